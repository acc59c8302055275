"""A plan's progress, pure: where a route's plan stands (:class:`PlanRecord`, kept in Redis
with the rollout state and restored with it), and what to do next (:func:`next_action`,
and the operator's :func:`operator_action`), given the analysis, the route's state and ``now``.

States (``status``): **running** (in a step, judged continuously), **waiting_for_approval**
(at an ``approve`` step: the mode before it is held, the analysis keeps running),
**paused** (by an operator, a manual mode change, a failed analysis with ``on_failure:
pause``, a rollback, or a query Prometheus refused), **completed** (its last step passed),
**aborted** (an operator stopped it: the route went back to the first step), and
**removed** (a record kept after its plan was deleted, so a store that lost its data does
not bring it back). What the API shows as **waiting** is a running plan whose last
analysis was inconclusive: it waits for evidence.

What moves a plan:

==========================  ==============================================================
the analysis passes         after the step's ``for``: the next step (``approve``: wait for
                            an operator; past the last step: completed)
it fails                    ``on_failure``: rollback (to the last step that passed, shadow
                            at worst; then paused) or pause
Prometheus refuses a query  paused, the error shown
inconclusive                nothing: the plan waits
the route's mode changed    paused (a person's word wins)
outside the plan
==========================  ==============================================================
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from .plan import Plan, StepKind
from .plan_analysis import Analysis, Verdict
from .rollout import GateStats, Mode, RouteState

__all__ = [
    "HISTORY",
    "ActionKind",
    "Baseline",
    "OperatorRefused",
    "PlanAction",
    "PlanRecord",
    "PlanStatus",
    "StepEvent",
    "next_action",
    "operator_action",
    "start_action",
]

#: how many step events a record keeps (the newest)
HISTORY = 40


class PlanStatus(str, Enum):
    RUNNING = "running"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    PAUSED = "paused"
    COMPLETED = "completed"
    ABORTED = "aborted"
    REMOVED = "removed"

    @property
    def driven(self) -> bool:
        """Does the plan's driver judge it (running, or waiting for an approval)?"""
        return self in (PlanStatus.RUNNING, PlanStatus.WAITING_FOR_APPROVAL)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepEvent:
    """Something that happened to a step: ``started``, ``passed``, ``failed``,
    ``rolled_back``, ``waiting_for_approval``, ``approved``, ``paused``, ``resumed``,
    ``aborted``, ``completed``."""

    step: int
    at: float
    event: str
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "at": self.at, "event": self.event, "note": self.note}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepEvent:
        return cls(step=int(d["step"]), at=float(d["at"]), event=str(d["event"]), note=str(d.get("note", "")))


