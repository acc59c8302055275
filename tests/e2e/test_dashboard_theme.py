"""The dashboard in light and dark themes, and with more routes than the screen holds: a
light-theme snapshot, a theme switch through the command palette restyling what is on screen,
the theme option (``theme=``, ``--theme``, SHADOWLIMIT_DASHBOARD_THEME), and every route reachable
in the divergence panel at 160x50. Driven with Textual's pilot on fixed snapshots (the
routes table's ▶ marker against a real control plane is in test_dashboard.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from test_dashboard import SIZE, TOKEN, dash, fixed_app, fixed_snapshot, utc, wait_for  # noqa: F401 (utc: a fixture)
from textual.color import Color
from textual.command import CommandPalette
from textual.containers import VerticalScroll
from textual.pilot import Pilot

from dashboard.__main__ import main as dashboard_main
from dashboard.app import THEME_ENV, ShadowlimitDashboard
from dashboard.chart import DivergenceChart
from dashboard.models import Snapshot
from dashboard.theme import BAD, SELECTED_MARK, resolve, rich_theme
from dashboard.widgets import BackendPanel, RoutesTable

MANY = 15


def many_routes(n: int = MANY) -> dict[str, Any]:
    """The fixed snapshot plus ``n`` routes like checkout (route-00 ... route-NN, last)."""
    data = fixed_snapshot()
    like = data["routes"][1]
    div = data["divergence"]["routes"]["checkout"]
    for i in range(n):
        name = f"route-{i:02d}"
        route = copy.deepcopy(like)
        route["name"] = route["rule"]["name"] = name
        data["routes"].append(route)
        data["divergence"]["routes"][name] = copy.deepcopy(div)
    return data


def many_app(**kwargs: Any) -> ShadowlimitDashboard:
    kwargs.setdefault("theme", "textual-dark")
    return ShadowlimitDashboard(
        "http://control-plane.test:8080", TOKEN, snapshot=Snapshot.parse(many_routes()), **kwargs
    )


def visible_chart_lines(app: ShadowlimitDashboard) -> list[str]:
    """The divergence panel's lines that are in view now (its scroll offset and height)."""
    box = dash(app).query_one("#chart-box", VerticalScroll)
    lines = str(dash(app).query_one(DivergenceChart).render()).splitlines()
    top = round(box.scroll_y)
    return lines[top : top + box.scrollable_content_region.height]


def style_hex(app: ShadowlimitDashboard, name: str) -> str:
    colour = app.console.get_style(name).color
    assert colour is not None
    return colour.get_truecolor().hex.upper()


# -- light theme ------------------------------------------------------------------------------


@pytest.mark.usefixtures("utc")
def test_snapshot_main_screen_light_160x50(snap_compare: Any) -> None:
    assert snap_compare(fixed_app(theme="textual-light"), terminal_size=SIZE)


@pytest.mark.usefixtures("utc")
def test_snapshot_many_routes_last_selected_light_160x50(snap_compare: Any) -> None:
    async def to_last(pilot: Pilot[Any]) -> None:
        await pilot.press("ctrl+end")
        await pilot.pause()

    assert snap_compare(many_app(theme="textual-light"), run_before=to_last, terminal_size=SIZE)


@pytest.mark.usefixtures("utc")
async def test_the_theme_palette_switch_restyles_what_is_on_screen() -> None:
    """ctrl+p → Theme → textual-light: the Rich-drawn panels take the light theme's colours
    (the ones already converted for display too), not only the CSS-styled parts."""
    app = fixed_app(theme="textual-dark")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        dark = {**app.theme_variables}
        dark_bad = style_hex(app, BAD)
        panel = dash(app).query_one(BackendPanel)
        assert dark_bad in panel_colours(panel)

        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="the command palette")
        await pilot.press(*"theme", "enter")
        await pilot.pause(0.3)
        await pilot.press(*"textual-light")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.theme == "textual-light", what="the theme switch")
        await wait_for(pilot, lambda: not isinstance(app.screen, CommandPalette), what="the palette to close")
        await pilot.pause()

        light_bad = style_hex(app, BAD)
        expected = rich_theme(app.theme_variables).styles[BAD].color
        assert expected is not None and light_bad == expected.get_truecolor().hex.upper()
        assert light_bad != dark_bad
        # a light theme's error colour is darker than its panels, a dark theme's lighter
        assert Color.parse(light_bad).brightness < resolve(app.theme_variables, "surface").brightness
        assert Color.parse(dark_bad).brightness > resolve(dark, "surface").brightness
        colours = panel_colours(panel)
        assert light_bad in colours and dark_bad not in colours  # the Backend panel was redrawn
        assert str(app.screen.query_one(RoutesTable).get_cell("search", "sel")) == SELECTED_MARK


