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

**Budgets.** On a route whose rules give it a ``budget`` block, a request costs what its answer
turns out to use (an LLM answer's tokens), read from the response as it passes
(:mod:`control_plane.metering`: a header, a callable, or the OpenAI-style ``usage`` in a JSON body
or in an event stream's last event). With ``estimate=`` (a callable given the request, its body
included, returning the estimate or None) the request reserves its estimate and the reservation
is settled with the actual cost when the body ends; without it, the request is admitted while
anything is left of the key's budget (a look, nothing spent) and its actual cost is charged when
the body ends, counted whatever is left. Either way the answer is never held up: the settle or
charge follows the last chunk. A client that goes away mid-answer (or an app that fails
mid-body) is charged what was produced. ``rate_limit_metered_responses_total`` counts how each
answer's cost was found.

``metrics_path="/metrics"`` (off by default, so an app's own ``/metrics`` is left alone)
answers ``GET`` and ``HEAD`` on that path with the engine's Prometheus metrics, the same
families a control plane exports (docs/metrics.md); the app is not called for it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from limiter.keys import InvalidKeyError
from limiter.policy import MAX_COST, Charge

from .decision import DecideError, DecideResult
from .engine import DecideInput, Engine
from .metering import Meter, Metering
from .settings import Settings, load_settings
from .wiring import EngineHandle, open_engine

__all__ = ["Metering", "RequestInfo", "ShadowLimitMiddleware"]

log = logging.getLogger("shadowlimit.middleware")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestInfo:
    """A request as an ``estimate`` callable sees it: method, path, headers (lower-case names,
    repeated ones joined) and its whole body (at most ``max_request_body`` bytes)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes


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
        metering: Metering = Metering(),
        estimate: Callable[[RequestInfo], int | None] | None = None,
        max_request_body: int = 1 << 20,
    ) -> None:
        self.app = app
        self.settings = settings
        self.engine = engine
        self.exclude_paths = exclude_paths
        self.metrics_path = metrics_path
        self.metering = metering
        self.estimate = estimate
        self.max_request_body = max_request_body
        self._handle: EngineHandle | None = None
        self._unmetered: set[str] = set()  # routes whose unmetered answers were logged
        self._seen: tuple[object, bool] = (None, False)  # the rules last looked at, and whether any has a budget

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
        method = scope.get("method", "GET")
        inp = DecideInput(
            method=method,
            path=path,
            client_ip=client[0] if client else None,
            headers=headers,
        )
        if self._has_budgets() and self.engine.rules.match(method.upper(), path).budget is not None:
            await self._metered(scope, receive, send, inp)
            return
        try:
            result = await self.engine.decide(inp)
        except InvalidKeyError as exc:
            await _json(send, 400, {"error": "invalid_key", "message": str(exc), "field": exc.field}, {})
            return
        if not await self._admitted(result, send):
            return
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in result.headers.items()]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _has_budgets(self) -> bool:
        """Whether any route of the rules in force has a budget (looked at once per rules), so a
        fleet without budgets matches each request's route once, in the decision, not twice."""
        assert self.engine is not None
        rules = self.engine.rules
        if self._seen[0] is not rules:
            self._seen = (rules, any(r.budget is not None for r in rules.all_routes))
        return self._seen[1]

    async def _admitted(self, result: DecideResult, send: Send) -> bool:
        """True when ``result`` admits the request; else its refusal is sent."""
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
            return False
        return True

    async def _metered(self, scope: Scope, receive: Receive, send: Send, inp: DecideInput) -> None:
        """A request on a budget route (see the module docstring): reserved or looked at, the
        answer passed on as it comes, then settled or charged at what it cost."""
        assert self.engine is not None
        decider = self.engine.decider
        estimate = None
        if self.estimate is not None:
            body, receive = await _whole_body(receive, self.max_request_body)
            if body is None:
                await _json(send, 413, {"error": "payload_too_large", "message": "the request body is too large "
                            f"to estimate its cost (at most {self.max_request_body} bytes)"}, {})  # fmt: skip
                return
            info = RequestInfo(method=inp.method or "GET", path=inp.path or "/", headers=inp.headers, body=body)
            estimate = self.estimate(info)
        try:
            if estimate is not None:
                inp.estimate = estimate
                result = await decider.reserve(inp)
            else:
                inp.cost = 0  # a look: admitted while anything is left, nothing spent
                result = await decider.decide(inp)
        except InvalidKeyError as exc:
            await _json(send, 400, {"error": "invalid_key", "message": str(exc), "field": exc.field}, {})
            return
        except DecideError as exc:
            await _json(send, 422, {"error": "invalid_request", "message": str(exc), "field": exc.field}, {})
            return
        if not await self._admitted(result, send):
            return
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in result.headers.items()]
        meter = Meter(self.metering)
        ended = False

        async def metered_send(message: Message) -> None:
            nonlocal ended
            kind = message["type"]
            if kind == "http.response.start":
                meter.start(message)
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + extra
            elif kind == "http.response.body":
                meter.body(message.get("body", b""))
                ended = ended or not message.get("more_body", False)
            await send(message)

        try:
            await self.app(scope, receive, metered_send)
        finally:
            if result.list_match is None:  # an allow-listed client is never limited: nothing to account
                await self._account(result, meter, ended, estimate)

    async def _account(self, result: DecideResult, meter: Meter, ended: bool, estimate: int | None) -> None:
        """The answer's cost settled (a reservation) or charged, counted by how it was found."""
        assert self.engine is not None
        try:
            cost = meter.cost() if ended else meter.produced(estimate)
        except ValueError as exc:
            log.warning("route %s: %s", result.route, exc)
            cost = None
        how = "metered" if ended and cost is not None else "early" if not ended else "unmetered"
        m = self.engine.metrics
        m.child(m.metered, result.route, how).inc()
        if cost is None:
            if estimate is None:
                if result.route not in self._unmetered:  # once a route: the metric counts each
                    self._unmetered.add(result.route)
                    log.warning(
                        "route %s: an answer named no cost (no usage, no %s header); nothing charged"
                        " (rate_limit_metered_responses_total counts them)",
                        result.route,
                        self.metering.header,
                    )
                return
            cost = estimate  # nothing learnt: what was reserved is kept
        cost = min(cost, MAX_COST)
        try:
            if result.reservation is not None:
                await self.engine.decider.settle_reservation(result.reservation, cost)
            else:
                charge = DecideInput(route=result.route, key=result.key, cost=Charge(cost))
                await self.engine.decider.decide(charge, headers=False)
        except Exception as exc:  # noqa: BLE001 - the answer has gone out: the failure is logged, not raised
            log.warning("route %s: the answer's cost (%d) could not be accounted: %s", result.route, cost, exc)

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


async def _whole_body(receive: Receive, most: int) -> tuple[bytes | None, Receive]:
    """The request's body (None past ``most`` bytes) and a ``receive`` that hands it to the app
    as it came, then the rest of the connection's messages."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        if size > most:
            return None, receive
        if not message.get("more_body", False):
            break
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
    replay = iter(messages)

    async def replayed() -> Message:
        for message in replay:
            return message
        return await receive()

    return body, replayed
