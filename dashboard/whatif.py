"""The what-if dialog (``w`` on the selected route): a candidate limit (rate, burst,
algorithm, minutes of recording), its replay next to the route's current global policy and
divergence, the keys it would reject; from there, ``Adjust`` makes the candidate the route's
distributed limit (with a reason, audited), and ``Try live`` (``ctrl+t``) sets it as the
route's candidate limit: evaluated in shadow beside the current one on live traffic, until
promoted or dropped. Like the other dialogs it does no IO: it dismisses with what to do
(:class:`WhatIfAnswer`) and the screen calls the control plane."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from .modals import ReasonDialog
from .models import RouteView, WhatIfView

__all__ = ["ALGORITHMS", "ConfirmAdjustScreen", "ConfirmTryLiveScreen", "WhatIfAnswer", "WhatIfScreen", "parse_rate"]

ALGORITHMS = ("token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_rate(text: str) -> tuple[float, float] | None:
    """``50/1s``, ``50/s``, ``1000/1m``: (average, period in seconds), or None."""
    n, _, per = text.strip().partition("/")
    per = per.strip() or "1s"
    unit = next((u for u in sorted(_UNITS, key=len, reverse=True) if per.endswith(u)), None)
    try:
        avg = float(n)
        num = per[: -len(unit)] if unit else per
        period = (float(num) if num else 1.0) * (_UNITS[unit] if unit else 1.0)
    except ValueError:
        return None
    return (avg, period) if avg > 0 and period > 0 else None


def _number(x: float) -> str:
    """``x`` as the control plane's limit grammar reads it: no exponent (``1e-05`` is not a number there)."""
    text = f"{x:.15g}"
    return f"{x:.9f}".rstrip("0").rstrip(".") if "e" in text else text


@dataclass(frozen=True)
class WhatIfAnswer:
    """What the dialog was closed with: ``replay``, ``adjust`` or ``try`` (live, as the route's
    candidate limit) the entered limit."""

    action: str
    rate: str
    burst: str
    algorithm: str
    minutes: int
    policy: dict[str, Any]

    @property
    def limit(self) -> str:
        """The rate as the candidate API's limit text: ``2/1s``, ``1000/60s``."""
        return f"{_number(self.policy['average'])}/{_number(self.policy['period'])}s"

    @property
    def label(self) -> str:
        """As typed: ``2/1s burst 2``."""
        return self.rate + (f" burst {self.burst}" if self.burst else "")


def _figures(result: WhatIfView) -> Table:
    t = Table(box=None, pad_edge=False, expand=True)
    for col, justify in (("replay", "left"), ("policy", "left"), ("requests", "right"), ("rejected", "right")):
        t.add_column(col, justify=justify, style="bold" if col == "replay" else None)  # type: ignore[arg-type]
    t.add_column("share", justify="right")
    for name, r in (("candidate", result.candidate), ("current", result.current)):
        t.add_row(name, r.policy, f"{r.requests:,.0f}", f"{r.rejections:,.0f}", f"{r.reject_share:.2%}")
    t.add_row("", "", "", "", "")
    for key, req, rej in result.candidate.top_keys[:5]:
        t.add_row("", Text("  " + key, style="italic"), f"{req:,.0f}", f"{rej:,.0f}", "")
    return t


