"""What explaining divergence costs: the shadow pipeline's comparisons per second, and Redis'
CPU per comparison, on routes that explain their divergence (``explain: true``, the default:
the route's local policy is evaluated fleet-wide as the reference, beside the global one, in
the same burst) and on the same routes with ``explain: false``.

One engine in this process (``open_engine`` on the benchmark's embedded Redis). Batches of
``SHADOWLIMIT_SHADOW_BATCH_SIZE`` (256) items, built as the decider builds them (each key's
local check first, so its bucket has a birth to look at), are evaluated by
``engine.shadow.evaluate``, the shadow worker's own call; only that call is timed. Every
round runs each case once, ``explain`` on and off in turn (which one first alternates), and
the ratios are each round's, so the machine's drift between rounds cancels. Two workloads:
``agree``, where the two limits are the same (the common case: nothing is divergent to
explain, and under a global limit no stricter than the local one no reference is evaluated)
and ``diverge``, a global limit far stricter, where every comparison is a new rejection that
is then explained (the worst case: the reference evaluated, a cause worked out and counted
for each).

Redis' CPU is the redis-server process's (user + system, from /proc, 10 ms ticks) over the
run, per comparison.

Run: ``python -m bench --only explain`` (``./dev bench --only explain``), under
``flock /tmp/shadowlimit-bench.lock`` on a shared machine.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .harness import pid_cpu_seconds

__all__ = ["measure", "render"]

KEYS = 10_000
#: one route per workload and setting: the same limits, ``explain`` on or off
RULES = """\
version: 1
routes:
"""
_ROUTE = """\
  - name: {name}
    match: {{path: /{name}/**}}
    key: {{strategy: header, header: X-Client-Id}}
    local: {{average: 1000000, period: 1s, burst: 1000000}}
    distributed: {distributed}
    explain: {explain}
"""
#: the global limit of each workload: as generous as the local one (they agree), or one
#: request an hour per key (after its first, every comparison is a new rejection)
WORKLOADS = {
    "agree": "{average: 1000000, period: 1s, burst: 1000000}",
    "diverge": "{average: 1, period: 3600s, burst: 1}",
}


def _rules() -> str:
    routes = [
        _ROUTE.format(name=f"{w}-{'on' if on else 'off'}", distributed=d, explain="true" if on else "false")
        for w, d in WORKLOADS.items()
        for on in (True, False)
    ]
    return RULES + "".join(routes)


async def _run(url: str, redis_pid: int | None, seconds: float, repeats: int) -> dict[str, Any]:
    from control_plane.decision.shadow import ShadowItem
    from control_plane.settings import load_settings
    from control_plane.wiring import open_engine

    work = Path(tempfile.mkdtemp(prefix="shadowlimit-bench-explain-"))
    rules = work / "rules.yaml"
    rules.write_text(_rules())
    settings = load_settings(
        rules_path=rules, enable_distributed_rate_limiting=True, namespace="bench-explain", redis_url=url
    )
    handle = await open_engine(settings)
    engine = handle.engine
    batch_size = settings.shadow_batch_size
    keys = [f"client-{i}" for i in range(KEYS)]
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        for rnd in range(repeats):
            for workload in WORKLOADS:
                order = (True, False) if rnd % 2 == 0 else (False, True)
                for on in order:
                    name = f"{workload}-{'on' if on else 'off'}"
                    rule = engine.rules.get(name)
                    assert rule is not None and rule.explain is on
                    lp, dp = rule.local, rule.distributed
                    prefix = f"{name}:"
                    done = 0
                    spent = 0.0
                    cpu = 0.0
                    redis0 = pid_cpu_seconds(redis_pid)
                    started = time.perf_counter()
                    while time.perf_counter() - started < seconds:
                        now_us = time.time_ns() // 1000
                        batch = []
                        for j in range(batch_size):
                            key = keys[(done + j) % KEYS]
                            lkey = prefix + key
                            local = engine.local.check(lkey, lp, 1, now_us)
                            batch.append(
                                ShadowItem(
                                    request=(lkey, dp, 1, now_us),
                                    route=name,
                                    key=key,
                                    local_allowed=local.allowed,
                                    request_id="bench",
                                    ref=lp if on else None,
                                )  # fmt: skip
                            )
                        c0, t0 = time.process_time(), time.perf_counter()
                        await engine.shadow.evaluate(batch)
                        spent += time.perf_counter() - t0
                        cpu += time.process_time() - c0
                        done += batch_size
                    redis_s = pid_cpu_seconds(redis_pid) - redis0
                    runs.setdefault(name, []).append(
                        {
                            "comparisons": done,
                            "per_s": done / spent,
                            "redis_us": redis_s / done * 1e6,
                            "process_us": cpu / done * 1e6,
                        }
                    )
                    await engine.flush()  # the counters this run wrote, before the next run
    finally:
        await handle.aclose()
    return runs


def measure(url: str, redis_pid: int | None, *, seconds: float = 2.0, repeats: int = 7) -> dict[str, Any]:
    """Each workload's median figures with and without the reference, and the median of each
    round's ratio (with / without)."""
    runs = asyncio.run(_run(url, redis_pid, seconds, repeats))
    out: dict[str, Any] = {"seconds_per_run": seconds, "repeats": repeats, "keys": KEYS, "workloads": {}}
    for workload in WORKLOADS:
        on, off = runs[f"{workload}-on"], runs[f"{workload}-off"]
        row: dict[str, Any] = {}
        for field in ("per_s", "redis_us", "process_us"):
            row[field] = {
                "explain": statistics.median(r[field] for r in on),
                "no_explain": statistics.median(r[field] for r in off),
                "ratio": statistics.median(a[field] / b[field] for a, b in zip(on, off, strict=True) if b[field]),
            }
        row["runs"] = {"explain": on, "no_explain": off}
        out["workloads"][workload] = row
    out["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return out


def render(r: dict[str, Any]) -> str:
    """A markdown section for docs/benchmarks.md."""
    lines = [
        "## Explaining divergence: the reference's cost",
        "",
        "The shadow pipeline's own call (`ShadowPipeline.evaluate`) on batches of 256 items built as the decider "
        f"builds them, over {r['keys']:,} keys, on a route that explains its divergence (`explain: true`, the "
        "default: the route's local policy evaluated fleet-wide in Redis beside a stricter global one) and on the same "
        f"route with `explain: false`; {r['seconds_per_run']:g} s per run, median of {r['repeats']} rounds, each "
        "running both in turn (the ratio is the median of each round's). Redis CPU: the redis-server process's "
        "CPU time per comparison; the benchmark's CPU: this process's during the call. `agree`: the same limits "
        "(nothing to explain; a global limit no stricter than the local one needs no reference, so none is "
        "evaluated); `diverge`: a far stricter global limit, every comparison a new rejection that gets a cause "
        f"(the reference evaluated for each). Both processes share the 2 cores; measured {r['date']}.",
        "",
        "| workload | comparisons/s, explain | without | ratio | Redis CPU/comparison, explain | without | ratio "
        "| benchmark CPU/comparison, explain | without | ratio |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, w in r["workloads"].items():
        s, red, cpu = w["per_s"], w["redis_us"], w["process_us"]
        lines.append(
            f"| {name} | {s['explain']:,.0f} | {s['no_explain']:,.0f} | {s['ratio']:.2f}x "
            f"| {red['explain']:.1f} µs | {red['no_explain']:.1f} µs | {red['ratio']:.2f}x "
            f"| {cpu['explain']:.1f} µs | {cpu['no_explain']:.1f} µs | {cpu['ratio']:.2f}x |"
        )
    return "\n".join(lines) + "\n"
