"""Rollout decisions, pure: modes, canary assignment, divergence classes, promotion gates.

Nothing here does IO. The engine asks these functions what to do and the store
persists the answers.

Modes (the rollout plan, per route; docs/rollout-runbook.md)::

    off      local decision only
    shadow   local decision enforced; distributed evaluated off the hot path and compared
    canary   a stable share of keys (by key hash) enforced by the distributed decision
    enforce  distributed decision enforced; local still computed and compared
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

__all__ = [
    "CANARY_STEPS",
    "GATE_COUNTS",
    "AuditEntry",
    "Divergence",
    "GateConfig",
    "GateResult",
    "GateStats",
    "Mode",
    "RouteState",
    "canary_bucket",
    "classify",
    "enforced_by_distributed",
    "evaluate_gate",
    "figure_problems",
    "next_step",
]


class Mode(str, Enum):
    OFF = "off"
    SHADOW = "shadow"
    CANARY = "canary"
    ENFORCE = "enforce"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Mode.OFF: 0, Mode.SHADOW: 1, Mode.CANARY: 2, Mode.ENFORCE: 3}

#: the runbook's canary percentages: shadow -> canary 10% -> 25% -> 50% -> enforce
CANARY_STEPS = (10, 25, 50)


class Divergence(str, Enum):
    AGREE = "agree"
    LOCAL_ALLOW_DISTRIBUTED_DENY = "local_allow_distributed_deny"
    LOCAL_DENY_DISTRIBUTED_ALLOW = "local_deny_distributed_allow"


def classify(local_allowed: bool, distributed_allowed: bool) -> Divergence:
    """Compare one pair of decisions. ``local_allow_distributed_deny`` are the requests
    that enforcement would newly reject."""
    if local_allowed == distributed_allowed:
        return Divergence.AGREE
    if local_allowed:
        return Divergence.LOCAL_ALLOW_DISTRIBUTED_DENY
    return Divergence.LOCAL_DENY_DISTRIBUTED_ALLOW


def canary_bucket(route: str, key: str) -> int:
    """A stable number in [0, 100) for (route, key): the same key always lands in the
    same bucket on every replica, so a canary share is a stable set of clients."""
    h = hashlib.blake2b(f"{route}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") % 100


def enforced_by_distributed(mode: Mode, canary_percent: int, route: str, key: str) -> bool:
    if mode is Mode.ENFORCE:
        return True
    if mode is Mode.CANARY:
        return canary_bucket(route, key) < canary_percent
    return False


@dataclass(frozen=True, slots=True)
class RouteState:
    """A route's rollout state as stored in Redis."""

    mode: Mode = Mode.SHADOW
    canary_percent: int = 0
    updated_at: float = 0.0
    updated_by: str = "default"
    reason: str = ""
    version: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "canary_percent": self.canary_percent,
            "updated_at": self.updated_at,
            "updated_by": self.updated_by,
            "reason": self.reason,
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RouteState:
        return cls(
            mode=Mode(d.get("mode", "shadow")),
            canary_percent=int(d.get("canary_percent", 0)),
            updated_at=float(d.get("updated_at", 0.0)),
            updated_by=str(d.get("updated_by", "")),
            reason=str(d.get("reason", "")),
            version=int(d.get("version", 0)),
        )

    def label(self) -> str:
        return f"canary {self.canary_percent}%" if self.mode is Mode.CANARY else self.mode.value


def next_step(state: RouteState) -> tuple[Mode, int] | None:
    """The runbook's next step from ``state``: off -> shadow -> canary 10% -> 25% -> 50%
    -> enforce (a canary between two steps goes to the next larger one); None once enforced."""
    if state.mode is Mode.OFF:
        return Mode.SHADOW, 0
    if state.mode is Mode.SHADOW:
        return Mode.CANARY, CANARY_STEPS[0]
    if state.mode is Mode.CANARY:
        larger = [p for p in CANARY_STEPS if p > state.canary_percent]
        return (Mode.CANARY, larger[0]) if larger else (Mode.ENFORCE, 0)
    return None


