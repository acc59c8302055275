"""Render-only widgets: each is handed typed views and draws them; user intent goes up as
messages. No widget talks to the control plane."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable, Static

from .models import (
    AuditEntryView,
    BackendView,
    BucketSide,
    BucketView,
    CandidateView,
    ConnectionState,
    DivergenceView,
    EventView,
    ExternalView,
    RouteView,
)
from .plan_views import PLAN_STATE_STYLE, PlanView, plan_strip
from .render import (
    BREAKER_STYLE,
    ago,
    amount,
    bar,
    candidate_gate_text,
    clock,
    gate_text,
    mode_text,
    pct,
    spark_text,
)
from .theme import (
    BAD,
    BAD_BOLD,
    BADGE_INFO,
    BADGE_NOTE,
    BADGE_OK,
    BADGE_WARN,
    HINT,
    INFO,
    INFO_BOLD,
    OK,
    SELECTED_MARK,
    WARN,
    WARN_BOLD,
)

__all__ = [
    "CANDIDATE_ROW",
    "PLAN_ROW",
    "plan_cells",
    "AuditPanel",
    "BackendPanel",
    "BucketsTable",
    "ConnectionBar",
    "RoutesTable",
    "route_of_row",
]

SPARK_MINUTES = 12
#: a route's name followed by this is the key of its candidate's row (no route name has \x1f)
CANDIDATE_ROW = "\x1fcandidate"
#: a route's name followed by this is the key of its rollout plan's row
PLAN_ROW = "\x1fplan"
#: after a route's name in the routes table: its global limit in force is not the rules file's
ADJUSTED_MARK = " *"
_TRANSITION_STYLE = {"closed": OK, "open": BAD_BOLD}  # a breaker's new state; anything else is a probe


def route_of_row(key: str | None) -> str | None:
    """The route a routes-table row is about (its own row, its candidate's or its plan's)."""
    return None if key is None else key.removesuffix(CANDIDATE_ROW).removesuffix(PLAN_ROW)


def _row_keys(r: RouteView) -> list[str]:
    """A route's rows: its own, its candidate's, its plan's."""
    return [r.name, *([r.name + CANDIDATE_ROW] if r.candidate else []), *([r.name + PLAN_ROW] if r.plan else [])]


