"""Divergence over time: per route, one sparkline per class (agree, new rejections, reverse)
over the last hour, one column per minute, sized to the panel; why the two limits disagree,
in words (the shares of each cause, docs/rollout-runbook.md#why-they-disagree), and the keys
a limit would block with each one's cause; under a route with a candidate limit, the
candidate's comparisons with the current limit and its newly rejected requests per minute."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.geometry import Region
from textual.widget import Widget

from .models import BlockedKey, CandidateView, CausesView, DivergenceView, UnitsView
from .render import amount, pct, spark_text
from .theme import BAD, BAD_BOLD, INFO_BOLD, OK, SELECTED_MARK, WARN, WARN_BOLD

__all__ = ["DivergenceChart", "candidate_lines"]

LABEL = 14
SERIES = (
    ("agree", "agree", OK),
    ("new rej", "local_allow_distributed_deny", BAD),
    ("reverse", "local_deny_distributed_allow", WARN),
)


class DivergenceChart(Widget):
    """Render-only: ``show()`` hands it the divergence view; it draws every route (its
    scrolling parent shows what does not fit) and, when the selection changes, scrolls that
    parent to the selected route's block, which is marked ``▶``."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._view: DivergenceView | None = None
        self._order: list[str] = []
        self._selected: str | None = None

    def show(self, view: DivergenceView | None, order: Sequence[str], selected: str | None) -> None:
        reveal = selected != self._selected or (self._view is None and view is not None)
        self._view, self._order, self._selected = view, list(order), selected
        self.refresh(layout=True)
        if reveal and selected is not None:
            self.call_after_refresh(self.reveal_selected)

    def get_content_height(self, container: object, viewport: object, width: int) -> int:
        if self._view is None:
            return 1
        return sum(self._block_height(n) for n in self._names()) + 1

    def _block_height(self, name: str) -> int:
        assert self._view is not None
        rd = self._view.routes[name]
        cand = 0 if rd.candidate is None else 2 + bool(rd.candidate.would_be_blocked)
        return 4 + len(_why(rd.causes)) + bool(rd.would_be_blocked) + cand + (rd.units is not None)

    def _names(self) -> list[str]:
        if self._view is None:
            return []
        names = [n for n in self._order if n in self._view.routes]
        return names + [n for n in self._view.routes if n not in names]

    def block(self, name: str) -> tuple[int, int] | None:
        """The first line and the height of ``name``'s block (the last one includes the time axis)."""
        names = self._names()
        if name not in names:
            return None
        top = sum(self._block_height(n) for n in names[: names.index(name)])
        return top, self._block_height(name) + (name == names[-1])

    def reveal_selected(self) -> None:
        """Scroll the parent container so the selected route's block is in view."""
        where = self.block(self._selected) if self._selected else None
        if where is None or not isinstance(self.parent, Widget):
            return
        top, height = where
        region = Region(0, self.virtual_region.y + top, 1, height)
        self.parent.scroll_to_region(region, animate=False, immediate=True, x_axis=False)

    def render(self) -> Text:
        if self._view is None:
            return Text("divergence unavailable (waiting for data, or Redis is down)", style="dim")
        width = max(10, self.content_size.width - LABEL - 9)
        minutes = min(width, self._view.minutes)
        out = Text(no_wrap=True, overflow="ellipsis")
        for name in self._names():
            rd = self._view.routes[name]
            series = list(rd.series)[-minutes:]
            tot = rd.totals
            if name == self._selected:
                out.append(f"{SELECTED_MARK} {name:<{LABEL - 2}}", style="bold reverse")
            else:
                out.append(f"  {name:<{LABEL - 2}}", style="bold")
            out.append(f" {tot.compared:,} compared · ", style="dim")
            out.append(
                f"{pct(tot.new_rejection_rate, 2)} new rej.",
                style=BAD if tot.local_allow_distributed_deny else "dim",
            )
            out.append(
                f" · {pct(tot.reverse_rate, 2)} reverse", style=WARN if tot.local_deny_distributed_allow else "dim"
            )
            if tot.backend_errors:
                out.append(f" · {tot.backend_errors:,} backend errors", style=BAD_BOLD)
            if tot.sampled_share is not None:
                out.append(f" · {pct(tot.sampled_share)} sampled", style=WARN_BOLD if tot.sampled else "dim")
            out.append("\n")
            # the two directions share one scale so they compare; agree has its own
            both = max((max(p.local_allow_distributed_deny, p.local_deny_distributed_allow) for p in series), default=0)
            for label, attr, colour in SERIES:
                vals = [float(getattr(p, attr)) for p in series]
                total = int(getattr(tot, attr))  # the whole window, like the header
                out.append(f"  {label:<{LABEL - 3}} ", style="dim")
                out.append_text(spark_text(vals, minutes, colour, top=None if attr == "agree" else float(both)))
                out.append(f" {_short(total):>7}\n", style=colour if total else "dim")
            for label, words in _why(rd.causes):
                out.append(f"  {label:<{LABEL - 3}} ", style="dim")
                out.append(words + "\n")
            if rd.units is not None:  # a budget route: the same in its cost unit
                out.append(f"  {'in ' + rd.units.unit:<{LABEL - 3}} ", style="dim")
                out.append_text(_units_line(rd.units))
            if rd.would_be_blocked:
                out.append(f"  {'would block':<{LABEL - 3}} ", style="dim")
                _blocked(out, rd.would_be_blocked[:4], None if rd.units is None else rd.units.unit)
            if rd.candidate is not None:
                candidate_lines(out, rd.candidate, minutes)
        out.append(_axis(minutes), style="dim")
        return out


