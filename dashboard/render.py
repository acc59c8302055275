"""Pure formatting helpers shared by the widgets: sparklines, bars, rates, times."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text

from .models import GateView
from .theme import (
    BAD,
    BAD_BOLD,
    BAD_DIM,
    BADGE_BAD,
    BADGE_OK,
    BADGE_WARN,
    INFO,
    INFO_BOLD,
    OK,
    OK_BOLD,
    TRACK,
    TRACK_FG,
    WARN,
    WARN_BOLD,
)

__all__ = [
    "BREAKER_STYLE",
    "MODE_STYLE",
    "ago",
    "bar",
    "candidate_gate_text",
    "clock",
    "gate_figures",
    "gate_problems",
    "gate_text",
    "mode_text",
    "pct",
    "spark_text",
    "sparkline",
]

BLOCKS = " ▁▂▃▄▅▆▇█"

MODE_STYLE = {"off": "dim", "shadow": INFO_BOLD, "canary": WARN_BOLD, "enforce": OK_BOLD}
BREAKER_STYLE = {"closed": BADGE_OK, "open": BADGE_BAD, "half_open": BADGE_WARN}


def sparkline(values: Sequence[float], width: int | None = None, *, top: float | None = None) -> str:
    """Unicode sparkline of the last ``width`` values; 0 shows as the lowest tick only when
    some value is non-zero, a blank when all are zero."""
    vals = list(values)[-width:] if width else list(values)
    if width and len(vals) < width:
        vals = [0.0] * (width - len(vals)) + vals
    hi = top if top is not None else max(vals, default=0.0)
    if hi <= 0:
        return "▁" * len(vals) if vals else ""
    out = []
    for v in vals:
        if v <= 0:
            out.append("▁")
        else:
            out.append(BLOCKS[max(1, min(8, round(v / hi * 8)))])
    return "".join(out)


def spark_text(
    values: Sequence[float], width: int, colour: str, *, top: float | None = None, zero: str = TRACK_FG
) -> Text:
    """:func:`sparkline` as Text: minutes with data in ``colour``, empty minutes dim."""
    vals = list(values)[-width:]
    vals = [0.0] * (width - len(vals)) + vals
    text = Text()
    for ch, v in zip(sparkline(vals, width, top=top), vals):
        text.append(ch, style=colour if v > 0 else zero)
    return text


def bar(value: float, maximum: float, width: int, *, style: str = INFO, empty: str = TRACK) -> Text:
    """A horizontal bar ``value / maximum`` in ``width`` cells with eighth-cell precision;
    ``style`` colours the filled part, ``empty`` is the background of the rest."""
    text = Text()
    if maximum <= 0 or width <= 0:
        return Text("·" * max(0, width), style=TRACK_FG)
    frac = max(0.0, min(1.0, value / maximum))
    eighths = round(frac * width * 8)
    full, part = divmod(eighths, 8)
    text.append("█" * full, style=style)
    if part and full < width:
        text.append(" ▏▎▍▌▋▊▉"[part], style=empty)
        text.stylize(style, full, full + 1)  # the partial block's colour over the track
        full += 1
    text.append(" " * (width - full), style=empty)
    return text


def amount(n: float) -> str:
    """An amount of a budget's units, short: ``950``, ``14k``, ``2.1M``."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.1f}".removesuffix(".0") + suffix
    return f"{int(n)}"


def pct(rate: float | None, digits: int = 1) -> str:
    if rate is None:
        return "—"
    if rate == 0:
        return "0%"
    if rate < 0.001:
        return "<0.1%"
    return f"{rate * 100:.{digits}f}%"


def ago(at: float | None, now: float) -> str:
    """``3s ago`` style, relative to ``now`` (the snapshot's time, so renders are stable)."""
    if not at:
        return "—"
    d = max(0.0, now - at)
    if d < 1:
        return "now"
    if d < 90:
        return f"{d:.0f}s ago"
    if d < 5400:
        return f"{d / 60:.0f}m ago"
    return f"{d / 3600:.1f}h ago"


def clock(at: float | None) -> str:
    if not at:
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(at))


def mode_text(mode: str, percent: int = 0) -> Text:
    label = f"canary {percent}%" if mode == "canary" else mode
    return Text(label, style=MODE_STYLE.get(mode, ""))


