"""What-if replay speed: 1,000,000 recorded requests, read from Redis and replayed.

The recording is written the way replicas write it (``Recorder.offer`` + ``flush``, into an
embedded Redis) over 10,000 keys in 10 minutes; then ``Recorder.read`` (XRANGE and parsing)
and ``replay`` under each algorithm are timed separately, best of ``repeats``.

Run: ``python -m bench.whatif [--events 1000000]`` (``python -m bench`` runs it as its ``whatif`` section).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["measure", "render"]

ALGORITHMS = ("token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log")
TARGET_S = 5.0


async def _record(url: str, events: int, now_s: float) -> Any:
    import redis.asyncio as aioredis

    from control_plane.whatif import Recorder

    client = aioredis.Redis.from_url(url)
    rec = Recorder(client, "bench-whatif", budget=10_000_000, minutes=60, queue_size=events + 1, clock=lambda: now_s)
    rng = random.Random(1)
    start_us = int((now_s - 600) * 1_000_000)
    step = 600_000_000 // events
    for i in range(events):
        rec.offer("api", f"client-{rng.randrange(10_000)}", 1, start_us + i * step, "shadow", True)
        if len(rec.queue) >= 50_000:
            await rec.flush()
    await rec.flush()
    return rec


def measure(url: str, events: int = 1_000_000, repeats: int = 3) -> dict[str, Any]:
    from control_plane.whatif import replay
    from limiter.policy import Policy

    now_s = time.time()
    rec = asyncio.run(_record(url, events, now_s))

    async def read() -> tuple[Any, float]:
        import redis.asyncio as aioredis

        rec.client = aioredis.Redis.from_url(url)
        t0 = time.perf_counter()
        by_key, _, _ = await rec.read("api", 12, now_s)
        return by_key, time.perf_counter() - t0

    read_s = []
    by_key: Any = None
    for _ in range(repeats):
        by_key, s = asyncio.run(read())
        read_s.append(s)
    out: dict[str, Any] = {"events": sum(len(v) for v in by_key.values()), "keys": len(by_key), "read_s": min(read_s)}
    out["replay_s"] = {}
    for alg in ALGORITHMS:
        policy = Policy(average=100, period=60, burst=100, algorithm=alg)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            replay(by_key, policy)
            times.append(time.perf_counter() - t0)
        out["replay_s"][alg] = min(times)
    out["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return out


def render(r: dict[str, Any]) -> str:
    lines = [
        "## What-if replay speed",
        "",
        f"{r['events']:,} recorded requests over {r['keys']:,} keys and 10 minutes, written as replicas write them "
        f"into Redis; best of the runs, measured {r['date']}. Read = `Recorder.read` (XRANGE of the minutes and "
        "parsing); replay = `replay` under the algorithm (what `POST /v1/whatif` does twice: candidate and current).",
        "",
        "| algorithm | read | replay | read + replay | target <= 5 s |",
        "|---|--:|--:|--:|---|",
    ]
    for alg, s in r["replay_s"].items():
        total = r["read_s"] + s
        met = "met" if total <= TARGET_S else "**not met**"
        lines.append(f"| {alg} | {r['read_s']:.2f} s | {s:.2f} s | {total:.2f} s | {met} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--out", default="bench/results/whatif.json")
    args = ap.parse_args(argv)
    from limiter.embedded import EmbeddedRedis

    server = EmbeddedRedis().start()
    try:
        results = measure(server.url, args.events)
    finally:
        server.stop()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
