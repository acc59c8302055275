"""An ASGI middleware: a Starlette or FastAPI app embeds the same engine and follows the
same rollout state in Redis as the control plane.

>>> from fastapi import FastAPI
>>> from control_plane.middleware import ShadowLimitMiddleware
>>> app = FastAPI()
>>> app.add_middleware(ShadowLimitMiddleware)  # settings from the environment  # doctest: +SKIP

Every HTTP request is decided by the engine under its route's mode (matched by method
and path in the rules file, key by the route's key strategy). A rejected request gets a
429 (or the failure code, or 403 for a deny-listed client) with the rejection's JSON body and
the rate-limit headers; an allowed one reaches the app and its response carries the
headers. Bad keys (for example a missing key header) are answered with 400 naming the
header, never passed through silently. The engine starts and stops with the app's
lifespan; pass ``engine=`` to share one you manage yourself.

``metrics_path="/metrics"`` (off by default, so an app's own ``/metrics`` is left alone)
answers ``GET`` and ``HEAD`` on that path with the engine's Prometheus metrics, the same
families a control plane exports (docs/metrics.md); the app is not called for it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from limiter.keys import InvalidKeyError

from .engine import DecideInput, Engine
from .settings import Settings, load_settings
from .wiring import EngineHandle, open_engine

__all__ = ["ShadowLimitMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ShadowLimitMiddleware:
    """Rate-limit an ASGI app with shadowlimit's engine."""

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings | None = None,
        *,
        engine: Engine | None = None,
        exclude_paths: tuple[str, ...] = ("/healthz", "/readyz", "/metrics"),
        metrics_path: str | None = None,
    ) -> None:
        self.app = app
        self.settings = settings
        self.engine = engine
        self.exclude_paths = exclude_paths
        self.metrics_path = metrics_path
        self._handle: EngineHandle | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "http" or self.engine is None:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "/")
        if path == self.metrics_path:  # never rate-limited
            await self._metrics(scope, send)
            return
        if path in self.exclude_paths:
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for k, v in scope.get("headers", []):
            name = k.decode("latin-1").lower()
            value = v.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value  # repeated lines join (RFC 9110)
        client = scope.get("client")
        inp = DecideInput(
            method=scope.get("method", "GET"),
            path=path,
            client_ip=client[0] if client else None,
            headers=headers,
        )
        try:
            result = await self.engine.decide(inp)
        except InvalidKeyError as exc:
            await _json(send, 400, {"error": "invalid_key", "message": str(exc), "field": exc.field}, {})
            return
        if not result.allowed:
            body = {
                "error": "rate limit exceeded",
                "message": "Too many requests. Please try again later.",
                "identifier": f"{result.route}:{result.key}",
            }
            if result.list_match == "deny":
                body = {
                    "error": "denied",
                    "message": "This client is on the route's deny list.",
                    "identifier": f"{result.route}:{result.key}",
                }
            await _json(send, result.status_code, body, result.headers)
            return
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in result.headers.items()]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _metrics(self, scope: Scope, send: Send) -> None:
        """The engine's metrics in Prometheus's text format (405 for other methods)."""
        assert self.engine is not None
        method = scope.get("method", "GET")
        if method not in ("GET", "HEAD"):
            await _json(send, 405, {"error": "method_not_allowed", "message": f"{method} {self.metrics_path}"}, {})
            return
        payload = self.engine.metrics.render()
        raw = [(b"content-type", CONTENT_TYPE_LATEST.encode()), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else payload})

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def wrapped_receive() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup" and self.engine is None:
                self._handle = await open_engine(self.settings or load_settings())
                self.engine = self._handle.engine
            elif message["type"] == "lifespan.shutdown" and self._handle is not None:
                await self._handle.aclose()
                self._handle = None
                self.engine = None
            return message

        await self.app(scope, wrapped_receive, send)


async def _json(send: Send, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
