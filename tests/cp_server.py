"""A real control plane for tests: ``create_app(settings)`` under uvicorn in a background
thread, on a free loopback port, over real HTTP against a real Redis.

Usage::

    with ControlPlaneServer(redis_url=url, rules_path=path, namespace=unique_namespace()) as cp:
        httpx.post(cp.url + "/v1/decide", json={...})
        cp.restart()          # a new app (new engine, new process state) on the same port

Every wait here is bounded; a server that does not come up raises with the reason.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import httpx
import uvicorn
from support import eventually, run_in_loop, settle

from control_plane.server.app import create_app
from control_plane.server.serving import http_protocol
from control_plane.settings import Settings, load_settings

__all__ = [
    "ADMIN_TOKEN",
    "RULES_YAML",
    "Clocks",
    "ControlPlaneServer",
    "admin_headers",
    "free_port",
    "hour_aligned_clocks",
    "metric_value",
    "unique_namespace",
    "wait_until",
    "write_rules",
]

ADMIN_TOKEN = "test-admin-token-0123456789"

#: search: a token bucket keyed by X-Client-Id, same local and distributed limits;
#: login: sliding window keyed by client IP, with a deny CIDR and an allowed key;
#: export: a generous local limit and a tight, slowly refilled distributed one
#: (so shadow mode produces "local_allow_distributed_deny" on a single replica).
RULES_YAML = """\
version: 1
routes:
  - name: search
    match: {methods: [GET], path: /api/search/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 10, period: 1s, burst: 10}
    distributed: {average: 10, period: 1s, burst: 10}
  - name: login
    match: {methods: [POST], path: /api/login}
    local: {algorithm: sliding_window, average: 5, period: 10s}
    deny: ["203.0.113.0/24"]
    allow: ["internal-job"]
  - name: export
    match: {methods: [GET], path: /api/export/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 100, period: 1s, burst: 100}
    distributed: {average: 1, period: 10s, burst: 3}
"""

T = TypeVar("T")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def unique_namespace(prefix: str = "t") -> str:
    """A fresh namespace (``[A-Za-z0-9_.-]{1,64}``) so tests never share rollout state."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def write_rules(directory: Path, text: str = RULES_YAML, name: str = "rules.yaml") -> Path:
    path = Path(directory) / name
    path.write_text(text)
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any shadowlimit setting (``SHADOWLIMIT_*``,
    ``RATE_LIMIT_*``, ``ENABLE_*``), plus ``extra``: for a ``shadowlimit`` subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHADOWLIMIT_", "RATE_LIMIT_", "ENABLE_"))}
    env.update(extra)
    return env