class RoutesTable(DataTable[Text | str]):
    """Every route: mode, rate, divergence (with a sparkline of recent minutes), gate; under a
    route with a candidate limit, a ``↳ candidate`` row with its comparisons and its gate; under
    a route with a rollout plan, a ``↳ plan`` row (its state, time left, its steps as a progress
    strip, the first failing or missing check, what it waits for). The
    selected route is marked ``▶`` in the first column, not by colour alone (the cursor on a
    candidate's row selects its route); ``*`` after a name: its global limit in force is not
    the rules file's."""

    class Selected(Message):
        """The user moved to another route."""

        def __init__(self, route: str) -> None:
            super().__init__()
            self.route = route

    COLUMNS = (
        ("sel", " "),
        ("route", "Route"),
        ("mode", "Mode"),
        ("rate", "Dec/s"),
        ("div", f"Diverged 5m · {SPARK_MINUTES}m"),
        ("newrej", "New rej. 5m"),
        ("errors", "Errors 5m"),
        ("gate", "Gate (next step)"),
    )

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._rows: list[str] = []  # row keys: route names, and candidates' (CANDIDATE_ROW)
        self._marked: str | None = None

    def on_mount(self) -> None:
        for key, label in self.COLUMNS:
            self.add_column(label, key=key)

    def cursor_key(self) -> str | None:
        """The key of the row under the cursor (a route's name, or its candidate's row)."""
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value

    def cursor_route(self) -> str | None:
        """The route under the cursor now (the :class:`Selected` message follows a move later)."""
        return route_of_row(self.cursor_key())

    def show(self, routes: Sequence[RouteView], divergence: DivergenceView | None, selected: str | None) -> None:
        rows = [k for r in routes for k in _row_keys(r)]
        if rows != self._rows:
            at = self.cursor_key()
            self.clear()
            self._marked = None
            for r in routes:
                self.add_row(self._mark(r.name == selected), *self._cells(r, divergence), key=r.name)
                if r.candidate is not None:
                    cells = self.candidate_cells(r.candidate)
                    self.add_row(Text(" "), *cells, key=r.name + CANDIDATE_ROW)
                if r.plan is not None:
                    self.add_row(Text(" "), *plan_cells(r.plan), key=r.name + PLAN_ROW)
            self._rows = rows
            if selected in rows:
                self._marked = selected
                keep = at if at in rows and route_of_row(at) == selected else selected
                self.move_cursor(row=rows.index(keep), animate=False)
            return
        for r in routes:
            for (col, _), cell in zip(self.COLUMNS[1:], self._cells(r, divergence)):
                self.update_cell(r.name, col, cell, update_width=True)
            if r.candidate is not None:
                cells = self.candidate_cells(r.candidate)
                for (col, _), cell in zip(self.COLUMNS[1:], cells):
                    self.update_cell(r.name + CANDIDATE_ROW, col, cell, update_width=True)
            if r.plan is not None:
                for (col, _), cell in zip(self.COLUMNS[1:], plan_cells(r.plan)):
                    self.update_cell(r.name + PLAN_ROW, col, cell, update_width=True)
        self.mark(selected)

    def mark(self, route: str | None) -> None:
        """Move the ``▶`` marker to ``route``'s row."""
        if route == self._marked:
            return
        for name, on in ((self._marked, False), (route, True)):
            if name is not None and name in self._rows:
                self.update_cell(name, "sel", self._mark(on))
        self._marked = route

    @staticmethod
    def _mark(on: bool) -> Text:
        return Text(SELECTED_MARK if on else " ", style="bold")

    @staticmethod
    def _cells(r: RouteView, divergence: DivergenceView | None) -> list[Text | str]:
        mode = mode_text(r.mode, r.canary_percent)
        if r.stored_mode != r.mode:
            mode.append(f" (stored {r.stored_mode})", style="dim")
        d = r.divergence_5m
        series = divergence.routes[r.name].series if divergence and r.name in divergence.routes else ()
        rates = [
            (p.local_allow_distributed_deny + p.local_deny_distributed_allow) / p.compared if p.compared else 0.0
            for p in series
        ]
        div = Text(f"{pct(d.divergence_rate) if d else '—':>6} ", style="bold" if d and d.divergence_rate else "")
        div.append_text(spark_text(rates, SPARK_MINUTES, BAD))
        if d is None:
            newrej, errors = Text("Redis unavailable", style=WARN), Text("—")
        else:
            newrej = Text(
                f"{d.local_allow_distributed_deny:,}", style=BAD_BOLD if d.local_allow_distributed_deny else ""
            )
            newrej.append(f" ({pct(d.new_rejection_rate)})", style="dim")
            if d.sampled:  # a sample: say how much of the traffic it covers
                newrej.append(f" of {pct(d.sampled_share)}", style=WARN_BOLD)
            errors = Text(f"{d.backend_errors:,}", style=BAD_BOLD if d.backend_errors else "")
            errors.append(f" ({pct(d.backend_error_rate, 2)})", style="dim")
        name = Text(r.name, style="bold")
        if r.adjusted:
            name.append(ADJUSTED_MARK, style=WARN_BOLD)
        return [name, mode, f"{r.decisions_per_s:,.1f}", div, newrej, errors, gate_text(r.gate)]

    @staticmethod
    def candidate_cells(c: CandidateView) -> list[Text | str]:
        """``↳ candidate 5/1s burst 5 · 120 compared · 6 (5.0%) · admitted 0 · 0 errors · gate``:
        its comparisons with the current limit since it was set, under the route's columns."""
        label = Text("  ↳ candidate", style=INFO_BOLD)
        limit = Text(c.limit, style="bold")
        t = c.totals
        if t is None:
            wait = Text("no figures yet", style="dim")
            return [label, limit, "", wait, Text("—", style="dim"), Text("—", style="dim"), candidate_gate_text(c.gate)]
        div = Text(f"{t.compared:,} compared", style="" if t.compared else "dim")  # per minute: the chart
        if t.sampled:
            div.append(f" {pct(t.sampled_share)} sampled", style=WARN_BOLD)
        newrej = Text(f"{t.newly_rejected:,}", style=BAD_BOLD if t.newly_rejected else "")
        newrej.append(f" ({pct(t.newly_rejected_share)})", style="dim")
        newrej.append(" · admitted ", style="dim")
        newrej.append(f"{t.newly_admitted:,}", style=WARN_BOLD if t.newly_admitted else "dim")
        errors = Text(f"{t.errors:,}", style=BAD_BOLD if t.errors else "")
        if t.dropped:
            errors.append(f" · {t.dropped:,} dropped", style=WARN)
        return [label, limit, "", div, newrej, errors, candidate_gate_text(c.gate)]

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        route = route_of_row(event.row_key.value)
        if route is not None:
            self.mark(route)
            self.post_message(self.Selected(route))


