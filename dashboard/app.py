"""The terminal dashboard for the shadowlimit control plane (a thin App; the view is
:class:`~dashboard.screen.DashboardScreen`).

Usage::

    python -m dashboard --url http://127.0.0.1:8080 --token "$SHADOWLIMIT_ADMIN_TOKEN" [--theme textual-light]
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterable

from rich.console import ConsoleRenderable
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.theme import Theme
from textual.widgets import Static

from .modals import HelpScreen
from .models import Snapshot
from .screen import DashboardScreen
from .theme import use_theme

__all__ = ["THEME_ENV", "ShadowlimitDashboard", "run_dashboard"]

DEMO_HINT = "demo: ? shows URLs & token"
#: the theme to start with (any Textual theme name); ``--theme`` and ``theme=`` win over it
THEME_ENV = "SHADOWLIMIT_DASHBOARD_THEME"


class ShadowlimitDashboard(App[int]):
    """Routes, buckets, backend, divergence and audit of one control plane, live.

    ``snapshot`` renders that fixed snapshot without connecting (tests, screenshots).
    ``theme`` is a Textual theme name (default: ``$SHADOWLIMIT_DASHBOARD_THEME``, else
    Textual's default); the command palette's "Theme" switches it while running.
    """

    CSS_PATH = "dashboard.tcss"
    TITLE = "shadowlimit"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
    ]

    #: ``shadowlimit demo --duration N`` sets this: quit after N seconds.
    call_later_after: float | None = None
    #: the dashboard's styles are on the console (from the first computed CSS variables on)
    _styled = False

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        replicas: list[str] | None = None,
        demo_banner: str | None = None,
        snapshot: Snapshot | None = None,
        theme: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__()
        #: the TLS of an https:// control plane: its CA bundle and a client certificate (None: the system's CAs)
        self.tls = tls
        #: a problem with the theme asked for in the environment, shown once the app runs
        self.theme_problem: str | None = None
        self.start_theme = self._start_theme(theme)
        self.url = url.rstrip("/")
        self.token = token or None
        urls = [u.rstrip("/") for u in (replicas or [])]
        self.replicas = [self.url] + [u for u in urls if u != self.url]
        self.demo_banner = demo_banner
        self.fixed_snapshot = snapshot

    def _start_theme(self, theme: str | None) -> str | None:
        if theme is not None:
            if self.get_theme(theme) is None:
                raise ValueError(
                    f"theme: unknown Textual theme {theme!r} (known: {', '.join(sorted(self.available_themes))})"
                )
            return theme
        wanted = os.environ.get(THEME_ENV, "").strip()
        if wanted and self.get_theme(wanted) is None:
            self.theme_problem = (
                f"{THEME_ENV}: unknown theme {wanted!r}; using {self.theme}"
                f" (known: {', '.join(sorted(self.available_themes))})"
            )
            return None
        return wanted or None

    def get_css_variables(self) -> dict[str, str]:
        """Textual's variables for the current theme; the dashboard's Rich styles
        (:mod:`dashboard.theme`) are rebuilt from them each time (start, theme change)."""
        variables = super().get_css_variables()
        use_theme(self.console, variables, replace=self._styled)
        self._styled = True
        return variables

    def _restyle(self, _theme: Theme) -> None:
        """After a theme change: Rich text already converted for display is converted again."""
        for screen in self.screen_stack:
            for static in screen.query(Static):
                if isinstance(static.content, ConsoleRenderable):
                    static.update(static.content)

    def on_mount(self) -> None:
        if self.start_theme:
            self.theme = self.start_theme
        self.theme_changed_signal.subscribe(self, self._restyle)
        self.push_screen(
            DashboardScreen(
                self.replicas,
                self.token,
                hint=DEMO_HINT if self.demo_banner else None,
                snapshot=self.fixed_snapshot,
                tls=self.tls,
            )
        )
        if self.theme_problem:  # on the dashboard's screen, once it is there
            self.call_after_refresh(self.notify, self.theme_problem, title="Theme", severity="warning", timeout=10)
        if self.call_later_after:
            self.set_timer(self.call_later_after, self.exit)

    @property
    def dashboard(self) -> DashboardScreen | None:
        return next((s for s in self.screen_stack if isinstance(s, DashboardScreen)), None)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        dash = self.dashboard
        url = dash.client.url if dash else self.url
        self.push_screen(HelpScreen(url, self.token is not None, self.replicas, self.demo_banner))

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Help", "Keys, panels and (in the demo) the URLs and admin token", self.action_help)
        dash = self.dashboard
        if dash is None or dash.fixed is not None:
            return
        yield SystemCommand("Reconnect", "Reconnect to the control plane now", dash.action_reconnect)
        if len(self.replicas) > 1:
            yield SystemCommand("Next replica", "Follow the next control-plane replica", dash.action_next_replica)
        route = dash.selected
        if route:
            for mode, label in (
                ("off", "off"),
                ("shadow", "shadow"),
                ("canary", "canary (asks the percent)"),
                ("enforce", "enforce"),
            ):
                yield SystemCommand(
                    f"Set {route} to {mode}",
                    f"Move route {route} to {label}; asks for a reason",
                    lambda m=mode: dash.action_mode(m),
                )
            view = dash.snapshot.route(route) if dash.snapshot is not None else None
            if view is not None and view.candidate is not None:
                limit = view.candidate.limit
                yield SystemCommand(
                    f"Promote {route}'s candidate",
                    f"Make {limit} {route}'s global limit (gated); asks for a reason",
                    lambda: dash.action_candidate("promote"),
                )
                yield SystemCommand(
                    f"Drop {route}'s candidate",
                    f"Stop evaluating {limit} beside {route}'s global limit; asks for a reason",
                    lambda: dash.action_candidate("drop"),
                )
            if view is not None and view.plan is not None:
                for key, title in (("toggle", "Pause or resume"), ("approve", "Approve the step of")):
                    if dash.check_action("plan", (key,)):
                        yield SystemCommand(
                            f"{title} {route}'s plan",
                            f"{route}'s rollout plan is {view.plan.state.replace('_', ' ')}; asks for a reason",
                            lambda k=key: dash.action_plan(k),
                        )


def run_dashboard(
    url: str,
    token: str | None = None,
    *,
    replicas: list[str] | None = None,
    theme: str | None = None,
    tls: ssl.SSLContext | None = None,
) -> int:
    """Run the dashboard in this terminal until the user quits; returns the exit code."""
    app = ShadowlimitDashboard(url, token, replicas=replicas, theme=theme, tls=tls)
    app.run()
    return app.return_code or 0
