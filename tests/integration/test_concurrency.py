"""Many processes, one key: the global limit holds under real concurrency.

4 OS processes (multiprocessing, 'spawn') x 50 asyncio tasks each hammer ONE key
through :class:`RedisLimiter` for ~2.5 s, against standalone Redis and against the
3-master cluster. Every process uses its own clock (``now_us=None``), so requests
reach Redis out of timestamp order. The total admitted must stay within what the
policy allows over the elapsed time, and must not be absurdly low either.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

PROCESSES = 4
TASKS = 50
DURATION_S = 2.5  # not close to a whole number of sliding-log windows (1 s)
START_DELAY_S = 0.6
SLACK = 2  # tokens, for clock reads
RATE = 100.0  # per second
BURST = 50


def _warm(_: int) -> int:
    """Import everything once in the worker, and hold it a moment so that every
    worker process gets started."""
    import limiter  # noqa: F401
    import limiter.redis_limiter  # noqa: F401

    time.sleep(0.3)
    return os.getpid()


def _hammer(url: str, key: str, algorithm: str, start_at: float, end_at: float) -> dict:
    """Worker process body: TASKS tasks loop ``check`` on one key until end_at."""
    from limiter import BackendError, Policy, RedisLimiter

    policy = Policy(average=RATE, period=1.0, burst=BURST, algorithm=algorithm)

    async def main() -> dict:
        rl = RedisLimiter.from_url(url, namespace="conc", command_timeout=2.0, connect_timeout=2.0)
        result = {"pid": os.getpid(), "allowed": 0, "denied": 0, "first_us": None, "last_us": None, "errors": []}
        firsts: list[int] = []
        lasts: list[int] = []
        try:
            await rl.ping()  # connect (and load the cluster slot table) before the start
            delay = start_at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)

            async def task() -> None:
                first = None
                last = None
                for _ in range(1_000_000):  # bounded; the deadline ends it much earlier
                    if time.time() >= end_at:
                        break
                    before = time.time_ns() // 1000  # <= the now_us check() reads
                    try:
                        d = await rl.check(key, policy)
                    except BackendError as exc:
                        result["errors"].append(repr(exc))
                        await asyncio.sleep(0.01)
                        continue
                    after = time.time_ns() // 1000  # >= that now_us
                    if first is None:
                        first = before
                    last = after
                    if d.allowed:
                        result["allowed"] += 1
                    else:
                        result["denied"] += 1
                    await asyncio.sleep(0.001)
                if first is not None:
                    firsts.append(first)
                    lasts.append(last)

            await asyncio.gather(*(task() for _ in range(TASKS)))
        finally:
            await rl.aclose()
        result["first_us"] = min(firsts) if firsts else None
        result["last_us"] = max(lasts) if lasts else None
        return result

    return asyncio.run(main())


@pytest.fixture(scope="module")
def pool():
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=PROCESSES, mp_context=ctx) as executor:
        pids = list(executor.map(_warm, range(PROCESSES)))
        assert len(set(pids)) == PROCESSES
        yield executor


@pytest.fixture
def url(every_redis_url):
    """Every connection kind (plain, TLS + ACL, Sentinel, cluster over TLS), flushed."""
    return every_redis_url


def _run(pool, url: str, algorithm: str) -> tuple[int, float, list[dict]]:
    start_at = time.time() + START_DELAY_S
    end_at = start_at + DURATION_S
    key = f"one-key-{algorithm}"
    futures = [pool.submit(_hammer, url, key, algorithm, start_at, end_at) for _ in range(PROCESSES)]
    results = [f.result(timeout=60) for f in futures]
    assert len({r["pid"] for r in results}) == PROCESSES  # really 4 processes
    for r in results:
        assert r["errors"] == [], r["errors"][:3]
        assert r["first_us"] is not None
        # each process really hammered: many more requests than it was admitted
        assert r["allowed"] + r["denied"] > 200
    first = min(r["first_us"] for r in results)
    last = max(r["last_us"] for r in results)
    elapsed_s = (last - first) / 1e6
    assert DURATION_S - 0.2 < elapsed_s < DURATION_S + 2.0
    total = sum(r["allowed"] for r in results)
    return total, elapsed_s, results


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra"])
def test_one_key_many_processes_bucket(pool, url, algorithm):
    total, elapsed_s, results = _run(pool, url, algorithm)
    bound = BURST + RATE * elapsed_s + SLACK
    print(
        f"{algorithm}: admitted {total} of bound {bound:.1f} over {elapsed_s:.3f}s; "
        f"requests {sum(r['allowed'] + r['denied'] for r in results)}"
    )
    assert total <= bound, (total, bound, results)
    assert total >= 0.8 * bound, (total, bound, results)
    # the admissions were shared between the processes
    assert sum(1 for r in results if r["allowed"] > 0) >= 2


def test_one_key_many_processes_sliding_log(pool, url):
    total, elapsed_s, results = _run(pool, url, "sliding_log")
    limit = int(RATE)  # requests in any window of 1 s
    # any `limit + 1` admitted requests span at least one window, so over elapsed_s
    # at most limit * (floor(elapsed / window) + 1) are admitted
    bound = limit * (math.floor(elapsed_s / 1.0) + 1) + SLACK
    print(
        f"sliding_log: admitted {total} of bound {bound} over {elapsed_s:.3f}s; "
        f"requests {sum(r['allowed'] + r['denied'] for r in results)}"
    )
    assert total <= bound, (total, bound, results)
    assert total >= 0.8 * bound, (total, bound, results)
    assert sum(1 for r in results if r["allowed"] > 0) >= 2
