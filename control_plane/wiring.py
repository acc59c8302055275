"""The one place that builds an engine: its parts from settings (:func:`build_engine`), and
the Redis connections it runs on (:func:`open_engine`, used by the app and the middleware)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from limiter import LocalLimiter, RedisConnection, RedisLimiter
from limiter.errors import BackendAuthError, BackendError
from limiter.resilience import BreakerState, CircuitBreaker, FleetMembership, ResilientLimiter

from .decision import Comparisons, Decider, wall_clock_us
from .decision.explain import Explainer
from .decision.overlimit import OverLimitCache
from .decision.shadow import ShadowPipeline
from .engine import Engine
from .external import ExternalManager
from .live_rules import LiveRules
from .model.recovery import StateMemory
from .observe.activity import Activity
from .observe.auditlog import AuditSink
from .observe.clock import ClockSkew
from .observe.events import EventHub
from .observe.hitters import WouldBeBlocked
from .observe.metrics import Metrics
from .observe.notify import Notifier
from .observe.prometheus import PrometheusClient
from .observe.views import FleetViews
from .rollout.adjustments import Adjustments
from .rollout.candidates import Candidates
from .rollout.manager import RolloutManager
from .rollout.plan_driver import PlanDriver
from .rollout.plans import Plans
from .rules import Rules
from .settings import Settings, SettingsError
from .store import DivergenceStore, PlanStore, RolloutStore
from .whatif.recorder import Recorder

__all__ = ["NO_REDIS_URL", "EngineHandle", "build_engine", "open_engine"]

#: why a control plane without a Redis URL does not start
NO_REDIS_URL = (
    "RATE_LIMIT_REDIS_URL is not set: every replica must share one Redis (e.g. redis://10.0.0.5:6379/0). "
    "For development only, --embedded-redis (SHADOWLIMIT_EMBEDDED_REDIS=true) starts a private redis-server "
    "for this process -- each process then has its own 'global' limit."
)

log = logging.getLogger("shadowlimit.wiring")


@dataclass
class EngineHandle:
    """A started engine and what must be closed with it."""

    engine: Engine
    redis: RedisLimiter
    client: Any
    url: str
    embedded: Any = None

    async def aclose(self) -> None:
        await self.engine.stop()
        await self.redis.aclose()
        with contextlib.suppress(Exception):
            await self.client.aclose()
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None


def check_redis(connection: RedisConnection, timeout_s: float = 2.0) -> str | None:
    """Startup checks: ``ValueError`` when the target's TLS files cannot be used,
    :class:`~limiter.errors.BackendAuthError` when Redis refuses the login (waiting will
    not help); any other failure to reach Redis now is returned as text (the service
    starts anyway: the failure policy answers until Redis is back). Building the client
    reads the TLS files (:func:`~limiter.connection.make_backend`)."""

    async def probe() -> None:
        quick = replace(connection, connect_timeout=timeout_s, command_timeout=timeout_s)
        rl = RedisLimiter.from_connection(quick)
        try:
            await asyncio.wait_for(rl.ping(), timeout_s * 2)
        finally:
            await rl.aclose()

    try:
        asyncio.run(probe())
    except BackendAuthError:
        raise
    except (BackendError, TimeoutError) as exc:
        return str(exc) or "timed out"
    return None


async def open_engine(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    clock_us: Callable[[], int] = wall_clock_us,
    clock: Callable[[], float] = time.time,
) -> EngineHandle:
    """Connect to Redis (RATE_LIMIT_REDIS_URL; a private embedded one only when the
    development setting SHADOWLIMIT_EMBEDDED_REDIS asks for it), build the engine with the
    clocks (:func:`build_engine`) and start its background work."""
    embedded = None
    url = settings.redis_url
    if url is None:
        if not settings.embedded_redis:
            raise SettingsError(NO_REDIS_URL)
        from limiter.embedded import EmbeddedRedis

        embedded = EmbeddedRedis().start()
        url = embedded.url
        log.warning(
            "development mode (--embedded-redis): started a private redis-server at %s; "
            "this process's 'global' limit is its own",
            url,
        )
    connection = settings.redis_connection(url)  # the one description both clients are built from
    redis = RedisLimiter.from_connection(
        connection,
        namespace=settings.namespace,
        time_source=settings.time_source,  # type: ignore[arg-type]
        state_format=2 if settings.state_format == "2" else 1,  # auto: the hash until the fleet is read
    )
    client = redis.client  # redis-py, from the same connection
    engine = build_engine(
        settings,
        redis=redis,
        client=client,
        metrics=metrics or Metrics(max_routes=settings.metrics_max_routes),
        clock_us=clock_us,
        clock=clock,
    )
    handle = EngineHandle(engine, redis, client, connection.redacted(), embedded)
    try:
        await engine.start()
    except BaseException:
        await handle.aclose()
        raise
    return handle


def _resilient(
    settings: Settings, redis: RedisLimiter, iid: str, clock: Callable[[], float], clock_us: Callable[[], int]
) -> tuple[CircuitBreaker, FleetMembership, Any]:
    """The Redis circuit breaker, the fleet's membership and the resilient limiter over them
    (``clock``: the wall clock their stamps and the fleet's heartbeats read; ``clock_us``:
    the decisions', which the in-memory fallback sweeps its keys by)."""
    # the engine logs the transitions (with their event fields)
    breaker = CircuitBreaker(
        failure_threshold=settings.breaker_failure_threshold, trial_half_opens=False, name=None, wall_clock=clock
    )
    fleet = FleetMembership(
        redis,
        instance_id=iid,
        interval_s=2.0,
        joins=settings.enable_distributed_rate_limiting,
        wall_clock=clock,
        state_format=settings.state_format,
    )
    resilient = ResilientLimiter(
        redis,
        failure_policy=settings.failure_policy,
        failure_code=settings.failure_code,
        fallback=LocalLimiter(max_keys=settings.local_max_keys, clock=clock_us),
        breaker=breaker,
        fleet=fleet,
    )
    return breaker, fleet, resilient


def _plans(
    settings: Settings, rollout: RolloutManager, *, rules: LiveRules, metrics: Metrics, iid: str,
    clock: Callable[[], float],
) -> tuple[Plans, PlanDriver]:  # fmt: skip
    """The rollout plans and their driver (its lease, Prometheus, the notifications)."""
    store = PlanStore(rollout.store)
    plans = Plans(
        store=store, rollout=rollout, divergence=rollout.divergence, rules=rules, memory=rollout.memory,
        metrics=metrics, notifier=Notifier(settings.notify_url, metrics), window_s=settings.gate_window_s, clock=clock,
    )  # fmt: skip
    prometheus = PrometheusClient(default_url=settings.prometheus_url, timeout_s=settings.prometheus_timeout_s)
    driver = PlanDriver(
        plans, store=store, prometheus=prometheus, instance_id=iid, interval_s=settings.plan_interval_s,
        lease_s=settings.plan_lease_s, clock=clock,
    )  # fmt: skip
    return plans, driver


def _shadow(
    settings: Settings,
    *,
    redis: RedisLimiter,
    resilient: Any,
    comparisons: Comparisons,
    local: LocalLimiter,
    views: FleetViews,
    metrics: Metrics,
    clock_us: Callable[[], int],
) -> tuple[ClockSkew, ShadowPipeline]:
    """This replica's clock against Redis' (its gauge), and the shadow pipeline with what
    explains its divergence: the local store's births, that clock, the fleet's size and views."""
    gauge = metrics.clock_skew.labels()
    skew = ClockSkew(
        redis.redis_time_us, clock_us=clock_us, tolerance_us=round(settings.clock_skew_tolerance_ms * 1000),
        on_measure=lambda offset_us: gauge.set(offset_us / 1e6),
    )  # fmt: skip
    explainer = Explainer(
        local=local, skew=skew, caller_clock=settings.time_source == "local",
        fleet_size=lambda: int(resilient.live_instances), fleet_before=views.decided_before,
    )  # fmt: skip
    shadow = ShadowPipeline(
        resilient, comparisons, queue_size=settings.shadow_queue_size, batch_size=settings.shadow_batch_size,
        linger_s=settings.shadow_linger_ms / 1000, explainer=explainer,
    )  # fmt: skip
    return skew, shadow


def build_engine(
    settings: Settings,
    *,
    redis: RedisLimiter,
    client: Any,
    metrics: Metrics | None = None,
    rules: Rules | None = None,
    instance_id: str | None = None,
    clock_us: Callable[[], int] = wall_clock_us,
    clock: Callable[[], float] = time.time,
) -> Engine:
    """Build every part of an engine (not started: :meth:`Engine.start`). ``redis`` runs
    the decisions, ``client`` (redis-py) the rest; ``clock_us`` is the decisions' clock
    (integer microseconds), ``clock`` everything else's (seconds): the counters' minutes,
    the rollout's timestamps, the activity's rates, the views' age."""
    iid = instance_id or settings.instance_id or uuid.uuid4().hex[:12]
    metrics = metrics or Metrics(max_routes=settings.metrics_max_routes)
    events = EventHub(history=settings.stream_history, clock=clock)
    breaker, fleet, resilient = _resilient(settings, redis, iid, clock, clock_us)
    memory = StateMemory()
    store = RolloutStore(client, settings.namespace, clock=clock)
    divergence = DivergenceStore(client, settings.namespace, clock=clock)
    blocked = WouldBeBlocked(settings.namespace, clock=clock)
    live = LiveRules(settings, store=store, metrics=metrics, events=events, instance_id=iid, rules=rules, clock=clock)
    adjustments = Adjustments(client, store, memory, live, clock=clock)
    sink = AuditSink(iid, settings.audit_log)
    rollout = RolloutManager(
        settings, rules=live, store=store, divergence=divergence, memory=memory, adjustments=adjustments,
        breaker=breaker, metrics=metrics, events=events, audit_sink=sink, instance_id=iid, clock=clock,
    )  # fmt: skip
    external = ExternalManager(
        namespace=settings.namespace, client=client, backend_hosts=settings.backend_hosts,
        cache_ok=lambda: breaker.state is not BreakerState.OPEN,
        cache_timeout_s=max(0.05, settings.redis_command_timeout_s * 2),
        metrics=metrics, publish=events.publish, instance_id=iid,
    )  # fmt: skip
    external.configure(live.current.all_routes)
    candidates = Candidates(client, store, adjustments, divergence, live, rollout, clock=clock)
    plans, plan_driver = _plans(settings, rollout, rules=live, metrics=metrics, iid=iid, clock=clock)
    live.listeners += [lambda r: external.configure(r.all_routes), rollout.rules_changed, candidates.rules_changed]
    comparisons = Comparisons(divergence, blocked, metrics)
    local = LocalLimiter(max_keys=settings.local_max_keys, clock=clock_us)  # its sweeps read the decisions' clock
    views = FleetViews(
        divergence,
        blocked,
        client,
        live,
        clock=clock,
        max_routes=settings.metrics_max_routes,
        candidate_of=lambda r: adjustments.candidates.get(r),
    )
    clock_skew, shadow = _shadow(
        settings, redis=redis, resilient=resilient, comparisons=comparisons, local=local, views=views,
        metrics=metrics, clock_us=clock_us,
    )  # fmt: skip
    activity = Activity(clock=clock)
    recorder = Recorder(
        client, settings.namespace, budget=settings.record_budget, minutes=settings.record_minutes,
        enabled=settings.record, clock=clock, ready=lambda: breaker.state is not BreakerState.OPEN,
    )  # fmt: skip
    decider = Decider(
        rules=live, modes=rollout, adjustments=adjustments, local=local, resilient=resilient, shadow=shadow,
        comparisons=comparisons, external=external, activity=activity, metrics=metrics, instance_id=iid,
        recorder=recorder, headers=settings.header_style(),
        clock_us=clock_us,
        over_limit=OverLimitCache(settings.over_limit_cache_keys) if settings.over_limit_cache_keys else None,
    )  # fmt: skip
    engine = Engine(
        settings=settings, instance_id=iid, metrics=metrics, events=events, redis=redis, client=client,
        local=local, breaker=breaker, fleet=fleet, resilient=resilient, store=store, divergence=divergence,
        blocked=blocked, memory=memory, live_rules=live, adjustments=adjustments, rollout=rollout,
        candidates=candidates, plans=plans, plan_driver=plan_driver, activity=activity, views=views, external=external,
        comparisons=comparisons, shadow=shadow, decider=decider, recorder=recorder, clock=clock, clock_skew=clock_skew,
        started_at=clock(),
    )  # fmt: skip
    breaker.on_transition = engine.on_breaker
    return engine
