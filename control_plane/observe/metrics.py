"""Prometheus metrics: the rollout's and the admin API's names, plus shadowlimit's own (docs/metrics.md).

Each app gets its own :class:`~prometheus_client.CollectorRegistry`, so several
control planes (and tests) can live in one process. Labelled counters exist at 0 for every
label set known in advance (the fixed ones at once, a route's from :meth:`Metrics.add_route`),
so a first event is an increase ``increase()`` and ``rate()`` see.

========================================  =======  =================================
metric                                    type     labels
========================================  =======  =================================
rate_limit_rejections_total               counter  reason: local_exhausted,
                                                   distributed_exhausted, backend_error,
                                                   fallback_exhausted, deny_list
rate_limit_tokens_remaining               gauge    scope (global/route), route
rate_limit_backend_errors_total           counter  -
rate_limit_shadow_divergence_total        counter  route, direction
rate_limit_divergence_cause_total         counter  route, direction, cause (the divergent decisions
                                                   explained: control_plane/model/causes.py)
rate_limit_clock_skew_seconds             gauge    - (this replica's clock minus Redis' TIME)
rate_limit_requests_total                 counter  limiter_type, status
rate_limit_exceeded_total                 counter  limiter_type
rate_limit_active_clients                 gauge    limiter_type
rate_limit_decision_duration_seconds      hist.    mode
rate_limit_decisions_total                counter  route, mode, enforced_by, allowed
rate_limit_shadow_dropped_total           counter  route
rate_limit_shadow_queue_depth             gauge    -
rate_limit_route_mode                     gauge    route, mode (1 for the current mode)
rate_limit_breaker_state                  gauge    state (1 for the current state)
rate_limit_breaker_transitions_total      counter  to
rate_limit_fallback_decisions_total       counter  policy
rate_limit_rules_reload_total             counter  result: ok, error
rate_limit_rules_valid                    gauge    - (0 while the last reload failed)
rate_limit_mode_changes_total             counter  route, to, automatic: false (a person), true
                                                   (the breaker's automatic rollback), plan (a
                                                   rollout plan's step)
rate_limit_plan_step                      gauge    route (the step its rollout plan is at, from 1;
                                                   0 without a plan)
rate_limit_plan_state                     gauge    route, state (1 for its plan's state: running,
                                                   waiting, waiting_for_approval, paused,
                                                   completed, aborted; all 0 without a plan)
rate_limit_plan_analysis_total            counter  route, outcome: pass, fail, inconclusive,
                                                   refused (the plan's analyses, by the replica
                                                   driving the plans)
rate_limit_notifications_total            counter  result: sent, retried, failed, dropped
                                                   (SHADOWLIMIT_NOTIFY_URL's deliveries)
rate_limit_state_restorations_total       counter  - (the store lost its data, this replica
                                                   wrote back what it remembered)
rate_limit_external_calls_total           counter  result: ok, timeout, error, invalid
rate_limit_external_errors_total          counter  reason: timeout, error, invalid,
                                                   overloaded, circuit_open, internal
rate_limit_external_cache_total           counter  result: hit, miss, stale
rate_limit_external_breaker_transitions_total
                                          counter  to: open, half_open, closed
rate_limit_external_limits_total          counter  route, source: external, cache,
                                                   stale, static
rate_limit_external_backend_url_rejected_total
                                          counter  -
rate_limit_stream_snapshot_builds_total   counter  -
rate_limit_stream_subscribers             gauge    -
rate_limit_stream_refused_total           counter  -
rate_limit_slow_clients_total             counter  - (request heads, or a gRPC connection's HTTP/2
                                                   preface, not complete within
                                                   SHADOWLIMIT_HEADER_TIMEOUT_S: connection closed)
rate_limit_record_events_total            counter  result: recorded, dropped (what-if recording)
rate_limit_envoy_requests_total           counter  code: ok, over_limit, invalid, overloaded (refused:
                                                   too many calls in progress), error
                                                   (ShouldRateLimit calls)
rate_limit_deadline_answers_total         counter  route, reason: redis_timeout, no_time (the failure
                                                   policy answered within the caller's deadline)
rate_limit_over_limit_cache_total         counter  result: hit, stored (keys over their global limit
                                                   answered without Redis, in enforce)
rate_limit_candidate_divergence_total     counter  route, direction: agree, newly_rejected,
                                                   newly_admitted (a candidate limit against
                                                   the current one; control_plane/model/candidate.py)
rate_limit_envoy_hits_total               counter  route, stat: total_hits, over_limit, near_limit,
                                                   within_limit, shadow_mode (envoyproxy/ratelimit's
                                                   per-descriptor stats; control_plane/envoy/stats.py)
rate_limit_envoy_bad_costs_total          counter  route, reason (a descriptor's cost; gateways.md)
rate_limit_reservations_total, ..._settles_total, ..._metered_responses_total, ..._settle_cost_ratio,
rate_limit_divergence_units_total         budgets: control_plane/observe/budgets.py
rate_limit_grpc_connections               gauge    - (gRPC connections open)
rate_limit_grpc_protocol_errors_total     counter  kind: GRPC_PROTOCOL_KINDS (docs/metrics.md)
shadowlimit_build_info                    gauge    version (always 1)
process_*, python_*                       -        prometheus-client's process, platform and GC collectors
========================================  =======  =================================
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from limiter.breaker import BreakerState
from limiter.resilience import FailurePolicy

from ..external.resolver import SOURCES
from ..model.candidate import CandidateDirection
from ..model.causes import Cause, direction_of
from ..model.rollout import Divergence, Mode
from .budgets import UNIT_MEASURES, BudgetMetrics
from .families import FastCounter, FastGauge, FastHistogram

__all__ = [
    "DECISION_ENFORCERS", "ENVOY_STATS", "GRPC_PROTOCOL_KINDS", "MODE_CHANGE_CAUSES", "OTHER_ROUTES", "PLAN_OUTCOMES",
    "PLAN_STATES", "FastCounter", "FastGauge", "FastHistogram", "Metrics",
]  # fmt: skip

#: rate_limit_grpc_protocol_errors_total's kinds: a connection error sent (goaway_<code>), streams
#: reset, refused, answers held too long by the peer's window, closes, malformed requests
GRPC_PROTOCOL_KINDS = (
    "goaway_protocol_error", "goaway_flow_control_error", "goaway_frame_size_error", "goaway_compression_error",
    "goaway_stream_closed", "goaway_enhance_your_calm", "reset_received", "reset_sent", "refused_stream",
    "flow_control", "idle_close", "keepalive_timeout", "connection_refused", "bad_header",
)  # fmt: skip


#: from 5 us (an in-process decision takes 10-20 us) to 1 s (a slow Redis round trip)
_LATENCY_BUCKETS = (
    0.000005, 0.00001, 0.000015, 0.00002, 0.00003, 0.00005, 0.000075, 0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip

#: who can enforce a decision in each mode: the ``enforced_by`` values of
#: ``rate_limit_decisions_total`` a route's series are created with (at 0)
DECISION_ENFORCERS: dict[str, tuple[str, ...]] = {
    Mode.OFF.value: ("local",),
    Mode.SHADOW.value: ("local",),
    Mode.CANARY.value: ("local", "distributed", "failure_policy"),
    Mode.ENFORCE.value: ("distributed", "failure_policy"),
}

#: rate_limit_candidate_divergence_total's directions
CANDIDATE_DIRECTIONS = CandidateDirection.ALL

#: rate_limit_plan_analysis_total's outcomes (control_plane/model/plan_analysis.py's verdicts)
PLAN_OUTCOMES = ("pass", "fail", "inconclusive", "refused")

#: rate_limit_plan_state's states (the plan's status, a running one waiting for evidence as ``waiting``)
PLAN_STATES = ("running", "waiting", "waiting_for_approval", "paused", "completed", "aborted")

#: rate_limit_mode_changes_total's ``automatic``: a person, the breaker's rollback, a plan's step
MODE_CHANGE_CAUSES = ("false", "true", "plan")

#: the interpreter's switch interval while /metrics is rendered in a thread (Metrics.render_async)
RENDER_SWITCH_INTERVAL_S = 0.001

#: the route label of the routes past SHADOWLIMIT_METRICS_MAX_ROUTES (no route can be named so)
OTHER_ROUTES = "(other)"

#: rate_limit_envoy_hits_total's stats, in envoyproxy/ratelimit's names
ENVOY_STATS = ("total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode")

#: the label values known in advance of the metrics without a route label (each series
#: exists at 0 from the start, so ``increase()`` and ``rate()`` see its first event)
_FIXED_LABELS: dict[str, tuple[tuple[str, ...], ...]] = {
    "rejections": tuple(
        (r,) for r in ("local_exhausted", "distributed_exhausted", "backend_error", "fallback_exhausted", "deny_list")
    ),
    "exceeded": (("local",), ("distributed",), ("failure_policy",)),
    "requests": tuple((t, s) for t in ("local", "distributed") for s in ("allowed", "denied")),
    "latency": tuple((m,) for m in (*DECISION_ENFORCERS, "batch")),
    "breaker_transitions": tuple((s.value,) for s in BreakerState),
    "fallback": tuple((p.value,) for p in FailurePolicy),
    "rules_reloads": (("ok",), ("error",)),
    "external_calls": tuple((r,) for r in ("ok", "timeout", "error", "invalid")),
    "external_errors": tuple((r,) for r in ("timeout", "error", "invalid", "overloaded", "circuit_open", "internal")),
    "external_cache": (("hit",), ("miss",), ("stale",)),
    "external_breaker_transitions": tuple((s.value,) for s in BreakerState),
    "record_events": (("recorded",), ("dropped",)),
    "envoy_requests": tuple((c,) for c in ("ok", "over_limit", "invalid", "overloaded", "error")),
    "grpc_protocol_errors": tuple((k,) for k in GRPC_PROTOCOL_KINDS),
    "over_limit_cache": (("hit",), ("stored",)),
    "notifications": (("sent",), ("retried",), ("failed",), ("dropped",)),
}


class Metrics(BudgetMetrics):
    """All metrics of one control plane."""

    def __init__(self, registry: CollectorRegistry | None = None, max_routes: int = 1000) -> None:
        r = self.registry = registry or CollectorRegistry()
        # routes with series of their own (SHADOWLIMIT_METRICS_MAX_ROUTES); the routes added past
        # it count under OTHER_ROUTES: 50,000 Envoy descriptors would be 2 million series, and
        # /metrics would take 20 s to render (on the event loop) and 200 MB to send
        self.max_routes = max_routes
        self._render_lock = asyncio.Lock()
        self._overflow: set[str] = set()
        self._overflow_added = False
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._child_routes: dict[str, list[tuple[int, tuple[str, ...]]]] = {}  # child() keys by route
        self._routes: dict[str, bool] = {}  # the routes whose series exist: name -> has external limits
        # created in this order, which is the order /metrics lists them in
        self._add_decision_metrics(r)
        self._add_budget_metrics(r)
        self._add_control_metrics(r)
        self._add_external_and_stream_metrics(r)
        self._add_process_metrics(r)
        for attr, label_sets in _FIXED_LABELS.items():
            metric = getattr(self, attr)
            for labels in label_sets:
                metric.labels(*labels)
        self.stream_snapshot_builds.labels()
        self.clock_skew.labels()
        self.stream_refused.labels()
        self.grpc_connections.labels()
        self.external_backend_url_rejected.labels()
        self.rules_valid.set(1)
        for s in ("closed", "open", "half_open"):
            self.breaker_state.labels(s).set(1 if s == "closed" else 0)

    def _add_decision_metrics(self, r: CollectorRegistry) -> None:
        """Decisions, rejections, divergence, latency and the shadow queue."""
        self.rejections = FastCounter(
            "rate_limit_rejections_total", "Requests rejected, by reason.", ["reason"], registry=r
        )
        self.tokens_remaining = FastGauge(
            "rate_limit_tokens_remaining", "Last observed tokens remaining.", ["scope", "route"], registry=r
        )
        self.backend_errors = Counter("rate_limit_backend_errors_total", "Redis operation failures.", registry=r)
        self.divergence = FastCounter(
            "rate_limit_shadow_divergence_total",
            "Compared local/distributed decision pairs, by direction.",
            ["route", "direction"],
            registry=r,
        )
        self.requests = FastCounter(
            "rate_limit_requests_total", "Rate-limit checks.", ["limiter_type", "status"], registry=r
        )
        self.exceeded = FastCounter("rate_limit_exceeded_total", "Rate-limit violations.", ["limiter_type"], registry=r)
        self.active_clients = Gauge(
            "rate_limit_active_clients", "Keys tracked by the limiter.", ["limiter_type"], registry=r
        )
        self.latency = FastHistogram(
            "rate_limit_decision_duration_seconds",
            "Time to decide one request.",
            ["mode"],
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.decisions = FastCounter(
            "rate_limit_decisions_total",
            "Decisions by route, mode, enforcer and result.",
            ["route", "mode", "enforced_by", "allowed"],
            registry=r,
        )
        self.shadow_dropped = FastCounter(
            "rate_limit_shadow_dropped_total",
            "Shadow evaluations dropped because the queue was full.",
            ["route"],
            registry=r,
        )
        self.shadow_queue = Gauge("rate_limit_shadow_queue_depth", "Shadow evaluations waiting.", registry=r)
        self.deadline_answers = FastCounter(
            "rate_limit_deadline_answers_total",
            "Requests the failure policy answered within the caller's deadline (gRPC grpc-timeout): Redis did not"
            " answer in time (redis_timeout) or too little time was left to ask it (no_time).",
            ["route", "reason"],
            registry=r,
        )
        self.candidate_divergence = FastCounter(
            "rate_limit_candidate_divergence_total",
            "A route's candidate limit compared with its current limit (the shadow pipeline): agree, newly_rejected"
            " (the current limit admits, the candidate would refuse), newly_admitted (the reverse).",
            ["route", "direction"],
            registry=r,
        )
        self.divergence_cause = FastCounter(
            "rate_limit_divergence_cause_total",
            "Divergent decisions by cause (control_plane/model/causes.py): replicas, tighter, fresh_local, clock"
            " (local_allow_distributed_deny); uneven, looser (local_deny_distributed_allow).",
            ["route", "direction", "cause"],
            registry=r,
        )
        self.clock_skew = FastGauge(
            "rate_limit_clock_skew_seconds",
            "This replica's clock minus Redis' TIME, seconds, the round trip taken off (measured every few seconds).",
            [],
            registry=r,
        )
        self.over_limit_cache = FastCounter(
            "rate_limit_over_limit_cache_total",
            "Keys over their global limit (enforce): refusals answered from this replica's cache without Redis"
            " (hit), refusals remembered (stored).",
            ["result"],
            registry=r,
        )

    def _add_control_metrics(self, r: CollectorRegistry) -> None:
        """Route modes, the Redis circuit breaker, failure policy, rules, restorations, mode changes."""
        self.route_mode = Gauge(
            "rate_limit_route_mode", "1 for each route's current mode.", ["route", "mode"], registry=r
        )
        self.breaker_state = Gauge(
            "rate_limit_breaker_state", "1 for the Redis circuit breaker's current state.", ["state"], registry=r
        )
        self.breaker_transitions = Counter(
            "rate_limit_breaker_transitions_total", "Circuit breaker transitions.", ["to"], registry=r
        )
        self.fallback = FastCounter(
            "rate_limit_fallback_decisions_total", "Decisions made by the failure policy.", ["policy"], registry=r
        )
        self.rules_reloads = Counter("rate_limit_rules_reload_total", "Rules file reloads.", ["result"], registry=r)
        self.rules_valid = Gauge("rate_limit_rules_valid", "1 when the last rules reload succeeded.", registry=r)
        self.restorations = Counter(
            "rate_limit_state_restorations_total",
            "Times this replica wrote back rollout state, audit entries or adjustments the store had lost.",
            registry=r,
        )
        self.mode_changes = Counter(
            "rate_limit_mode_changes_total",
            "Rollout mode changes applied: by a person (automatic=false), the breaker's automatic rollback (true),"
            " a rollout plan's step (plan).",
            ["route", "to", "automatic"],
            registry=r,
        )
        self.plan_step = FastGauge(
            "rate_limit_plan_step",
            "The step each route's rollout plan is at (from 1; 0: no plan).",
            ["route"],
            registry=r,
        )
        self.plan_state = FastGauge(
            "rate_limit_plan_state", "1 for the state of each route's rollout plan.", ["route", "state"], registry=r
        )
        self.plan_analyses = FastCounter(
            "rate_limit_plan_analysis_total",
            "Analyses of rollout plans' steps by outcome (counted by the replica driving the plans).",
            ["route", "outcome"],
            registry=r,
        )
        self.notifications = FastCounter(
            "rate_limit_notifications_total",
            "Notifications to SHADOWLIMIT_NOTIFY_URL: sent, retried (a failed attempt tried again), failed (given"
            " up), dropped (the queue was full).",
            ["result"],
            registry=r,
        )

    def _add_external_and_stream_metrics(self, r: CollectorRegistry) -> None:
        """The limits services (calls, errors, cache, breakers) and the event stream."""
        self.external_calls = FastCounter(
            "rate_limit_external_calls_total", "Calls to external limits services, by result.", ["result"], registry=r
        )
        self.external_errors = FastCounter(
            "rate_limit_external_errors_total",
            "External limits lookups that got no answer from the service, by reason.",
            ["reason"],
            registry=r,
        )
        self.external_cache = FastCounter(
            "rate_limit_external_cache_total",
            "External limits cache lookups (hit, miss) and stale copies used.",
            ["result"],
            registry=r,
        )
        self.external_breaker_transitions = FastCounter(
            "rate_limit_external_breaker_transitions_total",
            "Per-key external limits circuit breaker transitions.",
            ["to"],
            registry=r,
        )
        self.external_limits = FastCounter(
            "rate_limit_external_limits_total",
            "Decisions on routes with external limits, by where the limits came from.",
            ["route", "source"],
            registry=r,
        )
        self.stream_snapshot_builds = FastCounter(
            "rate_limit_stream_snapshot_builds_total",
            "Event-stream snapshots built (one per view per interval, shared by its subscribers).",
            [],
            registry=r,
        )
        self.stream_subscribers = FastGauge("rate_limit_stream_subscribers", "Event streams open.", [], registry=r)
        self.stream_refused = FastCounter(
            "rate_limit_stream_refused_total", "Event streams refused with 503 too_many_streams.", [], registry=r
        )
        self.slow_clients = Counter(  # exists at 0 (no labels); counted by serving.py and envoy/server.py
            "rate_limit_slow_clients_total",
            "Connections closed because a request head (HTTP) or the HTTP/2 preface (gRPC) did not arrive within"
            " SHADOWLIMIT_HEADER_TIMEOUT_S.",
            registry=r,
        )
        self.record_events = FastCounter(
            "rate_limit_record_events_total",
            "Decided requests recorded for what-if replays (recorded) or lost (dropped: queue full, Redis down).",
            ["result"],
            registry=r,
        )
        self.envoy_requests = FastCounter(
            "rate_limit_envoy_requests_total",
            "Envoy ShouldRateLimit calls by overall answer (invalid: refused request, error: no answer).",
            ["code"],
            registry=r,
        )
        self.grpc_connections = FastGauge("rate_limit_grpc_connections", "gRPC connections open.", [], registry=r)
        self.grpc_protocol_errors = FastCounter(
            "rate_limit_grpc_protocol_errors_total", "gRPC transport events by kind (docs/metrics.md).", ["kind"], r
        )
        self.envoy_hits = FastCounter(
            "rate_limit_envoy_hits_total",
            "Envoy descriptor hits per route, as envoyproxy/ratelimit's stats (total_hits, over_limit, near_limit,"
            " within_limit, shadow_mode).",
            ["route", "stat"],
            registry=r,
        )
        self.external_backend_url_rejected = FastCounter(
            "rate_limit_external_backend_url_rejected_total",
            "backend_url values dropped (host not allow-listed or not a URL).",
            [],
            registry=r,
        )

    def _add_process_metrics(self, r: CollectorRegistry) -> None:
        """``process_*`` and ``python_*`` (prometheus-client's own collectors, for this
        process) and ``shadowlimit_build_info`` (the version, always 1)."""
        from prometheus_client import GCCollector, Info, PlatformCollector, ProcessCollector

        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        info = Info("shadowlimit_build", "The running shadowlimit's version.", registry=r)
        from .. import package_version

        info.info({"version": package_version()})

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached: prometheus-client's lookup costs ~3 us."""
        k = (id(metric), labels)
        c = self._children.get(k)
        if c is None:
            names: tuple[str, ...] = tuple(getattr(metric, "labelnames", ()) or getattr(metric, "_labelnames", ()))
            if "route" in names:  # forgotten with the route (remove_route); an overflowed one counts as OTHER_ROUTES
                at = names.index("route")
                self._child_routes.setdefault(labels[at], []).append(k)
                if labels[at] in self._overflow:
                    c = self._children[k] = metric.labels(*labels[:at], OTHER_ROUTES, *labels[at + 1 :])
                    return c
            c = self._children[k] = metric.labels(*labels)
        return c

    def add_route(self, route: str, *, external: bool = False, envoy: bool = False, budget: bool = False) -> None:
        """Create ``route``'s labelled counters at 0 (decisions by mode, enforcer and result;
        divergence by direction, and by cause; shadow drops; mode changes by target and
        ``automatic``; with ``external``, decisions by limits source; with ``envoy``, the hits by
        stat; with ``budget``, the cost ratio), so the first event on any replica is an increase
        from 0 that ``increase()`` and ``rate()`` see, not a series that appears already at 1.
        Called for every route of the rules in force, at startup and after each reload; cheap
        when nothing is new. Past :attr:`max_routes` routes, a route counts under
        :data:`OTHER_ROUTES` (whose series exist at 0 then)."""
        known = self._routes.get(route)
        if known is not None and (known or not external):
            return
        if known is None and (route in self._overflow or len(self._routes) >= self.max_routes):
            self._overflow.add(route)
            if not self._overflow_added:
                self._overflow_added = True
                self._create(OTHER_ROUTES, external=True, envoy=True)
            return
        self._routes[route] = external
        self._create(route, external=external, envoy=envoy)
        if budget:
            self.cost_ratio.labels(route)
            for direction in Divergence:
                for measure in UNIT_MEASURES:
                    self.divergence_units.labels(route, direction.value, measure)

    def _create(self, route: str, *, external: bool, envoy: bool) -> None:
        if envoy:
            for stat in ENVOY_STATS:
                self.envoy_hits.labels(route, stat)
        if external:
            for source in SOURCES:
                self.external_limits.labels(route, source)
        for mode, enforcers in DECISION_ENFORCERS.items():
            for by in enforcers:
                for allowed in ("true", "false"):
                    self.decisions.labels(route, mode, by, allowed)
            for automatic in MODE_CHANGE_CAUSES:
                self.mode_changes.labels(route, mode, automatic)
        for div in Divergence:
            self.divergence.labels(route, div.value)
        for reason in ("redis_timeout", "no_time"):
            self.deadline_answers.labels(route, reason)
        for direction in CANDIDATE_DIRECTIONS:
            self.candidate_divergence.labels(route, direction)
        for cause in Cause:
            self.divergence_cause.labels(route, direction_of(cause).value, cause.value)
        self.shadow_dropped.labels(route)
        self.plan_step.labels(route)
        for state in PLAN_STATES:
            self.plan_state.labels(route, state)
        for outcome in PLAN_OUTCOMES:
            self.plan_analyses.labels(route, outcome)

    def remove_route(self, route: str) -> None:
        """Drop every series of ``route`` (gone from the rules): a configuration of 50,000
        Envoy descriptors replaced by a small one must not leave 2 million series behind."""
        for key in self._child_routes.pop(route, ()):
            self._children.pop(key, None)
        if route in self._overflow:
            self._overflow.discard(route)
            return
        if self._routes.pop(route, None) is None:
            return
        for family in (
            self.decisions, self.divergence, self.shadow_dropped, self.deadline_answers, self.envoy_hits,
            self.external_limits, self.tokens_remaining, self.candidate_divergence, self.divergence_cause,
            self.plan_step, self.plan_state, self.plan_analyses,
        ):  # fmt: skip
            family.remove_route(route)
        for mode in DECISION_ENFORCERS:
            with contextlib.suppress(KeyError):
                self.route_mode.remove(route, mode)
            for automatic in MODE_CHANGE_CAUSES:
                with contextlib.suppress(KeyError):
                    self.mode_changes.remove(route, mode, automatic)

    def routes(self) -> list[str]:
        """The routes whose series exist (:meth:`add_route`)."""
        return list(self._routes)

    def deadline_counts(self) -> dict[str, dict[str, int]]:
        """This replica's deadline answers per route: ``{route: {reason: n}}``."""
        out: dict[str, dict[str, int]] = {}
        for (route, reason), n in self.deadline_answers.samples().items():
            out.setdefault(route, {"redis_timeout": 0, "no_time": 0})[reason] = int(n)
        return out

    def set_breaker(self, state: str) -> None:
        for s in ("closed", "open", "half_open"):
            self.breaker_state.labels(s).set(1 if s == state else 0)

    def mode_changed(self, route: str, mode: str, automatic: bool | str) -> None:
        """``rate_limit_mode_changes_total`` (an overflowed route's under OTHER_ROUTES);
        ``automatic``: True for the breaker's automatic rollback, ``"plan"`` for a rollout
        plan's step, False for a person's change."""
        label = OTHER_ROUTES if route in self._overflow else route
        self.mode_changes.labels(label, mode, automatic if isinstance(automatic, str) else str(automatic).lower()).inc()

    def set_plan(self, route: str, step: int, state: str | None) -> None:
        """A route's plan: the step it is at (from 1; 0 without a plan) and its state (None: none)."""
        if route in self._overflow or route not in self._routes:
            return
        self.plan_step.labels(route).set(step)
        for s in PLAN_STATES:
            self.plan_state.labels(route, s).set(1 if s == state else 0)

    def plan_analysed(self, route: str, outcome: str) -> None:
        """``rate_limit_plan_analysis_total`` (an overflowed route's under OTHER_ROUTES)."""
        self.plan_analyses.labels(OTHER_ROUTES if route in self._overflow else route, outcome).inc()

    def set_mode(self, route: str, mode: str) -> None:
        if route in self._overflow:
            return  # no gauge of its own: OTHER_ROUTES stands for many routes
        for m in ("off", "shadow", "canary", "enforce"):
            self.route_mode.labels(route, m).set(1 if m == mode else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def render_async(self) -> bytes:
        """:meth:`render` in a thread, the interpreter's switch interval lowered to 1 ms
        meanwhile: thousands of routes' series take a fraction of a second to format, which
        must not hold the event loop (Envoy's calls have 20 ms); the loop waits at most a
        millisecond for the interpreter at a time instead of the default 5."""
        async with self._render_lock:
            previous = sys.getswitchinterval()
            sys.setswitchinterval(min(previous, RENDER_SWITCH_INTERVAL_S))
            try:
                return await asyncio.to_thread(self.render)
            finally:
                sys.setswitchinterval(previous)
