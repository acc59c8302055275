"""Typed views of a route's rollout plan as ``GET /v1/routes`` (and the stream's snapshots) send
it, and of the answer to an operator's word on it (pause, resume, approve, abort). Lenient
like the other views: a control plane that sends no ``plan`` gives ``None``, a malformed
field a neutral default. Rendering: :func:`plan_strip` (the steps as a progress strip)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from .coerce import as_dict, as_int, as_list, as_str, opt_float, opt_str
from .theme import BAD_BOLD, INFO_BOLD, OK, OK_BOLD, TRACK_FG, WARN, WARN_BOLD

__all__ = ["PLAN_STATE_STYLE", "PlanChange", "PlanCheckView", "PlanView", "plan_strip"]

#: how each plan state is drawn (a role of dashboard/theme.py)
PLAN_STATE_STYLE = {
    "running": OK_BOLD,
    "waiting": WARN,
    "waiting_for_approval": WARN_BOLD,
    "paused": BAD_BOLD,
    "completed": OK,
    "aborted": "dim",
}


@dataclass(frozen=True, slots=True)
class PlanCheckView:
    """One check of a plan's analysis: its value (None: none), threshold, outcome and why."""

    name: str
    value: float | None
    threshold: str
    outcome: str  # pass | fail | inconclusive | refused
    reason: str

    @classmethod
    def parse(cls, d: object) -> PlanCheckView | None:
        if not isinstance(d, dict):
            return None
        return cls(
            as_str(d.get("name"), "?"),
            opt_float(d.get("value")),
            as_str(d.get("threshold")),
            as_str(d.get("outcome"), "inconclusive"),
            as_str(d.get("reason")),
        )

    def describe(self) -> str:
        """``new rejection rate 3.2% (<= 1%)``, ``compared decisions 12 (>= 500)``."""
        if self.value is None:
            return f"{self.name}: {self.reason or self.outcome}"
        value = f"{self.value:.2%}" if "%" in self.threshold else f"{self.value:g}"
        return f"{self.name} {value} ({self.threshold})"


@dataclass(frozen=True, slots=True)
class PlanView:
    """Where a route's plan stands (see ``GET /v1/routes`` in docs/api.md)."""

    source: str
    state: str
    step: int  # from 1
    steps: int
    current: str
    labels: tuple[str, ...]
    in_step_s: float | None
    time_left_s: float | None
    waits_for: str | None
    reason: str
    verdict: str | None
    first_problem: PlanCheckView | None

    @classmethod
    def parse(cls, d: object) -> PlanView | None:
        if not isinstance(d, dict):
            return None
        labels = tuple(as_str(x) for x in as_list(d.get("labels")))
        return cls(
            source=as_str(d.get("source")),
            state=as_str(d.get("state"), "waiting"),
            step=as_int(d.get("step"), 1),
            steps=as_int(d.get("steps"), len(labels)),
            current=as_str(d.get("current")),
            labels=labels,
            in_step_s=opt_float(d.get("in_step_s")),
            time_left_s=opt_float(d.get("time_left_s")),
            waits_for=opt_str(d.get("waits_for")),
            reason=as_str(d.get("reason")),
            verdict=opt_str(d.get("verdict")),
            first_problem=PlanCheckView.parse(d.get("first_problem")),
        )

    @property
    def can_pause(self) -> bool:
        return self.state in ("running", "waiting", "waiting_for_approval")

    @property
    def can_resume(self) -> bool:
        return self.state in ("paused", "aborted")


@dataclass(frozen=True, slots=True)
class PlanChange:
    """The server's answer to an operator's word on a plan: its state and step afterwards and
    the audit entry's id."""

    route: str
    state: str
    current: str
    audit_id: str

    @classmethod
    def parse(cls, d: object) -> PlanChange:
        d = as_dict(d)
        plan, audit = as_dict(d.get("plan")), as_dict(d.get("audit"))
        return cls(
            as_str(d.get("route")), as_str(plan.get("state")), as_str(plan.get("current")), as_str(audit.get("id"))
        )


def plan_strip(p: PlanView) -> Text:
    """The steps as a progress strip: ``■■▶□ 3/4 canary 50%`` (passed, the current one, to come)."""
    out = Text()
    done = p.state == "completed"
    current_style = PLAN_STATE_STYLE.get(p.state, INFO_BOLD)
    for i in range(1, max(p.steps, len(p.labels)) + 1):
        if i < p.step or (done and i == p.step):
            out.append("■", style=OK)
        elif i == p.step:
            out.append("▶", style=current_style)
        else:
            out.append("□", style=TRACK_FG)
    out.append(f" {p.step}/{p.steps} ", style="dim")
    out.append(p.current, style="bold")
    return out
