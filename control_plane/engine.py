"""The engine: every decision, the shadow pipeline, rollout state, and the background work.

Decide first, enforce last (envoy's shadow mode): both limiters decide with the same
timestamp, then :func:`_enforce` picks which answer counts, as a separate step with
its own metric. In shadow mode the distributed evaluation runs off the hot path: the
request is queued (bounded; when full, shadow work is dropped and counted, never the
request delayed) and a worker evaluates queued requests in pipelined batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from limiter import Decision, LocalLimiter, Policy, RedisLimiter
from limiter.errors import BackendError
from limiter.keys import DEFAULT_MAX_KEY_LENGTH, validate_key
from limiter.policy import make_decision, validate_cost
from limiter.resilience import BreakerState, CircuitBreaker, FailurePolicy, FleetMembership, Outcome, ResilientLimiter

from .auditlog import AuditSink
from .events import EventHub
from .external import ExternalLimits, ExternalManager, Resolution
from .hitters import WouldBeBlocked
from .metrics import Metrics
from .recovery import RememberedAudit, StateMemory
from .rollout import (
    AuditEntry,
    Divergence,
    GateConfig,
    GateResult,
    Mode,
    RouteState,
    classify,
    enforced_by_distributed,
    evaluate_gate,
)
from .rules import RouteRule, Rules, RulesError, RulesWatcher, load_rules
from .settings import Settings
from .store import AUDIT_MAXLEN, DivergenceStore, RolloutStore, StoreError, StoreUnavailable, VersionConflict

__all__ = ["DecideInput", "DecideResult", "Engine", "GateRefused", "PlainInput", "UnknownRoute"]

log = logging.getLogger("shadowlimit.engine")


class UnknownRoute(LookupError):
    """No route by that name."""

    def __init__(self, route: str) -> None:
        super().__init__(route)
        self.route = route


class GateRefused(Exception):
    """A promotion did not pass its gate (and was not forced)."""

    def __init__(self, gate: GateResult) -> None:
        super().__init__("; ".join(gate.reasons))
        self.gate = gate


@dataclass(slots=True)
class DecideInput:
    route: str | None = None
    method: str | None = None
    path: str | None = None
    key: str | None = None
    client_ip: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    cost: int = 1
    request_id: str | None = None


#: A batch item as a tuple ``(route, key, cost, request_id)``: what
#: ``DecideInput(route=route, key=key, cost=cost, request_id=request_id)`` says, without
#: building the object (the batch endpoint's usual item; a tuple of plain values also
#: drops out of the garbage collector's tracking, a DecideInput does not).
PlainInput = tuple[str, str, int, "str | None"]


def _as_input(items: Sequence[Any], inputs: Sequence[Any], i: int) -> tuple[list[Any], DecideInput]:
    """Turn item ``i`` (a PlainInput) into a DecideInput, in a copy of the caller's list."""
    if items is inputs:
        items = list(inputs)
    route, key, cost, request_id = items[i]
    inp = items[i] = DecideInput(route=route, key=key, cost=cost, request_id=request_id)
    return items, inp  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class DecideResult:
    allowed: bool
    route: str
    mode: str
    canary_percent: int
    enforced_by: str  # local | distributed | failure_policy
    key: str
    local: Decision
    distributed: Decision | None
    divergence: Divergence | None
    status_code: int
    headers: dict[str, str]
    request_id: str
    list_match: str | None = None  # allow | deny
    backend_error: str | None = None
    limits_source: str | None = None  # external | cache | stale | static, on routes with external limits
    backend_url: str | None = None  # from the limits service, allow-listed hosts only

    def to_dict(self) -> dict[str, Any]:
        return {
            "allowed": self.allowed,
            "route": self.route,
            "mode": self.mode,
            "canary_percent": self.canary_percent,
            "enforced_by": self.enforced_by,
            "key": self.key,
            "request_id": self.request_id,
            "status_code": self.status_code,
            "local": self.local.to_dict(),
            "distributed": self.distributed.to_dict() if self.distributed is not None else None,
            "divergence": self.divergence.value if self.divergence is not None else None,
            "list_match": self.list_match,
            "backend_error": self.backend_error,
            "limits_source": self.limits_source,
            "backend_url": self.backend_url,
            "headers": self.headers,
        }


# One request waiting for its shadow evaluation, as a plain tuple (the cheapest thing
# to build on the request path): (lkey, dist_policy, cost, now_us, route, key,
# local_allowed, request_id). The first four are RedisLimiter's request.
_ShadowItem = tuple[str, Policy, int, int, str, str, bool, str]


class _ShadowQueue:
    """The bounded queue between the request path and the shadow worker.

    A request appends without ever waiting (a full queue refuses with
    ``asyncio.QueueFull``: the shadow work is dropped, never the request delayed);
    the one worker waits for work and takes it in batches. Leaner than
    ``asyncio.Queue``, which keeps getter/putter futures and task accounting that a
    single consumer does not need."""

    __slots__ = ("_queue", "_waiter", "maxsize")

    def __init__(self, maxsize: int) -> None:
        self._queue: deque[_ShadowItem] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.maxsize = maxsize

    def __len__(self) -> int:
        return len(self._queue)

    def put_nowait(self, item: _ShadowItem) -> None:
        q = self._queue
        if len(q) >= self.maxsize:
            raise asyncio.QueueFull
        q.append(item)
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def take(self, n: int) -> list[_ShadowItem]:
        """Up to ``n`` items, oldest first."""
        q = self._queue
        if len(q) <= n:
            batch = list(q)
            q.clear()
            return batch
        popleft = q.popleft
        return [popleft() for _ in range(n)]

    async def wait(self) -> None:
        """Until something is queued."""
        while not self._queue:
            w = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await w
            finally:
                if self._waiter is w:
                    self._waiter = None


@dataclass(slots=True)
class _Pending:
    """A decision waiting for the distributed answer (enforce, or the canary share)."""

    rule: RouteRule
    key: str
    mode: Mode
    percent: int
    lkey: str
    local: Decision
    dist_policy: Policy
    cost: int
    now_us: int
    now_s: float
    request_id: str
    failure_policy: FailurePolicy | None = None
    failure_code: int | None = None


@dataclass(slots=True)
class _RouteActivity:
    """Recent activity of one route: request counts per key (this minute and the last)
    and each key's last decision, all bounded."""

    counts: dict[str, int]
    previous: dict[str, int]
    last: dict[str, tuple[float, bool, str]]  # key -> (at, allowed, enforced_by)
    minute: int
    per_second: dict[int, int] = field(default_factory=dict)  # unix second -> decisions
    external: dict[str, tuple[Policy, Policy]] = field(default_factory=dict)  # key -> last external policies


_MAX_ACTIVE_KEYS = 2000


_WINDOWS: dict[int, tuple[Policy, int]] = {}  # id(policy) -> (policy, window)


def _window_s(policy: Policy) -> int:
    """The IETF header's window: how long the full quota takes to come back."""
    # looked up by identity (the policy kept in the entry guards against a reused id):
    # hashing a Policy dataclass on every request is not free
    e = _WINDOWS.get(id(policy))
    if e is not None and e[0] is policy:
        return e[1]
    if policy.unlimited:
        w = 0
    elif policy.algorithm.windowed:
        w = max(1, math.ceil(policy.period))
    else:
        w = max(1, math.ceil(policy.burst / (policy.average / policy.period)))
    if len(_WINDOWS) > 4096:
        _WINDOWS.clear()
    _WINDOWS[id(policy)] = (policy, w)
    return w


_SHADOW_POLICIES: dict[tuple[str, int], tuple[Policy, str]] = {}  # (route, id(policy)) -> (policy, text)


def _shadow_policy_text(route: str, policy: Policy) -> str:
    """The ``RateLimit-Policy`` item that announces the distributed limit to come."""
    k = (route, id(policy))
    e = _SHADOW_POLICIES.get(k)
    if e is not None and e[0] is policy:
        return e[1]
    text = f', "{route}-global";q={policy.limit};w={_window_s(policy)};sl-shadow'
    if len(_SHADOW_POLICIES) > 4096:
        _SHADOW_POLICIES.clear()
    _SHADOW_POLICIES[k] = (policy, text)
    return text


