"""What ``/openapi.json`` says beyond what the routes declare themselves.

The routes declare their answers with :func:`ok` (the 2xx model and one example) and
:func:`errors` (the JSON error body, ``{"error", "message", ...}``, per status), the
decision endpoints also the rate-limit headers (:data:`RATE_LIMIT_HEADERS`).
:func:`document` then completes the generated document once, when the app first builds
it:

* the ``bearerAuth`` HTTP bearer scheme in ``components.securitySchemes``, and on every
  operation the requirement its access level in :data:`control_plane.auth.ACCESS` gives
  (the one table the auth gate checks, so the two cannot disagree): ``operator`` and
  ``admin`` endpoints require the token; the read and decide endpoints list it as
  optional (``[{"bearerAuth": []}, {}]``): whether they need one depends on the
  configuration (``SHADOWLIMIT_TOKENS_FILE``, ``SHADOWLIMIT_CLIENT_TOKEN``); open ones
  (health, metrics, docs) list none. Each operation says its access level in
  ``x-shadowlimit-access`` and in its description, and gets the 401/403 answers it can give;
* a 2xx schema is the declared model alone: an endpoint that returns a dict keeps its
  dict serializer at run time (so the bytes out are what they were), and FastAPI's
  generic ``object`` schema of that dict is dropped beside the model's ``$ref``;
* every operation declares the ``500 internal_error`` any endpoint may give
  (:class:`control_plane.observe.incidents.CatchAll`);
* the links between operations (:mod:`.links`): which answer feeds which request;
* the examples get back the ``null`` values FastAPI drops (:func:`keep_example`); the
  request bodies the handlers read themselves (:func:`json_request`) and the models of
  their ``$defs`` go to the components; a ``$ref`` to no schema is a ``RuntimeError``.

Nothing here runs per request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from ..auth import ACCESS, Access
from ..observe import incidents
from .links import add_links
from .requests import adapter
from .schemas import ErrorBody

__all__ = [
    "BEARER",
    "RATE_LIMIT_HEADERS",
    "RETRY_AFTER",
    "document",
    "errors",
    "json_request",
    "keep_example",
    "ok",
]

#: the name of the security scheme in ``components.securitySchemes``
BEARER = "bearerAuth"

_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": (
        "`Authorization: Bearer <token>`: SHADOWLIMIT_ADMIN_TOKEN (role admin), a named token from"
        " SHADOWLIMIT_TOKENS_FILE (viewer, operator or admin), or for the decide endpoints"
        " SHADOWLIMIT_CLIENT_TOKEN. Checked before the body is read."
    ),
}

_ACCESS_TEXT = {
    Access.OPEN: "open: no token",
    Access.DATA: "the client token (or an admin token) when SHADOWLIMIT_CLIENT_TOKEN is set; else open",
    Access.READ: "at least a viewer token when SHADOWLIMIT_TOKENS_FILE is set (unless SHADOWLIMIT_OPEN_READS);"
    " else open",
    Access.OPERATOR: "a token with the operator or admin role",
    Access.ADMIN: "a token with the admin role",
}

#: the examples given to routes, by their JSON without nulls (see :func:`keep_example`)
_EXAMPLES: dict[str, Any] = {}
#: the request bodies declared by :func:`json_request`, by name (models or typed dicts)
_BODIES: dict[str, type[Any]] = {}

_INT = {"type": "integer"}
_STR = {"type": "string"}

#: what :func:`control_plane.decision.headers.render_headers` sets on a decision
RATE_LIMIT_HEADERS: dict[str, dict[str, Any]] = {
    "X-RateLimit-Limit": {"description": "The key's limit.", "schema": _INT, "example": 10},
    "X-RateLimit-Remaining": {"description": "Requests left now.", "schema": _INT, "example": 9},
    "X-RateLimit-Reset": {
        "description": "When the key is back to its full allowance (Unix seconds).",
        "schema": _INT,
        "example": 1795710209,
    },
    "RateLimit-Policy": {
        "description": "draft-ietf-httpapi-ratelimit-headers-11 (May 2026): the quota (q) a client pacing"
        " itself is admitted per window (w, seconds), a bucket's"
        " burst as `sl-burst` when it differs from q; with SHADOWLIMIT_ANNOUNCE_SHADOW=true, in shadow and"
        " canary also the distributed limit to come, marked `sl-shadow`.",
        "schema": _STR,
        "example": '"search";q=10;w=1',
    },
    "RateLimit": {
        "description": "draft-ietf-httpapi-ratelimit-headers-11 (May 2026): remaining (r) and the seconds"
        " until more quota is made available (t, at most w).",
        "schema": _STR,
        "example": '"search";r=9;t=1',
    },
}

#: on rejections (decisions) and on ``503 too_many_streams``
RETRY_AFTER: dict[str, dict[str, Any]] = {
    "Retry-After": {"description": "Seconds to wait before trying again.", "schema": _INT, "example": 1}
}

_ERRORS: dict[int, tuple[str, dict[str, Any]]] = {
    400: ("Bad request.", {"error": "invalid_request", "message": "...", "field": "..."}),
    401: (
        "No valid token (`WWW-Authenticate: Bearer`).",
        {
            "error": "unauthorized",
            "message": "this endpoint needs Authorization: Bearer <token> with the operator role",
            "needs": "operator",
        },
    ),
    403: (
        "The token's role is too small (`forbidden`), or no token is configured (`admin_disabled`).",
        {
            "error": "forbidden",
            "message": "this needs the operator role; the token 'vera' has the viewer role",
            "needs": "operator",
            "role": "viewer",
            "token": "vera",
        },
    ),
    404: ("No such route.", {"error": "unknown_route", "message": "no route named 'nope'", "field": "route"}),
    409: (
        "Refused: the gate, a concurrent change, or a turned-off feature.",
        {"error": "gate_failed", "message": "..."},
    ),
    413: (
        "The body is larger than SHADOWLIMIT_MAX_BODY_BYTES.",
        {"error": "payload_too_large", "message": "...", "limit": 33554432},
    ),
    422: (
        "A bad field (`field` names it; body validation errors also list `errors`).",
        {
            "error": "invalid_request",
            "message": "minutes: Input should be less than or equal to 120",
            "field": "minutes",
            "errors": [{"field": "minutes", "message": "Input should be less than or equal to 120"}],
        },
    ),
    500: ("A bug: the log has the details under the incident id.", incidents.body("3f2a9c1e5b7d4f60")),
    503: ("Redis is unreachable; nothing was changed.", {"error": "backend_unavailable", "message": "..."}),
}

_CLIENT_401 = {
    "error": "unauthorized",
    "message": "the decide endpoints need Authorization: Bearer <client token>",
}


def ok(model: type[BaseModel], example: Any, description: str = "Successful Response") -> dict[int | str, Any]:
    """``responses=`` entry: the 200 answer's model and one example (the schema only)."""
    content = {"example": keep_example(example)}
    return {200: {"model": model, "description": description, "content": {"application/json": content}}}


