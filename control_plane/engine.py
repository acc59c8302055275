"""The engine: the control plane's parts for one replica, started and stopped together.

Each part has one job and is built in one place (:func:`control_plane.wiring.build_engine`):

=================  ==================================================================
``decider``        every decision (:mod:`control_plane.decision`)
``shadow``         the shadow pipeline: queued evaluations, compared later
``rollout``        modes, gates, the sync with the fleet, automatic rollback
``plans``          each route's rollout plan and the changes to it
``plan_driver``    the replica driving the plans (a lease): judges them, applies their steps
``adjustments``    runtime limit adjustments
``live_rules``     the rules in force and their hot reload
``activity``       what this replica saw lately (hot keys, rates, last decisions)
``views``          fleet-wide divergence figures, refreshed in the background
``external``       per-key limits from limits services
``comparisons``    where compared pairs are counted
``clock_skew``     this replica's clock against Redis'
=================  ==================================================================

The engine itself only runs their background work, says whether the replica is ready,
and describes the backend. API routers depend on the part they use, not on the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from limiter import LocalLimiter, Policy, RedisLimiter
from limiter.errors import BackendError
from limiter.resilience import BreakerState, CircuitBreaker, FleetMembership, ResilientLimiter

from .decision import Comparisons, DecideInput, Decider, DecideResult, PlainInput, UnknownRoute
from .decision.shadow import ShadowPipeline
from .external import ExternalManager
from .live_rules import LiveRules
from .model.recovery import StateMemory
from .observe.activity import Activity
from .observe.budgets import OutstandingScan
from .observe.clock import ClockSkew
from .observe.events import EventHub
from .observe.hitters import WouldBeBlocked
from .observe.logs import event_fields
from .observe.metrics import Metrics
from .observe.views import FleetViews
from .rollout.adjustments import Adjustments
from .rollout.candidates import Candidates
from .rollout.manager import GateRefused, RolloutManager
from .rollout.plan_driver import PlanDriver
from .rollout.plans import Plans
from .rules import Rules
from .settings import Settings
from .store import DivergenceStore, RolloutStore, StoreUnavailable
from .whatif.recorder import Recorder

__all__ = ["DecideInput", "DecideResult", "Engine", "GateRefused", "PlainInput", "UnknownRoute"]

log = logging.getLogger("shadowlimit.engine")


@dataclass(eq=False, kw_only=True)
class Engine:
    """One replica's control plane (see the module docstring)."""

    settings: Settings
    instance_id: str
    metrics: Metrics
    events: EventHub
    redis: RedisLimiter
    client: Any
    local: LocalLimiter
    breaker: CircuitBreaker
    fleet: FleetMembership
    resilient: ResilientLimiter
    store: RolloutStore
    divergence: DivergenceStore
    blocked: WouldBeBlocked
    memory: StateMemory
    live_rules: LiveRules
    adjustments: Adjustments
    rollout: RolloutManager
    candidates: Candidates
    plans: Plans
    plan_driver: PlanDriver
    activity: Activity
    views: FleetViews
    external: ExternalManager
    comparisons: Comparisons
    shadow: ShadowPipeline
    decider: Decider
    recorder: Recorder
    clock: Callable[[], float]  # wall-clock seconds: every part of the replica reads this one
    clock_skew: ClockSkew
    started_at: float
    running: bool = False  # started and not stopping: the replica can decide
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    _outstanding: OutstandingScan | None = None  # the budget gauges' scan of the local books

    # -- the rules in force and decisions (for embedders: the middleware, scripts) -------

    @property
    def rules(self) -> Rules:
        return self.live_rules.current

    async def decide(self, inp: DecideInput) -> DecideResult:
        return await self.decider.decide(inp)

    async def decide_many(self, inputs: list[DecideInput | PlainInput]) -> list[Any]:
        return await self.decider.decide_many(inputs)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self.redis.load_scripts()
            await self.rollout.sync()
        except (BackendError, StoreUnavailable) as exc:
            log.warning("Redis not reachable at startup (%s); starting with defaults", exc)
            self.breaker.record_failure(exc)
        await self.resilient.start()
        for name in self.rules.names():
            self.rollout.set_mode_metric(name)
        spawn = asyncio.get_running_loop().create_task
        self._tasks = [
            spawn(self.shadow.run(), name="shadow-worker"),
            spawn(self._flush_loop(), name="divergence-flush"),
            spawn(self.rollout.resync_loop(), name="rollout-resync"),
            spawn(self.rollout.subscribe_loop(), name="rollout-pubsub"),
            spawn(self.rollout.monitor_loop(), name="breaker-monitor"),
            spawn(self.views.run(), name="views-refresh"),
            spawn(self.plan_driver.run(), name="plan-driver"),
            spawn(self.plans.notifier.run(), name="notifications"),
            spawn(self.clock_skew.run(), name="clock-check"),
        ]
        if self.live_rules.watching:
            self._tasks.append(spawn(self.live_rules.run(), name="rules-watcher"))
        self.running = True

    async def stop(self) -> None:
        """Stop background work and flush what is buffered; bounded even when Redis is gone."""
        self.running = False
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=3.0)
        self._tasks.clear()
        final = [
            self.live_rules.settle(),
            self.external.aclose(),
            self.decider.settle(),
            self.shadow.drain(),
            self.divergence.flush(),
            self.blocked.flush(self.client),
            self.resilient.aclose(),
            self.plan_driver.prometheus.aclose(),
            self.plans.notifier.aclose(),
        ]
        for step in final:
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(step, timeout=2.0)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            await self.flush()

    async def flush(self) -> None:
        """Write this replica's counter deltas to Redis and sweep idle local keys (every
        second in the background; tests call it instead of waiting)."""
        self.metrics.shadow_queue.set(len(self.shadow))
        self.metrics.active_clients.labels("local").set(len(self.local))
        await self.recorder.flush()
        self.metrics.record_events.labels("recorded").value = self.recorder.recorded
        self.metrics.record_events.labels("dropped").value = self.recorder.dropped
        try:
            await self.divergence.flush()
            await self.blocked.flush(self.client)
        except (StoreUnavailable, BackendError, OSError) as exc:
            log.debug("divergence flush failed: %s", exc)
        if len(self.local) > 0:
            self.local.sweep()
        if self._outstanding is None:
            self._outstanding = OutstandingScan(self.local, self.metrics)
        self._outstanding.step(self.decider.now_us(), self._budget_policies)

    def _budget_policies(self) -> dict[str, Policy]:
        """Each budget route's local policy in force (for the budget gauges)."""
        rules = self.rules
        out = {}
        for name in rules.names():
            rule = rules.get(name)
            if rule is not None and rule.budget is not None:
                out[name] = self.adjustments.route_policies(rule)[0]
        return out

    def on_breaker(self, frm: BreakerState, to: BreakerState, reason: str | None) -> None:
        log.warning(
            "redis circuit breaker %s -> %s (%s)",
            frm.value,
            to.value,
            reason or "",
            extra=event_fields("breaker", **{"from": frm.value, "to": to.value, "reason": reason}),
        )
        self.metrics.set_breaker(to.value)
        self.metrics.breaker_transitions.labels(to.value).inc()
        self.events.publish(
            {"type": "breaker", "from": frm.value, "to": to.value, "reason": reason, "instance": self.instance_id}
        )

    # -- health --------------------------------------------------------------------------

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """(ready, report) for ``/readyz``. Ready while this replica can decide: started,
        not stopping, its background tasks alive; Redis being down is reported, and makes
        the replica unready only with ``SHADOWLIMIT_READY_REQUIRES_REDIS`` (the failure
        policies are there to serve exactly then)."""
        reasons = []
        if not self.running:
            reasons.append("the engine is not running (starting or stopping)")
        dead = sorted(t.get_name() for t in self._tasks if t.done())
        if dead:
            reasons.append("background tasks stopped: " + ", ".join(dead))
        redis = await self._redis_health()
        can_decide = not reasons
        if self.settings.ready_requires_redis and not (redis["reachable"] and redis["scripts"]):
            reasons.append("Redis is unreachable and SHADOWLIMIT_READY_REQUIRES_REDIS=true")
        report = {
            "status": "ready" if not reasons else "not_ready",
            "can_decide": can_decide,
            "reasons": reasons,
            "requires_redis": self.settings.ready_requires_redis,
            "redis": redis,
            "breaker": self.breaker.state.value,
            "failure_policy": self.resilient.failure_policy.value,
            "rules": {"source": self.rules.source, "error": self.live_rules.last_error},
            "instance_id": self.instance_id,
        }
        return not reasons, report

    async def _redis_health(self) -> dict[str, Any]:
        """Every node answers PING and has every script (missing ones are loaded)."""
        redis: dict[str, Any] = {"reachable": False, "scripts": False}
        try:
            await asyncio.wait_for(self.redis.ping(), timeout=max(0.5, self.settings.redis_command_timeout_s * 4))
            redis["reachable"] = True
            redis["scripts"] = await self.redis.scripts_loaded()
            if not redis["scripts"]:
                await self.redis.load_scripts()
                redis["scripts"] = await self.redis.scripts_loaded()
        except (TimeoutError, BackendError, OSError) as exc:
            redis["error"] = str(exc) or type(exc).__name__
        return redis

    def backend_snapshot(self) -> dict[str, Any]:
        """The breaker, the failure policy, the fleet and the shadow pipeline (``/v1/backend``)."""
        snap = self.breaker.snapshot().to_dict()
        snap.update(
            {
                "failure_policy": self.resilient.failure_policy.value,
                "failure_code": self.resilient.failure_code,
                "redis": self.redis.describe(),
                "redis_topology": self.redis.topology(),
                "time_source": self.redis.time_source,
                "clock": self.clock_skew.snapshot(),
                "live_instances": self.resilient.live_instances,
                "fleet": self.fleet.members,
                "instance_id": self.instance_id,
                "fallback_decisions": self.resilient.fallback_decisions,
                "backend_errors": self.resilient.backend_errors,
                "shadow_queue": len(self.shadow),
                "shadow_queue_capacity": self.shadow.capacity,
                "shadow_dropped": self.comparisons.dropped,
                "shadow_evaluated": self.comparisons.evaluated,
                "deadline_answers": {
                    reason: sum(c[reason] for c in self.metrics.deadline_counts().values())
                    for reason in ("redis_timeout", "no_time")
                },
                "over_limit_cache": None if self.decider.over_limit is None else self.decider.over_limit.stats(),
                "auto_rollback_after_s": self.settings.auto_rollback_after_s,
                "pending_rollbacks": sorted(self.rollout.pending_rollbacks),
                "distributed_enabled": self.settings.enable_distributed_rate_limiting,
            }
        )
        return snap
