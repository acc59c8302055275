"""The decision endpoints' way in, in front of the framework.

``POST /v1/decide``, ``POST /v1/decide/batch`` and ``/v1/authz`` are what a fleet calls on
every request. Through FastAPI each one would pass eight middleware layers, the router and
the dependency machinery before the engine sees it: most of a decision's cost. :class:`HotPath`
takes these requests first and does what those layers would do, with their own code:

* the request limits' check of the head (:class:`~.limits.HeadCheck`, the middleware's own:
  a 431 or 413 goes out with the same bytes) and the auth gate's access check
  (:func:`~control_plane.auth.authorize`: a 401/403 the same);
* the body read to its declared ``Content-Length``;
* the endpoint itself: :func:`~control_plane.api.decide.decide_answer`,
  :func:`~control_plane.api.decide.batch_answer`, :func:`~control_plane.api.authz.authz_answer`,
  the one implementation of each (its parser, its decision, its answer), which the FastAPI
  routes (declared for the OpenAPI document) call too;
* an unexpected error is a 500 with an incident id, as :class:`~control_plane.observe.incidents.CatchAll`.

What it does not take goes through FastAPI as it came (the body, if read, handed over):
another method (the router's 405), ``HEAD``, a body without a ``Content-Length`` (counted by
the middleware as it arrives), and everything before the engine is open.
``tests/e2e/test_hot_path.py`` sends the same requests through both ways and compares the
bytes. ``SHADOWLIMIT_HOT_PATH=false`` sends everything through FastAPI.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from starlette.datastructures import Headers

from ..api.authz import AUTHZ_METHODS, authz_answer
from ..api.decide import Answer, batch_answer, decide_answer
from ..auth import Access, Authenticator, authorize, refuse
from ..observe import incidents
from .limits import NO_LENGTH, HeadCheck, RequestLimits, respond

__all__ = ["HOT_PATHS", "HotPath"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DECIDE, BATCH, AUTHZ = "/v1/decide", "/v1/decide/batch", "/v1/authz"
HOT_PATHS = frozenset({DECIDE, BATCH, AUTHZ})
_AUTHZ_METHODS = frozenset(m for m in AUTHZ_METHODS if m != "HEAD")
_POST = frozenset({"POST"})
_JSON = (b"content-type", b"application/json")


class HotPath:
    """See the module docstring. ``engine`` is set by the app's lifespan once the engine
    is open; until then every request goes to FastAPI (which says the service is not ready)."""

    def __init__(self, limits: RequestLimits, auth: Authenticator, *, deny_status: int | None) -> None:
        self.check = HeadCheck(limits)
        self.auth = auth
        self.engine: Any = None
        self.deny_status = deny_status
        self.answered = 0  # requests answered here
        self.handed_over = 0  # requests given to FastAPI

    async def __call__(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        """Answer the request, or hand it to ``app`` (the whole FastAPI app)."""
        path, method = scope["path"], scope["method"]
        if self.engine is None or method not in (_AUTHZ_METHODS if path == AUTHZ else _POST):
            self.handed_over += 1
            await app(scope, receive, send)
            return
        length = self.check.admit(scope["headers"])
        if length.__class__ is tuple:
            self.answered += 1
            await respond(send, length)
            return
        if length == NO_LENGTH and path == AUTHZ:
            length = 0  # a proxy's question: no body
        elif length < 0:  # type: ignore[operator]
            self.handed_over += 1  # a body to count as it arrives
            await app(scope, receive, send)
            return
        denied = authorize(self.auth, Access.DATA, scope)
        if denied is not None:
            self.answered += 1
            await refuse(send, denied)
            return
        body = b""
        if length:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body = message.get("body", b"")  # the usual case: the whole body in one message
            else:
                got = await _read(receive, message)
                if got is None:
                    return  # the client went away
                body = got
        try:
            # the endpoint, called here (no coroutine between): one implementation of each
            if path == DECIDE:
                answer = await decide_answer(self.engine.decider, body)
            elif path == BATCH:
                answer = await batch_answer(self.engine.decider, body)
            else:
                answer = await self._authz(scope)
        except Exception as exc:  # noqa: BLE001 - as CatchAll: a 500 with an incident id
            payload = orjson.dumps(incidents.body(incidents.report(exc, f"{method} {path}")))
            answer = Answer(500, [_JSON, (b"content-length", str(len(payload)).encode())], payload)
        self.answered += 1
        await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
        await send({"type": "http.response.body", "body": answer.body})

    async def _authz(self, scope: Scope) -> Answer:
        decider = self.engine.decider
        client = scope.get("client")
        return await authz_answer(
            decider,
            Headers(scope=scope),
            client_ip=client[0] if client else None,
            query=scope["query_string"],
            deny_status=self.deny_status,
        )


async def _read(receive: Receive, message: Message) -> bytes | None:
    """The body (framed by its ``Content-Length``) from its first ``message`` on, or None if the
    client disconnected."""
    chunks = []
    while True:
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
        message = await receive()
