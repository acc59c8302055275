"""The data plane: ``POST /v1/decide`` and ``POST /v1/decide/batch``."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError

from limiter.keys import InvalidKeyError

from .. import incidents
from ..engine import DecideInput, DecideResult, PlainInput, UnknownRoute
from .deps import ApiError
from .schemas import MAX_BATCH, BatchRequest, BatchResponse, DecideRequest, DecideResponse, ErrorBody

router = APIRouter(prefix="/v1", tags=["decide"])

_REJECTION = {"error": "rate limit exceeded", "message": "Too many requests. Please try again later."}


def _missing(
    route: str | None, path: str | None, key: str | None, client_ip: str | None, headers: Any
) -> ApiError | None:
    """The error for an item that names no route or no key, if it is one."""
    if route is None and path is None:
        return ApiError(422, "invalid_request", "give either route or method + path", field="route")
    if key is None and client_ip is None and not headers:
        return ApiError(422, "invalid_request", "give either key or client_ip + headers", field="key")
    return None


def _input(req: DecideRequest) -> DecideInput:
    missing = _missing(req.route, req.path, req.key, req.client_ip, req.headers)
    if missing is not None:
        raise missing
    return DecideInput(
        route=req.route,
        method=req.method,
        path=req.path,
        key=req.key,
        client_ip=req.client_ip,
        headers=req.headers,
        cost=req.cost,
        request_id=req.request_id,
    )


def _body(result: DecideResult) -> dict[str, Any]:
    body = result.to_dict()
    return body if result.allowed else _rejected(body)


def _rejected(body: dict[str, Any]) -> dict[str, Any]:
    """A rejected decision's body: its ``to_dict()`` form plus seed 002's error fields."""
    body.update(_REJECTION)
    body["identifier"] = f"{body['route']}:{body['key']}"
    if body["list_match"] == "deny":
        body["error"] = "denied"
        body["message"] = "This client is on the route's deny list."
    elif body["enforced_by"] == "failure_policy":
        body["message"] = "The rate-limit backend is unavailable and this route fails closed."
    return body


def _translate(exc: Exception) -> ApiError:
    """The answer for an item the engine refused, or for one whose decision failed
    unexpectedly: a 500-like error with an incident id (the traceback is logged under
    it; the exception's text is never sent)."""
    if isinstance(exc, UnknownRoute):
        return ApiError(404, "unknown_route", f"no route named {exc.route!r}", field="route")
    if isinstance(exc, InvalidKeyError):
        return ApiError(422, "invalid_key", str(exc), field=exc.field)
    if isinstance(exc, ValueError):
        msg = str(exc)
        field = msg.split(":", 1)[0] if ":" in msg else "request"
        return ApiError(422, "invalid_request", msg, field=field)
    return ApiError(500, "internal_error", incidents.MESSAGE, incident=incidents.report(exc, "a /v1/decide/batch item"))


_RESPONSES: dict[int | str, dict[str, Any]] = {
    429: {
        "model": DecideResponse,
        "description": "Rejected by the limiter (seed 002 body, Retry-After, rate-limit headers).",
    },
    403: {"model": DecideResponse, "description": "Rejected by the route's deny list."},
    401: {"model": ErrorBody},
    404: {"model": ErrorBody},
    422: {"model": ErrorBody},
    500: {"model": DecideResponse, "description": "failClosed with RATE_LIMIT_FAILURE_CODE in 5xx"},
    503: {"model": DecideResponse, "description": "failClosed with RATE_LIMIT_FAILURE_CODE=503"},
}


_DECIDE_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DecideRequest"}}},
}


def _validate(model: Any, raw: bytes) -> Any:
    """Parse and validate a JSON body straight from bytes (pydantic-core), skipping
    FastAPI's generic body handling on the hot path; errors become the usual 422."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False), body=None) from None


@router.post(
    "/decide", response_model=DecideResponse, responses=_RESPONSES, openapi_extra={"requestBody": _DECIDE_BODY}
)
async def decide(request: Request) -> Response:
    """Decide one request under its route's mode; the response says who enforced it."""
    engine = request.app.state.engine
    req = _validate(DecideRequest, await request.body())
    try:
        result = await engine.decide(_input(req))
    except (UnknownRoute, InvalidKeyError, ValueError) as exc:
        raise _translate(exc) from exc
    return Response(
        orjson.dumps(_body(result)),
        status_code=result.status_code,
        headers=result.headers,
        media_type="application/json",
    )


_BATCH_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": BatchRequest.model_json_schema(ref_template="#/components/schemas/{model}")}
    },
}


_ITEM_FIELDS = frozenset(DecideRequest.model_fields)
_PLAIN_FIELDS = frozenset({"route", "key", "cost", "request_id"})
_NO_HEADERS: Any = object()