def plan_cells(p: PlanView) -> list[Text | str]:
    """``↳ plan · running · 42s left · ■■▶□ 3/4 canary 50% · the first failing or missing check ·
    what it waits for``, under the route's columns."""
    label = Text("  ↳ plan", style=INFO_BOLD)
    state = Text(p.state.replace("_", " "), style=PLAN_STATE_STYLE.get(p.state, ""))
    left = f"{p.time_left_s:.0f}s left" if p.time_left_s else ""
    problem: Text | str = ""
    if p.first_problem is not None:
        bad = p.first_problem.outcome in ("fail", "refused")
        problem = Text(p.first_problem.describe(), style=BAD_BOLD if bad else WARN)
    return [label, state, left, plan_strip(p), problem, "", _plan_next(p)]


def _plan_next(p: PlanView) -> Text:
    """What the plan waits for, said with the key that gives it (``a``, ``x``) when a person does."""
    if p.state == "waiting_for_approval":
        return Text("waits for an approval: a approves", style=WARN_BOLD)
    if p.state == "paused":
        why = p.reason.rsplit("; ", 1)[-1] if "; rolled back" in p.reason else p.reason
        out = Text(f"{why} · " if why else "", style="dim")
        out.append("x resumes", style=WARN_BOLD)
        return out
    return Text(p.waits_for or p.reason or "", style="dim")


def _side(side: BucketSide | None, width: int, unit: str | None = None) -> Text:
    """A bucket's tokens against its burst; a budget's (``unit``) in whole units, with what its
    reservations hold and its debt."""
    if side is None:
        return Text("— (not read)", style="dim")
    cap = side.burst or side.limit
    low = cap > 0 and side.tokens < cap * 0.2
    t = bar(max(0.0, side.tokens), cap, width, style=BAD if low else INFO)
    if unit is None:
        t.append(f" {side.tokens:.1f}/{cap}", style=BAD_BOLD if low else "")
        return t
    t.append(f" {amount(max(0.0, side.tokens))}/{amount(cap)} {unit}", style=BAD_BOLD if low else "")
    if side.reserved:
        t.append(f" · {amount(side.reserved)} reserved", style=WARN)
    if side.debt >= 1:
        t.append(f" · debt {amount(side.debt)}", style=BAD_BOLD)
    return t


class BucketsTable(DataTable[Text | str]):
    """The selected route's most active keys: local and distributed tokens against the burst."""

    BAR = 8
    BY = {"local": "local", "distributed": "global", "failure_policy": "fail-policy"}

    def __init__(self, **kwargs: object) -> None:
        super().__init__(show_cursor=False, zebra_stripes=True, **kwargs)  # type: ignore[arg-type]

    def on_mount(self) -> None:
        self.add_column("Key", key="key")
        self.add_column("Req", key="req")
        self.add_column("Local (replica)", key="local")
        self.add_column("Global (Redis)", key="dist")
        self.add_column("Last decision", key="last")  # ✔/✘ and who decided (local, global = Redis)

    def show(self, buckets: Sequence[BucketView], now: float) -> None:
        self.clear()
        for b in buckets:
            last = Text("—", style="dim")
            if b.last_decision is not None:
                ld = b.last_decision
                last = Text("✔ " if ld.allowed else "✘ ", style=OK if ld.allowed else BAD_BOLD)
                last.append(self.BY.get(ld.enforced_by, ld.enforced_by), style=OK if ld.allowed else BAD_BOLD)
                last.append(f" {ago(ld.at, now)}", style="dim")
            self.add_row(
                Text(b.key, style="bold"),
                f"{b.recent_requests:,}",
                _side(b.local, self.BAR, b.unit),
                _side(b.distributed, self.BAR, b.unit),
                last,
                key=b.key,
            )


