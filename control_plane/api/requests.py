"""Decide request bodies into engine inputs: the pydantic path for a single decision and for
any batch the hand-written check does not take, and :func:`parse_batch`, the batch body's
fast check (orjson and the schema's own bounds, no model objects), which gives exactly
what pydantic + :func:`to_input` would give or steps aside."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from ..decision import DecideInput, PlainInput
from .deps import ApiError
from .schemas import (
    CLIENT_IP_LEN,
    COST_RANGE,
    KEY_LEN,
    MAX_BATCH,
    MAX_HEADERS,
    METHOD_LEN,
    PATH_LEN,
    REQUEST_ID_LEN,
    ROUTE_LEN,
    DecideRequest,
)

__all__ = ["BatchItem", "json_body", "missing_target", "parse_batch", "to_input", "validate_body"]

M = TypeVar("M", bound=BaseModel)

#: one parsed batch item: an input for the engine, or the item's own error
BatchItem = DecideInput | PlainInput | ApiError

_ITEM_FIELDS = frozenset(DecideRequest.model_fields)
_PLAIN_FIELDS = frozenset({"route", "key", "cost", "request_id"})
_NO_HEADERS: Any = object()


def validate_body(model: type[M], raw: bytes) -> M:
    """Parse and validate a JSON body straight from bytes (pydantic-core's parser, under the
    model's strictness: :class:`~.schemas.StrictBody`); every error, of the JSON itself
    (not JSON, not UTF-8, nested too deep) or of a field, is the usual 422 naming it
    (``body`` for the JSON as a whole)."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=None) from None


def json_body(model: type[M]) -> Any:
    """A dependency giving the request's JSON body as ``model``, read by :func:`validate_body`:
    every endpoint's body is parsed as ``/v1/decide``'s is (FastAPI's own body handling
    parses with :mod:`json` and answers a body nested too deep with a 400). The operation
    declares the body with :func:`~.openapi.json_request`."""

    async def parse(request: Request) -> M:
        return validate_body(model, await request.body())

    return Depends(parse)


def missing_target(
    route: str | None, path: str | None, key: str | None, client_ip: str | None, headers: Any
) -> ApiError | None:
    """The error for an item that names no route or no key, if it is one."""
    if route is None and path is None:
        return ApiError(422, "invalid_request", "give either route or method + path", field="route")
    if key is None and client_ip is None and not headers:
        return ApiError(422, "invalid_request", "give either key or client_ip + headers", field="key")
    return None


def to_input(req: DecideRequest) -> DecideInput:
    missing = missing_target(req.route, req.path, req.key, req.client_ip, req.headers)
    if missing is not None:
        raise missing
    return DecideInput(
        route=req.route, method=req.method, path=req.path, key=req.key, client_ip=req.client_ip,
        headers=req.headers, cost=req.cost, request_id=req.request_id,
    )  # fmt: skip


def _text(v: Any, bounds: tuple[int, int]) -> bool:
    """``v`` is absent or a string of a length within ``bounds``."""
    return v is None or (v.__class__ is str and bounds[0] <= len(v) <= bounds[1])


def _too_many(n: int) -> RequestValidationError:
    msg = f"at most {MAX_BATCH} items per batch, got {n}"
    return RequestValidationError([{"type": "too_long", "loc": ("body", "requests"), "msg": msg, "input": None}])


def parse_batch(raw: bytes) -> list[BatchItem] | None:
    """The batch body checked by hand: each item as pydantic + :func:`to_input` would give
    it (an item with just a route, a key and maybe cost and request_id as a PlainInput
    tuple), or None whenever anything is not plainly valid (bad JSON, unknown fields, a
    value of another type or out of range, ...): the caller then lets pydantic parse the
    body, so every 422 is pydantic's own, except one: more than ``MAX_BATCH`` items are
    refused here, before any item is validated. A test keeps this in step with
    :class:`~.schemas.DecideRequest` and :class:`~.schemas.BatchRequest`."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    items = body.get("requests") if body.__class__ is dict else None
    if items.__class__ is not list:
        return None
    if len(items) > MAX_BATCH:  # refused before any item is looked at (pydantic checks every item first)
        raise _too_many(len(items))
    if len(body) != 1 or not items:
        return None
    out: list[BatchItem] = []
    append = out.append
    for it in items:
        item = plain_item(it)
        if item is None:
            return None
        append(item)
    return out


_RMIN, _RMAX = ROUTE_LEN
_KMIN, _KMAX = KEY_LEN


def plain_item(it: Any) -> BatchItem | None:
    """One decide request's JSON (a batch item, or ``POST /v1/decide``'s body) as
    :func:`parse_batch` reads it: the usual ``{"route": ..., "key": ...}`` checked inline
    (a dict of two entries with both is exactly that), anything else by :func:`_item`."""
    if it.__class__ is dict and len(it) == 2:
        route, key = it.get("route"), it.get("key")
        if (
            route.__class__ is str
            and key.__class__ is str
            and _RMIN <= len(route) <= _RMAX
            and _KMIN <= len(key) <= _KMAX
        ):
            return (route, key, 1, None)
    return _item(it)


def _item(it: Any) -> BatchItem | None:
    if it.__class__ is not dict:
        return None
    keys = it.keys()
    simple = keys <= _PLAIN_FIELDS
    if not simple and not keys <= _ITEM_FIELDS:
        return None
    route, key, request_id = it.get("route"), it.get("key"), it.get("request_id")
    cost = it.get("cost", 1)
    if not (_text(route, ROUTE_LEN) and _text(key, KEY_LEN) and _text(request_id, REQUEST_ID_LEN)):
        return None
    if cost.__class__ is not int or not COST_RANGE[0] <= cost <= COST_RANGE[1]:
        return None
    if simple and route is not None and key is not None:
        return (route, key, cost, request_id)  # the engine's PlainInput
    full = _full_fields(it) if not simple else (None, None, None, {})
    if full is None:
        return None
    method, path, client_ip, headers = full
    missing = missing_target(route, path, key, client_ip, headers)
    if missing is not None:
        return missing
    return DecideInput(
        route=route, method=method, path=path, key=key, client_ip=client_ip, headers=headers, cost=cost,
        request_id=request_id,
    )  # fmt: skip


def _full_fields(it: dict[str, Any]) -> tuple[Any, Any, Any, dict[str, str]] | None:
    """(method, path, client_ip, headers) of an item that has more than the plain fields."""
    method, path, client_ip = it.get("method"), it.get("path"), it.get("client_ip")
    if not _text(method, METHOD_LEN) or (method is not None and not (method.isascii() and method.isalpha())):
        return None
    if not _text(path, PATH_LEN) or (path is not None and path[0] != "/"):
        return None
    if not _text(client_ip, CLIENT_IP_LEN):
        return None
    h = it.get("headers", _NO_HEADERS)
    if h is _NO_HEADERS:
        return method, path, client_ip, {}
    if h.__class__ is not dict or len(h) > MAX_HEADERS or any(v.__class__ is not str for v in h.values()):
        return None
    return method, path, client_ip, h
