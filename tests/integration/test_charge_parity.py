"""Charges (costs known after the answer, counted whatever is left: limiter/charges.py) agree bit
for bit across the pure functions, both ``LocalLimiter`` paths and the ``charge_<algorithm>.lua``
scripts on real Redis (standalone and a 3-master cluster), mixed with decisions and peeks at
random times (older timestamps included): answers, debts and stored states. Then the bounds:
budgets of 10^12 a period on periods from a second to 31 days, charges of 10^9, debts held at
their bound, every figure an exact whole number on both sides."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_strategies import policies

from limiter import Algorithm, LocalLimiter, Policy, RedisLimiter
from limiter.algorithms import EPSILON, decide, peek
from limiter.charges import MAX_DEBT, MAX_DEBT_US, charge
from limiter.policy import MAX_COST, Charge
from limiter.scripts import STATE_FORMATS

T0 = 1_700_000_000_000_000
_ids = itertools.count()
CHARGING = [a for a in Algorithm if a is not Algorithm.SLIDING_LOG]


@st.composite
def operations(draw, policy):
    """(step, cost): a plain int cost is a decision (0: a peek), a :class:`Charge` a charge
    (large ones into debt, negative ones refunds)."""
    w = policy.period_us
    out = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.integers(0, 9))
        if kind == 0:
            step = -draw(st.integers(1, 2 * w))
        elif kind < 4:
            step = 0
        else:
            step = draw(st.integers(0, w))
        what = draw(st.integers(0, 5))
        if what == 0:
            cost: int = 0
        elif what < 3:
            cost = draw(st.integers(1, min(policy.limit, 5)))
        else:
            cost = Charge(draw(st.one_of(st.integers(0, 3 * policy.limit), st.integers(-2 * policy.limit, -1))))
        out.append((step, cost))
    return out


def pure(state, now, policy, cost):
    if cost.__class__ is Charge:
        return charge(state, now, policy, cost)
    if cost == 0:
        return peek(state, now, policy), state
    return decide(state, now, policy, cost)


def _run_redis(url, policy, ops, key, formats):
    """Each step's answer and stored state, each step written in its own state format."""

    async def go():
        rl = RedisLimiter.from_url(url, namespace="chargediff")
        try:
            now, res = T0, []
            for (step, cost), state_format in zip(ops, formats, strict=True):
                now += step
                rl.set_state_format(state_format)
                res.append((await rl.check(key, policy, cost, now), await rl.raw_state(key, policy)))
            return res
        finally:
            await rl.aclose()

    return asyncio.run(go())


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
def test_charges_agree_in_python_both_local_paths_and_lua(any_redis_url, data):
    policy = data.draw(policies(CHARGING))
    ops = data.draw(operations(policy))
    key = f"c{next(_ids)}"
    formats = data.draw(st.lists(st.sampled_from(STATE_FORMATS), min_size=len(ops), max_size=len(ops)))
    redis_results = _run_redis(any_redis_url, policy, ops, key, formats)
    local, local_py = LocalLimiter(speedups=True), LocalLimiter(speedups=False)
    state, now = None, T0
    for i, ((step, cost), (rd, rstate)) in enumerate(zip(ops, redis_results, strict=True)):
        now += step
        pd, state = pure(state, now, policy, cost)
        ld, lpd = local.check(key, policy, cost, now), local_py.check(key, policy, cost, now)
        assert pd == ld == lpd == rd, f"step {i} {cost!r}: pure={pd} local(C)={ld} local(py)={lpd} redis={rd} {policy}"
        assert local.state(key) == local_py.state(key) == state, f"step {i}: {local.state(key)!r} != {state!r}"
        assert rstate == state, f"step {i}: stored state {rstate!r} != pure {state!r}"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
