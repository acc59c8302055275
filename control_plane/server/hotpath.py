"""The decision endpoints without the framework's per-request work.

``POST /v1/decide``, ``POST /v1/decide/batch`` and ``/v1/authz`` are what a fleet calls on
every request. Through FastAPI each one passes eight middleware layers, the router and
the dependency machinery before the engine sees it: most of a decision's cost. FastAPI
stays the control plane (it declares every route, for OpenAPI and for everything else);
:class:`HotPath` answers the plainly normal requests to these three endpoints in front of
it, with the same code for the decision and the same bytes out:

* the checks the middleware would make come first: header count and size within
  ``SHADOWLIMIT_MAX_HEADERS`` / ``SHADOWLIMIT_MAX_HEADER_BYTES``, a ``Content-Length``
  within ``SHADOWLIMIT_MAX_BODY_BYTES`` (no chunked body), the client token when
  ``SHADOWLIMIT_CLIENT_TOKEN`` is set;
* the body is parsed by the same hand-checked parser the batch endpoint uses
  (:func:`~control_plane.api.requests.parse_batch`'s items): a decide body of ``route``,
  ``key`` and maybe ``cost`` and ``request_id``;
* the answer is built as the FastAPI handler builds it (the decision's ``to_dict()`` form
  from :meth:`~control_plane.decision.Decider.decide`, :func:`rejected`,
  :func:`batch_body`, the same header order Starlette's ``Response`` gives);
* an unexpected error is a 500 with an incident id, as :class:`~control_plane.observe.incidents.CatchAll`.

Anything else -- a check that fails, a body the parser does not plainly accept, ``HEAD``,
a query other than ``deny_status=4xx`` -- goes through FastAPI (with the body already read
handed over), so every refusal and every 422 is the framework's own.
``tests/e2e/test_hot_path.py`` sends the decide tests' requests through both and
compares the bytes. ``SHADOWLIMIT_HOT_PATH=false`` sends everything through FastAPI.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from starlette.datastructures import Headers

from limiter.keys import InvalidKeyError

from ..api.authz import AUTHZ_METHODS, described
from ..api.decide import batch_body, rejected, translate
from ..api.deps import ApiError
from ..api.requests import parse_batch, plain_item
from ..auth import Access, Authenticator, Denied, bearer_token, check
from ..decision import DecideError, DecideInput, UnknownRoute
from ..observe import incidents
from .limits import RequestLimits

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
_DECIDE_ERRORS = (UnknownRoute, InvalidKeyError, DecideError)
_names: dict[str, bytes] = {}


def _name(k: str) -> bytes:
    name = _names[k] = k.lower().encode("latin-1")
    return name


def _raw_headers(headers: dict[str, str], body: bytes, media: bool) -> list[tuple[bytes, bytes]]:
    """What Starlette's ``Response(body, headers=headers, media_type=...)`` sends: the
    headers lower-cased, then ``content-length``, then ``content-type``."""
    names = _names
    out = [(names.get(k) or _name(k), v.encode("latin-1")) for k, v in headers.items()]
    out.append((b"content-length", str(len(body)).encode()))
    if media:
        out.append(_JSON)
    return out


def _error_body(exc: ApiError) -> bytes:
    """The bytes of the app's ``ApiError`` handler (a Starlette ``JSONResponse``)."""
    content = {"error": exc.error, "message": exc.message, **exc.details}
    return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


#: an answer: status, raw headers, body
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


def _json_answer(status: int, payload: bytes) -> Answer:
    return status, [(b"content-length", str(len(payload)).encode()), _JSON], payload


def _error(exc: ApiError) -> Answer:
    return _json_answer(exc.status, _error_body(exc))


def _result(body: dict[str, Any], status: int) -> Answer:
    """A decision (its ``to_dict()`` form) as the FastAPI handler answers it."""
    payload = orjson.dumps(body if body["allowed"] else rejected(body))
    return status, _raw_headers(body["headers"], payload, True), payload


