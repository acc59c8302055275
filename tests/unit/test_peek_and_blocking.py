"""Peeks and blocking policies where no Redis answers.

A blocking policy (``Policy.blocking``: envoyproxy/ratelimit's ``requests_per_unit: 0``)
is decided without any store: ``RedisLimiter`` answers it without sending anything (not
even TIME), and ``ResilientLimiter`` denies it whatever its breaker and failure policy
say, without feeding the breaker. A peek (cost 0) that falls back to the in-memory
limiter is that limiter's peek and records nothing.
"""

from __future__ import annotations

import socket

import hiredis
import pytest

from limiter import BackendError, Decision, LocalLimiter, Policy, RedisLimiter
from limiter.algorithms import peek
from limiter.resilience import BreakerState, CircuitBreaker, ResilientLimiter
from limiter.scripts import MANY_MAX, many

T0 = 1_700_000_000_000_000
SEC = 1_000_000
NOW = T0 + 12_345_678
BLOCKING = Policy.blocking(60)
END = 60 * SEC - NOW % (60 * SEC)  # to the end of the current minute
DENIED = Decision(False, 0, 0, END, END)
TB = Policy(average=10, period=1.0, burst=5)


class NoBackend:
    """A backend that fails the test if anything at all is asked of it (but the kind of
    server it talks to: one server, where a burst goes as calls for many keys)."""

    cluster = False

    def __getattr__(self, name):
        raise AssertionError(f"the backend was used: {name}")


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("time_source", ["local", "redis"])
async def test_redis_limiter_answers_a_blocking_policy_without_the_backend(time_source):
    rl = RedisLimiter(NoBackend(), time_source=time_source, clock=lambda: NOW)  # type: ignore[arg-type]
    for cost in (1, 3, 10**6, 0):
        assert await rl.check("k", BLOCKING, cost) == DENIED  # the local clock, never TIME
        assert await rl.check("k", BLOCKING, cost, NOW) == DENIED
    batch = [
        ("a", BLOCKING, 1, None),
        ("b", Policy.unlimited_policy(), 1, NOW),
        ("c", BLOCKING, 0, NOW),
        ("d", BLOCKING, 2, NOW),
    ]
    assert await rl.check_many(batch) == [DENIED, Decision(True, 1, 1, 0, 0), DENIED, DENIED]
    assert await rl.allowed_many(batch) == [False, True, False, False]
    for bad in (-1, 1.5, "1", None, True, 0.0):
        with pytest.raises(ValueError, match="^cost:"):
            await rl.check("k", BLOCKING, bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="^cost:"):
            await rl.check_many([("k", BLOCKING, bad, None)])  # type: ignore[list-item]


async def test_redis_limiter_on_a_closed_port_still_denies_a_blocking_policy():
    rl = RedisLimiter.from_url(f"redis://127.0.0.1:{closed_port()}/0", connect_timeout=0.3, command_timeout=0.3)
    try:
        assert await rl.check("k", BLOCKING, 1, NOW) == DENIED
        assert await rl.check("k", BLOCKING, 0, NOW) == DENIED
        assert await rl.check_many([("k", BLOCKING, 5, NOW)]) == [DENIED]
        with pytest.raises(BackendError):  # anything that needs Redis does fail here
            await rl.check("k", TB, 1, NOW)
        with pytest.raises(BackendError):
            await rl.check("k", TB, 0, NOW)  # a peek of a real policy needs Redis
    finally:
        await rl.aclose()


def _resilient(policy_name: str) -> tuple[ResilientLimiter, RedisLimiter]:
    rl = RedisLimiter.from_url(f"redis://127.0.0.1:{closed_port()}/0", connect_timeout=0.3, command_timeout=0.3)
    breaker = CircuitBreaker(failure_threshold=1, backoff_initial_s=30, backoff_max_s=30, name=None)
    return ResilientLimiter(rl, failure_policy=policy_name, breaker=breaker, fallback=LocalLimiter()), rl


