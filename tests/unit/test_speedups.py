"""The C hot path of LocalLimiter.check (limiter/_speedups.c) against the pure-Python
LocalLimiter it accelerates: same decisions, same stored state, same errors, and no
lost or doubled update under threads.

These tests need the extension: when it is not built they fail (they never skip).
"""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from limiter import Algorithm, LocalLimiter, Policy, speedups_available
from limiter.algorithms import decide
from limiter.charges import MAX_DEBT, MAX_DEBT_US, charge_token_bucket
from limiter.policy import MAX_COST, Charge

T0 = 1_700_000_000_000_000


def test_extension_is_built_and_used():
    import limiter._speedups  # noqa: F401  (ImportError here means the build failed)

    assert speedups_available()
    lim = LocalLimiter()
    assert lim.accelerated
    p = Policy(average=10, burst=5)
    lim.check("a", p, now_us=T0)  # a new key: the Python path inserts it
    for i in range(4):
        lim.check("a", p, now_us=T0 + i)
    assert lim.check.stats() == {"fast": 4, "slow": 1}


def test_charges_take_the_c_path_with_the_python_bounds():
    import limiter._speedups as c

    assert (c.MAX_COST, c.MAX_DEBT, c.MAX_DEBT_US) == (MAX_COST, MAX_DEBT, MAX_DEBT_US)
    lim = LocalLimiter()
    p = Policy(average=10, burst=5)
    lim.check("a", p, now_us=T0)
    state = lim.state("a")
    for i, cost in enumerate([Charge(3), Charge(40), Charge(-7), Charge(MAX_COST), Charge(-MAX_COST)], 1):
        d, state = charge_token_bucket(state, T0 + i, p, cost)
        assert lim.check("a", p, cost, T0 + i) == d
        assert lim.state("a") == state
    assert lim.check.stats() == {"fast": 5, "slow": 1}
    with pytest.raises(ValueError, match="at most"):  # past the bound: the Python path refuses it
        lim.check("a", p, Charge(MAX_COST + 1), T0 + 9)
    assert lim.check.stats() == {"fast": 5, "slow": 2}


def test_pure_python_can_be_forced(monkeypatch):
    monkeypatch.setenv("SHADOWLIMIT_PURE_PYTHON", "1")
    assert not speedups_available()
    assert not LocalLimiter().accelerated
    assert LocalLimiter(speedups=True).accelerated  # an explicit choice wins


@st.composite
def token_bucket_policies(draw):
    average = draw(st.sampled_from([0.001, 0.5, 1, 3, 7.7, 10, 100, 1000, 33.333, 1e6, 1e9]))
    period = draw(st.sampled_from([0.001, 0.01, 0.25, 1.0, 3.0, 60.0, 86_400.0]))
    burst = draw(st.sampled_from([1, 2, 5, 20, 1000, 10**9]))
    try:
        return Policy(average=average, period=period, burst=burst)
    except ValueError:  # refills too slowly to be represented (see test_policy_bounds)
        reject()


@st.composite
def operations(draw):
    policies = draw(st.lists(token_bucket_policies(), min_size=1, max_size=3))
    other = Policy(
        average=5,
        period=1.0,
        algorithm=draw(st.sampled_from([a for a in Algorithm if a is not Algorithm.TOKEN_BUCKET])),
    )
    ops = []
    for _ in range(draw(st.integers(1, 60))):
        key = draw(st.sampled_from(["a", "b", "c", "\u00e9t\u00e9", "x" * 300]))
        kind = draw(st.integers(0, 19))
        policy = other if kind == 0 else draw(st.sampled_from(policies))
        if kind == 1:
            cost = draw(st.one_of(st.integers(1, 5), st.just(0), st.just(10**12), st.just(1.5), st.just(True)))
        elif kind in (2, 3):  # a charge: into debt, a refund, at and past its bounds
            cost = Charge(draw(st.one_of(st.integers(-5, 50), st.sampled_from([10**9, -(10**9), 10**9 + 1, 10**6]))))
        else:
            cost = draw(st.integers(1, 3))
        step = (
            draw(st.one_of(st.integers(-2_000_000, -1), st.integers(0, 3_000_000)))
            if kind < 15
            else draw(st.integers(0, 50))
        )
        ops.append((key, policy, cost, step))
    return ops


def _call(lim, key, policy, cost, now):
    try:
        return ("ok", lim.check(key, policy, cost, now))
    except (ValueError, TypeError) as exc:
        return (type(exc).__name__, str(exc))


def _record(lim, key):
    """Everything the limiter holds for ``key``, comparable."""
    info = lim.info(key)
    return None if info is None else (info.state, info.algorithm, info.last_seen_us, info.expires_us)


