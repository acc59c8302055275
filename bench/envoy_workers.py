"""Behind Envoy, how calls spread over processes: ``serve --workers N`` against Envoy's own
connection pattern.

``SO_REUSEPORT`` (what ``serve --workers`` listens with) spreads *connections* over the
processes, never the calls of one connection, and Envoy keeps about one HTTP/2 connection per
worker thread (``--concurrency``) to each upstream host of its ``ratelimit`` cluster. So the
processes that can work are at most the connections Envoy holds: its workers, or more where its
cluster caps the streams of a connection (``max_concurrent_streams``: calls in flight past the
cap open another connection), and over time where it recycles connections
(``max_requests_per_connection``: a connection used that many times is drained and another
opened, which the kernel may give another process).

Rows, interleaved (every round runs every row once), medians of the rounds: the bare grpcio
server (``bench/bare_rls.py``, the ceiling) behind Envoy with 1 and with 2 workers; shadowlimit
(``serve --grpc-port``, enforce) as 1 and as 2 processes, behind Envoy with 1 and 2 workers, and
2 processes behind one worker whose cluster caps streams at 4 or recycles its connection every
1,000 calls. The rest is the ``envoy`` section's setup (bench/envoy.py): Envoy 1.40 in front of an
upstream Envoy answering 200, wrk (1 thread, 32 connections) over 1,000 keys of a descriptor
limited to 1,000,000/s, every call decided in Redis; every process shares the machine's cores.

Per row: requests/s and against the bare server behind as many Envoy workers; the calls Envoy
counted (``ok`` + ``over_limit`` + ``error``) a second; the calls that failed, each a request let
through unlimited (``failure_mode_deny: false``, Envoy's 20 ms default timeout); p99; the
service's CPU per call; and how the service's CPU split over its processes, round by round.

Run: ``python -m bench --only envoy_workers`` (or ``python -m bench.envoy_workers [--seconds 5]
[--repeats 3]``); the results land in ``bench/results/envoy_workers.json`` and a section of
docs/benchmarks.md.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .control_plane import run_wrk
from .envoy import ENVOY_CONFIG, ROOT, ROUTES, BareServer, Started, envoy_version, tree_cpu, wrk_script
from .harness import section_main

__all__ = ["ROWS", "measure", "render"]


@dataclass(frozen=True, kw_only=True)
class Row:
    name: str
    service: str  # bare | one | two: the bare grpcio server, serve as 1 process, serve --workers 2
    envoy_workers: int = 1
    max_streams: int | None = None  # the ratelimit cluster's HTTP/2 max_concurrent_streams
    max_requests: int | None = None  # the ratelimit cluster's max_requests_per_connection

    @property
    def envoy(self) -> str:
        return f"c{self.envoy_workers}-s{self.max_streams or 0}-r{self.max_requests or 0}"

    @property
    def processes(self) -> int:
        return 2 if self.service == "two" else 1

    @property
    def baseline(self) -> str | None:
        return None if self.service == "bare" else f"bare_c{self.envoy_workers}"


ROWS = (
    Row(name="bare_c1", service="bare"),
    Row(name="bare_c2", service="bare", envoy_workers=2),
    Row(name="one_c1", service="one"),
    Row(name="one_c2", service="one", envoy_workers=2),
    Row(name="two_c1", service="two"),
    Row(name="two_c2", service="two", envoy_workers=2),
    Row(name="two_c1_streams", service="two", max_streams=4),
    Row(name="two_c1_recycled", service="two", max_requests=1000),
)
CONNECTIONS = 32


class Bench(Started):
    """Redis, the services, the upstream Envoy and one front Envoy a row (see the module docstring)."""

    def __init__(self, workdir: Path, seconds: float) -> None:
        super().__init__(workdir, seconds)
        self.ports: dict[str, int] = {}
        self.pids: dict[str, int] = {}

    def start(self) -> None:
        from limiter.embedded import EmbeddedRedis

        self.script = self.work / "rl.lua"
        self.script.write_text(wrk_script("rl"))
        (self.work / "envoy-config.yaml").write_text(ENVOY_CONFIG)
        redis = EmbeddedRedis().start()
        self.stack.callback(redis.stop)
        bare = BareServer(self.work)
        self.stack.callback(bare.stop)
        self.ports["bare"], self.pids["bare"] = bare.port, bare.pid
        for name, extra in (("one", ()), ("two", ("--workers", "2"))):
            server, self.ports[name] = self.serve(f"workers-{name}", redis.url, extra)
            for route in ROUTES:
                server.set_mode("enforce", 0, route)
            self.pids[name] = server.proc.pid
        upstream = self.upstream()
        for row in ROWS:
            self.front(
                row.name, self.ports[row.service], upstream, max_streams=row.max_streams,
                max_requests=row.max_requests, concurrency=row.envoy_workers,
            )  # fmt: skip

    def run_row(self, row: Row, seconds: float | None = None) -> dict[str, Any]:
        seconds = seconds or self.seconds
        envoy = self.envoys[row.name]
        pid = self.pids[row.service]
        before, cpu0 = envoy.ratelimit_stats(), tree_cpu(pid)
        w = run_wrk(self.wrk, envoy.url, self.script, seconds, CONNECTIONS)
        after, cpu1 = envoy.ratelimit_stats(), tree_cpu(pid)
        rl = {k: after[k] - before[k] for k in after}
        calls = rl["ok"] + rl["over_limit"] + rl["error"]
        by_pid = {p: cpu1[p] - cpu0.get(p, 0.0) for p in cpu1}
        wall = w["duration_us"] / 1e6
        return {
            "rps": w["rps"],
            "p99_us": w["p99_us"],
            "calls_per_s": calls / wall if wall else None,
            "calls": calls,
            "failed": rl["error"],
            "error_share": rl["error"] / calls if calls else None,
            "service_cpu_us_per_call": sum(by_pid.values()) / calls * 1e6 if calls else None,
            "service_cpu_by_pid": {str(p): round(c, 3) for p, c in sorted(by_pid.items())},
        }


def _median(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for row in ROWS:
        rs = runs[row.name]
        rows[row.name] = {
            "service": row.service,
            "processes": row.processes,
            "envoy_workers": row.envoy_workers,
            "max_streams": row.max_streams,
            "max_requests": row.max_requests,
            "baseline": row.baseline,
            "runs": rs,
            **{k: _median([r[k] for r in rs]) for k in ("rps", "p99_us", "calls_per_s", "error_share")},
            "service_cpu_us_per_call": _median([r["service_cpu_us_per_call"] for r in rs]),
            "error_share_max": max((r["error_share"] for r in rs if r["error_share"] is not None), default=None),
        }
    for r in rows.values():
        base = rows.get(r["baseline"] or "")
        r["vs_baseline"] = r["rps"] / base["rps"] if base and base["rps"] else None
    return rows


def measure(seconds: float = 5.0, repeats: int = 3, quick: bool = False) -> dict[str, Any]:
    """Every row, ``repeats`` interleaved rounds of ``seconds`` each."""
    import grpc

    if quick:
        seconds, repeats = min(seconds, 2.0), 1
    work = Path(tempfile.mkdtemp(prefix="shadowlimit-bench-envoy-workers-"))
    runs: dict[str, list[dict[str, Any]]] = {row.name: [] for row in ROWS}
    t0, load0 = time.perf_counter(), os.getloadavg()
    try:
        with Bench(work, seconds) as bench:
            for row in ROWS:  # warm-up: connections, scripts loaded, keys created
                bench.run_row(row, 1.0)
            for rnd in range(repeats):
                for row in ROWS:
                    r = bench.run_row(row)
                    runs[row.name].append(r)
                    print(
                        f"bench: envoy_workers round {rnd + 1}/{repeats} {row.name}: {r['rps']:,.0f} requests/s, "
                        f"{r['failed']} failed calls of {r['calls']}",
                        file=sys.stderr,
                        flush=True,
                    )
    except BaseException:
        print(f"bench: envoy_workers: work directory kept for its logs: {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)
    return {
        "rows": summarize(runs),
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "envoy": envoy_version(),
            "grpcio": grpc.__version__,
            "cores": os.cpu_count(),
            "connections": CONNECTIONS,
            "seconds_per_run": seconds,
            "repeats": repeats,
            "quick": quick,
            "duration_s": round(time.perf_counter() - t0, 1),
            "load_avg_start": [round(x, 2) for x in load0],
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        },
    }


def _split(row: dict[str, Any]) -> str:
    """Each round's service CPU by process (the supervisor of ``--workers`` left out below
    half a percent), largest first, as shares of the round's total."""
    parts = []
    for r in row["runs"]:
        cpu = sorted(r["service_cpu_by_pid"].values(), reverse=True)
        total = sum(cpu) or 1.0
        parts.append(" / ".join(f"{c / total:.0%}" for c in cpu if c / total >= 0.005))
    return "; ".join(parts)