def rate_limit_headers(
    route: str, decision: Decision, policy: Policy, *, shadow_policy: Policy | None, now_s: float
) -> dict[str, str]:
    """Seed 002's X-RateLimit-* and Retry-After, and draft-ietf-httpapi-ratelimit-headers-11.

    In shadow (and the shadowed share of canary), ``RateLimit-Policy`` also describes
    the distributed limit that is coming, marked with the vendor parameter
    ``sl-shadow``, so clients can adapt before enforcement starts.
    """
    reset_s = math.ceil(decision.reset_after_us / 1_000_000)
    h = {
        "X-RateLimit-Limit": str(decision.limit),
        "X-RateLimit-Remaining": str(max(0, decision.remaining)),
        "X-RateLimit-Reset": str(int(now_s) + reset_s),
        "RateLimit-Policy": f'"{route}";q={decision.limit};w={_window_s(policy)}',
        "RateLimit": f'"{route}";r={max(0, decision.remaining)};t={reset_s}',
    }
    if shadow_policy is not None:
        h["RateLimit-Policy"] += _shadow_policy_text(route, shadow_policy)
    if not decision.allowed:
        h["Retry-After"] = str(max(1, math.ceil(decision.retry_after_us / 1_000_000)))
    return h


def _with_source(result: DecideResult, res: Resolution) -> DecideResult:
    """A decision on a route with external limits says where its limits came from."""
    return replace(
        result, limits_source=res.source, backend_url=res.limits.backend_url if res.limits is not None else None
    )


_AGREE = Divergence.AGREE
_LADD = Divergence.LOCAL_ALLOW_DISTRIBUTED_DENY
_LDDA = Divergence.LOCAL_DENY_DISTRIBUTED_ALLOW


class _Plan:
    """What is the same for every fast-path item of one route in one batch (see
    :meth:`Engine.decide_many`), and the metric increments waiting to be applied.

    Counters: ``req_*`` = rate_limit_requests_total{local}, ``fin_*`` = decisions
    enforced by the local answer, ``dreq_*`` = distributed answers (requests{distributed}
    and decisions enforced by them), ``div`` = divergence per class, ``dropped`` = shadow
    evaluations dropped (queue full), ``remaining`` = the last value for
    rate_limit_tokens_remaining{route}. A metric child is created when its
    first increment happens (as the per-item path would), the increments are added when
    the plan is flushed.
    """

    __slots__ = (
        "rule", "name", "prefix", "mode", "mode_value", "percent", "lp", "dp", "fast", "cost_max", "failure",
        "req_ok", "req_rej", "fin_ok", "fin_rej", "dreq_ok", "dreq_rej", "div", "remaining", "dropped",
        "l_limit", "l_limit_s", "l_policy_h", "d_limit", "d_limit_s", "d_policy_h",
    )  # fmt: skip

    def __init__(self, rule: RouteRule, mode: Mode, percent: int, lp: Policy, dp: Policy, fast: bool) -> None:
        self.rule = rule
        self.name = rule.name
        self.prefix = f"{rule.name}:"
        self.mode = mode
        self.mode_value = mode.value
        self.percent = percent
        self.lp = lp
        self.dp = dp
        self.fast = fast
        # validate_cost(lp, cost) and the distributed limit check of _begin pass for 1 <= cost <= cost_max
        self.cost_max = min(math.inf if lp.unlimited else lp.limit, math.inf if dp.unlimited else dp.limit)
        self.failure = (rule.failure_policy, rule.failure_code)
        self.req_ok = self.req_rej = self.fin_ok = self.fin_rej = self.dreq_ok = self.dreq_rej = self.dropped = 0
        self.div: dict[Divergence, int] = {}
        self.remaining: int | None = None
        self.l_limit: int | None = None
        self.d_limit: int | None = None

    def local_headers(self, limit: int) -> None:
        """The parts of rate_limit_headers that depend on the limit and the policies only,
        for decisions enforced by the local answer (shadowing the distributed policy
        unless the mode is off)."""
        name = self.name
        h = f'"{name}";q={limit};w={_window_s(self.lp)}'
        if self.mode is not Mode.OFF:
            h += _shadow_policy_text(name, self.dp)
        self.l_limit, self.l_limit_s, self.l_policy_h = limit, str(limit), h

    def dist_headers(self, limit: int) -> None:
        """The same for decisions enforced by the distributed answer."""
        self.d_limit, self.d_limit_s, self.d_policy_h = (
            limit,
            str(limit),
            f'"{self.name}";q={limit};w={_window_s(self.dp)}',
        )

    def result(
        self,
        decision: Decision,
        local: Decision,
        dist: Decision | None,
        div: Divergence | None,
        key: str,
        request_id: str,
        now_s: float,
        as_dicts: bool,
    ) -> Any:
        """One fast-path answer, enforced by ``decision`` (the local one when ``dist`` is
        None): rate_limit_headers() from the plan's cached parts, then the DecideResult,
        or its ``to_dict()`` form when ``as_dicts``."""
        name = self.name
        allowed = decision.allowed
        limit = decision.limit
        if dist is None:
            if limit != self.l_limit:
                self.local_headers(limit)
            limit_s, policy_h = self.l_limit_s, self.l_policy_h
        else:
            if limit != self.d_limit:
                self.dist_headers(limit)
            limit_s, policy_h = self.d_limit_s, self.d_policy_h
        remaining = decision.remaining
        rem = str(remaining) if remaining > 0 else "0"
        reset_s = math.ceil(decision.reset_after_us / 1_000_000)
        headers = {
            "X-RateLimit-Limit": limit_s,
            "X-RateLimit-Remaining": rem,
            "X-RateLimit-Reset": str(int(now_s) + reset_s),
            "RateLimit-Policy": policy_h,
            "RateLimit": f'"{name}";r={rem};t={reset_s}',
        }
        if not allowed:
            headers["Retry-After"] = str(max(1, math.ceil(decision.retry_after_us / 1_000_000)))
        enforced_by = "local" if dist is None else "distributed"
        status = 200 if allowed else 429
        if not as_dicts:
            return DecideResult(
                allowed=allowed,
                route=name,
                mode=self.mode_value,
                canary_percent=self.percent,
                enforced_by=enforced_by,
                key=key,
                local=local,
                distributed=dist,
                divergence=div,
                status_code=status,
                headers=headers,
                request_id=request_id,
            )
        return {
            "allowed": allowed,
            "route": name,
            "mode": self.mode_value,
            "canary_percent": self.percent,
            "enforced_by": enforced_by,
            "key": key,
            "request_id": request_id,
            "status_code": status,
            "local": local.to_dict(),
            "distributed": None if dist is None else dist.to_dict(),
            "divergence": None if div is None else div.value,
            "list_match": None,
            "backend_error": None,
            "limits_source": None,
            "backend_url": None,
            "headers": headers,
        }

    def count_divergence(self, m: Metrics, div: Divergence) -> None:
        n = self.div.get(div)
        if n is None:
            m.child(m.divergence, self.name, div.value)
            n = 0
        self.div[div] = n + 1

    def flush(self, m: Metrics) -> None:
        name, mode = self.name, self.mode_value
        if self.req_ok:
            m.child(m.requests, "local", "allowed").inc(self.req_ok)
            self.req_ok = 0
        if self.req_rej:
            m.child(m.requests, "local", "denied").inc(self.req_rej)
            self.req_rej = 0
        if self.fin_ok:
            m.child(m.decisions, name, mode, "local", "true").inc(self.fin_ok)
            self.fin_ok = 0
        if self.fin_rej:
            n = self.fin_rej
            m.child(m.rejections, "local_exhausted").inc(n)
            m.child(m.exceeded, "local").inc(n)
            m.child(m.decisions, name, mode, "local", "false").inc(n)
            self.fin_rej = 0
        if self.div:
            for div, n in self.div.items():
                m.child(m.divergence, name, div.value).inc(n)
            self.div.clear()
        if self.dreq_ok:
            n = self.dreq_ok
            m.child(m.requests, "distributed", "allowed").inc(n)
            m.child(m.decisions, name, mode, "distributed", "true").inc(n)
            self.dreq_ok = 0
        if self.dreq_rej:
            n = self.dreq_rej
            m.child(m.requests, "distributed", "denied").inc(n)
            m.child(m.rejections, "distributed_exhausted").inc(n)
            m.child(m.exceeded, "distributed").inc(n)
            m.child(m.decisions, name, mode, "distributed", "false").inc(n)
            self.dreq_rej = 0
        if self.remaining is not None:
            m.child(m.tokens_remaining, "route", name).set(self.remaining)
            self.remaining = None