def test_a_burst_of_charges_decisions_and_peeks_is_the_pure_functions_in_order(any_redis_url, data):
    """One ``check_many`` (on one server: runs of one script and policy in calls of the
    scripts made for many keys) over a few keys: each answer and final state as the pure
    functions give them, request by request."""
    policy = data.draw(policies(CHARGING))
    ops = data.draw(operations(policy))
    keys = [f"cm{next(_ids)}" for _ in range(data.draw(st.integers(1, 3)))]
    state_format = data.draw(st.sampled_from(STATE_FORMATS))

    async def go():
        rl = RedisLimiter.from_url(any_redis_url, namespace="chargediff-many", state_format=state_format)
        try:
            await rl.load_scripts()
            now, requests = T0, []
            for i, (step, cost) in enumerate(ops):
                now += step
                requests.append((keys[i % len(keys)], policy, cost, now))
            return await rl.check_many(requests), [await rl.raw_state(k, policy) for k in keys]
        finally:
            await rl.aclose()

    got, states = asyncio.run(go())
    state: dict[str, object] = dict.fromkeys(keys)
    now = T0
    for i, ((step, cost), rd) in enumerate(zip(ops, got, strict=True)):
        now += step
        k = keys[i % len(keys)]
        pd, state[k] = pure(state[k], now, policy, cost)
        assert pd == rd, f"request {i} ({cost!r}): pure={pd} redis={rd} {policy}"
    assert states == [state[k] for k in keys]


BIG = [
    Policy(average=10**12, period=1.0, burst=10**12),  # 10^12 a second
    Policy(average=10**12, period=31 * 86_400.0, burst=10**12),  # 10^12 over 31 days
    Policy(average=1, period=31 * 86_400.0, burst=1),  # 1 over 31 days
    Policy(average=10**12, period=31 * 86_400.0, burst=10**12, algorithm="gcra"),
    Policy(average=1, period=1.0, burst=1, algorithm="gcra"),
    Policy(average=10**12, period=1.0, algorithm="fixed_window"),
    Policy(average=10**12, period=31 * 86_400.0, algorithm="sliding_window"),
    Policy(average=1, period=31 * 86_400.0, algorithm="sliding_window"),
]


@pytest.mark.parametrize("policy", BIG, ids=lambda p: p.describe())
def test_the_largest_budgets_and_charges_stay_exact_and_debts_are_held_at_their_bound(redis_url, policy):
    """Budgets of 10^12, charges of 10^9, many of them (into debt and past its bound), refunds,
    a decision and time passing: every answer and state the same on both sides, every balance
    a whole number, the debt never past its bound, a refund never past a full bucket."""
    steps = [(0, Charge(MAX_COST))] * 5 + [(1, Charge(-MAX_COST)), (7, 1), (3_000_000, Charge(MAX_COST))]
    steps += [(0, Charge(MAX_COST))] * 3 + [(86_400_000_000, 0), (0, Charge(-MAX_COST)), (0, Charge(12_345))]
    key = f"big{next(_ids)}"
    got = _run_redis(redis_url, policy, steps, key, [2] * len(steps))
    state, now = None, T0
    for (step, cost), (rd, rstate) in zip(steps, got, strict=True):
        now += step
        pd, state = pure(state, now, policy, cost)
        assert pd == rd and rstate == state, f"{cost!r}: pure={pd}/{state!r} redis={rd}/{rstate!r}"
        assert isinstance(rd.remaining, int) and abs(rd.remaining) <= MAX_DEBT
    # where the refill cannot repay it in time, the debt is held at the bound
    if policy.algorithm is Algorithm.TOKEN_BUCKET:
        bound = min(policy.rate_per_us * MAX_DEBT_US, MAX_DEBT)
        d, s = charge((T0, -bound), T0, policy, Charge(MAX_COST))
        assert s == (T0, -bound) and d.remaining == math.floor(-bound + EPSILON) and not d.allowed
        assert charge((T0, policy.burst_f), T0, policy, Charge(-5))[1] == (T0, policy.burst_f)  # never past full
    elif policy.algorithm is Algorithm.GCRA:
        tau = policy.emission_us * policy.burst_f
        d, s = charge(T0 + tau + MAX_DEBT_US, T0, policy, Charge(MAX_COST))
        assert s == T0 + tau + MAX_DEBT_US
        assert charge(None, T0, policy, Charge(-5))[1] == T0  # a refund never makes more than a full bucket


def test_a_charge_on_the_sliding_log_is_refused_saying_why() -> None:
    policy = Policy(average=10, period=1.0, algorithm="sliding_log")
    with pytest.raises(ValueError, match="sliding_log keeps one entry per unit"):
        LocalLimiter().check("k", policy, Charge(3))
    with pytest.raises(ValueError, match="a charge is at most 1000000000 units"):
        LocalLimiter().check("k", Policy(average=10), Charge(MAX_COST + 1))
