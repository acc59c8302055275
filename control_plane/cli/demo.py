"""The main job: embedded Redis, three control-plane replicas as separate OS processes,
the example limits service (``examples/limits_service.py``), a traffic generator, and the
dashboard attached to the first replica.

The replicas run the one example rules file, ``examples/rules.yaml`` (the rules
docs/api.md's examples were produced with), copied into the demo's folder with only the
``tenants`` route's ``external.url`` pointed at the demo's limits service. The traffic
(:data:`TRAFFIC`) tells the shadow rollout's story on those routes: one client (``bob``) spreads
bursts on ``search`` over every replica; each replica's local bucket sees a third of his
traffic and admits it all, while the global limit would reject a part of it. In shadow mode
that shows up as divergence (``local_allow_distributed_deny``), put down to the fleet
multiplying the old limit (the cause ``replicas``); flip the route to enforce and the global
limit takes over. ``mallory`` guesses passwords on ``login`` (5 a minute per client IP) on
every replica, whose global limit being tried is stricter (3 a minute): ``uptime``, a monitor
logging in 4 times a minute on its own replica, would be refused by the new limit alone (the
cause ``tighter``). About a minute in, the last replica is restarted once
(:meth:`DemoStack.restart`): its new local buckets admit what the old ones would not have,
while the global state remembers its clients (``fresh_local``). The ``tenants`` route
takes each tenant's limits from the limits service (hooli 2/s on the free plan, globex 5/s),
cached in Redis; stop the service and decisions fall back to the stale copy, then to the
rules file's limits. Two rollout plans drive themselves: ``internal`` walks to enforce in a
couple of minutes, ``login``'s finds its limit too tight for mallory and rolls back.
Quitting the dashboard stops everything.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..extras import MissingExtra, require_extra
from .demo_chat import CHAT_TENANTS, CHAT_UPSTREAM, chat_client, http_pool, start_example_service

ROOT = Path(__file__).resolve().parents[2]  # the checkout: control_plane/cli/demo.py -> ../../..
#: the one example rules file: the demo runs it, and docs/api.md's examples were produced with it
EXAMPLE_RULES = ROOT / "examples" / "rules.yaml"
#: the limits service the example file's ``tenants`` route names; the demo points it at its own
EXAMPLE_LIMITS_URL = "http://127.0.0.1:9100/limits"
LIMITS_SERVICE = ROOT / "examples" / "limits_service.py"


def demo_rules(limits_url: str, example: Path = EXAMPLE_RULES) -> str:
    """examples/rules.yaml with only the ``tenants`` route's ``external.url`` replaced by
    ``limits_url`` (the demo's own limits service, on a free port), said in a comment on that
    line; every other line (and so every line number) is the example file's."""
    text = example.read_text()
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == f"url: {EXAMPLE_LIMITS_URL}"]
    if len(hits) != 1:
        raise ValueError(
            f"{example}: expected one line 'url: {EXAMPLE_LIMITS_URL}' (the tenants route), found {len(hits)}"
        )
    i = hits[0]
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    note = f"shadowlimit demo: its limits service ({example.name} says {EXAMPLE_LIMITS_URL})"
    lines[i] = f"{indent}url: {limits_url}   # {note}\n"
    return "".join(lines)


# Addresses from the documentation ranges (RFC 5737): 198.51.100.x are ordinary clients,
# 203.0.113.x is on search's deny list. docs/api.md's examples use 198.51.100.7 and other
# keys the demo does not send, so they give the documented answers against a running demo.
@dataclass(frozen=True, kw_only=True)
class Client:
    """One demo client: who, what it asks for, how often (``spread``: over every replica, in
    bursts; else its own replica, evenly), from which address, with which headers."""

    name: str
    method: str
    path: str
    rps: float
    spread: bool
    ip: str
    headers: dict[str, str]


