"""Redis failures on a real server: SCRIPT FLUSH mid-run, Redis killed mid-run under each
failure policy, Redis back: the breaker closes and decisions are distributed again."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis as redis_sync

from limiter import LocalLimiter, Policy, RedisLimiter
from limiter.embedded import EmbeddedRedis
from limiter.resilience import BreakerState, CircuitBreaker, FailurePolicy, FleetMembership, ResilientLimiter

POLICY = Policy(average=10, period=1.0, burst=6)


@pytest.fixture
def private_redis():
    server = EmbeddedRedis().start()
    yield server
    server.stop()


def fast_breaker():
    return CircuitBreaker(failure_threshold=2, backoff_initial_s=0.1, backoff_max_s=0.4)


async def test_script_flush_mid_run_causes_no_error(redis_url):
    rl = RedisLimiter.from_url(redis_url, namespace="flush")
    admin = redis_sync.Redis.from_url(redis_url)
    errors: list[BaseException] = []
    decided = 0
    policy = Policy(average=1e6, burst=10**6)

    async def worker(i):
        nonlocal decided
        for n in range(200):
            try:
                await rl.check(f"k{i}", policy)
                decided += 1
            except Exception as exc:  # noqa: BLE001 - any error fails the test below
                errors.append(exc)
            if n % 50 == 0:
                await asyncio.sleep(0)

    async def flusher():
        for _ in range(5):
            await asyncio.sleep(0.01)
            await asyncio.to_thread(admin.script_flush)

    await asyncio.gather(flusher(), *[worker(i) for i in range(20)])
    await rl.aclose()
    assert errors == []
    assert decided == 20 * 200


async def _until(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.parametrize("policy_name", ["passThrough", "failClosed", "inMemoryFallback"])
async def test_redis_down_then_back(private_redis, policy_name):
    rl = RedisLimiter.from_url(private_redis.url, namespace="outage", connect_timeout=0.3, command_timeout=0.3)
    limiter = ResilientLimiter(rl, failure_policy=policy_name, failure_code=503, breaker=fast_breaker())
    out = await limiter.check("client", POLICY)
    assert out.source == "distributed" and out.allowed

    private_redis.kill()
    outcomes = [await limiter.check("client", POLICY) for _ in range(10)]
    assert limiter.breaker.state is BreakerState.OPEN
    assert limiter.breaker.snapshot().last_error
    fp = FailurePolicy.parse(policy_name)
    if fp is FailurePolicy.PASS_THROUGH:
        assert all(o.allowed and o.source == "pass_through" for o in outcomes)
    elif fp is FailurePolicy.FAIL_CLOSED:
        assert all(not o.allowed and o.source == "fail_closed" and o.status_code == 503 for o in outcomes)
        assert all(o.decision.retry_after_us >= 1_000_000 for o in outcomes)
    else:
        assert all(o.source == "fallback" for o in outcomes)
        # the local bucket enforces the policy: burst 6, so 6 of the 10 pass
        assert sum(o.allowed for o in outcomes) == POLICY.burst

    private_redis.start()

    async def distributed_again():
        o = await limiter.check("client", POLICY)
        return o.source == "distributed"

    assert await _until(distributed_again), limiter.breaker.snapshot()
    assert limiter.breaker.state is BreakerState.CLOSED
    await limiter.aclose()
    await rl.aclose()


async def test_breaker_open_does_not_wait_for_redis(private_redis):
    rl = RedisLimiter.from_url(private_redis.url, namespace="fast", connect_timeout=0.3, command_timeout=0.3)
    limiter = ResilientLimiter(
        rl,
        failure_policy="passThrough",
        breaker=CircuitBreaker(failure_threshold=1, backoff_initial_s=30, backoff_max_s=30),
    )
    await limiter.check("k", POLICY)
    private_redis.kill()
    await limiter.check("k", POLICY)  # this one pays the failure
    assert limiter.breaker.state is BreakerState.OPEN
    calls = 0
    real_check = rl.check

    async def counting_check(*args, **kwargs):
        nonlocal calls
        calls += 1
        return await real_check(*args, **kwargs)

    rl.check = counting_check  # type: ignore[method-assign]
    for _ in range(100):
        assert (await limiter.check("k", POLICY)).source == "pass_through"
    assert calls == 0  # while open, Redis is not even asked
    await limiter.aclose()
    await rl.aclose()


async def test_fallback_shares_the_limit_across_live_instances(private_redis):
    policy = Policy(average=40, period=1.0, burst=40)
    replicas = []
    for i in range(4):
        rl = RedisLimiter.from_url(private_redis.url, namespace="fleet", connect_timeout=0.3, command_timeout=0.3)
        fleet = FleetMembership(rl, instance_id=f"replica-{i}", interval_s=0.2)
        lim = ResilientLimiter(
            rl, failure_policy="inMemoryFallback", breaker=fast_breaker(), fallback=LocalLimiter(), fleet=fleet
        )
        await lim.start()
        replicas.append(lim)
    for lim in replicas:
        await lim.fleet.beat()
    assert [lim.live_instances for lim in replicas] == [4, 4, 4, 4]

    private_redis.kill()
    now = time.time_ns() // 1000
    admitted = 0
    for lim in replicas:
        for _ in range(40):
            o = await lim.check("client", policy, 1, now)
            assert o.source == "fallback"
            admitted += o.allowed
    # each replica enforces burst/4 = 10 while Redis is down: the fleet still admits 40, not 160
    assert admitted == 40
    for lim in replicas:
        await lim.aclose()
        await lim.redis.aclose()


async def test_heartbeats_expire_stale_instances(redis_url):
    rl = RedisLimiter.from_url(redis_url, namespace=f"hb-{time.time_ns()}")
    wall = [1_700_000_000.0]
    a = FleetMembership(rl, instance_id="a", interval_s=0.1, stale_after_s=0.3, wall_clock=lambda: wall[0])
    b = FleetMembership(rl, instance_id="b", interval_s=0.1, stale_after_s=0.3, wall_clock=lambda: wall[0])
    await a.beat()
    assert await b.beat() == 2 and b.last_beat_ok == 1_700_000_000.0
    wall[0] += 0.2
    assert await a.beat() == 2  # b beat 0.2 s ago: still live
    wall[0] += 0.2
    assert await a.beat() == 1  # b stopped beating 0.4 s ago
    assert a.members == ["a"]
    await a.leave()
    await rl.aclose()


async def test_a_replica_that_does_not_join_reads_the_fleet_without_counting(redis_url):
    """A kill-switched replica (joins=False) sees the fleet but is not one of its live
    instances: the others' fallback share is not shrunk by a replica that takes none."""
    rl = RedisLimiter.from_url(redis_url, namespace=f"hb-{time.time_ns()}")
    members = [FleetMembership(rl, instance_id=name, interval_s=0.1) for name in ("a", "b")]
    switched_off = FleetMembership(rl, instance_id="off", interval_s=0.1, joins=False)
    for m in members:
        await m.beat()
    assert await switched_off.beat() == 2 and switched_off.members == ["a", "b"]
    assert await members[0].beat() == 2  # not 3
    await rl.aclose()