def json_request(model: type[Any], example: Any) -> dict[str, Any]:
    """``openapi_extra=`` declaring the JSON request body a handler reads itself with
    :func:`~.requests.json_body` (or :func:`~.requests.validate_body`): ``model`` (put in
    the components by :func:`document`) and one example."""
    _BODIES[model.__name__] = model
    content = {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}, "example": keep_example(example)}
    return {"requestBody": {"required": True, "content": {"application/json": content}}}


def errors(*statuses: int, **examples: dict[str, Any]) -> dict[int | str, Any]:
    """``responses=`` entries: the JSON error body for each status, with its usual example
    (``e409={...}`` replaces the example of 409)."""
    return {status: _error(status, examples.get(f"e{status}")) for status in statuses}


def _error(status: int, example: dict[str, Any] | None = None) -> dict[str, Any]:
    # the schema by reference (not ``model``): FastAPI would put a model under the route's
    # own media type (text/event-stream for the stream); document() adds the component
    text, usual = _ERRORS[status]
    content = {"schema": {"$ref": "#/components/schemas/ErrorBody"}, "example": keep_example(example or usual)}
    entry: dict[str, Any] = {"description": text, "content": {"application/json": content}}
    if status == 401:
        entry["headers"] = {"WWW-Authenticate": {"description": 'Bearer realm="shadowlimit"', "schema": _STR}}
    return entry


