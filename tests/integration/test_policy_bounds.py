"""Every policy that constructs can be decided, by every implementation, without an error.

A policy's derived times (refill, retry, reset, key TTL) must stay far enough below 2^53
microseconds that a timestamp plus any of them is exact in Python, in the C path's
64-bit integers, in the Lua scripts' doubles, in Redis's integer replies and in JSON.
:class:`~limiter.policy.Policy` refuses values that break this (a full bucket refills
within ``MAX_REFILL_S``, ``average <= MAX_AVERAGE``, GCRA's interval ``>= MIN_EMISSION_US``);
these tests throw the whole constructible range at the pure functions, both
LocalLimiter paths and the Lua scripts on real Redis, and check that each decision
comes back, that all four agree, and that it serialises.
"""

from __future__ import annotations

import asyncio
import itertools
import math

import orjson
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from limiter import Algorithm, LocalLimiter, Policy, RedisLimiter
from limiter.algorithms import decide
from limiter.policy import MAX_AVERAGE, MAX_PERIOD_S, MAX_REFILL_S, MIN_EMISSION_US, MIN_PERIOD_S

T0 = 1_700_000_000_000_000
YEAR_US = 365 * 86_400 * 1_000_000
EXACT = 2**53  # below this every integer is exact as a double (Lua) and as an int64
_ids = itertools.count()