TRAFFIC: list[Client] = [
    # search, 20/s per replica today, 30/s global: bob spreads 45/s over the replicas, each
    # admits its third, the global limit would reject a third of it (shadow divergence)
    Client(
        name="alice", method="GET", path="/api/v1/search/books", rps=5.0, spread=False, ip="198.51.100.10", headers={}
    ),
    Client(
        name="bob", method="GET", path="/api/v1/search/all", rps=45.0, spread=True, ip="198.51.100.20", headers={}
    ),  # multiplies his limit
    Client(
        name="scraper", method="GET", path="/api/v1/search/all", rps=0.5, spread=False, ip="203.0.113.50", headers={}
    ),  # deny list: 403
    # checkout, per tenant and API family ("globex:checkout"): its global limit (100/s) is far
    # above what carol sends, the limit worth tightening in the runbook's "Changing a limit"
    Client(
        name="carol",
        method="POST",
        path="/checkout/c-1001/pay",
        rps=4.0,
        spread=False,
        ip="198.51.100.30",
        headers={"X-Tenant-Id": "globex"},
    ),
    # login, 5 per minute per client IP today, 3 a minute tried globally: erin logs in now and
    # then; uptime, a monitor, logs in 4 times a minute on its replica (the old limit admits it,
    # the new one would not: tighter); mallory guesses passwords on every replica (each admits
    # 5 a minute: 15 in all, where the old limit fleet-wide would admit 5: replicas)
    Client(name="erin", method="POST", path="/auth/login", rps=0.05, spread=False, ip="198.51.100.40", headers={}),
    Client(name="uptime", method="POST", path="/auth/login", rps=4 / 60, spread=False, ip="198.51.100.41", headers={}),
    Client(name="mallory", method="POST", path="/auth/login", rps=1.0, spread=True, ip="198.51.100.66", headers={}),
    # internal, keyed by API key, a 10% canary
    Client(
        name="reports",
        method="GET",
        path="/internal/reports",
        rps=3.0,
        spread=False,
        ip="10.1.2.3",
        headers={"X-API-Key": "sk-demo-reports"},
    ),
    # tenants, limits from the limits service: hooli on the free plan (2/s), globex 5/s (rejected
    # in bursts); docs/api.md's examples use acme and umbrella, which the demo leaves alone
    Client(
        name="hooli",
        method="GET",
        path="/api/v1/tenants/orders",
        rps=1.5,
        spread=False,
        ip="198.51.100.80",
        headers={"X-Tenant-Id": "hooli"},
    ),
    Client(
        name="globex",
        method="GET",
        path="/api/v1/tenants/orders",
        rps=8.0,
        spread=True,
        ip="198.51.100.81",
        headers={"X-Tenant-Id": "globex"},
    ),
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
    """Redis + the limits service + the chat upstream + N replicas + traffic; ``stop()`` always
    leaves nothing behind."""

    def __init__(
        self,
        replicas: int = 3,
        base_port: int = 0,
        *,
        clock: Callable[[], float] = time.monotonic,
        keep_logs: bool = False,
        restart: bool = True,
        tls: bool = False,
    ) -> None:
        self.n = replicas
        #: with ``tls``: the demo's CA and certificates (limiter.embedded.tls.TestPki), made at start
        self.tls = tls
        self.pki: Any = None
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
        self.chat_proc: subprocess.Popen[bytes] | None = None
        self.chat_url: str | None = None
        self.keep_logs = keep_logs
        self.workdir = Path(tempfile.mkdtemp(prefix="shadowlimit-demo-"))
        self.rules_path = self.workdir / "rules.yaml"
        self.sent = 0
        self.errors = 0
        self.error_kinds: dict[str, int] = {}  # each kind of failed demo request, counted (said when stopping)
        self.gates = ""  # the promotion gate settings the replicas run with (said in the banner)
        self.gate_settings: dict[str, str] = {}
        self.env: dict[str, str] = {}  # the replicas' environment
        #: restart the last replica once, after a whole minute of decisions (with 2 replicas or more)
        self.restart_planned = restart and replicas > 1
        self.down: set[int] = set()  # replicas being restarted: the traffic skips them
        self.busy: dict[int, int] = {}  # requests in flight to each replica: a restart drains them first
        self.restarted: list[int] = []  # replicas restarted so far (1-based, as in the banner)

    def start(self) -> None:
        if self.redis_url is None:
            from limiter.embedded import EmbeddedRedis

            self.redis = EmbeddedRedis().start()
            self.redis_url = self.redis.url
        self._start_services()
        self.rules_path.write_text(demo_rules(f"{self.limits_url}/limits"))
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
                # the rollout plans (internal's, login's) judged every 2 s instead of 5
                "SHADOWLIMIT_PLAN_INTERVAL_S": env.get("SHADOWLIMIT_PLAN_INTERVAL_S", "2"),
                # the fleet's audit trail outside Redis: each replica appends the entries it writes
                "SHADOWLIMIT_AUDIT_LOG": env.get("SHADOWLIMIT_AUDIT_LOG", str(self.workdir / "audit.jsonl")),
            }
        )
        if self.tls:  # both ports over mutual TLS: a CA, the replicas' certificate, a client's
            from limiter.embedded.tls import make_test_pki

            self.pki = make_test_pki(self.workdir / "tls")
            env.update(
                SHADOWLIMIT_TLS_CERT_FILE=self.pki.server_cert,
                SHADOWLIMIT_TLS_KEY_FILE=self.pki.server_key,
                SHADOWLIMIT_TLS_CLIENT_CA_FILE=self.pki.ca_cert,
            )
        self.env = env
        self.gate_settings = {k: env[k] for k in _GATE_SETTINGS}
        self.gates = (
            f"{env['SHADOWLIMIT_GATE_WINDOW_S']}s window, {env['SHADOWLIMIT_GATE_MIN_SAMPLES']} compared decisions,"
            f" {env['SHADOWLIMIT_GATE_MIN_DWELL_S']}s in each step (demo settings; production defaults 300s, 500, 600s)"
        )
        for i in range(self.n):
            port = self.base_port + i if self.base_port else _free_port()
            self.urls.append(f"{'https' if self.tls else 'http'}://127.0.0.1:{port}")
            self.procs.append(self._spawn(i))
        self._wait_ready()

    def verify(self) -> Any:
        """httpx's ``verify=`` for the replicas: True, or (``--tls``) the demo's CA and client
        certificate (also the dashboard's)."""
        if self.pki is None:
            return True
        from ..tls.client import client_context

        pki = self.pki
        return client_context(ca_file=Path(pki.ca_cert), cert_file=Path(pki.client_cert), key_file=Path(pki.client_key))

    def _spawn(self, i: int) -> subprocess.Popen[bytes]:
        """Replica ``i`` (0-based) as its own process, on its port, logging to its file."""
        port = self.urls[i].rsplit(":", 1)[1]
        log = open(self.workdir / f"replica-{i + 1}.log", "ab")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(
            [sys.executable, "-m", "control_plane.cli", "serve", "--host", "127.0.0.1", "--port", port]
            + ["--log-level", "warning"],
            env=dict(self.env, SHADOWLIMIT_INSTANCE_ID=f"replica-{i + 1}"),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )

    @contextlib.contextmanager
    def using(self, i: int) -> Iterator[None]:
        """A request (or a reserve, stream and settle) in flight to replica ``i``."""
        self.busy[i] = self.busy.get(i, 0) + 1
        try:
            yield
        finally:
            self.busy[i] -= 1

    def failed(self, error: Exception) -> None:
        """A demo request that got no answer, counted by its kind."""
        self.errors += 1
        kind = type(error).__name__
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    async def restart(self, i: int) -> None:
        """Replica ``i`` (0-based) stopped and started again on its port, as a deployment or a
        crash would: its local buckets start empty while the global state in Redis remembers
        its clients, which shows as the cause ``fresh_local`` for a refill time. The traffic
        skips it meanwhile."""
        import httpx

        self.down.add(i)
        try:
            drained = self.clock() + 10  # as a deployment drains a replica before stopping it
            while self.busy.get(i, 0) and self.clock() < drained:
                await asyncio.sleep(0.05)
            old = self.procs[i]
            old.terminate()
            try:
                await asyncio.to_thread(old.wait, 10)
            except subprocess.TimeoutExpired:
                old.kill()
                await asyncio.to_thread(old.wait)
            self.procs[i] = self._spawn(i)
            deadline = self.clock() + 30
            async with httpx.AsyncClient(timeout=1.0, verify=self.verify(), limits=http_pool()) as http:
                while self.clock() < deadline and self.procs[i].poll() is None:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(self.urls[i] + "/readyz")).status_code == 200:
                            break
                    await asyncio.sleep(0.1)
            self.restarted.append(i + 1)
        finally:
            self.down.discard(i)

    async def _restart_once(self, stop: asyncio.Event, started: float) -> None:
        """The last replica restarted 5 s into the first minute after the traffic began (at
        least 10 s of it in that minute): the fleet's figures are per minute, and a replica
        counts its fresh buckets as ``fresh_local`` only when the fleet had been deciding the
        route in a whole minute before its restart."""
        boundary = (started // 60 + 1) * 60
        if boundary - started < 10:
            boundary += 60
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, boundary + 5 - time.time()))
        if not stop.is_set():
            await self.restart(self.n - 1)

    def _start_services(self) -> None:
        """The example limits service and chat upstream, each its own process on a free port."""
        self.limits_proc, self.limits_url = start_example_service(
            LIMITS_SERVICE, self.workdir, "limits service", _free_port(), clock=self.clock, preexec=_die_with_parent
        )
        self.chat_proc, self.chat_url = start_example_service(
            CHAT_UPSTREAM, self.workdir, "chat upstream", _free_port(), clock=self.clock, preexec=_die_with_parent
        )

    def _wait_ready(self, timeout: float = 30.0) -> None:
        import httpx

        deadline = self.clock() + timeout
        pending = set(self.urls)
        verify = self.verify()
        while pending and self.clock() < deadline:
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    tail = (self.workdir / f"replica-{i + 1}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"replica {i + 1} exited with {p.returncode}:\n{tail}")
            for url in list(pending):
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/readyz", timeout=1.0, verify=verify).status_code == 200:
                        pending.discard(url)
            time.sleep(0.1)
        if pending:
            raise RuntimeError(f"replicas not ready after {timeout:.0f}s: {sorted(pending)}")

    async def traffic(self, stop: asyncio.Event) -> None:
        """Each client sends at its rate, to one replica or spread over all of them."""
        import httpx

        started = time.time()
        async with httpx.AsyncClient(timeout=2.0, verify=self.verify(), limits=http_pool()) as http:

            async def client(c: Client) -> None:
                i = 0
                home = sum(c.name.encode()) % len(self.urls)
                body = {"method": c.method, "path": c.path, "headers": c.headers, "client_ip": c.ip}
                loop = asyncio.get_running_loop()
                due = loop.time()  # paced by a schedule, so a slow answer does not lower the rate
                while not stop.is_set():
                    target = i % len(self.urls) if c.spread else home
                    i += 1
                    if target not in self.down:  # a replica being restarted is skipped
                        with self.using(target):
                            try:
                                await http.post(self.urls[target] + "/v1/decide", json=body)
                                self.sent += 1
                            except httpx.HTTPError as e:
                                self.failed(e)
                    # bursty clients come in clumps; steady ones evenly
                    delay = 1.0 / c.rps
                    if c.spread and i % 5 == 0:
                        delay *= 4
                    elif c.spread:
                        delay *= 0.25
                    due = max(due + delay, loop.time() - 1.0)  # at most 1 s of catching up
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), max(0.0, due - loop.time()))

            restart = [self._restart_once(stop, started)] if self.restart_planned else []
            chat = [chat_client(self, http, t, stop) for t in CHAT_TENANTS]
            await asyncio.gather(*[client(c) for c in TRAFFIC], *chat, *restart)

    def stop(self) -> None:
        procs = [*self.procs, *(p for p in (self.limits_proc, self.chat_proc) if p is not None)]
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
            "chat_upstream": self.chat_url,
            "rules": str(self.rules_path),
            "gate_settings": dict(self.gate_settings),
            "admin_token": self.token,
            "logs": str(self.workdir),
            "keep_logs": self.keep_logs,
            "restart": f"replica-{self.n}" if self.restart_planned else None,
            "tls": self.pki and {"ca": self.pki.ca_cert, "cert": self.pki.client_cert, "key": self.pki.client_key},
        }

    def _tls_exports(self) -> list[str]:
        """The CLI's settings for ``--tls`` (the dashboard and every command read them)."""
        if self.pki is None:
            return []
        return [
            f"  export SHADOWLIMIT_CA_FILE={self.pki.ca_cert} SHADOWLIMIT_CLIENT_CERT_FILE={self.pki.client_cert}"
            f" SHADOWLIMIT_CLIENT_KEY_FILE={self.pki.client_key}"
        ]

    def _curl_tls(self) -> str:
        if self.pki is None:
            return ""
        return f" --cacert {self.pki.ca_cert} --cert {self.pki.client_cert} --key {self.pki.client_key}"

    def banner(self) -> str:
        lines = [
            "shadowlimit demo is running",
            f"  redis:      {self.redis_url}" + (" (embedded)" if self.redis is not None else ""),
        ]
        for i, u in enumerate(self.urls):
            lines.append(f"  replica {i + 1}:  {u}   (API docs {u}/docs, metrics {u}/metrics)")
        if self.limits_url:
            lines.append(f"  limits:     {self.limits_url}/limits   (examples/limits_service.py; route tenants)")
        if self.chat_url:
            lines.append(
                f"  chat:       {self.chat_url}   (examples/chat_upstream.py; route chat, token budgets in shadow:"
                " stark's would run out)"
            )
        if self.pki is not None:
            lines.append(
                f"  tls:        both ports over mutual TLS; CA {self.pki.ca_cert}, a client's certificate"
                f" {self.pki.client_cert} and key {self.pki.client_key}"
            )
        lines += [
            f"  rules:      {self.rules_path}   (examples/rules.yaml; only the tenants route's"
            " external.url changed, to the limits service above)",
            f"  gates:      {self.gates}",
            "  plans:      internal walks canary 10% -> 50% -> enforce on its own; login's plan finds its limit"
            " too tight and rolls back (shadowlimit plan ROUTE)",
            *(
                [
                    f"  restart:    replica {self.n} restarts once, 5 s into the first whole minute of traffic: its"
                    " new local buckets show as the cause fresh_local (--no-restart: never)"
                ]
                if self.restart_planned
                else []
            ),
            f"  admin token: {self.token}",
            f"  logs:       {self.workdir}   (audit trail: audit.jsonl; "
            + ("kept after the demo)" if self.keep_logs else "removed when the demo stops; --keep-logs keeps them)"),
            "",
            "try:",
            *self._tls_exports(),
            f"  B={self.urls[0]} T={self.token}   (docs/api.md's examples use $B and $T)",
            f"  curl -s{self._curl_tls()} {self.urls[0]}/v1/routes | python3 -m json.tool",
            f"  curl -s{self._curl_tls()} {self.urls[0]}/v1/external | python3 -m json.tool",
            f"  SHADOWLIMIT_ADMIN_TOKEN={self.token} ./dev shadowlimit mode search enforce --url {self.urls[0]}"
            " --reason 'try the global limit' --force",
            f"  ./dev shadowlimit whatif search --rate 20/1s --url {self.urls[0]}",
            f"  ./dev shadowlimit plan internal --url {self.urls[0]}",
            f"  ./dev shadowlimit divergence chat --url {self.urls[0]}   (in tokens)",
            f"  ./dev shadowlimit dash --url {self.urls[0]} --token {self.token}",
            "  (./dev shadowlimit runs the CLI from the project's .venv; installed, it is plain `shadowlimit`)",
        ]
        return "\n".join(lines)


