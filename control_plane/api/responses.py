"""The response models of the read and admin endpoints, for OpenAPI.

The endpoints build their answers as dicts (the read models in :mod:`.readmodels`, the
engine's snapshots) and return them as they are: these models only declare their shape in
``/openapi.json`` (see :func:`control_plane.api.openapi.ok`), they never filter, reorder
or convert a field on the way out. Parts owned by other modules (a rule's summary, the
gate's figures, the external limits' routes) allow extra fields, so a new field there is
documented by its module without breaking the schema. ``tests/e2e/test_api_schema.py``
checks real answers against these models.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Mode = Literal["off", "shadow", "canary", "enforce"]
BreakerStateName = Literal["closed", "open", "half_open"]


class _Open(BaseModel):
    """A part whose producer may add fields."""

    model_config = ConfigDict(extra="allow")


# -- shared parts -------------------------------------------------------------------------


class PolicyView(_Open):
    algorithm: str = Field(description="token_bucket, gcra, fixed_window, sliding_window or sliding_log")
    average: float = Field(description="Tokens per period; 0 = unlimited.")
    period: float = Field(description="Seconds.")
    burst: int


class RouteStateView(BaseModel):
    mode: Mode
    canary_percent: int
    updated_at: float = Field(description="Unix seconds; 0 for a route never changed.")
    updated_by: str
    reason: str
    version: int


class GateView(_Open):
    """The promotion gate's verdict and the figures it used."""

    target: Mode | None = Field(None, description="The next step's mode (route listings only).")
    passed: bool
    required: bool = Field(description="False when the change is not a promotion (no gate).")
    reasons: list[str] = Field(description="Why it did not pass.")
    window_s: int | None = None
    compared: int | None = None
    min_samples: int | None = None
    new_rejections: int | None = None
    new_rejection_rate: float | None = None
    max_new_rejection_rate: float | None = None
    backend_errors: int | None = None
    backend_error_rate: float | None = None
    max_backend_error_rate: float | None = None
    shadow_dropped: int | None = None
    sampled_share: float | None = None
    min_sampled_share: float | None = None


class AuditEntryView(_Open):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    id: str
    kind: Literal["mode_change", "rules_reload", "config_change", "reset", "restore", "candidate", "plan"]
    route: str
    actor: str = Field(description="The token's name and the caller's address, e.g. alice@10.0.0.7.")
    at: float = Field(description="Unix seconds.")
    from_: str = Field(alias="from")
    to: str
    from_percent: int
    to_percent: int
    reason: str
    forced: bool
    automatic: bool
    gate: GateView | None


_UNITS = "Budget routes: what the %s requests cost: actual where settled, else the estimate or cost."
_ESTIMATED = "Of %s, the part still at an estimate (reservations not settled)."


class DivergenceCounts(_Open):
    agree: int
    local_allow_distributed_deny: int
    local_deny_distributed_allow: int
    compared: int
    backend_errors: int
    distributed_attempts: int
    shadow_dropped: int
    cause_replicas: int = Field(0, description="New rejections the reference (the old limit fleet-wide) makes too.")
    cause_tighter: int = Field(0, description="New rejections the reference admits: the global limit is stricter.")
    cause_fresh_local: int = Field(0, description="New rejections on a replica's bucket made after a restart.")
    cause_clock: int = Field(0, description="New rejections on a replica whose clock is off from Redis'.")
    cause_uneven: int = Field(0, description="Reverse divergences within what the fleet's local limits give.")
    cause_looser: int = Field(0, description="Reverse divergences under a global limit above the fleet's.")
    # budget routes: what the compared requests cost (the route's cost_unit), and the part of it
    # still at an estimate (reservations not settled); actual costs where settled
    units_agree: int = Field(0, description=_UNITS % "agreeing")
    units_local_allow_distributed_deny: int = Field(0, description=_UNITS % "newly rejected")
    units_local_deny_distributed_allow: int = Field(0, description=_UNITS % "reverse")
    units_estimated_agree: int = Field(0, description=_ESTIMATED % "units_agree")
    units_estimated_local_allow_distributed_deny: int = Field(0, description=_ESTIMATED % "units_local_allow_...")
    units_estimated_local_deny_distributed_allow: int = Field(0, description=_ESTIMATED % "units_local_deny_...")


class DivergenceTotals(DivergenceCounts):
    minutes: int
    new_rejection_rate: float
    reverse_rate: float
    backend_error_rate: float
    sampled_share: float | None = Field(description="Share of decisions the distributed limiter evaluated.")


class MinuteCounts(DivergenceCounts):
    minute: int = Field(description="The minute's start, Unix seconds.")