class BackendPanel(Static):
    """Circuit breaker (coloured by state), failure policy and the live fleet; and, when
    routes take their limits from a limits service, its per-key breakers and cache."""

    def show(
        self, backend: BackendView | None, replicas: Sequence[str] = (), external: ExternalView | None = None
    ) -> None:
        self.update(self.render_backend(backend, replicas, external))

    @staticmethod
    def render_backend(
        b: BackendView | None, replicas: Sequence[str], external: ExternalView | None = None
    ) -> RenderableType:
        """What :meth:`show` displays: breaker, failures, fleet, shadow queue, external limits."""
        if b is None:
            return Text("waiting for the first snapshot …", style="dim")
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True, min_width=10)
        grid.add_column(ratio=1)

        def row(label: str, value: str | Text, style: str = "") -> None:
            grid.add_row(label, Text(value, style=style) if isinstance(value, str) else value)

        row("breaker", Text.assemble((f" {b.state.replace('_', '-').upper()} ", BREAKER_STYLE.get(b.state, "bold"))))
        row(
            "failures",
            f"{b.consecutive_failures} in a row · {b.total_failures} total",
            BAD_BOLD if b.consecutive_failures else "",
        )
        row("last error", b.last_error or "—", BAD if b.last_error and b.state != "closed" else "dim")
        if b.state == "open":
            probe = f"in {b.next_probe_in_s:.1f}s" if b.next_probe_in_s is not None else "due"
            row("next probe", f"{probe} (attempt {b.probe_attempt + 1})", WARN_BOLD)
        elif b.state == "half_open":
            row("next probe", "probing now", WARN_BOLD)
        closed = b.failure_policy.replace("_", "").lower() == "failclosed"
        row("on failure", f"{b.failure_policy or '?'}" + (f" (answers {b.failure_code})" if closed else ""), "bold")
        row("instances", f"{b.live_instances} live: " + (", ".join(b.fleet) if b.fleet else b.instance_id))
        row("following", b.instance_id + (f" (1 of {len(replicas)} replicas)" if len(replicas) > 1 else ""))
        row("redis", _redis_and_clock(b))
        if b.redis_kind:
            where = f" · master {b.redis_master}" if b.redis_master else " · master not known yet"
            row("topology", f"{b.redis_kind}{where} · TLS {b.redis_tls}", "" if b.redis_master else WARN)
        cap = f"/{b.shadow_queue_capacity:,}" if b.shadow_queue_capacity else ""
        row(
            "shadow",
            f"queue {b.shadow_queue:,}{cap} · dropped {b.shadow_dropped:,} · {b.shadow_evaluated:,} evaluated",
            BAD_BOLD if b.shadow_dropped else "",
        )
        late = b.deadline_redis_timeout + b.deadline_no_time
        row(
            "deadlines",
            f"{b.deadline_redis_timeout:,} Redis too slow · {b.deadline_no_time:,} too little time"
            + (" (answered by the failure policy in time)" if late else ""),
            WARN_BOLD if late else "dim",
        )
        if b.over_limit_hits is not None:
            cached = f"{b.over_limit_hits:,} answered without Redis · {b.over_limit_keys:,} keys cached"
            row("over limit", cached, "dim")
        if b.pending_rollbacks:
            row("rollback", "pending: " + ", ".join(b.pending_rollbacks), BAD_BOLD)
        if not b.distributed_enabled:
            row("kill switch", "distributed limiting is DISABLED: every route runs as off", WARN_BOLD)
        if external is not None and external.routes:
            _external_rows(row, external)
        return grid


