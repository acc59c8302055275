"""The data plane: ``POST /v1/decide`` and ``POST /v1/decide/batch``."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError

from limiter.keys import InvalidKeyError

from ..engine import DecideInput, DecideResult, UnknownRoute
from .deps import ApiError, require_client
from .schemas import BatchRequest, BatchResponse, DecideRequest, DecideResponse, ErrorBody

router = APIRouter(prefix="/v1", tags=["decide"])

_REJECTION = {"error": "rate limit exceeded", "message": "Too many requests. Please try again later."}


def _input(req: DecideRequest) -> DecideInput:
    if req.route is None and req.path is None:
        raise ApiError(422, "invalid_request", "give either route or method + path", field="route")
    if req.key is None and req.client_ip is None and not req.headers:
        raise ApiError(422, "invalid_request", "give either key or client_ip + headers", field="key")
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
    if not result.allowed:
        body.update(_REJECTION)
        body["identifier"] = f"{result.route}:{result.key}"
        if result.list_match == "deny":
            body["error"] = "denied"
            body["message"] = "This client is on the route's deny list."
        elif result.enforced_by == "failure_policy":
            body["message"] = "The rate-limit backend is unavailable and this route fails closed."
    return body


def _translate(exc: Exception) -> ApiError:
    if isinstance(exc, UnknownRoute):
        return ApiError(404, "unknown_route", f"no route named {exc.route!r}", field="route")
    if isinstance(exc, InvalidKeyError):
        return ApiError(422, "invalid_key", str(exc), field=exc.field)
    if isinstance(exc, ValueError):
        msg = str(exc)
        field = msg.split(":", 1)[0] if ":" in msg else "request"
        return ApiError(422, "invalid_request", msg, field=field)
    raise exc


_RESPONSES: dict[int | str, dict[str, Any]] = {
    429: {"model": DecideResponse, "description": "Rejected by the limiter (seed 002 body, Retry-After, rate-limit headers)."},
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


async def _parse(request: Request, model: Any) -> Any:
    """Parse and validate a JSON body straight from bytes (pydantic-core), skipping
    FastAPI's generic body handling on the hot path; errors become the usual 422."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False), body=None) from None


@router.post("/decide", response_model=DecideResponse, responses=_RESPONSES, openapi_extra={"requestBody": _DECIDE_BODY})
async def decide(request: Request) -> Response:
    """Decide one request under its route's mode; the response says who enforced it."""
    await require_client(request)
    engine = request.app.state.engine
    req = await _parse(request, DecideRequest)
    try:
        result = await engine.decide(_input(req))
    except (UnknownRoute, InvalidKeyError, ValueError) as exc:
        raise _translate(exc) from exc
    return Response(orjson.dumps(_body(result)), status_code=result.status_code, headers=result.headers, media_type="application/json")


_BATCH_BODY = {
    "required": True,
    "content": {"application/json": {"schema": BatchRequest.model_json_schema(ref_template="#/components/schemas/{model}")}},
}


@router.post(
    "/decide/batch",
    response_model=BatchResponse,
    responses={401: {"model": ErrorBody}, 422: {"model": ErrorBody}},
    openapi_extra={"requestBody": _BATCH_BODY},
)
async def decide_batch(request: Request) -> Response:
    """Many decisions in order; a bad item gets an error in its place, the rest are decided.
    Distributed enforcement for the whole batch goes to Redis as one pipelined burst."""
    await require_client(request)
    engine = request.app.state.engine
    req = await _parse(request, BatchRequest)
    inputs: list[DecideInput | ApiError] = []
    for item in req.requests:
        try:
            inputs.append(_input(item))
        except ApiError as exc:
            inputs.append(exc)
    valid = [i for i in inputs if isinstance(i, DecideInput)]
    results = iter(await engine.decide_many(valid))
    out: list[dict[str, Any]] = []
    for i, item in enumerate(inputs):
        res: Any = item if isinstance(item, ApiError) else next(results)
        if isinstance(res, DecideResult):
            out.append(_body(res))
            continue
        e = res if isinstance(res, ApiError) else _translate(res)
        out.append({"error": e.error, "message": e.message, "index": i, "field": e.details.get("field")})
    return Response(orjson.dumps({"decisions": out}), media_type="application/json")