AuditKind = Literal["mode_change", "rules_reload", "config_change", "reset", "restore", "candidate", "plan"]
"""What an audit entry records (``plan``: a rollout plan set, removed, paused, resumed, ... without a mode change)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEntry:
    """One rollout change: who, when, from, to, why, and the gate figures at the time."""

    route: str
    actor: str
    from_mode: str
    to_mode: str
    reason: str
    at: float  # wall-clock seconds (the caller's clock)
    from_percent: int = 0
    to_percent: int = 0
    forced: bool = False
    automatic: bool = False
    gate: dict[str, Any] | None = None
    kind: AuditKind = "mode_change"
    id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "route": self.route,
            "actor": self.actor,
            "at": self.at,
            "from": self.from_mode,
            "to": self.to_mode,
            "from_percent": self.from_percent,
            "to_percent": self.to_percent,
            "reason": self.reason,
            "forced": self.forced,
            "automatic": self.automatic,
            "gate": self.gate,
        }


#: which new rejections the gate's ``max_new_rejection_rate`` counts: every one, or only
#: those not explained as something else than a tighter limit (:data:`GateStats.excused`)
GATE_COUNTS = ("all", "tighter")
#: what the gate's new-rejection rate weighs: each request as one, or (a route with a budget) what
#: each cost, in its cost_unit (:meth:`GateStats.counted_rate`)
GATE_WEIGHTS = ("requests", "cost")


@dataclass(frozen=True, slots=True, kw_only=True)
class GateConfig:
    """Promotion thresholds (defaults: >= 500 compared decisions in 5 minutes, new
    rejections <= 1%, backend errors <= 0.1%, and >= 90% of the decisions evaluated by
    the distributed limiter -- a shadow queue that dropped more makes the figures a
    sample biased toward quiet moments, when nothing is rejected -- and at least
    ``min_dwell_s`` (10 minutes) in the current step since it was set). ``counts``: which
    new rejections ``max_new_rejection_rate`` counts (:data:`GATE_COUNTS`; ``tighter``
    leaves out those excused, :attr:`GateStats.excused`); ``weight``: what the rate weighs
    (:data:`GATE_WEIGHTS`: ``cost``, the share of the compared requests' cost that the new
    rejections would have cost)."""

    window_s: int = 300
    min_samples: int = 500
    max_new_rejection_rate: float = 0.01
    max_backend_error_rate: float = 0.001
    min_sampled_share: float = 0.9
    min_dwell_s: float = 600.0
    counts: str = "all"
    weight: str = "requests"


@dataclass(frozen=True, slots=True, kw_only=True)
class GateStats:
    """Fleet-wide figures for a route over the gate window. ``excused``: the new rejections
    explained by a cause that is not a policy question (control_plane/model/causes.py's
    ``EXCUSED``: the leak across replicas, fresh buckets, clock skew), which the gate leaves
    out with ``counts: tighter``. On a route with a budget, ``units_compared`` and
    ``units_new_rejections``: what the compared requests and the new rejections cost (actual
    costs where settled, else estimates)."""

    compared: int
    new_rejections: int  # local_allow_distributed_deny
    backend_errors: int
    distributed_attempts: int
    shadow_dropped: int = 0  # decisions whose shadow evaluation was dropped (queue full)
    excused: int = 0
    units_compared: int = 0
    units_new_rejections: int = 0

    def counted_rejections(self, counts: str) -> int:
        """The new rejections the gate counts (``counts``: :data:`GATE_COUNTS`)."""
        return (
            self.new_rejections - min(self.excused, self.new_rejections) if counts == "tighter" else self.new_rejections
        )

    def counted_rate(self, counts: str, weight: str = "requests") -> float:
        """The share of the compared requests the counted new rejections are (``weight``
        ``cost``: the share of what they cost; the causes are counted in requests, so with
        ``counts: tighter`` the excused part is taken off the cost in proportion)."""
        if weight == "cost":
            if not self.units_compared or not self.new_rejections:
                return 0.0
            counted = self.units_new_rejections * self.counted_rejections(counts) / self.new_rejections
            return counted / self.units_compared
        return self.counted_rejections(counts) / self.compared if self.compared else 0.0

    @property
    def sampled_share(self) -> float | None:
        """The share of decisions the distributed limiter evaluated (compared or failed)
        out of all that should have been: 1.0 without drops, None without decisions."""
        total = self.distributed_attempts + self.shadow_dropped
        return self.distributed_attempts / total if total else None

    @property
    def new_rejection_rate(self) -> float:
        return self.new_rejections / self.compared if self.compared else 0.0

    @property
    def backend_error_rate(self) -> float:
        return self.backend_errors / self.distributed_attempts if self.distributed_attempts else 0.0


@dataclass(frozen=True, slots=True)
class GateResult:
    passed: bool
    required: bool
    reasons: tuple[str, ...]
    stats: GateStats
    config: GateConfig
    in_step_s: float | None = None  # how long the route has been in its current step (None: unknown)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "required": self.required,
            "reasons": list(self.reasons),
            "window_s": self.config.window_s,
            "compared": self.stats.compared,
            "min_samples": self.config.min_samples,
            "new_rejections": self.stats.new_rejections,
            "new_rejection_rate": round(self.stats.new_rejection_rate, 6),
            "max_new_rejection_rate": self.config.max_new_rejection_rate,
            "gate_counts": self.config.counts,
            "gate_weight": self.config.weight,
            "counted_rejections": self.stats.counted_rejections(self.config.counts),
            "counted_rejection_rate": round(self.stats.counted_rate(self.config.counts, self.config.weight), 6),
            "units_compared": self.stats.units_compared,
            "units_new_rejections": self.stats.units_new_rejections,
            "backend_errors": self.stats.backend_errors,
            "backend_error_rate": round(self.stats.backend_error_rate, 6),
            "max_backend_error_rate": self.config.max_backend_error_rate,
            "shadow_dropped": self.stats.shadow_dropped,
            "sampled_share": None if self.stats.sampled_share is None else round(self.stats.sampled_share, 6),
            "min_sampled_share": self.config.min_sampled_share,
            "in_step_s": None if self.in_step_s is None else round(self.in_step_s, 1),
            "min_dwell_s": self.config.min_dwell_s,
        }


def evaluate_gate(
    current: RouteState, target: Mode, target_percent: int, stats: GateStats, config: GateConfig, *, now: float
) -> GateResult:
    """Does moving ``current`` to ``target`` need the gate, and does it pass at ``now``?

    Only promotions toward enforcement are gated: shadow -> canary, canary -> a larger
    share or enforce, and any jump into canary or enforce. Moving back (rollback) or to
    off/shadow is always allowed. A promotion also waits until the route has been
    ``config.min_dwell_s`` in its current step (since ``current.updated_at``; a state never
    changed has no start and has waited long enough).
    """
    in_step = max(0.0, now - current.updated_at) if current.updated_at > 0 else None
    promoting = target in (Mode.CANARY, Mode.ENFORCE) and (
        target.rank > current.mode.rank
        or (target is Mode.CANARY and current.mode is Mode.CANARY and target_percent > current.canary_percent)
    )
    if not promoting:
        return GateResult(True, False, (), stats, config, in_step)
    reasons = figure_problems(stats, config)
    if in_step is not None and in_step < config.min_dwell_s:
        reasons.append(
            f"in {current.label()} for {in_step:.0f}s, the minimum before the next step is"
            f" {config.min_dwell_s:.0f}s (min_dwell; {config.min_dwell_s - in_step:.0f}s to go)"
        )
    return GateResult(not reasons, True, tuple(reasons), stats, config, in_step)


def figure_problems(stats: GateStats, config: GateConfig, *, since: str | None = None) -> list[str]:
    """Why the figures do not allow a promotion (empty when they do); ``since`` says what
    period they cover (the gate window by default)."""
    reasons: list[str] = []
    if stats.compared < config.min_samples:
        period = since or f"in the last {config.window_s}s"
        reasons.append(f"only {stats.compared} compared decisions {period} (need {config.min_samples})")
    counted = stats.counted_rate(config.counts, config.weight)
    if counted > config.max_new_rejection_rate:
        if config.weight == "cost":
            which = "tighter new rejections" if config.counts == "tighter" else "new rejections"
            reasons.append(
                f"{which} worth {counted:.2%} of the compared requests' cost exceed {config.max_new_rejection_rate:.2%}"
                " (gate_weight: cost)"
            )
        elif config.counts == "tighter":
            excused = stats.new_rejection_rate - counted
            reasons.append(
                f"tighter new rejections {counted:.2%} exceed {config.max_new_rejection_rate:.2%}"
                f" (gate_counts: tighter; {excused:.2%} more left out: replicas, fresh_local, clock)"
            )
        else:
            reasons.append(f"new rejections {counted:.2%} exceed {config.max_new_rejection_rate:.2%}")
    if stats.backend_error_rate > config.max_backend_error_rate:
        reasons.append(f"backend errors {stats.backend_error_rate:.2%} exceed {config.max_backend_error_rate:.2%}")
    share = stats.sampled_share
    if share is not None and share < config.min_sampled_share:
        reasons.append(
            f"only {share:.1%} of decisions were compared"
            f" ({stats.shadow_dropped:,} shadow evaluations dropped, queue full); "
            f"need {config.min_sampled_share:.0%}"
        )
    return reasons