def admin_headers(token: str = ADMIN_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Clocks(NamedTuple):
    """A control plane's two clocks (``create_app(clock=..., clock_us=...)``)."""

    clock: Callable[[], float]  # wall-clock seconds
    clock_us: Callable[[], int]  # the decisions', integer microseconds


def hour_aligned_clocks(into_s: float = 1.0) -> Clocks:
    """The wall clock moved so that a control plane's "now" starts ``into_s`` seconds into an
    hour, and so into a minute, a 5-minute "would be blocked" window, a 10-second window: a
    test has the whole window ahead of it instead of waiting for the next one (every window
    is aligned on the epoch). Time still passes; the replicas of one fleet share one."""
    shift_us = int(into_s * 1_000_000) - time.time_ns() // 1000 % 3_600_000_000

    def clock_us() -> int:
        return time.time_ns() // 1000 + shift_us

    return Clocks(clock=lambda: clock_us() / 1_000_000, clock_us=clock_us)


#: the old name of :func:`support.eventually`
wait_until = eventually


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels`` (0.0 if none)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def _stack_of(thread: threading.Thread | None) -> str:
    frame = sys._current_frames().get(thread.ident) if thread is not None and thread.ident is not None else None
    return "".join(traceback.format_stack(frame)) if frame is not None else "(not running)"


class _Unbound(RuntimeError):
    """The server could not listen on its port (uvicorn exits when its bind fails)."""


class ControlPlaneServer:
    """``create_app(settings)`` served by uvicorn in a daemon thread on loopback.

    ``overrides`` are :func:`load_settings` field names (``redis_url``, ``rules_path``,
    ``namespace``, ``admin_token``, ``gate_min_samples``, ...). Test defaults: the
    distributed limiter enabled (ENABLE_DISTRIBUTED_RATE_LIMITING), :data:`ADMIN_TOKEN`
    as the admin token, a fresh :func:`unique_namespace` and no minimum time in a rollout
    step (``gate_min_dwell_s=0``: tests promote step after step at once; the default's own
    refusal is tested with it set back); everything else (the rest of the promotion gate
    included) keeps the settings' own defaults unless overridden.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        startup_timeout: float = 15.0,
        http: str = "auto",
        clocks: Clocks | None = None,
        **overrides: Any,
    ) -> None:
        defaults: dict[str, Any] = {
            "enable_distributed_rate_limiting": True,
            "admin_token": ADMIN_TOKEN,
            "namespace": unique_namespace(),
            "gate_min_dwell_s": 0.0,
        }
        defaults.update(overrides)
        self.overrides = defaults
        self.settings: Settings = load_settings(**defaults)
        self.port = port or free_port()
        self._port_chosen = port is None  # a port this harness picked may be picked again (see start)
        self.host = "127.0.0.1"
        self.startup_timeout = startup_timeout
        self.http = http  # uvicorn's HTTP implementation (auto, httptools, h11), bounded as `serve` bounds it
        self.clocks = clocks  # the engine's clocks (None: the wall clock)
        self.app: Any = None
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # -- properties ------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    @property
    def engine(self) -> Any:
        return self.app.state.engine

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    # -- lifecycle -------------------------------------------------------------------

    def _run(self) -> None:
        assert self.server is not None
        try:
            self.server.run()
        except BaseException as exc:  # noqa: BLE001 - surfaced by start()
            self._error = exc

    def start(self) -> ControlPlaneServer:
        """Serve, and wait until ``/healthz`` answers. A port this harness picked that another
        process took between the pick and the bind (tests run in parallel) is picked again,
        up to three times; a port the caller gave is not."""
        for attempt in range(3):
            try:
                return self._start()
            except _Unbound:
                if not self._port_chosen or attempt == 2:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")  # pragma: no cover

    def _start(self) -> ControlPlaneServer:
        if self.running:
            return self
        self._error = None
        self.app = create_app(self.settings, **(self.clocks._asdict() if self.clocks is not None else {}))
        protocol = http_protocol(self.settings.request_limits, self.http)
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level="warning",
            lifespan="on",
            access_log=False,
            proxy_headers=False,  # as `serve`: only SHADOWLIMIT_TRUSTED_PROXIES decides
            http=protocol,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, name=f"cp-server-{self.port}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout
        last: Any = None
        while time.monotonic() < deadline:
            if not self.thread.is_alive():
                if not self.server.started and isinstance(self._error, SystemExit):  # uvicorn could not bind
                    raise _Unbound(f"control plane on port {self.port} could not listen: {self._error!r}")
                raise RuntimeError(f"control plane on port {self.port} exited during startup: {self._error!r}")
            if self.server.started:
                try:
                    r = httpx.get(self.url + "/healthz", timeout=1.0)
                    if r.status_code == 200:
                        return self
                    last = r.status_code
                except httpx.HTTPError as exc:
                    last = exc
            time.sleep(0.02)
        stack = _stack_of(self.thread)
        self.stop()
        raise RuntimeError(
            f"control plane on port {self.port} not healthy within {self.startup_timeout}s (last: {last!r});"
            f" its thread:\n{stack}"
        )

    def stop(self, timeout: float = 15.0) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)
            alive = self.thread.is_alive()
            if alive and self.server is not None:
                self.server.force_exit = True
                self.thread.join(5.0)
            if self.thread.is_alive():
                raise RuntimeError(
                    f"control plane on port {self.port} did not stop within {timeout}s;"
                    f" its thread:\n{_stack_of(self.thread)}"
                )
        self.thread = None
        self.server = None

    @property
    def loop(self) -> Any:
        """The server's event loop (its thread's)."""
        assert self.server is not None and self.server.servers, "not serving"
        return self.server.servers[0].get_loop()

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run a coroutine function on the server's loop (e.g. ``cp.call(cp.engine.flush)``)."""
        return run_in_loop(self.loop, fn, timeout)

    def settle(self) -> None:
        """Make the engine's buffered work visible now: shadow evaluations, counter
        deltas, fleet views (instead of waiting out their intervals)."""
        self.call(lambda: settle(self.engine))

    def restart(self) -> ControlPlaneServer:
        """Stop, then serve a brand-new app (new engine: nothing kept in memory) on the same port."""
        self.stop()
        return self.start()

    def __enter__(self) -> ControlPlaneServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- HTTP shortcuts --------------------------------------------------------------

    def client(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("timeout", 10.0)
        return httpx.Client(base_url=self.url, **kwargs)


@contextlib.contextmanager
def started(*servers: ControlPlaneServer) -> Iterator[tuple[ControlPlaneServer, ...]]:
    """The servers started in order (those started stopped again when one fails to start),
    then stopped in reverse order."""
    up: list[ControlPlaneServer] = []
    try:
        for server in servers:
            server.start()
            up.append(server)
        yield servers
    finally:
        for server in reversed(up):
            server.stop()
