"""Typed, immutable views of the control plane's JSON, parsed in one place.

Widgets render only these objects; nothing here does IO. Parsing is lenient (missing
fields get neutral defaults) so a newer control plane with extra or fewer fields still
renders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AuditEntryView",
    "BackendView",
    "BlockedKey",
    "BucketSide",
    "ConnectionState",
    "BucketView",
    "DivergenceTotals",
    "DivergenceView",
    "EventView",
    "ExternalBreakerView",
    "ExternalView",
    "GateView",
    "LastDecision",
    "MinutePoint",
    "ModeChangeResult",
    "PolicyView",
    "RouteDivergence",
    "RouteStateView",
    "RouteView",
    "Snapshot",
]

MODES = ("off", "shadow", "canary", "enforce")


def _d(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _f(v: Any, default: float = 0.0) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def _fo(v: Any) -> float | None:
    return None if v is None else _f(v)


def _i(v: Any, default: int = 0) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _s(v: Any, default: str = "") -> str:
    return default if v is None else str(v)


def _so(v: Any) -> str | None:
    return None if v is None else str(v)


@dataclass(frozen=True, slots=True)
class PolicyView:
    algorithm: str
    average: float
    period: float
    burst: int

    @classmethod
    def parse(cls, d: Any) -> PolicyView | None:
        d = _d(d)
        if not d:
            return None
        return cls(
            _s(d.get("algorithm"), "token_bucket"), _f(d.get("average")), _f(d.get("period"), 1.0), _i(d.get("burst"))
        )

    def describe(self) -> str:
        if self.average <= 0:
            return "unlimited"
        per = f"{self.period:g}s"
        burst = f" burst {self.burst}" if self.burst else ""
        algo = "" if self.algorithm == "token_bucket" else f" {self.algorithm}"
        return f"{self.average:g}/{per}{burst}{algo}"


@dataclass(frozen=True, slots=True)
class DivergenceTotals:
    agree: int = 0
    local_allow_distributed_deny: int = 0
    local_deny_distributed_allow: int = 0
    compared: int = 0
    backend_errors: int = 0
    distributed_attempts: int = 0
    new_rejection_rate: float = 0.0
    reverse_rate: float = 0.0
    backend_error_rate: float = 0.0
    shadow_dropped: int = 0
    sampled_share: float | None = None  # decisions evaluated / decisions that should have been

    @classmethod
    def parse(cls, d: Any) -> DivergenceTotals | None:
        if not isinstance(d, dict):
            return None
        return cls(
            _i(d.get("agree")),
            _i(d.get("local_allow_distributed_deny")),
            _i(d.get("local_deny_distributed_allow")),
            _i(d.get("compared")),
            _i(d.get("backend_errors")),
            _i(d.get("distributed_attempts")),
            _f(d.get("new_rejection_rate")),
            _f(d.get("reverse_rate")),
            _f(d.get("backend_error_rate")),
            _i(d.get("shadow_dropped")),
            _fo(d.get("sampled_share")),
        )

    @property
    def sampled(self) -> bool:
        """True when the figures are a sample (shadow evaluations were dropped)."""
        return self.sampled_share is not None and self.sampled_share < 1.0

    @property
    def divergence_rate(self) -> float:
        """Share of compared decisions where the two limiters disagreed (either way)."""
        diverged = self.local_allow_distributed_deny + self.local_deny_distributed_allow
        return diverged / self.compared if self.compared else 0.0


@dataclass(frozen=True, slots=True)
class GateView:
    """A promotion gate's verdict and the figures behind it."""

    passed: bool
    required: bool
    reasons: tuple[str, ...]
    target: str | None = None
    compared: int | None = None
    min_samples: int | None = None
    new_rejections: int | None = None
    new_rejection_rate: float | None = None
    max_new_rejection_rate: float | None = None
    backend_errors: int | None = None
    backend_error_rate: float | None = None
    max_backend_error_rate: float | None = None
    window_s: int | None = None
    sampled_share: float | None = None
    min_sampled_share: float | None = None
    shadow_dropped: int | None = None

    @classmethod
    def parse(cls, d: Any) -> GateView | None:
        if not isinstance(d, dict):
            return None

        def opt_i(k: str) -> int | None:
            return None if d.get(k) is None else _i(d.get(k))

        return cls(
            passed=bool(d.get("passed", False)),
            required=bool(d.get("required", True)),
            reasons=tuple(str(r) for r in d.get("reasons") or ()),
            target=_so(d.get("target")),
            compared=opt_i("compared"),
            min_samples=opt_i("min_samples"),
            new_rejections=opt_i("new_rejections"),
            new_rejection_rate=_fo(d.get("new_rejection_rate")),
            max_new_rejection_rate=_fo(d.get("max_new_rejection_rate")),
            backend_errors=opt_i("backend_errors"),
            backend_error_rate=_fo(d.get("backend_error_rate")),
            max_backend_error_rate=_fo(d.get("max_backend_error_rate")),
            window_s=opt_i("window_s"),
            sampled_share=_fo(d.get("sampled_share")),
            min_sampled_share=_fo(d.get("min_sampled_share")),
            shadow_dropped=opt_i("shadow_dropped"),
        )

    @property
    def has_figures(self) -> bool:
        return self.compared is not None


