"""The dashboard's colours, taken from the running Textual theme.

The Python code draws only with the style names below (``OK``, ``BAD_BOLD``, ``BADGE_WARN`` ...;
Rich named styles ``sl.*``), never with a colour. :data:`ROLES` is the one mapping from those
names to Textual theme variables (``$text-success``, ``$error``, ``$surface`` ...):
:func:`use_theme` resolves it against the current theme's variables and installs the result on
the app's Rich console, which Textual uses to draw Rich text. The app calls it whenever Textual
computes its CSS variables (at start and on every theme change), so a light theme (textual-light,
solarized-light, ...) gets dark status colours on its light panels and a dark theme light ones.

Status is never told by colour alone: modes, breaker states and gate results are words or
symbols (``✔``/``✘``), and the selected route has a ``▶`` marker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rich.console import Console
from rich.style import Style
from rich.theme import Theme
from textual.color import Color

__all__ = [
    "BADGE_BAD",
    "BADGE_INFO",
    "BADGE_NOTE",
    "BADGE_OK",
    "BADGE_WARN",
    "BAD",
    "BAD_BOLD",
    "BAD_DIM",
    "HINT",
    "INFO",
    "INFO_BOLD",
    "OK",
    "OK_BOLD",
    "ROLES",
    "SELECTED_MARK",
    "TRACK",
    "TRACK_FG",
    "WARN",
    "WARN_BOLD",
    "Role",
    "contrast",
    "legible",
    "resolve",
    "rich_theme",
    "use_theme",
]

#: drawn before the selected route (routes table and divergence panel): selection is never colour alone
SELECTED_MARK = "▶"

OK = "sl.ok"
OK_BOLD = "sl.ok.bold"
WARN = "sl.warn"
WARN_BOLD = "sl.warn.bold"
BAD = "sl.bad"
BAD_BOLD = "sl.bad.bold"
BAD_DIM = "sl.bad.dim"
INFO = "sl.info"
INFO_BOLD = "sl.info.bold"
HINT = "sl.hint"
TRACK = "sl.track"  # the empty part of a bar (a background)
TRACK_FG = "sl.track.fg"  # empty minutes of a sparkline
BADGE_OK = "sl.badge.ok"
BADGE_WARN = "sl.badge.warn"
BADGE_BAD = "sl.badge.bad"
BADGE_INFO = "sl.badge.info"
BADGE_NOTE = "sl.badge.note"


@dataclass(frozen=True)
class Role:
    """A style in theme terms: a foreground variable, or a badge on a background variable
    (its text then takes the contrasting colour), plus text attributes."""

    fg: str | None = None
    bg: str | None = None
    bold: bool = False
    dim: bool = False
    italic: bool = False


#: the only place the dashboard's Python code names colours (as Textual theme variables)
ROLES: dict[str, Role] = {
    OK: Role("text-success"),
    OK_BOLD: Role("text-success", bold=True),
    WARN: Role("text-warning"),
    WARN_BOLD: Role("text-warning", bold=True),
    BAD: Role("text-error"),
    BAD_BOLD: Role("text-error", bold=True),
    BAD_DIM: Role("text-error", dim=True),
    INFO: Role("text-primary"),
    INFO_BOLD: Role("text-primary", bold=True),
    HINT: Role("text-secondary", italic=True),
    TRACK: Role(bg="track"),
    TRACK_FG: Role("track"),
    BADGE_OK: Role(bg="success", bold=True),
    BADGE_WARN: Role(bg="warning", bold=True),
    BADGE_BAD: Role(bg="error", bold=True),
    BADGE_INFO: Role(bg="primary", bold=True),
    BADGE_NOTE: Role(bg="secondary", bold=True),
}

#: how much of the foreground an empty bar or sparkline minute mixes into the panel's surface
TRACK_MIX = 0.22
#: the least contrast (WCAG ratio) a text colour keeps against the panels (``$surface``, and
#: ``$panel`` under dialogs): one that has less is lightened (dark theme) or darkened (light
#: theme) until it has it; a terminal's own ANSI colours are left to the terminal
MIN_CONTRAST = 4.5


def resolve(variables: Mapping[str, str], name: str) -> Color:
    """One theme variable as an opaque colour (a translucent one laid over the surface);
    ``track`` is the surface mixed a little towards the foreground (in a theme of the
    terminal's own ANSI colours, whose surface is transparent: the terminal's foreground)."""
    surface = _colour(variables, "surface", None)
    if name == "track":
        foreground = _colour(variables, "foreground", surface)
        if foreground.ansi is not None or Color.parse(variables.get("surface", "")).a == 0:
            return foreground
        return surface.blend(foreground, TRACK_MIX)
    return _colour(variables, name, surface)


def _colour(variables: Mapping[str, str], name: str, under: Color | None) -> Color:
    raw = variables.get(name, "")
    try:
        colour = Color.parse(raw)
    except Exception as exc:  # a theme without it, or "auto 87%": a theme bug, say which
        raise ValueError(f"theme variable ${name} is not a colour: {raw!r}") from exc
    if colour.ansi is not None:  # the terminal's own colour: left to the terminal
        return colour
    if colour.a < 1 and under is not None:
        colour = under + colour
    return colour.with_alpha(1.0)


def contrast(a: Color, b: Color) -> float:
    """The WCAG contrast ratio of two opaque colours (1 to 21)."""

    def luminance(c: Color) -> float:
        def channel(v: int) -> float:
            x = v / 255
            return x / 12.92 if x <= 0.03928 else float(((x + 0.055) / 1.055) ** 2.4)

        return 0.2126 * channel(c.r) + 0.7152 * channel(c.g) + 0.0722 * channel(c.b)

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def legible(colour: Color, backgrounds: list[Color]) -> Color:
    """``colour``, lightened or darkened (keeping its hue) until it has :data:`MIN_CONTRAST`
    against every one of ``backgrounds``."""
    if colour.ansi is not None:
        return colour
    dark = backgrounds[0].brightness < 0.5
    out = colour
    for step in range(1, 21):
        if min(contrast(out, bg) for bg in backgrounds) >= MIN_CONTRAST:
            break
        out = colour.lighten(0.04 * step) if dark else colour.darken(0.04 * step)
    return out


def rich_theme(variables: Mapping[str, str]) -> Theme:
    """:data:`ROLES` resolved against one Textual theme's variables (``App.theme_variables``)."""
    styles: dict[str, Style] = {}
    panels = [resolve(variables, "surface"), resolve(variables, "panel")]
    for name, role in ROLES.items():
        fg = resolve(variables, role.fg) if role.fg else None
        bg = resolve(variables, role.bg) if role.bg else None
        if bg is not None and fg is None:
            fg = bg + bg.get_contrast_text(0.9)
        elif fg is not None and bg is None and role.fg != "track":
            fg = legible(fg, panels)
        if bg is not None and bg.ansi is not None and role.bg == "track":
            bg = None  # the terminal's own background: an empty bar is just empty
        styles[name] = Style(
            color=fg.rich_color if fg else None,
            bgcolor=bg.rich_color if bg else None,
            bold=role.bold or None,
            dim=role.dim or (role.fg == "track" and fg is not None and fg.ansi is not None) or None,
            italic=role.italic or None,
        )
    return Theme(styles, inherit=False)


def use_theme(console: Console, variables: Mapping[str, str], *, replace: bool) -> None:
    """Install the styles for ``variables`` on ``console`` (``replace``: drop the ones installed
    before, so switching themes does not pile them up)."""
    if replace:
        console.pop_theme()
    console.push_theme(rich_theme(variables))