@dataclass(frozen=True, slots=True, kw_only=True)
class Baseline:
    """The fleet's counters of the minute a step began in, as they were then: subtracted
    from that minute's later counts, they leave what the step itself saw."""

    minute: int
    counts: GateStats

    def to_dict(self) -> dict[str, Any]:
        c = self.counts
        return {
            "minute": self.minute,
            "compared": c.compared,
            "new_rejections": c.new_rejections,
            "backend_errors": c.backend_errors,
            "distributed_attempts": c.distributed_attempts,
            "shadow_dropped": c.shadow_dropped,
            "excused": c.excused,
            "units_compared": c.units_compared,
            "units_new_rejections": c.units_new_rejections,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Baseline:
        counts = GateStats(
            compared=int(d["compared"]),
            new_rejections=int(d["new_rejections"]),
            backend_errors=int(d["backend_errors"]),
            distributed_attempts=int(d["distributed_attempts"]),
            shadow_dropped=int(d.get("shadow_dropped", 0)),
            excused=int(d.get("excused", 0)),
            units_compared=int(d.get("units_compared", 0)),
            units_new_rejections=int(d.get("units_new_rejections", 0)),
        )
        return cls(minute=int(d["minute"]), counts=counts)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRecord:
    """Where a route's plan stands. ``plan`` is the API's plan (None: the rules file's, named
    by ``plan_id``); ``step`` the current step and ``step_since`` when it began; ``reason``
    why the plan is in its status; ``route_version`` the route state's version the plan
    last wrote or saw; ``version`` grows with every write (compare-and-set in Redis)."""

    plan_id: str
    source: str  # "rules", "api"; "" once removed
    status: PlanStatus
    step: int = 0
    step_since: float = 0.0
    reason: str = ""
    route_version: int = 0
    baseline: Baseline | None = None
    plan: Plan | None = None
    history: tuple[StepEvent, ...] = ()
    updated_at: float = 0.0
    updated_by: str = ""
    version: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id,
            "source": self.source,
            "status": self.status.value,
            "step": self.step,
            "step_since": self.step_since,
            "reason": self.reason,
            "route_version": self.route_version,
            "baseline": None if self.baseline is None else self.baseline.to_dict(),
            "plan": None if self.plan is None else self.plan.to_dict(),
            "history": [e.to_dict() for e in self.history],
            "updated_at": self.updated_at,
            "updated_by": self.updated_by,
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlanRecord:
        """Raises ``ValueError`` for anything :meth:`to_dict` did not write."""
        try:
            return cls(
                plan_id=str(d["plan_id"]),
                source=str(d["source"]),
                status=PlanStatus(d["status"]),
                step=int(d.get("step", 0)),
                step_since=float(d.get("step_since", 0.0)),
                reason=str(d.get("reason", "")),
                route_version=int(d.get("route_version", 0)),
                baseline=None if d.get("baseline") is None else Baseline.from_dict(d["baseline"]),
                plan=None if d.get("plan") is None else Plan.from_dict(d["plan"]),
                history=tuple(StepEvent.from_dict(e) for e in d.get("history") or ()),
                updated_at=float(d.get("updated_at", 0.0)),
                updated_by=str(d.get("updated_by", "")),
                version=int(d.get("version", 0)),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a plan record: {exc!r}") from None

    def moved(self, action: PlanAction, *, now: float, by: str) -> PlanRecord:
        """The record after ``action`` (its step restarted when the plan starts, or its step or
        status changed; the version is the store's to set)."""
        restart = action.kind is ActionKind.START or action.step != self.step or action.status is not self.status
        events = (
            *self.history,
            *(StepEvent(step=action.step, at=now, event=e, note=action.reason) for e in action.events),
        )
        return replace(
            self,
            status=action.status,
            step=action.step,
            step_since=now if restart else self.step_since,
            reason=action.reason,
            baseline=None if restart else self.baseline,
            history=events[-HISTORY:],
            updated_at=now,
            updated_by=by,
        )


class ActionKind(str, Enum):
    WAIT = "wait"
    START = "start"
    ADVANCE = "advance"
    AWAIT_APPROVAL = "await_approval"
    COMPLETE = "complete"
    ROLLBACK = "rollback"
    PAUSE = "pause"
    RESUME = "resume"
    APPROVE = "approve"
    ABORT = "abort"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanAction:
    """What to do: the plan's step and status afterwards, the mode to apply (None: the
    route's mode stays), why, and the step events to record."""

    kind: ActionKind
    step: int
    status: PlanStatus
    mode: Mode | None = None
    percent: int = 0
    reason: str = ""
    events: tuple[str, ...] = ()

    @property
    def changes(self) -> bool:
        return self.kind is not ActionKind.WAIT


class OperatorRefused(ValueError):
    """An operator's action that does not apply to the plan as it stands (a 409)."""


def _wait(record: PlanRecord) -> PlanAction:
    return PlanAction(kind=ActionKind.WAIT, step=record.step, status=record.status, reason=record.reason)


def _goto(plan: Plan, index: int, kind: ActionKind, reason: str, events: tuple[str, ...]) -> PlanAction:
    """Move to step ``index`` and apply its mode; completed at once when it is the last step
    and has no time to hold."""
    step = plan.steps[index]
    mode = step.mode
    assert mode is not None, "an approve step has no mode to go to"
    last = index == len(plan.steps) - 1 and not step.for_s
    status = PlanStatus.COMPLETED if last else PlanStatus.RUNNING
    return PlanAction(
        kind=kind, step=index, status=status, mode=mode, percent=step.percent, reason=reason,
        events=(*events, "started", *(("completed",) if last else ())),
    )  # fmt: skip


def start_action(plan: Plan, route: RouteState) -> PlanAction:
    """A plan seen for the first time: it starts at its first step in the route's mode (no
    change), else at its first step, whose mode is applied."""
    index = plan.start_index(route.mode, route.canary_percent)
    action = _goto(plan, index, ActionKind.START, f"plan started at {plan.steps[index].label()}", ())
    if plan.steps[index].matches(route.mode, route.canary_percent):
        action = replace(action, mode=None, percent=0)
    return action


def _failure(plan: Plan, record: PlanRecord, active: int, analysis: Analysis, route: RouteState) -> PlanAction:
    why = f"analysis failed: {analysis.reason}"
    paused = PlanAction(
        kind=ActionKind.PAUSE, step=record.step, status=PlanStatus.PAUSED, reason=why, events=("failed", "paused")
    )
    if plan.on_failure.value == "pause":
        return paused
    target = plan.active_index(active - 1) if active > 0 else None
    if target is not None:
        step = plan.steps[target]
        return PlanAction(
            kind=ActionKind.ROLLBACK, step=target, status=PlanStatus.PAUSED, mode=step.mode, percent=step.percent,
            reason=f"{why}; rolled back to {step.label()}", events=("rolled_back", "paused"),
        )  # fmt: skip
    if route.mode.rank > Mode.SHADOW.rank:  # nothing passed before the first step: shadow at worst
        return PlanAction(
            kind=ActionKind.ROLLBACK, step=record.step, status=PlanStatus.PAUSED, mode=Mode.SHADOW,
            reason=f"{why}; rolled back to shadow", events=("rolled_back", "paused"),
        )  # fmt: skip
    return paused


def next_action(
    plan: Plan, record: PlanRecord, analysis: Analysis | None, *, route: RouteState, now: float
) -> PlanAction:
    """What the plan's driver does at ``now`` (see the module docstring's table)."""
    if not record.status.driven:
        return _wait(record)
    active = plan.active_index(record.step)
    assert active is not None, "a plan's first step has a mode"
    held = plan.steps[active]
    if not held.matches(route.mode, route.canary_percent):
        who = route.updated_by or "someone"
        return PlanAction(
            kind=ActionKind.PAUSE, step=record.step, status=PlanStatus.PAUSED, events=("paused",),
            reason=f"the route was moved to {route.label()} by {who}, outside the plan",
        )  # fmt: skip
    if analysis is None or analysis.step != record.step or analysis.at < record.step_since:
        return _wait(record)  # nothing judged in this step yet
    if analysis.verdict is Verdict.FAIL:
        return _failure(plan, record, active, analysis, route)
    if analysis.verdict is Verdict.REFUSED:
        return PlanAction(
            kind=ActionKind.PAUSE, step=record.step, status=PlanStatus.PAUSED, reason=analysis.reason,
            events=("paused",),
        )  # fmt: skip
    if record.status is PlanStatus.WAITING_FOR_APPROVAL or analysis.verdict is Verdict.INCONCLUSIVE:
        return _wait(record)
    if now - record.step_since < held.for_s:
        return _wait(record)
    nxt = record.step + 1
    if nxt >= len(plan.steps):
        return PlanAction(
            kind=ActionKind.COMPLETE, step=record.step, status=PlanStatus.COMPLETED, reason="every step passed",
            events=("passed", "completed"),
        )  # fmt: skip
    if plan.steps[nxt].kind is StepKind.APPROVE:
        return PlanAction(
            kind=ActionKind.AWAIT_APPROVAL, step=nxt, status=PlanStatus.WAITING_FOR_APPROVAL,
            reason=f"{held.label()} passed; waiting for an operator to approve the next step",
            events=("waiting_for_approval",),
        )  # fmt: skip
    return _goto(plan, nxt, ActionKind.ADVANCE, f"{held.label()} passed", ())


def operator_action(plan: Plan, record: PlanRecord, kind: ActionKind, *, route: RouteState) -> PlanAction:
    """An operator's ``pause``, ``resume``, ``approve`` or ``abort``; raises
    :class:`OperatorRefused` when it does not apply to the plan as it stands."""
    status = record.status
    if kind is ActionKind.PAUSE:
        if not status.driven:
            raise OperatorRefused(f"the plan is {status.value}: only a running plan can be paused")
        return PlanAction(kind=kind, step=record.step, status=PlanStatus.PAUSED, events=("paused",))
    if kind is ActionKind.APPROVE:
        if status is not PlanStatus.WAITING_FOR_APPROVAL:
            raise OperatorRefused(f"the plan is {status.value}, not waiting for an approval")
        return _goto(plan, record.step + 1, kind, "approved", ("approved",))
    if kind is ActionKind.ABORT:
        if status in (PlanStatus.ABORTED, PlanStatus.REMOVED):
            raise OperatorRefused(f"the plan is {status.value}")
        first = plan.steps[0]
        return PlanAction(
            kind=kind, step=0, status=PlanStatus.ABORTED, mode=first.mode, percent=first.percent, events=("aborted",)
        )
    if kind is ActionKind.RESUME:
        if status not in (PlanStatus.PAUSED, PlanStatus.ABORTED):
            raise OperatorRefused(f"the plan is {status.value}: only a paused or aborted plan can be resumed")
        at_approval = plan.steps[record.step].kind is StepKind.APPROVE
        active = plan.active_index(record.step)
        held = plan.steps[active if active is not None else 0]
        aligned = held.matches(route.mode, route.canary_percent)
        return PlanAction(
            kind=kind, step=record.step,
            status=PlanStatus.WAITING_FOR_APPROVAL if at_approval else PlanStatus.RUNNING,
            mode=None if aligned else held.mode, percent=0 if aligned else held.percent, events=("resumed",),
        )  # fmt: skip
    raise ValueError(f"not an operator's action: {kind.value}")
