"""A rollout plan, pure: the steps a route walks on its own and the analysis that lets it
leave each one (docs/rollout-runbook.md#letting-a-plan-drive).

A plan is written in the rules file under a route's ``rollout`` key, or set at run time
(``PUT /v1/routes/{route}/plan``); both are read by the same rows
(:mod:`control_plane.rules.plan`) into a :class:`Plan`::

    rollout:
      steps:                      # in order, each a step forward
        - shadow: 10m             # the mode, and how long at least
        - canary: 10              # percent of keys (1-99), the canary's stable nested sets
          for: 10m
        - approve                 # waits for an operator (never last, never first)
        - enforce
      analysis:                   # every check must pass to leave a step
        min_compared: 500         # fewer compared decisions: inconclusive
        max_new_rejection_rate: 1%
        max_backend_error_rate: 0.1%
        prometheus:               # the protected service's own health (optional)
          - {name: upstream 5xx, query: "...{route}...", max: 0.01}
      on_failure: rollback        # or pause

Nothing here does IO: the plan is data, its id a digest of its canonical JSON (a changed
plan is a new plan: its progress starts over), and :func:`step_order_problem` is the one
check of the order of the steps, used by the rules file and the API alike.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .rollout import Mode

__all__ = [
    "OnFailure",
    "Plan",
    "PlanAnalysis",
    "PlanStep",
    "PrometheusCheck",
    "StepKind",
    "format_duration",
    "step_order_problem",
]


class StepKind(str, Enum):
    """What a step does: move the route to a mode, or wait for an operator."""

    SHADOW = "shadow"
    CANARY = "canary"
    APPROVE = "approve"
    ENFORCE = "enforce"


class OnFailure(str, Enum):
    """What a failed analysis does: back to the last step that passed (shadow at worst), or stop where it is."""

    ROLLBACK = "rollback"
    PAUSE = "pause"


def format_duration(seconds: float) -> str:
    """``90`` -> ``1m30s``, ``600`` -> ``10m``, ``2.5`` -> ``2.5s``, ``0`` -> ``0s``."""
    if seconds < 60 or seconds != int(seconds):
        return f"{seconds:g}s" if seconds < 60 else f"{int(seconds // 60)}m{seconds % 60:g}s"
    s = int(seconds)
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            out += f"{s // size}{unit}"
            s %= size
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanStep:
    """One step: a mode (with the canary's percent) held at least ``for_s`` seconds and until
    the analysis passes, or an operator's approval (``approve``: the mode before it is held)."""

    kind: StepKind
    percent: int = 0
    for_s: float = 0.0

    @property
    def mode(self) -> Mode | None:
        """The mode the step moves the route to (None for ``approve``)."""
        return None if self.kind is StepKind.APPROVE else Mode(self.kind.value)

    @property
    def position(self) -> tuple[int, int]:
        """Where the step stands on the way to enforce (mode rank, canary percent)."""
        mode = self.mode
        return (-1, 0) if mode is None else (mode.rank, self.percent)

    def matches(self, mode: Mode, percent: int) -> bool:
        """Is a route in ``mode`` (``percent`` for a canary) in this step's mode?"""
        return self.mode is mode and (mode is not Mode.CANARY or self.percent == percent)

    def label(self) -> str:
        """``shadow``, ``canary 10%``, ``approve``, ``enforce``."""
        return f"canary {self.percent}%" if self.kind is StepKind.CANARY else self.kind.value

    def describe(self) -> str:
        """The label with its time: ``shadow 10m``, ``canary 10% for 10m``."""
        if self.kind is StepKind.APPROVE or not self.for_s:
            return self.label()
        joiner = " for " if self.kind is StepKind.CANARY else " "
        return self.label() + joiner + format_duration(self.for_s)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.kind.value}
        if self.kind is StepKind.CANARY:
            out["percent"] = self.percent
        if self.kind is not StepKind.APPROVE:
            out["for_s"] = self.for_s
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlanStep:
        return cls(kind=StepKind(d["step"]), percent=int(d.get("percent", 0)), for_s=float(d.get("for_s", 0.0)))


