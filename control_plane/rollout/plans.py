"""Rollout plans at work: which plan each route has, and every change to one -- set or
removed by an operator, moved by the plan driver (:mod:`.plan_driver`) or by an operator's
pause, resume, approve or abort, paused by a manual mode change.

A route's plan is the API's (``PUT /v1/routes/{route}/plan``, kept in its record in Redis)
until it is deleted, else the rules file's (``rollout:``). Its progress is a
:class:`~control_plane.model.plan_progress.PlanRecord` in ``rl:{ns}:plans``, remembered by
every replica (:class:`~control_plane.model.recovery.StateMemory`) and written back with the
rollout state when Redis loses its data. Every change is one compare-and-set write of the
record -- with the route's mode in the same Lua script when the step changes it
(:meth:`RolloutManager.change_for_plan`) -- so two replicas never both apply a step, and an
operator's word and the driver's cannot cross: the later one finds the record moved and
reads it again. The decisions are pure (:mod:`control_plane.model.plan_progress`); this
module does the IO, the audit entries, the notifications and the metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..decision.types import UnknownRoute
from ..model.plan import Plan
from ..model.plan_analysis import Analysis, Verdict, since_baseline
from ..model.plan_progress import (
    ActionKind,
    Baseline,
    PlanAction,
    PlanRecord,
    PlanStatus,
    operator_action,
    start_action,
)
from ..model.recovery import StateMemory
from ..model.rollout import AuditEntry, GateResult, GateStats, Mode, RouteState
from ..observe.metrics import Metrics
from ..observe.notify import Notifier
from ..store import DivergenceStore, PlanConflict, PlanStore, PlanWrite, gate_stats_of
from .manager import RolloutManager

if TYPE_CHECKING:
    from ..rules import Rules

__all__ = ["NoPlan", "Plans", "RECENT_OUTCOMES"]

log = logging.getLogger("shadowlimit.plans")

#: how many of a plan's last analyses are kept for the API and the dashboard
RECENT_OUTCOMES = 10
#: the actor of the plan driver's own changes
PLAN_ACTOR = "plan"


class NoPlan(LookupError):
    """The route has no plan (a 404)."""

    def __init__(self, route: str, detail: str = "") -> None:
        super().__init__(f"route {route!r} has no rollout plan{detail}")
        self.route = route


class Plans:
    """Every route's plan and the changes to it (see the module docstring)."""

    def __init__(
        self,
        *,
        store: PlanStore,
        rollout: RolloutManager,
        divergence: DivergenceStore,
        rules: Callable[[], Rules],
        memory: StateMemory,
        metrics: Metrics,
        notifier: Notifier,
        window_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.rollout = rollout
        self.divergence = divergence
        self._rules = rules
        self.memory = memory
        self.metrics = metrics
        self.notifier = notifier
        self.window_s = window_s
        self.clock = clock
        #: each plan's latest analysis and last outcomes ({"analysis", "recent", "driver"}), by route
        self.analyses: dict[str, dict[str, Any]] = {}
        #: the plan driver's lease as this replica last saw it ("<instance>#<fence>"; None: none)
        self.driver: str | None = None
        #: the routes whose plan the metrics last showed (a plan gone from the rules goes back to 0)
        self._shown: set[str] = set()

    # -- which plan a route has ------------------------------------------------------------

    def effective(self, route: str) -> tuple[Plan, str] | None:
        """The route's plan and where it comes from (``api`` wins over ``rules``), or None."""
        record = self.memory.plans.get(route)
        if record is not None and record.source == "api" and record.plan is not None:
            return record.plan, "api"
        rule = self._rules().get(route)
        if rule is not None and rule.rollout is not None:
            return rule.rollout, "rules"
        return None

    def record(self, route: str) -> PlanRecord | None:
        """The progress of the route's plan (None: not started yet, or no plan)."""
        eff = self.effective(route)
        record = self.memory.plans.get(route)
        if eff is None or record is None or record.status is PlanStatus.REMOVED:
            return None
        plan, source = eff
        return record if record.plan_id == plan.id and record.source == source else None

    def routes(self) -> list[str]:
        """The routes of the rules in force that have a plan."""
        rules = self._rules()
        names = [r.name for r in rules.all_routes if r.rollout is not None]
        seen = set(names)
        for route, record in self.memory.plans.items():
            if record.source == "api" and route not in seen and rules.get(route) is not None:
                names.append(route)
        return names

    def route_state(self, route: str) -> RouteState:
        return self.rollout.state_for(route)

    # -- figures ---------------------------------------------------------------------------

    async def baseline(self, route: str, now: float) -> Baseline:
        """The fleet's counters of the current minute, now: where a step starting now begins."""
        rows = await self.divergence.series(route, 1, now=now)
        return Baseline(minute=int(rows[-1]["minute"]), counts=gate_stats_of(rows[-1:]))

    async def step_stats(self, route: str, record: PlanRecord, now: float) -> GateStats:
        """The fleet's figures since the record's step began (at most the gate window's last
        minutes): the minute it began in counts only what came after its baseline."""
        start = max(record.step_since, now - self.window_s)
        minutes = int(now // 60) - int(start // 60) + 1
        rows = await self.divergence.series(route, max(1, minutes), now=now)
        base = record.baseline
        if base is None or not rows or int(rows[0]["minute"]) != base.minute:
            return gate_stats_of(rows)
        return since_baseline(first=gate_stats_of(rows[:1]), later=gate_stats_of(rows[1:]), baseline=base.counts)

    def note_analysis(self, route: str, analysis: Analysis, driver: str) -> dict[str, Any]:
        """Keep the analysis and its outcome among the last ones; returns what is stored."""
        before = self.analyses.get(route) or {}
        recent = [
            *(before.get("recent") or [])[-(RECENT_OUTCOMES - 1) :],
            {"at": analysis.at, "step": analysis.step, "verdict": analysis.verdict.value, "reason": analysis.reason},
        ]
        value = {"analysis": analysis.to_dict(), "recent": recent, "driver": driver}
        self.analyses[route] = value
        return value

    def last_analysis(self, route: str, record: PlanRecord | None) -> Analysis | None:
        """The latest analysis of a running plan's current step (None: none yet); of a plan that
        stopped (paused, completed, aborted), the last one, whichever step it judged: what
        stopped it."""
        d = (self.analyses.get(route) or {}).get("analysis")
        if record is None or not isinstance(d, dict):
            return None
        try:
            analysis = Analysis.from_dict(d)
        except ValueError:
            return None
        if not record.status.driven:
            return analysis
        return analysis if analysis.step == record.step and analysis.at >= record.step_since else None

    def refresh_metrics(self) -> None:
        """``rate_limit_plan_step`` and ``rate_limit_plan_state`` of every route with a plan
        (and back to 0 for a route whose plan is gone)."""
        routes = self.routes()
        for route in self._shown.difference(routes):
            self.metrics.set_plan(route, 0, None)
        self._shown = set(routes)
        for route in routes:
            record = self.record(route)
            if record is None:
                self.metrics.set_plan(route, 0, None)
                continue
            self.metrics.set_plan(route, record.step + 1, self.state_of(route, record))

    def state_of(self, route: str, record: PlanRecord | None) -> str:
        """What the API shows: the record's status, ``waiting`` for a running plan waiting for evidence."""
        if record is None:
            return "waiting"
        if record.status is PlanStatus.RUNNING:
            analysis = self.last_analysis(route, record)
            if analysis is None or analysis.verdict is Verdict.INCONCLUSIVE:
                return "waiting"
        return record.status.value

    # -- changes ---------------------------------------------------------------------------

    async def apply(
        self, route: str, plan: Plan, record: PlanRecord, action: PlanAction, *, prior: PlanRecord | None,
        actor: str, reason: str, lease: str | None = None, judged: dict[str, Any] | None = None,
    ) -> tuple[PlanRecord, AuditEntry | None]:  # fmt: skip
        """Apply ``action`` to ``record`` (``prior``: what the store holds for the route, whose
        version the write must find), with the route's mode when the action changes it:
        audited (``reason``), announced, counted and notified. ``lease``: the plan driver's,
        checked by the write. Raises ``PlanConflict``, ``LeaseLost``, ``VersionConflict``,
        ``StoreUnavailable``, ``UnknownRoute``."""
        now = self.clock()
        new = record.moved(action, now=now, by=actor)
        if new.step_since == now:
            new = replace(new, baseline=await self.baseline(route, now))
        expected = prior.version if prior is not None else 0
        automatic = actor == PLAN_ACTOR
        entry: AuditEntry | None
        if action.mode is not None:
            _, entry = await self.rollout.change_for_plan(
                route, action.mode, canary_percent=action.percent, reason=reason, actor=actor, judged=judged,
                automatic=automatic, plan=PlanWrite(record=new, expected_version=expected, lease=lease),
            )  # fmt: skip
            written = self.memory.plans.get(route) or replace(new, version=expected + 1)
        else:
            audit = AuditEntry(
                route=route, actor=actor, from_mode=record.status.value if prior is not None else "",
                to_mode=_label(plan, new), reason=reason, automatic=automatic, gate=judged, kind="plan", at=now,
            )  # fmt: skip
            written, entry = await self.store.write(route, new, expected_version=expected, entry=audit, lease=lease)
            self.memory.note_plan(route, written)
        self.metrics.set_plan(route, written.step + 1, self.state_of(route, written))
        self._notify(route, plan, written, action, reason)
        return written, entry

    def _notify(self, route: str, plan: Plan, record: PlanRecord, action: PlanAction, reason: str) -> None:
        step = plan.steps[record.step]
        where = f"step {record.step + 1} of {len(plan.steps)} ({step.label()})"
        what = {
            ActionKind.START: f"plan started at {where}",
            ActionKind.ADVANCE: f"moved to {where}",
            ActionKind.AWAIT_APPROVAL: f"waiting for an approval at {where}: shadowlimit plan {route} --approve",
            ActionKind.COMPLETE: "plan completed",
            ActionKind.ROLLBACK: f"plan failed and rolled back to {_mode_label(action)}; paused",
            ActionKind.PAUSE: "plan paused",
            ActionKind.RESUME: f"plan resumed at {where}",
            ActionKind.APPROVE: f"approved: moved to {where}",
            ActionKind.ABORT: f"plan aborted: back to {plan.steps[0].label()}",
        }.get(action.kind, action.kind.value)
        if action.kind is not ActionKind.COMPLETE and record.status is PlanStatus.COMPLETED:
            what += "; plan completed"
        self.notifier.send(
            f"shadowlimit: route {route}: {what} -- {reason}",
            route=route, event=action.kind.value, status=record.status.value, step=record.step + 1,
            steps=len(plan.steps), label=step.label(), reason=reason,
        )  # fmt: skip

    async def _stored(self, route: str) -> PlanRecord | None:
        record = await self.store.get(route)
        if record is not None:
            self.memory.note_plan(route, record)
        return record

    def require_route(self, route: str) -> None:
        """Raises ``UnknownRoute`` unless the rules in force have the route."""
        if self._rules().get(route) is None:
            raise UnknownRoute(route)

    async def set(self, route: str, plan: Plan, *, reason: str, actor: str) -> tuple[PlanRecord, AuditEntry | None]:
        """Set (or replace) the route's plan from the API: it wins over the rules file's until
        deleted, and starts now (its first step in the route's mode, else its first step,
        applied). Raises ``UnknownRoute``, ``PlanConflict``, ``StoreUnavailable``."""
        self.require_route(route)
        prior = await self._stored(route)
        fresh = PlanRecord(plan_id=plan.id, source="api", status=PlanStatus.RUNNING, plan=plan)
        action = start_action(plan, self.route_state(route))
        return await self.apply(
            route, plan, fresh, action, prior=prior, actor=actor, reason=f"plan set: {plan.describe()}: {reason}"
        )

    async def delete(self, route: str, *, reason: str, actor: str) -> AuditEntry | None:
        """Remove the route's plan set by the API (the rules file's, if any, then starts);
        raises ``NoPlan`` when it has none."""
        self.require_route(route)
        prior = await self._stored(route)
        if prior is None or prior.source != "api" or prior.plan is None:
            raise NoPlan(route, " set through the API (a rules file's plan is removed from the file)")
        now = self.clock()
        gone = replace(
            prior, source="", status=PlanStatus.REMOVED, plan=None, plan_id="", reason=f"removed by {actor}: {reason}",
            updated_at=now, updated_by=actor,
        )  # fmt: skip
        audit = AuditEntry(
            route=route, actor=actor, from_mode=prior.status.value, to_mode="plan removed", reason=reason,
            kind="plan", at=now,
        )  # fmt: skip
        written, entry = await self.store.write(route, gone, expected_version=prior.version, entry=audit)
        self.memory.note_plan(route, written)
        self.metrics.set_plan(route, 0, None)
        return entry

    async def act(
        self, route: str, kind: ActionKind, *, reason: str, actor: str
    ) -> tuple[PlanRecord, AuditEntry | None]:
        """An operator's pause, resume, approve or abort (abort moves the route back to the
        plan's first step). Raises ``UnknownRoute``, ``NoPlan``,
        :class:`~control_plane.model.plan_progress.OperatorRefused`, ``PlanConflict``,
        ``StoreUnavailable``."""
        self.require_route(route)
        eff = self.effective(route)
        if eff is None:
            raise NoPlan(route)
        plan, source = eff
        prior = await self._stored(route)
        record = self.record(route)
        if record is None:
            raise NoPlan(route, " started yet (its driver starts it within SHADOWLIMIT_PLAN_INTERVAL_S)")
        action = operator_action(plan, record, kind, route=self.route_state(route))
        action = replace(action, reason=f"{_DONE[kind]} by {actor}: {reason}")
        return await self.apply(route, plan, record, action, prior=prior, actor=actor, reason=f"{kind.value}: {reason}")

    async def set_mode(
        self, route: str, mode: Mode, *, canary_percent: int, reason: str, actor: str, force: bool
    ) -> tuple[RouteState, AuditEntry, GateResult]:
        """A person's mode change (:meth:`RolloutManager.set_mode`); a running plan on the
        route is paused by the same write (a person's word wins), audited with it."""
        for _ in range(3):
            record = self.record(route)
            if record is None or not record.status.driven:
                return await self.rollout.set_mode(
                    route, mode, canary_percent=canary_percent, reason=reason, actor=actor, force=force
                )
            label = f"canary {canary_percent}%" if mode is Mode.CANARY else mode.value
            why = f"paused: {actor} moved the route to {label} ({reason})"
            action = PlanAction(
                kind=ActionKind.PAUSE, step=record.step, status=PlanStatus.PAUSED, reason=why, events=("paused",)
            )
            paused = record.moved(action, now=self.clock(), by=actor)
            try:
                result = await self.rollout.set_mode(
                    route, mode, canary_percent=canary_percent, reason=reason, actor=actor, force=force,
                    plan=PlanWrite(record=paused, expected_version=record.version),
                )  # fmt: skip
            except PlanConflict as exc:  # the plan moved meanwhile: judge again with its record
                if exc.current is not None:
                    self.memory.note_plan(route, exc.current)
                continue
            eff = self.effective(route)
            if eff is not None:
                self._notify(route, eff[0], paused, action, why)
            self.refresh_metrics()
            return result
        raise PlanConflict(route, self.memory.plans.get(route))


_DONE = {
    ActionKind.PAUSE: "paused",
    ActionKind.RESUME: "resumed",
    ActionKind.APPROVE: "approved",
    ActionKind.ABORT: "aborted",
}


def _label(plan: Plan, record: PlanRecord) -> str:
    """An audit entry's ``to`` for a plan's change: ``running at canary 10% (step 2 of 5)``."""
    if record.status is PlanStatus.REMOVED:
        return "plan removed"
    step = plan.steps[record.step]
    return f"{record.status.value} at {step.label()} (step {record.step + 1} of {len(plan.steps)})"


def _mode_label(action: PlanAction) -> str:
    if action.mode is None:
        return "its step"
    return f"canary {action.percent}%" if action.mode is Mode.CANARY else action.mode.value