def panel_colours(panel: BackendPanel) -> set[str]:
    """The foreground colours the panel draws with now (from its rendered lines)."""
    out = set()
    for y in range(panel.size.height):
        for segment in panel.render_line(y):
            if segment.style is not None and segment.style.color is not None:
                out.add(segment.style.color.get_truecolor().hex.upper())
    return out


# -- the theme option -------------------------------------------------------------------------


async def test_the_theme_option_and_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THEME_ENV, "solarized-light")
    app = ShadowlimitDashboard("http://control-plane.test:8080", TOKEN, snapshot=Snapshot.parse(fixed_snapshot()))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.theme == "solarized-light"
    # theme= wins over the environment
    app = fixed_app(theme="textual-light")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.theme == "textual-light"
    # an unknown name in the environment: Textual's default, and a notification naming the variable
    monkeypatch.setenv(THEME_ENV, "no-such-theme")
    app = ShadowlimitDashboard("http://control-plane.test:8080", TOKEN, snapshot=Snapshot.parse(fixed_snapshot()))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause()
        assert app.theme == "textual-dark"
        assert app.theme_problem is not None and "no-such-theme" in app.theme_problem
        await wait_for(pilot, lambda: THEME_ENV in app.export_screenshot(), what="the notification on screen")
        assert "no-such-theme" in app.export_screenshot()
    with pytest.raises(ValueError, match="theme: unknown Textual theme 'nope'"):
        ShadowlimitDashboard("http://control-plane.test:8080", TOKEN, theme="nope")


@pytest.mark.parametrize(("argv", "env", "names"), [(["--theme", "nope"], None, "--theme"), ([], "nope", THEME_ENV)])
def test_python_m_dashboard_refuses_an_unknown_theme(
    argv: list[str], env: str | None, names: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if env is not None:
        monkeypatch.setenv(THEME_ENV, env)
    else:
        monkeypatch.delenv(THEME_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_:
        dashboard_main(["--url", "http://127.0.0.1:9", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{names}: unknown theme 'nope'" in err and "textual-light" in err and "Traceback" not in err


# -- many routes at 160x50 ----------------------------------------------------------------------


@pytest.mark.usefixtures("utc")
async def test_the_last_of_many_routes_is_reachable_in_the_divergence_panel() -> None:
    """15 extra routes at 160x50: the panel scrolls; selecting the last route brings its
    block (and the time axis) into view; the panel also scrolls by itself with the keys, and a
    fresh snapshot does not pull it back."""
    app = many_app()
    last = f"route-{MANY - 1:02d}"
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        box = dash(app).query_one("#chart-box", VerticalScroll)
        assert box.max_scroll_y > 0  # more than fits: this is the case being tested
        assert not any(last in line for line in visible_chart_lines(app))

        await pilot.press("ctrl+end")  # the last route in the routes table
        await wait_for(pilot, lambda: dash(app).selected == last, what="the last route selected")
        await wait_for(
            pilot,
            lambda: any(line.startswith(f"{SELECTED_MARK} {last}") for line in visible_chart_lines(app)),
            what="the last route's block in view",
        )
        seen = visible_chart_lines(app)  # its whole block and the time axis
        assert seen[-5].startswith(f"{SELECTED_MARK} {last}")
        assert [line.split()[0] for line in seen[-4:-1]] == ["agree", "new", "reverse"]
        assert seen[-1].strip().startswith("-60m")

        # back to the first route: the panel follows it up
        await pilot.press("ctrl+home")
        await wait_for(pilot, lambda: box.scroll_y == 0, what="the panel back at the top")

        # the panel itself: tab to it, End scrolls to the last route
        for _ in range(6):
            if app.focused is box:
                break
            await pilot.press("tab")
        assert app.focused is box
        await pilot.press("end")
        await wait_for(pilot, lambda: box.scroll_y == box.max_scroll_y, what="End to scroll the panel")
        assert any(line.lstrip().startswith(last) for line in visible_chart_lines(app))
        # a new snapshot (same selection) leaves the panel where the user scrolled it
        snap = dash(app).snapshot
        assert snap is not None
        dash(app).show_snapshot(snap)
        await pilot.pause()
        assert box.scroll_y == box.max_scroll_y


def test_shadowlimit_dash_refuses_an_unknown_theme() -> None:
    import subprocess
    import sys
    from pathlib import Path

    cli = Path(sys.executable).parent / "shadowlimit"
    proc = subprocess.run(
        [str(cli), "dash", "--url", "http://127.0.0.1:9", "--theme", "nope"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--theme: unknown theme 'nope'" in proc.stderr and "textual-light" in proc.stderr
    assert "Traceback" not in proc.stderr
