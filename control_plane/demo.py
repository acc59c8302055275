"""The main job: embedded Redis, three control-plane replicas as separate OS processes,
the example limits service (``examples/limits_service.py``), a traffic generator, and the
dashboard attached to the first replica.

One client (``bob``) spreads bursts over every replica, as seed 004 describes: each
replica's local bucket sees a third of his traffic and admits it all, while the global
limit would reject most of it. In shadow mode that shows up as divergence
(``local_allow_distributed_deny``); flip the route to enforce from the dashboard and the
global limit takes over. The ``tenants`` route takes each tenant's limits from the
limits service (acme 50/s, globex 5/s), cached in Redis; stop the service and decisions
fall back to the stale copy, then to the rules file's limits. Quitting the dashboard
stops everything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEMO_RULES = """\
# Rules used by `shadowlimit demo`. The local policy is what every replica enforces on its
# own today; the distributed policy is the global limit being tried.
version: 1
routes:
  - name: search
    match: {methods: [GET], path: /api/search/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 10, period: 1s, burst: 10}
    distributed: {average: 10, period: 1s, burst: 10}
  - name: checkout
    match: {methods: [POST], path: /api/checkout/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 5, period: 1s, burst: 5}
    distributed: {average: 8, period: 1s, burst: 8}
  - name: login
    match: {methods: [POST], path: /api/login}
    key: {strategy: header, header: X-Client-Id}
    local: {algorithm: sliding_window, average: 20, period: 10s}
    distributed: {algorithm: sliding_window, average: 20, period: 10s}
    failure_policy: failClosed
