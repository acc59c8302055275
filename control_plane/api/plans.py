"""Rollout plans: ``GET``, ``PUT`` and ``DELETE /v1/routes/{route}/plan`` and ``POST
/v1/routes/{route}/plan/{pause,resume,approve,abort}`` (the changes: operator role, audited).
A plan set here wins over the rules file's until it is deleted; it is read by the rules
file's own rows (:func:`control_plane.rules.plan.read_plan`), so a 422 names the field the
file would (``steps[1].canary``). See :mod:`control_plane.rollout.plans`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request

from ..decision import UnknownRoute
from ..model.plan_progress import ActionKind, OperatorRefused
from ..rollout.plans import NoPlan
from ..rules.budget import NO_COSTS
from ..rules.errors import RulesError
from ..rules.plan import read_plan
from ..store import LeaseLost, PlanConflict, StoreUnavailable, VersionConflict
from . import plan_examples as examples
from .deps import ApiError, OperatorDep, PlansDep, RulesDep, actor_of
from .openapi import errors, json_request, ok
from .plan_views import plan_detail
from .requests import json_body
from .responses import PlanChanged, PlanDetail
from .schemas import PlanAct, PlanSet

router = APIRouter(prefix="/v1", tags=["rollout"])

PlanSetBody = Annotated[PlanSet, json_body(PlanSet)]
PlanActBody = Annotated[PlanAct, json_body(PlanAct)]

_REFUSED = {"error": "conflict", "message": "the plan is paused, not waiting for an approval"}


def _failed(exc: Exception) -> ApiError:
    """The API's answer to what a plan's change can raise."""
    if isinstance(exc, UnknownRoute):
        return ApiError(404, "unknown_route", f"no route named {exc.route!r}", field="route")
    if isinstance(exc, NoPlan):
        return ApiError(404, "no_plan", str(exc), field="route")
    if isinstance(exc, OperatorRefused):
        return ApiError(409, "conflict", str(exc))
    if isinstance(exc, (PlanConflict, VersionConflict, LeaseLost)):
        return ApiError(409, "conflict", f"the plan or the route changed meanwhile ({exc}); read it again and retry")
    return ApiError(503, "backend_unavailable", f"Redis is unreachable, so nothing was changed: {exc}")


_CHANGE_ERRORS = (UnknownRoute, NoPlan, OperatorRefused, PlanConflict, VersionConflict, LeaseLost, StoreUnavailable)


def _answer(plans: Any, route: str, audit: Any) -> dict[str, Any]:
    return {
        "route": route,
        "plan": plan_detail(plans, route, plans.clock()),
        "audit": None if audit is None else audit.to_dict(),
    }


@router.get("/routes/{route:path}/plan", responses={**ok(PlanDetail, examples.PLAN), **errors(404, 422)})
async def get_plan(route: str, plans: PlansDep) -> dict[str, Any]:
    """The route's rollout plan: every step with its status and times, every check of the
    last analysis with its value, threshold and outcome, the last outcomes."""
    try:
        plans.require_route(route)
    except UnknownRoute as exc:
        raise _failed(exc) from None
    detail = plan_detail(plans, route, plans.clock())
    if detail is None:
        raise _failed(NoPlan(route))
    return detail


@router.put(
    "/routes/{route:path}/plan",
    responses={**ok(PlanChanged, examples.PLAN_CHANGED), **errors(404, 409, 413, 422, 503)},
    openapi_extra=json_request(PlanSet, examples.PLAN_REQUEST),
)
async def set_plan(
    route: str, request: Request, plans: PlansDep, rules: RulesDep, _: OperatorDep, body: PlanSetBody
) -> dict[str, Any]:
    """Set (or replace) the route's rollout plan; it wins over the rules file's until it is
    deleted and starts at once (at its first step in the route's mode, else at its first
    step, applied). A plan the rules file would refuse is a 422 naming the field."""
    raw: dict[str, Any] = {"steps": body.steps}
    if body.analysis is not None:
        raw["analysis"] = body.analysis
    if body.on_failure is not None:
        raw["on_failure"] = body.on_failure
    try:
        plan = read_plan(raw, plans.rollout.settings)
    except RulesError as exc:
        raise ApiError(422, "invalid_request", str(exc), field=exc.field or "steps") from exc
    rule = rules.current.get(route)
    if plan.analysis.gate_weight == "cost" and rule is not None and rule.budget is None:
        raise ApiError(422, "invalid_request", f"analysis.gate_weight: {NO_COSTS}", field="analysis.gate_weight")
    try:
        entry = (await plans.set(route, plan, reason=body.reason, actor=actor_of(request)))[1]
    except _CHANGE_ERRORS as exc:
        raise _failed(exc) from exc
    return _answer(plans, route, entry)


@router.delete(
    "/routes/{route:path}/plan",
    responses={**ok(PlanChanged, examples.PLAN_DELETED), **errors(404, 409, 413, 422, 503)},
    openapi_extra=json_request(PlanAct, examples.PLAN_ACTION),
)
async def delete_plan(
    route: str, request: Request, plans: PlansDep, _: OperatorDep, body: PlanActBody
) -> dict[str, Any]:
    """Remove the plan set through the API (audited); the rules file's plan for the route, if
    it has one, is in force again (and starts over)."""
    try:
        entry = await plans.delete(route, reason=body.reason, actor=actor_of(request))
    except _CHANGE_ERRORS as exc:
        raise _failed(exc) from exc
    return _answer(plans, route, entry)


def _action(kind: ActionKind, doc: str) -> Any:
    async def act(route: str, request: Request, plans: PlansDep, _: OperatorDep, body: PlanActBody) -> dict[str, Any]:
        try:
            entry = (await plans.act(route, kind, reason=body.reason, actor=actor_of(request)))[1]
        except _CHANGE_ERRORS as exc:
            raise _failed(exc) from exc
        return _answer(plans, route, entry)

    act.__doc__ = doc
    act.__name__ = f"{kind.value}_plan"
    return act


_ACTIONS = {
    ActionKind.PAUSE: "Pause the route's running plan where it is (audited): no step is applied until it is resumed.",
    ActionKind.RESUME: "Resume a paused or aborted plan at its step (its time starts over; the step's mode is applied"
    " again if the route was moved off it).",
    ActionKind.APPROVE: "Approve the step a plan waits at: the next step is applied now.",
    ActionKind.ABORT: "Stop the plan and move the route back to the plan's first step (audited).",
}
for _kind, _doc in _ACTIONS.items():
    router.post(
        f"/routes/{{route:path}}/plan/{_kind.value}",
        responses={**ok(PlanChanged, examples.PLAN_CHANGED), **errors(404, 409, 413, 422, 503, e409=_REFUSED)},
        openapi_extra=json_request(PlanAct, examples.PLAN_ACTION),
    )(_action(_kind, _doc))
