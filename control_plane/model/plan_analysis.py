"""A plan's analysis, pure: each check's value against its threshold, and the verdict.

The figures are passed in (shadowlimit's own since the step began, each Prometheus check's
answer as read by :func:`read_prometheus_answer`), so nothing here does IO. Four verdicts:

* **pass** -- every check passes;
* **fail** -- a check is past its threshold (the plan's ``on_failure`` applies);
* **inconclusive** -- not enough evidence to judge: fewer compared decisions than
  ``min_compared`` (the rates of a handful of decisions say nothing), Prometheus
  unreachable, an empty or non-numeric answer. The plan stays and waits; it never advances
  on no evidence;
* **refused** -- Prometheus refused a query (a PromQL error): the plan pauses, Prometheus'
  own error shown, until someone fixes the query.

A failure wins over a refusal, a refusal over missing evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from .plan import Plan, PlanAnalysis, PrometheusCheck
from .rollout import GateStats

__all__ = [
    "Analysis",
    "CheckResult",
    "PromReading",
    "Verdict",
    "analyse",
    "percent",
    "read_prometheus_answer",
    "since_baseline",
]


class Verdict(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    REFUSED = "refused"


#: which verdict a set of checks gets: the first of these any check has
_PRECEDENCE = (Verdict.FAIL, Verdict.REFUSED, Verdict.INCONCLUSIVE)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    """One check: its value (None when there is none), its threshold, its outcome and, unless
    it passed, why."""

    name: str
    value: float | None
    threshold: str
    outcome: Verdict
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        value = self.value
        if value is not None and not math.isfinite(value):
            value = None  # JSON has no infinities; the reason says it
        return {
            "name": self.name,
            "value": value,
            "threshold": self.threshold,
            "outcome": self.outcome.value,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckResult:
        return cls(
            name=str(d["name"]),
            value=None if d.get("value") is None else float(d["value"]),
            threshold=str(d.get("threshold", "")),
            outcome=Verdict(d["outcome"]),
            reason=str(d.get("reason", "")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Analysis:
    """One evaluation of a plan's step at ``at``: every check and the verdict."""

    at: float
    step: int
    verdict: Verdict
    checks: tuple[CheckResult, ...]

    @property
    def reason(self) -> str:
        """Why the verdict is not a pass: the first check with the verdict's outcome ("" for a pass)."""
        for c in self.checks:
            if c.outcome is self.verdict and c.reason:
                return f"{c.name}: {c.reason}"
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "step": self.step,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "checks": [c.to_dict() for c in self.checks],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Analysis:
        """Raises ``ValueError`` for anything :meth:`to_dict` did not write."""
        try:
            return cls(
                at=float(d["at"]),
                step=int(d["step"]),
                verdict=Verdict(d["verdict"]),
                checks=tuple(CheckResult.from_dict(c) for c in d["checks"]),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not an analysis: {exc!r}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromReading:
    """What a Prometheus query gave: a number, or why there is none (``outcome``
    inconclusive: unreachable, empty, not a number; refused: a PromQL error)."""

    value: float | None = None
    outcome: Verdict = Verdict.PASS  # PASS: a value was read (it is judged by analyse)
    reason: str = ""


def read_prometheus_answer(status: int | None, body: Any, *, error: str = "") -> PromReading:
    """Read an answer of Prometheus' ``/api/v1/query`` (``status`` None: no answer at all,
    ``error`` says why). A 400 or 422 is Prometheus refusing the query (its ``error`` is kept);
    anything else that is not one number -- no answer, a 5xx, an empty vector, several
    series, a string, NaN -- is inconclusive."""
    if status is None:
        return PromReading(outcome=Verdict.INCONCLUSIVE, reason=f"Prometheus unreachable: {error or 'no answer'}")
    d = body if isinstance(body, dict) else {}
    if status in (400, 422) and d.get("status") == "error":
        kind = str(d.get("errorType", "bad_data"))
        return PromReading(outcome=Verdict.REFUSED, reason=f"Prometheus refused the query ({kind}): {d.get('error')}")
    if status != 200 or d.get("status") != "success":
        why = d.get("error") or f"HTTP {status}"
        return PromReading(outcome=Verdict.INCONCLUSIVE, reason=f"Prometheus did not answer the query: {why}")
    raw = d.get("data")
    data: dict[str, Any] = raw if isinstance(raw, dict) else {}
    kind, result = str(data.get("resultType")), data.get("result")
    if kind == "vector" and isinstance(result, list):
        if not result:
            return PromReading(outcome=Verdict.INCONCLUSIVE, reason="the query returned no series (no data yet?)")
        if len(result) > 1:
            return PromReading(
                outcome=Verdict.INCONCLUSIVE, reason=f"the query returned {len(result)} series; it must return one"
            )
        sample = result[0].get("value") if isinstance(result[0], dict) else None
    elif kind == "scalar":
        sample = result
    else:
        return PromReading(outcome=Verdict.INCONCLUSIVE, reason=f"the query returned a {kind}, not a number")
    try:
        value = float(sample[1])  # type: ignore[index]
    except (TypeError, ValueError, IndexError):
        return PromReading(outcome=Verdict.INCONCLUSIVE, reason=f"not a number: {sample!r}")
    if math.isnan(value):
        return PromReading(outcome=Verdict.INCONCLUSIVE, reason="the query's value is NaN (a ratio of no traffic?)")
    return PromReading(value=value)


def percent(share: float) -> str:
    """A share as a short percentage: ``0.01`` -> ``1%``, ``0.001`` -> ``0.1%``."""
    return f"{share * 100:.4f}".rstrip("0").rstrip(".") + "%"


def since_baseline(*, first: GateStats, later: GateStats, baseline: GateStats | None) -> GateStats:
    """The figures counted after ``baseline`` was taken: ``first``, the minute it was taken in,
    less the baseline (never below 0: counters that went back, lost with Redis' data, count
    nothing of that minute), and ``later``, the minutes after it, whole."""

    def since(name: str) -> int:
        before: int = 0 if baseline is None else getattr(baseline, name)
        now: int = getattr(first, name)
        after: int = getattr(later, name)
        return max(0, now - before) + after

    return GateStats(
        compared=since("compared"),
        new_rejections=since("new_rejections"),
        backend_errors=since("backend_errors"),
        distributed_attempts=since("distributed_attempts"),
        shadow_dropped=since("shadow_dropped"),
        excused=since("excused"),
        units_compared=since("units_compared"),
        units_new_rejections=since("units_new_rejections"),
    )


def _rate(name: str, value: float, limit: float, enough: bool, what: str) -> CheckResult:
    threshold = f"<= {percent(limit)}"
    if not enough:
        return CheckResult(
            name=name, value=value, threshold=threshold, outcome=Verdict.INCONCLUSIVE,
            reason="too few compared decisions to judge",
        )  # fmt: skip
    if value > limit:
        return CheckResult(
            name=name, value=value, threshold=threshold, outcome=Verdict.FAIL,
            reason=f"{what} {value:.2%} exceed {percent(limit)}",
        )  # fmt: skip
    return CheckResult(name=name, value=value, threshold=threshold, outcome=Verdict.PASS)


def _new_rejections(a: PlanAnalysis, stats: GateStats, enough: bool) -> CheckResult:
    """The new-rejection check: all of them, or (``gate_counts: tighter``) only those that are a
    change of policy, the leak across replicas, fresh buckets and clock skew left out; weighed by
    what they cost with ``gate_weight: cost``."""
    if a.gate_weight == "cost":
        rate = stats.counted_rate(a.gate_counts, "cost")
        name = "tighter new rejection cost share" if a.gate_counts == "tighter" else "new rejection cost share"
        return _rate(name, rate, a.max_new_rejection_rate, enough, "new rejections worth")
    if a.gate_counts == "tighter":
        rate = stats.counted_rate("tighter")
        return _rate("tighter new rejection rate", rate, a.max_new_rejection_rate, enough, "tighter new rejections")
    return _rate("new rejection rate", stats.new_rejection_rate, a.max_new_rejection_rate, enough, "new rejections")


def _prometheus(check: PrometheusCheck, reading: PromReading | None) -> CheckResult:
    base = CheckResult(name=check.name, value=None, threshold=check.threshold(), outcome=Verdict.INCONCLUSIVE)
    if reading is None:
        return replace(base, reason="not asked yet")
    if reading.outcome is not Verdict.PASS or reading.value is None:
        return replace(base, outcome=reading.outcome, reason=reading.reason)
    v = reading.value
    if check.max is not None and v > check.max:
        return replace(base, value=v, outcome=Verdict.FAIL, reason=f"{v:g} is above {check.max:g}")
    if check.min is not None and v < check.min:
        return replace(base, value=v, outcome=Verdict.FAIL, reason=f"{v:g} is below {check.min:g}")
    return replace(base, value=v, outcome=Verdict.PASS)


def analyse(plan: Plan, stats: GateStats, readings: dict[str, PromReading], *, step: int, now: float) -> Analysis:
    """Judge step ``step`` of ``plan`` at ``now``: ``stats`` are the fleet's figures since the
    step began, ``readings`` each Prometheus check's answer by name (a missing one: not asked)."""
    a = plan.analysis
    enough = stats.compared >= a.min_compared
    compared = CheckResult(
        name="compared decisions",
        value=float(stats.compared),
        threshold=f">= {a.min_compared}",
        outcome=Verdict.PASS if enough else Verdict.INCONCLUSIVE,
        reason="" if enough else f"only {stats.compared} since the step began (need {a.min_compared})",
    )
    checks = [
        compared,
        _new_rejections(a, stats, enough),
        _rate("backend error rate", stats.backend_error_rate, a.max_backend_error_rate, enough, "backend errors"),
        *(_prometheus(c, readings.get(c.name)) for c in a.prometheus),
    ]
    verdict = Verdict.PASS
    for v in _PRECEDENCE:
        if any(c.outcome is v for c in checks):
            verdict = v
            break
    return Analysis(at=now, step=step, verdict=verdict, checks=tuple(checks))
