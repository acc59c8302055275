"""Two revisions of the service side by side, interleaved: did a change make it slower?

``python -m bench.ab REV [--rounds 5] [--seconds 3]`` checks ``REV`` out in a temporary git
worktree, starts ``shadowlimit serve --grpc-port`` from it and from this checkout (the same
rules and Envoy configuration as the service section, one Redis, a namespace each), and runs
every row against both in turn, round after round, the order swapped every round: ``POST
/v1/decide`` and ``/v1/authz`` (wrk, 32 connections) and gRPC ``ShouldRateLimit`` (32
callers) in off, shadow and enforce. It prints each row's median requests/s for both, the
ratio (this checkout over ``REV``) and whether it is within ``--tolerance`` (5%), and writes
``bench/results/ab.json``. Both servers share the machine: what drifts, drifts for both.

Each row also says the server's CPU time (user + system, /proc) per request for both: on a
machine other work shares, requests/s moves with that work, while the CPU a request costs
moves much less (the machine's load average is recorded with the figures).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .control_plane import WRK_AUTHZ_LUA, WRK_LUA, Server, ensure_wrk, free_port, process_cpu_s, run_wrk
from .grpc_rls import ENVOY_CONFIG, ROUTE, RULES, run_client

__all__ = ["measure", "main"]

ROOT = Path(__file__).resolve().parent.parent
MODES = ("off", "shadow", "enforce")


@contextlib.contextmanager
def worktree(rev: str) -> Any:
    """``rev`` checked out in a temporary directory (removed afterwards), with its C
    extension built in place as this checkout's is: without it, its local limiter would run
    the pure Python path and the comparison would favour this checkout."""
    path = Path(tempfile.mkdtemp(prefix="shadowlimit-ab-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), rev], cwd=ROOT, check=True)
    try:
        _build_extension(path)
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


def _build_extension(tree: Path) -> None:
    """``tree``'s ``limiter._speedups``: this checkout's build when the C source is the same,
    else compiled in place (the flags of setup.py; the project's packaging is not read)."""
    source = "limiter/_speedups.c"
    if (tree / source).read_bytes() == (ROOT / source).read_bytes():
        for built in (ROOT / "limiter").glob("_speedups*.so"):
            shutil.copy2(built, tree / "limiter" / built.name)
        return
    from setuptools import Extension
    from setuptools.command.build_ext import build_ext
    from setuptools.dist import Distribution

    ext = Extension("limiter._speedups", [source], extra_compile_args=["-O2", "-ffp-contract=off"])
    here = os.getcwd()
    os.chdir(tree)
    try:
        cmd = build_ext(Distribution({"ext_modules": [ext]}))
        cmd.inplace = True
        cmd.ensure_finalized()
        cmd.run()
    finally:
        os.chdir(here)


def _server(work: Path, tree: Path | None, name: str, redis_url: str) -> tuple[Server, int]:
    work.mkdir(parents=True)
    grpc_port = free_port()
    (work / "envoy.yaml").write_text(ENVOY_CONFIG)
    env = {"SHADOWLIMIT_ENVOY_CONFIG": str(work / "envoy.yaml"), "SHADOWLIMIT_NAMESPACE": f"bench-ab-{name}"}
    server = Server(
        work, rules_text=RULES, env_extra=env, args=("--grpc-port", str(grpc_port)), redis_url=redis_url, tree=tree
    )
    return server, grpc_port


def measure(rev: str, rounds: int = 5, seconds: float = 3.0) -> dict[str, Any]:
    from limiter.embedded import EmbeddedRedis

    wrk = ensure_wrk()
    work = Path(tempfile.mkdtemp(prefix="shadowlimit-bench-ab-"))
    decide, authz = work / "decide.lua", work / "authz.lua"
    decide.write_text(WRK_LUA)
    authz.write_text(WRK_AUTHZ_LUA)
    runs: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    cpu: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}  # server CPU us per request
    load = [os.getloadavg()[0]]
    with contextlib.ExitStack() as stack, worktree(rev) as tree:
        redis = EmbeddedRedis().start()
        stack.callback(redis.stop)
        servers = {}
        for name, where in (("before", tree), ("after", None)):
            servers[name] = _server(work / name, where, name, redis.url)
            stack.callback(servers[name][0].stop)
        for server, _ in servers.values():  # warm-up
            run_wrk(wrk, server.url, decide, 1.0, 32)
        for rnd in range(rounds):
            for mode in MODES:
                order = ("before", "after") if rnd % 2 == 0 else ("after", "before")
                for name in order:
                    for route in (ROUTE, "api"):
                        servers[name][0].set_mode(mode, 0, route)
                time.sleep(0.3)
                for name in order:
                    server, grpc_port = servers[name]
                    pid = server.proc.pid
                    for row, script in (("decide", decide), ("authz", authz)):
                        r = run_wrk(wrk, server.url, script, seconds, 32, pid)
                        runs[name].setdefault(f"{row} {mode}", []).append(r["rps"])
                        cpu[name].setdefault(f"{row} {mode}", []).append(r["server_cpu_us_per_request"])
                    c0 = process_cpu_s(pid)
                    g = run_client(grpc_port, seconds, 32)
                    c1 = process_cpu_s(pid)
                    runs[name].setdefault(f"grpc {mode}", []).append(g["calls_per_s"])
                    if c0 is not None and c1 is not None and g["calls"]:
                        cpu[name].setdefault(f"grpc {mode}", []).append((c1 - c0) / g["calls"] * 1e6)
            load.append(os.getloadavg()[0])
            print(f"bench.ab: round {rnd + 1}/{rounds} done (load {load[-1]:.2f})", file=sys.stderr, flush=True)
    rows = {}
    for key in runs["after"]:
        b, a = statistics.median(runs["before"][key]), statistics.median(runs["after"][key])
        paired = statistics.median(x / y for x, y in zip(runs["after"][key], runs["before"][key]))
        rows[key] = {"before": b, "after": a, "ratio": a / b, "paired_ratio": paired}
        cb, ca = cpu["before"].get(key), cpu["after"].get(key)
        if cb and ca:
            rows[key]["cpu_us"] = {
                "before": statistics.median(cb),
                "after": statistics.median(ca),
                "paired_ratio": statistics.median(x / y for x, y in zip(ca, cb)),
            }
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {
        "rows": rows,
        "runs": runs,
        "cpu_runs": cpu,
        "meta": {
            "before": rev,
            "after": head.stdout.strip(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "rounds": rounds,
            "seconds": seconds,
            "cores": os.cpu_count(),
            "load_avg": {"min": min(load), "median": statistics.median(load), "max": max(load)},
        },
    }


def render(results: dict[str, Any], tolerance: float) -> str:
    meta = results["meta"]
    load = meta.get("load_avg")
    machine = ""
    if load:
        machine = f"; {meta['cores']} cores, load average {load['min']:.1f} to {load['max']:.1f}"
        machine += f" (median {load['median']:.1f})"
    lines = [
        f"A/B, {meta['date']}: {meta['after']} (after) against {meta['before']} (before), "
        f"{meta['rounds']} interleaved rounds of {meta['seconds']:g} s per row, medians" + machine,
        "",
        f"| row | before /s | after /s | after / before | paired | within {tolerance:.0%} "
        "| server CPU/request before | after | paired |",
        "|---|--:|--:|--:|--:|---|--:|--:|--:|",
    ]
    for key, r in results["rows"].items():
        ok = r["ratio"] >= 1 - tolerance
        c = r.get("cpu_us")
        cpu = f"{c['before']:.1f} µs | {c['after']:.1f} µs | {c['paired_ratio']:.3f}" if c else "- | - | -"
        lines.append(
            f"| {key} | {r['before']:,.0f} | {r['after']:,.0f} | {r['ratio']:.3f} | {r['paired_ratio']:.3f} | "
            f"{'yes' if ok else '**no**'} | {cpu} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the revision to compare this checkout with (git rev)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ab.json"))
    args = ap.parse_args(argv)
    results = measure(args.rev, args.rounds, args.seconds)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(render(results, args.tolerance))
    return 0 if all(r["ratio"] >= 1 - args.tolerance for r in results["rows"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
