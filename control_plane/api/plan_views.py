"""The read models of rollout plans: a route's plan in ``GET /v1/routes`` (:func:`plan_summary`:
its state, step, time in the step, what it waits for, the first check that fails or is
missing) and in ``GET /v1/routes/{route}/plan`` (:func:`plan_detail`: every step with its
status and times, every check with its value, threshold and outcome, the last outcomes).
Both read only what the replica holds (the plans' records and the latest analyses)."""

from __future__ import annotations

from typing import Any

from ..model.plan import Plan
from ..model.plan_analysis import Analysis, Verdict
from ..model.plan_progress import PlanRecord, PlanStatus
from ..rollout.plans import Plans

__all__ = ["plan_detail", "plan_summary"]


def _waits_for(route: str, plan: Plan, record: PlanRecord | None, analysis: Analysis | None, now: float) -> str | None:
    if record is None:
        return "the plan driver to start it (within SHADOWLIMIT_PLAN_INTERVAL_S)"
    status = record.status
    if status is PlanStatus.WAITING_FOR_APPROVAL:
        return f"an operator's approval: shadowlimit plan {route} --approve"
    if status is PlanStatus.PAUSED:
        return f"an operator: shadowlimit plan {route} --resume"
    if status is not PlanStatus.RUNNING:
        return None
    if analysis is None:
        return "its first analysis"
    if analysis.verdict is not Verdict.PASS:
        return analysis.reason
    left = plan.steps[record.step].for_s - (now - record.step_since)
    return f"{left:.0f}s more in {plan.steps[record.step].label()}" if left > 0 else "the next analysis"


def _problem(analysis: Analysis | None) -> dict[str, Any] | None:
    """The first check that fails, then the first refused or missing one."""
    if analysis is None:
        return None
    for outcome in (Verdict.FAIL, Verdict.REFUSED, Verdict.INCONCLUSIVE):
        for c in analysis.checks:
            if c.outcome is outcome:
                return c.to_dict()
    return None


def plan_summary(plans: Plans, route: str, now: float) -> dict[str, Any] | None:
    """The route's plan as ``GET /v1/routes`` shows it; None without one."""
    eff = plans.effective(route)
    if eff is None:
        return None
    plan, source = eff
    record = plans.record(route)
    analysis = plans.last_analysis(route, record)
    index = record.step if record is not None else 0
    step = plan.steps[index]
    in_step = max(0.0, now - record.step_since) if record is not None else None
    running = record is not None and record.status is PlanStatus.RUNNING
    return {
        "source": source,
        "state": plans.state_of(route, record),
        "step": index + 1,
        "steps": len(plan.steps),
        "current": step.label(),
        "labels": [s.label() for s in plan.steps],
        "describe": plan.describe(),
        "in_step_s": None if in_step is None else round(in_step, 1),
        "time_left_s": round(max(0.0, step.for_s - in_step), 1) if running and in_step is not None else None,
        "waits_for": _waits_for(route, plan, record, analysis, now),
        "reason": record.reason if record is not None else "",
        "verdict": analysis.verdict.value if analysis is not None else None,
        "first_problem": _problem(analysis),
    }


def _steps(plan: Plan, record: PlanRecord | None) -> list[dict[str, Any]]:
    current = record.step if record is not None else 0
    done = record is not None and record.status is PlanStatus.COMPLETED
    out = []
    for i, step in enumerate(plan.steps):
        events = [e for e in (record.history if record is not None else ()) if e.step == i]
        started = [e.at for e in events if e.event in ("started", "waiting_for_approval", "resumed")]
        if i < current or (done and i == current):
            status = "passed"
        elif i == current:
            status = "current"
        else:
            status = "pending"
        out.append(
            {
                "index": i + 1,
                "step": step.kind.value,
                "label": step.label(),
                "describe": step.describe(),
                "percent": step.percent,
                "for_s": step.for_s,
                "status": status,
                "started_at": started[-1] if started else None,
                "last_event": events[-1].to_dict() if events else None,
            }
        )
    return out


def plan_detail(plans: Plans, route: str, now: float) -> dict[str, Any] | None:
    """The route's plan as ``GET /v1/routes/{route}/plan`` shows it; None without one."""
    summary = plan_summary(plans, route, now)
    eff = plans.effective(route)
    if summary is None or eff is None:
        return None
    plan = eff[0]
    record = plans.record(route)
    analysis = plans.last_analysis(route, record)
    kept = plans.analyses.get(route) or {}
    return {
        "route": route,
        **summary,
        "plan": plan.to_dict(),
        "step_list": _steps(plan, record),
        "checks": [c.to_dict() for c in analysis.checks] if analysis is not None else [],
        "analysed_at": analysis.at if analysis is not None else None,
        "analysed_step": analysis.step + 1 if analysis is not None else None,
        "recent": list(kept.get("recent") or []),
        "history": [e.to_dict() for e in record.history] if record is not None else [],
        "driver": plans.driver,
        "version": record.version if record is not None else 0,
        "updated_at": record.updated_at if record is not None else None,
        "updated_by": record.updated_by if record is not None else None,
    }