class Engine:
    """Runs the limiters for every decision and keeps rollout state in sync."""

    def __init__(
        self,
        settings: Settings,
        *,
        redis: RedisLimiter,
        client: Any,
        metrics: Metrics | None = None,
        rules: Rules | None = None,
        instance_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.instance_id = instance_id or settings.instance_id or uuid.uuid4().hex[:12]
        self.metrics = metrics or Metrics()
        self.events = EventHub(history=settings.stream_history)
        self.redis = redis
        self.client = client
        self.local = LocalLimiter(max_keys=settings.local_max_keys)
        self.fleet = FleetMembership(redis, instance_id=self.instance_id, interval_s=2.0)
        self.breaker = CircuitBreaker(
            failure_threshold=settings.breaker_failure_threshold, on_transition=self._on_breaker
        )
        self.resilient = ResilientLimiter(
            redis,
            failure_policy=settings.failure_policy,
            failure_code=settings.failure_code,
            fallback=LocalLimiter(max_keys=settings.local_max_keys),
            breaker=self.breaker,
            fleet=self.fleet,
        )
        # what this replica remembers of the rollout state, the audit and the adjustments:
        # written back when the store loses its data (see control_plane.recovery)
        self.memory = StateMemory()
        self.audit_sink = AuditSink(self.instance_id, settings.audit_log)
        self.store = RolloutStore(client, settings.namespace, on_audit=self._on_audit_written)
        self.restorations = 0
        self.divergence = DivergenceStore(client, settings.namespace)
        self.blocked = WouldBeBlocked(settings.namespace)
        self.gate_config = GateConfig(
            window_s=settings.gate_window_s,
            min_samples=settings.gate_min_samples,
            max_new_rejection_rate=settings.gate_max_new_rejection_rate,
            max_backend_error_rate=settings.gate_max_backend_error_rate,
            min_sampled_share=settings.gate_min_sampled_share,
        )
        self.rules = rules or load_rules(settings.rules_path, settings)
        self.watcher: RulesWatcher | None = None
        if settings.rules_path is not None:
            # the rules were just loaded: the watcher starts from them instead of reading the file again
            self.watcher = RulesWatcher(
                settings.rules_path,
                settings,
                on_change=self._on_rules,
                on_error=self._on_rules_error,
                initial=self.rules,
                on_recover=self._on_rules_recovered,
            )
        self._states: dict[str, RouteState] = self.memory.states  # the newest state seen per route
        self._adjust: dict[str, dict[str, Policy]] = {}
        self._pending_rollbacks: dict[str, tuple[RouteState, RouteState]] = {}  # route -> (rollback, from)
        self._queue = _ShadowQueue(settings.shadow_queue_size)
        self._activity: dict[str, _RouteActivity] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._audit_tasks: set[asyncio.Task[Any]] = set()
        self.started_at = time.time()
        self._seq = 0
        self.shadow_evaluated = 0
        self.shadow_dropped = 0
        self.running = False  # started and not stopping: the replica can decide
        self.last_rules_error: str | None = None
        # fleet-wide divergence views, refreshed in the background so that the API and
        # the event stream never wait on Redis
        self._views: dict[str, dict[str, Any]] = {}
        self.views_at: float = 0.0
        self.views_error: str | None = None
        # routes with an `external` block: per-key limits from a limits service
        self.external = ExternalManager(
            namespace=settings.namespace,
            client=client,
            backend_hosts=settings.backend_hosts,
            cache_ok=lambda: self.breaker.state is not BreakerState.OPEN,
            cache_timeout_s=max(0.05, settings.redis_command_timeout_s * 2),
            metrics=self.metrics,
            publish=self.events.publish,
            instance_id=self.instance_id,
        )
        self.external.configure(self.rules.all_routes)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self.redis.load_scripts()
            await self.sync_rollout()
        except (BackendError, StoreUnavailable) as exc:
            log.warning("Redis not reachable at startup (%s); starting with defaults", exc)
            self.breaker.record_failure(exc)
        await self.resilient.start()
        for name in self.rules.names():
            self._set_mode_metric(name)
        spawn = asyncio.get_running_loop().create_task
        self._tasks = [
            spawn(self._shadow_worker(), name="shadow-worker"),
            spawn(self._flush_loop(), name="divergence-flush"),
            spawn(self._resync_loop(), name="rollout-resync"),
            spawn(self._subscribe_loop(), name="rollout-pubsub"),
            spawn(self._monitor_loop(), name="breaker-monitor"),
            spawn(self._views_loop(), name="views-refresh"),
        ]
        if self.watcher is not None:
            self._tasks.append(spawn(self.watcher.run(self.settings.rules_poll_interval_s), name="rules-watcher"))
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
            self.settle_audit(),
            self.external.aclose(),
            self._drain_shadow(),
            self.divergence.flush(),
            self.blocked.flush(self.client),
            self.resilient.aclose(),
        ]
        for step in final:
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(step, timeout=2.0)

    # -- rollout state ------------------------------------------------------------------

    def default_state(self, route: RouteRule | None) -> RouteState:
        if route is not None and route.initial_mode is not None:
            return RouteState(mode=route.initial_mode, canary_percent=route.initial_canary_percent, updated_by="rules")
        return RouteState(mode=Mode(self.settings.default_mode), updated_by="default")

    def state_for(self, name: str) -> RouteState:
        pending = self._pending_rollbacks.get(name)
        if pending is not None:
            return pending[0]
        st = self._states.get(name)
        if st is None:
            st = self.default_state(self.rules.get(name))
        return st

    def effective_mode(self, name: str) -> tuple[Mode, int]:
        if not self.settings.enable_distributed_rate_limiting:
            return Mode.OFF, 0
        st = self.state_for(name)
        return st.mode, st.canary_percent

    # -- runtime adjustments (seed 002's adjust) ----------------------------------------

    @property
    def _adjust_key(self) -> str:
        return self.store.adjust_key

    def policies(self, rule: RouteRule, key: str, base: tuple[Policy, Policy] | None = None) -> tuple[Policy, Policy]:
        """The (local, distributed) policies for a key: rules (or ``base``, the limits
        service's answer), then runtime adjustments."""
        local, dist = base if base is not None else rule.policies_for(key)
        if self._adjust:
            for k in (f"{rule.name}\x00{key}", rule.name):
                adj = self._adjust.get(k)
                if adj is not None:
                    return adj.get("local", local), adj.get("distributed", dist)
        return local, dist

    async def adjust(
        self, route: str, key: str | None, target: str, policy: Policy | None, *, reason: str, actor: str
    ) -> AuditEntry:
        """Set (or clear, with ``policy=None``) a runtime limit for a route or one key, fleet-wide."""
        if self.rules.get(route) is None:
            raise UnknownRoute(route)
        field_name = route if key is None else f"{route}\x00{key}"
        try:
            if policy is None:
                await self.client.hdel(self._adjust_key, field_name)
            else:
                cur = json.loads(await self.client.hget(self._adjust_key, field_name) or "{}")
                for t in ("local", "distributed") if target == "both" else (target,):
                    cur[t] = policy.to_dict()
                await self.client.hset(self._adjust_key, field_name, json.dumps(cur))
            entry = AuditEntry(
                route=route,
                actor=actor,
                from_mode="",
                to_mode="cleared" if policy is None else policy.describe(),
                reason=reason + (f" (key {key}, {target})" if key else f" ({target})"),
                kind="config_change",
            )
            entry = await self.store.append_audit(entry)
            await self._load_adjustments()
        except (OSError, BackendError, StoreUnavailable, ConnectionError) as exc:
            raise StoreUnavailable(str(exc)) from exc
        except Exception as exc:  # redis-py errors
            if type(exc).__module__.startswith("redis"):
                raise StoreUnavailable(str(exc)) from exc
            raise
        return entry

    async def _load_adjustments(self) -> None:
        raw = await self.client.hgetall(self._adjust_key)
        self.memory.adjustments = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in (raw or {}).items()
        }
        self._apply_adjustments()

    def _apply_adjustments(self) -> None:
        """Parse the remembered adjustments (the hash's raw fields) into policies."""
        adjust: dict[str, dict[str, Policy]] = {}
        for k, v in self.memory.adjustments.items():
            try:
                d = json.loads(v)
                adjust[k] = {t: Policy(**p) for t, p in d.items() if t in ("local", "distributed")}
            except (ValueError, TypeError, AttributeError) as exc:
                log.warning("ignoring bad adjustment %r: %s", k, exc)
        self._adjust = adjust

    def adjustments(self) -> list[dict[str, Any]]:
        out = []
        for k, v in self._adjust.items():
            route, _, key = k.partition("\x00")
            out.append({"route": route, "key": key or None, **{t: p.to_dict() for t, p in v.items()}})
        return out

    def _set_mode_metric(self, name: str) -> None:
        self.metrics.set_mode(name, self.effective_mode(name)[0].value)

    async def sync_rollout(self) -> None:
        """Read the store and take in what is new; when the store has lost what this
        replica remembers (restarted empty, flushed, failed over to an older copy), write
        it back first (:meth:`RolloutStore.restore`, audited), so no mode ever goes back."""
        mem = self.memory
        view = await self.store.read_view(mem.head)
        loss = mem.check(view, audit_maxlen=AUDIT_MAXLEN)
        if loss.lost:
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
        self._apply_adjustments()
        for n in changed:
            self._set_mode_metric(n)

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.rollout_resync_s)
            try:
                await self.sync_rollout()
                await self.persist_rollbacks()
            except StoreUnavailable as exc:
                log.debug("rollout resync failed: %s", exc)
            except (StoreError, BackendError) as exc:
                log.warning("rollout resync failed: %s", exc)

    async def _subscribe_loop(self) -> None:
        while True:
            try:
                async for event in self.store.subscribe():
                    self._note_event(event)
                    self.events.publish(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reconnect on any pub/sub failure
                log.debug("pub/sub listener failed: %s", exc)
            await asyncio.sleep(1.0)

    def _note_event(self, event: dict[str, Any]) -> None:
        """Remember what an event from another replica (or our own) tells: a route's new
        state (never an older one) and the audit entry it carries."""
        route = event.get("route")
        if event.get("type") == "mode_change" and isinstance(event.get("state"), dict) and isinstance(route, str):
            try:
                state = RouteState.from_dict(event["state"])
            except (ValueError, TypeError):
                log.warning("ignoring a mode_change event with an unreadable state: %r", event)
            else:
                if self.memory.note_state(route, state):
                    self._set_mode_metric(route)
        audit = event.get("audit")
        if isinstance(audit, dict) and isinstance(audit.get("id"), str):
            body = {k: v for k, v in audit.items() if k != "id"}
            kind = str(audit.get("kind", event.get("type", "")))
            self.memory.note_audit(
                RememberedAudit(
                    audit["id"],
                    kind,
                    str(audit.get("route", route or "")),
                    json.dumps(body, separators=(",", ":"), ensure_ascii=False),
                )
            )

    def _on_audit_written(self, entry: AuditEntry, raw: RememberedAudit) -> None:
        """Every audit entry this replica stored: remembered, and logged once (the log
        line and SHADOWLIMIT_AUDIT_LOG)."""
        self.memory.note_audit(raw)
        self.audit_sink.emit(entry)

    async def gate_for(self, route: str, target: Mode, percent: int) -> GateResult:
        stats = await self.divergence.window_stats(route, self.gate_config.window_s)
        return evaluate_gate(self.state_for(route), target, percent, stats, self.gate_config)

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
    ) -> tuple[RouteState, AuditEntry, GateResult]:
        """Change a route's mode fleet-wide (atomic in Redis; audited)."""
        if self.rules.get(route) is None:
            raise UnknownRoute(route)
        if mode is not Mode.CANARY:
            canary_percent = 0
        try:
            remembered = self._states.get(route)
            stored = await self.store.get(route)
            if (
                remembered is not None
                and remembered.version > 0
                and (stored is None or stored.version < remembered.version)
            ):
                await self.sync_rollout()  # the store lost this route's state: write it back first
                stored = await self.store.get(route)
            current = stored or remembered or self.default_state(self.rules.get(route))
            gate = await self.gate_for(route, mode, canary_percent)
        except BackendError as exc:
            raise StoreUnavailable(str(exc)) from exc
        if gate.required and not gate.passed and not force:
            raise GateRefused(gate)
        new = RouteState(
            mode=mode,
            canary_percent=canary_percent,
            updated_at=time.time(),
            updated_by=actor,
            reason=reason,
            version=current.version + 1,
        )
        entry = AuditEntry(
            route=route,
            actor=actor,
            from_mode=current.mode.value,
            to_mode=mode.value,
            from_percent=current.canary_percent,
            to_percent=canary_percent,
            reason=reason,
            forced=force and gate.required and not gate.passed,
            automatic=automatic,
            gate=gate.to_dict(),
        )
        entry = await self.store.change(route, new, entry, expected_version=current.version)
        self.memory.note_state(route, new)
        self._pending_rollbacks.pop(route, None)
        self._set_mode_metric(route)
        self.metrics.mode_changes.labels(route, mode.value, str(automatic).lower()).inc()
        return new, entry, gate

    # -- decisions ------------------------------------------------------------------------

    def resolve(self, inp: DecideInput) -> tuple[RouteRule, str]:
        """Route and key for a request (raises UnknownRoute / InvalidKeyError / ValueError)."""
        if inp.route is not None:
            rule = self.rules.get(inp.route)
            if rule is None:
                raise UnknownRoute(inp.route)
        else:
            rule = self.rules.match((inp.method or "GET").upper(), inp.path or "/")
        if inp.key is not None:
            key = validate_key(inp.key, field="key")
        else:
            key = rule.key.extract(client_ip=inp.client_ip, headers=inp.headers, path=inp.path or "/")
        return rule, key

    @staticmethod
    def _listed(rule: RouteRule, key: str, client_ip: str | None) -> bool:
        return rule.deny.matches(key, client_ip) or rule.allow.matches(key, client_ip)

    async def decide(self, inp: DecideInput) -> DecideResult:
        t0 = time.perf_counter()
        rule, key = self.resolve(inp)
        res: Resolution | None = None
        if rule.external is not None and not self._listed(rule, key, inp.client_ip):
            res = await self.external.resolve(rule, key, inp.method, inp.path, inp.headers)
        step = self._begin(
            rule,
            key,
            inp.cost,
            inp.request_id or self._next_id(),
            inp.client_ip,
            res.limits if res is not None else None,
        )
        if isinstance(step, _Pending):
            outcome = await self.resilient.check(
                step.lkey,
                step.dist_policy,
                step.cost,
                step.now_us,
                failure_policy=step.failure_policy,
                failure_code=step.failure_code,
            )
            step = self._complete(step, outcome)
        if res is not None:
            step = _with_source(step, res)
        self.metrics.child(self.metrics.latency, step.mode).observe(time.perf_counter() - t0)
        return step

    async def decide_many(self, inputs: Sequence[DecideInput | PlainInput], *, as_dicts: bool = False) -> list[Any]:
        """Decide many requests; all distributed enforcement goes to Redis as one pipelined
        burst (external limits, if any, are looked up concurrently first). Invalid items
        come back as their exception, in place, and so does an item whose decision failed
        unexpectedly (any other ``Exception``; the caller reports it): one item never
        fails the batch.

        An item is a :class:`DecideInput` or, for the common case of a named route and a
        key, a :data:`PlainInput` tuple ``(route, key, cost, request_id)`` (the same as
        ``DecideInput(route=route, key=key, cost=cost, request_id=request_id)``).

        With ``as_dicts=True`` each decision comes back as ``DecideResult.to_dict()``
        would give it (same keys, same order), built without the intermediate object:
        that is what the batch endpoint serialises.

        Items on a plain route (no allow/deny lists, overrides, per-key adjustments or
        external limits) with a plain key and cost take a fast path: what is the same for
        every item of a route (mode, policies, metric children, header templates) is
        looked up once per batch and metric increments are added up and applied once per
        synchronous step (before every await, so nothing can observe the difference). It
        gives exactly the answers, side effects and ordering of :meth:`_begin`,
        :meth:`_complete` and :meth:`_finish`, which every other item still goes through.
        """
        t0 = time.perf_counter()
        items = inputs  # becomes a copy when a tuple has to be turned into a DecideInput
        n = len(inputs)
        out: list[Any] = [None] * n
        rules_l: list[RouteRule | None] = [None] * n
        keys_l: list[Any] = [None] * n  # the key, or the item's exception
        lookups: list[int] = []
        rules_get = self.rules.get
        for i, inp in enumerate(inputs):
            if inp.__class__ is tuple:
                route, key = inp[0], inp[1]
            else:
                route = inp.route
                key = inp.key
            if (
                route is not None
                and key.__class__ is str
                and 0 < len(key) <= DEFAULT_MAX_KEY_LENGTH
                and key.isascii()
                and key.isprintable()
                and key[0] != " "
                and key[-1] != " "
            ):
                # what resolve() does, for a named route and a plain printable ASCII key
                # (validate_key returns such a key unchanged)
                rule = rules_get(route)
                if rule is None:
                    keys_l[i] = UnknownRoute(route)
                    continue
            else:
                if inp.__class__ is tuple:
                    items, inp = _as_input(items, inputs, i)
                try:
                    rule, key = self.resolve(inp)
                except Exception as exc:  # noqa: BLE001 - UnknownRoute, ValueError, or unexpected: in place
                    keys_l[i] = exc
                    continue
            rules_l[i] = rule
            keys_l[i] = key
            if rule.external is not None:
                if inp.__class__ is tuple:
                    items, inp = _as_input(items, inputs, i)
                if not self._listed(rule, key, inp.client_ip):
                    lookups.append(i)
        ext: dict[int, Resolution] = {}
        if lookups:
            got = await asyncio.gather(
                *[
                    self.external.resolve(rules_l[i], keys_l[i], items[i].method, items[i].path, items[i].headers)
                    for i in lookups
                ],
                return_exceptions=True,
            )  # type: ignore[arg-type, union-attr]
            for i, res in zip(lookups, got):
                if isinstance(res, BaseException):
                    if not isinstance(res, Exception):
                        raise res
                    rules_l[i], keys_l[i] = None, res  # in place, like an invalid item
                else:
                    ext[i] = res

        # -- local decisions, in order (no await from here to the distributed call) ----
        m = self.metrics
        plans: dict[str, _Plan] = {}
        pend: list[tuple[Any, ...]] = []  # (i, _Pending) or (i, plan, key, local, request_id, now_s)
        reqs: list[tuple[str, Policy, int, int]] = []
        ovs: list[tuple[FailurePolicy | None, int | None]] = []
        check = self.local.check
        activity = self._activity
        queue = self._queue
        queue_put = queue.put_nowait
        free: int | None = None  # room left in the shadow queue, None: not known
        time_ns = time.time_ns
        instance_id = self.instance_id
        dirty = False
        try:
            for i in range(n):
                try:
                    rule = rules_l[i]
                    if rule is None:
                        out[i] = keys_l[i]
                        continue
                    key = keys_l[i]
                    inp = items[i]
                    name = rule.name
                    p = plans.get(name)
                    if p is None or p.rule is not rule:
                        p = plans[name] = self._plan(rule)
                    plain = inp.__class__ is tuple
                    cost = inp[2] if plain else inp.cost  # type: ignore[index, union-attr]
                    if not p.fast or cost.__class__ is not int or cost < 1 or cost > p.cost_max or (ext and i in ext):
                        # everything else: the general path, after what the fast path has buffered
                        if dirty:
                            self._flush_plans(plans)
                            dirty = False
                        free = None
                        if plain:
                            items, inp = _as_input(items, inputs, i)
                        res = ext.get(i)
                        try:
                            step = self._begin(
                                rule,
                                key,
                                cost,
                                inp.request_id or self._next_id(),
                                inp.client_ip,
                                res.limits if res is not None else None,
                            )
                        except (UnknownRoute, ValueError) as exc:
                            out[i] = exc
                            continue
                        if isinstance(step, _Pending):
                            pend.append((i, step))
                            reqs.append((step.lkey, step.dist_policy, step.cost, step.now_us))
                            ovs.append((step.failure_policy, step.failure_code))
                        out[i] = step
                        continue

                    # -- the fast path: _begin for a plain route ------------------------------
                    dirty = True
                    request_id = inp[3] if plain else inp.request_id  # type: ignore[index, union-attr]
                    if not request_id:  # _next_id()
                        self._seq = seq = self._seq + 1
                        request_id = f"{instance_id}-{seq}"
                    now_us = time_ns() // 1000
                    now_s = now_us / 1_000_000
                    lkey = p.prefix + key
                    local = check(lkey, p.lp, cost, now_us)
                    self._note_activity(name, key, now_s)
                    act = activity[name]
                    allowed = local.allowed
                    if allowed:
                        if not p.req_ok:
                            m.child(m.requests, "local", "allowed")
                        p.req_ok += 1
                    else:
                        if not p.req_rej:
                            m.child(m.requests, "local", "denied")
                        p.req_rej += 1
                    mode = p.mode
                    if mode is not Mode.OFF:
                        if mode is Mode.ENFORCE or (
                            mode is Mode.CANARY and enforced_by_distributed(mode, p.percent, name, key)
                        ):
                            pend.append((i, p, key, local, request_id, now_s))
                            reqs.append((lkey, p.dp, cost, now_us))
                            ovs.append(p.failure)
                            continue
                        # _enqueue_shadow: nothing takes from the queue before the next await, so
                        # its free room is counted down instead of asking the queue each time
                        if free is None:
                            free = queue.maxsize - len(queue)
                        if free:
                            queue_put((lkey, p.dp, cost, now_us, name, key, allowed, request_id))
                            free -= 1
                        else:
                            if not p.dropped:
                                m.child(m.shadow_dropped, name)
                            p.dropped += 1
                    # -- _finish, enforced by the local decision ------------------------------
                    if allowed:
                        if not p.fin_ok:
                            m.child(m.decisions, name, p.mode_value, "local", "true")
                        p.fin_ok += 1
                    else:
                        if not p.fin_rej:
                            m.child(m.rejections, "local_exhausted")
                            m.child(m.exceeded, "local")
                            m.child(m.decisions, name, p.mode_value, "local", "false")
                        p.fin_rej += 1
                    if p.remaining is None:
                        m.child(m.tokens_remaining, "route", name)
                    p.remaining = local.remaining
                    act.last[key] = (now_s, allowed, "local")
                    out[i] = p.result(local, local, None, None, key, request_id, now_s, as_dicts)
                except Exception as exc:  # noqa: BLE001 - one item never fails the batch: its error in place
                    out[i] = exc
        finally:
            self._flush_plans(plans)

        # -- the distributed decisions: one pipelined burst, then compare and enforce ---
        if pend:
            try:
                outcomes = await self.resilient.check_many(reqs, overrides=ovs)
            except Exception as exc:  # noqa: BLE001 - not a backend failure (those are outcomes): each item's error in place
                for entry in pend:
                    out[entry[0]] = exc
                outcomes = []
            record = self.divergence.record
            dirty = False
            try:
                for j, (entry, outcome) in enumerate(zip(pend, outcomes)):
                    i = entry[0]
                    try:
                        if len(entry) == 2:
                            if dirty:
                                self._flush_plans(plans)
                                dirty = False
                            out[i] = self._complete(entry[1], outcome)
                            continue
                        _, p, key, local, request_id, now_s = entry
                        if outcome.source != "distributed":
                            if dirty:
                                self._flush_plans(plans)
                                dirty = False
                            lkey, dist_policy, cost, now_us = reqs[j]
                            out[i] = self._complete(
                                _Pending(
                                    p.rule,
                                    key,
                                    p.mode,
                                    p.percent,
                                    lkey,
                                    local,
                                    dist_policy,
                                    cost,
                                    now_us,
                                    now_s,
                                    request_id,
                                    *p.failure,
                                ),
                                outcome,
                            )
                            continue
                        # _complete for a distributed answer, then _finish
                        dirty = True
                        name = p.name
                        dist = outcome.decision
                        allowed = dist.allowed
                        local_allowed = local.allowed
                        div = _AGREE if local_allowed == allowed else _LADD if local_allowed else _LDDA
                        record(name, div, distributed_attempt=True)
                        p.count_divergence(m, div)
                        if div is _LADD:
                            self.blocked.record(name, key, request_id)
                        if allowed:
                            if not p.dreq_ok:
                                m.child(m.requests, "distributed", "allowed")
                                m.child(m.decisions, name, p.mode_value, "distributed", "true")
                            p.dreq_ok += 1
                        else:
                            if not p.dreq_rej:
                                m.child(m.requests, "distributed", "denied")
                                m.child(m.rejections, "distributed_exhausted")
                                m.child(m.exceeded, "distributed")
                                m.child(m.decisions, name, p.mode_value, "distributed", "false")
                            p.dreq_rej += 1
                        if p.remaining is None:
                            m.child(m.tokens_remaining, "route", name)
                        p.remaining = dist.remaining
                        act = activity.get(name)
                        if act is not None:
                            act.last[key] = (now_s, allowed, "distributed")
                        out[i] = p.result(dist, local, dist, div, key, request_id, now_s, as_dicts)
                    except Exception as exc:  # noqa: BLE001 - one item never fails the batch: its error in place
                        out[i] = exc
            finally:
                self._flush_plans(plans)
        for i, res in ext.items():  # ``out`` has one entry per input, in order
            r = out[i]
            if isinstance(r, DecideResult):
                out[i] = _with_source(r, res)
        if as_dicts:
            for i, r in enumerate(out):
                if r.__class__ is DecideResult:
                    out[i] = r.to_dict()
        if inputs:
            per = (time.perf_counter() - t0) / len(inputs)
            self.metrics.child(self.metrics.latency, "batch").observe(per)
        return out

    def _plan(self, rule: RouteRule) -> _Plan:
        """The per-route facts of the batch fast path (called with no await pending, so
        mode, rules and adjustments cannot change while a plan is in use)."""
        mode, percent = self.effective_mode(rule.name)
        fast = (
            rule.external is None
            and not rule.deny
            and not rule.allow
            and not rule.api_key_overrides
            and not rule.tenant_overrides
        )
        lp, dp = rule.local, rule.distributed
        if self._adjust:
            # policies(): a per-key adjustment first, then the route's
            per_key = f"{rule.name}\x00"
            if any(k.startswith(per_key) for k in self._adjust):
                fast = False
            adj = self._adjust.get(rule.name)
            if adj is not None:
                lp, dp = adj.get("local", lp), adj.get("distributed", dp)
        return _Plan(rule, mode, percent, lp, dp, fast)

    def _flush_plans(self, plans: dict[str, _Plan]) -> None:
        """Apply what the fast path has counted (before any await and before any item
        that takes the general path, so the order of gauge updates is kept too)."""
        m = self.metrics
        for p in plans.values():
            if p.dropped:
                self.shadow_dropped += p.dropped
                m.child(m.shadow_dropped, p.name).inc(p.dropped)
                self.divergence.add(p.name, dropped=p.dropped)
                p.dropped = 0
            p.flush(m)

    def _next_id(self) -> str:
        self._seq += 1
        return f"{self.instance_id}-{self._seq}"

    def _begin(
        self,
        rule: RouteRule,
        key: str,
        cost: int,
        request_id: str,
        client_ip: str | None,
        ext: ExternalLimits | None = None,
    ) -> DecideResult | _Pending:
        """Everything up to the distributed call: lists, the local decision, shadow queueing.

        ``ext`` is the limits service's answer for this key (routes with ``external``):
        its policy replaces the rules' in both limiters, its ``tenant_key`` the bucket
        key (``t:<tenant_key>``) and its failure policy/code the route's.
        """
        name = rule.name
        now_us = time.time_ns() // 1000
        now_s = now_us / 1_000_000
        mode, percent = self.effective_mode(name)
        fp, fc = rule.failure_policy, rule.failure_code
        if ext is None:
            local_policy, dist_policy = self.policies(rule, key)
            bkey = key
        else:
            bkey = ext.bucket_key(key)
            local_policy, dist_policy = self.policies(rule, bkey, (ext.policy, ext.policy))
            fp = ext.failure_policy or fp
            fc = ext.failure_code or fc
        cost = validate_cost(local_policy, cost)
        if not dist_policy.unlimited and cost > dist_policy.limit:
            validate_cost(dist_policy, cost)
        m = self.metrics

        if rule.deny.matches(key, client_ip):
            d = make_decision(False, 0, local_policy.limit, local_policy.period_us, 0)
            m.child(m.rejections, "deny_list").inc()
            return self._result(
                rule,
                key,
                mode,
                percent,
                "local",
                d,
                d,
                None,
                403,
                request_id,
                now_s,
                local_policy,
                None,
                list_match="deny",
            )
        if rule.allow.matches(key, client_ip):
            d = make_decision(True, local_policy.limit, local_policy.limit, 0, 0)
            return self._result(
                rule,
                key,
                mode,
                percent,
                "local",
                d,
                d,
                None,
                200,
                request_id,
                now_s,
                local_policy,
                None,
                list_match="allow",
            )

        key = bkey
        lkey = f"{name}:{key}"
        local = self.local.check(lkey, local_policy, cost, now_us)
        self._note_activity(name, key, now_s)
        if ext is not None:
            self._activity[name].external[key] = (local_policy, dist_policy)
        m.child(m.requests, "local", "allowed" if local.allowed else "denied").inc()

        if mode is Mode.OFF:
            return self._finish(
                rule, key, mode, percent, "local", local, None, None, request_id, now_s, local_policy, None
            )
        if not enforced_by_distributed(mode, percent, name, key):
            self._enqueue_shadow((lkey, dist_policy, cost, now_us, name, key, local.allowed, request_id))
            return self._finish(
                rule, key, mode, percent, "local", local, None, None, request_id, now_s, local_policy, dist_policy
            )
        return _Pending(rule, key, mode, percent, lkey, local, dist_policy, cost, now_us, now_s, request_id, fp, fc)

    def _complete(self, p: _Pending, outcome: Outcome) -> DecideResult:
        """The distributed answer is in: compare, then enforce."""
        m = self.metrics
        name = p.rule.name
        if outcome.source == "distributed":
            dist = outcome.decision
            div = classify(p.local.allowed, dist.allowed)
            self._record_comparison(name, p.key, div, p.request_id, backend_error=False)
            m.child(m.requests, "distributed", "allowed" if dist.allowed else "denied").inc()
            return self._finish(
                p.rule,
                p.key,
                p.mode,
                p.percent,
                "distributed",
                dist,
                p.local,
                dist,
                p.request_id,
                p.now_s,
                p.dist_policy,
                None,
                div,
            )
        # Redis failed: the failure policy decides
        self._record_backend_error(name)
        m.child(m.fallback, (p.failure_policy or self.resilient.failure_policy).value).inc()
        status = outcome.status_code if outcome.source == "fail_closed" else 429
        reason = "fallback_exhausted" if outcome.source == "fallback" else "backend_error"
        return self._finish(
            p.rule,
            p.key,
            p.mode,
            p.percent,
            "failure_policy",
            outcome.decision,
            p.local,
            None,
            p.request_id,
            p.now_s,
            p.dist_policy,
            None,
            None,
            status=status,
            backend_error=outcome.error,
            reject_reason=reason,
        )

    def _finish(
        self,
        rule: RouteRule,
        key: str,
        mode: Mode,
        percent: int,
        enforced_by: str,
        enforced: Decision,
        local: Decision | None,
        dist: Decision | None,
        request_id: str,
        now_s: float,
        policy: Policy,
        shadow_policy: Policy | None,
        div: Divergence | None = None,
        *,
        status: int = 429,
        backend_error: str | None = None,
        reject_reason: str | None = None,
    ) -> DecideResult:
        m = self.metrics
        allowed = enforced.allowed
        if not allowed:
            reason = reject_reason or (
                "local_exhausted"
                if enforced_by == "local"
                else "distributed_exhausted"
                if enforced_by == "distributed"
                else "backend_error"
            )
            m.child(m.rejections, reason).inc()
            m.child(m.exceeded, enforced_by).inc()
        m.child(m.decisions, rule.name, mode.value, enforced_by, "true" if allowed else "false").inc()
        m.child(m.tokens_remaining, "route", rule.name).set(enforced.remaining)
        act = self._activity.get(rule.name)
        if act is not None:
            act.last[key] = (now_s, allowed, enforced_by)
        return self._result(
            rule,
            key,
            mode,
            percent,
            enforced_by,
            enforced,
            local if local is not None else enforced,
            dist,
            200 if allowed else status,
            request_id,
            now_s,
            policy,
            shadow_policy,
            div=div,
            backend_error=backend_error,
        )

    def _result(
        self,
        rule,
        key,
        mode,
        percent,
        enforced_by,
        enforced,
        local,
        dist,
        status,
        request_id,
        now_s,
        policy,
        shadow_policy,
        *,
        div=None,
        list_match=None,
        backend_error=None,
    ) -> DecideResult:  # type: ignore[no-untyped-def]
        headers = rate_limit_headers(rule.name, enforced, policy, shadow_policy=shadow_policy, now_s=now_s)
        return DecideResult(
            allowed=enforced.allowed,
            route=rule.name,
            mode=mode.value,
            canary_percent=percent,
            enforced_by=enforced_by,
            key=key,
            local=local,
            distributed=dist,
            divergence=div,
            status_code=status,
            headers=headers,
            request_id=request_id,
            list_match=list_match,
            backend_error=backend_error,
        )

    # -- shadow pipeline ------------------------------------------------------------------

    def _enqueue_shadow(self, item: _ShadowItem) -> None:
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.shadow_dropped += 1
            self.metrics.child(self.metrics.shadow_dropped, item[4]).inc()
            self.divergence.add(item[4], dropped=1)

    async def _shadow_worker(self) -> None:
        q = self._queue
        size = self.settings.shadow_batch_size
        linger = self.settings.shadow_linger_ms / 1000
        while True:
            await q.wait()
            if linger and len(q) < size:
                # off the hot path: a few ms of waiting turns many one-item round trips
                # into one pipelined batch, which leaves the event loop to the requests
                await asyncio.sleep(linger)
            batch = q.take(size)
            self.metrics.shadow_queue.set(len(q))
            try:
                await self._evaluate_shadow(batch)
            except Exception:  # noqa: BLE001 - the shadow path must never die
                log.exception("shadow evaluation failed")

    async def _drain_shadow(self) -> None:
        batch = self._queue.take(len(self._queue))
        if batch:
            await self._evaluate_shadow(batch)

    async def _evaluate_shadow(self, batch: list[_ShadowItem]) -> None:
        verdicts = await self.resilient.compare_many([item[:4] for item in batch])
        # what _record_comparison / _record_backend_error do per item, added up per
        # route and applied once (no await in between)
        m = self.metrics
        per_route: dict[str, list[int]] = {}  # route -> [agree, ladd, ldda, backend errors]
        blocked = self.blocked.record
        try:
            for item, dist_allowed in zip(batch, verdicts):
                route = item[4]
                c = per_route.get(route)
                if c is None:
                    c = per_route[route] = [0, 0, 0, 0]
                if dist_allowed is None:
                    c[3] += 1
                elif item[6] == dist_allowed:
                    c[0] += 1
                elif dist_allowed:
                    c[2] += 1
                else:
                    c[1] += 1
                    blocked(route, item[5], item[7])
        finally:
            record = self.divergence.add
            for route, (agree, ladd, ldda, errors) in per_route.items():
                record(route, agree=agree, ladd=ladd, ldda=ldda, backend_errors=errors)
                self.shadow_evaluated += agree + ladd + ldda
                for div, n in ((_AGREE, agree), (_LADD, ladd), (_LDDA, ldda)):
                    if n:
                        m.child(m.divergence, route, div.value).inc(n)
                if errors:
                    m.backend_errors.inc(errors)

    def _record_comparison(
        self, route: str, key: str, div: Divergence, request_id: str, *, backend_error: bool
    ) -> None:
        self.divergence.record(route, div, distributed_attempt=True)
        self.metrics.child(self.metrics.divergence, route, div.value).inc()
        if div is Divergence.LOCAL_ALLOW_DISTRIBUTED_DENY:
            self.blocked.record(route, key, request_id)

    def _record_backend_error(self, route: str) -> None:
        self.divergence.record(route, None, backend_error=True, distributed_attempt=True)
        self.metrics.backend_errors.inc()

    def _note_activity(self, route: str, key: str, now_s: float) -> None:
        act = self._activity.get(route)
        minute = int(now_s // 60)
        if act is None or act.minute != minute:
            old = act
            act = _RouteActivity(
                {},
                old.counts if old is not None and old.minute == minute - 1 else {},
                old.last if old is not None else {},
                minute,
            )
            if old is not None:
                act.external = old.external
                act.per_second = old.per_second  # decisions/s must not drop at the minute boundary
            self._activity[route] = act
        counts = act.counts
        n = counts.get(key)
        if n is not None:
            counts[key] = n + 1
        elif len(counts) < _MAX_ACTIVE_KEYS:
            counts[key] = 1
        sec = int(now_s)
        ps = act.per_second
        ps[sec] = ps.get(sec, 0) + 1
        if len(ps) > 20:
            for old_sec in [t for t in ps if t < sec - 15]:
                del ps[old_sec]
        if len(act.last) > _MAX_ACTIVE_KEYS:
            for k in list(act.last)[:500]:
                del act.last[k]
        if len(act.external) > _MAX_ACTIVE_KEYS:
            for k in list(act.external)[:500]:
                del act.external[k]

    # -- background -----------------------------------------------------------------------

    async def refresh_views(self) -> None:
        """Read every route's last two hours of fleet-wide counters and top blocked keys."""
        views: dict[str, dict[str, Any]] = {}
        for name in self.rules.names():
            series = await self.divergence.series(name, minutes=120)
            try:
                top = await self.blocked.fleet_top(self.client, name, n=10)
            except (StoreUnavailable, BackendError, OSError):
                top = self.blocked.top(name, n=10)
            views[name] = {"series": series, "top": top}
        self._views = views
        self.views_at = time.time()
        self.views_error = None

    async def _views_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.refresh_views(), timeout=3.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - stale views are flagged, never fatal
                self.views_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            await asyncio.sleep(1.0)

    async def route_view(self, name: str) -> dict[str, Any] | None:
        """Cached fleet-wide figures for a route (None until the first refresh)."""
        v = self._views.get(name)
        if v is None and not self._views:
            try:
                await asyncio.wait_for(self.refresh_views(), timeout=2.0)
            except Exception as exc:  # noqa: BLE001
                self.views_error = f"{type(exc).__name__}: {exc}"
            v = self._views.get(name)
        return v

    def views_age_s(self) -> float | None:
        return None if not self.views_at else time.time() - self.views_at

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.metrics.shadow_queue.set(len(self._queue))
            self.metrics.active_clients.labels("local").set(len(self.local))
            try:
                await self.divergence.flush()
                await self.blocked.flush(self.client)
            except (StoreUnavailable, BackendError, OSError) as exc:
                log.debug("divergence flush failed: %s", exc)
            if len(self.local) > 0:
                self.local.sweep()

    async def _monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            await self.check_auto_rollback()

    async def check_auto_rollback(self) -> None:
        """Automatic rollback: enforced routes go back to shadow when the breaker has been
        open for ``SHADOWLIMIT_AUTO_ROLLBACK_AFTER_S`` (at once on this replica; stored by
        :meth:`persist_rollbacks` once Redis answers)."""
        if self.breaker.state is BreakerState.CLOSED:
            return
        open_for = self.breaker.open_for_s()
        if open_for < self.settings.auto_rollback_after_s:
            return
        for name in self.rules.names():
            st = self.state_for(name)
            if st.mode in (Mode.ENFORCE, Mode.CANARY) and name not in self._pending_rollbacks:
                rb = RouteState(
                    mode=Mode.SHADOW,
                    updated_at=time.time(),
                    updated_by="shadowlimit/auto-rollback",
                    reason=f"Redis circuit breaker open for {open_for:.0f}s",
                    version=st.version,
                )
                self._pending_rollbacks[name] = (rb, st)
                self._set_mode_metric(name)
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
                self.audit_sink.emit(self._rollback_entry(name, rb, st), stored=False)
                log.warning("auto-rollback of route %s to shadow: %s", name, rb.reason)

    @staticmethod
    def _rollback_entry(name: str, rb: RouteState, frm: RouteState) -> AuditEntry:
        return AuditEntry(
            route=name,
            actor=rb.updated_by,
            from_mode=frm.mode.value,
            to_mode="shadow",
            from_percent=frm.canary_percent,
            reason=rb.reason,
            automatic=True,
        )

    async def persist_rollbacks(self) -> None:
        """Persist automatic rollbacks once Redis answers again (audited as automatic, from
        the mode the route really had: the newest state this replica knows, which a store
        that lost its data cannot take away). A route someone moved out of enforce/canary
        meanwhile keeps that change (it has its own audit entry)."""
        for name, (rb, frm) in list(self._pending_rollbacks.items()):
            cur = self._states.get(name) or frm
            try:
                if cur.mode in (Mode.ENFORCE, Mode.CANARY):
                    new = replace(rb, version=cur.version + 1)
                    await self.store.change(
                        name, new, self._rollback_entry(name, rb, cur), expected_version=cur.version
                    )
                    self.memory.note_state(name, new)
                    self.metrics.mode_changes.labels(name, "shadow", "true").inc()
            except VersionConflict:
                pass  # another replica persisted it first
            self._pending_rollbacks.pop(name, None)

    def _on_breaker(self, frm: BreakerState, to: BreakerState, reason: str | None) -> None:
        self.metrics.set_breaker(to.value)
        self.metrics.breaker_transitions.labels(to.value).inc()
        self.events.publish(
            {"type": "breaker", "from": frm.value, "to": to.value, "reason": reason, "instance": self.instance_id}
        )

    def _on_rules(self, rules: Rules) -> None:
        self.rules = rules
        self.external.configure(rules.all_routes)
        self.last_rules_error = None
        self.metrics.rules_reloads.labels("ok").inc()
        self.metrics.rules_valid.set(1)
        event = {
            "type": "rules_reload",
            "ok": True,
            "routes": rules.names(),
            "digest": rules.digest,
            "instance": self.instance_id,
        }
        self.events.publish(event)
        for name in rules.names():
            self._set_mode_metric(name)
        self._spawn_audit(self._audit_rules(True, f"{len(rules.names())} routes, digest {rules.digest[:12]}"))

    def _on_rules_error(self, err: RulesError) -> None:
        self.last_rules_error = str(err)
        self.metrics.rules_reloads.labels("error").inc()
        self.metrics.rules_valid.set(0)
        self.events.publish({"type": "rules_reload", "ok": False, "error": str(err), "instance": self.instance_id})
        with contextlib.suppress(RuntimeError):
            self._spawn_audit(self._audit_rules(False, str(err)))

    def _spawn_audit(self, coro: Any) -> None:
        """Write an audit entry in the background (from a sync callback); tracked so
        :meth:`settle_audit` can wait for it and nothing is dropped half-way."""
        task = asyncio.get_running_loop().create_task(coro)
        self._audit_tasks.add(task)
        task.add_done_callback(self._audit_tasks.discard)

    async def settle_audit(self, timeout: float = 2.0) -> None:
        """Wait (bounded) until the audit entries written in the background are stored."""
        if self._audit_tasks:
            await asyncio.wait(list(self._audit_tasks), timeout=timeout)

    def _on_rules_recovered(self, rules: Rules) -> None:
        """The rejected file was put back to the rules in force: nothing to reload, but
        the error is over (rules_error, rate_limit_rules_valid, an event and the audit)."""
        self.last_rules_error = None
        self.metrics.rules_valid.set(1)
        self.events.publish(
            {
                "type": "rules_reload",
                "ok": True,
                "recovered": True,
                "routes": rules.names(),
                "digest": rules.digest,
                "instance": self.instance_id,
            }
        )
        with contextlib.suppress(RuntimeError):
            self._spawn_audit(
                self._audit_rules(
                    True,
                    f"the file is back to the rules in force ({len(rules.names())} routes, digest {rules.digest[:12]})",
                )
            )

    async def _audit_rules(self, ok: bool, detail: str) -> None:
        entry = AuditEntry(
            route="*",
            actor=f"instance/{self.instance_id}",
            from_mode="",
            to_mode="ok" if ok else "error",
            reason=detail,
            kind="rules_reload",
        )
        with contextlib.suppress(StoreUnavailable, BackendError, Exception):
            await self.store.append_audit(entry)

    def reload_rules(self) -> Rules:
        """The admin call: re-read the rules file now (keeps the last good on error)."""
        if self.watcher is None:
            raise RulesError("no rules file is configured (RATE_LIMIT_RULES_PATH)")
        return self.watcher.reload(force=True)

    # -- read models ----------------------------------------------------------------------

    def route_rate(self, name: str, window_s: int = 10) -> float:
        """Decisions per second on this replica over the last ``window_s`` whole seconds."""
        act = self._activity.get(name)
        if act is None:
            return 0.0
        now = int(time.time())
        total = sum(n for sec, n in list(act.per_second.items()) if now - window_s <= sec < now)
        return total / window_s

    def hot_keys(self, name: str, n: int) -> list[tuple[str, int]]:
        """The most active keys: requests this minute plus half of last minute's."""
        act = self._activity.get(name)
        if act is None:
            return []
        score: dict[str, int] = {k: v // 2 for k, v in act.previous.items()}
        for k, v in act.counts.items():
            score[k] = score.get(k, 0) + v
        return sorted(score.items(), key=lambda kv: -kv[1])[:n]

    def key_policies(self, rule: RouteRule, key: str) -> tuple[Policy, Policy]:
        """The policies a key was last decided with: the limits service's for keys on
        routes with external limits, else the rules' (with adjustments)."""
        act = self._activity.get(rule.name)
        if act is not None and act.external:
            p = act.external.get(key)
            if p is not None:
                return p
        return self.policies(rule, key)

    def last_decision(self, name: str, key: str) -> tuple[float, bool, str] | None:
        act = self._activity.get(name)
        return None if act is None else act.last.get(key)

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """(ready, report) for ``/readyz``. Ready while this replica can decide: started,
        not stopping, its shadow worker alive; Redis being down is reported, and makes the
        replica unready only with ``SHADOWLIMIT_READY_REQUIRES_REDIS`` (the failure
        policies are there to serve exactly then)."""
        reasons = []
        if not self.running:
            reasons.append("the engine is not running (starting or stopping)")
        dead = sorted(t.get_name() for t in self._tasks if t.done())
        if dead:
            reasons.append("background tasks stopped: " + ", ".join(dead))
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
            "rules": {"source": self.rules.source, "error": self.last_rules_error},
            "instance_id": self.instance_id,
        }
        return not reasons, report

    def backend_snapshot(self) -> dict[str, Any]:
        snap = self.breaker.snapshot().to_dict()
        snap.update(
            {
                "failure_policy": self.resilient.failure_policy.value,
                "failure_code": self.resilient.failure_code,
                "redis": self.redis.describe(),
                "time_source": self.redis.time_source,
                "live_instances": self.resilient.live_instances,
                "fleet": self.fleet.members,
                "instance_id": self.instance_id,
                "fallback_decisions": self.resilient.fallback_decisions,
                "backend_errors": self.resilient.backend_errors,
                "shadow_queue": len(self._queue),
                "shadow_queue_capacity": self.settings.shadow_queue_size,
                "shadow_dropped": self.shadow_dropped,
                "shadow_evaluated": self.shadow_evaluated,
                "auto_rollback_after_s": self.settings.auto_rollback_after_s,
                "pending_rollbacks": sorted(self._pending_rollbacks),
                "distributed_enabled": self.settings.enable_distributed_rate_limiting,
            }
        )
        return snap
