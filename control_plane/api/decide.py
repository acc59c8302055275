"""The data plane: ``POST /v1/decide`` and ``POST /v1/decide/batch``, each implemented once.

:func:`decide_answer` and :func:`batch_answer` are the endpoints: the body read by its model
(the one parser, :func:`~.requests.validate_body`; a bad body is the usual 422) unless it is
the plain ``{"route", "key"}`` the model would read as such (:func:`plain_request`), the requests
decided through the one decision path, the answer as an :class:`Answer` (status, raw headers,
body bytes). The ASGI entry in front of the framework (:mod:`control_plane.server.hotpath`) and
the routes declared here for FastAPI and the OpenAPI document both call them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from limiter.keys import InvalidKeyError

from ..decision import (
    DecideError,
    DecideInput,
    Decider,
    DecideResult,
    ExpiredReservation,
    InputLike,
    PlainInput,
    UnknownReservation,
    UnknownRoute,
)
from ..decision.reservations import BackendUnavailable
from ..observe import incidents
from . import examples
from .deps import ApiError
from .openapi import RATE_LIMIT_HEADERS, RETRY_AFTER, errors, json_request, keep_example, ok
from .requests import invalid_request, reader
from .schemas import (
    KEY_LEN,
    MAX_BATCH,
    ROUTE_LEN,
    BatchRequest,
    BatchResponse,
    DecideRequest,
    DecideResponse,
    ErrorBody,
)

__all__ = [
    "DECIDE_ERRORS",
    "DECISION_RESPONSES",
    "REJECTION",
    "SETTLE_ERRORS",
    "Answer",
    "answer_batch",
    "as_input",
    "as_response",
    "batch_answer",
    "body_of",
    "decide_answer",
    "error_answer",
    "invalid_answer",
    "item_error",
    "json_answer",
    "plain_request",
    "raw_headers",
    "read_batch",
    "read_decide",
    "rejected",
    "result_answer",
    "router",
    "translate",
]

_read_decide = reader(DecideRequest)
_read_batch = reader(BatchRequest)

#: what the decider refuses a request with (each a 4xx naming the field)
DECIDE_ERRORS = (UnknownRoute, InvalidKeyError, DecideError)
#: what a settle is refused with besides (404, 409, 503: each naming the reservation)
SETTLE_ERRORS = (*DECIDE_ERRORS, UnknownReservation, ExpiredReservation, BackendUnavailable)


class Answer(NamedTuple):
    """An endpoint's answer: the status, the raw headers in order, the body."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


_JSON = (b"content-type", b"application/json")
_names: dict[str, bytes] = {}


def _name(k: str) -> bytes:
    name = _names[k] = k.lower().encode("latin-1")
    return name


def raw_headers(headers: Mapping[str, str], body: bytes, media: bool) -> list[tuple[bytes, bytes]]:
    """What Starlette's ``Response(body, headers=headers, media_type=...)`` sends: the headers
    lower-cased, then ``content-length``, then ``content-type``."""
    names = _names
    out: list[tuple[bytes, bytes]] = []
    add = out.append  # a loop, not a comprehension: no frame of its own (every decision passes here)
    for k, v in headers.items():
        add((names.get(k) or _name(k), v.encode("latin-1")))
    add((b"content-length", b"%d" % len(body)))
    if media:
        add(_JSON)
    return out


def json_answer(status: int, payload: bytes, headers: Mapping[str, str] | None = None) -> Answer:
    """A JSON body with ``headers`` first."""
    return Answer(status, raw_headers(headers or {}, payload, True), payload)


def error_answer(exc: ApiError) -> Answer:
    """The bytes of the app's ``ApiError`` handler (a Starlette ``JSONResponse``)."""
    content = {"error": exc.error, "message": exc.message, **exc.details}
    body = json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
    return json_answer(exc.status, body)


def invalid_answer(exc: RequestValidationError) -> Answer:
    """The bytes of the app's handler of a request that failed validation (a 422)."""
    content = invalid_request(list(exc.errors()))
    body = json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
    return json_answer(422, body)


