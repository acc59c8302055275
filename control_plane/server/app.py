"""The app factory and its lifespan: the one place that wires everything together."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..api import (
    admin,
    authz,
    candidates,
    charge,
    decide,
    external,
    health,
    observe,
    plans,
    routes,
    settle,
    stream,
    whatif,
)
from ..api.deps import ApiError
from ..api.docs_ui import install_docs
from ..api.openapi import document
from ..api.requests import invalid_request
from ..auth import Authenticator, AuthGate, TokensFile
from ..decision import wall_clock_us
from ..gctune import tune_gc
from ..observe import incidents
from ..settings import Settings, load_settings
from ..tls import port_tls
from ..tls.metrics import TlsCollector
from ..wiring import open_engine
from .hotpath import HOT_PATHS, HotPath
from .limits import RequestLimitsMiddleware

__all__ = ["ControlPlaneApp", "create_app"]

log = logging.getLogger("shadowlimit.app")

#: every API router, in the order of the OpenAPI document
ROUTERS = (
    decide.router,
    charge.router,
    settle.router,
    authz.router,
    routes.router,
    candidates.router,
    plans.router,
    observe.router,
    external.router,
    admin.router,
    stream.router,
    whatif.router,
    health.router,
)


class ControlPlaneApp(FastAPI):
    """FastAPI with the decision endpoints' hot path in front (:mod:`control_plane.server.hotpath`)."""

    #: the hot path (``app.state.hot`` too), read here without State's ``__getattr__``
    hot_path: HotPath | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = self.hot_path
        if hot is not None and scope["type"] == "http" and scope["path"] in HOT_PATHS:
            await hot(scope, receive, send, self._framework)
            return
        await super().__call__(scope, receive, send)

    @functools.cached_property
    def _framework(self) -> ASGIApp:
        """FastAPI's own ``__call__``, bound once (for the hot path to hand requests to)."""
        return super().__call__

    def openapi(self) -> dict[str, Any]:
        """The generated document, completed once by :func:`control_plane.api.openapi.document`
        (security from the access table, the 2xx models)."""
        if self.openapi_schema is None:
            self.openapi_schema = document(super().openapi())
        return self.openapi_schema


def create_app(
    settings: Settings | None = None,
    *,
    clock_us: Callable[[], int] = wall_clock_us,
    clock: Callable[[], float] = time.time,
) -> ControlPlaneApp:
    """Build the control plane. With no ``RATE_LIMIT_REDIS_URL`` an embedded redis-server
    is started for the app's lifetime. ``clock_us`` and ``clock`` are the engine's clocks
    (the decisions', everything else's: :func:`~control_plane.wiring.build_engine`)."""
    settings = settings or load_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        handle = await open_engine(settings, clock_us=clock_us, clock=clock)
        app.state.engine = handle.engine
        if app.state.hot is not None:
            app.state.hot.engine = handle.engine
        app.state.redis_url = handle.url
        app.state.embedded = handle.embedded
        app.state.streams = streams = stream.Streams(handle.engine)
        try:
            app.state.grpc = await _start_grpc(app, settings, handle.engine)
        except BaseException:
            await streams.aclose()
            await handle.aclose()
            raise
        # after everything is loaded and started: the startup heap is frozen out of the
        # collector's way (see gctune)
        tuning = tune_gc() if settings.gc_tuning else None
        try:
            yield
        finally:
            if tuning is not None:
                tuning.undo()
            if app.state.grpc is not None:
                await app.state.grpc.stop()
            await streams.aclose()
            await handle.aclose()

    app = ControlPlaneApp(
        title="shadowlimit control plane",
        version="0.1.0",
        description=(
            "Runs the distributed limiter in shadow beside the local one, measures divergence"
            " and rolls routes out (off, shadow, canary, enforce)."
        ),
        lifespan=lifespan,
        # /docs and /redoc with their assets served from a package (api/docs_ui.py), not a CDN
        docs_url=None,
        redoc_url=None,
        # FastAPI's OpenTelemetry hook looks for a configured provider on every request
        # (about 5 us, nearly 2% of a decide request) even when there is none; the control
        # plane's own metrics are Prometheus. SHADOWLIMIT_OTEL=true turns it back on.
        # (FastAPI versions without native telemetry keep the argument in app.extra.)
        telemetry=None if settings.otel else {"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.auth = auth = authenticator(settings)  # one for the gate, the hot path and gRPC
    # each port's TLS (None: cleartext), built here so a file that cannot serve stops startup
    grpc_tls = port_tls(settings, "grpc") if settings.grpc_port is not None else None
    app.state.tls = {"http": port_tls(settings, "http"), "grpc": grpc_tls}
    app.state.hot = app.hot_path = (
        HotPath(settings.request_limits, auth, deny_status=settings.authz_deny_status) if settings.hot_path else None
    )

    _install_error_handlers(app)
    for r in ROUTERS:
        app.include_router(r)
    install_docs(app)
    # innermost first: the access check (before any body is read), then the size limits
    # (431/413 from the head, before the token is even looked at), then the last resort
    app.add_middleware(AuthGate, auth=auth, endpoints=endpoints_of(app))
    app.add_middleware(RequestLimitsMiddleware, limits=settings.request_limits)
    # a bug answers 500 + incident id and keeps the connection; the last add_middleware
    # call, so that it wraps every other middleware
    app.add_middleware(incidents.CatchAll)
    return app


async def _start_grpc(app: FastAPI, settings: Settings, engine: Any) -> Any:
    """The TLS ports' metrics, and Envoy's rate limit service beside the HTTP API (None
    without ``SHADOWLIMIT_GRPC_PORT``)."""
    tls_ports = [t for t in app.state.tls.values() if t is not None]
    if tls_ports:
        engine.metrics.registry.register(TlsCollector(tls_ports))
    if settings.grpc_port is None:
        return None
    from ..envoy.server import start_grpc_server

    return await start_grpc_server(
        engine,
        settings.host,
        settings.grpc_port,
        app.state.auth,
        reuse_port=settings.workers > 1,
        tls=app.state.tls["grpc"],
        handshake_timeout_s=settings.tls_handshake_timeout_s,
    )


def _install_error_handlers(app: FastAPI) -> None:
    """Every error answer is JSON ``{"error": ..., "message": ...}``; an unexpected
    exception is reported under an incident id and never shown to the client."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.error, "message": exc.message, **exc.details}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(invalid_request(list(exc.errors())), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": "not_found" if exc.status_code == 404 else "http_error", "message": str(exc.detail)},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:  # pragma: no cover - behind CatchAll
        # the exception's text stays in the log (under the incident id), never in the answer
        return JSONResponse(
            incidents.body(incidents.report(exc, f"{request.method} {request.url.path}")), status_code=500
        )


def endpoints_of(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path template) the app serves: the OpenAPI operations and the
    plain routes (the API docs)."""
    out = [(method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops]
    for route in app.routes:
        if isinstance(route, Route):
            out += [(m, route.path) for m in route.methods or ()]
    return out


def authenticator(settings: Settings) -> Authenticator:
    """The tokens the settings name: the single admin token, the client token, the tokens file."""
    return Authenticator(
        admin_token=settings.admin_token.get_secret_value() if settings.admin_token else None,
        client_token=settings.client_token.get_secret_value() if settings.client_token else None,
        tokens_file=TokensFile(settings.tokens_file) if settings.tokens_file is not None else None,
        open_reads=settings.open_reads,
    )
