"""``bench.clients``' redis-py path decides like ``RedisLimiter``, so the clients benchmark's A/B
(own RESP client vs redis-py) compares like with like: the same script, the same key,
the same ARGV, the same decoding. Real Redis from ``conftest.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is not an installed package
    sys.path.insert(0, str(ROOT))

from bench.clients import RedisPyLimiter, bench_policy, compare_decisions  # noqa: E402
from limiter import Policy, RedisLimiter  # noqa: E402

T0 = 1_700_000_000_000_000

POLICIES = [
    Policy(average=10, period=1.0, burst=5, algorithm="token_bucket"),
    Policy(average=10, period=1.0, burst=5, algorithm="gcra"),
    Policy(average=5, period=1.0, algorithm="fixed_window"),
    Policy(average=5, period=1.0, algorithm="sliding_window"),
    Policy(average=5, period=1.0, algorithm="sliding_log"),
    bench_policy(),
]


async def test_same_decisions_one_by_one_and_batched(redis_url):
    own = RedisLimiter.from_url(redis_url, namespace="own")
    rp = RedisPyLimiter.from_url(redis_url, namespace="py", max_connections=2)
    try:
        acc = await compare_decisions(own, rp, POLICIES, n=40, batch=10)
    finally:
        await own.aclose()
        await rp.aclose()
    assert acc["mismatches"] == 0, acc["examples"]
    assert acc["pairs"] == len(POLICIES) * 40 * 2
    assert acc["allowed"] > 0 and acc["denied"] > 0  # both kinds of answer were compared


async def test_same_key_and_stored_state(redis_url):
    """The redis-py path writes ``rl:<namespace>:<key>`` with the same state and TTL."""
    policy = POLICIES[0]
    own = RedisLimiter.from_url(redis_url, namespace="a")
    rp = RedisPyLimiter.from_url(redis_url, namespace="b", max_connections=2)
    try:
        for i, cost in enumerate((1, 3, 2)):
            now = T0 + i * 40_000
            assert await own.check("x", policy, cost, now) == await rp.check("x", policy, cost, now)
    finally:
        await own.aclose()
        await rp.aclose()
    r = redis.Redis.from_url(redis_url)
    try:
        assert sorted(r.keys()) == [b"rl:a:x", b"rl:b:x"]
        assert r.hgetall("rl:a:x") == r.hgetall("rl:b:x")
        assert abs(r.pttl("rl:a:x") - r.pttl("rl:b:x")) < 1_000
    finally:
        r.close()


async def test_redis_py_path_survives_script_flush(redis_url):
    """NOSCRIPT is answered with EVAL, as RedisLimiter does."""
    policy = POLICIES[0]
    rp = RedisPyLimiter.from_url(redis_url, namespace="f", max_connections=2)
    r = redis.Redis.from_url(redis_url)
    try:
        r.script_flush()
        assert (await rp.check("k", policy, 1, T0)).allowed
        r.script_flush()
        got = await rp.check_many([("k", policy, 1, T0), ("j", policy, 5, T0), ("j", policy, 1, T0)])
        assert [d.allowed for d in got] == [True, True, False]  # type: ignore[union-attr]
    finally:
        await rp.aclose()
        r.close()
