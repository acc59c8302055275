"""``GET /v1/external``: routes with external limits, their per-key breakers, cache and call figures."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from . import examples
from .deps import ApiError, ExternalDep, RulesDep
from .openapi import errors, ok
from .responses import ExternalReport

router = APIRouter(prefix="/v1", tags=["observe"])


@router.get("/external", responses={**ok(ExternalReport, examples.EXTERNAL), **errors(404, 422)})
async def external(
    rules: RulesDep,
    external: ExternalDep,
    route: str | None = Query(None, max_length=256),
    limit: int = Query(100, ge=1, le=1000),
) -> dict[str, Any]:
    """This replica's view of the external limits services: each route's service and
    settings, the per-key circuit breakers (open and half-open first, with failures and
    the next probe), cache hits, misses and stale copies used, calls and errors by kind,
    and where decisions took their limits from."""
    if route is not None and rules.current.get(route) is None:
        raise ApiError(404, "unknown_route", f"no route named {route!r}", field="route")
    return {"instance_id": rules.instance_id, **external.snapshot(limit=limit, route=route)}
