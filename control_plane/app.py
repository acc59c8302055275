"""The app factory and its lifespan: the one place that wires everything together."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .api import admin, decide, external, health, observe, routes, stream
from .api.deps import ApiError
from .gctune import tune_gc
from .settings import Settings, load_settings
from .wiring import open_engine

__all__ = ["create_app"]

log = logging.getLogger("shadowlimit.app")


def _field_of(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        where = parts.pop(0)
        if not parts:
            return where
    return ".".join(parts)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the control plane. With no ``RATE_LIMIT_REDIS_URL`` an embedded redis-server
    is started for the app's lifetime."""
    settings = settings or load_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        handle = await open_engine(settings)
        app.state.engine = handle.engine
        app.state.redis_url = handle.url
        app.state.embedded = handle.embedded
        app.state.streams = streams = stream.Streams(handle.engine)
        # after everything is loaded and started: the startup heap is frozen out of the
        # collector's way (see gctune)
        tuning = tune_gc() if settings.gc_tuning else None
        try:
            yield
        finally:
            if tuning is not None:
                tuning.undo()
            await streams.aclose()
            await handle.aclose()

    app = FastAPI(
        title="shadowlimit control plane",
        version="0.1.0",
        description="Runs the distributed limiter in shadow beside the local one, measures divergence and rolls routes out (off, shadow, canary, enforce).",
        lifespan=lifespan,
        # FastAPI's OpenTelemetry hook looks for a configured provider on every request
        # (about 5 us, nearly 2% of a decide request) even when there is none; the control
        # plane's own metrics are Prometheus. SHADOWLIMIT_OTEL=true turns it back on.
        # (FastAPI versions without native telemetry keep the argument in app.extra.)
        telemetry=None if settings.otel else {"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.error, "message": exc.message, **exc.details}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        field = _field_of(tuple(first.get("loc", ())))
        msg = f"{field}: {first.get('msg', 'invalid value')}"
        details = [{"field": _field_of(tuple(e.get("loc", ()))), "message": e.get("msg")} for e in errors]
        return JSONResponse({"error": "invalid_request", "message": msg, "field": field, "errors": details}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": "not_found" if exc.status_code == 404 else "http_error", "message": str(exc.detail)}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:  # pragma: no cover - last resort
        log.exception("unexpected error")
        return JSONResponse({"error": "internal_error", "message": f"{type(exc).__name__}: {exc}"}, status_code=500)

    for r in (decide.router, routes.router, observe.router, external.router, admin.router, stream.router, health.router):
        app.include_router(r)
    return app
