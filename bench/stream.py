"""Event-stream benchmark: what N ``GET /v1/stream`` subscribers cost ``POST /v1/decide``.

One control plane (``shadowlimit serve`` in its own process, against a redis-server this
script starts), N SSE subscribers in a second process (raw asyncio sockets that count and
drop what they read) and ``wrk`` in a third. Each round measures, with 0 and then with N
subscribers connected: the server's CPU while idle (cores), then a wrk run of decide
requests (p50, p99, requests/s, server CPU per request). Rounds are repeated and medians
reported. All subscribers ask for the same view (``--views`` spreads them over several).

Run: ``python -m bench.stream [--subscribers 200] [--interval 0.5] [--repeats 3]``. To
compare with another commit's control plane, extract it and measure both in interleaved
rounds (``--config LABEL=DIR@INTERVAL``, repeatable; every server is started up front
against the same Redis and only the one being measured gets traffic)::

    mkdir /tmp/base && git archive main control_plane | tar -x -C /tmp/base
    python -m bench.stream --config "main@0.2=/tmp/base@0.2" --config "this@0.5=.@0.5"

Results are merged into ``bench/results/stream.json`` (one entry per label; ``--out``)
and ``python -m bench`` renders them into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from .control_plane import RULES, WRK_LUA, ensure_wrk, free_port, process_cpu_s, run_wrk

ROOT = Path(__file__).resolve().parent.parent

#: extra routes beside the benchmark's ``api`` route, so that a snapshot carries what a
#: real fleet's does (a dozen routes with divergence, buckets of busy keys)
EXTRA_ROUTES = 5


def rules_text(extra: int = EXTRA_ROUTES) -> str:
    text = RULES
    for i in range(extra):
        text += (
            f"  - name: r{i:02d}\n"
            f"    match: {{path: /r{i:02d}/**}}\n"
            "    key: {strategy: header, header: X-Client-Id}\n"
            "    local: {average: 50, period: 1s, burst: 50}\n"
            "    distributed: {average: 20, period: 1s, burst: 20}\n"
        )
    return text


class Server:
    """``shadowlimit serve`` on a free loopback port, its Redis given by URL; ``src``: the
    directory whose ``control_plane`` package is served (the process starts there)."""

    def __init__(self, workdir: Path, redis_url: str, src: Path, max_streams: int) -> None:
        self.port = free_port()
        self.token = secrets.token_hex(12)
        self.url = f"http://127.0.0.1:{self.port}"
        rules = workdir / "rules.yaml"
        rules.write_text(rules_text())
        env = dict(
            os.environ,
            ENABLE_DISTRIBUTED_RATE_LIMITING="true",
            RATE_LIMIT_REDIS_URL=redis_url,
            RATE_LIMIT_RULES_PATH=str(rules),
            SHADOWLIMIT_ADMIN_TOKEN=self.token,
            SHADOWLIMIT_NAMESPACE=f"bench-stream-{secrets.token_hex(4)}",
            SHADOWLIMIT_MAX_STREAMS=str(max_streams),
        )
        env.pop("PYTHONPATH", None)
        self.log = open(workdir / "server.log", "wb")  # noqa: SIM115
        # `python -m` puts the working directory first on sys.path: src's control_plane wins
        cmd = [sys.executable, "-m", "control_plane.cli", "serve", "--port", str(self.port), "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, env=env, cwd=src, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise SystemExit(f"control plane did not start: see {workdir / 'server.log'}")

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid) or 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def warm_up(url: str, extra: int = EXTRA_ROUTES) -> None:
    """Traffic on every route (30 keys each), so buckets and divergence have content."""
    with httpx.Client(base_url=url, timeout=10) as c:
        reqs = [{"route": f"r{i:02d}", "key": f"k{k}"} for i in range(extra) for k in range(30)]
        for start in range(0, len(reqs), 500):
            c.post("/v1/decide/batch", json={"requests": reqs[start : start + 500]}).raise_for_status()


def snapshot_size(url: str, interval: float) -> int:
    """Bytes of one ``snapshot`` event as the server sends it."""
    with (
        httpx.Client(timeout=10) as c,
        c.stream("GET", url + "/v1/stream", params={"interval": interval, "minutes": 30}) as resp,
    ):
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data:"):
                return len(line) + len("event: snapshot\n\n\n")
    return 0


# -- the subscriber process ----------------------------------------------------------------


async def _subscribe(host: str, port: int, path: str, stats: dict[str, int], first: asyncio.Event) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n".encode())
        status = int((await reader.readline()).split()[1])
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        if status != 200:
            stats[f"status_{status}"] = stats.get(f"status_{status}", 0) + 1
            return
        stats["open"] += 1
        while chunk := await reader.read(1 << 16):
            stats["bytes"] += len(chunk)
            n = chunk.count(b"event: snapshot")
            stats["snapshots"] += n
            if n and not first.is_set():
                first.set()
    finally:
        first.set()
        writer.close()


async def _subscribers(url: str, n: int, interval: float, views: int) -> None:
    host, port = url.removeprefix("http://").split(":")
    stats = {"open": 0, "bytes": 0, "snapshots": 0}
    firsts = [asyncio.Event() for _ in range(n)]
    paths = [f"/v1/stream?interval={interval}&minutes={30 - i % views}" for i in range(n)]
    tasks = [asyncio.ensure_future(_subscribe(host, int(port), paths[i], stats, firsts[i])) for i in range(n)]
    await asyncio.gather(*(f.wait() for f in firsts))
    print("READY " + json.dumps(stats), flush=True)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(done.set)), daemon=True).start()
    await done.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print("DONE " + json.dumps(stats), flush=True)


class Subscribers:
    """N subscribers in their own process; ready once each has its first snapshot (or its
    refusal); :meth:`stop` returns their counts."""

    def __init__(self, url: str, n: int, interval: float, views: int) -> None:
        cmd = [sys.executable, "-m", "bench.stream", "--subscriber-process", url, str(n), str(interval), str(views)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.proc.kill()
            raise RuntimeError(f"subscribers did not start: {line!r}")
        self.ready = json.loads(line[6:])
        self.started = time.monotonic()

    def stop(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        line = self.proc.stdout.readline()
        self.proc.wait(30)
        stats: dict[str, Any] = json.loads(line[5:]) if line.startswith("DONE ") else {}
        stats["seconds"] = time.monotonic() - self.started
        return stats


# -- measuring -----------------------------------------------------------------------------


def idle_cores(server: Server, seconds: float) -> float:
    """Cores the server process used over ``seconds`` with no decide traffic."""
    c0, t0 = server.cpu_s(), time.monotonic()
    time.sleep(seconds)
    return (server.cpu_s() - c0) / (time.monotonic() - t0)


def measure(
    configs: list[tuple[str, Path, float]],
    subscribers: int,
    *,
    views: int = 1,
    seconds: float = 5.0,
    idle_s: float = 3.0,
    repeats: int = 3,
    connections: int = 32,
    max_streams: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Each config is ``(label, server source directory, interval)``: one server each, all
    started up front, and every round measures every config in turn (drift in the
    machine's speed hits them alike)."""
    from limiter.embedded import EmbeddedRedis

    wrk = ensure_wrk()
    work = Path(tempfile.mkdtemp(prefix="shadowlimit-bench-stream-"))
    script = work / "decide.lua"
    script.write_text(WRK_LUA)
    redis = EmbeddedRedis().start()
    servers: dict[str, Server] = {}
    rounds: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in configs}
    sizes: dict[str, int] = {}
    try:
        for i, (label, src, interval) in enumerate(configs):
            (work / f"server{i}").mkdir()
            server = servers[label] = Server(work / f"server{i}", redis.url, src, max_streams or subscribers)
            warm_up(server.url)
            sizes[label] = snapshot_size(server.url, interval)
            run_wrk(wrk, server.url, script, 2, connections)  # warm-up
        for _ in range(repeats):
            for label, _, interval in configs:
                server = servers[label]
                r: dict[str, Any] = {
                    "idle_cores_0": idle_cores(server, idle_s),
                    "wrk_0": run_wrk(wrk, server.url, script, seconds, connections, server.proc.pid),
                }
                subs = Subscribers(server.url, subscribers, interval, views)
                try:
                    r["subscribers_ready"] = subs.ready
                    r["idle_cores_n"] = idle_cores(server, idle_s)
                    r["wrk_n"] = run_wrk(wrk, server.url, script, seconds, connections, server.proc.pid)
                finally:
                    r["subscribers"] = subs.stop()
                rounds[label].append(r)
                time.sleep(1.0)  # the streams' slots and tasks are gone before the next run
    finally:
        for server in servers.values():
            server.stop()
        redis.stop()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "seconds_per_run": seconds,
        "idle_s": idle_s,
        "repeats": repeats,
        "connections": connections,
        "python": platform.python_version(),
        "load_avg": os.getloadavg(),
    }
    return {
        label: summarize(rounds[label], subscribers, interval, views, sizes[label], meta)
        for label, _, interval in configs
    }


