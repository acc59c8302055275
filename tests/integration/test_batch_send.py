"""Batched sends: many commands, one write and one future (``NodeConnection.send_many``,
the backends' ``send_many``), and what is built on them: ``RedisLimiter.check_many`` /
``allowed_many``, ``ResilientLimiter.compare_many`` and ``DivergenceStore.add``.

Real Redis (standalone and the 3-master cluster) for the protocol; a scripted loopback
server for the failures a real one will not produce on demand.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis as redis_sync
from hiredis import ReplyError

from control_plane.model.rollout import Divergence
from control_plane.store import DivergenceStore
from limiter import BackendError, BackendTimeout, BackendUnavailable, Decision, Policy, RedisLimiter
from limiter.resilience import CircuitBreaker, ResilientLimiter
from limiter.resp import Endpoint, NodeConnection, encode_command

T0 = 1_700_000_000_000_000
POLICY = Policy(average=10, period=1.0, burst=5, algorithm="token_bucket")


def _endpoint(url: str) -> Endpoint:
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    return Endpoint(host=host, port=int(port))


@contextlib.asynccontextmanager
async def _conn(endpoint: Endpoint, **kw):
    c = NodeConnection(endpoint, **kw)
    await c.connect()
    try:
        yield c
    finally:
        c.close()


# --------------------------------------------------------------------------- #
# NodeConnection.send_many on a real server
# --------------------------------------------------------------------------- #


async def test_send_many_keeps_order_with_single_sends(redis_url):
    async with _conn(_endpoint(redis_url)) as c:
        first = c.send(encode_command("INCR", "n"))
        batch = c.send_many([encode_command("INCR", "n") for _ in range(5)])
        last = c.send(encode_command("INCR", "n"))
        assert await first == 1
        assert await batch == [2, 3, 4, 5, 6]
        assert await last == 7
        assert await c.send_many([]) == []


async def test_send_many_gives_error_replies_in_place(redis_url):
    redis_sync.Redis.from_url(redis_url).hset("h", "f", "v")
    async with _conn(_endpoint(redis_url)) as c:
        out = await c.send_many([encode_command("INCR", "a"), encode_command("INCR", "h"), encode_command("INCR", "a")])
        assert out[0] == 1 and out[2] == 2
        assert isinstance(out[1], ReplyError) and "WRONGTYPE" in str(out[1])


async def test_a_cancelled_batch_does_not_shift_later_replies(redis_url):
    async with _conn(_endpoint(redis_url)) as c:
        batch = c.send_many([encode_command("ECHO", f"b{i}") for i in range(3)])
        batch.cancel()
        assert await c.send(encode_command("ECHO", "after")) == b"after"
        assert await c.send_many([encode_command("ECHO", "x"), encode_command("ECHO", "y")]) == [b"x", b"y"]


# --------------------------------------------------------------------------- #
# failures: a scripted loopback server
# --------------------------------------------------------------------------- #


@contextlib.asynccontextmanager
async def _scripted(on_command):
    """A loopback server that answers the connection handshake (+OK), then hands every
    later command count to ``on_command(writer, n_so_far)``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen = 0
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                if not line.startswith(b"*"):
                    continue
                for _ in range(int(line[1:]) * 2):  # $len + data per argument
                    await reader.readline()
                seen += 1
                if seen == 1:
                    writer.write(b"+OK\r\n")  # CLIENT SETNAME
                    continue
                await on_command(writer, seen - 1)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Endpoint(host="127.0.0.1", port=port)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_connection_lost_mid_batch_keeps_the_replies_that_arrived():
    async def three_then_close(writer, n):
        if n <= 3:
            writer.write(b":%d\r\n" % n)
        if n == 3:
            await writer.drain()
            writer.close()

    async with _scripted(three_then_close) as ep, _conn(ep) as c:
        single = c.send(encode_command("PING"))
        batch = c.send_many([encode_command("PING") for _ in range(5)])
        assert await single == 1
        out = await asyncio.wait_for(batch, 5)
        # Redis ran the first two: their replies stand; the other three failed in place
        assert out[:2] == [2, 3]
        assert len(out) == 5 and all(isinstance(e, BackendUnavailable) for e in out[2:])
        assert c.closed
        # a batch sent on the dead connection fails as a whole
        with pytest.raises(BackendUnavailable):
            await c.send_many([encode_command("PING")])


