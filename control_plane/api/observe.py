"""Read models: ``/v1/divergence``, ``/v1/buckets``, ``/v1/backend``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from limiter.errors import BackendError

from ..store import StoreUnavailable
from . import examples
from .deps import ApiError, EngineDep, RolloutDep, RulesDep, ViewsDep
from .openapi import errors, ok
from .readmodels import Buckets, buckets_view, divergence_view
from .responses import BackendReport, BucketsList, DivergenceReport

router = APIRouter(prefix="/v1", tags=["observe"])


async def get_buckets(request: Request) -> Buckets:
    e = request.app.state.engine
    return Buckets(e.activity, e.adjustments, e.local, e.redis, e.breaker, clock_us=e.decider.clock_us)


BucketsDep = Annotated[Buckets, Depends(get_buckets)]


@router.get("/divergence", responses={**ok(DivergenceReport, examples.DIVERGENCE), **errors(422, 503)})
async def divergence(
    rules: RulesDep, views: ViewsDep, rollout: RolloutDep, minutes: int = Query(60, ge=1, le=120)
) -> dict[str, Any]:
    """Per route: fleet-wide agree / new rejections / reverse counts, rates, a per-minute series
    and the keys that enforcement would block (who would be blocked); and its candidate limit
    against its current one (newly rejected, newly admitted, per minute since it was set,
    who it would newly reject, its gate), or null."""
    try:
        return await divergence_view(rules.current, views, minutes, rollout.adjustments.candidates, rollout)
    except (StoreUnavailable, BackendError) as exc:
        raise ApiError(503, "backend_unavailable", f"Redis is unreachable: {exc}") from exc


@router.get("/buckets", responses={**ok(BucketsList, examples.BUCKETS), **errors(404, 422)})
async def buckets(
    rules: RulesDep,
    buckets: BucketsDep,
    route: str | None = Query(None, max_length=256),
    limit: int = Query(20, ge=1, le=200),
) -> dict[str, Any]:
    """The most active keys with their local and distributed state, read without consuming."""
    return await buckets_view(rules.current, buckets, route, limit)


@router.get("/backend", responses=ok(BackendReport, examples.BACKEND))
async def backend(engine: EngineDep) -> dict[str, Any]:
    """Circuit breaker and recovery state, failure policy, fleet."""
    return engine.backend_snapshot()
