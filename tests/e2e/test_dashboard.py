"""The terminal dashboard, driven with Textual's pilot against a real control plane on
loopback (uvicorn in a thread, the session's embedded Redis); plus snapshot tests of the
main screen fed a fixed :class:`~dashboard.models.Snapshot`."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from support import eventually, settle
from textual import events
from textual.pilot import Pilot
from textual.widgets import Input

from dashboard.app import ShadowlimitDashboard
from dashboard.client import ControlPlaneClient, GateRefused, Unauthorized
from dashboard.modals import ConfirmModeScreen, GateRefusedScreen, PercentScreen
from dashboard.screen import DashboardScreen
from dashboard.widgets import AuditPanel, BucketsTable, ConnectionBar, RoutesTable

TOKEN = "t0ken"
SIZE = (160, 50)

# search: the global limit is stricter than the local one, so shadow mode shows new
# rejections (local allowed, distributed would deny) for a busy client.
RULES = """\
version: 1
routes:
  - name: search
    match: {methods: [GET], path: /api/search/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 10, period: 1s, burst: 20}
    distributed: {average: 5, period: 1s, burst: 5}
  - name: checkout
    match: {methods: [POST], path: /api/checkout/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 5, period: 1s, burst: 5}
    distributed: {average: 8, period: 1s, burst: 8}
  - name: chat                       # a token budget: its figures in tokens
    match: {methods: [POST], path: /v1/chat/**}
    key: {strategy: header, header: X-Tenant}
    local: {average: 3000, period: 1h, burst: 3000}
    distributed: {average: 2000, period: 1h, burst: 2000}
    budget: {}
    cost_unit: tokens
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ControlPlane:
    """A real control plane (``create_app``) served by uvicorn in a background thread."""

    def __init__(
        self, redis_url: str, rules_path: Path, *, namespace: str, port: int | None = None, **overrides: Any
    ) -> None:
        self.redis_url, self.rules_path, self.namespace = redis_url, rules_path, namespace
        self.port = port or _free_port()
        self.overrides = overrides
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ControlPlane:
        from control_plane.server.app import create_app
        from control_plane.settings import load_settings

        settings = load_settings(
            redis_url=self.redis_url,
            enable_distributed_rate_limiting=True,
            admin_token=TOKEN,
            rules_path=self.rules_path,
            namespace=self.namespace,
            # gate_min_dwell_s=0: the tests step canary 10% -> 25% at once
            **{"gate_min_samples": 0, "gate_min_dwell_s": 0, "stream_interval_s": 0.5, **self.overrides},
        )
        self.app = create_app(settings)
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            timeout_graceful_shutdown=1,
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"control-plane-{self.port}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if not self.thread.is_alive():
                break
            time.sleep(0.05)
        raise RuntimeError(f"control plane on {self.url} did not come up")

    async def settle(self) -> None:
        """The engine's buffered work (shadow, counters, views) made visible now."""
        assert self.server is not None
        loop = self.server.servers[0].get_loop()
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(settle(self.app.state.engine), loop))

    def stop(self) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(15)
            assert not self.thread.is_alive(), "uvicorn did not stop"
        self.server = self.thread = None

    def restart(self) -> ControlPlane:
        """Start again on the same port, Redis and namespace (state survives in Redis)."""
        return ControlPlane(
            self.redis_url, self.rules_path, namespace=self.namespace, port=self.port, **self.overrides
        ).start()


@pytest.fixture
def control_plane(redis_server: Any, tmp_path: Path) -> Iterator[Callable[..., ControlPlane]]:
    """Factory: ``control_plane(**settings_overrides)`` starts one; all stop at teardown."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    started: list[ControlPlane] = []

    def start(namespace: str | None = None, **overrides: Any) -> ControlPlane:
        """One more control plane; ``namespace``: another's, to make them one fleet."""
        namespace = namespace or f"dash{uuid.uuid4().hex[:10]}"
        cp = ControlPlane(redis_server.url, rules, namespace=namespace, **overrides).start()
        started.append(cp)
        return cp

    yield start
    for cp in started:
        cp.stop()


async def traffic(url: str, n: int = 30, *, route: str = "search", key: str = "bob") -> None:
    async with httpx.AsyncClient(base_url=url) as c:
        for _ in range(n):
            r = await c.post("/v1/decide", json={"route": route, "key": key})
            assert r.status_code in (200, 429), r.text


async def wait_for(
    pilot: Pilot[Any], predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def dash(app: ShadowlimitDashboard) -> DashboardScreen:
    screen = app.dashboard
    assert screen is not None
    return screen


def cell(app: ShadowlimitDashboard, table: type[RoutesTable] | type[BucketsTable], row: str, col: str) -> str:
    value = dash(app).query_one(table).get_cell(row, col)
    return getattr(value, "plain", str(value))


def connection_text(app: ShadowlimitDashboard) -> str:
    bar = dash(app).query_one(ConnectionBar)
    return str(bar.render())


def plain(widget: Any, width: int = 120) -> str:
    """What a Static shows, as plain text (Text or a rich table)."""
    import io

    from rich.console import Console

    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.file.getvalue()  # type: ignore[attr-defined,no-any-return]


def server_routes(url: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in httpx.get(f"{url}/v1/routes", timeout=5).json()["routes"]}


async def until_live(pilot: Pilot[Any], app: ShadowlimitDashboard) -> None:
    await wait_for(
        pilot,
        lambda: app.dashboard is not None and dash(app).conn.status == "live" and dash(app).snapshot is not None,
        what="the dashboard to go live",
    )


async def reason_focused(pilot: Pilot[Any]) -> None:
    """Wait until the dialog on top has mounted and focused its reason input (a key pressed
    before that, on a loaded machine, goes nowhere)."""
    await wait_for(
        pilot,
        lambda: getattr(pilot.app.focused, "id", None) == "reason" and pilot.app.focused.screen is pilot.app.screen,
        what="the reason input focused",
    )


async def type_reason(pilot: Pilot[Any], reason: str) -> None:
    await reason_focused(pilot)
    await pilot.press(*["space" if ch == " " else ch for ch in reason])


# -- against a real control plane ---------------------------------------------------------


async def test_routes_and_buckets_show_the_servers_figures(
    control_plane: Callable[..., ControlPlane], tmp_path: Path
) -> None:
    cp = control_plane()
    await traffic(cp.url, 30)  # local burst 20, global burst 5: 15 new rejections
    await traffic(cp.url, 4, route="checkout", key="carol")
    await cp.settle()  # the divergence counters in Redis, and in the fleet views, now
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        server = server_routes(cp.url)
        new_rej = server["search"]["divergence_5m"]["local_allow_distributed_deny"]
        assert new_rej >= 10  # about 15, plus whatever the global bucket refilled meanwhile

        def same_new_rejections() -> bool:
            nonlocal server
            server = server_routes(cp.url)
            lad = server["search"]["divergence_5m"]["local_allow_distributed_deny"]
            return cell(app, RoutesTable, "search", "newrej").startswith(f"{lad:,} ")

        await wait_for(pilot, same_new_rejections, what="the server's new rejections in the routes table")
        assert cell(app, RoutesTable, "search", "mode") == "shadow"
        assert cell(app, RoutesTable, "checkout", "mode") == "shadow"
        rate = server["search"]["divergence_5m"]["new_rejection_rate"]
        assert f"({rate * 100:.1f}%)" in cell(app, RoutesTable, "search", "newrej")
        assert cell(app, RoutesTable, "search", "errors").startswith("0 ")
        assert "canary" in cell(app, RoutesTable, "search", "gate")
        assert "new rej" in cell(app, RoutesTable, "search", "gate")  # why not: the rate is over 1%

        # the buckets follow the selected route (search, the first row) and match /v1/buckets
        buckets = httpx.get(f"{cp.url}/v1/buckets", params={"route": "search"}).json()["buckets"]
        bob = next(b for b in buckets if b["key"] == "bob")
        await wait_for(pilot, lambda: "bob" in dash(app).query_one(BucketsTable).rows, what="bob's bucket")
        assert cell(app, BucketsTable, "bob", "req") == str(bob["recent_requests"])
        assert cell(app, BucketsTable, "bob", "local").strip().endswith(f"/{bob['local']['burst']}")
        assert cell(app, BucketsTable, "bob", "dist").strip().endswith(f"/{bob['distributed']['burst']}")
        assert "local" in cell(app, BucketsTable, "bob", "last")

        # live: more traffic shows up without doing anything
        await traffic(cp.url, 10, key="dave")
        await wait_for(
            pilot,
            lambda: "dave" in dash(app).query_one(BucketsTable).rows and cell(app, BucketsTable, "dave", "req") == "10",
            what="dave's 10 requests to appear live",
        )

        # moving to checkout shows checkout's keys
        await pilot.press("down")
        await wait_for(
            pilot, lambda: set(dash(app).query_one(BucketsTable).rows) == {"carol"}, what="checkout's buckets"
        )
        assert "Backend" in str(dash(app).query_one("#backend-box").border_title)
        assert "CLOSED" in plain(dash(app).query_one("#backend"))

        # a screenshot of the real thing (SHADOWLIMIT_DASH_SCREENSHOTS=dir keeps a copy)
        svg = Path(app.save_screenshot("dashboard.svg", path=str(tmp_path)))
        assert "checkout" in svg.read_text()
        keep = os.environ.get("SHADOWLIMIT_DASH_SCREENSHOTS")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(svg, Path(keep) / "dashboard-real-server-160x50.svg")


async def test_a_budget_route_shows_its_figures_in_tokens(control_plane: Callable[..., ControlPlane]) -> None:
    """A budget route in shadow: the divergence panel says in tokens what the global budget would
    have refused, and who, worth how much; the buckets show each side's balance, what its
    reservations hold and its debt, in tokens, as /v1/buckets says."""
    cp = control_plane()
    async with httpx.AsyncClient(base_url=cp.url) as c:
        for _ in range(4):  # 4 x 600: each fits the replica's 3,000, the global 2,000 runs out after 3
            r = await c.post("/v1/decide", json={"route": "chat", "key": "stark", "estimate": 600})
            rid = r.json()["reservation"]
            assert rid is not None, r.text
            assert (await c.post("/v1/settle", json={"reservation": rid, "cost": 500})).status_code == 200
        held = await c.post("/v1/decide", json={"route": "chat", "key": "stark", "estimate": 400})
        assert held.json()["reservation"] is not None  # left outstanding: 400 reserved
        charged = await c.post("/v1/charge", json={"route": "chat", "key": "stark", "cost": 1500})
        assert charged.status_code == 200, charged.text  # past what is left: a debt of 900 here, 1,400 globally
    await cp.settle()
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        await pilot.press("down", "down")  # search, checkout, chat
        await wait_for(pilot, lambda: "stark" in dash(app).query_one(BucketsTable).rows, what="stark's budget")
        from dashboard.chart import DivergenceChart

        lines = str(dash(app).query_one(DivergenceChart).render()).splitlines()
        said = next(line for line in lines if line.strip().startswith("in tokens"))
        assert "would refuse 1 request worth 500 tokens" in said, lines
        blocked = [line for line in lines if "stark ×1" in line]
        assert blocked and "stark ×1 (600 tokens)" in blocked[-1], lines
        bucket = next(b for b in httpx.get(f"{cp.url}/v1/buckets", params={"route": "chat"}).json()["buckets"])
        assert bucket["unit"] == "tokens" and bucket["local"]["reserved"] == 400 and bucket["distributed"]["debt"] > 0
        local, dist = cell(app, BucketsTable, "stark", "local"), cell(app, BucketsTable, "stark", "dist")
        assert "/3k tokens · 400 reserved · debt 89" in local, local  # 900 less what refilled since
        assert "/2k tokens" in dist and "400 reserved" in dist and "debt 1.4k" in dist, dist
        assert "✘ local" in cell(app, BucketsTable, "stark", "last")  # the last: the charge, past what was left


def chart_header(app: ShadowlimitDashboard, route: str) -> str:
    """``route``'s header line in the divergence panel (``▶ `` in front when it is selected)."""
    from dashboard.chart import DivergenceChart

    lines = str(dash(app).query_one(DivergenceChart).render()).splitlines()
    return next((line for line in lines if line.lstrip("▶ ").startswith(f"{route} ")), "")


async def test_the_selected_route_is_marked_not_only_coloured(control_plane: Callable[..., ControlPlane]) -> None:
    """The cursor row carries a ▶ in the routes table's first column and in the divergence
    panel, so the selection shows without colour; it follows the keys, stays through live
    updates, and the mode keys act on the marked route."""
    cp = control_plane()
    await traffic(cp.url, 6)
    await traffic(cp.url, 3, route="checkout", key="carol")
    await cp.settle()
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        marks = lambda: [cell(app, RoutesTable, r, "sel") for r in ("search", "checkout")]  # noqa: E731
        assert marks() == ["▶", " "]
        await wait_for(pilot, lambda: chart_header(app, "search").startswith("▶ search"), what="▶ in the chart")
        assert chart_header(app, "checkout").startswith("  checkout")

        await pilot.press("down")
        await wait_for(pilot, lambda: marks() == [" ", "▶"], what="the marker to follow the cursor")
        await wait_for(pilot, lambda: chart_header(app, "checkout").startswith("▶ checkout"), what="the chart marker")
        assert not chart_header(app, "search").startswith("▶")

        # live snapshots re-render the table: the marker stays on the cursor row
        before = dash(app).snapshot
        await traffic(cp.url, 3, route="checkout", key="erin")
        await wait_for(pilot, lambda: dash(app).snapshot is not before, what="a newer snapshot")
        assert marks() == [" ", "▶"]

        await pilot.press("o")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModeScreen), what="the confirmation")
        assert "Move checkout:" in str(app.screen.query_one(".dialog-title").render())


async def test_toggle_with_a_reason_changes_the_mode_on_the_server(control_plane: Callable[..., ControlPlane]) -> None:
    cp = control_plane()
    await traffic(cp.url, 3)
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        await pilot.press("o")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModeScreen), what="the confirmation")
        assert "no gate" in str(app.screen.query_one("#gate-verdict").render()).lower()
        await pilot.press("enter")  # no reason yet: refused locally, the dialog stays
        await pilot.pause(0.2)
        assert isinstance(app.screen, ConfirmModeScreen)
        assert server_routes(cp.url)["search"]["stored_mode"] == "shadow"
        await type_reason(pilot, "pause the rollout")
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: server_routes(cp.url)["search"]["stored_mode"] == "off", what="the server to store off"
        )
        await wait_for(pilot, lambda: cell(app, RoutesTable, "search", "mode") == "off", what="the table to show off")
        entry = httpx.get(f"{cp.url}/v1/rollout/audit").json()["entries"][0]
        assert (entry["route"], entry["from"], entry["to"], entry["reason"]) == (
            "search",
            "shadow",
            "off",
            "pause the rollout",
        )
        assert entry["actor"] == "admin@127.0.0.1 (note: dashboard)"  # the token's name; the header is a note
        await wait_for(
            pilot, lambda: "pause the rollout" in plain(dash(app).query_one(AuditPanel)), what="the audit panel"
        )

        # canary asks the percent first; the gate passes (gate_min_samples=0, no divergence)
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModeScreen))
        await type_reason(pilot, "back to shadow")
        await pilot.press("enter")
        await wait_for(pilot, lambda: cell(app, RoutesTable, "search", "mode") == "shadow", what="shadow")
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, PercentScreen), what="the percent prompt")
        app.screen.query_one("#percent", Input).value = ""
        await pilot.press("2", "5", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModeScreen))
        assert "promotion" in str(app.screen.query_one("#gate-verdict").render())
        await type_reason(pilot, "quarter")
        await pilot.press("enter")
        await wait_for(pilot, lambda: cell(app, RoutesTable, "search", "mode") == "canary 25%", what="canary 25%")
        search = server_routes(cp.url)["search"]
        assert (search["stored_mode"], search["canary_percent"]) == ("canary", 25)


async def test_a_refused_gate_shows_why_and_force_works(control_plane: Callable[..., ControlPlane]) -> None:
    cp = control_plane(gate_min_samples=10_000)
    await traffic(cp.url, 5)
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        assert "samples" in cell(app, RoutesTable, "search", "gate")  # why not, in the table already
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModeScreen))
        figures = str(app.screen.query_one("#gate-figures").render())
        assert "need ≥ 10,000" in figures
        await type_reason(pilot, "go global")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GateRefusedScreen), what="the refusal")
        reasons = str(app.screen.query_one("#gate-reasons").render())
        assert "need 10000" in reasons and "compared decisions" in reasons
        assert server_routes(cp.url)["search"]["stored_mode"] == "shadow"  # nothing changed
        assert cell(app, RoutesTable, "search", "mode") == "shadow"
        # the reason is carried over; forcing sends force=true with it
        assert app.screen.query_one("#reason", Input).value == "go global"
        await reason_focused(pilot)
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: server_routes(cp.url)["search"]["stored_mode"] == "enforce", what="the forced change"
        )
        await wait_for(
            pilot, lambda: cell(app, RoutesTable, "search", "mode") == "enforce", what="the table to show enforce"
        )
        entry = httpx.get(f"{cp.url}/v1/rollout/audit").json()["entries"][0]
        assert entry["forced"] is True and entry["to"] == "enforce" and entry["reason"] == "go global"
        await wait_for(
            pilot,
            lambda: "FORCED" in plain(dash(app).query_one(AuditPanel)),
            what="the forced entry in the audit panel",
        )

        # cancelling the refusal leaves the server alone
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, PercentScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
        assert server_routes(cp.url)["search"]["stored_mode"] == "enforce"


async def test_without_a_token_the_toggles_say_they_need_one(control_plane: Callable[..., ControlPlane]) -> None:
    cp = control_plane()
    app = ShadowlimitDashboard(cp.url, None)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        assert "read-only" in connection_text(app)
        for key in ("e", "c", "o", "s"):
            await pilot.press(key)
            await pilot.pause(0.1)
            assert isinstance(app.screen, DashboardScreen)  # no dialog, no request
        messages = [n.message for n in app._notifications]
        assert messages and all("needs an operator or admin token" in m for m in messages)
        assert httpx.get(f"{cp.url}/v1/rollout/audit").json()["entries"] == []
        assert server_routes(cp.url)["search"]["stored_mode"] == "shadow"


async def test_a_viewer_token_watches_and_is_told_a_change_needs_more(
    control_plane: Callable[..., ControlPlane], tmp_path: Path
) -> None:
    """With a tokens file the stream needs a viewer token; a mode change with it is refused
    by the server, and the dashboard says which role it needs."""
    import hashlib

    tokens = tmp_path / "tokens"
    tokens.write_text(f"vera viewer {hashlib.sha256(b'vera-secret').hexdigest()}\n")
    cp = control_plane(tokens_file=str(tokens))
    app = ShadowlimitDashboard(cp.url, "vera-secret")
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        await pilot.press("o")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModeScreen))
        await type_reason(pilot, "quiet please")
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("operator role" in n.message for n in app._notifications), what="the refusal")
        note = next(n for n in app._notifications if "operator role" in n.message)
        assert "the token 'vera' has the viewer role" in note.message and "403" in (note.title or "")
        assert server_routes_with(cp.url, "vera-secret")["search"]["stored_mode"] == "shadow"
    # without a token the stream itself is refused, and the bar says why
    app = ShadowlimitDashboard(cp.url, None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(
            pilot,
            lambda: "viewer role" in connection_text(app),
            what="the connection bar to say a viewer token is needed",
        )


async def test_a_sampled_divergence_says_how_much_it_covers(control_plane: Callable[..., ControlPlane]) -> None:
    """A shadow queue that drops evaluations makes the figures a sample: the chart and the
    routes table say what share of the decisions they cover."""
    from dashboard.chart import DivergenceChart

    cp = control_plane(shadow_queue_size=1)
    async with httpx.AsyncClient(base_url=cp.url) as c:
        r = await c.post(
            "/v1/decide/batch", json={"requests": [{"route": "search", "key": f"k{i % 20}"} for i in range(300)]}
        )
        assert r.status_code == 200
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        await wait_for(
            pilot,
            lambda: " sampled" in str(dash(app).query_one(DivergenceChart).render()),
            what="the chart to show the sampled share",
        )
        header = next(
            line
            for line in str(dash(app).query_one(DivergenceChart).render()).splitlines()
            if line.lstrip("▶ ").startswith("search ")  # the selected route is marked ▶
        )
        share = float(header.split(" sampled")[0].rsplit("· ", 1)[1].rstrip("%"))
        assert 0 < share < 30
        await wait_for(
            pilot, lambda: " of " in cell(app, RoutesTable, "search", "newrej"), what="the table to show the share"
        )
        assert cell(app, RoutesTable, "search", "newrej").endswith("%")


def chart_lines(app: ShadowlimitDashboard, route: str) -> list[str]:
    """``route``'s block in the divergence panel, line by line (its header first)."""
    from dashboard.chart import DivergenceChart

    snap = dash(app).snapshot
    names = list(snap.divergence.routes) if snap is not None and snap.divergence is not None else []
    lines = str(dash(app).query_one(DivergenceChart).render()).splitlines()
    heads = [i for i, line in enumerate(lines) if any(line.lstrip("▶ ").startswith(f"{n} ") for n in names)]
    top = next((i for i in heads if lines[i].lstrip("▶ ").startswith(f"{route} ")), None)
    if top is None:
        return []
    end = next((i for i in heads if i > top), len(lines) - 1)  # the next route's header, or the time axis
    return lines[top:end]


def chart_line(app: ShadowlimitDashboard, route: str, label: str) -> str:
    """What follows ``label`` on its line in ``route``'s block ("" without such a line)."""
    found = [line.strip()[len(label) :].strip() for line in chart_lines(app, route) if line.strip().startswith(label)]
    return found[0] if found else ""


async def test_the_divergence_panel_says_why_in_words_and_each_blocked_keys_cause(
    control_plane: Callable[..., ControlPlane],
) -> None:
    """Two replicas of one fleet. On search (a global limit stricter than the local one) bob
    sends 15 requests to each: every one admitted locally, the global limit admits 5; the
    old limit, fleet-wide, would have admitted 20, so of his 25 new rejections 15 are the new
    limit being tighter and 10 the fleet multiplying the old one. On checkout carol
    sends 7 to one replica, whose bucket holds 5, while the global limit would admit them:
    the reverse, the load uneven over the replicas. The panel says so in the server's words,
    with each would-be-blocked key's cause."""
    cp = control_plane()
    cp2 = control_plane(namespace=cp.namespace)
    for replica in (cp, cp2):  # each knows the fleet is two (heartbeats): 2 x 5/s locally is above 8/s
        eventually(
            lambda r=replica: httpx.get(f"{r.url}/v1/backend", timeout=5).json()["live_instances"] == 2,
            15,
            what="a fleet of two",
        )
    async with httpx.AsyncClient() as c:  # in two bursts, so the limits barely refill meanwhile
        for replica in (cp, cp2):
            r = await c.post(
                f"{replica.url}/v1/decide/batch", json={"requests": [{"route": "search", "key": "bob"}] * 15}
            )
            assert r.status_code == 200 and all(x["allowed"] for x in r.json()["decisions"]), r.text
    await traffic(cp.url, 7, route="checkout", key="carol")
    await cp.settle()
    await cp2.settle()
    await cp.settle()  # the views again, now that both replicas' counters are written
    server = httpx.get(f"{cp.url}/v1/divergence", params={"minutes": 60}, timeout=5).json()["routes"]
    search, checkout = server["search"], server["checkout"]
    why = search["causes"]["new_rejections"]
    assert why["by_cause"]["tighter"] > 0 and why["by_cause"]["replicas"] > 0, why
    assert " · " in why["summary"], why
    [bob] = search["would_be_blocked"]
    assert bob["key"] == "bob" and bob["cause"] in ("tighter", "replicas"), bob
    assert checkout["causes"]["reverse"]["summary"] == "100% the load was uneven over the replicas", checkout

    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        await wait_for(pilot, lambda: chart_line(app, "search", "why new rej"), what="the search block's why line")
        assert chart_line(app, "search", "why new rej") == why["summary"]
        assert chart_line(app, "search", "would block") == f"bob ×{bob['count']:,} {bob['cause']}"
        assert not chart_line(app, "search", "why reverse")
        assert chart_line(app, "checkout", "why reverse") == "100% the load was uneven over the replicas"
        assert not chart_line(app, "checkout", "why new rej") and not chart_line(app, "checkout", "would block")


async def test_a_restoration_shows_in_the_audit_panel(
    control_plane: Callable[..., ControlPlane], redis_server: Any
) -> None:
    """The store loses this fleet's state: the replica writes it back and the dashboard
    shows the restoration next to the change it restored."""
    import redis as redis_sync

    cp = control_plane()
    r = httpx.put(
        f"{cp.url}/v1/routes/search/mode",
        json={"mode": "enforce", "reason": "go", "force": True},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert r.status_code == 200
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        rc = redis_sync.Redis.from_url(redis_server.url)
        rc.delete(*rc.keys(f"rl:{{{cp.namespace}}}:*"))  # this fleet's rollout, audit and epoch: gone
        await wait_for(
            pilot,
            lambda: "RESTORED" in plain(dash(app).query_one(AuditPanel)),
            what="the restoration in the audit panel",
        )
        text = plain(dash(app).query_one(AuditPanel))
        assert "search RESTORED enforce" in text and "after the store lost its data" in text
        assert cell(app, RoutesTable, "search", "mode") == "enforce"


def server_routes_with(url: str, token: str) -> dict[str, Any]:
    routes = httpx.get(f"{url}/v1/routes", headers={"Authorization": f"Bearer {token}"}).json()["routes"]
    return {r["name"]: r for r in routes}


async def test_a_lost_control_plane_marks_the_data_stale_and_reconnects(
    control_plane: Callable[..., ControlPlane],
) -> None:
    cp = control_plane()
    await traffic(cp.url, 8)
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        assert "LIVE" in connection_text(app)
        before = dash(app).snapshot
        assert before is not None
        await asyncio.to_thread(cp.stop)
        await wait_for(pilot, lambda: dash(app).conn.status == "stale", what="stale")
        text = connection_text(app)
        assert "STALE" in text and "reconnecting" in text and "showing data from" in text
        assert dash(app).has_class("-stale")
        # the last data stays on screen
        assert cell(app, RoutesTable, "search", "mode") == "shadow"
        assert "bob" in dash(app).query_one(BucketsTable).rows
        await pilot.pause(1.5)
        assert dash(app).conn.status == "stale"

        back = await asyncio.to_thread(cp.restart)
        try:
            await wait_for(pilot, lambda: dash(app).conn.status == "live", timeout=20, what="the reconnect")
            assert "LIVE" in connection_text(app) and not dash(app).has_class("-stale")
            snap = dash(app).snapshot
            assert snap is not None and snap.at > before.at and snap.instance_id != before.instance_id
        finally:
            await asyncio.to_thread(back.stop)


async def test_client_translates_errors(control_plane: Callable[..., ControlPlane]) -> None:
    cp = control_plane(gate_min_samples=10_000)
    bad = ControlPlaneClient(cp.url, "wrong")
    good = ControlPlaneClient(cp.url, TOKEN)
    try:
        with pytest.raises(Unauthorized) as unauthorized:
            await bad.set_mode("search", "off", reason="x")
        assert unauthorized.value.status == 401
        with pytest.raises(GateRefused) as refused:
            await good.set_mode("search", "enforce", reason="x")
        assert refused.value.gate.min_samples == 10_000 and not refused.value.gate.passed
        result = await good.set_mode("search", "enforce", reason="x", force=True)
        assert result.state.mode == "enforce" and result.audit.forced
        assert [r.name for r in await good.routes()][:2] == ["search", "checkout"]
        assert (await good.audit())[0].to_mode == "enforce"
    finally:
        await bad.aclose()
        await good.aclose()


# -- snapshot tests: the main screen fed a fixed Snapshot (no connection) -----------------

AT = 1_700_000_000.0


def _gate(
    target: str, compared: int, min_samples: int, new_rej: int, errors: int = 0, attempts: int | None = None
) -> dict[str, Any]:
    rate = new_rej / compared if compared else 0.0
    erate = errors / (attempts or compared) if (attempts or compared) else 0.0
    reasons = []
    if compared < min_samples:
        reasons.append(f"only {compared} compared decisions in the last 300s (need {min_samples})")
    if rate > 0.01:
        reasons.append(f"new rejections {rate:.2%} exceed 1.00%")
    return {
        "target": target,
        "passed": not reasons,
        "required": True,
        "reasons": reasons,
        "window_s": 300,
        "compared": compared,
        "min_samples": min_samples,
        "new_rejections": new_rej,
        "new_rejection_rate": rate,
        "max_new_rejection_rate": 0.01,
        "backend_errors": errors,
        "backend_error_rate": erate,
        "max_backend_error_rate": 0.001,
    }


def _series(
    minutes: int, agree: Callable[[int], int], lad: Callable[[int], int], lda: Callable[[int], int]
) -> list[dict[str, int]]:
    start = int(AT // 60 * 60) - 60 * (minutes - 1)
    out = []
    for i in range(minutes):
        a, b, c = agree(i), lad(i), lda(i)
        out.append(
            {
                "minute": start + 60 * i,
                "agree": a,
                "local_allow_distributed_deny": b,
                "local_deny_distributed_allow": c,
                "compared": a + b + c,
                "backend_errors": 0,
                "distributed_attempts": a + b + c,
            }
        )
    return out


def _totals(series: list[dict[str, int]]) -> dict[str, Any]:
    keys = (
        "agree",
        "local_allow_distributed_deny",
        "local_deny_distributed_allow",
        "compared",
        "backend_errors",
        "distributed_attempts",
    )
    t: dict[str, Any] = {k: sum(p[k] for p in series) for k in keys}
    t["new_rejection_rate"] = t["local_allow_distributed_deny"] / t["compared"] if t["compared"] else 0.0
    t["reverse_rate"] = t["local_deny_distributed_allow"] / t["compared"] if t["compared"] else 0.0
    t["backend_error_rate"] = 0.0
    return t


def _policy(avg: float, burst: int, algo: str = "token_bucket") -> dict[str, Any]:
    return {"algorithm": algo, "average": avg, "period": 1.0, "burst": burst}


def _route(
    name: str,
    mode: str,
    percent: int,
    rate: float,
    series: list[dict[str, int]],
    gate: dict[str, Any],
    local: dict[str, Any],
    dist: dict[str, Any],
) -> dict[str, Any]:
    return {
        "name": name,
        "mode": mode,
        "stored_mode": mode,
        "canary_percent": percent,
        "state": {
            "mode": mode,
            "canary_percent": percent,
            "updated_at": AT - 600,
            "updated_by": "dashboard@127.0.0.1",
            "reason": "",
            "version": 3,
        },
        "rule": {"name": name, "local": local, "distributed": dist},
        "decisions_per_s": rate,
        "divergence_5m": _totals(series[-5:]),
        "gate": gate,
    }


def _bucket(
    route: str,
    key: str,
    n: int,
    local: float,
    lburst: int,
    dist: float,
    dburst: int,
    allowed: bool,
    by: str,
    age: float,
) -> dict[str, Any]:
    return {
        "route": route,
        "key": key,
        "recent_requests": n,
        "local": {
            "tokens": local,
            "limit": lburst,
            "exists": True,
            "reset_after_us": 0,
            "burst": lburst,
            "policy": _policy(lburst, lburst),
        },
        "distributed": {
            "tokens": dist,
            "limit": dburst,
            "exists": True,
            "reset_after_us": 0,
            "burst": dburst,
            "policy": _policy(dburst, dburst),
        },
        "last_decision": {"at": AT - age, "allowed": allowed, "enforced_by": by},
    }


def fixed_snapshot() -> dict[str, Any]:
    search = _series(
        60, lambda i: 400 + (i * 37) % 180, lambda i: 0 if i < 20 else 20 + (i * 13) % 60, lambda i: (i * 7) % 5
    )
    checkout = _series(60, lambda i: 150 + (i * 11) % 40, lambda i: 0, lambda i: 10 + (i * 3) % 9)
    login = _series(60, lambda i: 30 if i > 40 else 0, lambda i: 0, lambda i: 0)
    divergence = {
        "minutes": 60,
        "routes": {
            "search": {
                "totals": _totals(search),
                "series": search,
                "would_be_blocked": [
                    {"key": "bob", "count": 1840, "last_request_id": "r1", "cause": "replicas"},
                    {"key": "mallory", "count": 96, "last_request_id": "r2", "cause": "tighter"},
                ],
                "causes": {
                    "explain": True,
                    "new_rejections": {
                        "total": 1936,
                        "unexplained": 0,
                        "summary": "95% the fleet multiplied the old limit · 5% the new limit is tighter",
                    },
                    "reverse": {"total": 0, "unexplained": 0, "summary": ""},
                },
            },
            "checkout": {"totals": _totals(checkout), "series": checkout, "would_be_blocked": []},
            "login": {"totals": _totals(login), "series": login, "would_be_blocked": []},
        },
    }

    def audit(
        at: float,
        route: str,
        frm: str,
        to: str,
        pf: int,
        pt: int,
        reason: str,
        forced: bool = False,
        kind: str = "mode_change",
    ) -> dict[str, Any]:
        return {
            "seq": int(at),
            "at": at,
            "type": kind,
            "route": route,
            "audit": {
                "id": f"{int(at)}-0",
                "kind": kind,
                "route": route,
                "actor": "dashboard@127.0.0.1",
                "at": at,
                "from": frm,
                "to": to,
                "from_percent": pf,
                "to_percent": pt,
                "reason": reason,
                "forced": forced,
                "automatic": False,
                "gate": None,
            },
        }

    return {
        "at": AT,
        "instance_id": "replica-1",
        "backend": {
            "state": "open",
            "consecutive_failures": 7,
            "last_error": "TimeoutError: Redis did not answer within 250 ms",
            "next_probe_in_s": 3.4,
            "probe_attempt": 2,
            "total_failures": 19,
            "failure_policy": "inMemoryFallback",
            "failure_code": 429,
            "redis": "127.0.0.1:6379",
            "live_instances": 3,
            "fleet": ["replica-1", "replica-2", "replica-3"],
            "instance_id": "replica-1",
            "shadow_queue": 12,
            "shadow_queue_capacity": 10000,
            "shadow_dropped": 0,
            "shadow_evaluated": 48213,
            "pending_rollbacks": [],
            "distributed_enabled": True,
        },
        "routes": [
            _route(
                "search", "shadow", 0, 21.3, search, _gate("canary", 2514, 500, 312), _policy(10, 10), _policy(10, 10)
            ),
            _route(
                "checkout", "canary", 25, 14.8, checkout, _gate("enforce", 890, 500, 0), _policy(5, 5), _policy(8, 8)
            ),
            _route(
                "login",
                "off",
                0,
                0.5,
                login,
                {
                    "target": "shadow",
                    "passed": True,
                    "required": False,
                    "reasons": [],
                    "compared": 150,
                    "min_samples": 500,
                },
                _policy(2, 20, "sliding_window"),
                _policy(2, 20, "sliding_window"),
            ),
        ],
        "divergence": divergence,
        "buckets": [
            _bucket("search", "bob", 1260, 7.5, 10, 0.4, 10, True, "local", 0.3),
            _bucket("search", "alice", 240, 9.0, 10, 8.2, 10, True, "local", 2.0),
            _bucket("search", "mallory", 96, 2.0, 10, 0.0, 10, False, "local", 14.0),
            _bucket("checkout", "carol", 180, 4.0, 5, 6.5, 8, True, "distributed", 1.0),
        ],
        "events": [
            audit(AT - 3600, "search", "off", "shadow", 0, 0, "start measuring"),
            audit(AT - 1800, "checkout", "shadow", "canary", 0, 10, "divergence under 1% for a day"),
            audit(AT - 600, "checkout", "canary", "canary", 10, 25, "widen the canary", forced=True),
            {
                "seq": 900,
                "at": AT - 42,
                "type": "breaker",
                "from": "closed",
                "to": "open",
                "reason": "TimeoutError",
                "instance": "replica-1",
            },
            {
                "seq": 901,
                "at": AT - 30,
                "type": "rules_reload",
                "route": "*",
                "audit": {
                    "kind": "rules_reload",
                    "route": "*",
                    "actor": "instance/replica-1",
                    "at": AT - 30,
                    "from": "",
                    "to": "ok",
                    "reason": "3 routes, digest 9f2c4e1a7b3d",
                },
            },
        ],
    }


@pytest.fixture
def utc() -> Iterator[None]:
    """Clock times in the snapshots are rendered in local time: pin it."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def fixed_app(token: str | None = TOKEN, **kwargs: Any) -> ShadowlimitDashboard:
    """The fixed snapshot, in textual-dark unless ``theme=`` says otherwise (never the
    environment's SHADOWLIMIT_DASHBOARD_THEME: a snapshot test must not depend on it)."""
    from dashboard.models import Snapshot

    kwargs.setdefault("theme", "textual-dark")
    return ShadowlimitDashboard(
        "http://control-plane.test:8080", token, snapshot=Snapshot.parse(fixed_snapshot()), **kwargs
    )


def test_snapshot_main_screen_160x50(snap_compare: Any, utc: None) -> None:
    assert snap_compare(fixed_app(), terminal_size=SIZE)


def test_snapshot_main_screen_120x40(snap_compare: Any, utc: None) -> None:
    assert snap_compare(fixed_app(None), terminal_size=(120, 40))


async def _steady_cursor(pilot: Pilot[Any]) -> None:
    """A dialog's text cursor blinks: shown steadily, a snapshot does not depend on when it is taken."""
    for field in pilot.app.screen.query(Input):
        field.cursor_blink = False
    await pilot.pause()


def budget_snapshot() -> dict[str, Any]:
    """The fixed snapshot with a token budget in shadow, ``chat``: stark spreads its requests over
    the replicas and the global budget would refuse them (2.1M tokens' worth); its buckets in
    tokens, with what their reservations hold and the global side's debt."""
    data = fixed_snapshot()
    chat = _series(60, lambda i: 40 + i % 7, lambda i: 0 if i < 30 else 3 + i % 4, lambda i: 0)
    units = {"unit": "tokens", "summary": "would have refused 141 requests worth 2.1M tokens (96k of it estimated:"
             " reservations not settled yet)"}  # fmt: skip
    data["routes"].append(
        _route(
            "chat", "shadow", 0, 0.8, chat, _gate("canary", 300, 500, 20), _policy(333, 20000), _policy(500, 30000)
        )  # fmt: skip
    )
    data["divergence"]["routes"]["chat"] = {
        "totals": _totals(chat),
        "series": chat,
        "would_be_blocked": [
            {"key": "stark", "count": 141, "last_request_id": "r9", "cause": None, "units": 2_094_000},
        ],
        "units": {**units, "new_rejections": {"requests": 141, "units": 2_100_000, "estimated": 96_000}},
    }
    for key, local, dist, reserved, debt in (
        ("stark", 4200.0, -1800.0, 3000, 1800.0),
        ("initech", 18800.0, 27100.0, 0, 0),
    ):
        b = _bucket("chat", key, 60, local, 20000, max(dist, 0.0), 30000, True, "local", 1.0)
        b["unit"] = "tokens"
        b["local"] |= {"reserved": reserved, "debt": 0.0}
        b["distributed"] |= {"tokens": dist, "reserved": reserved, "debt": debt}
        data["buckets"].append(b)
    return data


def test_snapshot_budget_route_in_tokens(snap_compare: Any, utc: None) -> None:
    """The chat budget selected: its divergence line in tokens, stark's refusals' worth, and its
    buckets in tokens with what the reservations hold and the debt."""
    from dashboard.models import Snapshot

    app = ShadowlimitDashboard(
        "http://control-plane.test:8080", TOKEN, snapshot=Snapshot.parse(budget_snapshot()), theme="textual-dark"
    )

    async def select_chat(pilot: Pilot[Any]) -> None:
        await pilot.press("down", "down", "down")
        await pilot.pause()

    assert snap_compare(app, run_before=select_chat, terminal_size=SIZE)


def test_snapshot_confirm_dialog(snap_compare: Any, utc: None) -> None:
    async def confirm(pilot: Pilot[Any]) -> None:
        await pilot.press("e")
        await pilot.pause()
        await _steady_cursor(pilot)

    assert snap_compare(fixed_app(), run_before=confirm, terminal_size=SIZE)


def test_snapshot_gate_refused_dialog(snap_compare: Any, utc: None) -> None:
    from dashboard.models import GateView, Snapshot

    snap = Snapshot.parse(fixed_snapshot())
    gate = GateView.parse(_gate("enforce", 2514, 500, 312))
    assert gate is not None

    async def refuse(pilot: Pilot[Any]) -> None:
        route = snap.route("search")
        assert route is not None
        await pilot.app.push_screen(GateRefusedScreen(route, "enforce", 0, gate, "try the global limit"))
        await _steady_cursor(pilot)

    assert snap_compare(fixed_app(), run_before=refuse, terminal_size=SIZE)


def test_snapshot_help_with_demo_banner(snap_compare: Any, utc: None) -> None:
    banner = "shadowlimit demo is running\n  replica 1:  http://127.0.0.1:8081\n  admin token: demo-token"
    assert snap_compare(
        fixed_app(replicas=["http://control-plane.test:8080", "http://127.0.0.1:8082"], demo_banner=banner),
        press=["question_mark"],
        terminal_size=SIZE,
    )


# -- external limits in the Backend panel -------------------------------------------------


def _external_snapshot() -> dict[str, Any]:
    return {
        "routes": [{"route": "tenants", "url": "http://limits.internal:9100/limits"}],
        "breakers": [
            {
                "route": "tenants",
                "key": "initech",
                "state": "open",
                "failures": 5,
                "next_probe_in_s": 12.4,
                "last_error": "the limits service answered HTTP 500",
            },
            {
                "route": "tenants",
                "key": "hooli",
                "state": "half_open",
                "failures": 5,
                "next_probe_in_s": 0.0,
                "last_error": "timeout",
            },
            {
                "route": "tenants",
                "key": "acme",
                "state": "closed",
                "failures": 0,
                "next_probe_in_s": None,
                "last_error": None,
            },
        ],
        "breakers_total": 14,
        "breakers_open": 1,
        "breakers_half_open": 1,
        "cache": {
            "enabled": True,
            "available": True,
            "hit": 1234,
            "miss": 96,
            "stale": 4,
            "hit_ratio": 0.9278,
            "errors": 0,
        },
        "calls": {"ok": 80, "timeout": 3, "error": 12, "invalid": 1},
        "errors": {"error": 12},
        "sources": {"external": 80, "cache": 1234, "stale": 4, "static": 12},
    }


def test_backend_panel_shows_external_limits() -> None:
    import io

    from rich.console import Console

    from dashboard.models import BackendView, ExternalView
    from dashboard.widgets import BackendPanel

    ext = ExternalView.parse(_external_snapshot())
    assert ext is not None and ext.calls_failed == 16 and ext.hit_ratio == 0.9278
    console = Console(width=100, file=io.StringIO(), color_system=None)
    console.print(BackendPanel.render_backend(BackendView.parse(fixed_snapshot()["backend"]), [], ext))
    text = " ".join(console.file.getvalue().split())  # type: ignore[attr-defined]
    assert "ext limits 1 open · 1 probing / 14 breakers" in text
    assert "ext cache hit 92.8% (1,234/1,330) · stale 4" in text
    assert "ext calls 80 ok · 16 failed · 12 static" in text
    assert "open keys tenants/initech (probe in 12s), tenants/hooli (probing)" in text
    # no routes with external limits: no external lines at all
    console = Console(width=100, file=io.StringIO(), color_system=None)
    console.print(
        BackendPanel.render_backend(
            BackendView.parse(fixed_snapshot()["backend"]), [], ExternalView.parse({"routes": []})
        )
    )
    assert "ext limits" not in console.file.getvalue()  # type: ignore[attr-defined]
    # without Redis the cache line says so
    off = ExternalView.parse({**_external_snapshot(), "cache": {"enabled": False}})
    console = Console(width=100, file=io.StringIO(), color_system=None)
    console.print(BackendPanel.render_backend(BackendView.parse(fixed_snapshot()["backend"]), [], off))
    assert "off (no Redis)" in console.file.getvalue()  # type: ignore[attr-defined]


def test_snapshot_backend_with_external_limits(snap_compare: Any, utc: None) -> None:
    from dashboard.models import Snapshot

    data = fixed_snapshot()
    data["external"] = _external_snapshot()
    data["events"].append(
        {
            "seq": 902,
            "at": AT - 20,
            "type": "external_breaker",
            "route": "tenants",
            "key": "initech",
            "from": "closed",
            "to": "open",
            "failures": 5,
            "reason": "the limits service answered HTTP 500",
            "instance": "replica-1",
        }
    )
    app = ShadowlimitDashboard(
        "http://control-plane.test:8080", TOKEN, snapshot=Snapshot.parse(data), theme="textual-dark"
    )
    assert snap_compare(app, terminal_size=(160, 60))


async def test_backend_panel_follows_a_real_limits_service(redis_server: Any, tmp_path: Path) -> None:
    from ext_service import Answer, AppServer, Script, scripted_app

    script = Script()
    script.default = Answer(status=500, body={"error": "tenant db down"})
    script.answers["acme"] = Answer(body={"average": 50, "burst": 50, "period": "1s"})
    with AppServer(scripted_app(script)) as svc:
        rules = tmp_path / "rules.yaml"
        rules.write_text(
            RULES
            + f"""\
  - name: tenants
    match: {{path: /api/tenants/**}}
    key: {{strategy: header, header: X-Tenant-Id}}
    local: {{average: 3, period: 1s}}
    external: {{url: {svc.url}/limits, timeout: 1s}}
"""
        )
        cp = ControlPlane(redis_server.url, rules, namespace=f"dash{uuid.uuid4().hex[:10]}").start()
        try:
            async with httpx.AsyncClient(base_url=cp.url) as c:
                for key in ["acme"] * 3 + ["broken"] * 5:
                    r = await c.post(
                        "/v1/decide", json={"method": "GET", "path": "/api/tenants/x", "headers": {"X-Tenant-Id": key}}
                    )
                    assert r.status_code in (200, 429), r.text
            client = ControlPlaneClient(cp.url)
            ext = await client.external()
            await client.aclose()
            assert ext is not None and ext.routes == ("tenants",) and ext.breakers_open == 1 and ext.cache_hits == 2
            app = ShadowlimitDashboard(cp.url, TOKEN)
            async with app.run_test(size=SIZE) as pilot:
                await until_live(pilot, app)
                await wait_for(
                    pilot, lambda: "ext limits" in plain(dash(app).query_one("#backend")), what="the external lines"
                )
                text = " ".join(plain(dash(app).query_one("#backend")).split())
                assert "1 open / 2 breakers" in text and "(2/8)" in text and "tenants/broken" in text
                await wait_for(
                    pilot,
                    lambda: "ext limits tenants/broken" in plain(dash(app).query_one(AuditPanel)),
                    what="the breaker event in the audit panel",
                )
        finally:
            cp.stop()


def test_backend_panel_shows_the_redis_topology() -> None:
    """Which kind of Redis, where the master is and TLS, from /v1/backend's redis_topology."""
    import io

    from rich.console import Console

    from dashboard.models import BackendView
    from dashboard.widgets import BackendPanel

    def rendered(topology: dict[str, Any] | None) -> str:
        data = {**fixed_snapshot()["backend"], "redis_topology": topology}
        console = Console(width=120, file=io.StringIO(), color_system=None)
        console.print(BackendPanel.render_backend(BackendView.parse(data), [], None))
        return " ".join(console.file.getvalue().split())  # type: ignore[attr-defined]

    tls = {"verify": "required", "check_hostname": True, "ca_certs": "/ca.pem", "client_certificate": True}
    text = rendered({"kind": "sentinel", "master": "10.0.0.7:6379", "tls": tls, "password": "set"})
    assert "topology sentinel · master 10.0.0.7:6379 · TLS on (verify required + name · client certificate)" in text
    cluster = {"kind": "cluster", "masters": [{"address": "a:1", "slots": 5461}, {"address": "b:2", "slots": 5462}]}
    assert "topology cluster · master a:1, b:2 · TLS off" in rendered(cluster)
    assert "master not known yet" in rendered({"kind": "sentinel", "master": None, "tls": None})
    assert "topology" not in rendered(None)  # an older control plane: no line


def test_backend_panel_shows_the_replica_s_clock_against_redis() -> None:
    """/v1/backend's clock beside the Redis address: the offset and the tolerance, a warning
    past it when the policies are decided on this clock, nothing from an older control plane."""
    import io

    from rich.console import Console

    from dashboard.models import BackendView
    from dashboard.theme import WARN_BOLD
    from dashboard.widgets import BackendPanel
    from dashboard.widgets import _redis_and_clock as line

    def view(clock: dict[str, Any] | None, time_source: str = "local") -> BackendView:
        data = {**fixed_snapshot()["backend"], "redis": "10.0.0.7:6379", "time_source": time_source}
        if clock is not None:
            data["clock"] = clock
        return BackendView.parse(data)

    def rendered(b: BackendView) -> str:
        console = Console(width=120, file=io.StringIO(), color_system=None)
        console.print(BackendPanel.render_backend(b, [], None))
        return " ".join(console.file.getvalue().split())  # type: ignore[attr-defined]

    fine = view({"offset_ms": -0.012, "round_trip_ms": 0.1, "tolerance_ms": 250.0, "past_tolerance": False})
    assert "redis 10.0.0.7:6379 · clock -0.01 ms (±250 ms)" in rendered(fine)
    assert not any(span.style == WARN_BOLD for span in line(fine).spans)
    behind = view({"offset_ms": -20003.4, "tolerance_ms": 250.0, "past_tolerance": True})
    assert "clock -20.0 s (±250 ms)" in rendered(behind)
    assert any(span.style == WARN_BOLD for span in line(behind).spans)  # the new rejections are put down to it
    on_redis = view({"offset_ms": 900.0, "tolerance_ms": 250.0, "past_tolerance": True}, time_source="redis")
    assert "clock +900.0 ms (±250 ms) · decided on Redis' clock" in rendered(on_redis)
    assert not any(span.style == WARN_BOLD for span in line(on_redis).spans)
    assert "clock not measured yet" in rendered(view({"offset_ms": None, "tolerance_ms": 250.0}))
    failed = view({"offset_ms": None, "tolerance_ms": 250.0, "error": "TIME failed"})
    assert "clock not measured (TIME failed)" in rendered(failed)
    assert "clock" not in rendered(view(None))  # an older control plane: nothing


# -- what-if ----------------------------------------------------------------------------------


async def test_whatif_replays_then_adjusts_the_global_limit(control_plane: Callable[..., ControlPlane]) -> None:
    from dashboard.whatif import ConfirmAdjustScreen, WhatIfScreen

    cp = control_plane()
    await traffic(cp.url, 40)
    await cp.settle()
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        await pilot.press("w")
        await wait_for(pilot, lambda: isinstance(app.screen, WhatIfScreen), what="the what-if dialog")
        assert "Global limit now: 5/1s burst 5" in plain(app.screen.query_one("#whatif-now"))
        app.screen.query_one("#rate", Input).value = "nonsense"
        await pilot.press("enter")  # refused in the dialog, nothing sent
        await pilot.pause(0.2)
        assert "rate: enter N/period" in str(app.screen.query_one("#whatif-error").render())
        app.screen.query_one("#rate", Input).value = "2/1s"
        app.screen.query_one("#burst", Input).value = "2"
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, WhatIfScreen) and bool(app.screen.query("#whatif-figures")),
            what="the replay's figures",
        )
        figures = plain(app.screen.query_one("#whatif-figures"))
        assert "candidate" in figures and "2/1s burst 2" in figures and "current" in figures
        assert "bob" in figures  # the key the candidate would reject
        await pilot.click("#adjust")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmAdjustScreen), what="the adjust confirmation")
        assert "Its replay rejected" in plain(app.screen.query_one("#adjust-summary"))
        await pilot.press("enter")  # the reason is prefilled from the candidate
        await wait_for(
            pilot,
            lambda: any(
                a["route"] == "search" and (a.get("distributed") or {}).get("average") == 2
                for a in cp.app.state.engine.adjustments.listing()
            ),
            what="the adjusted global limit",
        )
        entry = httpx.get(f"{cp.url}/v1/rollout/audit").json()["entries"][0]
        assert entry["kind"] == "config_change" and entry["route"] == "search" and "what-if" in entry["reason"]


def _whatif_result() -> Any:
    from dashboard.models import WhatIfView

    replay = {
        "policy_describe": "2/1s burst 2 (token_bucket)",
        "requests": 1260,
        "rejections": 84,
        "reject_share": 84 / 1260,
        "top_keys": [
            {"key": "bob", "requests": 900, "rejections": 70},
            {"key": "mallory", "requests": 96, "rejections": 14},
        ],
    }
    current = dict(replay, policy_describe="5/1s burst 5 (token_bucket)", rejections=12, reject_share=12 / 1260)
    current["top_keys"] = []
    return WhatIfView.parse(
        {
            "route": "search",
            "minutes": 15,
            "minutes_recorded": 12,
            "recorded_share": 1.0,
            "candidate": replay,
            "current": current,
        }
    )


def test_snapshot_whatif_dialog(snap_compare: Any, utc: None) -> None:
    from dashboard.whatif import WhatIfAnswer, WhatIfScreen

    async def open_dialog(pilot: Pilot[Any]) -> None:
        screen = dash(pilot.app)  # type: ignore[arg-type]
        route = screen.snapshot.route("search")  # type: ignore[union-attr]
        values = WhatIfAnswer("replay", "2/1s", "2", "token_bucket", 15, {})
        await pilot.app.push_screen(WhatIfScreen(route, values=values, result=_whatif_result()))
        await pilot.pause()
        await _steady_cursor(pilot)

    assert snap_compare(fixed_app(), run_before=open_dialog, terminal_size=SIZE)


async def test_a_key_right_after_an_arrow_acts_on_the_route_under_the_cursor() -> None:
    """Typed fast (the arrow and the action in one burst), the action must not reach the
    route that was selected before the arrow: the ▶ row is the one changed."""
    app = fixed_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        first = str(app.screen.query_one(RoutesTable).get_row_at(0)[1])
        second = str(app.screen.query_one(RoutesTable).get_row_at(1)[1])
        for key, char in (("down", None), ("e", "e")):  # one burst, as a terminal delivers fast typing
            event = events.Key(key, char)
            event.set_sender(app)
            app.post_message(event)
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModeScreen), what="the confirmation")
        title = str(app.screen.query_one(".dialog-title").render())
        assert f"Move {second}:" in title and first != second, title


# -- candidate limits ---------------------------------------------------------------------------


def operator() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def set_candidate(url: str, route: str, limit: str, reason: str = "try it", **extra: Any) -> dict[str, Any]:
    """The candidate set over HTTP, as another operator (or the CLI) would."""
    body = {"limit": limit, "reason": reason, **extra}
    r = httpx.put(f"{url}/v1/routes/{route}/candidate", json=body, headers=operator(), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def candidate_cells(app: ShadowlimitDashboard, route: str) -> dict[str, str]:
    """The cells of ``route``'s candidate row in the routes table ({} without one)."""
    from dashboard.widgets import CANDIDATE_ROW

    if route + CANDIDATE_ROW not in dash(app).query_one(RoutesTable).rows:
        return {}
    return {col: cell(app, RoutesTable, route + CANDIDATE_ROW, col) for col, _ in RoutesTable.COLUMNS}


def audit_entries(url: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/v1/rollout/audit", timeout=10).json()["entries"]  # type: ignore[no-any-return]


async def test_a_candidate_shows_under_its_route_with_the_servers_figures(
    control_plane: Callable[..., ControlPlane],
) -> None:
    """Set over HTTP while the dashboard watches: a ``↳ candidate`` row appears under its
    route with the control plane's figures (compared, newly rejected and its share, newly
    admitted, errors, the gate), the divergence panel gets the candidate's lines, and ``p``
    and ``d`` apply to that route only."""
    from dashboard.chart import DivergenceChart
    from dashboard.render import pct

    cp = control_plane()
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        assert candidate_cells(app, "search") == {}  # no candidate: no row, no p / d
        assert not dash(app).check_action("candidate", ("promote",))
        set_candidate(cp.url, "search", "3/second", reason="tighter search")
        await wait_for(pilot, lambda: candidate_cells(app, "search"), what="the candidate row")
        row = candidate_cells(app, "search")
        assert (row["sel"].strip(), row["route"].strip(), row["mode"]) == ("", "↳ candidate", "3/1s burst 3")
        rows = [k.value for k in dash(app).query_one(RoutesTable).rows]
        assert rows[:3] == ["search", "search\x1fcandidate", "checkout"]  # under its route

        await traffic(cp.url, 30)  # the global limit (burst 5) admits about 5, the candidate (burst 3) 3
        await cp.settle()
        server: dict[str, Any] = {}

        def same_figures() -> bool:
            nonlocal server
            server = server_routes(cp.url)["search"]["candidate"]
            t = server["totals"]
            if not t or t["compared"] < 30:
                return False
            cells = candidate_cells(app, "search")
            newrej = f"{t['newly_rejected']:,} ({pct(t['newly_rejected_share'])}) · admitted {t['newly_admitted']:,}"
            return cells["div"].startswith(f"{t['compared']:,} compared") and cells["newrej"] == newrej

        await wait_for(pilot, same_figures, what="the server's candidate figures in the candidate row")
        totals = server["totals"]
        assert totals["newly_rejected"] >= 1 and totals["newly_admitted"] == 0
        cells = candidate_cells(app, "search")
        assert cells["errors"] == "0"
        assert cells["gate"].startswith("✘ promote: new rej")  # over the 1% the gate allows
        assert not server["gate"]["passed"]

        def chart_lines() -> list[str]:
            return str(dash(app).query_one(DivergenceChart).render()).splitlines()

        def chart_has(prefix: str) -> bool:
            return any(line.strip().startswith(prefix) for line in chart_lines())

        # the chart's figures come with the next snapshot (a route read refreshes the table only)
        compared = f"↳ candidate 3/1s burst 3 · {totals['compared']:,} compared · "
        await wait_for(pilot, lambda: chart_has(compared), what="the candidate's figures in the divergence panel")
        header = next(line for line in chart_lines() if line.strip().startswith(compared))
        assert "newly rejected" in header and "newly admitted" in header
        await wait_for(pilot, lambda: chart_has("cand. block bob ×"), what="who the candidate would newly reject")

        # the cursor on the candidate's row still selects search; checkout has no candidate
        await pilot.press("down")
        await wait_for(pilot, lambda: dash(app).query_one(RoutesTable).cursor_key() == "search\x1fcandidate")
        assert cell(app, RoutesTable, "search", "sel") == "▶" and dash(app).selected == "search"
        assert dash(app).check_action("candidate", ("promote",))
        await pilot.press("down")
        await wait_for(pilot, lambda: dash(app).selected == "checkout", what="checkout selected")
        assert not dash(app).check_action("candidate", ("promote",))
        await pilot.press("p", "d")
        await pilot.pause(0.2)
        assert isinstance(app.screen, DashboardScreen)  # nothing to promote or drop there


async def test_try_live_from_the_whatif_dialog_sets_the_candidate(control_plane: Callable[..., ControlPlane]) -> None:
    """After a replay, Try live (ctrl+t or the button) asks a reason and sets the replayed limit
    as the route's candidate; the server's refusal (422 naming the field) shows in the dialog."""
    from textual.widgets import Button

    from dashboard.whatif import ConfirmTryLiveScreen, WhatIfScreen

    cp = control_plane()
    await traffic(cp.url, 40)
    await cp.settle()
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        await pilot.press("w")
        await wait_for(pilot, lambda: isinstance(app.screen, WhatIfScreen), what="the what-if dialog")
        assert app.screen.query_one("#try-live", Button).disabled  # nothing replayed yet
        await pilot.press("enter")  # replay the dialog's default: the limit in force, 5/1s burst 5

        def replayed() -> bool:
            return isinstance(app.screen, WhatIfScreen) and bool(app.screen.query("#whatif-figures"))

        await wait_for(pilot, replayed, what="the replay's figures")
        assert not app.screen.query_one("#try-live", Button).disabled
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmTryLiveScreen), what="the try-live confirmation")
        assert "beside the global limit 5/1s burst 5" in plain(app.screen.query_one("#try-summary"))
        app.screen.query_one("#reason", Input).value = ""
        await type_reason(pilot, "same as now")
        await pilot.press("enter")

        def error() -> str:
            return str(app.screen.query_one("#whatif-error").render()) if isinstance(app.screen, WhatIfScreen) else ""

        await wait_for(pilot, lambda: "422" in error(), what="the server's refusal in the dialog")
        assert error().startswith("422 invalid_request: limit: equal to the route's current limit"), error()
        assert server_routes(cp.url)["search"]["candidate"] is None

        # a stricter limit: replay it, then the button
        app.screen.query_one("#rate", Input).value = "2/1s"
        app.screen.query_one("#burst", Input).value = "2"
        await pilot.press("enter")
        await wait_for(pilot, lambda: replayed() and "2/1s burst 2" in plain(app.screen.query_one("#whatif-figures")))
        await pilot.click("#try-live")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmTryLiveScreen), what="the try-live confirmation")
        assert app.screen.query_one("#reason", Input).value == "what-if: 2/1s burst 2"  # prefilled, as for Adjust
        app.screen.query_one("#reason", Input).value = ""
        await type_reason(pilot, "try 2 per second live")
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: server_routes(cp.url)["search"]["candidate"] is not None, what="the candidate on the server"
        )
        candidate = server_routes(cp.url)["search"]["candidate"]
        assert candidate["policy"] == {"algorithm": "token_bucket", "average": 2.0, "period": 1.0, "burst": 2}
        assert candidate["reason"] == "try 2 per second live"
        assert server_routes(cp.url)["search"]["limit"]["adjusted"] is False  # the limit in force is untouched
        entry = audit_entries(cp.url)[0]
        assert (entry["kind"], entry["route"], entry["to"]) == (
            "candidate",
            "search",
            f"candidate {candidate['describe']}",
        )
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="the dialog to close")
        assert any(n.title == "Candidate set" for n in app._notifications)
        await wait_for(
            pilot, lambda: candidate_cells(app, "search").get("mode") == "2/1s burst 2", what="the candidate row"
        )


async def test_try_live_says_when_the_route_is_gone(control_plane: Callable[..., ControlPlane], tmp_path: Path) -> None:
    """The route left the rules while the dialog was open: the 404 shows in the dialog."""
    from dashboard.whatif import ConfirmTryLiveScreen, WhatIfScreen

    cp = control_plane()
    await traffic(cp.url, 6, route="checkout", key="carol")
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        await pilot.press("down", "w")
        await wait_for(pilot, lambda: isinstance(app.screen, WhatIfScreen), what="the what-if dialog")
        app.screen.query_one("#rate", Input).value = "2/1s"
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: isinstance(app.screen, WhatIfScreen) and bool(app.screen.query("#whatif-figures"))
        )
        cp.rules_path.write_text(RULES.split("  - name: checkout")[0])
        await wait_for(pilot, lambda: "checkout" not in server_routes(cp.url), what="the reload without checkout")
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmTryLiveScreen))
        await reason_focused(pilot)
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: (
                isinstance(app.screen, WhatIfScreen) and "404" in str(app.screen.query_one("#whatif-error").render())
            ),
            what="the 404 in the dialog",
        )
        text = str(app.screen.query_one("#whatif-error").render())
        assert text == "404 unknown_route: route: no route named 'checkout'", text


async def test_promote_refused_by_the_gate_then_forced_and_drop_via_the_keys(
    control_plane: Callable[..., ControlPlane],
) -> None:
    """``p`` asks a reason, the gate refuses (new rejections over 1%) and says why, forcing
    with the reason promotes; ``d`` drops a candidate. Both are in the audit trail."""
    from dashboard.modals import CandidateGateRefusedScreen, ConfirmCandidateScreen

    cp = control_plane()
    set_candidate(cp.url, "search", "3/second", reason="tighter")
    await traffic(cp.url, 30)
    await cp.settle()
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        await wait_for(
            pilot,
            lambda: candidate_cells(app, "search").get("gate", "").startswith("✘ promote"),
            what="the candidate's refused gate in its row",
        )
        await pilot.press("down")  # onto the candidate's row: p acts on search from there too
        await wait_for(pilot, lambda: dash(app).query_one(RoutesTable).cursor_key() == "search\x1fcandidate")
        await pilot.press("p")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCandidateScreen), what="the promote confirmation")
        assert "Promote search's candidate" in str(app.screen.query_one(".dialog-title").render())
        assert "Candidate 3/1s burst 3 beside the global limit 5/1s burst 5" in plain(
            app.screen.query_one("#candidate-summary")
        )
        assert "new rejections" in plain(app.screen.query_one("#gate-figures"))
        await type_reason(pilot, "ship the tighter limit")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, CandidateGateRefusedScreen), what="the gate's refusal")
        reasons = str(app.screen.query_one("#gate-reasons").render())
        assert "✘ new rejections" in reasons and "exceed 1.00%" in reasons, reasons
        search = server_routes(cp.url)["search"]
        assert search["candidate"] is not None and search["limit"]["adjusted"] is False  # refused: nothing changed
        assert app.screen.query_one("#reason", Input).value == "ship the tighter limit"  # carried over
        await reason_focused(pilot)
        await pilot.press("enter")  # force, with that reason
        await wait_for(
            pilot, lambda: server_routes(cp.url)["search"]["limit"]["adjusted"], what="the promoted global limit"
        )
        search = server_routes(cp.url)["search"]
        assert search["candidate"] is None and search["limit"]["in_force"]["average"] == 3.0
        promoted, adjustment = audit_entries(cp.url)[:2]
        assert (promoted["kind"], promoted["to"]) == ("candidate", "promoted candidate 3/1s burst 3 (token_bucket)")
        assert promoted["forced"] is True and promoted["reason"] == "ship the tighter limit"
        assert promoted["gate"]["passed"] is False
        assert (
            adjustment["kind"] == "config_change"
            and "promoted candidate: ship the tighter limit" in adjustment["reason"]
        )

        # on screen: no candidate row, the route marked as adjusted, both limits in its detail
        await wait_for(
            pilot,
            lambda: not candidate_cells(app, "search") and cell(app, RoutesTable, "search", "route") == "search *",
            what="the adjusted route without its candidate row",
        )
        subtitle = str(dash(app).query_one("#buckets").border_subtitle)
        assert "global 3/1s burst 3 * (adjusted; rules: 5/1s burst 5)" in subtitle, subtitle
        await wait_for(
            pilot,
            lambda: "search promoted candidate 3/1s burst 3 FORCED" in plain(dash(app).query_one(AuditPanel)),
            what="the promotion in the audit panel",
        )
        await pilot.press("p")  # no candidate any more: nothing happens
        await pilot.pause(0.2)
        assert isinstance(app.screen, DashboardScreen)

        # a new one, dropped with d
        set_candidate(cp.url, "search", "4/second", reason="a little looser")
        await wait_for(pilot, lambda: candidate_cells(app, "search").get("mode") == "4/1s burst 4", what="the new row")
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCandidateScreen), what="the drop confirmation")
        assert "Drop search's candidate" in str(app.screen.query_one(".dialog-title").render())
        await type_reason(pilot, "not now")
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: server_routes(cp.url)["search"]["candidate"] is None, what="the candidate dropped"
        )
        dropped = audit_entries(cp.url)[0]
        assert (dropped["kind"], dropped["to"], dropped["reason"]) == (
            "candidate",
            "dropped candidate 4/1s burst 4 (token_bucket)",
            "not now",
        )
        assert server_routes(cp.url)["search"]["limit"]["in_force"]["average"] == 3.0  # the limit stays
        await wait_for(pilot, lambda: not candidate_cells(app, "search"), what="the candidate row to go")


async def test_client_candidate_calls(control_plane: Callable[..., ControlPlane]) -> None:
    """set / drop / promote_candidate: the answers parsed, the errors translated (422 naming the
    field, 404, the gate's 409, no token)."""
    from dashboard.client import ApiError

    cp = control_plane()
    good = ControlPlaneClient(cp.url, TOKEN)
    anonymous = ControlPlaneClient(cp.url)
    try:
        with pytest.raises(Unauthorized):
            await anonymous.set_candidate("search", "3/1s", reason="x")
        with pytest.raises(ApiError) as refused:
            await good.set_candidate("search", "5/1s", burst=5, reason="same")
        assert (refused.value.status, refused.value.field) == (422, "limit")
        with pytest.raises(ApiError) as refused:
            await good.set_candidate("search", "3/1s", burst=0, reason="no burst")
        assert refused.value.field == "burst" and refused.value.explain().startswith("422 invalid_request: burst")
        with pytest.raises(ApiError) as unknown:
            await good.set_candidate("nope", "3/1s", reason="x")
        assert (unknown.value.status, unknown.value.error) == (404, "unknown_route")
        with pytest.raises(ApiError) as none:
            await good.drop_candidate("search", reason="x")
        assert (none.value.status, none.value.error) == (404, "no_candidate")

        change = await good.set_candidate("search", "3/1s", algorithm="gcra", reason="try gcra")
        assert change.candidate is not None and change.candidate.limit == "3/1s burst 3 gcra"
        assert change.audit.kind == "candidate" and change.audit.reason == "try gcra"
        routes = {r.name: r for r in await good.routes()}
        assert routes["search"].candidate is not None and routes["search"].candidate.id == change.candidate.id
        assert routes["search"].limit is not None and not routes["search"].adjusted
        await traffic(cp.url, 20)
        await cp.settle()
        await asyncio.to_thread(
            eventually,
            lambda: (server_routes(cp.url)["search"]["candidate"]["totals"] or {}).get("newly_rejected"),
            15,
            what="the candidate's figures",
        )
        with pytest.raises(GateRefused) as gate:
            await good.promote_candidate("search", reason="go")
        assert not gate.value.gate.passed and any("new rejections" in r for r in gate.value.gate.reasons)
        promoted = await good.promote_candidate("search", reason="go anyway", force=True)
        assert promoted.candidate is None and promoted.audit.forced and promoted.limit is not None
        assert promoted.limit.describe() == "3/1s burst 3 gcra" and promoted.adjustment is not None
        assert promoted.adjustment.kind == "config_change"
        assert (await good.routes())[0].adjusted
    finally:
        await good.aclose()
        await anonymous.aclose()


def test_routes_without_or_with_odd_candidate_fields_still_parse_and_render() -> None:
    """An older control plane sends no ``limit`` and no ``candidate``; a malformed one gets
    neutral defaults, and the row and the chart still render."""
    import io

    from rich.console import Console
    from rich.text import Text

    from dashboard.chart import candidate_lines
    from dashboard.models import RouteDivergence, RouteView

    old = RouteView.parse({"name": "search", "rule": {"distributed": _policy(5, 5)}})
    assert old.limit is None and old.candidate is None and not old.adjusted
    assert old.global_policy is not None and old.global_policy.describe() == "5/1s burst 5"
    odd = {
        "name": "search",
        "limit": {"in_force": "x", "adjusted": True},
        "candidate": {"policy": [], "totals": [], "gate": 3, "series": 5, "would_be_blocked": "bob", "age_s": "?"},
    }
    r = RouteView.parse(odd)
    assert r.limit is not None and not r.adjusted  # adjusted, but to what: not said
    c = r.candidate
    assert c is not None and c.limit == "?" and c.totals is None and c.gate is None and c.series == ()
    assert RouteView.parse({"candidate": "yes", "limit": 7}).candidate is None
    cells = RoutesTable.candidate_cells(c)
    assert [getattr(x, "plain", x) for x in cells][:4] == ["  ↳ candidate", "?", "", "no figures yet"]
    rd = RouteDivergence.parse({"candidate": {"series": [{"minute": "x", "newly_rejected": 2}], "totals": {}}})
    assert rd.candidate is not None and rd.candidate.series[0].newly_rejected == 2
    out = Text()
    candidate_lines(out, rd.candidate, 12)
    console = Console(width=100, file=io.StringIO(), color_system=None)
    console.print(out)
    assert "↳ candidate ?" in console.file.getvalue()  # type: ignore[attr-defined]


# -- snapshots with a candidate ---------------------------------------------------------------


def candidate_snapshot() -> dict[str, Any]:
    """The fixed snapshot, plus: search has a candidate (8/1s, set 11 minutes ago, its gate
    refused: too many new rejections and not long enough yet); checkout's global limit in
    force was adjusted away from the rules file's."""
    data = fixed_snapshot()
    start = int(AT // 60 * 60) - 60 * 11
    series = [
        {"minute": start + 60 * i, "agree": 300 + (i * 29) % 90, "newly_rejected": 0 if i < 3 else 4 + (i * 7) % 19,
         "newly_admitted": 0, "errors": 0, "dropped": 0}
        for i in range(12)
    ]  # fmt: skip
    agree = sum(p["agree"] for p in series)
    rejected = sum(p["newly_rejected"] for p in series)
    compared = agree + rejected
    gate = {
        **_gate("enforce", compared, 500, rejected),
        "target": None,
        "reasons": [
            f"new rejections {rejected / compared:.2%} exceed 1.00%",
            "the candidate was set 660s ago, the minimum before promoting it is 900s (min_dwell; 240s to go)",
        ],
        "passed": False,
        "sampled_share": 1.0,
        "min_sampled_share": 0.9,
        "in_step_s": 660.0,
        "min_dwell_s": 900.0,
    }
    candidate = {
        "id": "c0ffee000001",
        "policy": _policy(8, 8),
        "describe": "8/1s burst 8 (token_bucket)",
        "since": AT - 660,
        "age_s": 660.0,
        "actor": "dashboard@127.0.0.1",
        "reason": "tighter search limit, tried live",
        "totals": {
            "agree": agree, "newly_rejected": rejected, "newly_admitted": 0, "errors": 0, "dropped": 0,
            "compared": compared, "newly_rejected_share": round(rejected / compared, 6), "newly_admitted_share": 0.0,
            "sampled_share": 1.0,
        },
        "gate": gate,
    }  # fmt: skip
    search, checkout = data["routes"][0], data["routes"][1]
    search["candidate"] = candidate
    search["limit"] = {"in_force": _policy(10, 10), "rules": _policy(10, 10), "adjusted": False, "describe": ""}
    checkout["limit"] = {"in_force": _policy(6, 6), "rules": _policy(8, 8), "adjusted": True, "describe": ""}
    data["divergence"]["routes"]["search"]["candidate"] = {
        **candidate,
        "series": series,
        "would_be_blocked": [{"key": "bob", "count": 212, "last_request_id": "r9"}],
    }
    data["events"].append(
        {
            "seq": 903,
            "at": AT - 660,
            "type": "candidate",
            "route": "search",
            "audit": {
                "kind": "candidate", "route": "search", "actor": "dashboard@127.0.0.1", "at": AT - 660, "from": "",
                "to": "candidate 8/1s burst 8 (token_bucket)", "reason": "tighter search limit, tried live",
            },
        }
    )  # fmt: skip
    return data


def candidate_app() -> ShadowlimitDashboard:
    from dashboard.models import Snapshot

    return ShadowlimitDashboard(
        "http://control-plane.test:8080", TOKEN, snapshot=Snapshot.parse(candidate_snapshot()), theme="textual-dark"
    )


def test_snapshot_candidate_row_160x50(snap_compare: Any, utc: None) -> None:
    """The candidate row under search, its lines in the divergence panel, its audit entry, p
    and d in the footer; checkout marked * (its limit in force is not the rules file's)."""
    assert snap_compare(candidate_app(), terminal_size=SIZE)


def test_snapshot_promote_candidate_dialog(snap_compare: Any, utc: None) -> None:
    async def promote(pilot: Pilot[Any]) -> None:
        await pilot.press("p")
        await pilot.pause()
        await _steady_cursor(pilot)

    assert snap_compare(candidate_app(), run_before=promote, terminal_size=SIZE)


# -- rollout plans: the ↳ plan line, x and a ------------------------------------------------


def plan_cells(app: ShadowlimitDashboard, route: str) -> dict[str, str]:
    """The cells of ``route``'s plan row in the routes table ({} without one)."""
    from dashboard.widgets import PLAN_ROW

    if route + PLAN_ROW not in dash(app).query_one(RoutesTable).rows:
        return {}
    return {col: cell(app, RoutesTable, route + PLAN_ROW, col) for col, _ in RoutesTable.COLUMNS}


def set_plan(url: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.put(f"{url}/v1/routes/{route}/plan", json=body, headers=operator(), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def test_a_plan_shows_under_its_route_and_x_and_a_speak_for_the_operator(
    control_plane: Callable[..., ControlPlane],
) -> None:
    """A plan set over HTTP while the dashboard watches: a ``↳ plan`` row under its route with
    the server's state, steps and what it waits for; ``x`` pauses and resumes it, ``a``
    approves the step it waits at (each asks a reason); the keys only where they apply."""
    from dashboard.modals import ReasonDialog
    from dashboard.plan_keys import ConfirmPlanScreen

    cp = control_plane(plan_interval_s=0.2, plan_lease_s=1.0, stream_interval_s=0.3)
    app = ShadowlimitDashboard(cp.url, TOKEN)
    async with app.run_test(size=SIZE) as pilot:
        await until_live(pilot, app)
        assert plan_cells(app, "checkout") == {}
        body = {"steps": [{"shadow": "0.2s"}, "approve", "enforce"], "analysis": {"min_compared": 5}, "reason": "t"}
        set_plan(cp.url, "checkout", body)
        await wait_for(pilot, lambda: plan_cells(app, "checkout"), what="the plan row")
        rows = [k.value for k in dash(app).query_one(RoutesTable).rows]
        assert rows.index("checkout\x1fplan") == rows.index("checkout") + 1  # under its route
        await wait_for(pilot, lambda: plan_cells(app, "checkout")["newrej"], what="the first analysis")
        row = plan_cells(app, "checkout")
        assert row["mode"] == "waiting"  # for traffic
        assert row["route"].strip() == "↳ plan" and row["div"] == "▶□□ 1/3 shadow"
        assert row["newrej"] == "compared decisions 0 (>= 5)"  # the missing evidence, said
        assert row["gate"] == "compared decisions: only 0 since the step began (need 5)"

        # x on a running plan pauses it (after a reason), a on it does nothing yet
        await pilot.press("down", "down")
        await wait_for(pilot, lambda: dash(app).query_one(RoutesTable).cursor_key() == "checkout\x1fplan")
        assert dash(app).selected == "checkout" and not dash(app).check_action("plan", ("approve",))
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmPlanScreen), what="the pause dialog")
        await type_reason(pilot, "hold on")
        await pilot.press("enter")
        await wait_for(pilot, lambda: plan_cells(app, "checkout")["mode"] == "paused", what="paused")
        assert server_routes(cp.url)["checkout"]["plan"]["state"] == "paused"
        # x again resumes it; traffic then takes it to its approval step
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, ReasonDialog), what="the resume dialog")
        await type_reason(pilot, "go on")
        await pilot.press("enter")
        await wait_for(pilot, lambda: plan_cells(app, "checkout")["mode"] != "paused", what="resumed")
        await traffic(cp.url, 20, route="checkout", key="carol")
        await cp.settle()
        await wait_for(
            pilot, lambda: plan_cells(app, "checkout")["mode"] == "waiting for approval", what="the approval step"
        )
        assert plan_cells(app, "checkout")["div"] == "■▶□ 2/3 approve"
        assert dash(app).check_action("plan", ("approve",))
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmPlanScreen), what="the approve dialog")
        await type_reason(pilot, "looks fine")
        await pilot.press("enter")
        await wait_for(pilot, lambda: plan_cells(app, "checkout")["mode"] == "completed", what="completed")
        assert plan_cells(app, "checkout")["div"] == "■■■ 3/3 enforce"
        assert server_routes(cp.url)["checkout"]["mode"] == "enforce"
        assert not dash(app).check_action("plan", ("toggle",))  # nothing to pause in a completed plan
        entries = audit_entries(cp.url)
        approved = next(e for e in entries if e["kind"] == "mode_change" and e["to"] == "enforce")
        assert approved["reason"] == "approve: looks fine" and approved["actor"].startswith("admin@")


def plan_snapshot() -> dict[str, Any]:
    """The fixed snapshot, plus plans: search's waiting in shadow for enough compared decisions,
    checkout's waiting for an approval after canary 25%, login's paused after its canary failed
    and rolled back to shadow."""
    data = fixed_snapshot()
    labels = ["shadow", "canary 10%", "canary 25%", "approve", "enforce"]
    base = {"source": "rules", "steps": 5, "labels": labels, "describe": "", "verdict": None, "reason": ""}
    search, checkout, login = (
        next(r for r in data["routes"] if r["name"] == n) for n in ("search", "checkout", "login")
    )
    search["plan"] = {
        **base, "state": "waiting", "step": 1, "current": "shadow", "in_step_s": 118.0, "time_left_s": 482.0,
        "waits_for": "compared decisions: only 312 since the step began (need 500)", "verdict": "inconclusive",
        "first_problem": {"name": "compared decisions", "value": 312.0, "threshold": ">= 500",
                          "outcome": "inconclusive", "reason": "only 312 since the step began (need 500)"},
    }  # fmt: skip
    checkout["plan"] = {
        **base, "source": "api", "state": "waiting_for_approval", "step": 4, "current": "approve", "in_step_s": 64.0,
        "time_left_s": None, "waits_for": "an operator's approval: shadowlimit plan checkout --approve",
        "verdict": "pass", "first_problem": None,
    }  # fmt: skip
    login.update(mode="shadow", stored_mode="shadow")
    login["plan"] = {
        **base, "state": "paused", "step": 1, "current": "shadow", "in_step_s": 30.0, "time_left_s": None,
        "waits_for": "an operator: shadowlimit plan login --resume",
        "reason": "analysis failed: new rejection rate: new rejections 16.00% exceed 1%; rolled back to shadow",
        "verdict": "fail",
        "first_problem": {"name": "new rejection rate", "value": 0.16, "threshold": "<= 1%", "outcome": "fail",
                          "reason": "new rejections 16.00% exceed 1%"},
    }  # fmt: skip
    return data


def test_snapshot_plan_lines_160x50(snap_compare: Any, utc: None) -> None:
    """A plan line under three routes: waiting for evidence (the missing check), waiting for an
    approval (x and a in the footer on that route), paused after a rollback (the failed check)."""
    from dashboard.models import Snapshot

    app = ShadowlimitDashboard(
        "http://control-plane.test:8080", TOKEN, snapshot=Snapshot.parse(plan_snapshot()), theme="textual-dark"
    )

    async def to_checkout(pilot: Pilot[Any]) -> None:
        await pilot.press("down", "down")
        await pilot.pause()

    assert snap_compare(app, run_before=to_checkout, terminal_size=SIZE)


def test_a_plan_line_from_odd_fields_still_parses_and_renders() -> None:
    from dashboard.models import RouteView
    from dashboard.widgets import plan_cells as cells_of

    for plan in ({}, {"state": 3, "step": "x", "labels": "no"}, {"first_problem": {"value": "nan?"}}):
        route = RouteView.parse({"name": "a", "plan": plan})
        assert route.plan is not None
        assert len(cells_of(route.plan)) == len(RoutesTable.COLUMNS) - 1
    assert RouteView.parse({"name": "a", "plan": None}).plan is None
    assert RouteView.parse({"name": "a"}).plan is None
