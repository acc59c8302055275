"""The sliding log's members on real Redis: integers (``<time><n in 3 digits>``) for the first
1,000 entries at one time, ``<time>:<n>`` past them; unique either way; a key the previous release
wrote (every member ``<time>:<n>``) decides exactly as the local limiter does; and the integer
members make a small sorted set smaller than the previous form."""

from __future__ import annotations

import redis

from limiter import LocalLimiter, Policy, RedisLimiter

T0 = 1_700_000_000_000_000
SEC = 1_000_000


def _members(client: redis.Redis, rkey: str) -> list[tuple[bytes, float]]:
    return client.zrange(rkey, 0, -1, withscores=True)


async def test_members_are_integers_then_strings_and_unique(redis_url):
    client = redis.Redis.from_url(redis_url)
    policy = Policy(average=5000, period=1.0, algorithm="sliding_log")
    rl = RedisLimiter.from_url(redis_url, namespace="members")
    try:
        assert (await rl.check("k", policy, 1005, now_us=T0)).allowed
        assert (await rl.check("k", policy, 2, now_us=T0 + 7)).allowed
        members = _members(client, rl.redis_key("k"))
    finally:
        await rl.aclose()
        client.close()
    assert len(members) == len({m for m, _ in members}) == 1007
    at_t0 = sorted(m.decode() for m, s in members if s == T0)
    assert at_t0[:3] == [f"{T0}000", f"{T0}001", f"{T0}002"] and f"{T0}999" in at_t0
    assert sorted(m for m in at_t0 if ":" in m) == sorted(f"{T0}:{n}" for n in range(1000, 1005))
    assert sorted(m.decode() for m, s in members if s == T0 + 7) == [f"{T0 + 7}000", f"{T0 + 7}001"]


async def test_a_key_the_previous_release_wrote_decides_as_the_local_limiter(redis_url):
    """Members ``<time>:<n>`` (the previous release's), then new entries at the same times."""
    client = redis.Redis.from_url(redis_url)
    policy = Policy(average=6, period=1.0, algorithm="sliding_log")
    rl = RedisLimiter.from_url(redis_url, namespace="members-old")
    local = LocalLimiter()
    rkey = rl.redis_key("k")
    try:
        client.zadd(rkey, {f"{T0}:0": T0, f"{T0}:1": T0, f"{T0 + 10}:0": T0 + 10})
        client.expire(rkey, 10)
        for now in (T0, T0, T0 + 10):  # what the previous release had decided
            assert local.check("k", policy, 1, now_us=now).allowed
        steps = [(T0 + 10, 2), (T0 + 20, 1), (T0 + 30, 1), (T0 + SEC + 5, 3), (T0 + SEC + 15, 1)]
        got = [await rl.check("k", policy, cost, now_us=now) for now, cost in steps]
        want = [local.check("k", policy, cost, now_us=now) for now, cost in steps]
        assert got == want
        assert any(d.allowed for d in got) and not all(d.allowed for d in got), got
        members = _members(client, rkey)
        assert len(members) == len({m for m, _ in members})
    finally:
        await rl.aclose()
        client.close()


async def test_the_logs_integer_members_make_a_small_log_smaller(redis_url):
    """The key the script wrote (ten entries) against the same entries with the previous
    release's members: same scores, same encoding, fewer bytes."""
    client = redis.Redis.from_url(redis_url)
    policy = Policy(average=100, period=1.0, algorithm="sliding_log")
    rl = RedisLimiter.from_url(redis_url, namespace="members-size")
    try:
        for i in range(10):
            assert (await rl.check("k", policy, now_us=T0 + 1000 * i)).allowed
        ours = rl.redis_key("k")
        entries = _members(client, ours)
        assert len(entries) == 10 and all(m.decode().isdigit() for m, _ in entries)
        client.zadd("mem:old", {f"{int(score)}:0": score for _, score in entries})
        assert [s for _, s in _members(client, "mem:old")] == [s for _, s in entries]
        assert client.object("encoding", ours) == client.object("encoding", "mem:old") == b"listpack"
        new, old = client.memory_usage(ours, samples=0), client.memory_usage("mem:old", samples=0)
        assert new < old, (new, old)
        client.delete("mem:old")
    finally:
        await rl.aclose()
        client.close()
