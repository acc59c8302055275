"""Shared pieces: run settings, repetition statistics, machine and version facts."""

from __future__ import annotations

import datetime as _dt
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "Settings", "summarize", "environment", "lib_versions", "pid_cpu_seconds", "timed_reps", "log", "section_main",
]  # fmt: skip

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def pid_cpu_seconds(pid: int | None) -> float:
    """CPU seconds (user + system) a process has used, from /proc (0.0 if unknown)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            rest = fh.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


@dataclass(frozen=True)
class Settings:
    """How long and how often to measure; ``quick`` is a smoke test."""

    quick: bool
    reps: int  # repetitions per local case (>= 5)
    dist_reps: int  # repetitions per distributed case (>= 5)
    local_rep_s: float  # target wall time of one local repetition
    dist_rep_s: float  # target wall time of one distributed repetition
    local_max_ops: int  # hard caps: every loop is bounded
    dist_max_ops: int
    local_keys: int  # keys in the round-robin case
    dist_keys: int  # keys the distributed traffic is spread over
    memory_keys: int  # N keys written for the memory section
    memory_log_keys: int  # keys for the "10 hits per key" memory rows
    concurrency: int = 100
    batch: int = 100

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(
                quick=True,
                reps=5,
                dist_reps=5,
                local_rep_s=0.02,
                dist_rep_s=0.06,
                local_max_ops=60_000,
                dist_max_ops=8_000,
                local_keys=20_000,
                dist_keys=1_000,
                memory_keys=2_000,
                memory_log_keys=300,
            )
        return cls(
            quick=False,
            reps=7,
            dist_reps=5,
            local_rep_s=0.15,
            dist_rep_s=0.3,
            local_max_ops=1_000_000,
            dist_max_ops=60_000,
            local_keys=100_000,
            dist_keys=10_000,
            memory_keys=100_000,
            memory_log_keys=2_000,
        )


class CpuAccount:
    """CPU seconds used by the whole machine, by this process and by the Redis server,
    so a run can say how much *other* processes (colleagues' test runs) took meanwhile."""

    TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __init__(self) -> None:
        self.redis_pid: int | None = None

    def _machine_busy(self) -> float:
        try:
            with open("/proc/stat", encoding="ascii") as fh:
                f = [int(x) for x in fh.readline().split()[1:]]
        except OSError:
            return 0.0
        # user nice system idle iowait irq softirq steal: only the task time (user, nice,
        # system) is comparable with the per-process figures; interrupt time (e.g. the
        # loopback traffic this benchmark itself generates) is not charged to any process
        return (f[0] + f[1] + f[2]) / self.TICK

    def attach_redis(self, pid: int | None) -> None:
        self.redis_pid = pid

    def snapshot(self) -> tuple[float, float, float, float]:
        t = os.times()
        return (time.perf_counter(), self._machine_busy(), t.user + t.system, pid_cpu_seconds(self.redis_pid))

    @staticmethod
    def background(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> dict[str, float]:
        """Average cores used between snapshots a and b: machine, this process, redis, everything else."""
        wall = max(b[0] - a[0], 1e-9)
        machine = (b[1] - a[1]) / wall
        own = (b[2] - a[2]) / wall
        red = max(0.0, b[3] - a[3]) / wall
        return {
            "wall_s": round(wall, 1),
            "machine_cores": round(machine, 2),
            "bench_cores": round(own, 2),
            "redis_cores": round(red, 2),
            "other_cores": round(max(0.0, machine - own - red), 2),
        }


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def summarize(values: list[float]) -> dict[str, Any]:
    """Median, min, max and quartiles (inclusive method) of one case's repetitions."""
    vals = sorted(values)
    if len(vals) >= 2:
        q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
    else:
        q1 = q3 = vals[0]
    return {
        "median": statistics.median(vals),
        "min": vals[0],
        "max": vals[-1],
        "q1": q1,
        "q3": q3,
        "reps": values,
    }


def timed_reps(run: Callable[[int], None], ops: int, reps: int) -> list[float]:
    """Run ``run(ops)`` ``reps`` times; nanoseconds per op of each repetition.

    The cyclic GC stays enabled (it is part of each library's real cost), but a
    collection is forced before each repetition so leftovers from the previous one
    are not billed to it.
    """
    out = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter_ns()
        run(ops)
        out.append((time.perf_counter_ns() - t0) / ops)
    return out


def calibrate(run: Callable[[int], None], target_s: float, max_ops: int, probe: int = 2_000) -> int:
    """Ops per repetition so one repetition takes about ``target_s`` (bounded)."""
    t0 = time.perf_counter()
    run(probe)
    per_op = max((time.perf_counter() - t0) / probe, 1e-9)
    return int(min(max_ops, max(probe, target_s / per_op)))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _os_name() -> str:
    try:
        with open("/etc/os-release", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"') + f" (kernel {platform.release()})"
    except OSError:
        pass
    return platform.platform()


def lib_versions() -> dict[str, str]:
    out = {}
    for dist in ("shadowlimit", "limits", "pyrate-limiter", "redis", "hiredis", "uvloop", "coredis"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _git() -> str | None:
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}{' + uncommitted changes' if dirty else ''}" if head else None


def environment(argv: list[str]) -> dict[str, Any]:
    """Facts about the run; the Redis version is added by the caller once a server runs."""
    return {
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": "python -m bench" + ("" if not argv else " " + " ".join(argv)),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "os": _os_name(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "versions": lib_versions(),
        "git": _git(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


def section_main(
    argv: list[str] | None,
    *,
    doc: str,
    out: Path,
    measure: Callable[[float, int, bool], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
) -> int:
    """The command line of a section measured on its own (``--seconds``, ``--repeats``,
    ``--quick``, ``--out``): its results written to ``out`` as JSON, its report printed."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round of 2 s per row")
    ap.add_argument("--out", default=str(out))
    args = ap.parse_args(argv)
    results = measure(args.seconds, args.repeats, args.quick)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(render(results))
    return 0