class BlockedKey(_Open):
    key: str
    count: int
    last_request_id: str | None = None
    cause: str | None = Field(
        None,
        description="The main cause of the key's new rejections (replicas, tighter, fresh_local, clock); null:"
        " not explained.",
    )
    units: int | None = Field(None, description="Budget routes: what its new rejections cost (estimates); else null.")


class CauseShares(BaseModel):
    total: int = Field(description="Divergent decisions in this direction over the window.")
    by_cause: dict[str, int]
    unexplained: int = Field(description="Divergent decisions without a cause (explain: false, enforce, a failure).")
    shares: dict[str, float] = Field(description="Each cause's share of total.")
    summary: str = Field(description='The shares in words: "74% the fleet multiplied the old limit · ..."')


class DivergenceCauses(BaseModel):
    """Why the route's local and global limits disagree (docs/rollout-runbook.md#why-they-disagree)."""

    explain: bool = Field(description="The route's explain setting in the rules.")
    meaning: dict[str, str] = Field(description="Each cause in words.")
    new_rejections: CauseShares = Field(description="New rejections: replicas, tighter, fresh_local, clock.")
    reverse: CauseShares = Field(description="The reverse divergences: uneven, looser.")


class Adjustment(_Open):
    route: str
    key: str | None
    local: PolicyView | None = None
    distributed: PolicyView | None = None


# -- /v1/routes and the rollout ------------------------------------------------------------


class RuleView(_Open):
    """A route's rule as the rules file (or the Envoy configuration) gives it."""

    name: str
    methods: list[str] | None = None
    path: str | None = None
    key: dict[str, Any]
    local: PolicyView
    distributed: PolicyView


class NextStep(BaseModel):
    mode: Mode
    canary_percent: int


class LimitView(_Open):
    """A route's global limit in force and the rules' (different after a runtime adjustment,
    a promoted candidate's included)."""

    in_force: PolicyView
    rules: PolicyView
    adjusted: bool
    describe: str


class CandidateTotals(_Open):
    agree: int
    newly_rejected: int = Field(description="The current limit admits, the candidate would refuse.")
    newly_admitted: int = Field(description="The current limit refuses, the candidate would admit.")
    errors: int = Field(description="Evaluations that failed (Redis).")
    dropped: int = Field(description="Evaluations dropped (the shadow queue was full).")
    compared: int
    newly_rejected_share: float
    newly_admitted_share: float
    sampled_share: float | None


class CandidateMinute(_Open):
    minute: int = Field(description="The minute's start, Unix seconds.")
    agree: int
    newly_rejected: int
    newly_admitted: int
    errors: int
    dropped: int


class CandidateSummary(_Open):
    """A route's candidate limit, compared in shadow with the current one since ``since``."""

    id: str
    policy: PolicyView
    describe: str
    since: float = Field(description="Unix seconds.")
    age_s: float | None = None
    actor: str
    reason: str
    totals: CandidateTotals | None = Field(description="Fleet-wide; null until the views have read them.")
    gate: GateView | None = Field(description="The gate of its promotion, evaluated now.")


class CandidateDetail(CandidateSummary):
    series: list[CandidateMinute] = Field(description="Per minute since it was set, oldest first.")
    would_be_blocked: list[BlockedKey] = Field(description="The keys it would newly reject, most first.")


class RouteView(_Open):
    name: str
    mode: Mode = Field(description="The effective mode (off while the kill switch is off).")
    stored_mode: Mode
    canary_percent: int
    state: RouteStateView
    rule: RuleView
    decisions_per_s: float
    deadline_answers: dict[str, int] = Field(
        description="This replica's answers by the failure policy for want of time: Redis did not answer"
        " within the caller's deadline (redis_timeout), or too little was left to ask it (no_time)."
    )
    divergence_5m: DivergenceTotals | None
    next_step: NextStep | None = Field(
        description="The runbook's next step for the route (off -> shadow -> canary 10/25/50% -> enforce);"
        " null once enforced."
    )
    gate: GateView | None = Field(
        description="The gate of the route's next step, evaluated now; null when that step is not gated"
        " (off -> shadow) or there is none (enforced)."
    )
    figures_age_s: float | None
    limit: LimitView
    candidate: CandidateSummary | None = Field(description="The route's candidate limit; null without one.")
    plan: PlanSummary | None = Field(None, description="The route's rollout plan; null without one.")


class RoutesList(BaseModel):
    routes: list[RouteView]
    distributed_enabled: bool
    rules_source: str | None
    rules_error: str | None
    figures_age_s: float | None
    figures_error: str | None


class ModeChanged(BaseModel):
    route: str
    state: RouteStateView
    audit: AuditEntryView
    gate: GateView


