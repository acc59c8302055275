"""Deadlines in the limiter: a reply not in time is DeadlineExceeded without cancelling what
is under way, and the resilient limiter answers by its failure policy (``redis_timeout``, the
breaker told) or at once when too little time is left (``no_time``, the breaker not told)."""

from __future__ import annotations

import asyncio

import pytest

from limiter import LocalLimiter, Policy
from limiter.errors import DeadlineExceeded
from limiter.policy import make_decision
from limiter.redis_limiter import within
from limiter.resilience import MIN_TRY_S, ResilientLimiter

P = Policy(average=10, period=1, burst=10)


async def test_a_reply_future_not_done_in_time_fails_and_a_late_reply_is_dropped() -> None:
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    with pytest.raises(DeadlineExceeded, match="within 10.0 ms"):
        await within(fut, 0.01)
    assert fut.done() and isinstance(fut.exception(), DeadlineExceeded)  # the connection skips done futures
    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    done.set_result(7)
    assert await within(done, 0.01) == 7


async def test_a_slow_call_is_left_to_finish_not_cancelled() -> None:
    finished = asyncio.Event()

    async def slow() -> int:
        await asyncio.sleep(0.05)
        finished.set()
        return 1

    with pytest.raises(DeadlineExceeded):
        await within(slow(), 0.01)
    await asyncio.wait_for(finished.wait(), 1)  # it went on


class _SlowRedis:
    """A RedisLimiter stand-in whose answers take ``delay_s``."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.calls = 0

    async def check(self, key, policy, cost=1, now_us=None, *, timeout_s=None):  # noqa: ANN001, ANN201
        self.calls += 1
        return await within(asyncio.sleep(self.delay_s, make_decision(True, 1, 10, 0, 0)), timeout_s or 9.0)

    async def check_many(self, requests, *, timeout_s=None):  # noqa: ANN001, ANN201
        self.calls += 1
        try:
            await within(asyncio.sleep(self.delay_s), timeout_s or 9.0)
        except DeadlineExceeded as exc:
            return [exc for _ in requests]
        return [make_decision(True, 1, 10, 0, 0) for _ in requests]

    async def allowed_many(self, requests, *, timeout_s=None):  # noqa: ANN001, ANN201
        return [
            d if isinstance(d, DeadlineExceeded) else d.allowed
            for d in await self.check_many(requests, timeout_s=timeout_s)
        ]


async def test_redis_not_in_time_is_answered_by_the_failure_policy_and_the_breaker_learns() -> None:
    rl = ResilientLimiter(_SlowRedis(0.2), fallback=LocalLimiter())  # type: ignore[arg-type]
    out = await rl.check("k", P, 1, timeout_s=0.01)
    assert (out.source, out.deadline, out.allowed) == ("fallback", "redis_timeout", True)
    assert rl.breaker.snapshot().consecutive_failures == 1
    many = await rl.check_many([("a", P, 1, None), ("b", P, 1, None)], timeout_s=0.01)
    assert [(o.source, o.deadline) for o in many] == [("fallback", "redis_timeout")] * 2
    assert rl.breaker.snapshot().consecutive_failures == 2
    assert await rl.compare_many([("a", P, 1, None)], timeout_s=0.01) == [None]


async def test_too_little_time_is_answered_at_once_without_asking_redis_or_blaming_it() -> None:
    redis = _SlowRedis(0.0)
    rl = ResilientLimiter(redis, fallback=LocalLimiter())  # type: ignore[arg-type]
    out = await rl.check("k", P, 1, timeout_s=MIN_TRY_S / 2)
    assert (out.source, out.deadline) == ("fallback", "no_time")
    many = await rl.check_many([("a", P, 1, None)], timeout_s=-0.5)
    assert [o.deadline for o in many] == ["no_time"]
    assert redis.calls == 0 and rl.breaker.snapshot().consecutive_failures == 0
    ok = await rl.check("k", P, 1, timeout_s=1.0)
    assert (ok.source, ok.deadline) == ("distributed", None)
