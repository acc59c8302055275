"""Peeks (cost 0: the answer a request of cost 1 would get now, nothing spent) agree
bit for bit across the pure ``peek``, both ``LocalLimiter`` paths and the read-only Lua
scripts on real Redis, and change nothing anywhere.

Decisions and peeks are interleaved at random times, older timestamps included; after
every peek the stored state (Redis's and the local limiters') is the one before it.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from importlib import resources

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_strategies import policies

from limiter import Algorithm, Decision, LocalLimiter, Policy, RedisLimiter
from limiter.algorithms import PEEKS, decide, peek
from limiter.resilience import ResilientLimiter
from limiter.resp import ReplyError, encode_command
from limiter.scripts import BOOKED, PEEK, SCRIPT_SETS, SCRIPTS, STATE_FORMATS, load_script, many, policy_args
from limiter.scripts import PEEKS as PEEK_SCRIPTS

T0 = 1_700_000_000_000_000
SEC = 1_000_000
_ids = itertools.count()
ALGS = list(Algorithm)

# one policy per algorithm with a limit of 5
POLICIES = {
    Algorithm.TOKEN_BUCKET: Policy(average=10, period=1.0, burst=5, algorithm="token_bucket"),
    Algorithm.GCRA: Policy(average=10, period=1.0, burst=5, algorithm="gcra"),
    Algorithm.FIXED_WINDOW: Policy(average=5, period=1.0, algorithm="fixed_window"),
    Algorithm.SLIDING_WINDOW: Policy(average=5, period=1.0, algorithm="sliding_window"),
    Algorithm.SLIDING_LOG: Policy(average=5, period=1.0, algorithm="sliding_log"),
}


@st.composite
def operations(draw, policy):
    """("decide", step, cost) moves the clock and spends; ("peek", offset, 0) looks at
    now + offset (older timestamps included) and must change nothing."""
    w = policy.period_us
    out = []
    for _ in range(draw(st.integers(1, 40))):
        if draw(st.booleans()):
            kind = draw(st.integers(0, 9))
            if kind == 0:
                step = -draw(st.integers(1, 2 * w))
            elif kind < 4:
                step = 0
            else:
                step = draw(st.integers(0, w))
            out.append(("decide", step, draw(st.integers(1, min(policy.limit, 5)))))
        else:
            offset = draw(st.one_of(st.just(0), st.integers(-2 * w, 2 * w), st.integers(-10 * w, 10 * w)))
            out.append(("peek", offset, 0))
    return out


def _run_redis(url, policy, ops, key, state_format):
    """Each step's (decision, stored state before, stored state after) on real Redis."""

    async def go():
        rl = RedisLimiter.from_url(url, namespace="peekdiff", state_format=state_format)
        try:
            now = T0
            res = []
            for kind, n, cost in ops:
                before = await rl.raw_state(key, policy)
                if kind == "decide":
                    now += n
                    d = await rl.check(key, policy, cost, now)
                else:
                    d = await rl.check(key, policy, 0, now + n)
                res.append((d, before, await rl.raw_state(key, policy)))
            return res
        finally:
            await rl.aclose()

    return asyncio.run(go())


def _local_record(lim: LocalLimiter, key: str):
    info = lim.info(key)
    return None if info is None else (info.state, info.last_seen_us, info.expires_us, lim.keys(), len(lim))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
def test_pure_local_and_lua_peeks_agree_and_change_nothing(redis_url, data):
    policy = data.draw(policies())
    ops = data.draw(operations(policy))
    key = f"p{next(_ids)}"
    redis_results = _run_redis(redis_url, policy, ops, key, data.draw(st.sampled_from(STATE_FORMATS)))
    local = LocalLimiter(speedups=True)  # the C hot path hands a cost of 0 to Python
    local_py = LocalLimiter(speedups=False)
    local.check("other", policy, 1, T0)  # another key: the LRU order must not move either
    local_py.check("other", policy, 1, T0)
    state = None
    now = T0
    for i, ((kind, n, cost), (rd, rbefore, rafter)) in enumerate(zip(ops, redis_results)):
        if kind == "decide":
            now += n
            pd, state = decide(state, now, policy, cost)
            ld = local.check(key, policy, cost, now)
            lpd = local_py.check(key, policy, cost, now)
        else:
            records = (_local_record(local, key), _local_record(local_py, key))
            pd = peek(state, now + n, policy)
            assert pd == PEEKS[policy.algorithm](state, now + n, policy)
            ld = local.check(key, policy, 0, now + n)
            lpd = local_py.check(key, policy, 0, now + n)
            assert (_local_record(local, key), _local_record(local_py, key)) == records, f"step {i}: a peek recorded"
            assert rbefore == rafter == state, f"step {i}: a peek changed Redis: {rbefore!r} -> {rafter!r}"
        assert pd == ld == lpd == rd, f"step {i} {kind}: pure={pd} local(C)={ld} local(py)={lpd} redis={rd} {policy}"
        assert rafter == state, f"step {i}: stored state {rafter!r} != pure {state!r}"
        assert local.state(key) == local_py.state(key) == state