def document(schema: dict[str, Any]) -> dict[str, Any]:
    """Complete the generated OpenAPI document in place (see the module docstring); an
    operation missing from :data:`~control_plane.auth.ACCESS` is a ``RuntimeError``."""
    _restore_examples(schema.get("paths", {}))
    components = schema.setdefault("components", {})
    components.setdefault("securitySchemes", {})[BEARER] = _SCHEME
    schemas = components.setdefault("schemas", {})
    bodies: list[type[Any]] = [ErrorBody, *_BODIES.values()]
    for model in bodies:
        _add_component(schemas, model.__name__, _json_schema(model))
    missing = []
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            access = ACCESS.get((method.upper(), path))
            if access is None:
                missing.append(f"{method.upper()} {path}")
                continue
            _tidy_success(op)
            _hoist_defs(op, schemas)
            _secure(op, access)
            if "500" not in op["responses"]:  # any endpoint (control_plane.observe.incidents.CatchAll)
                op["responses"]["500"] = _error(500)
    if missing:
        raise RuntimeError(
            "OpenAPI operations without an access level in control_plane.auth.ACCESS: " + ", ".join(missing)
        )
    add_links(schema.get("paths", {}))
    dangling = sorted(set(_refs(schema)) - {f"#/components/schemas/{name}" for name in schemas})
    if dangling:
        raise RuntimeError("OpenAPI references without a schema: " + ", ".join(dangling))
    return schema


def keep_example(value: Any) -> Any:
    """Register an example given to a route (returned as it is): FastAPI writes the document
    with ``exclude_none``, which drops an example's ``null`` values; :func:`document` puts
    them back from here."""
    if isinstance(value, (dict, list)):
        _EXAMPLES.setdefault(_fingerprint(value), value)
    return value


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _fingerprint(value: Any) -> str:
    return json.dumps(_without_nulls(value), sort_keys=True)


def _restore_examples(node: Any) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "example" and isinstance(v, (dict, list)):
                node[k] = _EXAMPLES.get(_fingerprint(v), v)
            else:
                _restore_examples(v)
    elif isinstance(node, list):
        for v in node:
            _restore_examples(v)


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def _json_schema(body: type[Any]) -> dict[str, Any]:
    """A request body's JSON Schema (a pydantic model or a typed dict), refs to the components."""
    template = "#/components/schemas/{model}"
    if issubclass(body, BaseModel):
        return body.model_json_schema(ref_template=template)
    return adapter(body).json_schema(ref_template=template)


def _add_component(schemas: dict[str, Any], name: str, schema: dict[str, Any]) -> None:
    """``schema`` under ``name`` in ``components.schemas``, and the models of its ``$defs``."""
    for def_name, s in schema.pop("$defs", {}).items():
        _add_component(schemas, def_name, s)
    if schemas.setdefault(name, schema) != schema:
        raise RuntimeError(f"two different OpenAPI schemas named {name}")


def _hoist_defs(op: dict[str, Any], schemas: dict[str, Any]) -> None:
    """A request body schema written out by hand (``Model.model_json_schema()``) brings its
    models in ``$defs``: they go to ``components.schemas``, where its refs point."""
    for media in op.get("requestBody", {}).get("content", {}).values():
        for name, s in media.get("schema", {}).pop("$defs", {}).items():
            _add_component(schemas, name, s)


def _tidy_success(op: dict[str, Any]) -> None:
    for status, response in op.get("responses", {}).items():
        if not status.startswith("2"):
            continue
        for media in response.get("content", {}).values():
            s = media.get("schema")
            if isinstance(s, dict) and "$ref" in s and len(s) > 1:
                media["schema"] = {"$ref": s["$ref"]}


def _secure(op: dict[str, Any], access: Access) -> None:
    op["x-shadowlimit-access"] = access.value
    text = f"**Access:** {_ACCESS_TEXT[access]}."
    op["description"] = f"{op['description']}\n\n{text}" if op.get("description") else text
    if access is Access.OPEN:
        return
    required = access in (Access.OPERATOR, Access.ADMIN)
    op["security"] = [{BEARER: []}] if required else [{BEARER: []}, {}]
    responses = op.setdefault("responses", {})
    for status in (401, 403) if required else (401,):  # any valid token may read
        if str(status) not in responses:
            responses[str(status)] = _error(status, _CLIENT_401 if access is Access.DATA else None)