@pytest.mark.parametrize("policy_name", ["passThrough", "failClosed", "inMemoryFallback"])
async def test_resilient_limiter_denies_a_blocking_policy_whatever_the_breaker(policy_name):
    lim, rl = _resilient(policy_name)
    try:
        out = await lim.check("k", BLOCKING, 1, NOW)
        assert out.decision == DENIED and out.source == "distributed"
        assert lim.breaker.state is BreakerState.CLOSED and lim.breaker.total_failures == 0
        assert lim.backend_errors == 0
        # Redis is down: the breaker opens on a real request
        assert (await lim.check("k", TB, 1, NOW)).source != "distributed"
        assert lim.breaker.state is BreakerState.OPEN
        for cost in (1, 0, 7):
            out = await lim.check("k", BLOCKING, cost, NOW)
            assert out.decision == DENIED and out.source == "distributed"
        outs = await lim.check_many([("k", BLOCKING, 1, NOW), ("j", TB, 1, NOW), ("i", BLOCKING, 0, NOW)])
        assert [o.decision for o in (outs[0], outs[2])] == [DENIED, DENIED]
        assert outs[1].source != "distributed"
        assert await lim.compare_many([("k", BLOCKING, 1, NOW), ("j", TB, 1, NOW)]) == [False, None]
        assert lim.breaker.state is BreakerState.OPEN  # no blocking answer closed it
        # the fallback holds the token-bucket keys it decided, nothing for the blocking ones
        assert set(lim.fallback.keys()) == ({"k", "j"} if policy_name == "inMemoryFallback" else set())
    finally:
        await lim.aclose()
        await rl.aclose()


async def test_resilient_check_many_of_blocking_policies_only_leaves_the_breaker_alone():
    lim, rl = _resilient("passThrough")
    try:
        outs = await lim.check_many([("a", BLOCKING, 1, NOW), ("b", BLOCKING, 2, NOW)])
        assert [o.decision for o in outs] == [DENIED, DENIED]
        assert await lim.compare_many([("a", BLOCKING, 1, NOW)]) == [False]
        assert lim.breaker.state is BreakerState.CLOSED and lim.breaker.total_failures == 0
        with pytest.raises(ValueError, match="^cost:"):
            await lim.check_many([("a", BLOCKING, -1, NOW)])
        with pytest.raises(ValueError, match="^cost:"):
            await lim.compare_many([("a", BLOCKING, 1.5, NOW)])  # type: ignore[list-item]
    finally:
        await lim.aclose()
        await rl.aclose()


async def test_resilient_peek_in_the_fallback_is_the_local_peek_and_records_nothing():
    lim, rl = _resilient("inMemoryFallback")
    try:
        for i in range(3):  # the first fails over, the rest find the breaker open
            out = await lim.check("k", TB, 1, NOW + i)
            assert out.source == "fallback" and out.allowed
        info = lim.fallback.info("k")
        state = lim.fallback.state("k")
        out = await lim.check("k", TB, 0, NOW + 50_000)
        assert out.source == "fallback"
        assert out.decision == peek(state, NOW + 50_000, TB) == Decision(True, 2, 5, 0, out.decision.reset_after_us)
        outs = await lim.check_many([("k", TB, 0, NOW + 60_000), ("new", TB, 0, NOW)])
        assert [o.decision for o in outs] == [peek(state, NOW + 60_000, TB), peek(None, NOW, TB)]
        assert lim.fallback.state("k") == state
        after = lim.fallback.info("k")
        assert after is not None and info is not None
        assert (after.last_seen_us, after.expires_us) == (info.last_seen_us, info.expires_us)
        assert "new" not in lim.fallback
        # only an int 0 is a peek
        for bad in (0.0, False, -1):
            with pytest.raises(ValueError, match="^cost:"):
                await lim.check("k", TB, bad, NOW)  # type: ignore[arg-type]
    finally:
        await lim.aclose()
        await rl.aclose()


@pytest.mark.parametrize(("policy_name", "allowed"), [("passThrough", True), ("failClosed", False)])
async def test_resilient_peek_under_the_other_failure_policies(policy_name, allowed):
    lim, rl = _resilient(policy_name)
    try:
        out = await lim.check("k", TB, 0, NOW)
        assert out.allowed is allowed and out.source != "distributed"
        assert len(lim.fallback) == 0
    finally:
        await lim.aclose()
        await rl.aclose()


