"""The ``shadowlimit`` command."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time


def _limiter_demo(args: argparse.Namespace) -> int:
    """Show the migration problem: N replicas with local buckets admit N times the limit."""
    from limiter import LocalLimiter, Policy, RedisLimiter
    from limiter.embedded import EmbeddedRedis

    url = os.environ.get("RATE_LIMIT_REDIS_URL")
    server = None
    if not url:
        server = EmbeddedRedis().start()
        url = server.url
        print(f"embedded redis-server started at {url}")
    policy = Policy(average=100, period=1.0, burst=50)
    replicas = [LocalLimiter() for _ in range(args.replicas)]

    async def run() -> tuple[int, int, int, int]:
        rl = RedisLimiter.from_url(url, namespace=f"demo{os.getpid()}")
        local_ok = dist_ok = disagree = total = 0
        t0 = time.time_ns() // 1000
        end = t0 + int(args.seconds * 1_000_000)
        i = 0
        try:
            while (now := time.time_ns() // 1000) < end:
                replica = replicas[i % len(replicas)]
                i += 1
                ld = replica.check("client-1", policy, 1, now)
                dd = await rl.check("client-1", policy, 1, now)
                total += 1
                local_ok += ld.allowed
                dist_ok += dd.allowed
                disagree += ld.allowed != dd.allowed
                await asyncio.sleep(1 / args.rps)
        finally:
            await rl.reset("client-1")
            await rl.aclose()
        return total, local_ok, dist_ok, disagree

    try:
        print(f"policy {policy.describe()}; one client sends ~{args.rps}/s spread over {args.replicas} replicas for {args.seconds:g}s")
        total, local_ok, dist_ok, disagree = asyncio.run(run())
    finally:
        if server is not None:
            server.stop()
    bound = policy.burst + policy.average / policy.period * args.seconds
    print(f"requests sent:                    {total}")
    print(f"admitted by per-replica buckets:  {local_ok}  (limit multiplied by {args.replicas} replicas)")
    print(f"admitted by the global Redis one: {dist_ok}  (bound burst + rate*t = {bound:.0f})")
    print(f"decisions that differ (divergence): {disagree}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shadowlimit", description="Move a fleet from per-replica rate limits to one global Redis-backed limit, safely.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the demo")
    demo.add_argument("--replicas", type=int, default=3)
    demo.add_argument("--rps", type=float, default=300.0)
    demo.add_argument("--seconds", type=float, default=3.0)
    demo.set_defaults(func=_limiter_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