async def test_check_many_keeps_the_decisions_redis_made_before_the_connection_dropped():
    """Scripts Redis already ran consumed their tokens: those items are decisions, only
    the unanswered ones are errors (so enforcement does not send them to the failure policy).
    Each request under its own policy: one call each (a run of one), the reply of a call
    for many with one answer."""
    reply = b"*1\r\n*5\r\n:1\r\n:4\r\n:5\r\n:0\r\n:0\r\n"

    async def two_then_close(writer, n):
        if n <= 2:
            writer.write(reply)
        if n == 2:
            await writer.drain()
            writer.close()

    async with _scripted(two_then_close) as ep:
        from limiter.resp import StandaloneBackend

        rl = RedisLimiter(StandaloneBackend(ep, connections=1))
        try:
            await rl.backend.nodes[0].connection()
            policies = [Policy(average=10, period=1.0, burst=5 + i) for i in range(4)]
            out = await asyncio.wait_for(rl.check_many([(f"k{i}", policies[i], 1, T0) for i in range(4)]), 5)
            assert [type(x).__name__ for x in out] == [
                "Decision",
                "Decision",
                "BackendUnavailable",
                "BackendUnavailable",
            ]
            assert out[0].allowed and out[0].remaining == 4
        finally:
            await rl.aclose()


async def test_replies_trickling_in_one_by_one_reach_the_right_futures():
    async def numbered(writer, n):
        writer.write(b":%d\r\n" % n)
        await writer.drain()
        await asyncio.sleep(0.01)  # each reply in its own segment: many data_received calls

    async with _scripted(numbered) as ep, _conn(ep) as c:
        first = c.send(encode_command("PING"))
        batch = c.send_many([encode_command("PING") for _ in range(3)])
        last = c.send(encode_command("PING"))
        again = c.send_many([encode_command("PING") for _ in range(2)])
        assert await asyncio.wait_for(asyncio.gather(first, batch, last, again), 5) == [1, [2, 3, 4], 5, [6, 7]]


async def test_a_stalled_server_times_the_batch_out():
    async def never(writer, n):
        return None

    async with _scripted(never) as ep, _conn(ep, command_timeout=0.2) as c:
        batch = c.send_many([encode_command("PING") for _ in range(3)])
        with pytest.raises(BackendTimeout):
            await asyncio.wait_for(batch, 5)


# --------------------------------------------------------------------------- #
# backends and the limiter
# --------------------------------------------------------------------------- #


async def test_cluster_send_many_groups_by_master_and_keeps_positions(redis_cluster):
    for host, port in redis_cluster.nodes:
        redis_sync.Redis(host=host, port=port).flushall()
    rl = RedisLimiter.from_url(redis_cluster.url, namespace="bs")
    try:
        await rl.ping()  # slot table and a connection to every master
        keys = [f"k{i}".encode() for i in range(60)]
        groups = rl.backend.send_many(keys, [encode_command("INCR", k) for k in keys])
        assert len(groups) == 3 and all(f is not None for f, _ in groups)
        assert sorted(i for _, idx in groups for i in idx) == list(range(60))
        for fut, idx in groups:
            assert await fut == [1] * len(idx)
        # a master whose connection is down: its positions come back for one-by-one calls
        down = rl.backend.node_for_slot(redis_sync.cluster.key_slot(keys[0]))
        down.close()
        groups = rl.backend.send_many(keys, [encode_command("INCR", k) for k in keys])
        loose = [idx for f, idx in groups if f is None]
        assert len(groups) == 3 and len(loose) == 1 and 0 in loose[0]
        assert all(rl.backend.node_for_slot(redis_sync.cluster.key_slot(keys[i])) is down for i in loose[0])
        for fut, _ in groups:
            if fut is not None:
                await fut
    finally:
        await rl.aclose()


async def test_check_many_and_allowed_many_match_one_by_one_checks(any_redis_url):
    keys = [f"u{i % 7}" for i in range(40)]  # repeated keys: order within a key matters
    requests = [(k, POLICY, 1 + i % 2, T0 + i) for i, k in enumerate(keys)]
    async with contextlib.AsyncExitStack() as stack:
        one, many, verdicts = (RedisLimiter.from_url(any_redis_url, namespace=ns) for ns in ("one", "many", "verdicts"))
        for rl in (one, many, verdicts):
            stack.push_async_callback(rl.aclose)
        expected = [await one.check(k, p, c, n) for k, p, c, n in requests]
        got = await many.check_many(requests)
        assert got == expected and all(isinstance(d, Decision) for d in got)
        assert await verdicts.allowed_many(requests) == [d.allowed for d in expected]
        assert any(not d.allowed for d in expected) and any(d.allowed for d in expected)