def _redis_and_clock(b: BackendView) -> Text:
    """Where Redis is, and this replica's clock against its ``TIME``: past the tolerance it is
    a warning when the policies are decided on this clock (``RATE_LIMIT_TIME_SOURCE=local``:
    Redis then judges its requests at a wrong time, and its new rejections are put down to it)."""
    t = Text(b.redis or "?", style="dim")
    if not b.clock_reported:
        return t  # an older control plane: no clock in its snapshot
    t.append(" · clock ", style="dim")
    if b.clock_offset_ms is None:
        why = f" ({b.clock_error})" if b.clock_error else " yet"
        t.append("not measured" + why, style=WARN if b.clock_error else "dim")
        return t
    off, past = b.clock_offset_ms, b.clock_past_tolerance
    text = f"{off / 1000:+.1f} s" if abs(off) >= 1000 else f"{off:+.1f} ms" if abs(off) >= 10 else f"{off:+.2f} ms"
    t.append(text, style=(WARN_BOLD if b.time_source != "redis" else WARN) if past else "")
    t.append(f" (±{b.clock_tolerance_ms:g} ms)", style="dim")
    if past and b.time_source == "redis":
        t.append(" · decided on Redis' clock", style="dim")
    return t


def _external_rows(row: Any, x: ExternalView) -> None:
    """Three or four short lines: per-key breakers, cache, calls, and which keys are open."""
    t = Text()
    t.append(f"{x.breakers_open} open", style=BAD_BOLD if x.breakers_open else OK)
    if x.breakers_half_open:
        t.append(f" · {x.breakers_half_open} probing", style=WARN_BOLD)
    t.append(f" / {x.breakers_total:,} breakers")
    if len(x.routes) > 1:
        t.append(f" ({len(x.routes)} routes)", style="dim")
    row("ext limits", t)
    if not x.cache_enabled:
        row("ext cache", "off (no Redis): every lookup calls the service", WARN)
    else:
        c = Text(
            f"hit {pct(x.hit_ratio) if x.hit_ratio is not None else '—'}", style="bold" if x.cache_available else "dim"
        )
        c.append(
            f" ({x.cache_hits:,}/{x.cache_hits + x.cache_misses:,}) · stale {x.stale_used:,}",
            style="" if x.cache_available else "dim",
        )
        if not x.cache_available:
            c.append(" · skipped: Redis down", style=WARN_BOLD)
        row("ext cache", c)
    calls = Text(f"{x.calls_ok:,} ok · ")
    calls.append(f"{x.calls_failed:,} failed", style=BAD_BOLD if x.calls_failed else "")
    calls.append(" · ")
    calls.append(f"{x.static_fallbacks:,} static", style=WARN if x.static_fallbacks else "dim")
    row("ext calls", calls)
    open_ = [br for br in x.breakers if br.state != "closed"][:3]
    if open_:
        keys = Text()
        for i, br in enumerate(open_):
            if i:
                keys.append(", ")
            keys.append(f"{br.route}/{br.key}", style=BAD_BOLD if br.state == "open" else WARN_BOLD)
            probe = (
                "probing"
                if br.state == "half_open"
                else (f"probe in {br.next_probe_in_s:.0f}s" if br.next_probe_in_s is not None else "probe due")
            )
            keys.append(f" ({probe})", style="dim")
        if x.breakers_open + x.breakers_half_open > len(open_):
            keys.append(f" +{x.breakers_open + x.breakers_half_open - len(open_)} more", style="dim")
        row("open keys", keys)


def _audit_entry(e: AuditEntryView) -> Text:
    t = Text()
    if e.kind == "mode_change":
        t.append(f"{e.route} ", style="bold")
        t.append_text(mode_text(e.from_mode, e.from_percent))
        t.append(" → ")
        t.append_text(mode_text(e.to_mode, e.to_percent))
        if e.forced:
            t.append(" FORCED", style=BAD_BOLD)
        if e.actor == "plan":  # a step of the route's rollout plan
            t.append(" PLAN", style=INFO_BOLD)
        elif e.automatic:
            t.append(" AUTO", style=WARN_BOLD)
    elif e.kind == "plan":  # a plan set, removed, paused, resumed, waiting for an approval, completed
        t.append(f"{e.route} ", style="bold")
        t.append("plan ", style=INFO_BOLD)
        t.append(e.to_mode)
    elif e.kind == "restore":  # the store lost its data; a replica wrote the state back
        t.append(f"{e.route} ", style="bold")
        t.append("RESTORED ", style=WARN_BOLD)
        if e.to_mode:
            t.append_text(mode_text(e.to_mode, e.to_percent))
    elif e.kind == "candidate":  # set (candidate ...), promoted candidate ..., dropped candidate ...
        t.append(f"{e.route} ", style="bold")
        t.append(e.to_mode.replace(" (token_bucket)", ""), style=INFO)
        if e.forced:
            t.append(" FORCED", style=BAD_BOLD)
        if e.automatic:
            t.append(" AUTO", style=WARN_BOLD)
    elif e.kind == "rules_reload":
        t.append("rules reload ", style="bold")
        t.append(e.to_mode, style=OK if e.to_mode == "ok" else BAD_BOLD)
    else:
        t.append(f"{e.kind.replace('_', ' ')} {e.route} ", style="bold")
        t.append(e.to_mode)
    t.append(f"\n{e.actor}", style="dim")
    if e.reason:
        t.append(f" · “{e.reason}”", style="italic")
    return t