def _fast_items(raw: bytes) -> list[DecideInput | PlainInput | ApiError] | None:
    """The batch body parsed with orjson and checked by hand: the inputs (or the item's
    ApiError) exactly as pydantic + :func:`_input` would give them (an item with just a
    route, a key and maybe cost and request_id as a PlainInput tuple), or None whenever
    anything is not plainly valid (bad JSON, unknown fields, a value of another type or
    out of range, ...). The caller then lets pydantic parse the body, so every 422 is
    pydantic's own, except one: more than ``MAX_BATCH`` items raise the 422 naming
    ``requests`` here, before any item is validated. Mirrors
    :class:`~.schemas.DecideRequest` and :class:`~.schemas.BatchRequest` (a test keeps
    them in step)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if body.__class__ is not dict:
        return None
    items = body.get("requests")
    if items.__class__ is not list:
        return None
    if len(items) > MAX_BATCH:  # refused before any item is looked at (pydantic checks every item first)
        raise RequestValidationError(
            [
                {
                    "type": "too_long",
                    "loc": ("body", "requests"),
                    "msg": f"at most {MAX_BATCH} items per batch, got {len(items)}",
                    "input": None,
                }
            ],
            body=None,
        )
    if len(body) != 1 or not items:
        return None
    fields = _ITEM_FIELDS
    plain = _PLAIN_FIELDS
    out: list[DecideInput | PlainInput | ApiError] = []
    append = out.append
    for it in items:
        if it.__class__ is not dict:
            return None
        keys = it.keys()
        simple = keys <= plain
        if not simple and not keys <= fields:
            return None
        route = it.get("route")
        key = it.get("key")
        if route is not None and (route.__class__ is not str or not 1 <= len(route) <= 64):
            return None
        if key is not None and (key.__class__ is not str or not 1 <= len(key) <= 256):
            return None
        cost = it.get("cost", 1)
        if cost.__class__ is not int or not 1 <= cost <= 1_000_000:
            return None
        request_id = it.get("request_id")
        if request_id is not None and (request_id.__class__ is not str or len(request_id) > 128):
            return None
        if simple:  # only route / key / cost / request_id
            if route is not None and key is not None:
                append((route, key, cost, request_id))  # the engine's PlainInput
                continue
            method = path = client_ip = None
            headers: dict[str, str] = {}
        else:
            method = it.get("method")
            if method is not None and (
                method.__class__ is not str
                or not 1 <= len(method) <= 16
                or not method.isascii()
                or not method.isalpha()
            ):
                return None
            path = it.get("path")
            if path is not None and (path.__class__ is not str or not 1 <= len(path) <= 2048 or path[0] != "/"):
                return None
            client_ip = it.get("client_ip")
            if client_ip is not None and (client_ip.__class__ is not str or len(client_ip) > 64):
                return None
            h = it.get("headers", _NO_HEADERS)
            if h is _NO_HEADERS:
                headers = {}
            elif h.__class__ is not dict or len(h) > 100 or any(v.__class__ is not str for v in h.values()):
                return None
            else:
                headers = h
        missing = _missing(route, path, key, client_ip, headers)
        append(
            missing
            if missing is not None
            else DecideInput(route, method, path, key, client_ip, headers, cost, request_id)
        )
    return out


@router.post(
    "/decide/batch",
    response_model=BatchResponse,
    responses={401: {"model": ErrorBody}, 422: {"model": ErrorBody}},
    openapi_extra={"requestBody": _BATCH_BODY},
)
async def decide_batch(request: Request) -> Response:
    """Many decisions in order; a bad item gets an error in its place, the rest are decided.
    Distributed enforcement for the whole batch goes to Redis as one pipelined burst."""
    engine = request.app.state.engine
    raw = await request.body()
    inputs = _fast_items(raw)
    if inputs is None:
        req = _validate(BatchRequest, raw)
        inputs = []
        for item in req.requests:
            try:
                inputs.append(_input(item))
            except ApiError as exc:
                inputs.append(exc)
    valid = [i for i in inputs if i.__class__ is not ApiError]
    results = iter(await engine.decide_many(valid, as_dicts=True))  # type: ignore[arg-type]
    out: list[dict[str, Any]] = []
    append = out.append
    for i, item in enumerate(inputs):
        res: Any = item if item.__class__ is ApiError else next(results)
        if res.__class__ is dict:
            append(res if res["allowed"] else _rejected(res))
            continue
        e = res if isinstance(res, ApiError) else _translate(res)
        err = {"error": e.error, "message": e.message, "index": i, "field": e.details.get("field"), "status": e.status}
        if "incident" in e.details:
            err["incident"] = e.details["incident"]
        append(err)
    return Response(orjson.dumps({"decisions": out}), media_type="application/json")
