"""Divergence over time: per route, one sparkline per class (agree, new rejections, reverse)
over the last hour, one column per minute, sized to the panel."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widget import Widget

from .models import DivergenceView
from .render import pct, spark_text

__all__ = ["DivergenceChart"]

LABEL = 14
SERIES = (
    ("agree", "agree", "#9ece6a"),
    ("new rej", "local_allow_distributed_deny", "#f7768e"),
    ("reverse", "local_deny_distributed_allow", "#e0af68"),
)


class DivergenceChart(Widget):
    """Render-only: ``show()`` hands it the divergence view; it draws what fits."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._view: DivergenceView | None = None
        self._order: list[str] = []
        self._selected: str | None = None

    def show(self, view: DivergenceView | None, order: Sequence[str], selected: str | None) -> None:
        self._view, self._order, self._selected = view, list(order), selected
        self.refresh(layout=True)

    def get_content_height(self, container: object, viewport: object, width: int) -> int:
        if self._view is None:
            return 1
        assert self._view is not None
        return sum(4 + bool(self._view.routes[n].would_be_blocked) for n in self._names()) + 1

    def _names(self) -> list[str]:
        if self._view is None:
            return []
        names = [n for n in self._order if n in self._view.routes]
        return names + [n for n in self._view.routes if n not in names]

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
            out.append(f"{name:<{LABEL}}", style="bold reverse" if name == self._selected else "bold")
            out.append(f" {tot.compared:,} compared · ", style="dim")
            out.append(
                f"{pct(tot.new_rejection_rate, 2)} new rej.",
                style="#f7768e" if tot.local_allow_distributed_deny else "dim",
            )
            out.append(
                f" · {pct(tot.reverse_rate, 2)} reverse", style="#e0af68" if tot.local_deny_distributed_allow else "dim"
            )
            if tot.backend_errors:
                out.append(f" · {tot.backend_errors:,} backend errors", style="bold #f7768e")
            if tot.sampled_share is not None:
                out.append(f" · {pct(tot.sampled_share)} sampled", style="bold #e0af68" if tot.sampled else "dim")
            out.append("\n")
            # the two directions share one scale so they compare; agree has its own
            both = max((max(p.local_allow_distributed_deny, p.local_deny_distributed_allow) for p in series), default=0)
            for label, attr, colour in SERIES:
                vals = [float(getattr(p, attr)) for p in series]
                total = int(getattr(tot, attr))  # the whole window, like the header
                out.append(f"  {label:<{LABEL - 3}} ", style="dim")
                out.append_text(spark_text(vals, minutes, colour, top=None if attr == "agree" else float(both)))
                out.append(f" {_short(total):>7}\n", style=colour if total else "dim")
            if rd.would_be_blocked:
                out.append(f"  {'would block':<{LABEL - 3}} ", style="dim")
                out.append(" · ".join(f"{b.key} ×{b.count:,}" for b in rd.would_be_blocked[:4]) + "\n", style="#f7768e")
        out.append(_axis(minutes), style="dim")
        return out


def _short(n: int) -> str:
    return f"{n / 1_000_000:.1f}M" if n >= 1_000_000 else f"{n / 1000:.1f}k" if n >= 10_000 else f"{n:,}"


def _axis(minutes: int) -> str:
    left = f"-{minutes}m"
    return " " * LABEL + left + "now".rjust(max(0, minutes - len(left)))
