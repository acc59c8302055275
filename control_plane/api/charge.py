"""Charges over HTTP: ``POST /v1/charge`` and ``POST /v1/charge/batch``, a cost known only
after the answer (an LLM answer's tokens, the bytes sent) with no reservation made for it.

A charge is counted whatever is left (:class:`limiter.policy.Charge`, docs/algorithms.md#charges):
it is **never refused for the budget's sake**, only for what is wrong with it (an unknown route,
a bad key, a cost that is not a whole number from 0 to 10^9, a route whose limit cannot take
charges). It goes through the one decision path as a request would, under the route's mode:
the local limiter is charged, and the distributed one where its answer counts (or in shadow,
beside it); the answer says whether it fitted (``over``), what is left (``remaining``,
negative in debt) and when a request of one unit would be allowed again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from limiter.policy import Charge

from ..decision import DecideInput, Decider, DecideResult
from . import examples
from .decide import DECIDE_ERRORS, Answer, as_response, error_answer, invalid_answer, item_error, json_answer, translate
from .openapi import errors, json_request, ok
from .requests import reader
from .schemas import ChargeBatchRequest, ChargeBatchResponse, ChargeRequest, ChargeResponse

__all__ = ["charge_answer", "charge_batch_answer", "charged", "router"]

_read_charge = reader(ChargeRequest)
_read_batch = reader(ChargeBatchRequest)

router = APIRouter(prefix="/v1", tags=["decide"])


def charged(result: DecideResult, cost: int) -> dict[str, Any]:
    """A charge's answer as the HTTP API sends it (:class:`~.schemas.ChargeResponse`)."""
    d = result.enforced
    return {
        "route": result.route,
        "key": result.key,
        "cost": cost,
        "over": not d.allowed,
        "remaining": d.remaining,
        "limit": d.limit,
        "retry_after_us": d.retry_after_us,
        "reset_after_us": d.reset_after_us,
        "mode": result.mode,
        "enforced_by": result.enforced_by,
        "request_id": result.request_id,
        "local": result.local.to_dict(),
        "distributed": None if result.distributed is None else result.distributed.to_dict(),
        "backend_error": result.backend_error,
    }


def _input(req: ChargeRequest) -> DecideInput:
    fields: dict[str, Any] = dict(req)
    fields["cost"] = Charge(req["cost"])
    return DecideInput(**fields)


@router.post(
    "/charge",
    response_model=ChargeResponse,
    responses={**ok(ChargeResponse, examples.CHARGE), **errors(404, 413, 422)},
    openapi_extra=json_request(ChargeRequest, examples.CHARGE_REQUEST),
)
async def charge(request: Request) -> Response:
    """Charge a cost known only after the answer: counted whatever is left (never refused for
    the budget's sake); the answer says whether it fitted and what is left, negative in debt."""
    return as_response(await charge_answer(request.app.state.engine.decider, await request.body()))


@router.post(
    "/charge/batch",
    response_model=ChargeBatchResponse,
    responses={**ok(ChargeBatchResponse, examples.CHARGE_BATCH), **errors(413, 422)},
    openapi_extra=json_request(ChargeBatchRequest, examples.CHARGE_BATCH_REQUEST),
)
async def charge_batch(request: Request) -> Response:
    """Many charges in order; a bad item gets an error in its place, the rest are charged (the
    distributed ones as one pipelined burst to Redis)."""
    return as_response(await charge_batch_answer(request.app.state.engine.decider, await request.body()))


async def charge_answer(decider: Decider, body: bytes) -> Answer:
    """``POST /v1/charge``: the body, its charge, the answer (200 unless the charge is invalid)."""
    try:
        req = _read_charge(body)
    except RequestValidationError as exc:
        return invalid_answer(exc)
    try:
        result = await decider.decide(_input(req), headers=False)
    except DECIDE_ERRORS as exc:
        return error_answer(translate(exc))
    return json_answer(200, orjson.dumps(charged(result, req["cost"])))


async def charge_batch_answer(decider: Decider, body: bytes) -> Answer:
    """``POST /v1/charge/batch``: each item's charge, or its error in place."""
    try:
        items: Sequence[ChargeRequest] = _read_batch(body)["charges"]
    except RequestValidationError as exc:
        return invalid_answer(exc)
    results = await decider.decide_many([_input(r) for r in items], headers=False)
    out: list[dict[str, Any]] = []
    for i, (req, res) in enumerate(zip(items, results, strict=True)):
        if res.__class__ is DecideResult:
            out.append(charged(res, req["cost"]))
            continue
        out.append(item_error(i, res))
    return json_answer(200, orjson.dumps({"charges": out}))
