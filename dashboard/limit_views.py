"""Typed views of limits: a policy, a promotion gate's verdict, a route's global limit in force
against the rules file's, and its candidate limit (a new limit evaluated in shadow beside the
current one, compared request by request, then promoted behind a gate or dropped).

Lenient parsing, like :mod:`dashboard.models`, which re-exports them: an older control plane
sends no ``limit`` and no ``candidate`` (``None``), a malformed field gets a neutral default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .coerce import as_dict, as_float, as_int, as_list, as_str, opt_float, opt_str

__all__ = [
    "BlockedKey",
    "CandidatePoint",
    "CandidateTotals",
    "CandidateView",
    "GateView",
    "LimitView",
    "PolicyView",
]


@dataclass(frozen=True, slots=True)
class PolicyView:
    algorithm: str
    average: float
    period: float
    burst: int
    blocked: bool = False  # Envoy's requests_per_unit: 0

    @classmethod
    def parse(cls, d: Any) -> PolicyView | None:
        d = as_dict(d)
        if not d:
            return None
        return cls(
            as_str(d.get("algorithm"), "token_bucket"),
            as_float(d.get("average")),
            as_float(d.get("period"), 1.0),
            as_int(d.get("burst")),
            d.get("blocked") is True,
        )

    def describe(self) -> str:
        if self.blocked:
            return f"0/{self.period:g}s (blocks all)"
        if self.average <= 0:
            return "unlimited"
        per = f"{self.period:g}s"
        burst = f" burst {self.burst}" if self.burst else ""
        algo = "" if self.algorithm == "token_bucket" else f" {self.algorithm}"
        return f"{self.average:g}/{per}{burst}{algo}"


@dataclass(frozen=True, slots=True)
class GateView:
    """A promotion gate's verdict and the figures behind it."""

    passed: bool
    required: bool
    reasons: tuple[str, ...]
    target: str | None = None
    target_percent: int | None = None  # the canary step the gate is for (canary targets)
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
    in_step_s: float | None = None  # time in the current step (None: unknown)
    min_dwell_s: float | None = None  # the minimum before the next step

    @classmethod
    def parse(cls, d: Any) -> GateView | None:
        if not isinstance(d, dict):
            return None

        def opt_i(k: str) -> int | None:
            return None if d.get(k) is None else as_int(d.get(k))

        return cls(
            passed=bool(d.get("passed", False)),
            required=bool(d.get("required", True)),
            reasons=tuple(str(r) for r in d.get("reasons") or ()),
            target=opt_str(d.get("target")),
            target_percent=opt_i("target_percent"),
            compared=opt_i("compared"),
            min_samples=opt_i("min_samples"),
            new_rejections=opt_i("new_rejections"),
            new_rejection_rate=opt_float(d.get("new_rejection_rate")),
            max_new_rejection_rate=opt_float(d.get("max_new_rejection_rate")),
            backend_errors=opt_i("backend_errors"),
            backend_error_rate=opt_float(d.get("backend_error_rate")),
            max_backend_error_rate=opt_float(d.get("max_backend_error_rate")),
            window_s=opt_i("window_s"),
            sampled_share=opt_float(d.get("sampled_share")),
            min_sampled_share=opt_float(d.get("min_sampled_share")),
            shadow_dropped=opt_i("shadow_dropped"),
            in_step_s=opt_float(d.get("in_step_s")),
            min_dwell_s=opt_float(d.get("min_dwell_s")),
        )

    @property
    def has_figures(self) -> bool:
        return self.compared is not None

    @property
    def target_label(self) -> str | None:
        """``canary 25%`` for a canary step, else the target mode."""
        if self.target == "canary" and self.target_percent:
            return f"canary {self.target_percent}%"
        return self.target


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockedKey:
    """A key a limit would newly reject: how often, its last request, and (the current global
    limit's would-be-blocked keys) the main cause of its new rejections, None: not explained;
    on a budget route, what its refusals would cost (``units``, in the route's cost unit)."""

    key: str
    count: int
    last_request_id: str
    cause: str | None = None
    units: int | None = None

    @classmethod
    def parse(cls, d: Any) -> BlockedKey:
        d = as_dict(d)
        return cls(
            key=as_str(d.get("key")),
            count=as_int(d.get("count")),
            last_request_id=as_str(d.get("last_request_id")),
            cause=opt_str(d.get("cause")),
            units=None if d.get("units") is None else as_int(d.get("units")),
        )


