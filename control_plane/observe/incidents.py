"""Unexpected errors: logged once, with the traceback, under an incident id.

A client that hits a bug gets ``{"error": "internal_error", "message": ..., "incident":
"<id>"}`` and never the exception's text (which can carry keys, URLs or internals); the
operator finds the traceback in the log by the id (``incident <id>``).

:class:`CatchAll` is the control plane's outermost handler: it turns an exception that
escaped every route into that 500 answer itself, so the server neither logs the
traceback a second time nor closes the keep-alive connection (which a re-raised
exception makes uvicorn do, failing the client's next request).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

__all__ = ["MESSAGE", "CatchAll", "body", "report"]

log = logging.getLogger("shadowlimit.incident")

MESSAGE = "an unexpected error occurred; the control plane's log has the details under this incident id"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def report(exc: BaseException, where: str) -> str:
    """Log ``exc`` with its traceback under a new incident id, and return the id (the
    same id again, logged once, when ``exc`` was already reported)."""
    incident = getattr(exc, "_shadowlimit_incident", None)
    if isinstance(incident, str):
        return incident
    incident = uuid.uuid4().hex[:16]
    log.error("incident %s: unexpected %s in %s", incident, type(exc).__name__, where, exc_info=exc)
    try:
        exc._shadowlimit_incident = incident  # type: ignore[attr-defined]
    except AttributeError:  # an exception type without a __dict__
        pass
    return incident


def body(incident: str) -> dict[str, str]:
    """The JSON body of a 500 answer (and of a batch item that failed unexpectedly)."""
    return {"error": "internal_error", "message": MESSAGE, "incident": incident}


class CatchAll:
    """ASGI middleware: an exception from the app becomes a generic 500 with an incident
    id, unless the response had already started (then it is re-raised: the server can
    only close the connection)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            incident = report(exc, f"{scope.get('method', '?')} {scope.get('path', '?')}")
            if started:
                raise
            payload = orjson.dumps(body(incident))
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
            await send({"type": "http.response.start", "status": 500, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
