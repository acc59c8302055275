"""The rollout manager: every route's mode on this replica, kept in step with the fleet.

It holds what this replica knows of the rollout state (through :class:`StateMemory`:
never an older state than one seen), changes modes fleet-wide behind the promotion gate
(atomic in Redis, audited), follows the other replicas (pub/sub events, and a resync
every ``SHADOWLIMIT_ROLLOUT_RESYNC_S``), writes back what a store that lost its data no
longer has, and rolls enforced routes back to shadow when the Redis breaker stays open.
The pure decisions (modes, gates, classes) are in :mod:`control_plane.model.rollout`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from limiter.errors import BackendError
from limiter.resilience import BreakerState, CircuitBreaker

from ..decision.types import UnknownRoute
from ..model.plan_progress import PlanRecord
from ..model.recovery import RememberedAudit, StateMemory
from ..model.rollout import AuditEntry, GateConfig, GateResult, Mode, RouteState, evaluate_gate
from ..observe.auditlog import AuditSink
from ..observe.events import EventHub
from ..observe.logs import event_fields
from ..observe.metrics import Metrics
from ..store import (
    AUDIT_MAXLEN,
    DivergenceStore,
    PlanWrite,
    RolloutStore,
    StoreError,
    StoreUnavailable,
    VersionConflict,
)
from .adjustments import Adjustments

if TYPE_CHECKING:
    from ..rules import RouteRule, Rules
    from ..settings import Settings

__all__ = ["GateRefused", "RolloutManager"]

log = logging.getLogger("shadowlimit.engine")


class GateRefused(Exception):
    """A promotion did not pass its gate (and was not forced)."""

    def __init__(self, gate: GateResult) -> None:
        super().__init__("; ".join(gate.reasons))
        self.gate = gate


class RolloutManager:
    """Modes, gates, the sync with the fleet and automatic rollback (module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        rules: Callable[[], Rules],
        store: RolloutStore,
        divergence: DivergenceStore,
        memory: StateMemory,
        adjustments: Adjustments,
        breaker: CircuitBreaker,
        metrics: Metrics,
        events: EventHub,
        audit_sink: AuditSink,
        instance_id: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._rules = rules
        self.store = store
        self.divergence = divergence
        self.memory = memory
        self.adjustments = adjustments
        self.breaker = breaker
        self.metrics = metrics
        self.events = events
        self.audit_sink = audit_sink
        self.instance_id = instance_id
        self.clock = clock
        self.gate_config = GateConfig(
            window_s=settings.gate_window_s,
            min_samples=settings.gate_min_samples,
            max_new_rejection_rate=settings.gate_max_new_rejection_rate,
            max_backend_error_rate=settings.gate_max_backend_error_rate,
            min_sampled_share=settings.gate_min_sampled_share,
            min_dwell_s=settings.gate_min_dwell_s,
            counts=settings.gate_counts,
        )
        self.pending_rollbacks: dict[str, tuple[RouteState, RouteState]] = {}  # route -> (rollback, from)
        self.restorations = 0
        #: grows with every change of a route's mode on this replica (decision plans follow it)
        self.generation = 0
        self._metrics_task: asyncio.Task[None] | None = None
        store.on_audit = self.on_audit_written

    # -- the modes in force --------------------------------------------------------------

    def default_state(self, route: RouteRule | None) -> RouteState:
        if route is not None and route.initial_mode is not None:
            return RouteState(mode=route.initial_mode, canary_percent=route.initial_canary_percent, updated_by="rules")
        return RouteState(mode=Mode(self.settings.default_mode), updated_by="default")

    def state_for(self, name: str) -> RouteState:
        pending = self.pending_rollbacks.get(name)
        if pending is not None:
            return pending[0]
        st = self.memory.states.get(name)
        return st if st is not None else self.default_state(self._rules().get(name))

    def effective_mode(self, name: str) -> tuple[Mode, int]:
        if not self.settings.enable_distributed_rate_limiting:
            return Mode.OFF, 0
        st = self.state_for(name)
        return st.mode, st.canary_percent

    def set_mode_metric(self, name: str) -> None:
        """The route's mode gauge; its labelled counters are created at 0 the first time."""
        rule = self._rules().get(name)
        self.metrics.add_route(
            name,
            external=rule is not None and rule.external is not None,
            envoy=rule is not None and (rule.origin or {}).get("kind") == "envoy",
            budget=rule is not None and rule.budget is not None,
        )
        self.metrics.set_mode(name, self.effective_mode(name)[0].value)

    def _changed(self, routes: list[str] | tuple[str, ...]) -> None:
        if routes:
            self.generation += 1
        for name in routes:
            self.set_mode_metric(name)
            st = self.state_for(name)
            log.info(
                "route %s is now %s%s (by %s)",
                name,
                st.mode.value,
                f" {st.canary_percent}%" if st.mode is Mode.CANARY else "",
                st.updated_by,
                extra=event_fields(
                    "mode_change", route=name, mode=st.mode.value, canary_percent=st.canary_percent,
                    version=st.version, updated_by=st.updated_by, reason=st.reason,
                ),
            )  # fmt: skip

    def rules_changed(self, rules: Rules) -> asyncio.Task[None] | None:
        """New rules: a route's default mode may have changed. With an event loop
        running, the routes' metrics are set in the background, in slices (an Envoy
        configuration of 50,000 routes takes seconds of CPU to create the series of: that
        must not hold the loop), and the task doing it is returned (LiveRules.settle waits
        for it); a newer change cancels it (the new task covers every route)."""
        self.generation += 1
        names = rules.names()
        if self._metrics_task is not None:
            self._metrics_task.cancel()
            self._metrics_task = None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: at once
            current = set(names)
            for name in [r for r in self.metrics.routes() if r not in current]:
                self.metrics.remove_route(name)
            for name in names:
                self.set_mode_metric(name)
            return None
        self._metrics_task = loop.create_task(self._set_mode_metrics(names))
        return self._metrics_task

    async def _set_mode_metrics(self, names: list[str]) -> None:
        """The series of the routes that are gone are dropped, the new routes' created, in
        slices of 0.5 ms, then 2 ms for the rest: background work, it takes a fifth of the
        loop at most (a new series costs ~5 us: 50,000 Envoy routes make 2 million)."""
        from ..rules.offload import breathe

        current = set(names)
        gone = [r for r in self.metrics.routes() if r not in current]
        start = time.perf_counter()
        for i, name in enumerate(gone + names):
            if i < len(gone):
                self.metrics.remove_route(name)
            else:
                self.set_mode_metric(name)
            if time.perf_counter() - start >= 0.0005:
                await breathe(0.002)
                start = time.perf_counter()

    # -- following the fleet -------------------------------------------------------------

    async def sync(self) -> None:
        """Read the store and take in what is new; when the store has lost what this
        replica remembers (restarted empty, flushed, failed over to an older copy), write
        it back first (:meth:`RolloutStore.restore`, audited), so no mode ever goes back."""
        mem = self.memory
        view = await self.store.read_view(mem.head)
        loss = mem.check(view, audit_maxlen=AUDIT_MAXLEN)
        if loss.lost:
            mem.forget_baselines(loss.plans)
            result = await self.store.restore(mem, instance=self.instance_id, new_epoch=uuid.uuid4().hex)
            mem.restored(result.epoch)
            if result.restored:
                self.restorations += 1
                self.metrics.restorations.inc()
                log.warning(
                    "the store lost its data (%s): restored %d route states, %d audit entries and %d adjustments",
                    loss.describe(),
                    result.routes,
                    result.audit_entries,
                    result.adjustments,
                )
            view = await self.store.read_view(mem.head)
        changed = mem.absorb(view)
        if mem.epoch is None:
            mem.restored(await self.store.ensure_epoch(uuid.uuid4().hex))
        self.adjustments.apply()
        self._changed(changed)

    async def resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.rollout_resync_s)
            try:
                await self.sync()
                await self.persist_rollbacks()
            except StoreUnavailable as exc:
                log.debug("rollout resync failed: %s", exc)
            except (StoreError, BackendError) as exc:
                log.warning("rollout resync failed: %s", exc)
            except Exception as exc:  # noqa: BLE001 - anything else (a client closed under it): the loop lives on
                log.warning("rollout resync failed: %s: %s", type(exc).__name__, exc)

    async def subscribe_loop(self) -> None:
        """Follow the other replicas' events (and republish them to this replica's stream)."""
        while True:
            try:
                async for event in self.store.subscribe():
                    self.note_event(event)
                    self.events.publish(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reconnect on any pub/sub failure
                log.debug("pub/sub listener failed: %s", exc)
            await asyncio.sleep(1.0)

    def note_event(self, event: dict[str, Any]) -> None:
        """Remember what an event from another replica (or our own) tells: a route's new
        state (never an older one), its rollout plan's record, and the audit entry it carries."""
        route = event.get("route")
        if isinstance(event.get("plan"), dict) and isinstance(route, str):
            try:
                self.memory.note_plan(route, PlanRecord.from_dict(event["plan"]))
            except ValueError:
                log.warning("ignoring an event with an unreadable plan record: %r", event)
        if event.get("type") == "mode_change" and isinstance(event.get("state"), dict) and isinstance(route, str):
            try:
                state = RouteState.from_dict(event["state"])
            except (ValueError, TypeError):
                log.warning("ignoring a mode_change event with an unreadable state: %r", event)
            else:
                if self.memory.note_state(route, state):
                    self._changed((route,))
        audit = event.get("audit")
        if isinstance(audit, dict) and isinstance(audit.get("id"), str):
            body = {k: v for k, v in audit.items() if k != "id"}
            kind = str(audit.get("kind", event.get("type", "")))
            text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
            self.memory.note_audit(RememberedAudit(audit["id"], kind, str(audit.get("route", route or "")), text))

    def on_audit_written(self, entry: AuditEntry, raw: RememberedAudit) -> None:
        """Every audit entry this replica stored: remembered, and logged once (the log
        line and SHADOWLIMIT_AUDIT_LOG)."""
        self.memory.note_audit(raw)
        self.audit_sink.emit(entry)

    # -- changing a mode -----------------------------------------------------------------

    def gate_config_for(self, route: str) -> GateConfig:
        """The gate's thresholds for a route: the settings', with the rules' ``min_dwell`` and
        ``gate_weight``."""
        rule = self._rules().get(route)
        if rule is None:
            return self.gate_config
        dwell = self.gate_config.min_dwell_s if rule.min_dwell_s is None else rule.min_dwell_s
        return replace(self.gate_config, min_dwell_s=dwell, weight=rule.gate_weight)

    async def gate_for(self, route: str, target: Mode, percent: int) -> GateResult:
        stats = await self.divergence.window_stats(route, self.gate_config.window_s)
        config = self.gate_config_for(route)
        return evaluate_gate(self.state_for(route), target, percent, stats, config, now=self.clock())

    async def _current(self, route: str) -> RouteState:
        """The route's stored state, written back first if the store lost it."""
        remembered = self.memory.states.get(route)
        stored = await self.store.get(route)
        if (
            remembered is not None
            and remembered.version > 0
            and (stored is None or stored.version < remembered.version)
        ):
            await self.sync()  # the store lost this route's state: write it back first
            stored = await self.store.get(route)
        return stored or remembered or self.default_state(self._rules().get(route))

    async def set_mode(
        self,
        route: str,
        mode: Mode,
        *,
        canary_percent: int = 0,
        reason: str,
        actor: str,
        force: bool = False,
        automatic: bool = False,
        plan: PlanWrite | None = None,
    ) -> tuple[RouteState, AuditEntry, GateResult]:
        """Change a route's mode fleet-wide (atomic in Redis; audited), with ``plan``, the
        route's rollout plan record in the same step (a manual change pauses a running plan).
        Raises :class:`UnknownRoute`, :class:`GateRefused`, :class:`StoreUnavailable`,
        :class:`VersionConflict` or, with ``plan``, :class:`~control_plane.store.PlanConflict`."""
        canary_percent, current = await self._prepare(route, mode, canary_percent)
        try:
            gate = await self.gate_for(route, mode, canary_percent)
        except BackendError as exc:
            raise StoreUnavailable(str(exc)) from exc
        if gate.required and not gate.passed and not force:
            raise GateRefused(gate)
        now = self.clock()
        new = RouteState(mode, canary_percent, now, actor, reason, current.version + 1)
        entry = AuditEntry(
            route=route,
            actor=actor,
            at=now,
            from_mode=current.mode.value,
            to_mode=mode.value,
            from_percent=current.canary_percent,
            to_percent=canary_percent,
            reason=reason,
            forced=force and gate.required and not gate.passed,
            automatic=automatic,
            gate=gate.to_dict(),
        )
        entry = await self._apply(route, new, entry, current=current, plan=plan)
        self.metrics.mode_changed(route, mode.value, automatic)
        return new, entry, gate

    async def change_for_plan(
        self, route: str, mode: Mode, *, canary_percent: int, reason: str, actor: str, judged: dict[str, Any] | None,
        automatic: bool, plan: PlanWrite,
    ) -> tuple[RouteState, AuditEntry]:  # fmt: skip
        """A step of a route's rollout plan: the mode changed with the plan's record, atomically
        (:meth:`RolloutStore.change`; the plan driver's lease checked when ``plan.lease`` is
        given). The plan's own analysis (``judged``: every check's value and threshold) stands
        for the gate and is what the audit entry records. Raises :class:`UnknownRoute`,
        :class:`StoreUnavailable`, :class:`VersionConflict`, ``PlanConflict`` or ``LeaseLost``."""
        canary_percent, current = await self._prepare(route, mode, canary_percent)
        new = RouteState(mode, canary_percent, self.clock(), actor, reason, current.version + 1)
        entry = AuditEntry(
            route=route, actor=actor, from_mode=current.mode.value, to_mode=mode.value,
            from_percent=current.canary_percent, to_percent=canary_percent, reason=reason, automatic=automatic,
            gate=judged, at=new.updated_at,
        )  # fmt: skip
        entry = await self._apply(route, new, entry, current=current, plan=plan)
        self.metrics.mode_changed(route, mode.value, "plan" if automatic else False)
        return new, entry

    async def _prepare(self, route: str, mode: Mode, canary_percent: int) -> tuple[int, RouteState]:
        """A change's percent (0 but for a canary) and the route's stored state; raises
        :class:`UnknownRoute` or :class:`StoreUnavailable`."""
        if self._rules().get(route) is None:
            raise UnknownRoute(route)
        try:
            return (canary_percent if mode is Mode.CANARY else 0), await self._current(route)
        except BackendError as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def _apply(
        self, route: str, new: RouteState, entry: AuditEntry, *, current: RouteState, plan: PlanWrite | None
    ) -> AuditEntry:
        """Store a change (with the plan's record, which then names the route state's new
        version), then take it in on this replica."""
        if plan is not None:
            plan = replace(plan, record=replace(plan.record, route_version=new.version))
        entry = await self.store.change(route, new, entry, expected_version=current.version, plan=plan)
        self.memory.note_state(route, new)
        if plan is not None:
            self.memory.note_plan(route, replace(plan.record, version=plan.expected_version + 1))
        self.pending_rollbacks.pop(route, None)
        self._changed((route,))
        return entry

    # -- automatic rollback --------------------------------------------------------------

    async def monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            await self.check_auto_rollback()

    async def check_auto_rollback(self) -> None:
        """Enforced routes go back to shadow when the breaker has been open for
        ``SHADOWLIMIT_AUTO_ROLLBACK_AFTER_S`` (at once on this replica; stored by
        :meth:`persist_rollbacks` once Redis answers). Not the routes decided by name only
        (Envoy's): shadow lifts their limit, the failure policy keeps it."""
        if self.breaker.state is BreakerState.CLOSED:
            return
        open_for = self.breaker.open_for_s()
        if open_for < self.settings.auto_rollback_after_s:
            return
        for rule in self._rules().all_routes:
            name = rule.name
            st = self.state_for(name)
            if st.mode not in (Mode.ENFORCE, Mode.CANARY) or name in self.pending_rollbacks:
                continue
            if not rule.http:
                # an Envoy route in shadow answers OK: rolling it back would lift its limit
                # altogether; its failure policy keeps answering instead
                continue
            rb = RouteState(
                mode=Mode.SHADOW,
                updated_at=self.clock(),
                updated_by="shadowlimit/auto-rollback",
                reason=f"Redis circuit breaker open for {open_for:.0f}s",
                version=st.version,
            )
            self.pending_rollbacks[name] = (rb, st)
            self._changed((name,))
            self.events.publish(
                {
                    "type": "auto_rollback",
                    "route": name,
                    "from": st.mode.value,
                    "to": "shadow",
                    "reason": rb.reason,
                    "persisted": False,
                }
            )
            # the mode changed on this replica: on record now (log and audit file), in
            # the store once Redis answers again
            self.audit_sink.emit(_rollback_entry(name, rb, st), stored=False)
            log.warning(
                "auto-rollback of route %s to shadow: %s",
                name,
                rb.reason,
                extra=event_fields("auto_rollback", route=name, to="shadow", reason=rb.reason, open_for_s=open_for),
            )

    async def persist_rollbacks(self) -> None:
        """Persist automatic rollbacks once Redis answers again (audited as automatic, from
        the mode the route really had: the newest state this replica knows, which a store
        that lost its data cannot take away). A route someone moved out of enforce/canary
        meanwhile keeps that change (it has its own audit entry)."""
        for name, (rb, frm) in list(self.pending_rollbacks.items()):
            cur = self.memory.states.get(name) or frm
            try:
                if cur.mode in (Mode.ENFORCE, Mode.CANARY):
                    new = replace(rb, version=cur.version + 1)
                    await self.store.change(name, new, _rollback_entry(name, rb, cur), expected_version=cur.version)
                    self.memory.note_state(name, new)
                    self.metrics.mode_changed(name, "shadow", True)
            except VersionConflict:
                pass  # another replica persisted it first
            self.pending_rollbacks.pop(name, None)
            self._changed((name,))


def _rollback_entry(name: str, rb: RouteState, frm: RouteState) -> AuditEntry:
    return AuditEntry(
        route=name,
        actor=rb.updated_by,
        from_mode=frm.mode.value,
        to_mode="shadow",
        from_percent=frm.canary_percent,
        reason=rb.reason,
        at=rb.updated_at,
        automatic=True,
    )
