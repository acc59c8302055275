"""The plan driver: one replica of the fleet judges the rollout plans and applies their steps.

Every replica runs :meth:`PlanDriver.run`. Each turn (every third of
``SHADOWLIMIT_PLAN_LEASE_S``, and at most every ``SHADOWLIMIT_PLAN_INTERVAL_S`` for the
work) it takes or renews the driver's lease in Redis (``rl:{ns}:plan-lease``, a fencing
number with each taking). The holder judges each plan -- the fleet's figures since the
step began, each Prometheus check -- and applies what :func:`next_action` says, each write
naming its lease and the record's version, so a driver that lost its lease or raced
another writes nothing; the others read the holder's analyses. A driver that dies stops
renewing: its lease expires and the next replica to try takes it over, within
``SHADOWLIMIT_PLAN_LEASE_S``. A replica stopping gives its lease up at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from limiter.errors import BackendError

from ..decision.types import UnknownRoute
from ..model.plan import Plan
from ..model.plan_analysis import Analysis, PromReading, analyse
from ..model.plan_progress import PlanRecord, PlanStatus, next_action, start_action
from ..model.rollout import RouteState
from ..observe.prometheus import PrometheusClient
from ..store import LeaseLost, PlanConflict, PlanStore, StoreError, StoreUnavailable, VersionConflict
from .plans import PLAN_ACTOR, Plans

__all__ = ["PlanDriver"]

log = logging.getLogger("shadowlimit.plans")


class PlanDriver:
    """Takes the lease, judges the plans, applies their steps (see the module docstring)."""

    def __init__(
        self,
        plans: Plans,
        *,
        store: PlanStore,
        prometheus: PrometheusClient,
        instance_id: str,
        interval_s: float,
        lease_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.plans = plans
        self.store = store
        self.prometheus = prometheus
        self.instance_id = instance_id
        self.interval_s = interval_s
        self.lease_s = lease_s
        self.clock = clock
        #: the lease this replica holds ("<instance>#<fence>"), None when it does not drive
        self.held: str | None = None
        self._last_work = float("-inf")

    @property
    def driving(self) -> bool:
        return self.held is not None

    async def run(self) -> None:
        """Turn after turn until cancelled; the lease is given up on the way out."""
        try:
            while True:
                await self.turn()
                await asyncio.sleep(min(self.interval_s, self.lease_s / 3))
        finally:
            if self.held is not None:
                held, self.held = self.held, None
                try:
                    await asyncio.wait_for(self.store.release(held), 1.0)
                except (StoreError, BackendError, OSError, TimeoutError) as exc:
                    log.debug("could not give the plan driver's lease up: %s", exc)

    async def turn(self) -> None:
        """Take or renew the lease; when the work is due, drive (holder) or read the analyses."""
        try:
            holder = await self.store.lease(self.instance_id, self.lease_s, self.held)
        except (StoreError, BackendError, OSError) as exc:
            log.debug("plan driver's lease unavailable: %s", exc)
            self.held = None
            return
        took = self.held is None and holder.startswith(self.instance_id + "#")
        self.held = holder if holder.startswith(self.instance_id + "#") else None
        self.plans.driver = holder
        if took:
            log.info("this replica drives the rollout plans now (lease %s)", holder)
        now = self.clock()
        if now - self._last_work < self.interval_s and not took:
            return
        self._last_work = now
        try:
            if self.held is not None:
                await self.drive_all()
            else:
                self.plans.analyses = await self.store.analyses()
        except (StoreError, BackendError, OSError) as exc:
            log.debug("plans not driven this turn: %s", exc)
        self.plans.refresh_metrics()

    async def drive_all(self) -> None:
        for route in self.plans.routes():
            if self.held is None:
                return
            try:
                await self.drive(route)
            except (PlanConflict, VersionConflict) as exc:
                log.info("plan of %s moved by someone else first; judged again next turn (%s)", route, exc)
            except LeaseLost as exc:
                log.warning("lost the plan driver's lease: %s", exc)
                self.held = None
            except UnknownRoute:
                continue

    async def drive(self, route: str) -> None:
        """One plan's turn: start it, or judge its step and apply what follows."""
        eff = self.plans.effective(route)
        if eff is None:
            return
        plan, source = eff
        prior = await self.store.get(route)
        remembered = self.plans.memory.plans.get(route)
        if remembered is not None and remembered.version > (prior.version if prior is not None else 0):
            return  # the store lost the record (Redis lost its data): the resync writes it back first
        if prior is not None:
            self.plans.memory.note_plan(route, prior)
        state = await self._route_state(route)
        record = self.plans.record(route)
        if record is None or prior is None or record.version != prior.version:
            if (
                prior is None
                or prior.plan_id != plan.id
                or prior.source != source
                or prior.status is PlanStatus.REMOVED
            ):
                await self._start(route, plan, source, prior, state)
            return  # a record newer than memory's: judged next turn
        if not record.status.driven:
            return
        analysis = await self.analyse(route, plan, record)
        action = next_action(plan, record, analysis, route=state, now=self.clock())
        if not action.changes:
            return
        judged = analysis.to_dict()
        reason = f"plan: {action.reason}"
        await self.plans.apply(
            route, plan, record, action, prior=prior, actor=PLAN_ACTOR, reason=reason, lease=self.held, judged=judged
        )

    async def _start(self, route: str, plan: Plan, source: str, prior: PlanRecord | None, state: RouteState) -> None:
        fresh = PlanRecord(
            plan_id=plan.id, source=source, status=PlanStatus.RUNNING, plan=plan if source == "api" else None
        )
        action = start_action(plan, state)
        reason = f"plan: started ({plan.describe()}, from the {'rules file' if source == 'rules' else 'API'})"
        await self.plans.apply(
            route, plan, fresh, action, prior=prior, actor=PLAN_ACTOR, reason=reason, lease=self.held
        )

    async def _route_state(self, route: str) -> RouteState:
        try:
            stored = await self.plans.rollout.store.get(route)
        except StoreUnavailable:
            raise
        memory = self.plans.rollout.state_for(route)
        return stored if stored is not None and stored.version >= memory.version else memory

    async def analyse(self, route: str, plan: Plan, record: PlanRecord) -> Analysis:
        """Judge the record's step now: the figures since it began, each Prometheus check;
        counted, kept and written for the other replicas."""
        now = self.clock()
        stats = await self.plans.step_stats(route, record, now)
        checks = plan.analysis.prometheus
        answers = await asyncio.gather(*(self.prometheus.query(c.query_for(route), url=c.url) for c in checks))
        readings: dict[str, PromReading] = {c.name: a for c, a in zip(checks, answers)}
        analysis = analyse(plan, stats, readings, step=record.step, now=self.clock())
        self.plans.metrics.plan_analysed(route, analysis.verdict.value)
        value = self.plans.note_analysis(route, analysis, self.held or self.instance_id)
        try:
            await self.store.put_analysis(route, value)
        except StoreError as exc:
            log.debug("analysis of %s not shared: %s", route, exc)
        return analysis