@dataclass(frozen=True, slots=True)
class RouteStateView:
    mode: str = "shadow"
    canary_percent: int = 0
    updated_at: float = 0.0
    updated_by: str = ""
    reason: str = ""
    version: int = 0

    @classmethod
    def parse(cls, d: Any) -> RouteStateView:
        d = _d(d)
        return cls(
            _s(d.get("mode"), "shadow"),
            _i(d.get("canary_percent")),
            _f(d.get("updated_at")),
            _s(d.get("updated_by")),
            _s(d.get("reason")),
            _i(d.get("version")),
        )


@dataclass(frozen=True, slots=True)
class RouteView:
    name: str
    mode: str  # effective: off | shadow | canary | enforce
    stored_mode: str
    canary_percent: int
    state: RouteStateView
    decisions_per_s: float
    divergence_5m: DivergenceTotals | None
    gate: GateView | None
    local_policy: PolicyView | None = None
    distributed_policy: PolicyView | None = None
    rule: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def parse(cls, d: Any) -> RouteView:
        d = _d(d)
        rule = _d(d.get("rule"))
        return cls(
            name=_s(d.get("name"), "?"),
            mode=_s(d.get("mode"), "off"),
            stored_mode=_s(d.get("stored_mode"), _s(d.get("mode"), "off")),
            canary_percent=_i(d.get("canary_percent")),
            state=RouteStateView.parse(d.get("state")),
            decisions_per_s=_f(d.get("decisions_per_s")),
            divergence_5m=DivergenceTotals.parse(d.get("divergence_5m")),
            gate=GateView.parse(d.get("gate")),
            local_policy=PolicyView.parse(rule.get("local")),
            distributed_policy=PolicyView.parse(rule.get("distributed")),
            rule=rule,
        )

    @property
    def mode_label(self) -> str:
        return f"canary {self.canary_percent}%" if self.mode == "canary" else self.mode


@dataclass(frozen=True, slots=True)
class MinutePoint:
    minute: int
    agree: int
    local_allow_distributed_deny: int
    local_deny_distributed_allow: int
    compared: int
    backend_errors: int
    distributed_attempts: int

    @classmethod
    def parse(cls, d: Any) -> MinutePoint:
        d = _d(d)
        return cls(
            *(
                _i(d.get(k))
                for k in (
                    "minute",
                    "agree",
                    "local_allow_distributed_deny",
                    "local_deny_distributed_allow",
                    "compared",
                    "backend_errors",
                    "distributed_attempts",
                )
            )
        )

    @property
    def new_rejection_rate(self) -> float:
        return self.local_allow_distributed_deny / self.compared if self.compared else 0.0


@dataclass(frozen=True, slots=True)
class BlockedKey:
    key: str
    count: int
    last_request_id: str

    @classmethod
    def parse(cls, d: Any) -> BlockedKey:
        d = _d(d)
        return cls(_s(d.get("key")), _i(d.get("count")), _s(d.get("last_request_id")))


@dataclass(frozen=True, slots=True)
class RouteDivergence:
    totals: DivergenceTotals
    series: tuple[MinutePoint, ...]
    would_be_blocked: tuple[BlockedKey, ...]

    @classmethod
    def parse(cls, d: Any) -> RouteDivergence:
        d = _d(d)
        return cls(
            DivergenceTotals.parse(d.get("totals")) or DivergenceTotals(),
            tuple(MinutePoint.parse(p) for p in d.get("series") or ()),
            tuple(BlockedKey.parse(b) for b in d.get("would_be_blocked") or ()),
        )


@dataclass(frozen=True, slots=True)
class DivergenceView:
    minutes: int
    routes: dict[str, RouteDivergence]

    @classmethod
    def parse(cls, d: Any) -> DivergenceView | None:
        if not isinstance(d, dict):
            return None
        return cls(_i(d.get("minutes"), 60), {str(k): RouteDivergence.parse(v) for k, v in _d(d.get("routes")).items()})


@dataclass(frozen=True, slots=True)
class BucketSide:
    tokens: float
    limit: int
    exists: bool
    reset_after_us: int
    burst: int
    policy: PolicyView | None

    @classmethod
    def parse(cls, d: Any) -> BucketSide | None:
        if not isinstance(d, dict):
            return None
        return cls(
            _f(d.get("tokens")),
            _i(d.get("limit")),
            bool(d.get("exists")),
            _i(d.get("reset_after_us")),
            _i(d.get("burst"), _i(d.get("limit"))),
            PolicyView.parse(d.get("policy")),
        )


