"""``/v1/authz``: forward-auth for gateways (Caddy ``forward_auth``, Traefik ``ForwardAuth``,
nginx ``auth_request``). The proxy asks before it forwards a request; the original request
is described by the proxy's headers, decided like ``/v1/decide`` with method + path, and
answered with a status the proxy understands:

* allowed: 200 with the rate-limit headers (the proxy may copy them to the response);
* rejected: the route's status (429, 403 for a deny-listed client) with ``Retry-After``,
  the rate-limit headers and the rejection's JSON body, which the proxy returns to the client.
  nginx's ``auth_request`` only understands 401 and 403: ``?deny_status=403`` (or
  ``SHADOWLIMIT_AUTHZ_DENY_STATUS``) answers rejections with that status, and nginx's
  config maps it back to 429 (docs/gateways.md).

The method comes from ``X-Forwarded-Method`` (Caddy, Traefik) or ``X-Original-Method``
(nginx), the path from ``X-Forwarded-Uri`` or ``X-Original-URI`` (its query string is not
part of the match). The client address is the TCP peer unless the peer is a trusted proxy
(``SHADOWLIMIT_TRUSTED_PROXIES``), in which case ``X-Forwarded-For`` names it, exactly as
for every route's ``clientIP`` key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import Field, TypeAdapter, ValidationError

from ..decision import DecideInput, Decider
from .decide import (
    DECIDE_ERRORS,
    DECISION_RESPONSES,
    Answer,
    as_response,
    error_answer,
    invalid_answer,
    raw_headers,
    result_answer,
    translate,
)
from .deps import ApiError
from .openapi import RATE_LIMIT_HEADERS, errors

__all__ = ["AUTHZ_METHODS", "authz_answer", "described", "router"]

router = APIRouter(prefix="/v1", tags=["decide"])

#: the methods a proxy may use to ask (Caddy and Traefik: GET; nginx: the original method)
AUTHZ_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
_METHOD_HEADERS = ("x-forwarded-method", "x-original-method")
_URI_HEADERS = ("x-forwarded-uri", "x-original-uri")
_MAX_URI = 8192
_NO_METHOD = {
    "error": "invalid_request",
    "message": "the proxy must send X-Forwarded-Method (or X-Original-Method)",
    "field": "header:X-Forwarded-Method",
}
_DENY_STATUS: TypeAdapter[int] = TypeAdapter(Annotated[int, Field(ge=400, le=499)])


def described(h: Mapping[str, str]) -> tuple[str, str]:
    """(method, path) of the original request, from the proxy's headers."""
    method = next((h[n] for n in _METHOD_HEADERS if n in h), None)
    uri = next((h[n] for n in _URI_HEADERS if n in h), None)
    if method is None:
        raise ApiError(400, "invalid_request", "the proxy must send X-Forwarded-Method (or X-Original-Method)",
                       field="header:X-Forwarded-Method")  # fmt: skip
    if not (1 <= len(method) <= 16 and method.isascii() and method.isalpha()):
        raise ApiError(400, "invalid_request", "X-Forwarded-Method is not an HTTP method",
                       field="header:X-Forwarded-Method")  # fmt: skip
    if uri is None:
        raise ApiError(400, "invalid_request", "the proxy must send X-Forwarded-Uri (or X-Original-URI)",
                       field="header:X-Forwarded-Uri")  # fmt: skip
    if not uri.startswith("/") or len(uri) > _MAX_URI:
        raise ApiError(400, "invalid_request", f"X-Forwarded-Uri must be a path of at most {_MAX_URI} characters",
                       field="header:X-Forwarded-Uri")  # fmt: skip
    return method.upper(), uri.split("?", 1)[0].split("#", 1)[0]


def deny_status_of(query: bytes) -> int | None:
    """``?deny_status=4xx`` (the last one given; other parameters are ignored), None without
    one; a bad value is the usual 422 naming ``deny_status``."""
    value = None
    if query:
        for name, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
            if name == "deny_status":
                value = v
    if value is None:
        return None
    try:
        return _DENY_STATUS.validate_python(value, strict=False)
    except ValidationError as exc:
        errs = [{**e, "loc": ("query", "deny_status")} for e in exc.errors(include_url=False, include_input=False)]
        raise RequestValidationError(errs) from None


async def authz_answer(
    decider: Decider, headers: Mapping[str, str], *, client_ip: str | None, query: bytes, deny_status: int | None
) -> Answer:
    """Forward-auth: decide the request the proxy describes (see the module docstring);
    ``deny_status`` is the configured status of every rejection (``?deny_status=`` wins)."""
    try:
        asked = deny_status_of(query)
        method, path = described(headers)
    except RequestValidationError as exc:
        return invalid_answer(exc)
    except ApiError as exc:
        return error_answer(exc)
    inp = DecideInput(method=method, path=path, client_ip=client_ip, headers=headers)
    try:
        result = await decider.decide(inp)
    except DECIDE_ERRORS as exc:
        return error_answer(translate(exc))
    if result.allowed:  # the gateway forwards the request; only the headers matter
        return Answer(200, raw_headers(result.headers, b"", False), b"")
    return result_answer(result, asked or deny_status or result.status_code)


async def authz(request: Request) -> Response:
    """Forward-auth: decide the request the proxy describes (see the module docstring)."""
    client = request.client
    answer = await authz_answer(
        request.app.state.engine.decider,
        request.headers,
        client_ip=client.host if client else None,
        query=request.scope["query_string"],
        deny_status=request.app.state.settings.authz_deny_status,
    )
    return as_response(answer)


#: allowed: 200 with the headers and no body; rejected: the decision's status and body
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Allowed: no body; the rate-limit headers, which the proxy may copy to its response.",
        "headers": RATE_LIMIT_HEADERS,
    },
    **{status: DECISION_RESPONSES[status] for status in (429, 403, 500, 503)},
    **errors(404, 422),
    400: errors(400, e400=_NO_METHOD)[400],
}

#: ``deny_status`` (read by :func:`deny_status_of`) and the proxy's description of the request (read
#: from the headers by :func:`described`)
_PARAMETERS = [
    {"name": "deny_status", "in": "query", "required": False,
     "schema": {"anyOf": [{"type": "integer", "maximum": 499, "minimum": 400}, {"type": "null"}],
                "description": "Status of every rejection (nginx: 403).", "title": "Deny Status"},
     "description": "Status of every rejection (nginx: 403)."},
    {"name": "X-Forwarded-Method", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "The original method (Caddy, Traefik); nginx: X-Original-Method.", "example": "GET"},
    {"name": "X-Forwarded-Uri", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "The original path and query (Caddy, Traefik); nginx: X-Original-URI.",
     "example": "/api/search/books?q=x"},
]  # fmt: skip

for _m in AUTHZ_METHODS:  # one operation per method (distinct OpenAPI operation ids)
    # response_class=Response: the 200 has no body (nothing to declare for it)
    router.add_api_route(
        "/authz",
        authz,
        methods=[_m],
        response_model=None,
        response_class=Response,
        responses=_RESPONSES,
        openapi_extra={"parameters": _PARAMETERS},
        operation_id=f"authz_{_m.lower()}",
    )