@dataclass(frozen=True, slots=True, kw_only=True)
class PrometheusCheck:
    """A check of the protected service's health: a PromQL query (``{route}`` replaced by the
    route's name) whose one number must be at most ``max`` and at least ``min`` (either or
    both), asked of ``url`` (else ``SHADOWLIMIT_PROMETHEUS_URL``)."""

    name: str
    query: str
    max: float | None = None
    min: float | None = None
    url: str | None = None

    def query_for(self, route: str) -> str:
        return self.query.replace("{route}", route)

    def threshold(self) -> str:
        """``<= 0.01``, ``>= 0.9``, ``>= 0.9 and <= 1``."""
        parts = []
        if self.min is not None:
            parts.append(f">= {self.min:g}")
        if self.max is not None:
            parts.append(f"<= {self.max:g}")
        return " and ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "query": self.query, "max": self.max, "min": self.min, "url": self.url}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PrometheusCheck:
        return cls(
            name=str(d["name"]),
            query=str(d["query"]),
            max=None if d.get("max") is None else float(d["max"]),
            min=None if d.get("min") is None else float(d["min"]),
            url=None if d.get("url") is None else str(d["url"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanAnalysis:
    """The checks that let a route leave a step: shadowlimit's own figures over the step so
    far (compared decisions, new rejections, backend errors) and the Prometheus checks.
    ``gate_counts``: which new rejections ``max_new_rejection_rate`` counts, ``all`` or
    ``tighter`` (those that are a change of policy: control_plane/model/causes.py)."""

    min_compared: int
    max_new_rejection_rate: float
    max_backend_error_rate: float
    prometheus: tuple[PrometheusCheck, ...] = ()
    gate_counts: str = "all"
    gate_weight: str = "requests"  # or cost: the new rejections' share of what the compared requests cost

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "min_compared": self.min_compared,
            "max_new_rejection_rate": self.max_new_rejection_rate,
            "max_backend_error_rate": self.max_backend_error_rate,
            "prometheus": [c.to_dict() for c in self.prometheus],
        }
        if self.gate_counts != "all":  # a plan written before gate_counts keeps its id
            d["gate_counts"] = self.gate_counts
        if self.gate_weight != "requests":  # (as gate_counts)
            d["gate_weight"] = self.gate_weight
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlanAnalysis:
        return cls(
            min_compared=int(d["min_compared"]),
            max_new_rejection_rate=float(d["max_new_rejection_rate"]),
            max_backend_error_rate=float(d["max_backend_error_rate"]),
            prometheus=tuple(PrometheusCheck.from_dict(c) for c in d.get("prometheus") or ()),
            gate_counts=str(d.get("gate_counts", "all")),
            gate_weight=str(d.get("gate_weight", "requests")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A route's rollout plan (see the module docstring)."""

    steps: tuple[PlanStep, ...]
    analysis: PlanAnalysis
    on_failure: OnFailure = OnFailure.ROLLBACK

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": [s.to_dict() for s in self.steps],
            "analysis": self.analysis.to_dict(),
            "on_failure": self.on_failure.value,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """Raises ``ValueError`` for anything :meth:`to_dict` did not write."""
        try:
            return cls(
                steps=tuple(PlanStep.from_dict(s) for s in d["steps"]),
                analysis=PlanAnalysis.from_dict(d["analysis"]),
                on_failure=OnFailure(d.get("on_failure", "rollback")),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a plan: {exc!r}") from None

    @property
    def id(self) -> str:
        """A digest of the plan: equal plans have equal ids, a changed plan a new one."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()

    def describe(self) -> str:
        """``shadow 10m -> canary 10% for 10m -> approve -> enforce``."""
        return " -> ".join(s.describe() for s in self.steps)

    def start_index(self, mode: Mode, percent: int) -> int:
        """Where the plan starts on a route in ``mode``: the first step in that mode, else the first step."""
        for i, step in enumerate(self.steps):
            if step.matches(mode, percent):
                return i
        return 0

    def active_index(self, index: int) -> int | None:
        """The step whose mode is in force at step ``index``: itself, or for ``approve`` the
        nearest step before it with a mode (None when there is none)."""
        for i in range(index, -1, -1):
            if self.steps[i].mode is not None:
                return i
        return None


def step_order_problem(steps: tuple[PlanStep, ...] | list[PlanStep]) -> tuple[int, str] | None:
    """The first step out of order, as (its index, why); None when the steps are a plan:
    at least one, each a step forward (shadow, then larger canaries, then enforce), ``approve``
    neither first nor last."""
    if not steps:
        return 0, "a plan needs at least one step"
    last: PlanStep | None = None
    for i, step in enumerate(steps):
        if step.kind is StepKind.APPROVE:
            if i == 0:
                return i, "approve cannot be the first step: it approves the step before it"
            if i == len(steps) - 1:
                return i, "approve cannot be the last step: there is nothing after it to approve"
            continue
        if last is not None and step.position <= last.position:
            return i, f"{step.label()} after {last.label()} goes backwards: each step must move toward enforce"
        last = step
    return None