async def _decide_some(rl: RedisLimiter, lim: LocalLimiter, key: str, policy: Policy):
    state = None
    for i, cost in enumerate([3, 2]):
        now = T0 + i
        d, state = decide(state, now, policy, cost)
        assert await rl.check(key, policy, cost, now) == d == lim.check(key, policy, cost, now)
    return state


async def test_peeks_through_check_many_and_allowed_many(any_redis_url):
    """Standalone and the 3-master cluster: one batch of peeks over keys on every slot
    owner, mixed with decisions, for every algorithm."""
    rl = RedisLimiter.from_url(any_redis_url, namespace="peekmany")
    lim = LocalLimiter()
    try:
        states = {}
        for alg in ALGS:
            for j in range(4):
                states[(alg, j)] = await _decide_some(rl, lim, f"{alg}-{j}", POLICIES[alg])
        times = [T0 + 250_000, T0 - 3 * SEC, T0 + 900_000, T0 + 5 * SEC]
        batch = [(f"{alg}-{j}", POLICIES[alg], 0, times[j]) for alg in ALGS for j in range(4)]
        batch.append(("fresh", POLICIES[Algorithm.SLIDING_LOG], 0, T0))
        batch.append(("mixed", POLICIES[Algorithm.GCRA], 1, T0))  # a decision in the same batch
        out = await rl.check_many(batch)
        expected = [peek(states[(alg, j)], times[j], POLICIES[alg]) for alg in ALGS for j in range(4)]
        expected.append(peek(None, T0, POLICIES[Algorithm.SLIDING_LOG]))
        expected.append(decide(None, T0, POLICIES[Algorithm.GCRA], 1)[0])
        assert out == expected
        assert out[:-1] == [lim.check(k, p, 0, t) for k, p, _, t in batch[:-1]]
        assert await rl.allowed_many(batch[:-1]) == [d.allowed for d in expected[:-1]]
        for (alg, j), state in states.items():
            assert await rl.raw_state(f"{alg}-{j}", alg) == state
        assert await rl.raw_state("fresh", Algorithm.SLIDING_LOG) is None
        assert {d.allowed for d in out} == {True, False}  # exhausted keys and keys with room
    finally:
        await rl.aclose()


async def test_peek_works_after_script_flush(any_redis_url):
    """NOSCRIPT: the peek script's own source is re-sent (check and check_many)."""
    rl = RedisLimiter.from_url(any_redis_url, namespace="peekflush", state_format=2)
    try:
        states = {alg: await _decide_some(rl, LocalLimiter(), f"f-{alg}", POLICIES[alg]) for alg in ALGS}
        for alg in ALGS:
            await rl.backend.call_all(encode_command("SCRIPT", "FLUSH"))
            now = T0 + 300_000
            assert await rl.check(f"f-{alg}", POLICIES[alg], 0, now) == peek(states[alg], now, POLICIES[alg])
            assert await rl.raw_state(f"f-{alg}", alg) == states[alg]
        await rl.backend.call_all(encode_command("SCRIPT", "FLUSH"))
        out = await rl.check_many([(f"f-{alg}", POLICIES[alg], 0, T0 + 400_000) for alg in ALGS])
        assert out == [peek(states[alg], T0 + 400_000, POLICIES[alg]) for alg in ALGS]
        # the peek scripts were cached again, under their own shas (the burst's: made for many
        # keys on one server, each request's own on a cluster)
        one_server = not rl.backend.cluster
        for replies in [
            await rl.backend.call_all(
                encode_command("SCRIPT", "EXISTS", (many(PEEK_SCRIPTS[a]) if one_server else PEEK_SCRIPTS[a]).sha)
            )
            for a in ALGS
        ]:
            assert any(r == [1] for r in replies)
    finally:
        await rl.aclose()