def run_demo(args: argparse.Namespace) -> int:
    stack = DemoStack(
        replicas=args.replicas,
        base_port=args.base_port,
        keep_logs=args.keep_logs,
        restart=not args.no_restart,
        tls=bool(getattr(args, "tls", False)),
    )
    as_json = bool(getattr(args, "json", False))
    note = sys.stderr if as_json else sys.stdout
    stop = asyncio.Event()

    def on_signal(*_: Any) -> None:
        stop.set()

    try:
        # --json: stdout is JSON lines (headless: the running stack, then the totals); notes go to stderr
        print("starting embedded Redis and control-plane replicas ...", flush=True, file=note)
        try:
            stack.start()
        except (OSError, ValueError, RuntimeError) as exc:  # a missing example file, a process that died
            print(f"shadowlimit demo: {exc}", flush=True, file=sys.stderr)
            return 1
        try:
            require_extra("dashboard", "the demo's dashboard")
            from dashboard.app import ShadowlimitDashboard
        except MissingExtra as exc:  # installed without the dashboard: run headless
            print(f"{exc}; running headless", flush=True, file=note)
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
            stopped = {
                "event": "stopped",
                "sent": stack.sent,
                "errors": stack.errors,
                "error_kinds": stack.error_kinds,
                "restarted": stack.restarted,
            }
            print(
                json.dumps(stopped) if as_json else f"stopped: {stack.sent} demo requests sent ({stack.errors} errors)"
            )
            return 0
        verify = stack.verify()
        app = ShadowlimitDashboard(
            stack.urls[0],
            stack.token,
            replicas=stack.urls,
            demo_banner=stack.banner(),
            tls=verify if verify is not True else None,
        )

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