async def test_allowed_many_answers_the_items_asked_for_in_full(any_redis_url):
    """``decisions``: those items' whole Decision (what check_many gives), the others' verdicts,
    the same state changes; blocking and unlimited policies answered without Redis alike."""
    keys = [f"u{i % 3}" for i in range(12)]
    requests = [(k, POLICY, 1 + i % 2, T0 + i) for i, k in enumerate(keys)]
    full = {0, 5, 11}
    async with contextlib.AsyncExitStack() as stack:
        one, mixed = (RedisLimiter.from_url(any_redis_url, namespace=ns) for ns in ("one-full", "mixed"))
        for rl in (one, mixed):
            stack.push_async_callback(rl.aclose)
        expected = [await one.check(k, p, c, n) for k, p, c, n in requests]
        got = await mixed.allowed_many(requests, decisions=full)
        assert got == [d if i in full else d.allowed for i, d in enumerate(expected)]
        unlimited = [("x", Policy(average=0), 1, T0), ("y", Policy.blocking(), 1, T0)]
        assert await mixed.allowed_many(unlimited, decisions={1}) == [True, Decision(False, 0, 0, 1_000_000, 1_000_000)]


@pytest.mark.parametrize("call", ["allowed_many", "check_many"])
async def test_a_failing_key_gets_its_error_in_place_and_the_others_their_answers(any_redis_url, call):
    async with contextlib.AsyncExitStack() as stack:
        rl = RedisLimiter.from_url(any_redis_url, namespace=f"bad-{call}")
        stack.push_async_callback(rl.aclose)
        client = (
            redis_sync.RedisCluster.from_url(any_redis_url.replace("redis+cluster", "redis"))
            if "cluster" in any_redis_url
            else redis_sync.Redis.from_url(any_redis_url)
        )
        client.rpush(rl.redis_key("broken"), b"no algorithm keeps a list")  # a key of the wrong type
        out = await getattr(rl, call)([("a", POLICY, 1, T0), ("broken", POLICY, 1, T0), ("a", POLICY, 2, T0)])
        first, last = Decision(True, 4, 5, 0, 100_000), Decision(True, 2, 5, 0, 300_000)
        assert [out[0], out[2]] == ([True, True] if call == "allowed_many" else [first, last])
        assert isinstance(out[1], BackendError) and "WRONGTYPE" in str(out[1])