def _mixed_burst() -> list[tuple[str, Policy, int, int | None]]:
    """A peek between two decisions under one policy, equal policies that are distinct
    objects, another algorithm and its peek, an unlimited and a blocking policy."""
    window = Policy(average=5, period=60.0, algorithm="fixed_window")
    same_as_tb = Policy(average=10, period=1.0, burst=5)
    return [
        ("a", TB, 1, NOW), ("b", TB, 0, NOW), ("c", TB, 2, None), ("d", same_as_tb, 1, NOW),
        ("e", window, 3, NOW), ("f", Policy.unlimited_policy(), 1, NOW), ("g", window, 0, NOW),
        ("h", BLOCKING, 1, NOW), ("i", TB, 1, NOW),
    ]  # fmt: skip


@pytest.mark.parametrize("time_source", ["local", "redis"])
def test_a_burst_encodes_each_request_as_it_would_be_encoded_alone(time_source):
    """A burst looks a policy's script pieces up once per run of it: the bytes must still be
    each request's own (a peek between two decisions under one policy, equal policies that are
    distinct objects, an unlimited and a blocking one answered without Redis)."""
    rl = RedisLimiter(NoBackend(), time_source=time_source, clock=lambda: NOW)  # type: ignore[arg-type]
    burst = _mixed_burst()
    out: list[object] = [None] * len(burst)
    keys, payloads, _ = rl._payloads(burst, True, out, set())
    alone = []
    for req in burst:
        one: list[object] = [None]
        alone.extend(zip(*rl._payloads([req], True, one, set())[:2]))
    assert list(zip(keys, payloads)) == alone and len(alone) == 7
    sha = [p.split(b"\r\n")[4] for p in payloads]
    assert sha[0] != sha[1] and sha[0] == sha[2] == sha[3] != sha[4]  # the peek's own script; the window's


def _command(payload: bytes) -> list[bytes]:
    reader = hiredis.Reader()
    reader.feed(payload)
    return reader.gets()  # type: ignore[no-any-return]


@pytest.mark.parametrize("time_source", ["local", "redis"])
def test_a_burst_on_one_server_asks_for_each_request_what_its_own_call_would(time_source):
    """On one server a burst goes as calls for many keys, one per run of requests under one
    script and policy: each request's key, policy arguments, time and cost must be those of
    its own call, in the burst's order, under that call's script made for many (a peek's
    between two decisions, a new run past MANY_MAX requests)."""
    rl = RedisLimiter(NoBackend(), time_source=time_source, clock=lambda: NOW)  # type: ignore[arg-type]
    burst = _mixed_burst()
    burst += [(f"m{i}", TB, 1, NOW + i) for i in range(MANY_MAX + 1)]
    out: list[object] = [None] * len(burst)
    runs = rl._encode_runs(burst, True, out, {4})
    asked = []
    for run in runs:
        cmd = _command(run.command(run.prep.many_head))
        n = int(cmd[2])
        assert cmd[0] == b"EVALSHA" and n == len(run.at) and len(cmd) == 7 + 3 * n
        assert cmd[3 + n] == (b"1" if 4 in run.at else b"0")  # in full where one is asked for
        for j, pos in enumerate(run.at):
            asked.append((pos, cmd[1], cmd[3 + j], *cmd[4 + n : 7 + n], *cmd[7 + n + 2 * j : 9 + n + 2 * j]))
    alone = []
    for pos, req in enumerate(burst):
        one: list[object] = [None]
        _, payloads, _ = rl._payloads([req], True, one, set())
        if payloads:
            cmd = _command(payloads[0])  # EVALSHA sha 1 key a1 a2 a3 now cost
            script = next(
                s for s in (rl._prepare(req[1]).script, rl._prepare_peek(req[1]).script) if s.sha.encode() == cmd[1]
            )
            alone.append((pos, many(script).sha.encode(), cmd[3], *cmd[4:9]))
        else:
            assert one[0] == out[pos]  # answered without Redis, alike
    assert asked == alone and len(alone) == len(burst) - 2
    assert [len(r.at) for r in runs] == [1, 1, 2, 1, 1, MANY_MAX, 2]  # "i" starts the last long run