def _log_uniform(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(math.log10(lo), math.log10(hi)).map(lambda e: 10.0**e)


@st.composite
def any_policy(draw: st.DrawFn) -> Policy:
    """Policies over the whole range, edges included; those that do not construct are
    rejected (they are the other half of the property: refused up front)."""
    alg = draw(st.sampled_from(list(Algorithm)))
    period = draw(
        st.sampled_from([MIN_PERIOD_S, 1.0, 86_400.0, MAX_PERIOD_S]) | _log_uniform(MIN_PERIOD_S, MAX_PERIOD_S)
    )
    burst = draw(st.none() | st.sampled_from([1, 10**9]) | st.integers(0, 9).flatmap(lambda e: st.integers(1, 10**e)))
    b = burst if burst is not None else 1
    edges = [
        MAX_AVERAGE,
        1.0,
        b * period / MAX_REFILL_S,  # the slowest refill allowed
        math.nextafter(b * period / MAX_REFILL_S, math.inf),
        period * 1_000_000 / MIN_EMISSION_US,  # GCRA's fastest
    ]
    average = draw(st.sampled_from(edges) | _log_uniform(1e-12, 2e9))
    try:
        return Policy(average=average, period=period, burst=burst, algorithm=alg)
    except ValueError:
        reject()


@st.composite
def requests(draw: st.DrawFn, policy: Policy) -> list[tuple[int, int]]:
    """(time step, cost) pairs: same instant, a period, the full refill, a backwards
    clock, years ahead; costs from 1 to the limit (the sliding log stores one entry per
    token, so its costs stay small)."""
    refill = math.ceil(policy.burst * policy.period_us / max(policy.average, 1e-300))
    steps = st.sampled_from(
        [0, 1, policy.period_us, -policy.period_us, min(refill, 10 * YEAR_US), 10 * YEAR_US]
    ) | st.integers(0, policy.period_us)
    top = min(policy.limit, 1000) if policy.algorithm is Algorithm.SLIDING_LOG else policy.limit
    costs = st.sampled_from([1, top]) | st.integers(1, top)
    return draw(st.lists(st.tuples(steps, costs), min_size=1, max_size=6))


def _exact(d) -> None:
    for v in (d.remaining, d.limit, d.retry_after_us, d.reset_after_us):
        assert type(v) is int and -EXACT < v < EXACT, d
    orjson.dumps(d.to_dict())  # what the control plane serialises (int64 at most)


def _check(url: str, policy: Policy, seq: list[tuple[int, int]]) -> None:
    key = f"b{next(_ids)}"

    async def in_redis() -> list:
        rl = RedisLimiter.from_url(url, namespace="bounds", state_format=2)
        try:
            out, now = [], T0
            for step, cost in seq:
                now += step
                out.append(
                    (
                        await rl.check(key, policy, cost, now),
                        await rl.raw_state(key, policy),
                        await rl.peek(key, policy, now_us=now),
                    )
                )
            return out
        finally:
            await rl.aclose()

    redis_results = asyncio.run(in_redis())
    fast = LocalLimiter(speedups=True)
    slow = LocalLimiter(speedups=False)
    state, now = None, T0
    for i, ((step, cost), (rd, rstate, rpeek)) in enumerate(zip(seq, redis_results)):
        now += step
        pd, state = decide(state, now, policy, cost)
        cd = fast.check(key, policy, cost, now)
        sd = slow.check(key, policy, cost, now)
        assert pd == cd == sd == rd, f"step {i}: pure={pd} C={cd} python={sd} redis={rd} {policy}"
        assert rstate == state, f"step {i}: stored {rstate!r} != pure {state!r}"
        _exact(pd)
        lpeek = slow.peek(key, policy, now_us=now)
        assert -EXACT < lpeek.reset_after_us < EXACT and -EXACT < rpeek.reset_after_us < EXACT
        orjson.dumps(lpeek.to_dict())
        orjson.dumps(rpeek.to_dict())
        for info in slow.items():
            assert info.expires_us < EXACT, info


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(data=st.data())
def test_any_constructible_policy_decides_everywhere(redis_url, data):
    policy = data.draw(any_policy())
    _check(redis_url, policy, data.draw(requests(policy)))


# the extremes of each bound, each way round
LARGEST = [
    {"average": 1e9, "period": 0.001, "burst": 10**9},
    {"average": 1e9, "period": 0.001},
    {"average": 1e9, "period": MAX_PERIOD_S, "burst": 10**9},
    {"average": 1, "period": 0.001, "burst": 10**9},
]


@pytest.mark.parametrize("alg", list(Algorithm))
@pytest.mark.parametrize(
    "kwargs", LARGEST, ids=["fast-big", "fast-default-burst", "slow-window-big", "tiny-period-big-burst"]
)
def test_largest_values_decide_or_are_refused_by_name(redis_url, kwargs, alg):
    try:
        policy = Policy(**kwargs, algorithm=alg)
    except ValueError as exc:
        assert str(exc).startswith(("average:", "burst:")), exc
        return
    top = min(policy.limit, 1000) if alg is Algorithm.SLIDING_LOG else policy.limit
    _check(redis_url, policy, [(0, 1), (0, top), (1, 1), (policy.period_us, top), (-5, 1), (10 * YEAR_US, 1)])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"average": 1e-9, "period": 86_400, "burst": 1},  # PUT /ratelimit/config in the issue
        {"average": 1.0e-300},  # the rules file in the issue
        {"average": 1e-300, "period": 86_400},  # 1 / rate is inf: OverflowError in ceil()
        {
            "average": 1,
            "period": MAX_PERIOD_S,
            "burst": 10**9,
            "algorithm": "fixed_window",
        },  # TTL beyond EXPIRE's range
        {"average": 1, "period": MAX_PERIOD_S, "burst": 10**9, "algorithm": "sliding_log"},
        {"average": 1e9, "period": 0.001, "algorithm": "gcra"},  # 1e-6 us per token: TAT never moves
        {"average": 1e13},  # a default burst past 10^12
        {"average": 2e12, "period": 60, "algorithm": "fixed_window"},  # a window limit past 10^12
        {"average": 2e9, "period": 60, "algorithm": "sliding_log"},  # a log of more than 10^9 entries
        {"average": 10**400},  # float() overflows
    ],
)
def test_unrepresentable_policies_are_refused_naming_average(kwargs):
    with pytest.raises(ValueError, match=r"^average: "):
        Policy(**kwargs)


def test_the_edges_are_inclusive():
    slowest = Policy(average=1 / MAX_REFILL_S, period=1.0, burst=1)
    assert slowest.ttl_s <= MAX_REFILL_S + 2
    assert Policy(average=1e6, period=1.0, algorithm="gcra").emission_us == MIN_EMISSION_US
    assert Policy(average=MAX_AVERAGE, period=1.0).limit == MAX_AVERAGE
    with pytest.raises(ValueError, match=r"^average: .*10 years \(315360000 s\)"):
        Policy(average=math.nextafter(1 / MAX_REFILL_S, 0), period=1.0, burst=1)
