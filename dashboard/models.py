"""Typed, immutable views of the control plane's JSON, parsed in one place.

Widgets render only these objects; nothing here does IO. Parsing is lenient (missing
fields get neutral defaults) so a newer control plane with extra or fewer fields still
renders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .backend_views import BackendView, ExternalBreakerView, ExternalView
from .coerce import as_dict, as_float, as_int, as_str, opt_float, opt_str
from .limit_views import (
    BlockedKey,
    CandidatePoint,
    CandidateTotals,
    CandidateView,
    GateView,
    LimitView,
    PolicyView,
)
from .plan_views import PlanChange, PlanCheckView, PlanView

__all__ = [
    "AuditEntryView",
    "BackendView",
    "BlockedKey",
    "BucketSide",
    "BucketView",
    "CandidateChange",
    "CandidatePoint",
    "CandidateTotals",
    "CandidateView",
    "CauseShares",
    "CausesView",
    "ConnectionState",
    "DivergenceTotals",
    "DivergenceView",
    "EventView",
    "ExternalBreakerView",
    "ExternalView",
    "GateView",
    "LastDecision",
    "LimitView",
    "MinutePoint",
    "ModeChangeResult",
    "PlanChange",
    "PlanCheckView",
    "PlanView",
    "PolicyView",
    "RouteDivergence",
    "RouteStateView",
    "RouteView",
    "Snapshot",
]


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
            as_int(d.get("agree")),
            as_int(d.get("local_allow_distributed_deny")),
            as_int(d.get("local_deny_distributed_allow")),
            as_int(d.get("compared")),
            as_int(d.get("backend_errors")),
            as_int(d.get("distributed_attempts")),
            as_float(d.get("new_rejection_rate")),
            as_float(d.get("reverse_rate")),
            as_float(d.get("backend_error_rate")),
            as_int(d.get("shadow_dropped")),
            opt_float(d.get("sampled_share")),
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
class RouteStateView:
    mode: str = "shadow"
    canary_percent: int = 0
    updated_at: float = 0.0
    updated_by: str = ""
    reason: str = ""
    version: int = 0

    @classmethod
    def parse(cls, d: Any) -> RouteStateView:
        d = as_dict(d)
        return cls(
            as_str(d.get("mode"), "shadow"),
            as_int(d.get("canary_percent")),
            as_float(d.get("updated_at")),
            as_str(d.get("updated_by")),
            as_str(d.get("reason")),
            as_int(d.get("version")),
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
    limit: LimitView | None = None  # the global limit in force against the rules' (None: not sent)
    candidate: CandidateView | None = None
    plan: PlanView | None = None  # its rollout plan (None: none, or not sent)

    @classmethod
    def parse(cls, d: Any) -> RouteView:
        d = as_dict(d)
        rule = as_dict(d.get("rule"))
        return cls(
            name=as_str(d.get("name"), "?"),
            mode=as_str(d.get("mode"), "off"),
            stored_mode=as_str(d.get("stored_mode"), as_str(d.get("mode"), "off")),
            canary_percent=as_int(d.get("canary_percent")),
            state=RouteStateView.parse(d.get("state")),
            decisions_per_s=as_float(d.get("decisions_per_s")),
            divergence_5m=DivergenceTotals.parse(d.get("divergence_5m")),
            gate=GateView.parse(d.get("gate")),
            local_policy=PolicyView.parse(rule.get("local")),
            distributed_policy=PolicyView.parse(rule.get("distributed")),
            rule=rule,
            limit=LimitView.parse(d.get("limit")),
            candidate=CandidateView.parse(d.get("candidate")),
            plan=PlanView.parse(d.get("plan")),
        )

    @property
    def adjusted(self) -> bool:
        """The global limit in force is not the rules file's (an adjustment, a promoted candidate)."""
        return self.limit is not None and self.limit.adjusted and self.limit.in_force is not None

    @property
    def global_policy(self) -> PolicyView | None:
        """The global limit in force: the adjusted one when there is one, else the rules'."""
        if self.limit is not None and self.limit.in_force is not None:
            return self.limit.in_force
        return self.distributed_policy


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
        d = as_dict(d)
        return cls(
            *(
                as_int(d.get(k))
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


@dataclass(frozen=True, slots=True, kw_only=True)
class CauseShares:
    """One direction's divergent decisions by cause, as the server counted them: how many,
    how many it could not explain, and the shares in its words (``summary``: "74% the fleet
    multiplied the old limit · 26% the new limit is tighter")."""

    total: int = 0
    unexplained: int = 0
    summary: str = ""

    @classmethod
    def parse(cls, d: Any) -> CauseShares:
        d = as_dict(d)
        return cls(
            total=as_int(d.get("total")), unexplained=as_int(d.get("unexplained")), summary=as_str(d.get("summary"))
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CausesView:
    """Why a route's local and global limits disagree (docs/rollout-runbook.md#why-they-disagree):
    its new rejections and its reverse divergences by cause; ``explain``: the route's setting."""

    explain: bool = True
    new_rejections: CauseShares = CauseShares()
    reverse: CauseShares = CauseShares()

    @classmethod
    def parse(cls, d: Any) -> CausesView | None:
        """None for a control plane that does not send causes."""
        if not isinstance(d, dict):
            return None
        return cls(
            explain=d.get("explain") is not False,
            new_rejections=CauseShares.parse(d.get("new_rejections")),
            reverse=CauseShares.parse(d.get("reverse")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitsView:
    """A budget route's divergence in its cost unit (``/v1/divergence``'s ``units``): the new
    rejections, what they cost, how much of it is still an estimate, and the same in words."""

    unit: str
    requests: int
    units: int
    estimated: int
    summary: str

    @classmethod
    def parse(cls, d: Any) -> UnitsView | None:
        if not isinstance(d, dict):
            return None
        new = as_dict(d.get("new_rejections"))
        return cls(
            unit=as_str(d.get("unit"), "units"),
            requests=as_int(new.get("requests")),
            units=as_int(new.get("units")),
            estimated=as_int(new.get("estimated")),
            summary=as_str(d.get("summary")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteDivergence:
    totals: DivergenceTotals
    series: tuple[MinutePoint, ...]
    would_be_blocked: tuple[BlockedKey, ...]
    candidate: CandidateView | None = None  # with its series and the keys it would newly reject
    causes: CausesView | None = None  # None: not sent (an older control plane)
    units: UnitsView | None = None  # a budget route's figures in its cost unit

    @classmethod
    def parse(cls, d: Any) -> RouteDivergence:
        d = as_dict(d)
        return cls(
            totals=DivergenceTotals.parse(d.get("totals")) or DivergenceTotals(),
            series=tuple(MinutePoint.parse(p) for p in d.get("series") or ()),
            would_be_blocked=tuple(BlockedKey.parse(b) for b in d.get("would_be_blocked") or ()),
            candidate=CandidateView.parse(d.get("candidate")),
            causes=CausesView.parse(d.get("causes")),
            units=UnitsView.parse(d.get("units")),
        )


@dataclass(frozen=True, slots=True)
class DivergenceView:
    minutes: int
    routes: dict[str, RouteDivergence]

    @classmethod
    def parse(cls, d: Any) -> DivergenceView | None:
        if not isinstance(d, dict):
            return None
        return cls(
            as_int(d.get("minutes"), 60),
            {str(k): RouteDivergence.parse(v) for k, v in as_dict(d.get("routes")).items()},
        )


@dataclass(frozen=True, slots=True)
class BucketSide:
    tokens: float
    limit: int
    exists: bool
    reset_after_us: int
    burst: int
    policy: PolicyView | None
    reserved: int | None = None  # a budget route's: its reservations outstanding (None: not a budget, or unread)
    debt: float = 0.0  # a budget route's: how far below zero its balance is

    @classmethod
    def parse(cls, d: Any) -> BucketSide | None:
        if not isinstance(d, dict):
            return None
        return cls(
            as_float(d.get("tokens")),
            as_int(d.get("limit")),
            bool(d.get("exists")),
            as_int(d.get("reset_after_us")),
            as_int(d.get("burst"), as_int(d.get("limit"))),
            PolicyView.parse(d.get("policy")),
            None if d.get("reserved") is None else as_int(d.get("reserved")),
            as_float(d.get("debt")),
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
        return cls(as_float(d.get("at")), bool(d.get("allowed")), as_str(d.get("enforced_by"), "local"))


@dataclass(frozen=True, slots=True)
class BucketView:
    route: str
    key: str
    recent_requests: int
    local: BucketSide | None
    distributed: BucketSide | None
    last_decision: LastDecision | None
    unit: str | None = None  # a budget route's cost unit: what tokens, reserved and debt count

    @classmethod
    def parse(cls, d: Any) -> BucketView:
        d = as_dict(d)
        return cls(
            as_str(d.get("route")),
            as_str(d.get("key")),
            as_int(d.get("recent_requests")),
            BucketSide.parse(d.get("local")),
            BucketSide.parse(d.get("distributed")),
            LastDecision.parse(d.get("last_decision")),
            opt_str(d.get("unit")),
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
        d = as_dict(d)
        return cls(
            kind=as_str(d.get("kind"), "mode_change"),
            route=as_str(d.get("route")),
            actor=as_str(d.get("actor")),
            at=as_float(d.get("at")),
            from_mode=as_str(d.get("from")),
            to_mode=as_str(d.get("to")),
            from_percent=as_int(d.get("from_percent")),
            to_percent=as_int(d.get("to_percent")),
            reason=as_str(d.get("reason")),
            forced=bool(d.get("forced")),
            automatic=bool(d.get("automatic")),
            gate=GateView.parse(d.get("gate")),
            id=as_str(d.get("id")),
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
        d = as_dict(d)
        audit = d.get("audit")
        return cls(
            as_int(d.get("seq")),
            as_float(d.get("at")),
            as_str(d.get("type"), "event"),
            opt_str(d.get("route")),
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
        d = as_dict(d)
        return cls(
            at=as_float(d.get("at")),
            instance_id=as_str(d.get("instance_id")),
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
        d = as_dict(d)
        return cls(
            as_str(d.get("route")),
            RouteStateView.parse(d.get("state")),
            AuditEntryView.parse(d.get("audit")),
            GateView.parse(d.get("gate")),
        )


@dataclass(frozen=True, slots=True)
class CandidateChange:
    """The server's answer to setting, dropping or promoting a candidate: the candidate now
    (``None`` after a drop or a promotion), the audit entry; after a promotion also the
    route's new global limit, the adjustment's audit entry and the gate it passed (or was
    forced past)."""

    route: str
    candidate: CandidateView | None
    audit: AuditEntryView
    limit: PolicyView | None = None
    adjustment: AuditEntryView | None = None
    gate: GateView | None = None

    @classmethod
    def parse(cls, d: Any) -> CandidateChange:
        d = as_dict(d)
        adjustment = d.get("adjustment")
        return cls(
            as_str(d.get("route")),
            CandidateView.parse(d.get("candidate")),
            AuditEntryView.parse(d.get("audit")),
            PolicyView.parse(d.get("limit")),
            AuditEntryView.parse(adjustment) if isinstance(adjustment, dict) else None,
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


@dataclass(frozen=True, slots=True)
class ReplayView:
    """One what-if replay's figures (counts scaled by the recording's sampling)."""

    policy: str
    requests: float
    rejections: float
    reject_share: float
    top_keys: tuple[tuple[str, float, float], ...]  # (key, requests, rejections)

    @classmethod
    def parse(cls, d: Any) -> ReplayView:
        d = as_dict(d)
        keys = []
        for k in d.get("top_keys") or ():
            k = as_dict(k)
            keys.append((as_str(k.get("key"), "?"), as_float(k.get("requests")), as_float(k.get("rejections"))))
        return cls(
            as_str(d.get("policy_describe"), "?"),
            as_float(d.get("requests")),
            as_float(d.get("rejections")),
            as_float(d.get("reject_share")),
            tuple(keys),
        )


@dataclass(frozen=True, slots=True)
class WhatIfView:
    """``POST /v1/whatif``'s answer: the candidate's replay next to the current policy's."""

    route: str
    minutes: int
    minutes_recorded: int
    recorded_share: float
    candidate: ReplayView
    current: ReplayView

    @classmethod
    def parse(cls, d: Any) -> WhatIfView:
        d = as_dict(d)
        return cls(
            as_str(d.get("route"), "?"),
            as_int(d.get("minutes")),
            as_int(d.get("minutes_recorded")),
            as_float(d.get("recorded_share")),
            ReplayView.parse(d.get("candidate")),
            ReplayView.parse(d.get("current")),
        )