def _envoy_label(r: dict[str, Any]) -> str:
    label = f"{r['envoy_workers']}"
    if r["max_streams"]:
        label += f", at most {r['max_streams']} streams a connection"
    if r["max_requests"]:
        label += f", a new connection every {r['max_requests']:,} calls"
    return label


def render(results: dict[str, Any]) -> str:
    meta, rows = results["meta"], results["rows"]
    lines = [
        "## Behind Envoy: processes and Envoy workers",
        "",
        "How calls spread over `serve --workers` processes with Envoy's own connection pattern "
        f"(Envoy {meta['envoy']}, {meta['cores']} cores shared by every process, wrk 1 thread and "
        f"{meta['connections']} connections, every call decided in Redis in enforce; the setup of *Behind Envoy* "
        "above, `bench/envoy_workers.py`). Rows "
        f"interleaved, {meta['seconds_per_run']:g} s each, median of {meta['repeats']} round(s)"
        f"{' (a `--quick` trial)' if meta.get('quick') else ''}; measured {meta['date']} (load "
        f"{meta['load_avg_start'][0]:.2f} before, {meta['load_avg_end'][0]:.2f} after, {meta['duration_s']:.0f} s). "
        "Calls failed: Envoy's `ratelimit.error` over its calls (each a request let through unlimited), median of "
        "the rounds (the worst in brackets); vs bare: against the bare grpcio server behind as many Envoy workers. "
        "CPU split: the service's CPU by process, round by round.",
        "",
        "| service | processes | Envoy workers | requests/s | vs bare | calls/s | calls failed (worst round) | p99 "
        "| service CPU per call | CPU split by process |",
        "|---|--:|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in rows.values():
        service = "bare grpcio server" if r["service"] == "bare" else "shadowlimit"
        ratio = "-" if r["vs_baseline"] is None else f"{r['vs_baseline']:.2f}x"
        cpu = "-" if r["service_cpu_us_per_call"] is None else f"{r['service_cpu_us_per_call']:,.0f} µs"
        failed = "-" if r["error_share"] is None else f"{r['error_share']:.3%} ({r['error_share_max']:.3%})"
        lines.append(
            f"| {service} | {r['processes']} | {_envoy_label(r)} | {r['rps']:,.0f} | {ratio} | "
            f"{r['calls_per_s'] or 0:,.0f} | {failed} | {r['p99_us'] / 1000:.2f} ms | {cpu} | {_split(r)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return section_main(
        argv, doc=__doc__ or "", out=ROOT / "bench" / "results" / "envoy_workers.json", measure=measure, render=render
    )


if __name__ == "__main__":
    sys.exit(main())
