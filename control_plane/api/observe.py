"""Read models: ``/v1/divergence``, ``/v1/buckets``, ``/v1/backend``."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Query

from limiter.errors import BackendError

from ..engine import Engine
from ..store import StoreUnavailable, totals_of
from .deps import ApiError, EngineDep
from .schemas import ErrorBody

router = APIRouter(prefix="/v1", tags=["observe"])


async def divergence_view(engine: Engine, minutes: int = 60) -> dict[str, Any]:
    """Fleet-wide divergence per route from the engine's cached views (refreshed every
    second in the background); raises StoreUnavailable when there are none yet."""
    routes: dict[str, Any] = {}
    for name in engine.rules.names():
        cached = await engine.route_view(name)
        if cached is None:
            raise StoreUnavailable(engine.views_error or "no divergence figures yet")
        series = cached["series"][-minutes:]
        routes[name] = {"totals": totals_of(series, minutes), "series": series, "would_be_blocked": cached["top"]}
    return {
        "minutes": minutes,
        "routes": routes,
        "as_of": engine.views_at,
        "age_s": engine.views_age_s(),
        "error": engine.views_error,
    }


async def buckets_view(engine: Engine, route: str | None, limit: int) -> dict[str, Any]:
    names = [route] if route else engine.rules.names()
    out: list[dict[str, Any]] = []
    for name in names:
        rule = engine.rules.get(name)
        if rule is None:
            raise ApiError(404, "unknown_route", f"no route named {name!r}", field="route")
        hot = engine.hot_keys(name, limit)
        lkeys = [f"{name}:{k}" for k, _ in hot]
        pols = [engine.key_policies(rule, k) for k, _ in hot]

        async def dist_peek(lk: str, p: Any) -> Any:
            if engine.breaker.state.value == "open":
                return None
            try:
                return await engine.redis.peek(lk, p)
            except BackendError:
                return None

        dists = await asyncio.gather(*[dist_peek(lk, dp) for lk, (_, dp) in zip(lkeys, pols)])
        for (key, count), lk, (lp, dp), dv in zip(hot, lkeys, pols, dists):
            lv = engine.local.peek(lk, lp)
            last = engine.last_decision(name, key)
            out.append(
                {
                    "route": name,
                    "key": key,
                    "recent_requests": count,
                    "local": {**lv.to_dict(), "burst": lp.limit, "policy": lp.to_dict()},
                    "distributed": (
                        {**dv.to_dict(), "burst": dp.limit, "policy": dp.to_dict()} if dv is not None else None
                    ),
                    "last_decision": ({"at": last[0], "allowed": last[1], "enforced_by": last[2]} if last else None),
                }
            )
    out.sort(key=lambda b: -b["recent_requests"])
    return {"buckets": out[: limit if route is None else len(out)]}


@router.get("/divergence", responses={503: {"model": ErrorBody}})
async def divergence(engine: EngineDep, minutes: int = Query(60, ge=1, le=120)) -> dict[str, Any]:
    """Per route: fleet-wide agree / new rejections / reverse counts, rates, a per-minute series
    and the keys that enforcement would block (who would be blocked)."""
    try:
        return await divergence_view(engine, minutes)
    except (StoreUnavailable, BackendError) as exc:
        raise ApiError(503, "backend_unavailable", f"Redis is unreachable: {exc}") from exc


@router.get("/buckets", responses={404: {"model": ErrorBody}})
async def buckets(
    engine: EngineDep, route: str | None = Query(None, max_length=64), limit: int = Query(20, ge=1, le=200)
) -> dict[str, Any]:
    """The most active keys with their local and distributed state, read without consuming."""
    return await buckets_view(engine, route, limit)


@router.get("/backend")
async def backend(engine: EngineDep) -> dict[str, Any]:
    """Circuit breaker and recovery state, failure policy, fleet."""
    return engine.backend_snapshot()
