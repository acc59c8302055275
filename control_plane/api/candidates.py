"""Candidate limits: ``PUT`` / ``DELETE /v1/routes/{route}/candidate`` and ``POST
/v1/routes/{route}/candidate/promote`` (operator role, audited). A route's candidate is
evaluated in shadow beside its current limit; its figures are in ``GET /v1/routes`` and
``GET /v1/divergence`` (see :mod:`control_plane.rollout.candidates`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request

from limiter import Policy

from ..decision import UnknownRoute
from ..rollout.candidates import CandidateRefused, NoCandidate
from ..rollout.manager import GateRefused
from ..store import StoreUnavailable
from . import examples
from .deps import ApiError, CandidatesDep, OperatorDep, RolloutDep, ViewsDep, actor_of, gate_failed
from .openapi import errors, json_request, ok
from .readmodels import candidate_view
from .requests import json_body
from .responses import CandidateChanged, CandidatePromoted
from .schemas import ADJUST_MAX_PERIOD_S, CandidateAction, CandidateSet

router = APIRouter(prefix="/v1", tags=["rollout"])

CandidateSetBody = Annotated[CandidateSet, json_body(CandidateSet)]
CandidateActionBody = Annotated[CandidateAction, json_body(CandidateAction)]

_GATE_FAILED = {
    "error": "gate_failed",
    "message": "promotion refused by the gate: only 120 compared decisions since the candidate was set 95s ago"
    " (need 500) (use force with a reason to override)",
    "gate": {"passed": False, "required": True, "reasons": ["only 120 compared decisions ... (need 500)"]},
}


def _not_found(exc: UnknownRoute | NoCandidate) -> ApiError:
    if isinstance(exc, UnknownRoute):
        return ApiError(404, "unknown_route", f"no route named {exc.route!r}", field="route")
    return ApiError(404, "no_candidate", str(exc), field="route")


def _unavailable(exc: StoreUnavailable) -> ApiError:
    return ApiError(503, "backend_unavailable", f"Redis is unreachable, so nothing was changed: {exc}")


def _policy(body: CandidateSet, current: Policy) -> Policy:
    """The candidate's policy: its limit text, burst and algorithm (the route's current
    algorithm unless given); a 422 naming the field the rules loader would name."""
    try:
        policy = Policy.parse(body.limit, burst=body.burst, algorithm=body.algorithm or current.algorithm)
    except ValueError as exc:
        raise ApiError(422, "invalid_request", str(exc), field=str(exc).split(":", 1)[0]) from exc
    if policy.period > ADJUST_MAX_PERIOD_S:
        raise ApiError(
            422, "invalid_request", f"limit: the period is at most {ADJUST_MAX_PERIOD_S} s, got {body.limit!r}",
            field="limit",
        )  # fmt: skip
    return policy


@router.put(
    "/routes/{route:path}/candidate",
    responses={**ok(CandidateChanged, examples.CANDIDATE_SET), **errors(404, 413, 422, 503)},
    openapi_extra=json_request(CandidateSet, examples.CANDIDATE_REQUEST),
)
async def set_candidate(
    route: str, request: Request, *, candidates: CandidatesDep, rollout: RolloutDep, views: ViewsDep,
    _: OperatorDep, body: CandidateSetBody,
) -> dict[str, Any]:  # fmt: skip
    """Set (or replace) a route's candidate limit: the route keeps deciding with its current
    limit; the candidate is evaluated in shadow beside it (its own keys), and its divergence
    from the current one counted. A 422 names the field: a limit equal to the current one,
    a route in off (``route``), a limit the rules would refuse."""
    rule = candidates.adjustments.rule(route)
    if rule is None:
        raise _not_found(UnknownRoute(route))
    policy = _policy(body, candidates.adjustments.route_policies(rule)[1])
    if body.cost_unit is not None and body.cost_unit != (rule.cost_unit if rule.budget is not None else None):
        own = "its limits count requests" if rule.budget is None else f"its budget counts {rule.cost_unit or 'units'}"
        raise ApiError(
            422, "invalid_request", f"cost_unit: {body.cost_unit!r} is not route {route!r}'s unit ({own})",
            field="cost_unit",
        )  # fmt: skip
    try:
        candidate, entry = await candidates.set(route, policy, reason=body.reason, actor=actor_of(request))
    except UnknownRoute as exc:
        raise _not_found(exc) from exc
    except CandidateRefused as exc:
        raise ApiError(422, "invalid_request", str(exc), field=exc.field) from exc
    except StoreUnavailable as exc:
        raise _unavailable(exc) from exc
    return {
        "route": route,
        "candidate": candidate_view(candidate, await views.route(route), rollout),
        "audit": entry.to_dict(),
    }


@router.delete(
    "/routes/{route:path}/candidate",
    responses={**ok(CandidateChanged, examples.CANDIDATE_DROPPED), **errors(404, 413, 422, 503)},
    openapi_extra=json_request(CandidateAction, examples.CANDIDATE_ACTION),
)
async def drop_candidate(
    route: str, request: Request, candidates: CandidatesDep, _: OperatorDep, body: CandidateActionBody
) -> dict[str, Any]:
    """Drop a route's candidate limit (audited); its counters stay until they expire."""
    try:
        entry = await candidates.drop(route, reason=body.reason, actor=actor_of(request))
    except (UnknownRoute, NoCandidate) as exc:
        raise _not_found(exc) from exc
    except StoreUnavailable as exc:
        raise _unavailable(exc) from exc
    return {"route": route, "candidate": None, "audit": entry.to_dict()}


@router.post(
    "/routes/{route:path}/candidate/promote",
    responses={
        **ok(CandidatePromoted, examples.CANDIDATE_PROMOTED),
        **errors(404, 409, 413, 422, 503, e409=_GATE_FAILED),
    },
    openapi_extra=json_request(CandidateAction, examples.CANDIDATE_PROMOTE),
)
async def promote_candidate(
    route: str, request: Request, candidates: CandidatesDep, _: OperatorDep, body: CandidateActionBody
) -> dict[str, Any]:
    """Make a route's candidate its global limit, as a runtime adjustment (audited, kept across
    restarts; the rules file is not rewritten), behind a gate: a minimum time since it was
    set, a minimum of compared decisions, a maximum share of newly rejected requests
    (``force`` with a reason overrides, said in the audit trail)."""
    try:
        adjusted, entry, gate = await candidates.promote(
            route, reason=body.reason, actor=actor_of(request), force=body.force
        )
    except (UnknownRoute, NoCandidate) as exc:
        raise _not_found(exc) from exc
    except GateRefused as exc:
        raise gate_failed(exc.gate) from exc
    except StoreUnavailable as exc:
        raise _unavailable(exc) from exc
    rule = candidates.adjustments.rule(route)
    limit = candidates.adjustments.route_policies(rule)[1].to_dict() if rule is not None else {}
    return {
        "route": route,
        "limit": limit,
        "adjustment": adjusted.to_dict(),
        "audit": entry.to_dict(),
        "gate": gate.to_dict(),
    }
