"""The dashboard draws with theme colours only: no colour literal in its Python sources or its
stylesheet (so hard-coded colours cannot come back), every named style it uses is defined, and
the styles resolved from Textual's themes keep status legible and distinct in dark and light."""

from __future__ import annotations

import ast
import colorsys
import re
from pathlib import Path

import pytest
from rich.errors import StyleSyntaxError
from rich.style import Style
from textual.app import App
from textual.color import Color, ColorParseError
from textual.theme import BUILTIN_THEMES

from dashboard.theme import (
    BAD,
    BADGE_BAD,
    BADGE_INFO,
    BADGE_NOTE,
    BADGE_OK,
    BADGE_WARN,
    INFO,
    MIN_CONTRAST,
    OK,
    ROLES,
    TRACK_FG,
    WARN,
    contrast,
    resolve,
    rich_theme,
)

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboard"
HEX = re.compile(r"#[0-9a-fA-F]{3}(?:[0-9a-fA-F]{3})?(?:[0-9a-fA-F]{2})?\b")


def colour_literals(source: str, filename: str = "<source>") -> list[str]:
    """String constants in Python ``source`` that are colours: a hex colour anywhere in the
    text, or a string that parses as a Rich style with a foreground or background colour
    (``"red"``, ``"bold #f7768e"``, ``"on grey23"``, ``"rgb(1,2,3)"``)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        text = node.value
        if HEX.search(text):
            found.append(f"{filename}:{node.lineno}: {text!r}")
            continue
        try:
            style = Style.parse(text)
        except StyleSyntaxError:
            continue
        if style.color is not None or style.bgcolor is not None:
            found.append(f"{filename}:{node.lineno}: {text!r}")
    return found


def tcss_colour_literals(css: str) -> list[str]:
    """Values in a Textual stylesheet that are colours rather than ``$variables``."""
    found = []
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    for lineno, line in enumerate(css.splitlines(), 1):
        if ":" not in line or line.rstrip().endswith("{"):
            continue
        value = line.split(":", 1)[1].strip().rstrip(";")
        if HEX.search(value) or re.search(r"\b(rgba?|hsla?)\(", value):
            found.append(f"{lineno}: {line.strip()}")
            continue
        for word in value.split():
            if word.startswith("$") or re.fullmatch(r"[\d.]+%?|\d+fr", word):
                continue
            try:
                Color.parse(word)
            except ColorParseError:
                continue
            found.append(f"{lineno}: {line.strip()} ({word} is a colour)")
    return found


def test_the_detectors_find_what_the_dashboard_used_to_hard_code() -> None:
    old = (
        'MODE_STYLE = {"shadow": "bold #7aa2f7"}\n'
        'BADGE = ("x", "bold #1e1e1e on #9ece6a")\n'
        'f(style="red")\nf(style="on grey23")\nf(style="dim")\nf(style="sl.bad")\nf("Redis unavailable")\n'
    )
    assert [hit.split(": ", 1)[1] for hit in colour_literals(old)] == [
        "'bold #7aa2f7'",
        "'bold #1e1e1e on #9ece6a'",
        "'red'",
        "'on grey23'",
    ]
    css = "A {\n    color: red;\n    background: #112233 40%;\n    border: round $primary 60%;\n}\n"
    assert [hit.split(":")[0] for hit in tcss_colour_literals(css)] == ["2", "3"]


@pytest.mark.parametrize("path", sorted(DASHBOARD.glob("*.py")), ids=lambda p: p.name)
def test_no_colour_literal_in_the_dashboards_python(path: Path) -> None:
    assert colour_literals(path.read_text(encoding="utf-8"), path.name) == []


def test_no_colour_literal_in_the_dashboards_stylesheet() -> None:
    css = (DASHBOARD / "dashboard.tcss").read_text(encoding="utf-8")
    assert tcss_colour_literals(css) == []
    assert "$" in css  # it does colour things, with theme variables


def test_every_named_style_in_the_sources_is_defined() -> None:
    used = set()
    for path in DASHBOARD.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("sl."):
                used.add(node.value)
    assert used and used <= set(ROLES)


def variables(theme: str) -> dict[str, str]:
    """A theme's CSS variables, computed the way a running app does."""
    app = App[None]()
    app.theme = theme
    return app.get_css_variables()


def fg(styles: dict[str, Style], name: str) -> Color:
    colour = styles[name].color
    assert colour is not None
    t = colour.get_truecolor()
    return Color(t.red, t.green, t.blue)


def bg(styles: dict[str, Style], name: str) -> Color:
    colour = styles[name].bgcolor
    assert colour is not None
    t = colour.get_truecolor()
    return Color(t.red, t.green, t.blue)


def hue_gap(a: Color, b: Color) -> float:
    ha = colorsys.rgb_to_hls(a.r / 255, a.g / 255, a.b / 255)[0] * 360
    hb = colorsys.rgb_to_hls(b.r / 255, b.g / 255, b.b / 255)[0] * 360
    d = abs(ha - hb) % 360
    return min(d, 360 - d)


@pytest.mark.parametrize("theme", sorted(BUILTIN_THEMES))
def test_every_builtin_theme_gives_legible_status_colours(theme: str) -> None:
    v = variables(theme)
    styles = rich_theme(v).styles
    assert set(ROLES) <= set(styles)
    status = (OK, WARN, BAD, INFO)
    if theme.startswith("ansi-"):
        # the terminal's own palette: four distinct ANSI colours; empty minutes its foreground, dimmed
        numbers = [styles[name].color.number for name in status]  # type: ignore[union-attr]
        assert None not in numbers and len(set(numbers)) == len(status), (theme, numbers)
        track = styles[TRACK_FG]
        assert track.dim and track.color is not None and track.color.is_default
        return
    panels = [resolve(v, "surface"), resolve(v, "panel")]
    text = [name for name, role in ROLES.items() if role.bg is None and role.fg != "track"]
    assert set(status) <= set(text)
    for name in text:
        assert min(contrast(fg(styles, name), p) for p in panels) >= MIN_CONTRAST, (theme, name)
    assert fg(styles, TRACK_FG) != panels[0]  # empty minutes still show


@pytest.mark.parametrize("theme", ["textual-dark", "textual-light"])
def test_status_stays_distinguishable_in_dark_and_light(theme: str) -> None:
    v = variables(theme)
    styles = rich_theme(v).styles
    ok, warn, bad = fg(styles, OK), fg(styles, WARN), fg(styles, BAD)
    for a, b in ((ok, warn), (ok, bad), (warn, bad)):
        assert hue_gap(a, b) >= 30, (theme, a.hex, b.hex)
    surface = resolve(v, "surface")
    dark = BUILTIN_THEMES[theme].dark
    for colour in (ok, warn, bad):  # light text on a dark theme, dark text on a light one
        assert (colour.brightness > surface.brightness) == dark
    for badge in (BADGE_OK, BADGE_WARN, BADGE_BAD, BADGE_INFO, BADGE_NOTE):
        assert contrast(fg(styles, badge), bg(styles, badge)) >= 3, (theme, badge)
    assert len({bg(styles, b) for b in (BADGE_OK, BADGE_WARN, BADGE_BAD)}) == 3  # breaker states differ
