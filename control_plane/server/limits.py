"""Request size limits at the ASGI edge: bodies (413) and header sets (431), refused early.

:class:`RequestLimitsMiddleware` sits in front of every control-plane endpoint:

* more than ``max_headers`` header fields, or header names and values adding up to more
  than ``max_header_bytes``: **431** ``request_header_fields_too_large``;
* a ``Content-Length`` above ``max_body_bytes``: **413** ``payload_too_large`` before a
  byte of the body is read (the app is not called at all);
* a body without a ``Content-Length`` (chunked), or with one next to a
  ``Transfer-Encoding``: its bytes are counted as the app receives them, and the 413 goes
  out as soon as the count passes the limit. The chunk that passed it is dropped and the
  app is told the client disconnected, so at most ``max_body_bytes`` ever reach it.

Refusals carry ``Connection: close``: the unread rest of the body is never read.

The hot path (a request with a ``Content-Length`` within the limit) costs one scan of the
header list and nothing else: ``receive`` and ``send`` are passed through untouched. The
server frames such a body by its ``Content-Length``, so the app cannot be handed more
(bytes a client sends beyond it are parsed as the next request, which the HTTP parser
refuses).

A header set the middleware sees has already been parsed by the server; bounding it while
it arrives, in size and in time (:attr:`RequestLimits.header_timeout_s`), and the request
target's length (:data:`MAX_TARGET_BYTES`), is the HTTP protocol's job
(:mod:`control_plane.server.serving`), which uses :meth:`RequestLimits.head_bytes` and
:func:`refusal_body` (its refusals, a request that is not HTTP included, are JSON too).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from ..settings.limits import MAX_TARGET_BYTES, REQUEST_LINE_ALLOWANCE, RequestLimits

__all__ = [
    "MAX_TARGET_BYTES",
    "REQUEST_LINE_ALLOWANCE",
    "NO_LENGTH",
    "STREAMED",
    "HeadCheck",
    "Refusal",
    "RequestLimits",
    "RequestLimitsMiddleware",
    "refusal_body",
    "respond",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


_REFUSALS = {
    400: "bad_request",
    408: "request_timeout",
    413: "payload_too_large",
    414: "uri_too_long",
    431: "request_header_fields_too_large",
    503: "too_many_connections",
}


def refusal_body(status: int, message: str, limit: float | None = None) -> bytes:
    """The JSON body of a refusal before the app: a 400 (a request that is not HTTP), 408
    (``limit`` in seconds), 413, 414 or 431 (in bytes or fields), 503 (connections)."""
    body: dict[str, Any] = {"error": _REFUSALS[status], "message": message}
    if limit is not None:
        body["limit"] = limit
    return orjson.dumps(body)


def _response_start(status: int, body: bytes) -> Message:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    return {"type": "http.response.start", "status": status, "headers": headers}


#: :meth:`HeadCheck.admit`: no ``Content-Length`` and no ``Transfer-Encoding`` (no body framed)
NO_LENGTH = -1
#: :meth:`HeadCheck.admit`: a ``Transfer-Encoding``, or a ``Content-Length`` that is not a number:
#: the body is counted as it arrives
STREAMED = -2
#: a refusal before the app: its status and its JSON body
Refusal = tuple[int, bytes]


class HeadCheck:
    """The checks of a request's head against :class:`RequestLimits`: the middleware's, and
    the decision endpoints' in front of it (the same code, the same refusals)."""

    __slots__ = ("limits", "_max_body", "_max_body_digits", "_max_headers", "_max_header_bytes", "_declared_too_large")

    def __init__(self, limits: RequestLimits) -> None:
        self.limits = limits
        self._max_body = limits.max_body_bytes
        self._max_body_digits = len(str(limits.max_body_bytes))
        self._max_headers = limits.max_headers
        self._max_header_bytes = limits.max_header_bytes
        self._declared_too_large = refusal_body(
            413,
            f"the request body (Content-Length) is larger than the limit of {limits.max_body_bytes:,} bytes",
            limits.max_body_bytes,
        )

    def admit(self, headers: list[tuple[bytes, bytes]]) -> int | Refusal:
        """One scan of the header list: the declared body length (``>= 0``) when it is within
        the limit, :data:`NO_LENGTH`, :data:`STREAMED`, or the :data:`Refusal` (431, 413)."""
        if len(headers) > self._max_headers:
            limit = self._max_headers
            return 431, refusal_body(431, f"the request has {len(headers)} header fields; the limit is {limit}", limit)
        size = 0
        length = None
        chunked = False
        for name, value in headers:
            size += len(name) + len(value)
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = True
        if size > self._max_header_bytes:
            limit = self._max_header_bytes
            message = f"the request's header fields take {size:,} bytes; the limit is {limit:,}"
            return 431, refusal_body(431, message, limit)
        if chunked or (length is not None and not length.isdigit()):
            return STREAMED
        if length is None:
            return NO_LENGTH
        # shorter than the limit written out: within it, no need to compare
        if len(length) >= self._max_body_digits and int(length) > self._max_body:
            return 413, self._declared_too_large
        return int(length)


async def respond(send: Send, refusal: Refusal) -> None:
    """Send a refusal (``Connection: close``: the unread rest of the body is never read)."""
    status, body = refusal
    await send(_response_start(status, body))
    await send({"type": "http.response.body", "body": body, "more_body": False})


class RequestLimitsMiddleware:
    """Refuse oversized bodies (413) and header sets (431) before the app runs."""

    def __init__(self, app: ASGIApp, limits: RequestLimits) -> None:
        self.app = app
        self.limits = limits
        self.check = HeadCheck(limits)
        self._max_body = limits.max_body_bytes
        self._streamed_too_large = refusal_body(
            413, f"the request body passed the limit of {limits.max_body_bytes:,} bytes", limits.max_body_bytes
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        admitted = self.check.admit(scope["headers"])
        if admitted.__class__ is tuple:
            await respond(send, admitted)
            return
        if admitted >= 0:  # type: ignore[operator]
            await self.app(scope, receive, send)  # framed by its Content-Length, within the limit
            return
        await self._counted(scope, receive, send)

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app behind a ``receive`` that counts body bytes and answers 413 at the limit."""
        limit = self._max_body
        received = 0
        started = False
        refused = False

        async def bounded_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    if not started:
                        await respond(send, (413, self._streamed_too_large))
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 has been sent (or the response was cut off)
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, bounded_receive, guarded_send)
        except Exception:
            # after a refusal the app only sees a disconnected client; whatever it raises
            # about that (ClientDisconnect, a parse error) has been answered by the 413
            if not refused:
                raise
