"""The state formats on real Redis: the compact form of a window key (one number), the hash every
release reads, a key changing form as replicas of both formats write it, and the fleet's rule
for which form is written (docs/state-format.md)."""

from __future__ import annotations

import itertools

import pytest
import redis

from limiter import Algorithm, Policy, RedisLimiter
from limiter.algorithms import decide, peek
from limiter.resilience import FleetMembership

T0 = 1_764_412_345_678_901
_ids = itertools.count()

FIXED = Policy(average=100, period=60.0, algorithm=Algorithm.FIXED_WINDOW)
SLIDING = Policy(average=100, period=60.0, algorithm=Algorithm.SLIDING_WINDOW)


async def test_a_window_key_is_one_integer_in_the_compact_form(redis_url):
    client = redis.Redis.from_url(redis_url)
    rl = RedisLimiter.from_url(redis_url, namespace="fmt", state_format=2)
    try:
        for policy in (FIXED, SLIDING):
            key = f"k{next(_ids)}"
            state = None
            for step, cost in ((0, 3), (60_000_000, 2), (1, 4)):  # into the next window: both counts
                d = await rl.check(key, policy, cost, T0 + step)
                pd, state = decide(state, T0 + step, policy, cost)
                assert d == pd
            rkey = rl.redis_key(key)
            assert client.type(rkey) == b"string"
            assert client.object("encoding", rkey) == b"int"
            ws = (T0 + 60_000_001) // 60_000_000 * 60_000_000
            want = b"6%d0" % (ws // 1000) if policy is FIXED else b"36%d1" % (ws // 1000)
            assert client.get(rkey) == want
            assert await rl.raw_state(key, policy) == state
            assert 0 < client.ttl(rkey) <= policy.ttl_s + 1  # kept until the state is a new key's
    finally:
        await rl.aclose()
        client.close()


async def test_a_gcra_key_is_its_arrival_time_in_quarter_microseconds_exactly(redis_url):
    client = redis.Redis.from_url(redis_url)
    rl = RedisLimiter.from_url(redis_url, namespace="fmt", state_format=2)
    try:
        policy = Policy(average=3, period=1.0, burst=5, algorithm=Algorithm.GCRA)  # 333,333.33 us apart
        key, state = f"g{next(_ids)}", None
        for step in (0, 1, 7):
            d = await rl.check(key, policy, 1, T0 + step)
            pd, state = decide(state, T0 + step, policy, 1)
            assert d == pd
        rkey = rl.redis_key(key)
        assert client.object("encoding", rkey) == b"int"
        assert int(client.get(rkey)) == -state * 4  # the very double, no rounding (negated: GCRA's sign)
        assert await rl.raw_state(key, policy) == state
        # before 2005 a double has finer steps than a quarter microsecond: the hash keeps it exact
        assert (await rl.check("early", policy, 1, 1_000_000_000_000_001)).allowed
        assert client.type(rl.redis_key("early")) == b"hash"
    finally:
        await rl.aclose()
        client.close()


FORMS = [FIXED, SLIDING, Policy(average=100, period=60.0, algorithm=Algorithm.GCRA)]


@pytest.mark.parametrize("policy", FORMS, ids=lambda p: p.algorithm.value)
async def test_a_key_changes_form_as_each_format_writes_it_and_keeps_its_state_and_ttl(redis_url, policy):
    client = redis.Redis.from_url(redis_url)
    new = RedisLimiter.from_url(redis_url, namespace="fmt", state_format=2)
    old = RedisLimiter.from_url(redis_url, namespace="fmt", state_format=1)
    key = f"k{next(_ids)}"
    rkey = new.redis_key(key)
    try:
        state, now = None, T0
        for i, (rl, kind) in enumerate([(old, b"hash"), (new, b"string"), (old, b"hash"), (new, b"string")]):
            now += 1_000
            d = await rl.check(key, policy, 1, now)
            pd, state = decide(state, now, policy, 1)
            assert d == pd and d.remaining == 99 - i
            assert client.type(rkey) == kind
            assert client.ttl(rkey) > 0
        # a peek reads either form and writes nothing
        before = client.get(rkey)
        assert (await old.check(key, policy, 0, now)).remaining == 96
        assert client.get(rkey) == before
    finally:
        await new.aclose()
        await old.aclose()
        client.close()


async def test_a_window_that_is_no_whole_number_of_milliseconds_stays_a_hash(redis_url):
    client = redis.Redis.from_url(redis_url)
    rl = RedisLimiter.from_url(redis_url, namespace="fmt", state_format=2)
    try:
        policy = Policy(average=10, period=0.0015, algorithm=Algorithm.FIXED_WINDOW)
        now = T0 - T0 % 1500 + 500  # a window starting between two milliseconds
        assert (await rl.check("odd", policy, 1, now)).allowed
        assert client.type(rl.redis_key("odd")) == b"hash"
    finally:
        await rl.aclose()
        client.close()


async def _member(url: str, iid: str, setting: str = "auto") -> tuple[RedisLimiter, FleetMembership]:
    rl = RedisLimiter.from_url(url, namespace="fleetfmt", state_format=2 if setting == "2" else 1)
    return rl, FleetMembership(rl, instance_id=iid, interval_s=0.2, state_format=setting)


async def test_the_compact_form_is_written_only_while_every_live_replica_reads_it(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.delete("rl:fleetfmt:fleet", "rl:fleetfmt:fleet:reads")
    a_rl, a = await _member(redis_url, "new-a")
    b_rl, b = await _member(redis_url, "new-b")
    pinned_rl, pinned = await _member(redis_url, "pinned", "1")
    try:
        # a new deployment: every member reads the compact form
        await a.beat()
        assert a.all_read_compact is True and a_rl.state_format == 2
        # a replica of the previous release joins: its heartbeat has no record of what it reads
        old_ms = int(a.wall_clock() * 1000)
        client.zadd("rl:fleetfmt:fleet", {"old-release": old_ms})
        await a.beat()
        await b.beat()
        assert a.all_read_compact is b.all_read_compact is False
        assert a_rl.state_format == b_rl.state_format == 1
        key = f"k{next(_ids)}"
        assert (await a_rl.check(key, FIXED, 1, T0)).allowed
        assert client.type(a_rl.redis_key(key)) == b"hash"  # what the old replica reads
        # it leaves (its heartbeat goes stale): the compact form again, from the next beat
        client.zadd("rl:fleetfmt:fleet", {"old-release": old_ms - 60_000})
        await a.beat()
        assert a.all_read_compact is True and a_rl.state_format == 2
        assert (await a_rl.check(key, FIXED, 1, T0 + 1)).allowed
        assert client.type(a_rl.redis_key(key)) == b"string"
        # a pinned setting is left alone, whatever the fleet
        await pinned.beat()
        assert pinned.all_read_compact is True and pinned_rl.state_format == 1
        # members gone are forgotten from the record of what each reads
        await b.leave()
        await a.beat()
        assert set(client.hkeys("rl:fleetfmt:fleet:reads")) == {b"new-a", b"pinned"}
    finally:
        for rl in (a_rl, b_rl, pinned_rl):
            await rl.aclose()
        client.close()


def test_a_setting_that_is_no_format_is_refused_by_name():
    rl = RedisLimiter.from_url("redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match="state_format"):
        FleetMembership(rl, state_format="3")
    with pytest.raises(ValueError, match="state_format"):
        rl.set_state_format(3)


async def test_a_record_left_by_a_process_gone_does_not_vouch_for_the_one_beating_under_its_id(redis_url):
    """A replica of this release crashes (no leave) and one of the previous release starts under
    the same instance id: its beats move the id's score past the record's stamp, so the record
    no longer counts and the hash is written again."""
    client = redis.Redis.from_url(redis_url)
    client.delete("rl:fleetfmt:fleet", "rl:fleetfmt:fleet:reads")
    a_rl, a = await _member(redis_url, "new-a")
    crashed_rl, crashed = await _member(redis_url, "worker-1")
    try:
        await crashed.beat()
        await a.beat()
        assert a.all_read_compact is True and a_rl.state_format == 2
        stamp = int(client.hget("rl:fleetfmt:fleet:reads", "worker-1").split()[-1])
        # the previous release beats as worker-1, two beats (4 s) after the crashed one's last
        client.zadd("rl:fleetfmt:fleet", {"worker-1": stamp + 4_000})
        await a.beat()
        assert a.all_read_compact is False and a_rl.state_format == 1
    finally:
        await a_rl.aclose()
        await crashed_rl.aclose()
        client.close()


async def test_a_replica_that_cannot_read_the_fleet_goes_back_to_the_hash(redis_url):
    now = [1_000.0]
    rl = RedisLimiter.from_url(redis_url, namespace="fleetfmt-down")
    fleet = FleetMembership(rl, instance_id="lonely", interval_s=2.0, wall_clock=lambda: now[0])
    try:
        await fleet.beat()
        assert rl.state_format == 2
        now[0] += 3.0  # a beat fails: within stale_after_s (6 s) the last reading stands
        fleet._fleet_unread()
        assert rl.state_format == 2
        now[0] += 4.0  # 7 s without a reading: an older replica may have joined meanwhile
        fleet._fleet_unread()
        assert rl.state_format == 1 and fleet.all_read_compact is None
    finally:
        await rl.aclose()


async def test_a_rule_whose_algorithm_changes_reads_the_other_algorithms_key_as_no_key(redis_url):
    """As with the hashes (whose fields differ), a key the route's former algorithm wrote in the
    compact form is no state for the new one: a fresh key's answer, no error, and the key
    rewritten in the new algorithm's form."""
    client = redis.Redis.from_url(redis_url)
    rl = RedisLimiter.from_url(redis_url, namespace="fmt", state_format=2)
    await _switch_algorithms(rl, client)


async def test_in_the_hash_a_window_reads_the_other_windows_fields_as_no_state(redis_url):
    """Format 1: the fixed and the sliding window share the field ``w``; each reads a hash
    without its own count as no state (it used to fail on the missing count)."""
    client = redis.Redis.from_url(redis_url)
    rl = RedisLimiter.from_url(redis_url, namespace="fmt1", state_format=1)
    try:
        for i, alg in enumerate(["fixed_window", "sliding_window", "fixed_window"]):
            policy = Policy(average=100, period=60.0, algorithm=alg)
            key = "shared"
            d = await rl.check(key, policy, 3, T0 + i)
            assert d.allowed, (alg, d)
            if i < 2:
                assert d.remaining == 97, (alg, d)
    finally:
        await rl.aclose()
        client.close()


async def _switch_algorithms(rl: RedisLimiter, client: redis.Redis) -> None:
    key = f"switch{next(_ids)}"
    rkey = rl.redis_key(key)
    try:
        for i, alg in enumerate(["gcra", "fixed_window", "sliding_window", "token_bucket", "fixed_window", "gcra"]):
            policy = Policy(average=100, period=60.0, algorithm=alg)
            now = T0 + i * 1_000
            if alg != "token_bucket":  # a peek, and the stored state as Python reads it: none yet
                assert await rl.check(key, policy, 0, now) == peek(None, now, policy)
                assert await rl.raw_state(key, policy) is None
            for cost in (3, 2):
                d = await rl.check(key, policy, cost, now)
            assert d.allowed and d.remaining == 95, (alg, d)
            assert client.type(rkey) == (b"hash" if alg == "token_bucket" else b"string"), alg
    finally:
        await rl.aclose()
        client.close()