class HotPath:
    """See the module docstring. ``engine`` is set by the app's lifespan once the engine
    is open; until then every request goes to FastAPI (which says the service is not ready)."""

    def __init__(self, limits: RequestLimits, auth: Authenticator, *, deny_status: int | None) -> None:
        self.max_headers = limits.max_headers
        self.max_header_bytes = limits.max_header_bytes
        self.max_body = limits.max_body_bytes
        self.auth = auth
        self.engine: Any = None
        self.deny_status = deny_status
        self.answered = 0  # requests answered here
        self.handed_over = 0  # requests given to FastAPI

    async def __call__(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        """Answer the request, or hand it to ``app`` (the whole FastAPI app)."""
        path, method = scope["path"], scope["method"]
        length = self._admitted(scope) if method in (_AUTHZ_METHODS if path == AUTHZ else _POST) else None
        if length is None:
            self.handed_over += 1
            await app(scope, receive, send)
            return
        body = b""
        if length:
            got = await _read(receive, length)
            if got is None:
                return  # the client went away
            body = got
        try:
            answer = await self._answer(path, scope, body)
        except Exception as exc:  # noqa: BLE001 - as CatchAll: a 500 with an incident id
            payload = orjson.dumps(incidents.body(incidents.report(exc, f"{method} {path}")))
            answer = 500, [_JSON, (b"content-length", str(len(payload)).encode())], payload
        if answer is None:
            self.handed_over += 1
            await app(scope, _replay(body, receive), send)
            return
        self.answered += 1
        status, headers, payload = answer
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    def _admitted(self, scope: Scope) -> int | None:
        """The body's length when the middleware would let the request through as it is
        (headers within bounds, a Content-Length within the limit, the client token), else None."""
        headers = scope["headers"]
        if len(headers) > self.max_headers:
            return None
        size = 0
        length: bytes | None = None
        for name, value in headers:
            size += len(name) + len(value)
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                return None
        if size > self.max_header_bytes:
            return None
        if self.auth.client_token_required:  # as the auth gate checks it, with its own reading of the header
            try:
                check(self.auth, Access.DATA, bearer_token(scope))
            except Denied:
                return None
        if length is None:
            return 0 if scope["path"] == AUTHZ else None
        if not length.isdigit() or len(length) > 12 or int(length) > self.max_body:
            return None
        return int(length)

    async def _answer(self, path: str, scope: Scope, body: bytes) -> Answer | None:
        """The answer, or None for FastAPI to give it."""
        engine = self.engine
        if engine is None:  # not started: the framework says so
            return None
        decider = engine.decider
        if path == DECIDE:
            return await _decide(decider, body)
        if path == BATCH:
            inputs = _batch_items(body)
            if inputs is None:
                return None
            return _json_answer(200, await batch_body(decider, inputs))
        return await self._authz(decider, scope, body)

    async def _authz(self, decider: Any, scope: Scope, body: bytes) -> Answer | None:
        deny_status = _deny_status(scope["query_string"])
        if body or deny_status == -1:
            return None
        headers = Headers(scope=scope)
        try:
            method, path = described(headers)
        except ApiError as exc:
            return _error(exc)
        client = scope.get("client")
        inp = DecideInput(method=method, path=path, client_ip=client[0] if client else None, headers=headers)
        try:
            result = (await decider.decide(inp)).to_dict()
        except _DECIDE_ERRORS as exc:
            return _error(translate(exc))
        if result["allowed"]:
            return 200, _raw_headers(result["headers"], b"", False), b""
        return _result(result, deny_status or self.deny_status or result["status_code"])


async def _decide(decider: Any, body: bytes) -> Answer | None:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    item = plain_item(data)
    if item.__class__ is not tuple:
        return None
    try:
        result = (await decider.decide(item)).to_dict()  # the PlainInput tuple: no DecideInput built
    except _DECIDE_ERRORS as exc:
        return _error(translate(exc))
    return _result(result, result["status_code"])


def _batch_items(body: bytes) -> list[Any] | None:
    """The batch's items as the endpoint parses them, or None for FastAPI to answer."""
    try:
        return parse_batch(body)
    except Exception:  # noqa: BLE001 - too many items: the framework's 422
        return None


def _deny_status(query: bytes) -> int | None:
    """``?deny_status=4xx`` (None when there is no query; -1 for anything else)."""
    if not query:
        return None
    name, _, value = query.partition(b"=")
    if name != b"deny_status" or len(value) != 3 or not value.isdigit() or not 400 <= int(value) <= 499:
        return -1
    return int(value)


async def _read(receive: Receive, length: int) -> bytes | None:
    """The body (``length`` bytes announced), or None if the client disconnected."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks) if len(chunks) > 1 else chunks[0]


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` once, then waits on the real one."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