class CandidateChanged(BaseModel):
    route: str
    candidate: CandidateSummary | None = Field(description="The candidate in force now; null once dropped.")
    audit: AuditEntryView


class CandidatePromoted(BaseModel):
    route: str
    limit: PolicyView = Field(description="The route's global limit now (a runtime adjustment).")
    adjustment: AuditEntryView = Field(description="The runtime adjustment's audit entry.")
    audit: AuditEntryView = Field(description="The candidate's audit entry (promoted, with the gate).")
    gate: GateView


class AuditTrail(BaseModel):
    entries: list[AuditEntryView]


# -- observe -------------------------------------------------------------------------------


class UnitsPart(BaseModel):
    requests: int
    units: int = Field(description="What they cost: actual where settled, else the estimate or the cost.")
    estimated: int = Field(description="Of units, the part still at an estimate (reservations not settled).")


class DivergenceUnits(BaseModel):
    """A budget route's divergence in its cost_unit (control_plane/model/units.py)."""

    unit: str = Field(description="The route's cost_unit (units when it names none).")
    agree: UnitsPart
    new_rejections: UnitsPart
    reverse: UnitsPart
    summary: str = Field(description='In words: "would have refused 14 requests worth 2.1M tokens".')


class RouteDivergence(BaseModel):
    totals: DivergenceTotals
    series: list[MinuteCounts]
    would_be_blocked: list[BlockedKey]
    causes: DivergenceCauses
    units: DivergenceUnits | None = Field(None, description="Budget routes: the divergence in cost; null else.")
    candidate: CandidateDetail | None = Field(
        None, description="The route's candidate limit against its current one; null without one."
    )


class DivergenceReport(BaseModel):
    minutes: int
    routes: dict[str, RouteDivergence]
    as_of: float | None
    age_s: float | None
    error: str | None


class BucketState(_Open):
    tokens: float
    limit: int
    exists: bool
    reset_after_us: int


class LimiterBucket(BucketState):
    burst: int
    policy: PolicyView
    reserved: int | None = Field(None, description="Budget routes: the estimates of its reservations outstanding.")
    debt: float | None = Field(None, description="Budget routes: how far below zero its balance is (0: none).")


class LastDecision(BaseModel):
    at: float
    allowed: bool
    enforced_by: str


class BucketEntry(BaseModel):
    route: str
    key: str
    recent_requests: int
    local: LimiterBucket
    distributed: LimiterBucket | None
    last_decision: LastDecision | None
    unit: str | None = Field(None, description="Budget routes: what tokens, reserved and debt count (cost_unit).")


class BucketsList(BaseModel):
    buckets: list[BucketEntry]


class BackendReport(_Open):
    state: BreakerStateName
    consecutive_failures: int
    last_error: str | None
    last_failure_at: float | None
    opened_at: float | None
    next_probe_in_s: float | None
    probe_attempt: int
    total_failures: int
    transitions: int
    failure_policy: str
    failure_code: int
    redis: str
    redis_topology: dict[str, Any]
    time_source: str
    clock: dict[str, Any] = Field(
        description="This replica's clock against Redis' TIME: offset_ms (this clock minus Redis'), round_trip_ms,"
        " tolerance_ms (SHADOWLIMIT_CLOCK_SKEW_TOLERANCE_MS), past_tolerance, measured_at_us, error."
    )
    live_instances: int
    fleet: list[str]
    instance_id: str
    fallback_decisions: int
    backend_errors: int
    shadow_queue: int
    shadow_queue_capacity: int
    shadow_dropped: int
    shadow_evaluated: int
    deadline_answers: dict[str, int] = Field(
        description="Answers by the failure policy for want of time, all routes: redis_timeout, no_time."
    )
    over_limit_cache: dict[str, int] | None = Field(
        description="Keys over their global limit answered without Redis (enforce): keys, max_keys, hits,"
        " stored; null when SHADOWLIMIT_OVER_LIMIT_CACHE_KEYS is 0."
    )
    auto_rollback_after_s: float | None
    pending_rollbacks: list[str]
    distributed_enabled: bool


class ExternalCache(_Open):
    enabled: bool
    available: bool
    hit: int
    miss: int
    stale: int
    hit_ratio: float | None
    errors: int


class ExternalRoute(_Open):
    route: str


class ExternalBreaker(_Open):
    route: str
    key: str
    state: BreakerStateName
    failures: int
    next_probe_in_s: float | None
    last_error: str | None