@dataclass(frozen=True, slots=True)
class LastDecision:
    at: float
    allowed: bool
    enforced_by: str

    @classmethod
    def parse(cls, d: Any) -> LastDecision | None:
        if not isinstance(d, dict):
            return None
        return cls(_f(d.get("at")), bool(d.get("allowed")), _s(d.get("enforced_by"), "local"))


@dataclass(frozen=True, slots=True)
class BucketView:
    route: str
    key: str
    recent_requests: int
    local: BucketSide | None
    distributed: BucketSide | None
    last_decision: LastDecision | None

    @classmethod
    def parse(cls, d: Any) -> BucketView:
        d = _d(d)
        return cls(
            _s(d.get("route")),
            _s(d.get("key")),
            _i(d.get("recent_requests")),
            BucketSide.parse(d.get("local")),
            BucketSide.parse(d.get("distributed")),
            LastDecision.parse(d.get("last_decision")),
        )


@dataclass(frozen=True, slots=True)
class BackendView:
    """The replica's circuit breaker, failure policy and fleet."""

    state: str = "closed"
    consecutive_failures: int = 0
    last_error: str | None = None
    next_probe_in_s: float | None = None
    probe_attempt: int = 0
    total_failures: int = 0
    opened_at: float | None = None
    failure_policy: str = ""
    failure_code: int = 429
    redis: str = ""
    live_instances: int = 1
    fleet: tuple[str, ...] = ()
    instance_id: str = ""
    shadow_queue: int = 0
    shadow_queue_capacity: int = 0
    shadow_dropped: int = 0
    shadow_evaluated: int = 0
    pending_rollbacks: tuple[str, ...] = ()
    distributed_enabled: bool = True

    @classmethod
    def parse(cls, d: Any) -> BackendView:
        d = _d(d)
        return cls(
            state=_s(d.get("state"), "closed"),
            consecutive_failures=_i(d.get("consecutive_failures")),
            last_error=_so(d.get("last_error")),
            next_probe_in_s=_fo(d.get("next_probe_in_s")),
            probe_attempt=_i(d.get("probe_attempt")),
            total_failures=_i(d.get("total_failures")),
            opened_at=_fo(d.get("opened_at")),
            failure_policy=_s(d.get("failure_policy")),
            failure_code=_i(d.get("failure_code"), 429),
            redis=_s(d.get("redis")),
            live_instances=_i(d.get("live_instances"), 1),
            fleet=tuple(str(m) for m in d.get("fleet") or ()),
            instance_id=_s(d.get("instance_id")),
            shadow_queue=_i(d.get("shadow_queue")),
            shadow_queue_capacity=_i(d.get("shadow_queue_capacity")),
            shadow_dropped=_i(d.get("shadow_dropped")),
            shadow_evaluated=_i(d.get("shadow_evaluated")),
            pending_rollbacks=tuple(str(r) for r in d.get("pending_rollbacks") or ()),
            distributed_enabled=bool(d.get("distributed_enabled", True)),
        )


@dataclass(frozen=True, slots=True)
class ExternalBreakerView:
    """One key's circuit breaker in front of a route's limits service."""

    route: str
    key: str
    state: str
    failures: int
    next_probe_in_s: float | None
    last_error: str | None

    @classmethod
    def parse(cls, d: Any) -> ExternalBreakerView:
        d = _d(d)
        return cls(
            _s(d.get("route")),
            _s(d.get("key")),
            _s(d.get("state"), "closed"),
            _i(d.get("failures")),
            _fo(d.get("next_probe_in_s")),
            _so(d.get("last_error")),
        )