async def test_reservations_with_redis_down_and_back(private_redis):
    """A reserve with Redis killed is answered by the failure policy and booked nowhere; its
    settle is an error, nothing settled; Redis back, a settle of one never booked charges it in
    full, once."""
    from limiter.reservations import Terms

    terms = Terms(ttl_us=60_000_000, keep_us=60_000_000)
    budget = Policy(average=1000, period=60.0, burst=1000)
    rl = RedisLimiter.from_url(private_redis.url, namespace="resdown", connect_timeout=0.3, command_timeout=0.3)
    limiter = ResilientLimiter(rl, failure_policy="passThrough", breaker=fast_breaker())
    out, booked = await limiter.reserve("t", budget, 300, rid="a", terms=terms)
    assert out.source == "distributed" and booked is not None and booked.reserved
    assert (await limiter.settle("t", budget, 100, rid="a", terms=terms)).decision.remaining == 900

    private_redis.kill()
    out, booked = await limiter.reserve("t", budget, 300, rid="b", terms=terms)
    assert out.source == "pass_through" and out.allowed and booked is None and out.error
    failed = [await limiter.settle("t", budget, 200, rid="b", terms=terms, unbooked=True) for _ in range(3)]
    assert all(isinstance(f, str) and f for f in failed) and limiter.breaker.state is BreakerState.OPEN

    private_redis.start()
    assert await _until(lambda: _settles(limiter, budget, terms))
    again = await limiter.settle("t", budget, 200, rid="b", terms=terms, unbooked=True)
    # the restarted Redis started empty: 1000 - 200, charged once
    assert again.status == "again" and again.decision.remaining == 800
    await rl.aclose()


async def _settles(limiter, budget, terms):
    out = await limiter.settle("t", budget, 200, rid="b", terms=terms, unbooked=True)
    return not isinstance(out, str)