class ExternalReport(_Open):
    instance_id: str
    routes: list[ExternalRoute]
    breakers: list[ExternalBreaker]
    breakers_total: int
    breakers_open: int
    breakers_half_open: int
    cache: ExternalCache
    calls: dict[str, int]
    errors: dict[str, int]
    sources: dict[str, int]
    shared_calls: int
    breaker_transitions: dict[str, int]
    backend_hosts: list[str]
    backend_url_rejected: int


# -- the admin API (/ratelimit) ------------------------------------------------------------


class AllowedDenied(BaseModel):
    allowed: int
    denied: int


class Stats(_Open):
    instance_id: str
    uptime_s: float
    requests: dict[str, AllowedDenied] = Field(description="Per limiter: local, distributed.")
    exceeded: dict[str, int] = Field(description="Per limiter: local, distributed, failure_policy.")
    active_clients: dict[str, int]
    routes: dict[str, str] = Field(description="Each route's mode (canary with its percent).")
    shadow: dict[str, int]
    backend: dict[str, Any]
    adjustments: list[Adjustment]


class ClientEntry(BaseModel):
    route: str
    key: str
    algorithm: str
    last_seen_us: int
    local: BucketState | None


class ClientsList(BaseModel):
    clients: list[ClientEntry]
    total: int


class ResetResult(BaseModel):
    id: str
    routes: list[str]
    local_reset: int
    distributed_reset: int


class ConfigResult(BaseModel):
    adjustments: list[Adjustment]
    audit: AuditEntryView


class RulesReloaded(BaseModel):
    routes: list[str]
    digest: str
    source: str | None


# -- health --------------------------------------------------------------------------------


class Health(BaseModel):
    status: Literal["ok"]
    instance_id: str


class RedisHealth(_Open):
    reachable: bool
    scripts: bool
    error: str | None = None


class RulesHealth(BaseModel):
    source: str | None
    error: str | None


class Readiness(_Open):
    status: Literal["ready", "not_ready"]
    can_decide: bool
    reasons: list[str]
    requires_redis: bool
    redis: RedisHealth
    breaker: BreakerStateName
    failure_policy: str
    rules: RulesHealth
    instance_id: str


# -- rollout plans (control_plane/api/plan_views.py) ----------------------------------------------


class PlanCheckView(_Open):
    """One check of a plan's analysis."""

    name: str
    value: float | None = Field(description="The check's value now (null: none, e.g. Prometheus unreachable).")
    threshold: str = Field(description='">= 500", "<= 1%", "<= 0.01".')
    outcome: Literal["pass", "fail", "inconclusive", "refused"]
    reason: str = Field(description="Why it did not pass (empty when it did).")


class PlanSummary(_Open):
    """A route's rollout plan: where it stands and what it waits for."""

    source: Literal["rules", "api"] = Field(description="The rules file's plan, or one set through the API.")
    state: Literal["running", "waiting", "paused", "waiting_for_approval", "completed", "aborted"]
    step: int = Field(description="The current step, from 1.")
    steps: int
    current: str = Field(description='The current step: "shadow", "canary 10%", "approve", "enforce".')
    labels: list[str] = Field(description="Every step, in order.")
    describe: str
    in_step_s: float | None
    time_left_s: float | None = Field(description="The step's time still to hold (running plans).")
    waits_for: str | None = Field(description="What the plan waits for; null once completed or aborted.")
    reason: str = Field(description="Why the plan is in its state (its last change).")
    verdict: Literal["pass", "fail", "inconclusive", "refused"] | None = Field(
        description="The last analysis of the current step; null before the first."
    )
    first_problem: PlanCheckView | None = Field(description="The first failing, refused or missing check.")


class PlanDetail(PlanSummary):
    """A route's rollout plan with every step, every check and the last outcomes."""

    route: str
    plan: dict[str, Any] = Field(description="The plan: steps, analysis, on_failure.")
    step_list: list[dict[str, Any]] = Field(
        description="Every step: index, step, label, describe, percent, for_s, status (passed, current, pending),"
        " started_at, last_event."
    )
    checks: list[PlanCheckView] = Field(
        description="The last analysis' checks (of the current step while the plan runs; the one that stopped it"
        " otherwise)."
    )
    analysed_at: float | None
    analysed_step: int | None = Field(description="The step that analysis judged, from 1.")
    recent: list[dict[str, Any]] = Field(description="The last analyses' outcomes: at, step, verdict, reason.")
    history: list[dict[str, Any]] = Field(description="The steps' events: step, at, event, note.")
    driver: str | None = Field(description="The replica driving the plans (its lease).")
    version: int
    updated_at: float | None
    updated_by: str | None


class PlanChanged(BaseModel):
    route: str
    plan: PlanDetail | None = Field(description="The route's plan now (the rules file's after a delete; null: none).")
    audit: AuditEntryView | None
