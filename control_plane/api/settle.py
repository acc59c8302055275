"""Settles over HTTP: ``POST /v1/settle`` and ``POST /v1/settle/batch`` (a reservation's actual
cost, :mod:`control_plane.decision.reservations`) and ``GET /v1/reservations`` (a key's, as each
store holds them).

A settle is idempotent: the same reservation settled again, on any replica, answers the first
settle's answer (``status: again``) and charges nothing. It is refused naming the field: a cost
that is not a whole number from 0 to 10^9, an id that is not one (or is another namespace's)
(422); a reservation neither this replica nor Redis holds (404 ``unknown_reservation``), one that
expired first (409 ``reservation_expired``, saying whether its estimate was kept or given back),
and, where the route enforces Redis's answer, Redis not answering (503 ``backend_unavailable``:
nothing settled there, retry).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from ..decision import Decider
from . import budget_examples as examples
from .decide import SETTLE_ERRORS, Answer, as_response, error_answer, invalid_answer, item_error, json_answer, translate
from .openapi import errors, json_request, ok
from .requests import reader
from .schemas import (
    KEY_LEN,
    ROUTE_LEN,
    ReservationsResponse,
    SettleBatchRequest,
    SettleBatchResponse,
    SettleRequest,
    SettleResponse,
)

__all__ = ["router", "settle_answer", "settle_batch_answer"]

_read_settle = reader(SettleRequest)
_read_batch = reader(SettleBatchRequest)

router = APIRouter(prefix="/v1", tags=["decide"])


@router.post(
    "/settle",
    response_model=SettleResponse,
    responses={**ok(SettleResponse, examples.SETTLE), **errors(404, 409, 413, 422, 503)},
    openapi_extra=json_request(SettleRequest, examples.SETTLE_REQUEST),
)
async def settle(request: Request) -> Response:
    """Settle a reservation at its actual cost: the difference from its estimate is refunded or
    charged (into debt if need be); settled again, the first answer."""
    return as_response(await settle_answer(request.app.state.engine.decider, await request.body()))


@router.post(
    "/settle/batch",
    response_model=SettleBatchResponse,
    responses={**ok(SettleBatchResponse, examples.SETTLE_BATCH), **errors(413, 422)},
    openapi_extra=json_request(SettleBatchRequest, examples.SETTLE_BATCH_REQUEST),
)
async def settle_batch(request: Request) -> Response:
    """Many settles at once; a bad or failed item gets its error in its place (with the status it
    would have got alone), the rest are settled."""
    return as_response(await settle_batch_answer(request.app.state.engine.decider, await request.body()))


@router.get(
    "/reservations",
    response_model=ReservationsResponse,
    responses={**ok(ReservationsResponse, examples.RESERVATIONS), **errors(404, 422)},
)
async def reservations(
    request: Request,
    route: str = Query(..., min_length=ROUTE_LEN[0], max_length=ROUTE_LEN[1]),
    key: str = Query(..., min_length=KEY_LEN[0], max_length=KEY_LEN[1]),
) -> Response:
    """A key's reservations on a route: outstanding, settled and expired ones still remembered,
    as this replica's local limiter and Redis each hold them (ids left out: they settle)."""
    decider: Decider = request.app.state.engine.decider
    try:
        out = await decider.reservations(route, key)
    except SETTLE_ERRORS as exc:
        return as_response(error_answer(translate(exc)))
    return as_response(json_answer(200, orjson.dumps(out)))


async def settle_answer(decider: Decider, body: bytes) -> Answer:
    """``POST /v1/settle``: the body, its settle, the answer."""
    try:
        req = _read_settle(body)
    except RequestValidationError as exc:
        return invalid_answer(exc)
    try:
        result = await decider.settle_reservation(req["reservation"], req["cost"])
    except SETTLE_ERRORS as exc:
        return error_answer(translate(exc))
    return json_answer(200, orjson.dumps(result.to_dict()))


async def settle_batch_answer(decider: Decider, body: bytes) -> Answer:
    """``POST /v1/settle/batch``: each item's settle, or its error in place."""
    try:
        items = _read_batch(body)["settles"]
    except RequestValidationError as exc:
        return invalid_answer(exc)
    results = await asyncio.gather(
        *(decider.settle_reservation(r["reservation"], r["cost"]) for r in items), return_exceptions=True
    )
    out: list[dict[str, Any]] = []
    for i, res in enumerate(results):
        if isinstance(res, BaseException):
            if not isinstance(res, Exception):
                raise res
            out.append(item_error(i, res))
        else:
            out.append(res.to_dict())
    return json_answer(200, orjson.dumps({"settles": out}))
