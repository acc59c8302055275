"""Dialogs: canary percent, confirm a mode change (gate figures + reason), confirm promoting or
dropping a candidate limit, a refused gate (why, and force with a reason), and help. Each
dismisses with its answer; none does IO."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from .models import CandidateView, GateView, RouteView
from .render import ago, gate_figures, gate_problems, mode_text, pct
from .theme import BAD, BAD_BOLD

__all__ = [
    "CandidateGateRefusedScreen",
    "ConfirmCandidateScreen",
    "ConfirmModeScreen",
    "GateRefusedScreen",
    "HelpScreen",
    "PercentScreen",
    "ReasonDialog",
    "candidate_summary",
    "is_promotion",
]

_RANK = {"off": 0, "shadow": 1, "canary": 2, "enforce": 3}


def is_promotion(route: RouteView, mode: str, percent: int) -> bool:
    """Would the server gate this move? (Only for display; the server decides.)"""
    cur = route.state.mode
    return mode in ("canary", "enforce") and (
        _RANK.get(mode, 0) > _RANK.get(cur, 0) or (mode == cur == "canary" and percent > route.state.canary_percent)
    )


def _change(route: RouteView, mode: str, percent: int) -> Text:
    t = Text.assemble(("Move ", ""), (route.name, "bold"), (": ", ""))
    t.append_text(mode_text(route.state.mode, route.state.canary_percent))
    t.append(" → ")
    t.append_text(mode_text(mode, percent))
    return t


class PercentScreen(ModalScreen[int | None]):
    """Ask which share of keys (1-100 %) the distributed limit should enforce."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, route: RouteView) -> None:
        super().__init__()
        self.route = route

    def compose(self) -> ComposeResult:
        cur = self.route.state.canary_percent if self.route.state.mode == "canary" else 0
        suggestion = min(100, max(10, cur * 2)) if cur else 10
        with Vertical(classes="dialog"):
            yield Label(Text.assemble(("Canary for ", ""), (self.route.name, "bold")), classes="dialog-title")
            yield Static(
                "Share of keys (by key hash, stable across replicas) enforced by the distributed limit, 1-100 %."
            )
            yield Input(str(suggestion), type="integer", placeholder="percent", id="percent")
            yield Label("", id="percent-error", classes="error")
            with Horizontal(classes="buttons"):
                yield Button("Next", variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    def _submit(self) -> None:
        raw = self.query_one("#percent", Input).value.strip()
        if not raw.isdigit() or not 1 <= int(raw) <= 100:
            self.query_one("#percent-error", Label).update("enter a whole number from 1 to 100")
            return
        self.dismiss(int(raw))

    @on(Input.Submitted)
    @on(Button.Pressed, "#ok")
    def _ok(self) -> None:
        self._submit()

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class _ReasonDialog(ModalScreen[str | None]):
    """Shared: a reason input that must not be empty, confirm and cancel buttons."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    CONFIRM = "Confirm"
    VARIANT = "primary"

    def __init__(self, reason: str = "") -> None:
        super().__init__()
        self._reason = reason

    def reason_widgets(self) -> ComposeResult:
        yield Input(self._reason, placeholder="reason (required, goes to the audit trail)", id="reason")
        with Horizontal(classes="buttons"):
            yield Button(self.CONFIRM, variant=self.VARIANT, id="ok", disabled=not self._reason.strip())  # type: ignore[arg-type]
            yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#reason", Input).focus()

    @on(Input.Changed, "#reason")
    def _changed(self, event: Input.Changed) -> None:
        self.query_one("#ok", Button).disabled = not event.value.strip()

    @on(Input.Submitted, "#reason")
    @on(Button.Pressed, "#ok")
    def _ok(self) -> None:
        reason = self.query_one("#reason", Input).value.strip()
        if reason:
            self.dismiss(reason)
        else:
            self.notify("a reason is required", severity="warning")

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


#: the reason dialog for other modules' confirmations
ReasonDialog = _ReasonDialog


class ConfirmModeScreen(_ReasonDialog):
    """Confirm a mode change: what changes, the gate figures, and a required reason."""

    def __init__(self, route: RouteView, mode: str, percent: int) -> None:
        super().__init__()
        self.route, self.mode, self.percent = route, mode, percent

    def compose(self) -> ComposeResult:
        gated = is_promotion(self.route, self.mode, self.percent)
        with Vertical(classes="dialog"):
            yield Label(_change(self.route, self.mode, self.percent), classes="dialog-title")
            if gated:
                gate = self.route.gate
                verdict = Text("This is a promotion: the server checks the gate. ")
                if gate is not None and gate.has_figures:
                    verdict.append("Gate figures now:", style="bold")
                yield Static(verdict, id="gate-verdict")
                yield Static(gate_figures(gate), id="gate-figures")
                if gate is not None and gate.has_figures and gate.required and not gate.passed:
                    yield Static(Text("Likely refused: " + "; ".join(gate_problems(gate)), style=BAD))
            else:
                yield Static(Text("Not a promotion: no gate applies.", style="dim"), id="gate-verdict")
            yield self._reason_label()
            yield from self.reason_widgets()

    @staticmethod
    def _reason_label() -> Label:
        return Label("Why?", classes="field-label")


class _GateRefusedDialog(_ReasonDialog):
    """The server refused a promotion (``change`` says which): why, and force it with a reason."""

    CONFIRM = "Force"
    VARIANT = "error"

    def __init__(self, change: Text, gate: GateView, reason: str) -> None:
        super().__init__(reason)
        self.change, self.gate = change, gate

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -refused"):
            yield Label(Text("The gate refused this promotion", style=BAD_BOLD), classes="dialog-title")
            yield Static(self.change)
            reasons = Text()
            for r in self.gate.reasons or ("refused",):
                reasons.append(f"  ✘ {r}\n", style=BAD)
            reasons.rstrip()  # in place
            yield Static(reasons, id="gate-reasons")
            yield Static(gate_figures(self.gate), id="gate-figures")
            yield Static("Forcing overrides the gate; the audit trail records it as forced, with your reason.")
            yield Label("Reason for forcing", classes="field-label")
            yield from self.reason_widgets()


class GateRefusedScreen(_GateRefusedDialog):
    """The server refused the mode's promotion: show why, offer to force it with a reason."""

    def __init__(self, route: RouteView, mode: str, percent: int, gate: GateView, reason: str) -> None:
        super().__init__(_change(route, mode, percent), gate, reason)
        self.route, self.mode, self.percent = route, mode, percent


class CandidateGateRefusedScreen(_GateRefusedDialog):
    """The server refused promoting the route's candidate: why, and force it with a reason."""

    def __init__(self, route: RouteView, candidate: CandidateView, gate: GateView, reason: str) -> None:
        super().__init__(_promotion(route, candidate), gate, reason)
        self.route, self.candidate = route, candidate


def _promotion(route: RouteView, candidate: CandidateView) -> Text:
    now = route.global_policy.describe() if route.global_policy else "?"
    return Text.assemble(
        ("Promote ", ""), (route.name, "bold"), ("'s candidate: global limit ", ""), (now, ""), (" → ", ""),
        (candidate.limit, "bold"),
    )  # fmt: skip


def candidate_summary(route: RouteView, c: CandidateView, now: float | None = None) -> Text:
    """Two lines: the candidate beside the limit in force (who set it, when, why), and its
    comparisons since (``now``: the snapshot's time, for the age; else the server's age)."""
    current = route.global_policy.describe() if route.global_policy else "?"
    age = ago(c.since, now) if now else (f"{c.age_s:.0f}s ago" if c.age_s is not None else "")
    t = Text.assemble(("Candidate ", ""), (c.limit, "bold"), (f" beside the global limit {current}", ""))
    t.append(f", set {age} by {c.actor or '?'}" if age else f", set by {c.actor or '?'}", style="dim")
    if c.reason:
        t.append(f" · “{c.reason}”", style="italic")
    tot = c.totals
    if tot is None:
        t.append("\nNo comparisons yet (the fleet's figures do not include it yet).", style="dim")
        return t
    t.append(f"\nSince then: {tot.compared:,} compared, ")
    t.append(
        f"{tot.newly_rejected:,} newly rejected ({pct(tot.newly_rejected_share, 2)})",
        style=BAD if tot.newly_rejected else "",
    )
    t.append(f", {tot.newly_admitted:,} newly admitted ({pct(tot.newly_admitted_share, 2)}), {tot.errors:,} errors.")
    return t


class ConfirmCandidateScreen(_ReasonDialog):
    """Confirm promoting (``promote``: the gate's figures) or dropping (``drop``) the route's
    candidate limit, with a required reason."""

    def __init__(self, route: RouteView, candidate: CandidateView, action: str, *, now: float | None = None) -> None:
        super().__init__()
        self.route, self.candidate, self.action, self.now = route, candidate, action, now
        self.CONFIRM, self.VARIANT = ("Promote", "warning") if action == "promote" else ("Drop", "error")

    def compose(self) -> ComposeResult:
        c = self.candidate
        title = "Promote " if self.action == "promote" else "Drop "
        with Vertical(classes="dialog"):
            yield Label(
                Text.assemble((title, ""), (self.route.name, "bold"), ("'s candidate", "")), classes="dialog-title"
            )
            yield Static(candidate_summary(self.route, c, self.now), id="candidate-summary")
            if self.action == "promote":
                yield Static(
                    f"It becomes the route's global limit ({c.limit}), a runtime adjustment kept across restarts;"
                    " the rules file is not rewritten. The server checks the gate first.",
                    id="gate-verdict",
                )
                yield Static(gate_figures(c.gate), id="gate-figures")
                if c.gate is not None and c.gate.has_figures and not c.gate.passed:
                    problems = gate_problems(c.gate, dwell="dwell {0:.0f}s of {1:.0f}s")
                    yield Static(Text("Likely refused: " + "; ".join(problems), style=BAD))
            else:
                yield Static(
                    "The route keeps its global limit; the candidate is no longer evaluated.", id="gate-verdict"
                )
            yield Label("Why?", classes="field-label")
            yield from self.reason_widgets()


HELP = """\
[b]Keys[/b]
  ↑/↓        select a route (marked ▶; the buckets and divergence panels follow it)
  tab        move between panels; ↑/↓ pgup/pgdn then scroll the focused one
  o s c e    move the selected route to off / shadow / canary (asks the percent) / enforce
  w          what-if: replay recorded traffic against a limit, then adjust or try it live
  p d        promote (gated) / drop the selected route's candidate limit (when it has one)
  x a        pause or resume / approve the step of the selected route's rollout plan
  r          reconnect now          n   next replica (when several are known)
  ?          this help              q   quit
  ctrl+p     command palette; its Theme command switches dark and light themes

[b]Rollout[/b]
  Every change asks for a reason and shows the gate figures. A promotion the gate refuses
  (409) shows why and can be forced with a reason. The tables change only when the control
  plane says so (stream or a fresh read), never on a guess. Without an admin token the
  dashboard is read-only.

[b]Panels[/b]
  Routes      effective mode, decisions/s, divergence (5 min) with the last 12 minutes,
              new rejections (local allowed, distributed would deny), backend errors, gate;
              * limit adjusted (not the rules'); ↳ candidate: a candidate limit's figures;
              ↳ plan: a rollout plan's state, time left, steps (■ passed ▶ now □ next),
              the first failing or missing check, what it waits for
  Buckets     the selected route's most active keys: tokens left locally and globally
  Backend     the Redis circuit breaker, the failure policy in force, the live fleet
  Divergence  the last hour per route: agree, new rejections, reverse (one column a minute);
              why they disagree in words (the fleet multiplied the old limit, the new limit
              is tighter, ...) and the keys a limit would block, each with its cause;
              scrolls when the routes do not fit, and to the selected route
  Audit       mode changes (PLAN: a plan's step), plans, candidates, rules reloads, breaker
              transitions, as they happen

[b]Connection[/b]
  LIVE when snapshots arrive; STALE keeps the last data on screen and retries with backoff
  (0.5 s doubling to 10 s).
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def __init__(self, url: str, has_token: bool, replicas: list[str], banner: str | None) -> None:
        super().__init__()
        self.url, self.has_token, self.replicas, self.banner = url, has_token, replicas, banner

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog help"):
            yield Label("shadowlimit dashboard", classes="dialog-title")
            yield Static(HELP, markup=True)
            conn = (
                f"[b]Connected to[/b] {self.url}  ·  admin token: {'set' if self.has_token else 'not set (read-only)'}"
            )
            if len(self.replicas) > 1:
                conn += "\n[b]Replicas[/b] " + "  ".join(self.replicas)
            yield Static(conn)
            if self.banner:
                yield Label("Demo", classes="field-label")
                yield Static(Text(self.banner), id="demo-banner")
            yield Button("Close", id="close")

    @on(Button.Pressed, "#close")
    def action_close(self) -> None:
        self.dismiss(None)
