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
from typing import Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from limiter.keys import InvalidKeyError

from ..decision import DecideError, DecideInput, Decider, UnknownRoute
from .decide import DECISION_RESPONSES, body_of, translate
from .deps import ApiError
from .openapi import RATE_LIMIT_HEADERS, errors

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


async def authz(
    request: Request,
    deny_status: int | None = Query(None, ge=400, le=499, description="Status of every rejection (nginx: 403)."),
) -> Response:
    """Forward-auth: decide the request the proxy describes (see the module docstring)."""
    decider: Decider = request.app.state.engine.decider
    method, path = described(request.headers)
    client = request.client
    inp = DecideInput(method=method, path=path, client_ip=client.host if client else None, headers=request.headers)
    try:
        result = await decider.decide(inp)
    except (UnknownRoute, InvalidKeyError, DecideError) as exc:
        raise translate(exc) from exc
    if result.allowed:  # the gateway forwards the request; only the headers matter
        return Response(status_code=200, headers=result.headers)
    status = deny_status or request.app.state.settings.authz_deny_status or result.status_code
    return Response(
        orjson.dumps(body_of(result)), status_code=status, headers=result.headers, media_type="application/json"
    )


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

#: the proxy's description of the request (read from the headers by :func:`described`)
_PARAMETERS = [
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