async def test_load_scripts_includes_the_peek_scripts(redis_url):
    rl = RedisLimiter.from_url(redis_url, namespace="peekload")
    try:
        await rl.backend.call_all(encode_command("SCRIPT", "FLUSH"))
        assert await rl.scripts_loaded() is False
        shas = await rl.load_scripts()
        # each state format's decisions, peeks and charges, alone and for many keys
        sets = [SCRIPT_SETS[f].all() for f in STATE_FORMATS]
        singles = [PEEK, *(s for scripts in sets for s in scripts)]
        manys = [many(s) for scripts in sets for s in scripts]
        assert set(shas) == {s.sha for s in singles + manys + list(BOOKED.values())}
        assert len(shas) == 1 + 2 * (14 + 14) + 8
        assert await rl.scripts_loaded() is True
        await rl.backend.call(None, encode_command("SCRIPT", "FLUSH"))
        await rl.backend.call(None, encode_command("SCRIPT", "LOAD", SCRIPTS[Algorithm.GCRA].source))
        assert await rl.scripts_loaded() is False
    finally:
        await rl.aclose()


_WRITES = re.compile(
    r"""['"](hset|hmset|hdel|set|del|unlink|expire|pexpire|zadd|zrem|zremrangebyscore|incr\w*|rename)['"]""",
    re.IGNORECASE,
)


@pytest.mark.parametrize("alg", ALGS, ids=str)
def test_peek_scripts_never_write(alg):
    """The script itself names no writing command and does not call the prelude's
    sl_touch (EXPIRE); its header says which function it mirrors; it is loaded with the
    prelude in front like the others."""
    own = resources.files("lua").joinpath(f"peek_{alg.value}.lua").read_text(encoding="utf-8")
    script = PEEK_SCRIPTS[alg]
    assert script.name == f"peek_{alg.value}"
    prelude = resources.files("lua").joinpath("prelude.lua").read_text(encoding="utf-8")
    assert script.source == load_script(f"peek_{alg.value}").source
    assert script.source.startswith("local SL_FORMAT = 2\n" + prelude) and script.source.endswith("\n" + own)
    assert not _WRITES.search(own), f"{script.name} names a writing command"
    assert "sl_touch" not in own
    header = " ".join(line.lstrip("- ") for line in own.splitlines() if line.startswith("--"))
    assert f"mirrors limiter.algorithms.peek_{alg.value}" in header
    assert script.sha != SCRIPTS[alg].sha


@pytest.mark.parametrize("alg", ALGS, ids=str)
async def test_peek_scripts_run_under_eval_ro(redis_url, alg):
    """EVAL_RO refuses any write: every branch a peek takes (fresh key, a stored state,
    an exhausted key) runs under it, and the decision script does not."""
    rl = RedisLimiter.from_url(redis_url, namespace="peekro")
    policy = POLICIES[alg]
    script = PEEK_SCRIPTS[alg]
    rkey = rl.redis_key("ro")
    a1, a2, a3 = policy_args(policy)
    try:
        state = None
        for i in range(7):
            now = T0 + i * 1000
            cmd = encode_command("EVAL_RO", script.source, 1, rkey, a1, a2, a3, str(now), "5")
            reply = await rl.backend.call(rkey, cmd)
            assert not isinstance(reply, ReplyError), reply
            assert reply == list(_as_reply(peek(state, now, policy)))
            _, state = decide(state, now, policy, 1)
            await rl.check("ro", policy, 1, now)
        # the decision script writes, so EVAL_RO refuses it: the check above means something
        deny = encode_command("EVAL_RO", SCRIPTS[alg].source, 1, rl.redis_key("fresh"), a1, a2, a3, str(T0), "1")
        assert isinstance(await rl.backend.call(rkey, deny), ReplyError)
    finally:
        await rl.aclose()


def _as_reply(d):
    return (1 if d.allowed else 0, d.remaining, d.limit, d.retry_after_us, d.reset_after_us)


async def test_resilient_limiter_passes_a_peek_to_redis(any_redis_url):
    rl = RedisLimiter.from_url(any_redis_url, namespace="peekres")
    lim = ResilientLimiter(rl, failure_policy="inMemoryFallback")
    try:
        policy = POLICIES[Algorithm.SLIDING_LOG]
        for i in range(3):
            assert (await lim.check("k", policy, 1, T0 + i)).source == "distributed"
        state = await rl.raw_state("k", policy.algorithm)
        out = await lim.check("k", policy, 0, T0 + 10)
        assert out.source == "distributed" and out.decision == peek(state, T0 + 10, policy)
        outs = await lim.check_many([("k", policy, 0, T0 + 20), ("b", Policy.blocking(1), 1, T0)])
        assert [o.source for o in outs] == ["distributed", "distributed"]
        assert outs[0].decision == peek(state, T0 + 20, policy) and outs[1].decision == Decision(False, 0, 0, SEC, SEC)
        assert await lim.compare_many([("k", policy, 0, T0 + 20)]) == [True]
        assert await rl.raw_state("k", policy.algorithm) == state
        assert len(lim.fallback) == 0
    finally:
        await lim.aclose()
        await rl.aclose()