def _evalsha_calls(client: redis_sync.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.mark.parametrize("time_source", ["local", "redis"])
async def test_a_burst_on_one_server_is_a_call_per_run_of_one_policy(redis_url, time_source):
    """300 requests under one policy: three calls of its script for many keys (MANY_MAX is
    128), decided in order whichever clock: exactly the burst's 200 admitted, then denials."""
    client = redis_sync.Redis.from_url(redis_url)
    slow = Policy(average=1, period=3600.0, burst=200)
    rl = RedisLimiter.from_url(redis_url, namespace=f"runs-{time_source}", time_source=time_source)
    try:
        await rl.load_scripts()
        before = _evalsha_calls(client)
        out = await rl.allowed_many([("one", slow, 1, T0 + i) for i in range(300)])
        assert _evalsha_calls(client) - before == 3
        assert out == [True] * 200 + [False] * 100
    finally:
        await rl.aclose()


async def test_a_burst_after_script_flush_loads_its_scripts_again(redis_url):
    """A script Redis does not know (after a restart, SCRIPT FLUSH) is sent whole once
    (EVAL), then known again: the burst's answers are those of one check per request."""
    client = redis_sync.Redis.from_url(redis_url)
    window = Policy(average=3, period=60.0, algorithm="fixed_window")
    requests = [(f"f{i % 2}", POLICY if i % 3 else window, 1 + i % 2, T0 + i) for i in range(12)]
    requests.insert(5, ("f0", POLICY, 0, T0 + 5))  # a peek: its own script
    one, rl = (
        RedisLimiter.from_url(redis_url, namespace="flush-one"),
        RedisLimiter.from_url(redis_url, namespace="flush"),
    )
    try:
        expected = [await one.check(k, p, c, n) for k, p, c, n in requests]
        client.script_flush()
        assert await rl.check_many(requests) == expected
        assert not await rl.scripts_loaded()  # the others (not used here) are still unknown
        before = _evalsha_calls(client)
        await rl.check_many([(f"g{i}", POLICY, 1, T0) for i in range(3)])
        assert _evalsha_calls(client) - before == 1  # known again: EVALSHA, not EVAL
    finally:
        await one.aclose()
        await rl.aclose()


async def test_compare_many_feeds_the_breaker_and_never_degrades(redis_url):
    redis_sync.Redis.from_url(redis_url).rpush("rl:cmp:broken", b"no algorithm keeps a list")
    rl = RedisLimiter.from_url(redis_url, namespace="cmp")
    breaker = CircuitBreaker(failure_threshold=1, backoff_initial_s=30, backoff_max_s=30)
    res = ResilientLimiter(rl, failure_policy="passThrough", breaker=breaker)
    try:
        assert await res.compare_many([("a", POLICY, 5, T0), ("a", POLICY, 1, T0)]) == [True, False]
        assert breaker.consecutive_failures == 0
        out = await res.compare_many([("a", POLICY, 1, T0), ("broken", POLICY, 1, T0)])
        assert out == [False, None]  # the bucket is empty; the broken key has no verdict
        assert res.backend_errors == 1 and breaker.state.value == "open"
        # breaker open: no verdicts at all, no call to Redis, nothing decided by the policy
        assert await res.compare_many([("a", POLICY, 1, T0 + 10**7)]) == [None]
        assert res.fallback_decisions == 0
    finally:
        await res.aclose()
        await rl.aclose()


async def test_compare_many_gives_whole_decisions_where_asked_failures_still_none(redis_url):
    redis_sync.Redis.from_url(redis_url).rpush("rl:cmpd:broken", b"no algorithm keeps a list")
    rl = RedisLimiter.from_url(redis_url, namespace="cmpd")
    res = ResilientLimiter(rl, failure_policy="passThrough", breaker=CircuitBreaker(failure_threshold=5))
    try:
        out = await res.compare_many([("a", POLICY, 2, T0), ("a", POLICY, 1, T0)], decisions=[0])
        assert out == [Decision(True, POLICY.burst - 2, POLICY.burst, 0, out[0].reset_after_us), True]
        out = await res.compare_many([("broken", POLICY, 1, T0), ("a", POLICY, 1, T0)], decisions=[0, 1])
        assert out[0] is None and isinstance(out[1], Decision) and res.backend_errors == 1
        # a blocking policy is answered without Redis; the others keep their places
        out = await res.compare_many([("z", Policy.blocking(), 1, T0), ("a", POLICY, 1, T0)], decisions=[1])
        assert out[0] is False and isinstance(out[1], Decision)
    finally:
        await res.aclose()
        await rl.aclose()


def test_divergence_add_counts_like_record():
    one, many = DivergenceStore(None, "ns"), DivergenceStore(None, "ns")
    now = 1_700_000_030.0
    for div, n in (
        (Divergence.AGREE, 4),
        (Divergence.LOCAL_ALLOW_DISTRIBUTED_DENY, 2),
        (Divergence.LOCAL_DENY_DISTRIBUTED_ALLOW, 1),
    ):
        for _ in range(n):
            one.record("r", div, distributed_attempt=True, now=now)
    for _ in range(3):
        one.record("r", None, backend_error=True, distributed_attempt=True, now=now)
    many.add("r", agree=4, ladd=2, ldda=1, backend_errors=3, now=now)
    assert many.pending() == one.pending()
    assert list(many.pending().values())[0]["compared"] == 7


@pytest.mark.parametrize("call", ["check", "compare_many"])
async def test_a_cancelled_trial_does_not_wedge_a_half_open_breaker(call):
    """Half-open lets one request through as the trial. If that request is cancelled
    (its caller timed out) it says nothing about Redis: the next request must become
    the trial, or the breaker would stay half-open with nothing ever let through."""

    from limiter.resilience import BreakerState

    hang = asyncio.Event()
    decision = Decision(True, 4, 5, 0, 0)

    class Redis:
        async def check(self, key, policy, cost, now_us):
            await hang.wait()
            return decision

        async def allowed_many(self, requests):
            await hang.wait()
            return [True] * len(requests)

        async def ping(self):
            await asyncio.Event().wait()

    now = [100.0]
    breaker = CircuitBreaker(failure_threshold=1, backoff_initial_s=0.01, backoff_max_s=0.01, clock=lambda: now[0])
    breaker.record_failure("down")
    assert breaker.state is BreakerState.OPEN
    now[0] += 0.03  # the probe is due: the next request half-opens the breaker
    res = ResilientLimiter(Redis(), failure_policy="passThrough", breaker=breaker)

    async def one():
        if call == "check":
            out = await res.check("k", POLICY, 1, T0)
            return out.source
        return await res.compare_many([("k", POLICY, 1, T0)])

    trial = asyncio.ensure_future(one())
    await asyncio.sleep(0.01)
    assert breaker.state is BreakerState.HALF_OPEN
    trial.cancel()
    with pytest.raises(asyncio.CancelledError):
        await trial
    hang.set()
    assert await asyncio.wait_for(one(), 5) == ("distributed" if call == "check" else [True])
    assert breaker.state is BreakerState.CLOSED
