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

from limiter import RedisLimiter
from limiter.redis_limiter import make_redis_py_client

from .api import admin, decide, health, observe, routes, stream
from .api.deps import ApiError
from .engine import Engine
from .metrics import Metrics
from .settings import Settings, load_settings

__all__ = ["create_app"]

log = logging.getLogger("shadowlimit.app")


def _field_of(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the control plane. With no ``RATE_LIMIT_REDIS_URL`` an embedded redis-server
    is started for the app's lifetime."""
    settings = settings or load_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        embedded = None
        url = settings.redis_url
        if url is None:
            from limiter.embedded import EmbeddedRedis

            embedded = EmbeddedRedis().start()
            url = embedded.url
            log.warning("RATE_LIMIT_REDIS_URL is not set: started an embedded redis-server at %s", url)
        redis = RedisLimiter.from_url(
            url,
            namespace=settings.namespace,
            time_source=settings.time_source,  # type: ignore[arg-type]
            connect_timeout=settings.redis_connect_timeout_s,
            command_timeout=settings.redis_command_timeout_s,
        )
        client = make_redis_py_client(url, socket_timeout=max(1.0, settings.redis_command_timeout_s * 4), connect_timeout=settings.redis_connect_timeout_s)
        engine = Engine(settings, redis=redis, client=client, metrics=Metrics())
        app.state.engine = engine
        app.state.redis_url = url
        app.state.embedded = embedded
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()
            await redis.aclose()
            with contextlib.suppress(Exception):
                await client.aclose()
            if embedded is not None:
                embedded.stop()

    app = FastAPI(
        title="shadowlimit control plane",
        version="0.1.0",
        description="Runs the distributed limiter in shadow beside the local one, measures divergence and rolls routes out (off, shadow, canary, enforce).",
        lifespan=lifespan,
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

    for r in (decide.router, routes.router, observe.router, admin.router, stream.router, health.router):
        app.include_router(r)
    return app
