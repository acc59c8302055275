"""Envoy's rate limit service: ``ShouldRateLimit`` calls/s over gRPC, next to ``POST /v1/decide``.

One ``shadowlimit serve --grpc-port`` process (embedded Redis, an envoyproxy/ratelimit config
with one descriptor, ``remote_address``, limit 10^9 per second so every call is decided in
full) and the load in another process: a grpcio aio client with 32 concurrent callers,
each call one descriptor over 1,000 addresses round robin; ``wrk`` with the same keys on
``POST /v1/decide`` in the same rounds. Modes off, shadow and enforce, interleaved.

Run: ``python -m bench.grpc_rls [--seconds 3] [--repeats 5]``; the report lands in
``bench/results/grpc_rls.json`` and is rendered into docs/benchmarks.md by ``python -m bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .control_plane import WRK_LUA, Server, ensure_wrk, free_port, run_wrk

ENVOY_CONFIG = """\
domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
"""
RULES = """\
version: 1
routes:
  - name: api
    match: {path: /api/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 1000000, period: 1s, burst: 1000000}
"""
ROUTE = "bench/remote_address"
MODES = ("off", "shadow", "enforce")


async def _load(port: int, seconds: float, concurrency: int) -> dict[str, Any]:
    """``concurrency`` callers for ``seconds``: calls, errors, OVER_LIMIT answers."""
    import grpc
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

    entry = ratelimit_pb2.RateLimitDescriptor.Entry
    requests = [
        rls_pb2.RateLimitRequest(
            domain="bench",
            descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry(key="remote_address", value=f"k{i}")])],
        )
        for i in range(1000)
    ]
    counts = {"calls": 0, "errors": 0, "over": 0}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        await stub.ShouldRateLimit(requests[0])  # connected
        deadline = time.perf_counter() + seconds

        async def caller(offset: int) -> None:
            i = offset
            while time.perf_counter() < deadline:
                try:
                    r = await stub.ShouldRateLimit(requests[i % 1000])
                    counts["over"] += r.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
                except grpc.RpcError:
                    counts["errors"] += 1
                counts["calls"] += 1
                i += concurrency

        t0 = time.perf_counter()
        await asyncio.gather(*(caller(k) for k in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {**counts, "seconds": elapsed, "calls_per_s": counts["calls"] / elapsed}


def run_client(port: int, seconds: float, concurrency: int) -> dict[str, Any]:
    """The load from a separate process (as Envoy is one)."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.grpc_rls", "--client", str(port), str(seconds), str(concurrency)],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def start_server(work: Path) -> tuple[Server, int]:
    """``shadowlimit serve --grpc-port`` in its own process, and its gRPC port."""
    grpc_port = free_port()
    (work / "envoy.yaml").write_text(ENVOY_CONFIG)
    server = Server(
        work,
        rules_text=RULES,
        env_extra={"SHADOWLIMIT_ENVOY_CONFIG": str(work / "envoy.yaml"), "SHADOWLIMIT_NAMESPACE": "bench-grpc"},
        args=("--grpc-port", str(grpc_port)),
    )
    return server, grpc_port


def measure(seconds: float = 3.0, repeats: int = 5, concurrency: int = 32) -> dict[str, Any]:
    wrk = ensure_wrk()
    work = Path(tempfile.mkdtemp(prefix="shadowlimit-bench-grpc-"))
    script = work / "decide.lua"
    script.write_text(WRK_LUA)
    server, grpc_port = start_server(work)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {m: {"grpc": [], "decide": []} for m in MODES}
    try:
        run_client(grpc_port, 2, concurrency)  # warm-up
        for _ in range(repeats):
            for mode in MODES:
                for route in (ROUTE, "api"):
                    server.set_mode(mode, 0, route)
                time.sleep(0.3)
                runs[mode]["grpc"].append(run_client(grpc_port, seconds, concurrency))
                runs[mode]["decide"].append(run_wrk(wrk, server.url, script, seconds, concurrency))
    finally:
        server.stop()
    modes = {}
    for mode, by in runs.items():
        g = statistics.median(r["calls_per_s"] for r in by["grpc"])
        d = statistics.median(r["rps"] for r in by["decide"])
        modes[mode] = {
            "runs": by,
            "grpc_calls_per_s": g,
            "decide_rps": d,
            "errors": sum(r["errors"] for r in by["grpc"]),
            "over_limit": sum(r["over"] for r in by["grpc"]),
        }
    import grpc

    return {
        "modes": modes,
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "grpcio": grpc.__version__,
            "python": platform.python_version(),
            "concurrency": concurrency,
            "seconds_per_run": seconds,
            "repeats": repeats,
            "load_avg": os.getloadavg(),
        },
    }


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "## Envoy's rate limit service: `ShouldRateLimit` over gRPC",
        "",
        f"One `shadowlimit serve --grpc-port` process (embedded Redis) and a grpcio {meta['grpcio']} aio client in "
        f"another process: {meta['concurrency']} concurrent calls, one descriptor each (`remote_address`, 1,000 "
        "values round robin, limit 10^9/s so every call is decided in full), "
        f"{meta['seconds_per_run']:g} s per run, median of {meta['repeats']} rounds; `POST /v1/decide` with "
        f"wrk ({meta['concurrency']} connections, 1,000 keys) in the same rounds. Measured {meta['date']}.",
        "",
        "| mode | ShouldRateLimit calls/s | /v1/decide requests/s | gRPC / decide | gRPC errors |",
        "|---|--:|--:|--:|--:|",
    ]
    for mode, r in results["modes"].items():
        g, d = r["grpc_calls_per_s"], r["decide_rps"]
        lines.append(f"| {mode} | {g:,.0f} | {d:,.0f} | {g / d:.2f}x | {r['errors']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--out", default="bench/results/grpc_rls.json")
    ap.add_argument("--client", nargs=3, metavar=("PORT", "SECONDS", "CONCURRENCY"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.client:
        port, seconds, conc = args.client
        print(json.dumps(asyncio.run(_load(int(port), float(seconds), int(conc)))))
        return 0
    results = measure(args.seconds, args.repeats, args.concurrency)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