def summarize(
    rounds: list[dict[str, Any]], subscribers: int, interval: float, views: int, size: int, meta: dict[str, Any]
) -> dict[str, Any]:
    def med(f: Any) -> float:
        return float(statistics.median(f(r) for r in rounds))

    return {
        "subscribers": subscribers,
        "interval": interval,
        "views": views,
        "snapshot_bytes": size,
        "rounds": rounds,
        "p50_ms_0": med(lambda r: r["wrk_0"]["p50_us"] / 1000),
        "p50_ms_n": med(lambda r: r["wrk_n"]["p50_us"] / 1000),
        "p50_ratio_paired": med(lambda r: r["wrk_n"]["p50_us"] / r["wrk_0"]["p50_us"]),
        "p99_ms_0": med(lambda r: r["wrk_0"]["p99_us"] / 1000),
        "p99_ms_n": med(lambda r: r["wrk_n"]["p99_us"] / 1000),
        "rps_0": med(lambda r: r["wrk_0"]["rps"]),
        "rps_n": med(lambda r: r["wrk_n"]["rps"]),
        "cpu_us_per_request_0": med(lambda r: r["wrk_0"].get("server_cpu_us_per_request", 0.0)),
        "cpu_us_per_request_n": med(lambda r: r["wrk_n"].get("server_cpu_us_per_request", 0.0)),
        "idle_cores_0": med(lambda r: r["idle_cores_0"]),
        "idle_cores_n": med(lambda r: r["idle_cores_n"]),
        "streams_open": med(lambda r: r["subscribers_ready"]["open"]),
        "streams_refused": med(lambda r: sum(v for k, v in r["subscribers_ready"].items() if k.startswith("status_"))),
        "snapshots_per_s": med(lambda r: r["subscribers"].get("snapshots", 0) / r["subscribers"]["seconds"]),
        "mb_per_s": med(lambda r: r["subscribers"].get("bytes", 0) / r["subscribers"]["seconds"] / 1e6),
        "meta": meta,
    }