"""

# Per-tenant limits from the example limits service; the policies here are the fallback.
DEMO_TENANTS_ROUTE = """\
  - name: tenants
    match: {methods: [GET], path: /api/tenants/**}
    key: {strategy: header, header: X-Tenant-Id}
    local: {average: 3, period: 1s, burst: 3}
    distributed: {average: 3, period: 1s, burst: 3}
    external:
      url: @LIMITS_URL@
      timeout: 500ms
      cache_ttl: 30s
      header_filter: {allow_list: [X-Tenant-Id, X-Plan]}
"""

LIMITS_SERVICE = Path(__file__).resolve().parent.parent / "examples" / "limits_service.py"

# (client, route path, method, requests per second, spread over all replicas?)
TRAFFIC = [
    ("alice", "/api/search/books", "GET", 4.0, False),
    ("bob", "/api/search/all", "GET", 21.0, True),  # the client who multiplies his limit
    ("carol", "/api/checkout/cart", "POST", 3.0, False),
    ("dave", "/api/checkout/cart", "POST", 12.0, True),
    ("erin", "/api/login", "POST", 1.0, False),
    ("mallory", "/api/login", "POST", 4.0, True),
    ("acme", "/api/tenants/orders", "GET", 20.0, True),  # 50/s from the limits service
    ("globex", "/api/tenants/orders", "GET", 8.0, True),  # 5/s: rejected in bursts
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child before exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort on non-Linux
        pass
    os.setsid()


#: the promotion gate settings the demo sets for its replicas (unless the environment does)
_GATE_SETTINGS = ("SHADOWLIMIT_GATE_WINDOW_S", "SHADOWLIMIT_GATE_MIN_SAMPLES", "SHADOWLIMIT_GATE_MIN_DWELL_S")


class DemoStack:
    """Redis + the limits service + N replicas + traffic; ``stop()`` always leaves nothing behind."""

    def __init__(
        self,
        replicas: int = 3,
        base_port: int = 0,
        *,
        clock: Callable[[], float] = time.monotonic,
        keep_logs: bool = False,
    ) -> None:
        self.n = replicas
        #: monotonic seconds, for the startup and shutdown deadlines
        self.clock = clock
        self.base_port = base_port
        self.token = secrets.token_urlsafe(24)
        self.redis: Any = None
        self.redis_url = os.environ.get("RATE_LIMIT_REDIS_URL") or None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.urls: list[str] = []
        self.limits_proc: subprocess.Popen[bytes] | None = None
        self.limits_url: str | None = None
        self.keep_logs = keep_logs
        self.workdir = Path(tempfile.mkdtemp(prefix="shadowlimit-demo-"))
        self.rules_path = self.workdir / "rules.yaml"
        self.sent = 0
        self.errors = 0
        self.gates = ""  # the promotion gate settings the replicas run with (said in the banner)
        self.gate_settings: dict[str, str] = {}

    def start(self) -> None:
        if self.redis_url is None:
            from limiter.embedded import EmbeddedRedis

            self.redis = EmbeddedRedis().start()
            self.redis_url = self.redis.url
        rules = DEMO_RULES
        if self._start_limits_service():
            rules += DEMO_TENANTS_ROUTE.replace("@LIMITS_URL@", f"{self.limits_url}/limits")
        self.rules_path.write_text(rules)
        env = dict(os.environ)
        env.update(
            {
                "RATE_LIMIT_REDIS_URL": self.redis_url or "",
                "ENABLE_DISTRIBUTED_RATE_LIMITING": "true",
                "RATE_LIMIT_RULES_PATH": str(self.rules_path),
                "SHADOWLIMIT_ADMIN_TOKEN": self.token,
                "SHADOWLIMIT_NAMESPACE": env.get("SHADOWLIMIT_NAMESPACE", "demo"),
                "SHADOWLIMIT_GATE_WINDOW_S": env.get("SHADOWLIMIT_GATE_WINDOW_S", "60"),
                "SHADOWLIMIT_GATE_MIN_SAMPLES": env.get("SHADOWLIMIT_GATE_MIN_SAMPLES", "200"),
                # a demo steps through canary in minutes, not the production 10 per step
                "SHADOWLIMIT_GATE_MIN_DWELL_S": env.get("SHADOWLIMIT_GATE_MIN_DWELL_S", "30"),
                "SHADOWLIMIT_EXTERNAL_BACKEND_HOSTS": env.get(
                    "SHADOWLIMIT_EXTERNAL_BACKEND_HOSTS", "*.backend.internal"
                ),
                # the fleet's audit trail outside Redis: each replica appends the entries it writes
                "SHADOWLIMIT_AUDIT_LOG": env.get("SHADOWLIMIT_AUDIT_LOG", str(self.workdir / "audit.jsonl")),
            }
        )
        self.gate_settings = {k: env[k] for k in _GATE_SETTINGS}
        self.gates = (
            f"{env['SHADOWLIMIT_GATE_WINDOW_S']}s window, {env['SHADOWLIMIT_GATE_MIN_SAMPLES']} compared decisions,"
            f" {env['SHADOWLIMIT_GATE_MIN_DWELL_S']}s in each step (demo settings; production defaults 300s, 500, 600s)"
        )
        for i in range(self.n):
            port = self.base_port + i if self.base_port else _free_port()
            log = open(self.workdir / f"replica-{i + 1}.log", "wb")  # noqa: SIM115 - closed with the process
            env_i = dict(env, SHADOWLIMIT_INSTANCE_ID=f"replica-{i + 1}")
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "control_plane.cli",
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                env=env_i,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
            self.procs.append(proc)
            self.urls.append(f"http://127.0.0.1:{port}")
        self._wait_ready()

    def _start_limits_service(self, timeout: float = 15.0) -> bool:
        """The example limits service as its own process (False when the checkout has none)."""
        import httpx

        if not LIMITS_SERVICE.is_file():
            print(f"{LIMITS_SERVICE} not found: the demo runs without the tenants route", flush=True, file=sys.stderr)
            return False
        port = _free_port()
        log = open(self.workdir / "limits-service.log", "wb")  # noqa: SIM115 - closed with the process
        self.limits_proc = subprocess.Popen(
            [sys.executable, str(LIMITS_SERVICE), "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        self.limits_url = f"http://127.0.0.1:{port}"
        deadline = self.clock() + timeout
        while self.clock() < deadline:
            if self.limits_proc.poll() is not None:
                tail = (self.workdir / "limits-service.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the limits service exited with {self.limits_proc.returncode}:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.limits_url + "/healthz", timeout=1.0).status_code == 200:
                    return True
            time.sleep(0.1)
        raise RuntimeError(f"the limits service was not up after {timeout:.0f}s")

    def _wait_ready(self, timeout: float = 30.0) -> None:
        import httpx

        deadline = self.clock() + timeout
        pending = set(self.urls)
        while pending and self.clock() < deadline:
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    tail = (self.workdir / f"replica-{i + 1}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"replica {i + 1} exited with {p.returncode}:\n{tail}")
            for url in list(pending):
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/readyz", timeout=1.0).status_code == 200:
                        pending.discard(url)
            time.sleep(0.1)
        if pending:
            raise RuntimeError(f"replicas not ready after {timeout:.0f}s: {sorted(pending)}")

    async def traffic(self, stop: asyncio.Event) -> None:
        """Each client sends at its rate, to one replica or spread over all of them."""
        import httpx

        async with httpx.AsyncClient(timeout=2.0) as http:

            async def client(name: str, path: str, method: str, rps: float, spread: bool) -> None:
                i = 0
                home = hash(name) % len(self.urls)
                while not stop.is_set():
                    url = self.urls[i % len(self.urls)] if spread else self.urls[home]
                    i += 1
                    body = {
                        "method": method,
                        "path": path,
                        "headers": {"X-Client-Id": name, "X-Tenant-Id": name},
                        "client_ip": "127.0.0.1",
                    }
                    try:
                        await http.post(url + "/v1/decide", json=body)
                        self.sent += 1
                    except httpx.HTTPError:
                        self.errors += 1
                    # bursty clients come in clumps; steady ones evenly
                    delay = 1.0 / rps
                    if spread and i % 5 == 0:
                        delay *= 4
                    elif spread:
                        delay *= 0.25
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)

            await asyncio.gather(*[client(*t) for t in TRAFFIC])

    def stop(self) -> None:
        procs = [*self.procs, *([self.limits_proc] if self.limits_proc is not None else [])]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = self.clock() + 5
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - self.clock()))
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None
        if not self.keep_logs:  # the logs and rules go with the demo (--keep-logs keeps them)
            shutil.rmtree(self.workdir, ignore_errors=True)

    def info(self) -> dict[str, Any]:
        """What :meth:`banner` says, for ``demo --json``."""
        return {
            "event": "running",
            "redis": self.redis_url,
            "embedded_redis": self.redis is not None,
            "replicas": list(self.urls),
            "limits": f"{self.limits_url}/limits" if self.limits_url else None,
            "gate_settings": dict(self.gate_settings),
            "admin_token": self.token,
            "logs": str(self.workdir),
            "keep_logs": self.keep_logs,
        }

    def banner(self) -> str:
        lines = [
            "shadowlimit demo is running",
            f"  redis:      {self.redis_url}" + (" (embedded)" if self.redis is not None else ""),
        ]
        for i, u in enumerate(self.urls):
            lines.append(f"  replica {i + 1}:  {u}   (API docs {u}/docs, metrics {u}/metrics)")
        if self.limits_url:
            lines.append(f"  limits:     {self.limits_url}/limits   (examples/limits_service.py; route tenants)")
        lines += [
            f"  gates:      {self.gates}",
            f"  admin token: {self.token}",
            f"  logs:       {self.workdir}   (audit trail: audit.jsonl; "
            + ("kept after the demo)" if self.keep_logs else "removed when the demo stops; --keep-logs keeps them)"),
            "",
            "try:",
            f"  curl -s {self.urls[0]}/v1/routes | python3 -m json.tool",
            *([f"  curl -s {self.urls[0]}/v1/external | python3 -m json.tool"] if self.limits_url else []),
            f"  SHADOWLIMIT_ADMIN_TOKEN={self.token} ./dev shadowlimit mode search enforce --url {self.urls[0]}"
            " --reason 'try the global limit' --force",
            f"  ./dev shadowlimit whatif search --rate 20/1s --url {self.urls[0]}",
            f"  ./dev shadowlimit dash --url {self.urls[0]} --token {self.token}",
            "  (./dev shadowlimit runs the CLI from the project's .venv; installed, it is plain `shadowlimit`)",
        ]
        return "\n".join(lines)


def run_demo(args: argparse.Namespace) -> int:
    stack = DemoStack(replicas=args.replicas, base_port=args.base_port, keep_logs=args.keep_logs)
    as_json = bool(getattr(args, "json", False))
    note = sys.stderr if as_json else sys.stdout
    stop = asyncio.Event()

    def on_signal(*_: Any) -> None:
        stop.set()

    try:
        # --json: stdout is JSON lines (headless: the running stack, then the totals); notes go to stderr
        print("starting embedded Redis and control-plane replicas ...", flush=True, file=note)
        stack.start()
        try:
            from dashboard.app import ShadowlimitDashboard
        except ImportError as exc:  # a checkout without the dashboard: run headless
            print(f"dashboard unavailable ({exc}); running headless", flush=True, file=note)
            args.no_dash = True
        if args.no_dash:
            print(json.dumps(stack.info()) if as_json else stack.banner(), flush=True)

            async def headless() -> None:
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, on_signal)
                task = asyncio.ensure_future(stack.traffic(stop))
                if args.duration:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), args.duration)
                    stop.set()
                await task

            asyncio.run(headless())
            stopped = {"event": "stopped", "sent": stack.sent, "errors": stack.errors}
            print(
                json.dumps(stopped) if as_json else f"stopped: {stack.sent} demo requests sent ({stack.errors} errors)"
            )
            return 0
        app = ShadowlimitDashboard(stack.urls[0], stack.token, replicas=stack.urls, demo_banner=stack.banner())

        async def with_dash() -> None:
            task = asyncio.ensure_future(stack.traffic(stop))
            try:
                if args.duration:
                    app.call_later_after = args.duration
                await app.run_async()
            finally:
                stop.set()
                await task

        asyncio.run(with_dash())
        return 0
    finally:
        stack.stop()
