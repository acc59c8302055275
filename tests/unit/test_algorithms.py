"""The pure decision functions: worked examples and properties (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from limiter import Algorithm, Decision, Policy
from limiter.algorithms import (
    PEEKS,
    blocked_decision,
    decide,
    fixed_window,
    peek,
    sliding_log,
    sliding_window,
    token_bucket,
    token_bucket_tokens,
)

T0 = 1_700_000_000_000_000


def run(policy, steps):
    """steps: (dt_us, cost); returns list of (now, cost, decision)."""
    state = None
    now = T0
    out = []
    for dt, cost in steps:
        now += dt
        d, state = decide(state, now, policy, cost)
        out.append((now, cost, d))
    return out, state


def test_token_bucket_burst_then_refill():
    p = Policy(average=10, period=1, burst=5)  # 10 tokens/s
    results, _ = run(p, [(0, 1)] * 6)
    assert [d.allowed for _, _, d in results] == [True] * 5 + [False]
    assert results[4][2].remaining == 0
    # exact retry-after: one token needs 100 ms
    assert results[5][2].retry_after_us == 100_000
    assert results[0][2].reset_after_us == 100_000  # one token short of full


def test_token_bucket_new_key_starts_full_and_cost():
    p = Policy(average=1, period=1, burst=10)
    d, state = token_bucket(None, T0, p, 7)
    assert d.allowed and d.remaining == 3
    d, state2 = token_bucket(state, T0, p, 4)
    assert not d.allowed and d.remaining == 3 and d.retry_after_us == 1_000_000
    assert state2 == state  # a denial writes nothing


def test_token_bucket_old_timestamp_is_evaluated_at_stored_time():
    p = Policy(average=1, period=1, burst=1)
    d, s = token_bucket(None, T0 + 10_000_000, p, 1)
    assert d.allowed
    # a request stamped 5 s earlier must not be credited the 5 s again
    d, s = token_bucket(s, T0 + 5_000_000, p, 1)
    assert not d.allowed
    assert s[0] == T0 + 10_000_000


def test_gcra_matches_token_bucket_counts():
    p_tb = Policy(average=50, period=1, burst=10)
    p_g = Policy(average=50, period=1, burst=10, algorithm="gcra")
    steps = [(0, 1)] * 12 + [(20_000, 1)] * 30
    a, _ = run(p_tb, steps)
    b, _ = run(p_g, steps)
    assert [d.allowed for *_, d in a] == [d.allowed for *_, d in b]


def test_fixed_window_resets_at_boundary():
    p = Policy(average=3, period=1, algorithm="fixed_window")
    state = None
    now = T0  # aligned to a whole second
    for _ in range(3):
        d, state = fixed_window(state, now + 900_000, p, 1)
        assert d.allowed
    d, state = fixed_window(state, now + 900_000, p, 1)
    assert not d.allowed and d.retry_after_us == 100_000
    d, state = fixed_window(state, now + 1_000_000, p, 1)
    assert d.allowed and d.remaining == 2


def test_sliding_window_seed_003_example():
    # limit 10, previous window 8, current 3, 30 s into a 60 s window -> weighted 7
    p = Policy(average=10, period=60, algorithm="sliding_window")
    ws = T0 - T0 % p.period_us
    state = (ws, 3, 8)
    d, _ = sliding_window(state, ws + 30_000_000, p, 1)
    assert d.allowed and d.remaining == 2  # 10 - (7 + 1)
    p6 = Policy(average=6, period=60, algorithm="sliding_window")
    d, _ = sliding_window(state, ws + 30_000_000, p6, 1)
    assert not d.allowed


def test_sliding_window_boundary_gaming_prevented():
    p = Policy(average=100, period=60, algorithm="sliding_window")
    ws = T0 - T0 % p.period_us
    state = (ws - p.period_us, 100, 0)
    d, _ = sliding_window(state, ws, p, 1)
    assert not d.allowed
    d, _ = sliding_window(state, ws + 30_000_000, p, 50)
    assert d.allowed


def test_sliding_log_exact_window():
    p = Policy(average=2, period=1, algorithm="sliding_log")
    d, s = sliding_log(None, T0, p, 1)
    d, s = sliding_log(s, T0 + 500_000, p, 1)
    d, s2 = sliding_log(s, T0 + 999_999, p, 1)
    assert not d.allowed and d.retry_after_us == 1
    d, s = sliding_log(s, T0 + 1_000_000, p, 1)
    assert d.allowed


def test_unlimited_allows_everything_and_keeps_no_state():
    for alg in Algorithm:
        p = Policy(average=0, burst=5, algorithm=alg)
        d, s = decide(None, T0, p, 5)
        assert d.allowed and s is None and d.remaining == 5


# -- properties -------------------------------------------------------------------------

policies = st.builds(
    Policy,
    average=st.sampled_from([1, 2, 5, 10, 33.3, 100, 1000]),
    period=st.sampled_from([0.01, 0.1, 1.0, 2.5, 60.0]),
    burst=st.integers(1, 50),
)
steps = st.lists(st.tuples(st.integers(0, 200_000), st.integers(1, 3)), min_size=1, max_size=200)


@given(policies, steps, st.sampled_from(["token_bucket", "gcra"]))
@settings(max_examples=300, deadline=None)
def test_allowed_tokens_never_exceed_burst_plus_rate_times_elapsed(p, seq, alg):
    p = Policy(average=p.average, period=p.period, burst=p.burst, algorithm=alg)
    seq = [(dt, min(c, p.burst)) for dt, c in seq]
    results, _ = run(p, seq)
    t_first = results[0][0]
    allowed = 0
    for now, cost, d in results:
        if d.allowed:
            allowed += cost
        bound = p.burst + p.rate_per_us * (now - t_first)
        assert allowed <= bound + 1e-6


@given(policies, st.lists(st.tuples(st.integers(-300_000, 300_000), st.integers(1, 3)), min_size=1, max_size=200))
@settings(max_examples=300, deadline=None)
def test_out_of_order_clocks_never_credit_twice(p, seq):
    """Backwards steps included: the bound holds over the span of times seen."""
    seq = [(dt, min(c, p.burst)) for dt, c in seq]
    results, _ = run(p, seq)
    allowed = sum(c for _, c, d in results if d.allowed)
    times = [n for n, _, _ in results]
    assert allowed <= p.burst + p.rate_per_us * (max(times) - min(times)) + 1e-6


@given(policies, st.integers(0, 10_000_000), st.integers(0, 10_000_000))
@settings(max_examples=300, deadline=None)
def test_refill_is_proportional_and_capped(p, dt1, dt2):
    # drain completely, then refill
    state = (T0, 0.0)
    t1 = token_bucket_tokens(state, T0 + dt1, p)
    assert math.isclose(t1, min(p.burst, dt1 * p.rate_per_us), rel_tol=1e-12, abs_tol=1e-9)
    t2 = token_bucket_tokens(state, T0 + dt1 + dt2, p)
    assert t2 >= t1 and t2 <= p.burst


@given(st.integers(1, 20), st.sampled_from([0.01, 0.5, 1.0]), steps)
@settings(max_examples=200, deadline=None)
def test_sliding_log_never_exceeds_limit_in_any_window(limit, period, seq):
    p = Policy(average=limit, period=period, algorithm="sliding_log")
    seq = [(dt, min(c, limit)) for dt, c in seq]
    results, _ = run(p, seq)
    stamps = []
    for now, cost, d in results:
        if d.allowed:
            stamps.extend([now] * cost)
    for t in stamps:
        in_window = sum(1 for u in stamps if t - p.period_us < u <= t)
        assert in_window <= limit


@given(
    st.integers(1, 20), st.sampled_from([0.01, 0.5, 1.0]), steps, st.sampled_from(["fixed_window", "sliding_window"])
)
@settings(max_examples=200, deadline=None)
def test_window_counters_stay_within_their_bounds(limit, period, seq, alg):
    p = Policy(average=limit, period=period, algorithm=alg)
    seq = [(dt, min(c, limit)) for dt, c in seq]
    results, _ = run(p, seq)
    w = p.period_us
    per_window: dict[int, int] = {}
    for now, cost, d in results:
        if d.allowed:
            per_window[now - now % w] = per_window.get(now - now % w, 0) + cost
    # each aligned window admits at most the limit (both algorithms)
    assert all(v <= limit for v in per_window.values())


# -- peek: the answer a cost-1 request would get now, nothing spent ------------------------

ALG_POLICIES = {
    Algorithm.TOKEN_BUCKET: Policy(average=10, period=1, burst=5),  # 1 token per 100 ms
    Algorithm.GCRA: Policy(average=10, period=1, burst=5, algorithm="gcra"),
    Algorithm.FIXED_WINDOW: Policy(average=5, period=1, algorithm="fixed_window"),
    Algorithm.SLIDING_WINDOW: Policy(average=5, period=1, algorithm="sliding_window"),
    Algorithm.SLIDING_LOG: Policy(average=5, period=1, algorithm="sliding_log"),
}
NOW = T0 + 250_000  # a quarter into a (whole-second) window


def _spent(alg, cost, now=NOW):
    p = ALG_POLICIES[alg]
    return p, decide(None, now, p, cost)[1]


@pytest.mark.parametrize("alg", list(Algorithm), ids=str)
def test_peek_fresh_key_is_at_full_allowance(alg):
    p = ALG_POLICIES[alg]
    assert peek(None, NOW, p) == PEEKS[alg](None, NOW, p) == Decision(True, 5, 5, 0, 0)


@pytest.mark.parametrize(
    ("alg", "expected"),
    [
        (Algorithm.TOKEN_BUCKET, Decision(True, 3, 5, 0, 200_000)),
        (Algorithm.GCRA, Decision(True, 3, 5, 0, 200_000)),
        (Algorithm.FIXED_WINDOW, Decision(True, 3, 5, 0, 750_000)),  # the window's end
        (Algorithm.SLIDING_WINDOW, Decision(True, 3, 5, 0, 1_750_000)),  # the next window's end
        (Algorithm.SLIDING_LOG, Decision(True, 3, 5, 0, 1_000_000)),  # the newest entry's expiry
    ],
    ids=str,
)
def test_peek_partly_used_reports_what_is_left_before_spending(alg, expected):
    p, state = _spent(alg, 2)
    assert peek(state, NOW, p) == expected
    # a cost-1 request now would be allowed and leave one less
    d, _ = decide(state, NOW, p, 1)
    assert d.allowed and d.remaining == expected.remaining - 1


@pytest.mark.parametrize(
    ("alg", "expected"),
    [
        (Algorithm.TOKEN_BUCKET, Decision(False, 0, 5, 100_000, 500_000)),
        (Algorithm.GCRA, Decision(False, 0, 5, 100_000, 500_000)),
        (Algorithm.FIXED_WINDOW, Decision(False, 0, 5, 750_000, 750_000)),
        (Algorithm.SLIDING_WINDOW, Decision(False, 0, 5, 950_000, 1_750_000)),
        (Algorithm.SLIDING_LOG, Decision(False, 0, 5, 1_000_000, 1_000_000)),
    ],
    ids=str,
)
def test_peek_exhausted_key_is_denied_with_the_wait_for_one(alg, expected):
    p, state = _spent(alg, 5)
    assert peek(state, NOW, p) == expected
    assert peek(state, NOW, p) == decide(state, NOW, p, 1)[0]  # exactly the denied branch, cost 1
    # an older timestamp is evaluated as the decision evaluates it
    assert peek(state, NOW - 3_000_000, p) == decide(state, NOW - 3_000_000, p, 1)[0]
    # and once the wait is over, a request of 1 fits
    later = NOW + expected.retry_after_us
    assert peek(state, later, p).allowed and decide(state, later, p, 1)[0].allowed
    assert not peek(state, later - 1, p).allowed


def test_peek_after_refill_and_after_the_window():
    tb, state = _spent(Algorithm.TOKEN_BUCKET, 5)
    assert peek(state, NOW + 150_000, tb) == Decision(True, 1, 5, 0, 350_000)  # 1.5 tokens
    assert peek(state, NOW + 10_000_000, tb) == Decision(True, 5, 5, 0, 0)  # full again
    fw, state = _spent(Algorithm.FIXED_WINDOW, 5)
    assert peek(state, T0 + 1_000_000, fw) == Decision(True, 5, 5, 0, 0)  # a new, empty window
    sw, state = _spent(Algorithm.SLIDING_WINDOW, 5)
    d = peek(state, T0 + 1_500_000, sw)  # half the previous window still counts: 2.5
    assert d == Decision(True, 2, 5, 0, 500_000)
    sl, state = _spent(Algorithm.SLIDING_LOG, 5)
    assert peek(state, NOW + 1_000_000, sl) == Decision(True, 5, 5, 0, 0)  # every entry expired


@pytest.mark.parametrize("alg", list(Algorithm), ids=str)
def test_peek_unlimited(alg):
    p = Policy(average=0, burst=7, algorithm=alg)
    assert peek(None, NOW, p) == peek((1, 2, 3), NOW, p) == Decision(True, 7, 7, 0, 0)


_peek_policies = st.builds(
    lambda alg, avg, period, burst: Policy(
        average=max(1, round(avg)) if Algorithm(alg).windowed else avg, period=period, burst=burst, algorithm=alg
    ),
    st.sampled_from([a.value for a in Algorithm]),
    st.sampled_from([0.5, 1, 3, 7.7, 10, 33.333]),
    st.sampled_from([0.01, 0.25, 1.0, 3.0]),
    st.integers(1, 20),
)


@given(
    _peek_policies,
    st.lists(st.tuples(st.integers(-300_000, 300_000), st.integers(1, 3)), max_size=40),
    st.integers(-3_000_000, 3_000_000),
)
@settings(max_examples=400, deadline=None)
def test_peek_is_the_cost_one_verdict_and_the_denied_answer(p, seq, offset):
    state = None
    now = T0
    for dt, cost in seq:
        now += dt
        _, state = decide(state, now, p, min(cost, p.limit))
    at = now + offset
    frozen = state
    d = peek(state, at, p)
    one, after = decide(state, at, p, 1)
    assert state == frozen  # pure: the input is not touched
    assert d.allowed == one.allowed and d.limit == p.limit
    if d.allowed:
        assert d.retry_after_us == 0
        if p.algorithm in (Algorithm.FIXED_WINDOW, Algorithm.SLIDING_LOG):
            assert d.remaining == one.remaining + 1
    else:
        assert d == one and after == state
        assert d.retry_after_us > 0


# -- a blocking policy (requests_per_unit: 0) ------------------------------------------------


@pytest.mark.parametrize("cost", [1, 2, 1000])
def test_blocking_policy_denies_with_no_state(cost):
    p = Policy.blocking(60)
    now = T0 + 7_000_000
    end = 60_000_000 - now % 60_000_000
    d, state = fixed_window(None, now, p, cost)
    assert d == Decision(False, 0, 0, end, end) and state is None
    assert decide(None, now, p, cost) == (d, None)
    assert blocked_decision(now, p) == d
    # even handed some stored window, it counts nothing and changes nothing
    d2, state2 = fixed_window((now - now % 60_000_000, 3), now, p, cost)
    assert d2 == d and state2 == (now - now % 60_000_000, 3)
    assert peek(None, now, p) == peek((now - now % 60_000_000, 3), now, p) == d