@dataclass(frozen=True, slots=True)
class ExternalView:
    """Routes whose limits come from a limits service: breakers, cache, calls (``/v1/external``)."""

    routes: tuple[str, ...] = ()
    breakers_total: int = 0
    breakers_open: int = 0
    breakers_half_open: int = 0
    breakers: tuple[ExternalBreakerView, ...] = ()
    cache_enabled: bool = True
    cache_available: bool = True
    cache_hits: int = 0
    cache_misses: int = 0
    stale_used: int = 0
    hit_ratio: float | None = None
    calls_ok: int = 0
    calls_failed: int = 0
    static_fallbacks: int = 0

    @classmethod
    def parse(cls, d: Any) -> ExternalView | None:
        if not isinstance(d, dict):
            return None
        cache = _d(d.get("cache"))
        calls = {str(k): _i(v) for k, v in _d(d.get("calls")).items()}
        return cls(
            routes=tuple(_s(_d(r).get("route")) for r in d.get("routes") or ()),
            breakers_total=_i(d.get("breakers_total")),
            breakers_open=_i(d.get("breakers_open")),
            breakers_half_open=_i(d.get("breakers_half_open")),
            breakers=tuple(ExternalBreakerView.parse(b) for b in d.get("breakers") or ()),
            cache_enabled=bool(cache.get("enabled", True)),
            cache_available=bool(cache.get("available", True)),
            cache_hits=_i(cache.get("hit")),
            cache_misses=_i(cache.get("miss")),
            stale_used=_i(cache.get("stale")),
            hit_ratio=_fo(cache.get("hit_ratio")),
            calls_ok=calls.get("ok", 0),
            calls_failed=sum(v for k, v in calls.items() if k != "ok"),
            static_fallbacks=_i(_d(d.get("sources")).get("static")),
        )


@dataclass(frozen=True, slots=True)
class AuditEntryView:
    """One audited change: a mode change, rules reload, config change or reset."""

    kind: str
    route: str
    actor: str
    at: float
    from_mode: str
    to_mode: str
    from_percent: int = 0
    to_percent: int = 0
    reason: str = ""
    forced: bool = False
    automatic: bool = False
    gate: GateView | None = None
    id: str = ""

    @classmethod
    def parse(cls, d: Any) -> AuditEntryView:
        d = _d(d)
        return cls(
            kind=_s(d.get("kind"), "mode_change"),
            route=_s(d.get("route")),
            actor=_s(d.get("actor")),
            at=_f(d.get("at")),
            from_mode=_s(d.get("from")),
            to_mode=_s(d.get("to")),
            from_percent=_i(d.get("from_percent")),
            to_percent=_i(d.get("to_percent")),
            reason=_s(d.get("reason")),
            forced=bool(d.get("forced")),
            automatic=bool(d.get("automatic")),
            gate=GateView.parse(d.get("gate")),
            id=_s(d.get("id")),
        )

    @property
    def identity(self) -> tuple[str, str, str, int]:
        """Equal for the same change whether read from the audit trail or an event."""
        return (self.kind, self.route, self.to_mode, round(self.at * 1000))


@dataclass(frozen=True, slots=True)
class EventView:
    """A live event from the stream (mode change, breaker transition, rules reload, ...)."""

    seq: int
    at: float
    type: str
    route: str | None
    audit: AuditEntryView | None
    data: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def parse(cls, d: Any) -> EventView:
        d = _d(d)
        audit = d.get("audit")
        return cls(
            _i(d.get("seq")),
            _f(d.get("at")),
            _s(d.get("type"), "event"),
            _so(d.get("route")),
            AuditEntryView.parse(audit) if isinstance(audit, dict) else None,
            d,
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the dashboard shows, as of ``at`` (server time)."""

    at: float
    instance_id: str
    backend: BackendView
    routes: tuple[RouteView, ...]
    divergence: DivergenceView | None
    buckets: tuple[BucketView, ...]
    events: tuple[EventView, ...] = ()
    external: ExternalView | None = None

    @classmethod
    def parse(cls, d: Any) -> Snapshot:
        d = _d(d)
        return cls(
            at=_f(d.get("at")),
            instance_id=_s(d.get("instance_id")),
            backend=BackendView.parse(d.get("backend")),
            routes=tuple(RouteView.parse(r) for r in d.get("routes") or ()),
            divergence=DivergenceView.parse(d.get("divergence")),
            buckets=tuple(BucketView.parse(b) for b in d.get("buckets") or ()),
            events=tuple(EventView.parse(e) for e in d.get("events") or ()),
            external=ExternalView.parse(d.get("external")),
        )

    def route(self, name: str | None) -> RouteView | None:
        return next((r for r in self.routes if r.name == name), None)


@dataclass(frozen=True, slots=True)
class ModeChangeResult:
    """The server's answer to a mode change: the stored state, its audit entry, the gate."""

    route: str
    state: RouteStateView
    audit: AuditEntryView
    gate: GateView | None

    @classmethod
    def parse(cls, d: Any) -> ModeChangeResult:
        d = _d(d)
        return cls(
            _s(d.get("route")),
            RouteStateView.parse(d.get("state")),
            AuditEntryView.parse(d.get("audit")),
            GateView.parse(d.get("gate")),
        )


@dataclass(frozen=True, slots=True)
class ConnectionState:
    """The dashboard's link to the control plane (not server data: the app's own view)."""

    status: str  # connecting | live | stale | fixed
    url: str
    has_token: bool
    instance_id: str = ""
    data_at: float | None = None  # server time of the data on screen
    retry_in_s: float | None = None
    error: str | None = None
    hint: str | None = None