@dataclass(frozen=True, slots=True)
class LimitView:
    """A route's global limit in force and the rules file's: they differ (``adjusted``) after
    a runtime adjustment, a promoted candidate's included (the rules file is never rewritten)."""

    in_force: PolicyView | None
    rules: PolicyView | None
    adjusted: bool = False
    describe: str = ""

    @classmethod
    def parse(cls, d: Any) -> LimitView | None:
        if not isinstance(d, dict):
            return None
        return cls(
            PolicyView.parse(d.get("in_force")),
            PolicyView.parse(d.get("rules")),
            d.get("adjusted") is True,
            as_str(d.get("describe")),
        )


@dataclass(frozen=True, slots=True)
class CandidateTotals:
    """A candidate's comparisons with the current limit since it was set, fleet-wide:
    newly rejected (the current limit admits, the candidate would refuse), newly admitted
    (the reverse), failed and dropped evaluations."""

    agree: int = 0
    newly_rejected: int = 0
    newly_admitted: int = 0
    errors: int = 0
    dropped: int = 0
    compared: int = 0
    newly_rejected_share: float = 0.0
    newly_admitted_share: float = 0.0
    sampled_share: float | None = None  # evaluated / should have been (None: unknown)

    @classmethod
    def parse(cls, d: Any) -> CandidateTotals | None:
        if not isinstance(d, dict):
            return None
        return cls(
            as_int(d.get("agree")),
            as_int(d.get("newly_rejected")),
            as_int(d.get("newly_admitted")),
            as_int(d.get("errors")),
            as_int(d.get("dropped")),
            as_int(d.get("compared")),
            as_float(d.get("newly_rejected_share")),
            as_float(d.get("newly_admitted_share")),
            opt_float(d.get("sampled_share")),
        )

    @property
    def sampled(self) -> bool:
        """True when the figures are a sample (evaluations were dropped)."""
        return self.sampled_share is not None and self.sampled_share < 1.0


@dataclass(frozen=True, slots=True)
class CandidatePoint:
    """One minute of a candidate's comparisons."""

    minute: int = 0
    agree: int = 0
    newly_rejected: int = 0
    newly_admitted: int = 0
    errors: int = 0
    dropped: int = 0

    @classmethod
    def parse(cls, d: Any) -> CandidatePoint:
        d = as_dict(d)
        return cls(
            *(as_int(d.get(k)) for k in ("minute", "agree", "newly_rejected", "newly_admitted", "errors", "dropped"))
        )


@dataclass(frozen=True, slots=True)
class CandidateView:
    """A route's candidate limit: what it is, who set it when and why, its comparisons so far
    (``totals``: None until the fleet's figures include it) and its promotion gate; from the
    divergence view also per minute (``series``) and who it would newly reject."""

    id: str
    policy: PolicyView | None
    describe: str = ""
    since: float = 0.0
    age_s: float | None = None
    actor: str = ""
    reason: str = ""
    totals: CandidateTotals | None = None
    gate: GateView | None = None
    series: tuple[CandidatePoint, ...] = ()
    would_be_blocked: tuple[BlockedKey, ...] = ()

    @classmethod
    def parse(cls, d: Any) -> CandidateView | None:
        if not isinstance(d, dict):
            return None
        return cls(
            id=as_str(d.get("id")),
            policy=PolicyView.parse(d.get("policy")),
            describe=as_str(d.get("describe")),
            since=as_float(d.get("since")),
            age_s=opt_float(d.get("age_s")),
            actor=as_str(d.get("actor")),
            reason=as_str(d.get("reason")),
            totals=CandidateTotals.parse(d.get("totals")),
            gate=GateView.parse(d.get("gate")),
            series=tuple(CandidatePoint.parse(p) for p in as_list(d.get("series"))),
            would_be_blocked=tuple(BlockedKey.parse(b) for b in as_list(d.get("would_be_blocked"))),
        )

    @property
    def limit(self) -> str:
        """Its limit, short: ``5/1s burst 5`` (the algorithm when not a token bucket)."""
        if self.policy is not None:
            return self.policy.describe()
        return self.describe.removesuffix(" (token_bucket)") or "?"
