"""Two revisions' distributed decisions side by side: does Redis decide slower after a change?

``python -m bench.ab_redis REV [--rounds 7]`` checks ``REV`` out in a temporary git worktree
(its C extension built as ``bench.ab`` builds it) and starts one redis-server. Each round runs,
from each revision in turn (the order swapped every round), a driver in a process of its own
that imports that revision's own ``bench.distributed`` and ``limiter``: shadowlimit's rows of
the distributed section (``RedisLimiter.check`` for the token bucket, GCRA and the sliding
window at 1 and 100 tasks, and ``check_many``), measured as that section measures them, each
revision writing its default state format; then redis-benchmark sending the token bucket's own
EVALSHA (the section's same-script row), the pace the shard takes a script at in that round.

Each row's figure is its decisions per second over that pace (what the section reports), so a
round that the machine's other work slows down slows both. The report gives, per row, the
median of both revisions, the paired ratio (this checkout over ``REV``, round by round, the
median and the range over rounds) and Redis' CPU per decision; ``bench/results/ab_redis.json``
keeps every round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .ab import ROOT, worktree

__all__ = ["main", "measure"]

#: the driver each revision runs (its own bench code, its own limiter): argv url, out, reps
DRIVER = r"""
import dataclasses, json, sys
import redis, uvloop
from bench.harness import Settings
from bench.distributed import _Case, _Meter, _case_row, _timed_rep, _warm_up, run_same_script, shadow_factory

url, out, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
# the full run's sizes; quick only shortens the same-script row's run (50,000 requests a rep)
settings = dataclasses.replace(Settings.make(False), quick=True, dist_reps=reps)
keys = [f"client-{i}" for i in range(settings.dist_keys)]
cases = [
    _Case("shadowlimit", alg, conc, "RedisLimiter.check", shadow_factory(alg))
    for conc in (1, settings.concurrency)
    for alg in ("token_bucket", "gcra", "sliding_window")
]
many = shadow_factory("token_bucket", batch=settings.batch)
cases.append(_Case("shadowlimit", "token_bucket, check_many", 1, "batches", many, batch=settings.batch))
stats = redis.Redis.from_url(url)


async def run():
    for case in cases:
        await case.open(url, keys)
    for case in cases:
        await _warm_up(case, keys, settings)
        case.meter = _Meter(stats)
    for rep in range(settings.dist_reps):
        k = rep % len(cases)
        for case in cases[k:] + cases[:k]:
            await _timed_rep(case, stats)
    for case in cases:
        case.allowed = None
        await case.close()


stats.flushall()
uvloop.run(run())
stats.flushall()
rows = [_case_row(case, tag="ab") for case in cases]
json.dump({"rows": rows, "same_script": run_same_script(settings, url)}, open(out, "w"))
"""


def _row_name(row: dict[str, Any]) -> str:
    return f"{row['variant']} c={row['concurrency']}"


def _drive(tree: Path, url: str, reps: int, out: Path) -> dict[str, Any]:
    """One driver run from ``tree``: its rows and its same-script pace."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(
        [sys.executable, "-c", DRIVER, url, str(out), str(reps)],
        cwd=tree, env=env, check=True, timeout=900, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    got = json.loads(out.read_text())
    pace = got["same_script"]["decisions_per_s"]["median"]
    return {
        "pace": pace,
        "rows": {
            _row_name(r): {
                "decisions_per_s": r["decisions_per_s"]["median"],
                "of_pace": r["decisions_per_s"]["median"] / pace,
                "redis_cpu_us": r["redis_cpu_us_per_decision"],
            }
            for r in got["rows"]
        },
    }


def measure(rev: str, rounds: int = 7, reps: int = 5) -> dict[str, Any]:
    from limiter.embedded import EmbeddedRedis

    work = Path(tempfile.mkdtemp(prefix="shadowlimit-ab-redis-"))
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    load = [os.getloadavg()[0]]
    with worktree(rev) as tree, EmbeddedRedis() as server:
        trees = {"before": tree, "after": ROOT}
        for rnd in range(rounds):
            order = ("before", "after") if rnd % 2 == 0 else ("after", "before")
            for name in order:
                runs[name].append(_drive(trees[name], server.url, reps, work / f"{name}-{rnd}.json"))
            load.append(os.getloadavg()[0])
            print(f"bench.ab_redis: round {rnd + 1}/{rounds} done (load {load[-1]:.2f})", file=sys.stderr, flush=True)
    rows: dict[str, Any] = {}
    for key in runs["after"][0]["rows"]:
        per = {n: [r["rows"][key] for r in runs[n]] for n in runs}
        paired = [a["of_pace"] / b["of_pace"] for a, b in zip(per["after"], per["before"], strict=True)]
        rows[key] = {
            name: {
                "decisions_per_s": statistics.median(x["decisions_per_s"] for x in per[name]),
                "of_pace": statistics.median(x["of_pace"] for x in per[name]),
                "redis_cpu_us": statistics.median(x["redis_cpu_us"] for x in per[name]),
            }
            for name in per
        }
        rows[key]["paired_ratio"] = {"median": statistics.median(paired), "min": min(paired), "max": max(paired)}
    pace = {n: statistics.median(r["pace"] for r in runs[n]) for n in runs}
    return {"rev": rev, "rounds": rounds, "reps": reps, "load": load, "pace": pace, "rows": rows, "runs": runs}


def report(res: dict[str, Any]) -> str:
    lines = [
        f"bench.ab_redis vs {res['rev']}: {res['rounds']} rounds; redis-benchmark's same-script pace "
        f"{res['pace']['before']:,.0f}/s before, {res['pace']['after']:,.0f}/s after",
        f"{'row':34s} {'before/pace':>11s} {'after/pace':>11s} {'paired':>8s} {'range':>13s} {'cpu us b/a':>12s}",
    ]
    for key, r in res["rows"].items():
        p = r["paired_ratio"]
        lines.append(
            f"{key:34s} {r['before']['of_pace']:>11.3f} {r['after']['of_pace']:>11.3f} {p['median']:>8.3f} "
            f"{p['min']:>6.3f}-{p['max']:<6.3f} {r['before']['redis_cpu_us']:>5.1f}/{r['after']['redis_cpu_us']:<5.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ab_redis", description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the revision to compare this checkout with (e.g. main~3)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions of each row in a driver run")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "ab_redis.json"))
    args = ap.parse_args(argv)
    res = measure(args.rev, rounds=args.rounds, reps=args.reps)
    Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