class WhatIfScreen(ModalScreen[WhatIfAnswer | None]):
    """See the module docstring. ``values`` refill the inputs after a replay."""

    BINDINGS = [Binding("escape", "cancel", "Close"), Binding("ctrl+t", "try_live", "Try live")]

    def __init__(
        self,
        route: RouteView,
        *,
        values: WhatIfAnswer | None = None,
        result: WhatIfView | None = None,
        error: str | None = None,
    ) -> None:
        super().__init__()
        self.route, self.values, self.result, self.error = route, values, result, error

    def _defaults(self) -> tuple[str, str, str, str]:
        if self.values is not None:
            v = self.values
            return v.rate, v.burst, v.algorithm, str(v.minutes)
        p = self.route.global_policy
        if p is None or p.average <= 0:
            return "10/1s", "", "token_bucket", "15"
        return f"{p.average:g}/{p.period:g}s", str(p.burst or ""), p.algorithm, "15"

    def compose(self) -> ComposeResult:
        rate, burst, algorithm, minutes = self._defaults()
        div = self.route.divergence_5m
        current = self.route.global_policy.describe() if self.route.global_policy else "-"
        with Vertical(classes="dialog whatif"):
            yield Label(Text.assemble(("What if · ", ""), (self.route.name, "bold")), classes="dialog-title")
            yield Static(
                f"Global limit now: {current}. Divergence 5m: {div.compared if div else 0:,} compared, "
                f"{(div.new_rejection_rate if div else 0):.2%} new rejections."
                + (f" Candidate in shadow: {self.route.candidate.limit}." if self.route.candidate else ""),
                id="whatif-now",
            )
            with Horizontal(classes="whatif-inputs"):
                yield Input(rate, placeholder="rate 50/1s", id="rate")
                yield Input(burst, placeholder="burst", type="integer", id="burst")
                yield Select([(a, a) for a in ALGORITHMS], value=algorithm, allow_blank=False, id="algorithm")
                yield Input(minutes, placeholder="minutes", type="integer", id="minutes")
            yield Label(self.error or "", id="whatif-error", classes="error")
            if self.result is not None:
                r = self.result
                yield Static(_figures(r), id="whatif-figures")
                yield Static(
                    f"{r.minutes_recorded} of {r.minutes} min recorded · recorded share {r.recorded_share:.1%}",
                    id="whatif-share",
                )
                yield Static(
                    Text(
                        "Adjust makes it the global limit now; Try live (ctrl+t) evaluates it beside the current"
                        " limit on live traffic first, as the route's candidate (promote with p, drop with d).",
                        style="dim",
                    ),
                    id="whatif-next",
                )
            with Horizontal(classes="buttons"):
                yield Button("Replay", variant="primary", id="replay")
                yield Button("Try live", variant="success", id="try-live", disabled=self.result is None)
                yield Button("Adjust", variant="warning", id="adjust", disabled=self.result is None)
                yield Button("Close", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#rate", Input).focus()

    def _answer(self, action: str) -> WhatIfAnswer | None:
        rate = self.query_one("#rate", Input).value
        burst = self.query_one("#burst", Input).value.strip()
        algorithm = str(self.query_one("#algorithm", Select).value)
        minutes = self.query_one("#minutes", Input).value.strip()
        parsed = parse_rate(rate)
        problem = None
        if parsed is None:
            problem = "rate: enter N/period, like 50/1s or 1000/1m"
        elif burst and (not burst.isdigit() or int(burst) < 1):
            problem = "burst: a whole number >= 1, or empty"
        elif not minutes.isdigit() or int(minutes) < 1:
            problem = "minutes: a whole number >= 1"
        if problem is not None or parsed is None:
            self.query_one("#whatif-error", Label).update(problem or "")
            return None
        policy: dict[str, Any] = {"algorithm": algorithm, "average": parsed[0], "period": parsed[1]}
        if burst:
            policy["burst"] = int(burst)
        return WhatIfAnswer(action, rate, burst, algorithm, int(minutes), policy)

    @on(Input.Submitted)
    @on(Button.Pressed, "#replay")
    def _replay(self) -> None:
        answer = self._answer("replay")
        if answer is not None:
            self.dismiss(answer)

    @on(Button.Pressed, "#adjust")
    def _adjust(self) -> None:
        answer = self._answer("adjust")
        if answer is not None:
            self.dismiss(answer)

    @on(Button.Pressed, "#try-live")
    def action_try_live(self) -> None:
        """Set the replayed limit as the route's candidate (only once a replay is shown)."""
        if self.result is None:
            self.query_one("#whatif-error", Label).update("replay first: Try live sets the replayed limit")
            return
        answer = self._answer("try")
        if answer is not None:
            self.dismiss(answer)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmAdjustScreen(ReasonDialog):
    """Confirm making the candidate the route's distributed limit, with a required reason."""

    CONFIRM = "Adjust"
    VARIANT = "warning"

    def __init__(self, route: RouteView, answer: WhatIfAnswer, result: WhatIfView | None) -> None:
        super().__init__(f"what-if: {answer.rate}" + (f" burst {answer.burst}" if answer.burst else ""))
        self.route, self.answer, self.result = route, answer, result

    def compose(self) -> ComposeResult:
        p = self.answer.policy
        with Vertical(classes="dialog"):
            yield Label(
                Text.assemble(("Adjust ", ""), (self.route.name, "bold"), ("'s global limit", "")),
                classes="dialog-title",
            )
            burst = f" burst {p['burst']}" if "burst" in p else ""
            text = f"New distributed limit: {p['average']:g} per {p['period']:g}s{burst} ({p['algorithm']})."
            if self.result is not None:
                c = self.result.candidate
                text += f" Its replay rejected {c.rejections:,.0f} of {c.requests:,.0f} ({c.reject_share:.2%})."
            yield Static(text, id="adjust-summary")
            yield Label("Why?", classes="field-label")
            yield from self.reason_widgets()


class ConfirmTryLiveScreen(ReasonDialog):
    """Confirm setting the replayed limit as the route's candidate, with a required reason."""

    CONFIRM = "Try live"
    VARIANT = "success"

    def __init__(self, route: RouteView, answer: WhatIfAnswer, result: WhatIfView | None) -> None:
        super().__init__(f"what-if: {answer.label}")
        self.route, self.answer, self.result = route, answer, result

    def compose(self) -> ComposeResult:
        p = self.answer.policy
        current = self.route.global_policy.describe() if self.route.global_policy else "?"
        with Vertical(classes="dialog"):
            yield Label(
                Text.assemble(("Try ", ""), (self.answer.label, "bold"), (" live on ", ""), (self.route.name, "bold")),
                classes="dialog-title",
            )
            text = (
                f"Candidate limit {self.answer.limit}" + (f" burst {p['burst']}" if "burst" in p else "")
                + f" ({p['algorithm']}), evaluated in shadow beside the global limit {current}: each request is"
                " also decided under it and the answers compared (newly rejected, newly admitted). Nothing is"
                " refused because of it until it is promoted."
            )  # fmt: skip
            if self.route.candidate is not None:
                text += f" It replaces the current candidate {self.route.candidate.limit}."
            if self.result is not None:
                c = self.result.candidate
                text += f" Its replay rejected {c.rejections:,.0f} of {c.requests:,.0f} ({c.reject_share:.2%})."
            yield Static(text, id="try-summary")
            yield Label("Why?", classes="field-label")
            yield from self.reason_widgets()
