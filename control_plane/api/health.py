"""``/healthz``, ``/readyz`` and ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from .deps import EngineDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(engine: EngineDep) -> dict[str, Any]:
    """The process is up."""
    return {"status": "ok", "instance_id": engine.instance_id}


@router.get("/readyz")
async def readyz(engine: EngineDep) -> JSONResponse:
    """200 while this replica can decide (Redis and breaker state in the body; the failure
    policies decide while Redis is down); 503 when it cannot, or with
    SHADOWLIMIT_READY_REQUIRES_REDIS=true also while Redis is unreachable."""
    ready, report = await engine.readiness()
    return JSONResponse(report, status_code=200 if ready else 503)


@router.get("/metrics")
async def metrics(engine: EngineDep) -> Response:
    """Prometheus exposition."""
    return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)
