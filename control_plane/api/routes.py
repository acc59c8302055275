"""Rollout: ``GET /v1/routes``, ``PUT /v1/routes/{route}/mode``, ``GET /v1/rollout/audit``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from ..decision import UnknownRoute
from ..model.rollout import Mode
from ..rollout.manager import GateRefused
from ..store import PlanConflict, StoreUnavailable, VersionConflict
from . import examples
from .deps import (
    ActivityDep,
    ApiError,
    MetricsDep,
    OperatorDep,
    PlansDep,
    RolloutDep,
    RulesDep,
    StoreDep,
    ViewsDep,
    actor_of,
    gate_failed,
)  # fmt: skip
from .openapi import errors, json_request, ok
from .readmodels import route_views
from .requests import json_body
from .responses import AuditTrail, ModeChanged, RoutesList
from .schemas import ModeChange

router = APIRouter(prefix="/v1", tags=["rollout"])

ModeChangeBody = Annotated[ModeChange, json_body(ModeChange)]

_GATE_FAILED = {
    "error": "gate_failed",
    "message": "promotion refused by the gate: only 120 compared decisions in the last 300s (need 500)"
    " (use force with a reason to override)",
    "gate": {"passed": False, "required": True, "reasons": ["only 120 compared decisions in the last 300s (need 500)"]},
}


@router.get("/routes", responses=ok(RoutesList, examples.ROUTES))
async def list_routes(
    rules: RulesDep, rollout: RolloutDep, activity: ActivityDep, views: ViewsDep, metrics: MetricsDep, plans: PlansDep
) -> dict[str, Any]:
    """Routes, their mode (canary with its percent), rates, divergence, gate status, the
    answers this replica's failure policy gave for want of time (a caller's deadline), and
    each route's rollout plan (its state, step, time in the step, what it waits for)."""
    return {
        "routes": await route_views(rules.current, rollout, activity, views, metrics.deadline_counts(), plans),
        "distributed_enabled": rollout.settings.enable_distributed_rate_limiting,
        "rules_source": rules.current.source,
        "rules_error": rules.last_error,
        "figures_age_s": views.age_s(),
        "figures_error": views.error,
    }


@router.put(
    "/routes/{route:path}/mode",
    responses={**ok(ModeChanged, examples.MODE_CHANGED), **errors(404, 409, 413, 422, 503, e409=_GATE_FAILED)},
    openapi_extra=json_request(ModeChange, examples.MODE_REQUEST),
)
async def set_mode(
    route: str,
    request: Request,
    plans: PlansDep,
    _: OperatorDep,
    change: ModeChangeBody,
) -> dict[str, Any]:
    """Move a route to another mode (gated promotions; ``force`` with a reason overrides). A
    running rollout plan on the route is paused by the change (a person's word wins)."""
    if change.mode == "canary" and not 1 <= change.canary_percent <= 100:
        raise ApiError(422, "invalid_request", "canary needs canary_percent between 1 and 100", field="canary_percent")
    try:
        state, entry, gate = await plans.set_mode(
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
        raise gate_failed(exc.gate) from exc
    except StoreUnavailable as exc:
        raise ApiError(
            503,
            "backend_unavailable",
            f"Redis is unreachable, so the mode was not changed (nothing was written): {exc}",
        ) from exc
    except PlanConflict as exc:
        raise ApiError(409, "conflict", f"{exc}; read it again and retry") from exc
    except VersionConflict as exc:
        cur = exc.current.to_dict() if exc.current is not None else None
        raise ApiError(
            409,
            "conflict",
            f"the route was changed concurrently (now {cur['mode'] if cur else 'unset'}); read it again and retry",
            current=cur,
        ) from exc
    return {"route": route, "state": state.to_dict(), "audit": entry.to_dict(), "gate": gate.to_dict()}


@router.get("/rollout/audit", responses={**ok(AuditTrail, examples.AUDIT), **errors(422, 503)})
async def audit(
    store: StoreDep, limit: int = Query(100, ge=1, le=1000), route: str | None = Query(None, max_length=256)
) -> dict[str, Any]:
    """The audit trail, newest first (mode changes, rules reloads, resets, adjustments, restorations)."""
    try:
        entries = await store.audit(limit=limit, route=route)
    except StoreUnavailable as exc:
        raise ApiError(503, "backend_unavailable", f"Redis is unreachable: {exc}") from exc
    return {"entries": [e.to_dict() for e in entries]}