def _event_entry(e: EventView) -> Text:
    d = e.data
    t = Text()
    if e.type == "breaker":
        t.append("breaker ", style="bold")
        t.append(f"{d.get('from', '?')} → ")
        to = str(d.get("to", "?"))
        t.append(to, style=_TRANSITION_STYLE.get(to, WARN))
        detail = " · ".join(str(x) for x in (d.get("instance"), d.get("reason")) if x)
    elif e.type == "external_breaker":
        t.append(f"ext limits {d.get('route', '?')}/{d.get('key', '?')} ", style="bold")
        t.append(f"{d.get('from', '?')} → ")
        to = str(d.get("to", "?"))
        t.append(to, style=_TRANSITION_STYLE.get(to, WARN))
        detail = " · ".join(str(x) for x in (d.get("instance"), d.get("reason")) if x)
    elif e.type == "auto_rollback":
        t.append(f"{e.route} auto-rollback ", style=BAD_BOLD)
        t.append(f"{d.get('from', '?')} → {d.get('to', 'shadow')}")
        detail = str(d.get("reason") or "")
    else:
        t.append(e.type.replace("_", " "), style="bold")
        detail = str(d.get("error") or "")
    if detail:
        t.append(f"\n{detail}", style="dim")
    return t


class AuditPanel(Static):
    """Latest audited changes (mode changes, rules reloads, ...) and live events, newest first."""

    def show(self, items: Sequence[AuditEntryView | EventView]) -> None:
        if not items:
            self.update(Text("no changes recorded yet", style="dim"))
            return
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(ratio=1)
        for i in items:
            grid.add_row(clock(i.at), _audit_entry(i) if isinstance(i, AuditEntryView) else _event_entry(i))
        self.update(grid)


class ConnectionBar(Static):
    """Always visible: live / stale (reconnecting in N s) / connecting, and where to."""

    def show(self, c: ConnectionState) -> None:
        self.set_classes(f"-{c.status}")
        t = Text()
        badge = {
            "live": (" ● LIVE ", BADGE_OK),
            "stale": (" ◌ STALE ", BADGE_WARN),
            "connecting": (" … CONNECTING ", BADGE_INFO),
            "fixed": (" ■ FIXED SNAPSHOT ", BADGE_NOTE),
        }[c.status]
        t.append(*badge)
        stale = c.status == "stale"
        if stale:
            t.append(
                f" reconnecting in {c.retry_in_s:.0f}s"
                if c.retry_in_s and c.retry_in_s >= 0.5
                else " reconnecting now",
                style=WARN_BOLD,
            )
            if c.data_at:
                t.append(f" · showing data from {clock(c.data_at)}", style=WARN_BOLD)
        t.append(f"  {c.url}", style="bold")
        if c.instance_id:
            t.append(f" · {c.instance_id}", style="dim")
        if c.data_at and not stale:
            t.append(f" · data as of {clock(c.data_at)}", style="dim")
        t.append(" · token ✔" if c.has_token else " · read-only (no token)", style="dim" if c.has_token else WARN)
        if stale and c.error:
            t.append(f" · {c.error}", style=WARN)
        if c.hint:
            t.append(f" · {c.hint}", style=HINT)
        self.update(t)