def candidate_lines(out: Text, c: CandidateView, minutes: int) -> None:
    """Two or three lines: the candidate and its totals since it was set, its newly rejected
    requests per minute, the keys it would newly reject."""
    out.append(f"  {'↳ candidate':<{LABEL - 3}} ", style=INFO_BOLD)
    out.append(c.limit, style="bold")
    t = c.totals
    if t is None:
        out.append(" · no figures yet\n", style="dim")
    else:
        out.append(f" · {t.compared:,} compared · ", style="dim")
        out.append(f"{pct(t.newly_rejected_share, 2)} newly rejected", style=BAD if t.newly_rejected else "dim")
        out.append(f" · {pct(t.newly_admitted_share, 2)} newly admitted\n", style=WARN if t.newly_admitted else "dim")
    series = list(c.series)[-minutes:]
    out.append(f"  {'cand. rej':<{LABEL - 3}} ", style="dim")
    out.append_text(spark_text([float(p.newly_rejected) for p in series], minutes, BAD))
    total = t.newly_rejected if t is not None else 0
    out.append(f" {_short(total):>7}\n", style=BAD if total else "dim")
    if c.would_be_blocked:
        out.append(f"  {'cand. block':<{LABEL - 3}} ", style="dim")
        out.append(" · ".join(f"{b.key} ×{b.count:,}" for b in c.would_be_blocked[:4]) + "\n", style=BAD)


def _why(causes: CausesView | None) -> list[tuple[str, str]]:
    """The lines that say why the limits disagree, (label, words), one per direction with
    divergent decisions: the server's shares in words, or that the route explains nothing."""
    if causes is None:
        return []
    lines = []
    for label, shares in (("why new rej", causes.new_rejections), ("why reverse", causes.reverse)):
        if shares.total <= 0:
            continue
        if not causes.explain:
            lines.append((label, "not explained (explain: false in the rules)"))
        elif shares.summary:
            lines.append((label, shares.summary))
    return lines


def _units_line(u: UnitsView) -> Text:
    """A budget route's new rejections in its unit, on one line: how many, what they would cost,
    how much of that is still an estimate."""
    n = u.requests
    line = Text(f"would refuse {n:,} request{'' if n == 1 else 's'} worth {amount(u.units)} {u.unit}")
    line.stylize(BAD if n else "dim")
    if u.estimated:
        line.append(f" · {amount(u.estimated)} estimated", style="dim")
    line.append("\n")
    return line


def _blocked(out: Text, keys: Sequence[BlockedKey], unit: str | None = None) -> None:
    """The keys a limit would block, each with its count, what its refusals would cost (a budget
    route's, in its ``unit``) and, when known, its main cause."""
    for i, b in enumerate(keys):
        if i:
            out.append(" · ", style=BAD)
        out.append(f"{b.key} ×{b.count:,}", style=BAD)
        if unit is not None and b.units is not None:
            out.append(f" ({amount(b.units)} {unit})", style=BAD)
        if b.cause:
            out.append(" ")
            out.append(b.cause, style="italic")
    out.append("\n")


def _short(n: int) -> str:
    return f"{n / 1_000_000:.1f}M" if n >= 1_000_000 else f"{n / 1000:.1f}k" if n >= 10_000 else f"{n:,}"


def _axis(minutes: int) -> str:
    left = f"-{minutes}m"
    return " " * LABEL + left + "now".rjust(max(0, minutes - len(left)))
