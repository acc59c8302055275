"""The main view: routes, buckets, backend, divergence and audit, fed by the live stream; the
keys that change a route (its mode, its limit through the what-if dialog, its candidate limit).

All IO runs in workers calling :mod:`dashboard.client`; widgets only get typed views.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header

from .chart import DivergenceChart
from .client import ApiError, ClientError, ControlPlaneClient, ControlPlaneUnavailable, GateRefused, Unauthorized
from .modals import (
    CandidateGateRefusedScreen,
    ConfirmCandidateScreen,
    ConfirmModeScreen,
    GateRefusedScreen,
    PercentScreen,
)
from .models import AuditEntryView, CandidateView, ConnectionState, EventView, RouteView, Snapshot, WhatIfView
from .plan_keys import plan_key, plan_key_applies
from .whatif import ConfirmAdjustScreen, ConfirmTryLiveScreen, WhatIfAnswer, WhatIfScreen
from .widgets import AuditPanel, BackendPanel, BucketsTable, ConnectionBar, RoutesTable

__all__ = ["BACKOFF_INITIAL_S", "BACKOFF_MAX_S", "DashboardScreen"]

BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 10.0
STREAM_MINUTES = 60
AUDIT_KINDS_WITHOUT_ENTRY = {"breaker", "auto_rollback"}
AUDIT_KEEP = 100
#: events after which the routes are read again at once (not only with the next snapshot)
ROUTE_CHANGES = {"mode_change", "auto_rollback", "rules_reload", "candidate", "config_change", "plan"}


class DashboardScreen(Screen[None]):
    """One view of one control-plane replica (``n`` moves to the next known replica)."""

    BINDINGS = [
        Binding("o", "mode('off')", "Off"),
        Binding("s", "mode('shadow')", "Shadow"),
        Binding("c", "mode('canary')", "Canary %"),
        Binding("e", "mode('enforce')", "Enforce"),
        Binding("w", "whatif", "What-if"),
        Binding("p", "candidate('promote')", "Promote cand."),
        Binding("d", "candidate('drop')", "Drop cand."),
        Binding("x", "plan('toggle')", "Pause/resume plan"),
        Binding("a", "plan('approve')", "Approve step"),
        Binding("r", "reconnect", "Reconnect"),
        Binding("n", "next_replica", "Next replica"),
    ]

    def __init__(
        self,
        urls: Sequence[str],
        token: str | None,
        *,
        hint: str | None = None,
        snapshot: Snapshot | None = None,
        clock: Callable[[], float] = time.monotonic,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__()
        self.tls = tls
        #: monotonic seconds: reconnect deadlines and which of two route reads is newer
        self.clock = clock
        self.urls = list(urls)
        self.token = token
        self.hint = hint
        self.fixed = snapshot
        self.client = ControlPlaneClient(self.urls[0], token, tls=tls)
        self.snapshot: Snapshot | None = None
        self.selected: str | None = None
        self.conn = ConnectionState(
            "fixed" if snapshot else "connecting", self.client.url, self.client.has_token, hint=hint
        )
        self._audit: dict[tuple[str, str, str, int], AuditEntryView] = {}
        self._events: dict[int, EventView] = {}
        self._applied_at = 0.0  # monotonic time the last snapshot was shown
        self._candidate_keys: tuple[bool, ...] = ()  # which of p/d, x, a the footer shows now
        self._restart: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield ConnectionBar(id="connection")
        yield RoutesTable(id="routes", classes="panel")
        with Horizontal(id="middle"):
            yield BucketsTable(id="buckets", classes="panel")
            with VerticalScroll(id="backend-box", classes="panel"):
                yield BackendPanel(id="backend")
        with Horizontal(id="bottom"):
            with VerticalScroll(id="chart-box", classes="panel"):
                yield DivergenceChart(id="chart")
            with VerticalScroll(id="audit-box", classes="panel"):
                yield AuditPanel(id="audit")
        yield Footer()

    def on_mount(self) -> None:
        titles = {
            "routes": "Routes",
            "buckets": "Buckets",
            "backend-box": "Backend",
            "chart-box": "Divergence · last hour",
            "audit-box": "Audit & events",
        }
        for wid, title in titles.items():
            self.query_one(f"#{wid}").border_title = title
        self.query_one(BackendPanel).show(None)
        self.query_one(DivergenceChart).show(None, [], None)
        self._render_audit()
        self._show_conn()
        self.query_one(RoutesTable).focus()
        if self.fixed is not None:
            self.show_snapshot(self.fixed)
        else:
            self.run_stream()
            self.load_audit()

    async def on_unmount(self) -> None:
        await self.client.aclose()

    # -- rendering (no IO) --------------------------------------------------------------

    def _torn_down(self) -> bool:
        """While the app shuts down the panels go before the workers are cancelled."""
        return not self.query(ConnectionBar)

    def show_snapshot(self, snap: Snapshot) -> None:
        """Render one snapshot: every panel, from these figures only."""
        if self._torn_down():
            return
        self.snapshot = snap
        self._applied_at = self.clock()
        if self.selected is None or snap.route(self.selected) is None:
            self.selected = snap.routes[0].name if snap.routes else None
        self.query_one(RoutesTable).show(snap.routes, snap.divergence, self.selected)
        self._show_buckets()
        self.query_one(BackendPanel).show(snap.backend, self.urls, snap.external)
        self.query_one(DivergenceChart).show(snap.divergence, [r.name for r in snap.routes], self.selected)
        for ev in snap.events:
            self._note_event(ev)
        self._render_audit()
        self.conn = replace(self.conn, instance_id=snap.instance_id, data_at=snap.at)
        self._show_conn()
        self._show_candidate_keys()

    def _show_candidate_keys(self) -> None:
        """Show ``p`` and ``d`` in the footer only while the route under the cursor has a candidate,
        ``x`` and ``a`` while they do something to its plan."""
        route = self.route_at_cursor()
        has = (
            route is not None and route.candidate is not None,
            *(plan_key_applies(route, k) for k in ("toggle", "approve")),
        )
        if has != self._candidate_keys:
            self._candidate_keys = has
            self.refresh_bindings()

    def _show_buckets(self) -> None:
        snap, route = self.snapshot, self.selected
        if snap is None or self._torn_down():
            return
        box = self.query_one("#buckets")
        rv = snap.route(route)
        title = f"Buckets · {route}" if route else "Buckets"
        if rv is not None and (rv.local_policy or rv.global_policy):
            lp = rv.local_policy.describe() if rv.local_policy else "?"
            dp = rv.global_policy.describe() if rv.global_policy else "?"
            if rv.adjusted:  # the limit in force is not the rules file's: say both
                rules = rv.limit.rules.describe() if rv.limit and rv.limit.rules else "?"
                dp += f" * (adjusted; rules: {rules})"
            box.border_subtitle = f"local {lp} · global {dp}"
        box.border_title = title
        self.query_one(BucketsTable).show([b for b in snap.buckets if b.route == route], snap.at)

    def _note_event(self, ev: EventView) -> None:
        if ev.audit is not None:
            self._audit[ev.audit.identity] = ev.audit
        elif ev.type in AUDIT_KINDS_WITHOUT_ENTRY or (
            ev.type == "external_breaker" and ev.data.get("to") != "half_open"
        ):
            self._events[ev.seq] = ev

    def _render_audit(self) -> None:
        if self._torn_down():
            return
        items: list[AuditEntryView | EventView] = [*self._audit.values(), *self._events.values()]
        items.sort(key=lambda i: i.at, reverse=True)
        for old in items[AUDIT_KEEP:]:  # keep memory bounded on a long-running dashboard
            if isinstance(old, AuditEntryView):
                self._audit.pop(old.identity, None)
            else:
                self._events.pop(old.seq, None)
        self.query_one(AuditPanel).show(items[:AUDIT_KEEP])

    def _show_conn(self) -> None:
        if self._torn_down():
            return
        self.query_one(ConnectionBar).show(self.conn)
        self.set_class(self.conn.status == "stale", "-stale")
        self.sub_title = self.client.url

    def _set_conn(self, status: str, *, retry_in_s: float | None = None, error: str | None = None) -> None:
        self.conn = replace(self.conn, status=status, url=self.client.url, retry_in_s=retry_in_s, error=error)
        self._show_conn()

    # -- the stream (IO in a worker) ----------------------------------------------------

    @work(exclusive=True, group="stream")
    async def run_stream(self) -> None:
        """Follow ``/v1/stream``; on a break keep the data, mark it stale, retry with backoff."""
        backoff = BACKOFF_INITIAL_S
        if self.conn.status != "live":
            self._set_conn("connecting")
        while True:
            error = "stream ended"
            try:
                async for item in self.client.stream(route=self.selected, minutes=STREAM_MINUTES):
                    if isinstance(item, Snapshot):
                        was = self.conn.status
                        self.show_snapshot(item)
                        backoff = BACKOFF_INITIAL_S
                        if was != "live":
                            self._set_conn("live")
                            if was == "stale":
                                self.load_audit()
                    else:
                        self._on_event(item)
            except ClientError as exc:
                error = str(exc)
            deadline = self.clock() + backoff
            while (left := deadline - self.clock()) > 0:
                self._set_conn("stale", retry_in_s=left, error=error)
                await asyncio.sleep(min(0.25, left))
            self._set_conn("stale", retry_in_s=0, error=error)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _on_event(self, ev: EventView) -> None:
        self._note_event(ev)
        self._render_audit()
        if ev.type in ROUTE_CHANGES:
            self.refresh_routes()

    @work(exclusive=True, group="audit")
    async def load_audit(self) -> None:
        try:
            entries = await self.client.audit(limit=50)
        except ClientError:
            return  # the stream's state already says whether the control plane is there
        for e in entries:
            self._audit[e.identity] = e
        self._render_audit()

    @work(exclusive=True, group="routes")
    async def refresh_routes(self) -> None:
        """Re-read ``/v1/routes`` right after a change event (dropped if a newer snapshot won)."""
        started = self.clock()
        try:
            routes = await self.client.routes()
        except ClientError:
            return
        snap = self.snapshot
        if snap is None or self._applied_at > started:
            return
        self.show_snapshot(replace(snap, routes=tuple(routes), events=()))

    @on(RoutesTable.Selected)
    def _route_selected(self, event: RoutesTable.Selected) -> None:
        self._show_candidate_keys()
        if event.route == self.selected:
            return
        self.selected = event.route
        self._show_buckets()
        if self.snapshot is not None:
            self.query_one(DivergenceChart).show(
                self.snapshot.divergence, [r.name for r in self.snapshot.routes], self.selected
            )
        if self.fixed is None:
            if self._restart is not None:
                self._restart.stop()
            self._restart = self.set_timer(0.3, self.run_stream)  # the stream carries this route's buckets

    def action_reconnect(self) -> None:
        if self.fixed is None:
            self.run_stream()
            self.load_audit()

    def action_next_replica(self) -> None:
        if self.fixed is not None or len(self.urls) < 2:
            return
        i = (self.urls.index(self.client.url) + 1) % len(self.urls) if self.client.url in self.urls else 0
        old, self.client = self.client, ControlPlaneClient(self.urls[i], self.token, tls=self.tls)
        self._events.clear()
        self._set_conn("connecting")
        self.run_stream()
        self.load_audit()
        self._close(old)
        self.notify(f"now following {self.client.url}")

    @work(group="close")
    async def _close(self, client: ControlPlaneClient) -> None:
        await client.aclose()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "next_replica":
            return len(self.urls) > 1
        if action == "reconnect":
            return self.fixed is None
        if action == "candidate":
            route = self.route_at_cursor()
            return route is not None and route.candidate is not None
        if action == "plan":
            return plan_key_applies(self.route_at_cursor(), str(parameters[0]) if parameters else "toggle")
        return True

    # -- what-if ------------------------------------------------------------------------------

    def route_at_cursor(self) -> RouteView | None:
        """The route an action applies to: the one under the cursor now. A key typed right after an
        arrow key arrives before the table's highlight message has moved ``selected``."""
        name = self.query_one(RoutesTable).cursor_route() or self.selected
        return self.snapshot.route(name) if self.snapshot is not None and name else None

    def action_whatif(self) -> None:
        route = self.route_at_cursor()
        if route is None:
            self.notify("No route selected yet (waiting for data).", severity="warning")
            return
        self.what_if(route)

    @work(exclusive=True, group="whatif")
    async def what_if(self, route: RouteView) -> None:
        """The dialog, the replays it asks for, and the adjustment it may end with."""
        values: WhatIfAnswer | None = None
        result: WhatIfView | None = None
        error: str | None = None
        while True:
            answer = await self.app.push_screen_wait(WhatIfScreen(route, values=values, result=result, error=error))
            if answer is None:
                return
            if values is None or (answer.policy, answer.minutes) != (values.policy, values.minutes):
                result = None  # a replay shown is always the one of the inputs shown
            values, error = answer, None
            try:
                if answer.action == "replay":
                    result = await self.client.whatif(route.name, answer.policy, answer.minutes)
                    continue
                if answer.action == "try":
                    if await self._try_live(route, answer, result):
                        return
                    continue
                reason = await self.app.push_screen_wait(ConfirmAdjustScreen(route, answer, result))
                if reason is None:
                    continue
                await self.client.adjust(route.name, answer.policy, reason=reason)
            except ApiError as exc:
                error = exc.explain() if answer.action == "try" else exc.message
                continue
            except ControlPlaneUnavailable as exc:
                error = str(exc)
                continue
            self.notify(f"{route.name}'s global limit is now {answer.rate} (audited).", title="Limit adjusted")
            self.refresh_routes()
            return

    async def _try_live(self, route: RouteView, answer: WhatIfAnswer, result: WhatIfView | None) -> bool:
        """Ask a reason, then set the replayed limit as the route's candidate (True: it was set)."""
        reason = await self.app.push_screen_wait(ConfirmTryLiveScreen(route, answer, result))
        if reason is None:
            return False
        burst = int(answer.burst) if answer.burst else None
        change = await self.client.set_candidate(
            route.name, answer.limit, burst=burst, algorithm=answer.algorithm, reason=reason
        )
        limit = change.candidate.limit if change.candidate else answer.label
        self.notify(
            f"{route.name}'s candidate {limit} is now evaluated beside its global limit (audited);"
            " p promotes it, d drops it.",
            title="Candidate set",
        )
        self.refresh_routes()
        return True

    # -- rollout toggles ----------------------------------------------------------------

    def read_only(self, what: str) -> bool:
        """True (and said) when the dashboard has no token to do ``what`` with."""
        if self.client.has_token:
            return False
        self.notify(
            f"{what} needs an operator or admin token: start the dashboard with --token (or SHADOWLIMIT_ADMIN_TOKEN).",
            title="Read-only",
            severity="warning",
        )
        return True

    def action_mode(self, mode: str) -> None:
        if self.read_only("Changing a route's mode"):
            return
        route = self.route_at_cursor()
        if route is None:
            self.notify("No route selected yet (waiting for data).", severity="warning")
            return
        self.change_mode(route, mode)

    @work(exclusive=True, group="mode")
    async def change_mode(self, route: RouteView, mode: str) -> None:
        """Ask (percent, then reason), send, and report what the server answered."""
        percent = 0
        if mode == "canary":
            answer = await self.app.push_screen_wait(PercentScreen(route))
            if answer is None:
                return
            percent = answer
        reason = await self.app.push_screen_wait(ConfirmModeScreen(route, mode, percent))
        if reason is None:
            return
        force = False
        while True:
            try:
                result = await self.client.set_mode(
                    route.name, mode, canary_percent=percent, reason=reason, force=force
                )
            except GateRefused as exc:
                forced = await self.app.push_screen_wait(GateRefusedScreen(route, mode, percent, exc.gate, reason))
                if forced is None:
                    self.notify(
                        f"{route.name} not changed: the gate refused and it was not forced.", severity="warning"
                    )
                    return
                reason, force = forced, True
                continue
            except ClientError as exc:
                self.refused(f"{route.name} not changed", exc)
                return
            st = result.state
            label = f"canary {st.canary_percent}%" if st.mode == "canary" else st.mode
            forced_txt = " (forced)" if result.audit.forced else ""
            self.notify(
                f"{result.route} is now {label}{forced_txt} — version {st.version}, confirmed by the control plane.",
                title="Mode changed",
            )
            self.refresh_routes()
            return

    def action_plan(self, key: str) -> None:
        """``x`` pauses or resumes, ``a`` approves the plan of the route under the cursor."""
        plan_key(self, key)

    def refused(self, what: str, exc: ClientError) -> None:
        """Say why the control plane did not make a change (``what``: ``search not changed``)."""
        if isinstance(exc, Unauthorized):
            self.notify(
                f"The control plane refused the token: {exc.message}",
                title=f"{exc.status} {exc.error}",
                severity="error",
            )
        elif isinstance(exc, ApiError):
            self.notify(exc.message, title=f"{exc.status} {exc.error}", severity="error")
        else:
            self.notify(f"{what}: {exc}", title="Control plane unavailable", severity="error")

    # -- candidate limits (set from the what-if dialog) -----------------------------------

    def action_candidate(self, action: str) -> None:
        """``p`` promotes, ``d`` drops the candidate limit of the route under the cursor."""
        if self.read_only("Promoting or dropping a candidate limit"):
            return
        route = self.route_at_cursor()
        if route is None or route.candidate is None:
            self.notify("This route has no candidate limit: set one with w, Replay, Try live.", severity="warning")
            return
        if action == "promote":
            self.promote_candidate(route, route.candidate)
        else:
            self.drop_candidate(route, route.candidate)

    @work(exclusive=True, group="candidate")
    async def promote_candidate(self, route: RouteView, candidate: CandidateView) -> None:
        """Ask a reason (showing the gate's figures), promote; a refused gate shows why and
        can be forced with a reason."""
        now = self.snapshot.at if self.snapshot is not None else None
        reason = await self.app.push_screen_wait(ConfirmCandidateScreen(route, candidate, "promote", now=now))
        if reason is None:
            return
        force = False
        while True:
            try:
                change = await self.client.promote_candidate(route.name, reason=reason, force=force)
            except GateRefused as exc:
                screen = CandidateGateRefusedScreen(route, candidate, exc.gate, reason)
                forced = await self.app.push_screen_wait(screen)
                if forced is None:
                    self.notify(
                        f"{route.name}'s candidate not promoted: the gate refused and it was not forced.",
                        severity="warning",
                    )
                    return
                reason, force = forced, True
                continue
            except ClientError as exc:
                self.refused(f"{route.name}'s candidate not promoted", exc)
                return
            limit = change.limit.describe() if change.limit is not None else candidate.limit
            forced_txt = " (forced past the gate)" if change.audit.forced else ""
            self.notify(
                f"{route.name}'s global limit is now {limit}{forced_txt}, confirmed by the control plane (audited).",
                title="Candidate promoted",
            )
            self.refresh_routes()
            return

    @work(exclusive=True, group="candidate")
    async def drop_candidate(self, route: RouteView, candidate: CandidateView) -> None:
        """Ask a reason, drop the candidate; the route keeps its global limit."""
        now = self.snapshot.at if self.snapshot is not None else None
        reason = await self.app.push_screen_wait(ConfirmCandidateScreen(route, candidate, "drop", now=now))
        if reason is None:
            return
        try:
            await self.client.drop_candidate(route.name, reason=reason)
        except ClientError as exc:
            self.refused(f"{route.name}'s candidate not dropped", exc)
            return
        self.notify(
            f"{route.name}'s candidate {candidate.limit} dropped (audited); its global limit stays.",
            title="Candidate dropped",
        )
        self.refresh_routes()
