"""Request bodies read by their models (one parser for every endpoint), and the one shape of a
422 that names the bad field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, TypeAdapter, ValidationError

__all__ = ["adapter", "invalid_request", "json_body", "reader", "validate_body"]

M = TypeVar("M")


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def adapter(body: type[M]) -> TypeAdapter[M]:
    """The validator of a request body type that is not a model (a typed dict), built once."""
    a = _ADAPTERS.get(body)
    if a is None:
        a = _ADAPTERS[body] = TypeAdapter(body)
    return a


def validate_body(model: type[M], raw: bytes) -> M:
    """Parse and validate a JSON body straight from bytes (pydantic-core's parser, under the
    model's strictness: :class:`~.schemas.StrictBody`, :data:`~.schemas.STRICT`); ``model`` is
    a pydantic model or a typed dict. Every error, of the JSON itself (not JSON, not UTF-8,
    nested too deep) or of a field, is the usual 422 naming it (``body`` for the JSON as a
    whole)."""
    return reader(model)(raw)


_READERS: dict[Any, Callable[[bytes], Any]] = {}


def reader(model: type[M]) -> Callable[[bytes], M]:
    """:func:`validate_body` for one ``model``, made once (what a hot endpoint calls)."""
    read = _READERS.get(model)
    if read is None:
        # a typed dict's validator called straight (the adapter's method adds its own call per body)
        validate: Callable[[bytes], Any] = (
            model.model_validate_json if issubclass(model, BaseModel) else adapter(model).validator.validate_json
        )

        def read(raw: bytes) -> M:
            try:
                return validate(raw)  # type: ignore[no-any-return]
            except ValidationError as exc:
                errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False, include_input=False)]
                raise RequestValidationError(errors, body=None) from None

        _READERS[model] = read
    return read


def json_body(model: type[M]) -> Any:
    """A dependency giving the request's JSON body as ``model``, read by :func:`validate_body`:
    every endpoint's body is parsed as ``/v1/decide``'s is (FastAPI's own body handling
    parses with :mod:`json` and answers a body nested too deep with a 400). The operation
    declares the body with :func:`~.openapi.json_request`."""

    async def parse(request: Request) -> M:
        return validate_body(model, await request.body())

    return Depends(parse)


def _field_of(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        where = parts.pop(0)
        if not parts:
            return where
    return ".".join(parts)


def invalid_request(errors: list[Any]) -> dict[str, Any]:
    """The 422 body of a request that failed validation (the app's handler and the decision
    endpoints): the first bad field and its message, and every error."""
    first = errors[0] if errors else {}
    field = _field_of(tuple(first.get("loc", ())))
    msg = f"{field}: {first.get('msg', 'invalid value')}"
    details = [{"field": _field_of(tuple(e.get("loc", ()))), "message": e.get("msg")} for e in errors]
    return {"error": "invalid_request", "message": msg, "field": field, "errors": details}