def result_answer(result: DecideResult, status: int) -> Answer:
    """A decision as the decide endpoints answer it: its body (:func:`body_of`'s), its status,
    its headers."""
    body = result.to_dict()
    payload = orjson.dumps(body if result.enforced.allowed else rejected(body))
    return Answer(status, raw_headers(result.headers, payload, True), payload)


def as_response(answer: Answer) -> Response:
    """An :class:`Answer` as a Starlette response (the routes' way out): the same bytes."""
    response = Response(answer.body, status_code=answer.status)
    response.raw_headers = answer.headers
    return response


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
    if isinstance(exc, UnknownReservation):
        return ApiError(
            404, "unknown_reservation", "no reservation by that id here or in the distributed store (never made, or "
            "ended and forgotten)", field="reservation",
        )  # fmt: skip
    if isinstance(exc, ExpiredReservation):
        kept = "kept spent" if exc.fate == "charged" else "given back"
        return ApiError(
            409, "reservation_expired", f"the reservation expired before it was settled: its estimate of "
            f"{exc.estimate} was {kept} ({exc.fate})", field="reservation", expired=exc.fate, estimate=exc.estimate,
        )  # fmt: skip
    if isinstance(exc, BackendUnavailable):
        return ApiError(
            503, "backend_unavailable", "the distributed store could not settle it (the route enforces its answer): "
            "nothing was settled there; retry, a settle is idempotent", field="reservation", backend_error=exc.error,
        )  # fmt: skip
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
    return as_response(await decide_answer(request.app.state.engine.decider, await request.body()))


@router.post(
    "/decide/batch",
    response_model=BatchResponse,
    responses={**ok(BatchResponse, examples.BATCH), **errors(413, 422)},
    openapi_extra=json_request(BatchRequest, examples.BATCH_REQUEST),
)
async def decide_batch(request: Request) -> Response:
    """Many decisions in order; a bad item gets an error in its place, the rest are decided.
    Distributed enforcement for the whole batch goes to Redis as one pipelined burst."""
    return as_response(await batch_answer(request.app.state.engine.decider, await request.body()))


async def decide_answer(decider: Decider, body: bytes) -> Answer:
    """``POST /v1/decide``: the body, its decision, the answer."""
    try:
        req = read_decide(body)
    except RequestValidationError as exc:
        return invalid_answer(exc)
    try:
        if req.__class__ is DecideInput and req.estimate is not None:
            result = await decider.reserve(req)
        else:
            result = await decider.decide(req)
    except DECIDE_ERRORS as exc:
        return error_answer(translate(exc))
    return result_answer(result, result.status_code)


async def batch_answer(decider: Decider, body: bytes) -> Answer:
    """``POST /v1/decide/batch``: the body, each item's decision (or its error in place)."""
    try:
        requests = read_batch(body)
    except RequestValidationError as exc:
        return invalid_answer(exc)
    return await answer_batch(decider, requests)


_ROUTE_MIN, _ROUTE_MAX = ROUTE_LEN
_KEY_MIN, _KEY_MAX = KEY_LEN


def plain_request(item: Any) -> PlainInput | None:
    """A decoded JSON value that is exactly ``{"route": ..., "key": ...}``, two strings within
    :class:`~.schemas.DecideRequest`'s bounds, as the tuple the model's validation and
    :func:`as_input` give for it; None for anything else.

    The request almost every caller sends, recognised without running the model: on a served
    request pydantic-core's validation costs about 5 µs of the server's CPU (7% of a whole
    ``POST /v1/decide``, measured), far more than its cost alone in a loop. It only ever says
    yes to what the model says yes to, with the same result; everything else (other fields,
    other types, a bound passed, every error) is the model's to read and answer.
    ``tests/unit/test_request_bodies.py`` holds the two together."""
    if item.__class__ is dict and len(item) == 2:
        route, key = item.get("route"), item.get("key")
        if (
            route.__class__ is str
            and key.__class__ is str
            and _ROUTE_MIN <= len(route) <= _ROUTE_MAX
            and _KEY_MIN <= len(key) <= _KEY_MAX
        ):
            return (route, key, 1, None)
    return None


