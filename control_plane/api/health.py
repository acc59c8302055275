"""``/healthz``, ``/readyz`` and ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from . import examples
from .deps import EngineDep
from .openapi import keep_example, ok
from .responses import Health, Readiness

router = APIRouter(tags=["health"])


class PrometheusText(Response):
    """The exposition format's media type (for OpenAPI: the handler sets it itself)."""

    media_type = CONTENT_TYPE_LATEST


@router.get("/healthz", responses=ok(Health, examples.HEALTH))
async def healthz(engine: EngineDep) -> dict[str, Any]:
    """The process is up."""
    return {"status": "ok", "instance_id": engine.instance_id}


@router.get(
    "/readyz",
    responses={
        **ok(Readiness, examples.READY, "Ready: this replica can decide."),
        503: {
            "model": Readiness,
            "description": "Not ready (the reasons say why).",
            "content": {"application/json": {"example": keep_example(examples.NOT_READY)}},
        },
    },
)
async def readyz(engine: EngineDep) -> JSONResponse:
    """200 while this replica can decide (Redis and breaker state in the body; the failure
    policies decide while Redis is down); 503 when it cannot, or with
    SHADOWLIMIT_READY_REQUIRES_REDIS=true also while Redis is unreachable."""
    ready, report = await engine.readiness()
    return JSONResponse(report, status_code=200 if ready else 503)


@router.get(
    "/metrics",
    response_class=PrometheusText,
    responses={
        200: {
            "description": "Prometheus exposition (docs/metrics.md lists the series).",
            "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}, "example": examples.METRICS}},
        }
    },
)
async def metrics(engine: EngineDep) -> Response:
    """Prometheus exposition."""
    return Response(await engine.metrics.render_async(), media_type=CONTENT_TYPE_LATEST)
