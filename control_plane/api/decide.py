"""The data plane: ``POST /v1/decide`` and ``POST /v1/decide/batch``."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from limiter.keys import InvalidKeyError

from ..decision import DecideError, Decider, DecideResult, UnknownRoute
from ..observe import incidents
from . import examples
from .deps import ApiError
from .openapi import RATE_LIMIT_HEADERS, RETRY_AFTER, errors, json_request, keep_example, ok
from .requests import parse_batch, to_input, validate_body
from .schemas import BatchRequest, BatchResponse, DecideRequest, DecideResponse, ErrorBody

router = APIRouter(prefix="/v1", tags=["decide"])

_COST_422 = {
    "error": "invalid_request",
    "message": "cost: Input should be greater than or equal to 1",
    "field": "cost",
    "errors": [{"field": "cost", "message": "Input should be greater than or equal to 1"}],
}

REJECTION = {"error": "rate limit exceeded", "message": "Too many requests. Please try again later."}


def body_of(result: DecideResult) -> dict[str, Any]:
    body = result.to_dict()
    return body if result.allowed else rejected(body)


def rejected(body: dict[str, Any]) -> dict[str, Any]:
    """A rejected decision's body: its ``to_dict()`` form plus the rejection's error fields."""
    body.update(REJECTION)
    body["identifier"] = f"{body['route']}:{body['key']}"
    if body["list_match"] == "deny":
        body["error"] = "denied"
        body["message"] = "This client is on the route's deny list."
    elif body["enforced_by"] == "failure_policy":
        body["message"] = "The rate-limit backend is unavailable and this route fails closed."
    return body


def translate(exc: Exception) -> ApiError:
    """The answer for an item the engine refused, or for one whose decision failed
    unexpectedly: a 500-like error with an incident id (the traceback is logged under
    it; the exception's text is never sent)."""
    if isinstance(exc, UnknownRoute):
        return ApiError(404, "unknown_route", f"no route named {exc.route!r}", field="route")
    if isinstance(exc, InvalidKeyError):
        return ApiError(422, "invalid_key", str(exc), field=exc.field)
    if isinstance(exc, DecideError):
        return ApiError(422, "invalid_request", str(exc), field=exc.field)
    return ApiError(500, "internal_error", incidents.MESSAGE, incident=incidents.report(exc, "a /v1/decide/batch item"))


def _decision(description: str, example: dict[str, Any], model: Any = DecideResponse) -> dict[str, Any]:
    return {
        "model": model,
        "description": description,
        "headers": RATE_LIMIT_HEADERS if example["allowed"] else {**RATE_LIMIT_HEADERS, **RETRY_AFTER},
        "content": {"application/json": {"example": keep_example(example)}},
    }


#: a decision's answers (the same body for every status, with the rate-limit headers;
#: Retry-After on rejections); declared only: the handler's bytes go out as they are
DECISION_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _decision("Allowed.", examples.DECISION),
    429: _decision("Rejected by the limiter (the rejection body, Retry-After).", examples.REJECTION),
    403: _decision(
        "Rejected by the route's deny list.",
        {
            **examples.REJECTION,
            "list_match": "deny",
            "status_code": 403,
            "error": "denied",
            "message": "This client is on the route's deny list.",
        },
    ),  # fmt: skip
    500: _decision(
        "failClosed while Redis fails, with the route's failure_code in 5xx; or internal_error (an incident id).",
        {
            **examples.REJECTION,
            "enforced_by": "failure_policy",
            "status_code": 500,
            "message": "The rate-limit backend is unavailable and this route fails closed.",
        },
        DecideResponse | ErrorBody,
    ),  # fmt: skip
    503: _decision(
        "failClosed while Redis fails, with RATE_LIMIT_FAILURE_CODE=503.",
        {
            **examples.REJECTION,
            "enforced_by": "failure_policy",
            "status_code": 503,
            "message": "The rate-limit backend is unavailable and this route fails closed.",
        },
    ),  # fmt: skip
    **errors(404, 413, 422, e422=_COST_422),
}


@router.post(
    "/decide",
    response_model=DecideResponse,
    responses=DECISION_RESPONSES,
    openapi_extra=json_request(DecideRequest, examples.DECIDE_REQUEST),
)
async def decide(request: Request) -> Response:
    """Decide one request under its route's mode; the response says who enforced it."""
    decider: Decider = request.app.state.engine.decider
    req = validate_body(DecideRequest, await request.body())
    try:
        result = await decider.decide(to_input(req))
    except (UnknownRoute, InvalidKeyError, DecideError) as exc:
        raise translate(exc) from exc
    return Response(
        orjson.dumps(body_of(result)),
        status_code=result.status_code,
        headers=result.headers,
        media_type="application/json",
    )


@router.post(
    "/decide/batch",
    response_model=BatchResponse,
    responses={**ok(BatchResponse, examples.BATCH), **errors(413, 422)},
    openapi_extra=json_request(BatchRequest, examples.BATCH_REQUEST),
)
async def decide_batch(request: Request) -> Response:
    """Many decisions in order; a bad item gets an error in its place, the rest are decided.
    Distributed enforcement for the whole batch goes to Redis as one pipelined burst."""
    decider: Decider = request.app.state.engine.decider
    raw = await request.body()
    inputs = parse_batch(raw)
    if inputs is None:
        inputs = []
        for item in validate_body(BatchRequest, raw).requests:
            try:
                inputs.append(to_input(item))
            except ApiError as exc:
                inputs.append(exc)
    return Response(await batch_body(decider, inputs), media_type="application/json")


async def batch_body(decider: Decider, inputs: list[Any]) -> bytes:
    """The batch answer's JSON for parsed items (an :class:`ApiError` in place of a bad one)."""
    valid: list[Any] = [i for i in inputs if i.__class__ is not ApiError]
    results = iter(await decider.decide_many(valid))
    out: list[dict[str, Any]] = []
    append = out.append
    for i, item in enumerate(inputs):
        res: Any = item if item.__class__ is ApiError else next(results)
        if res.__class__ is DecideResult:
            append(body_of(res))
            continue
        e = res if isinstance(res, ApiError) else translate(res)
        err = {"error": e.error, "message": e.message, "index": i, "field": e.details.get("field"), "status": e.status}
        if "incident" in e.details:
            err["incident"] = e.details["incident"]
        append(err)
    return orjson.dumps({"decisions": out})