@settings(max_examples=400, deadline=None)
@given(ops=operations())
def test_c_and_python_agree_step_by_step(ops):
    fast, slow = LocalLimiter(speedups=True), LocalLimiter(speedups=False)
    now = T0
    for i, (key, policy, cost, step) in enumerate(ops):
        now += step
        a, b = _call(fast, key, policy, cost, now), _call(slow, key, policy, cost, now)
        assert a == b, f"op {i}: C {a} != Python {b} ({policy}, cost={cost!r})"
        assert fast.state(key) == slow.state(key)
        s1, s2 = _record(fast, key), _record(slow, key)
        assert s1 == s2, (
            f"op {i}: record {s1} != {s2} ({policy!r} ttl_us={policy.ttl_us} cost={cost!r} now={now} "
            f"ops={ops[: i + 1]})"
        )
    assert fast.keys() == slow.keys()  # same least-recently-used order


def test_matches_the_pure_function_with_huge_and_odd_timestamps():
    p = Policy(average=3, period=1.0, burst=4)
    lim = LocalLimiter(speedups=True)
    state = None
    for now in [T0, T0 + 1, T0 - 5_000_000, 2**62, 2**62 + 10, 2**70, 2**70 + 1_000_000, 5, 2**70 + 2_000_000]:
        d, state = decide(state, now, p, 1)
        assert lim.check("k", p, 1, now) == d
        assert lim.state("k") == state


def test_reads_its_clock_once_and_honours_a_custom_clock():
    t = [T0]
    calls = []

    def clock():
        calls.append(1)
        return t[0]

    lim = LocalLimiter(clock=clock, speedups=True)
    assert len(calls) == 1  # the store's start (LocalLimiter.started_us)
    assert lim.started_us == lim.forgot_us == T0
    ref = LocalLimiter(speedups=False)
    p = Policy(average=2, burst=3)
    for step in [0, 0, 0, 0, 100_000, 400_000, 2_000_000, 1]:
        t[0] += step
        assert lim.check("k", p) == ref.check("k", p, 1, t[0])
    assert len(calls) == 1 + 8  # once per check


def test_default_clock_is_wall_clock_microseconds():
    import time

    lim = LocalLimiter(speedups=True)
    p = Policy(average=1, burst=1_000)
    lim.check("k", p)
    before = time.time_ns() // 1000
    lim.check("k", p)  # the C path stores its own reading of the clock as last_seen
    after = time.time_ns() // 1000
    assert before <= lim.info("k").last_seen_us <= after


def test_arguments_by_keyword_and_bad_calls():
    lim = LocalLimiter(speedups=True)
    p = Policy(average=10, burst=5)
    lim.check("k", p, now_us=T0)
    d = lim.check(key="k", policy=p, cost=2, now_us=T0)
    assert d.remaining == 2
    assert lim.check("k", p, now_us=T0, cost=1).remaining == 1
    with pytest.raises(TypeError, match="unexpected keyword argument 'price'"):
        lim.check("k", p, price=1)
    with pytest.raises(TypeError, match="multiple values"):
        lim.check("k", p, 1, cost=1)
    with pytest.raises(TypeError):
        lim.check("k")
    with pytest.raises(TypeError):
        lim.check("k", p, 1, T0, 5)
    with pytest.raises(ValueError, match="cost"):
        lim.check("k", p, 6, T0)


def test_threads_lose_no_update_and_double_nothing():
    """8 threads hammer one key (C path) while others insert new keys, sweep and reset
    unrelated keys under the lock (Python path): exactly what is left of the burst
    is admitted."""
    burst = 20_000
    p = Policy(average=1e-3, period=1.0, burst=burst)  # no refill worth a token during the test
    lim = LocalLimiter(speedups=True)  # no eviction: an evicted "hot" would come back full
    lim.check("hot", p, 1, T0)  # admitted: burst - 1 left
    per_thread = 3_000
    admitted = [0] * 8
    stop = threading.Event()

    def hammer(i):
        n = 0
        for j in range(per_thread):
            if lim.check("hot", p, 1, T0 + j).allowed:
                n += 1
        admitted[i] = n

    def churn():
        i = 0
        while not stop.is_set():
            lim.check(f"cold-{i}", p, 1, T0)
            if i % 7 == 0:
                lim.reset(f"cold-{i - 3}")
            if i % 50 == 0:
                lim.sweep(T0)
            i += 1

    churners = [threading.Thread(target=churn) for _ in range(2)]
    workers = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
    for t in churners + workers:
        t.start()
    for t in workers:
        t.join(60)
    stop.set()
    for t in churners:
        t.join(60)
    assert sum(admitted) == min(burst - 1, 8 * per_thread)
    tokens = lim.state("hot")[1]
    assert tokens == pytest.approx(burst - 1 - sum(admitted), abs=1)
    assert lim.check.stats()["fast"] > 0