def _decoded(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # the model reads it again, and says what is wrong


def read_decide(body: bytes) -> InputLike | PlainInput:
    """``POST /v1/decide``'s body as the decider takes it: :func:`plain_request`'s, else the
    model's (:class:`RequestValidationError` for a bad body)."""
    plain = plain_request(_decoded(body))
    return plain if plain is not None else as_input(_read_decide(body))


def read_batch(body: bytes) -> list[InputLike | PlainInput]:
    """``POST /v1/decide/batch``'s items as the decider takes them: a batch of plain requests
    item by item (:func:`plain_request`), any other batch by the model (which refuses the
    whole body for one bad item)."""
    data = _decoded(body)
    if data.__class__ is dict and len(data) == 1:
        items = data.get("requests")
        if items.__class__ is list and 1 <= len(items) <= MAX_BATCH:
            out: list[InputLike | PlainInput] = []
            add = out.append
            for item in items:
                plain = plain_request(item)
                if plain is None:
                    break
                add(plain)
            else:
                return out
    return [as_input(r) for r in _read_batch(body)["requests"]]


def as_input(req: DecideRequest) -> InputLike | PlainInput:
    """A validated request as the decider takes it: the usual ``{"route", "key"}`` as a
    :data:`~control_plane.decision.PlainInput` tuple (no object built), anything else as a
    :class:`~control_plane.decision.DecideInput` (the same fields)."""
    if len(req) == 2:
        route, key = req.get("route"), req.get("key")
        if route is not None and key is not None:
            return (route, key, 1, None)
    return DecideInput(**req)


async def answer_batch(decider: Decider, requests: Sequence[InputLike | PlainInput]) -> Answer:
    """A validated batch's answer: each item's decision, or its error in place (the items with
    an estimate reserved beside the others, concurrently)."""
    reserving = [i for i, r in enumerate(requests) if r.__class__ is DecideInput and r.estimate is not None]
    if reserving:
        results = await _with_reservations(decider, requests, reserving)
    else:
        results = await decider.decide_many(requests)
    out: list[dict[str, Any]] = []
    append = out.append
    for i, res in enumerate(results):
        if res.__class__ is DecideResult:
            body = res.to_dict()  # body_of(res), without a call per item
            append(body if res.enforced.allowed else rejected(body))
            continue
        append(item_error(i, res))
    return json_answer(200, orjson.dumps({"decisions": out}))


async def _with_reservations(
    decider: Decider, requests: Sequence[InputLike | PlainInput], reserving: list[int]
) -> list[Any]:
    """Each item's answer in place: the reservations' and the decisions' of the others."""
    chosen = set(reserving)
    others = [i for i in range(len(requests)) if i not in chosen]
    decided, reserved = await asyncio.gather(
        decider.decide_many([requests[i] for i in others]),
        asyncio.gather(*(decider.reserve(requests[i]) for i in reserving), return_exceptions=True),  # type: ignore[arg-type]
    )
    out: list[Any] = [None] * len(requests)
    for i, res in zip(others, decided, strict=True):
        out[i] = res
    for i, res in zip(reserving, reserved, strict=True):
        if isinstance(res, BaseException) and not isinstance(res, Exception):
            raise res
        out[i] = res
    return out


def item_error(i: int, exc: Exception) -> dict[str, Any]:
    """A batch item the engine refused (or whose decision failed), in its place: the error,
    the item's index, the field and the status it would have got alone."""
    e = translate(exc)
    err = {"error": e.error, "message": e.message, "index": i, "field": e.details.get("field"), "status": e.status}
    if "incident" in e.details:
        err["incident"] = e.details["incident"]
    return err
