"""Rollout: ``GET /v1/routes``, ``PUT /v1/routes/{route}/mode``, ``GET /v1/rollout/audit``."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Query, Request

from ..engine import Engine, GateRefused, UnknownRoute
from ..rollout import Mode, evaluate_gate
from ..store import StoreUnavailable, VersionConflict, gate_stats_of, totals_of
from .deps import ApiError, EngineDep, OperatorDep, actor_of
from .schemas import ErrorBody, ModeChange

router = APIRouter(prefix="/v1", tags=["rollout"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody},
    403: {"model": ErrorBody},
    404: {"model": ErrorBody},
    409: {"model": ErrorBody},
    422: {"model": ErrorBody},
    503: {"model": ErrorBody},
}


async def route_views(engine: Engine) -> list[dict[str, Any]]:
    """Every route with its rules, rollout state, live rate and fleet-wide divergence."""
    out = []
    for name in engine.rules.names():
        rule = engine.rules.get(name)
        assert rule is not None
        st = engine.state_for(name)
        mode, percent = engine.effective_mode(name)
        view: dict[str, Any] = {
            "name": name,
            "mode": mode.value,
            "stored_mode": st.mode.value,
            "canary_percent": percent if mode is Mode.CANARY else st.canary_percent,
            "state": st.to_dict(),
            "rule": rule.to_dict(),
            "decisions_per_s": round(engine.route_rate(name), 2),
        }
        cached = await engine.route_view(name)
        gate_target = {
            Mode.OFF: Mode.SHADOW,
            Mode.SHADOW: Mode.CANARY,
            Mode.CANARY: Mode.ENFORCE,
            Mode.ENFORCE: Mode.ENFORCE,
        }[st.mode]
        gate_pct = max(st.canary_percent, 10) if gate_target is Mode.CANARY else st.canary_percent
        if cached is not None:
            series = cached["series"]
            view["divergence_5m"] = totals_of(series[-5:], 5)
            # the same whole minutes DivergenceStore.window_stats sums for the real gate
            now = time.time()
            window_min = max(1, (int(now // 60) - int((now - engine.gate_config.window_s) // 60)) + 1)
            gate = evaluate_gate(st, gate_target, gate_pct, gate_stats_of(series[-window_min:]), engine.gate_config)
            view["gate"] = {"target": gate_target.value, **gate.to_dict()}
        else:
            view["divergence_5m"] = None
            view["gate"] = {
                "target": gate_target.value,
                "passed": False,
                "required": True,
                "reasons": [f"fleet figures unavailable: {engine.views_error or 'Redis unreachable'}"],
            }
        view["figures_age_s"] = engine.views_age_s()
        out.append(view)
    return out


@router.get("/routes")
async def list_routes(engine: EngineDep) -> dict[str, Any]:
    """Routes, their mode (canary with its percent), rates, divergence and gate status."""
    return {
        "routes": await route_views(engine),
        "distributed_enabled": engine.settings.enable_distributed_rate_limiting,
        "rules_source": engine.rules.source,
        "rules_error": engine.last_rules_error,
        "figures_age_s": engine.views_age_s(),
        "figures_error": engine.views_error,
    }


@router.put("/routes/{route}/mode", responses=_ERRORS)
async def set_mode(
    route: str, change: ModeChange, request: Request, engine: EngineDep, _: OperatorDep
) -> dict[str, Any]:
    """Move a route to another mode (gated promotions; ``force`` with a reason overrides)."""
    if change.mode == "canary" and not 1 <= change.canary_percent <= 100:
        raise ApiError(422, "invalid_request", "canary needs canary_percent between 1 and 100", field="canary_percent")
    try:
        state, entry, gate = await engine.set_mode(
            route,
            Mode(change.mode),
            canary_percent=change.canary_percent,
            reason=change.reason,
            actor=actor_of(request),
            force=change.force,
        )
    except UnknownRoute as exc:
        raise ApiError(404, "unknown_route", f"no route named {exc.route!r}", field="route") from exc
    except GateRefused as exc:
        raise ApiError(
            409,
            "gate_failed",
            "promotion refused by the gate: " + "; ".join(exc.gate.reasons) + " (use force with a reason to override)",
            gate=exc.gate.to_dict(),
        ) from exc
    except StoreUnavailable as exc:
        raise ApiError(
            503,
            "backend_unavailable",
            f"Redis is unreachable, so the mode was not changed (nothing was written): {exc}",
        ) from exc
    except VersionConflict as exc:
        cur = exc.current.to_dict() if exc.current is not None else None
        raise ApiError(
            409,
            "conflict",
            f"the route was changed concurrently (now {cur['mode'] if cur else 'unset'}); read it again and retry",
            current=cur,
        ) from exc
    return {"route": route, "state": state.to_dict(), "audit": entry.to_dict(), "gate": gate.to_dict()}


@router.get("/rollout/audit", responses=_ERRORS)
async def audit(
    engine: EngineDep, limit: int = Query(100, ge=1, le=1000), route: str | None = Query(None, max_length=64)
) -> dict[str, Any]:
    """The audit trail, newest first (mode changes, rules reloads, resets, adjustments)."""
    try:
        entries = await engine.store.audit(limit=limit, route=route)
    except StoreUnavailable as exc:
        raise ApiError(503, "backend_unavailable", f"Redis is unreachable: {exc}") from exc
    return {"entries": [e.to_dict() for e in entries]}
