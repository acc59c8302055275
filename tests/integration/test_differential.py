"""Differential tests: the pure function, LocalLimiter and the Lua script on real Redis
give identical decisions and identical stored state, for every algorithm.

This is what makes shadow divergence mean something: when the local and distributed
limiters disagree in production, it is because of the traffic, never the code.
"""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_strategies import policies

from limiter import LocalLimiter, RedisLimiter
from limiter.algorithms import decide, peek
from limiter.scripts import STATE_FORMATS

T0 = 1_700_000_000_000_000
_ids = itertools.count()


@st.composite
def sequences(draw, policy):
    n = draw(st.integers(1, 40))
    out = []
    for _ in range(n):
        kind = draw(st.integers(0, 9))
        if kind == 0:
            step = -draw(st.integers(1, 2 * policy.period_us))  # backwards clock
        elif kind < 4:
            step = 0
        else:
            step = draw(st.integers(0, policy.period_us))
        cost = draw(st.integers(1, min(policy.limit, 5)))
        out.append((step, cost))
    return out


def _run_redis(url, policy, seq, key, formats):
    """Each step's decision and stored state, each step written in its own state format (a key
    changes form as a fleet's replicas of two releases write it in turn)."""

    async def go():
        rl = RedisLimiter.from_url(url, namespace="diff")
        try:
            now = T0
            res = []
            for (step, cost), state_format in zip(seq, formats, strict=True):
                now += step
                rl.set_state_format(state_format)
                res.append((await rl.check(key, policy, cost, now), await rl.raw_state(key, policy)))
            return res
        finally:
            await rl.aclose()

    return asyncio.run(go())


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
def test_pure_local_and_lua_agree(every_redis_url, data):
    policy = data.draw(policies())
    seq = data.draw(sequences(policy))
    key = f"k{next(_ids)}"
    formats = data.draw(st.lists(st.sampled_from(STATE_FORMATS), min_size=len(seq), max_size=len(seq)))
    redis_results = _run_redis(every_redis_url, policy, seq, key, formats)
    local = LocalLimiter(speedups=True)  # the C hot path (fails loudly when not built)
    local_py = LocalLimiter(speedups=False)  # the pure-Python LocalLimiter
    state = None
    now = T0
    for i, ((step, cost), (rd, rstate)) in enumerate(zip(seq, redis_results)):
        now += step
        pd, state = decide(state, now, policy, cost)
        ld = local.check(key, policy, cost, now)
        lpd = local_py.check(key, policy, cost, now)
        assert pd == ld == lpd == rd, f"step {i}: pure={pd} local(C)={ld} local(py)={lpd} redis={rd} policy={policy}"
        assert local.state(key) == local_py.state(key), (
            f"step {i}: C state {local.state(key)!r} != Python {local_py.state(key)!r}"
        )
        # the stored state round-trips exactly (17 significant digits)
        assert rstate == state, f"step {i}: stored state {rstate!r} != pure {state!r}"


def _run_redis_burst(url, policy, seq, keys, state_format):
    """The sequence as one burst (``check_many``) over interleaved keys, then each key's state:
    on one server, runs of requests in calls of the scripts made for many keys. The scripts
    are loaded first, as the service does at start and on each readiness check: a script
    Redis does not know is sent again after the burst, so its requests would run after the
    ones behind them (after a restart or SCRIPT FLUSH, until the scripts are loaded again)."""

    async def go():
        rl = RedisLimiter.from_url(url, namespace="diff-many", state_format=state_format)
        try:
            await rl.load_scripts()
            now, requests = T0, []
            for i, (step, cost) in enumerate(seq):
                now += step
                requests.append((keys[i % len(keys)], policy, cost, now))
            return await rl.check_many(requests), [await rl.raw_state(k, policy) for k in keys]
        finally:
            await rl.aclose()

    return asyncio.run(go())


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
def test_a_burst_decides_as_the_pure_function_does_request_by_request(every_redis_url, data):
    """A burst (the shadow worker's, a batch's) of decisions and peeks (cost 0) over a few
    keys: each answer and each key's final state are the pure function's, request by request
    in the burst's order."""
    policy = data.draw(policies())
    seq = [(step, 0 if data.draw(st.integers(0, 5)) == 0 else cost) for step, cost in data.draw(sequences(policy))]
    keys = [f"m{next(_ids)}" for _ in range(data.draw(st.integers(1, 3)))]
    got, states = _run_redis_burst(every_redis_url, policy, seq, keys, data.draw(st.sampled_from(STATE_FORMATS)))
    state: dict[str, object] = dict.fromkeys(keys)
    now = T0
    for i, ((step, cost), rd) in enumerate(zip(seq, got)):
        now += step
        k = keys[i % len(keys)]
        if cost == 0:
            pd = peek(state[k], now, policy)
        else:
            pd, state[k] = decide(state[k], now, policy, cost)
        assert pd == rd, f"request {i} (key {k}, cost {cost}): pure={pd} redis={rd} policy={policy}"
    assert states == [state[k] for k in keys]