def gate_text(gate: GateView | None) -> Text:
    """Compact gate status for a table cell: ``✔ pass → canary`` or why not, from the figures."""
    if gate is None:
        return Text("—", style="dim")
    if gate.target is None:
        return Text("? " + (gate.reasons[0] if gate.reasons else "unknown"), style=WARN)
    if not gate.required:
        return Text("fully enforced" if gate.target == "enforce" else f"no gate → {gate.target}", style="dim")
    if gate.passed:
        return Text(f"✔ pass → {gate.target_label}", style=OK_BOLD)
    problems = gate_problems(gate)
    text = Text(f"✘ {gate.target_label}: {problems[0]}", style=BAD)
    if len(problems) > 1:
        text.append(f" (+{len(problems) - 1} more)", style=BAD_DIM)
    return text


def candidate_gate_text(gate: GateView | None) -> Text:
    """A candidate's promotion gate for a table cell: ``✔ can promote`` or why not yet."""
    if gate is None:
        return Text("promote: no figures yet", style="dim")
    if gate.passed:
        return Text("✔ can promote", style=OK_BOLD)
    problems = gate_problems(gate, dwell="dwell {0:.0f}s of {1:.0f}s")
    text = Text(f"✘ promote: {problems[0]}", style=BAD)
    if len(problems) > 1:
        text.append(f" (+{len(problems) - 1} more)", style=BAD_DIM)
    return text


def gate_problems(gate: GateView, *, dwell: str = "in step {0:.0f}s/{1:.0f}s") -> list[str]:
    """The gate's failed checks, short and most serious first (full sentences are in
    ``gate.reasons``); ``dwell`` words the time checked against the minimum."""
    if not gate.has_figures:
        return list(gate.reasons) or ["refused"]
    out = []
    if (
        gate.new_rejection_rate is not None
        and gate.max_new_rejection_rate is not None
        and gate.new_rejection_rate > gate.max_new_rejection_rate
    ):
        out.append(f"new rej {pct(gate.new_rejection_rate)} > {pct(gate.max_new_rejection_rate)}")
    if (
        gate.backend_error_rate is not None
        and gate.max_backend_error_rate is not None
        and gate.backend_error_rate > gate.max_backend_error_rate
    ):
        out.append(f"errors {pct(gate.backend_error_rate, 2)} > {pct(gate.max_backend_error_rate, 2)}")
    if gate.min_samples is not None and (gate.compared or 0) < gate.min_samples:
        out.append(f"samples {gate.compared}/{gate.min_samples}")
    if (
        gate.sampled_share is not None
        and gate.min_sampled_share is not None
        and gate.sampled_share < gate.min_sampled_share
    ):
        out.append(f"sampled {pct(gate.sampled_share)} < {pct(gate.min_sampled_share)}")
    if gate.in_step_s is not None and gate.min_dwell_s is not None and gate.in_step_s < gate.min_dwell_s:
        out.append(dwell.format(gate.in_step_s, gate.min_dwell_s))
    return out or list(gate.reasons) or ["refused"]


def gate_figures(gate: GateView | None) -> Text:
    """Multi-line gate figures for the confirmation and refusal dialogs."""
    t = Text()
    if gate is None or not gate.has_figures:
        t.append("no gate figures available" + (f": {gate.reasons[0]}" if gate and gate.reasons else ""), style="dim")
        return t
    window = f"last {gate.window_s}s" if gate.window_s else "gate window"

    def row(label: str, value: str, limit: str, ok: bool) -> None:
        t.append(f"  {label:<18}", style="bold")
        t.append(f"{value:<12}", style=OK if ok else BAD_BOLD)
        t.append(f"{limit}\n", style="dim")

    row(
        "compared",
        f"{gate.compared:,}",
        f"need ≥ {gate.min_samples:,} ({window})",
        (gate.compared or 0) >= (gate.min_samples or 0),
    )
    nr, mnr = gate.new_rejection_rate or 0.0, gate.max_new_rejection_rate or 0.0
    row(
        "new rejections",
        pct(nr, 2),
        f"max {pct(mnr, 2)}" + (f" · {gate.new_rejections:,} requests" if gate.new_rejections is not None else ""),
        nr <= mnr,
    )
    be, mbe = gate.backend_error_rate or 0.0, gate.max_backend_error_rate or 0.0
    row("backend errors", pct(be, 2), f"max {pct(mbe, 2)}", be <= mbe)
    if gate.sampled_share is not None:
        ms = gate.min_sampled_share or 0.0
        dropped = f" · {gate.shadow_dropped:,} dropped" if gate.shadow_dropped else ""
        row("sampled", pct(gate.sampled_share), f"min {pct(ms)}{dropped}", gate.sampled_share >= ms)
    if gate.min_dwell_s and gate.in_step_s is not None:
        row("dwell", f"{gate.in_step_s:.0f}s", f"min {gate.min_dwell_s:.0f}s", gate.in_step_s >= gate.min_dwell_s)
    return t
