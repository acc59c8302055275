"""``/healthz``, ``/readyz`` and ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from limiter.errors import BackendError

from .deps import EngineDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(engine: EngineDep) -> dict[str, Any]:
    """The process is up."""
    return {"status": "ok", "instance_id": engine.instance_id}


@router.get("/readyz")
async def readyz(engine: EngineDep) -> JSONResponse:
    """Redis reachable and scripts loaded (503 otherwise)."""
    checks: dict[str, Any] = {"redis": False, "scripts": False}
    try:
        await engine.redis.ping()
        checks["redis"] = True
        checks["scripts"] = await engine.redis.scripts_loaded()
        if not checks["scripts"]:
            await engine.redis.load_scripts()
            checks["scripts"] = await engine.redis.scripts_loaded()
    except BackendError as exc:
        checks["error"] = str(exc)
    ok = checks["redis"] and checks["scripts"]
    return JSONResponse({"status": "ready" if ok else "not_ready", **checks}, status_code=200 if ok else 503)


@router.get("/metrics")
async def metrics(engine: EngineDep) -> Response:
    """Prometheus exposition."""
    return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)