def render(runs: dict[str, dict[str, Any]]) -> str:
    """A markdown section for docs/benchmarks.md from the labelled results."""
    if not runs:
        return ""
    any_run = next(iter(runs.values()))
    meta = any_run["meta"]
    lines = [
        "## Event stream: `GET /v1/stream` subscribers vs `POST /v1/decide`",
        "",
        f"One `shadowlimit serve` process (its own redis-server), N SSE subscribers in a second process and `wrk` "
        f"({meta['connections']} connections, {meta['seconds_per_run']:g} s per run) in a third, on the same 2 cores; "
        f"{EXTRA_ROUTES + 1} routes with traffic, so a snapshot is about {any_run['snapshot_bytes'] / 1000:.0f} KB. "
        "Each round runs decide with no subscriber, then with N connected; median of the rounds. Idle CPU: cores the "
        "server uses with no decide traffic. p50 N/0, paired: the median of each round's ratio (runs seconds apart, "
        "so the machine's drift cancels). Load average when a run ended: up to "
        f"{max(r['meta']['load_avg'][0] for r in runs.values()):.1f} on "
        f"{os.cpu_count()} cores, other jobs included: absolute figures are noisy, the paired ratios less so.",
        "",
        "| code | subscribers | interval | views | decide p50 (0 / N) | p50 N/0, paired | p99 (0 / N) "
        "| requests/s (0 / N) | server CPU per request (0 / N) | server idle CPU (0 / N) | snapshots/s delivered "
        "| measured |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for label, r in runs.items():
        lines.append(
            f"| {label} | {r['streams_open']:.0f} | {r['interval']:g} s | {r['views']} | "
            f"{r['p50_ms_0']:.2f} / {r['p50_ms_n']:.2f} ms | {r['p50_ratio_paired']:.2f}x | "
            f"{r['p99_ms_0']:.2f} / {r['p99_ms_n']:.2f} ms | {r['rps_0']:,.0f} / {r['rps_n']:,.0f} | "
            f"{r['cpu_us_per_request_0']:.0f} / {r['cpu_us_per_request_n']:.0f} µs | "
            f"{r['idle_cores_0']:.2f} / {r['idle_cores_n']:.2f} | "
            f"{r['snapshots_per_s']:,.0f} | {r['meta']['date'][:10]}, {r['meta']['repeats']} rounds |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--subscriber-process"]:
        url, n, interval, views = argv[1], int(argv[2]), float(argv[3]), int(argv[4])
        asyncio.run(_subscribers(url, n, interval, views))
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.stream", description=__doc__.splitlines()[0])
    ap.add_argument("--subscribers", type=int, default=200)
    ap.add_argument(
        "--interval", type=float, default=0.5, help="each subscriber's ?interval= (default 0.5, the minimum)"
    )
    ap.add_argument(
        "--views", type=int, default=1, help="spread the subscribers over this many views (minutes=30, 29, ...)"
    )
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per wrk run")
    ap.add_argument("--idle-s", type=float, default=3.0, help="seconds of the idle CPU window")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument(
        "--max-streams", type=int, default=None, help="SHADOWLIMIT_MAX_STREAMS for the server (default: --subscribers)"
    )
    ap.add_argument(
        "--server-src",
        type=Path,
        default=ROOT,
        help="directory whose control_plane package is served (default: this checkout)",
    )
    ap.add_argument(
        "--label", default=None, help="name of this run in the results (default: the checkout's git describe)"
    )
    ap.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="LABEL=DIR@INTERVAL",
        help="measure several servers in interleaved rounds (repeatable; replaces --server-src/--label/--interval)",
    )
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "stream.json"))
    args = ap.parse_args(argv)
    configs: list[tuple[str, Path, float]] = []
    for spec in args.config:
        label, _, rest = spec.partition("=")
        src, _, interval = rest.rpartition("@")
        configs.append((label, Path(src).resolve(), float(interval)))
    if not configs:
        label = (
            args.label
            or subprocess.run(
                ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip()
        )
        configs.append((label, args.server_src.resolve(), args.interval))
    results = measure(
        configs,
        args.subscribers,
        views=args.views,
        seconds=args.seconds,
        idle_s=args.idle_s,
        repeats=args.repeats,
        connections=args.connections,
        max_streams=args.max_streams,
    )
    out = Path(args.out)
    runs = json.loads(out.read_text()) if out.exists() else {}
    runs.update(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(runs, indent=1) + "\n")
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
