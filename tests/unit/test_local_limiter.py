"""LocalLimiter: the pure algorithms over a bounded, thread-safe key map.

Covers the basics for every algorithm, ``peek`` (never consumes), ``reset`` /
``keys`` / ``items``, LRU eviction at ``max_keys``, ``sweep`` (drops a key only
once it is equivalent to a fresh one), thread safety (no lost updates), cost
validation and algorithm changes for one key.
"""

from __future__ import annotations

import random
import threading

import pytest

from limiter import Algorithm, BucketView, Decision, LocalLimiter, Policy
from limiter.algorithms import decide, peek, token_bucket_tokens

T0 = 1_700_000_000_000_000
SEC = 1_000_000

# One policy per algorithm with a limit of 5 per second.
POLICIES = {
    Algorithm.TOKEN_BUCKET: Policy(average=10, period=1.0, burst=5, algorithm="token_bucket"),
    Algorithm.GCRA: Policy(average=10, period=1.0, burst=5, algorithm="gcra"),
    Algorithm.FIXED_WINDOW: Policy(average=5, period=1.0, algorithm="fixed_window"),
    Algorithm.SLIDING_WINDOW: Policy(average=5, period=1.0, algorithm="sliding_window"),
    Algorithm.SLIDING_LOG: Policy(average=5, period=1.0, algorithm="sliding_log"),
}
ALGS = list(Algorithm)


@pytest.fixture(autouse=True, params=["c", "python"])
def implementation(request, monkeypatch):
    """Every test here runs twice: with the C hot path of check() and with the pure
    Python LocalLimiter (SHADOWLIMIT_PURE_PYTHON=1), which must behave the same."""
    monkeypatch.setenv("SHADOWLIMIT_PURE_PYTHON", "1" if request.param == "python" else "0")
    assert LocalLimiter().accelerated == (request.param == "c"), "the C extension limiter._speedups is not built"
    return request.param


def _pure(policy: Policy, requests: list[tuple[int, int]]) -> list[Decision]:
    state = None
    out = []
    for now, cost in requests:
        d, state = decide(state, now, policy, cost)
        out.append(d)
    return out


# ---------------------------------------------------------------------------
# basics
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ALGS, ids=str)
def test_burst_is_allowed_then_denied(alg):
    policy = POLICIES[alg]
    lim = LocalLimiter()
    now = T0  # window aligned (T0 is a whole second)
    decisions = [lim.check("k", policy, now_us=now) for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert [d.remaining for d in decisions[:5]] == [4, 3, 2, 1, 0]
    assert all(d.limit == 5 for d in decisions)
    assert all(d.retry_after_us == 0 for d in decisions[:5])
    denied = decisions[5]
    assert denied.remaining == 0
    assert denied.retry_after_us > 0
    # retry_after is exact: at now + retry the request is allowed, one microsecond
    # earlier it is not (checked on copies of the state through the pure function)
    state = lim.state("k")
    ok, _ = decide(state, now + denied.retry_after_us, policy, 1)
    early, _ = decide(state, now + denied.retry_after_us - 1, policy, 1)
    assert ok.allowed and not early.allowed


@pytest.mark.parametrize("alg", ALGS, ids=str)
def test_decisions_equal_the_pure_function(alg):
    policy = POLICIES[alg]
    rng = random.Random(alg.value)
    now = T0
    requests = []
    for _ in range(300):
        r = rng.random()
        if r < 0.1:
            now -= rng.randrange(1, policy.period_us)  # out of order
        elif r < 0.5:
            pass
        else:
            now += rng.randrange(0, policy.period_us // 3)
        requests.append((now, rng.randint(1, 3)))
    lim = LocalLimiter()
    got = [lim.check("key", policy, cost, now_us=t) for t, cost in requests]
    assert got == _pure(policy, requests)
    assert any(d.allowed for d in got) and any(not d.allowed for d in got)


@pytest.mark.parametrize("alg", ALGS, ids=str)
def test_keys_are_independent(alg):
    policy = POLICIES[alg]
    lim = LocalLimiter()
    for _ in range(5):
        assert lim.check("a", policy, now_us=T0).allowed
    assert not lim.check("a", policy, now_us=T0).allowed
    assert lim.check("b", policy, now_us=T0).allowed
    assert lim.check("b", policy, now_us=T0).remaining == 3


@pytest.mark.parametrize("alg", ALGS, ids=str)
def test_unlimited_policy_always_allows_and_stores_nothing(alg):
    policy = Policy(average=0, algorithm=alg)
    lim = LocalLimiter()
    for _ in range(100):
        d = lim.check("k", policy, now_us=T0)
        assert d.allowed and d.retry_after_us == 0
    assert len(lim) == 0 and "k" not in lim


def test_uses_the_injected_clock_when_now_is_omitted():
    t = [T0]
    lim = LocalLimiter(clock=lambda: t[0])
    policy = POLICIES[Algorithm.TOKEN_BUCKET]  # 10/s, burst 5
    for _ in range(5):
        assert lim.check("k", policy).allowed
    assert not lim.check("k", policy).allowed
    t[0] += 100_000  # one token
    assert lim.check("k", policy).allowed
    assert not lim.check("k", policy).allowed
    assert lim.state("k") == (T0 + 100_000, pytest.approx(0.0, abs=1e-9))


# ---------------------------------------------------------------------------
# peek
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ALGS, ids=str)
def test_peek_does_not_consume(alg):
    policy = POLICIES[alg]
    lim = LocalLimiter()
    view = lim.peek("k", policy, now_us=T0)
    assert isinstance(view, BucketView)
    assert (view.tokens, view.limit, view.exists) == (5.0, 5, False)
    assert "k" not in lim  # peeking an unknown key records nothing
    lim.check("k", policy, cost=2, now_us=T0)
    state = lim.state("k")
    keys_before = lim.keys()
    for _ in range(50):
        v = lim.peek("k", policy, now_us=T0)
        assert v.exists and v.limit == 5 and v.tokens == 3.0
        assert v.reset_after_us > 0
    assert lim.state("k") == state
    assert lim.keys() == keys_before
    # still exactly 3 left
    assert [lim.check("k", policy, now_us=T0).allowed for _ in range(4)] == [True, True, True, False]


@pytest.mark.parametrize("alg", ALGS, ids=str)
def test_peek_unknown_key_is_at_full_allowance(alg):
    """BUG (windowed algorithms): an unknown key is already at its full allowance,
    so ``reset_after_us`` must be 0 (as for token_bucket and gcra). peek() reuses
    ``decide(state, now, policy, 0)`` whose *allowed* branch assumes something was
    just consumed, and reports one window (fixed_window, sliding_log) or two
    (sliding_window) instead."""
    view = LocalLimiter().peek("nobody", POLICIES[alg], now_us=T0 + 123)
    assert view == BucketView(5.0, 5, False, 0)


def test_peek_token_bucket_fractional_tokens_after_refill():
    policy = POLICIES[Algorithm.TOKEN_BUCKET]  # 10/s, burst 5
    lim = LocalLimiter()
    lim.check("k", policy, cost=4, now_us=T0)  # 1 left
    view = lim.peek("k", policy, now_us=T0 + 150_000)  # + 1.5 tokens
    assert view.tokens == token_bucket_tokens(lim.state("k"), T0 + 150_000, policy)
    assert view.tokens == pytest.approx(2.5, abs=1e-9)
    assert view.reset_after_us == 250_000
    assert view.exists
    # refill is capped at the burst
    assert lim.peek("k", policy, now_us=T0 + 60 * SEC).tokens == 5.0
    # peek with another algorithm's policy sees no state for that algorithm
    assert not lim.peek("k", POLICIES[Algorithm.GCRA], now_us=T0).exists


# ---------------------------------------------------------------------------
# check with cost 0: the pure peek, nothing recorded
# ---------------------------------------------------------------------------


def _record(lim: LocalLimiter):
    return [(i.key, i.algorithm, i.state, i.last_seen_us, i.expires_us) for i in lim.items()], lim.evicted, lim.expired


@pytest.mark.parametrize("alg", ALGS, ids=str)
def test_check_cost_zero_is_the_pure_peek_and_records_nothing(alg):
    policy = POLICIES[alg]
    lim = LocalLimiter(max_keys=3)
    # an unknown key: a fresh key's peek, and no key is created (nor one evicted)
    for k in ("a", "b", "c"):
        lim.check(k, policy, 1, T0)
    before = _record(lim)
    assert lim.check("new", policy, 0, T0) == peek(None, T0, policy) == Decision(True, 5, 5, 0, 0)
    assert _record(lim) == before and "new" not in lim
    # a known key, partly used, then exhausted; at later and older times
    lim.check("a", policy, 2, T0 + 1)
    for now in (T0 + 1, T0 + 300_000, T0 - 5 * SEC, T0 + 10 * SEC):
        before = _record(lim)
        d = lim.check("a", policy, 0, now)
        assert d == peek(lim.state("a"), now, policy)
        assert _record(lim) == before  # no LRU move, no last-seen or expiry update
    d = lim.check("a", policy, 0, T0 + 1)
    assert d.allowed and d.remaining == 2 and d.retry_after_us == 0 and d.reset_after_us > 0
    lim.check("a", policy, 2, T0 + 1)
    d = lim.check("a", policy, 0, T0 + 1)
    assert not d.allowed and d.remaining == 0 and d.retry_after_us > 0
    assert d == decide(lim.state("a"), T0 + 1, policy, 1)[0]  # the denied branch's answer
    assert lim.keys() == ["b", "c", "a"]


def test_check_cost_zero_on_another_algorithms_key_sees_a_fresh_key():
    lim = LocalLimiter()
    for _ in range(5):
        lim.check("k", POLICIES[Algorithm.TOKEN_BUCKET], 1, T0)
    state = lim.state("k")
    gcra = POLICIES[Algorithm.GCRA]
    assert lim.check("k", gcra, 0, T0) == peek(None, T0, gcra)
    assert lim.state("k") == state and next(lim.items()).algorithm is Algorithm.TOKEN_BUCKET


def test_check_cost_zero_for_an_unlimited_policy():
    lim = LocalLimiter()
    assert lim.check("k", Policy.unlimited_policy(), 0, T0) == Decision(True, 1, 1, 0, 0)
    assert len(lim) == 0


def test_c_path_hands_a_peek_to_python_and_changes_nothing():
    """The C hot path only takes a cost of 1 to the limit: a known token-bucket key peeked
    with cost 0 goes to the Python path, which records nothing."""
    policy = POLICIES[Algorithm.TOKEN_BUCKET]
    lim = LocalLimiter(speedups=True)
    lim.check("k", policy, 1, T0)  # new key: Python
    lim.check("k", policy, 2, T0 + 10)  # known key: C
    assert lim.check.stats() == {"fast": 1, "slow": 1}
    before = _record(lim)
    d = lim.check("k", policy, 0, T0 + 50_000)
    assert d == peek(lim.state("k"), T0 + 50_000, policy)
    assert d.allowed and d.remaining == 2  # 2 tokens and a half
    assert lim.check.stats() == {"fast": 1, "slow": 2}
    assert _record(lim) == before
    lim.check("k", policy, 2, T0 + 20)
    d = lim.check("k", policy, 0, T0 + 20)
    assert not d.allowed and d.retry_after_us > 0
    assert lim.check.stats() == {"fast": 2, "slow": 3}


# ---------------------------------------------------------------------------
# a blocking policy: denied, nothing stored
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cost", [1, 7, 10**6, 0])
def test_blocking_policy_is_denied_and_stores_nothing(cost):
    policy = Policy.blocking(60)
    lim = LocalLimiter()
    now = T0 + 15 * SEC  # T0 is a whole minute plus 20 s
    end = 60 * SEC - now % (60 * SEC)
    for _ in range(3):
        assert lim.check("k", policy, cost, now) == Decision(False, 0, 0, end, end)
    assert len(lim) == 0 and "k" not in lim


def test_blocking_policy_leaves_an_existing_key_alone():
    lim = LocalLimiter()
    fixed = POLICIES[Algorithm.FIXED_WINDOW]
    lim.check("k", fixed, 2, T0)
    lim.check("j", fixed, 1, T0)
    before = _record(lim)
    d = lim.check("k", Policy.blocking(1.0), 1, T0 + 5)
    assert d == Decision(False, 0, 0, SEC - 5, SEC - 5)
    assert _record(lim) == before


@pytest.mark.parametrize("cost", [-1, 1.5, "1", None, True, 0.0])
def test_blocking_policy_still_refuses_bad_costs(cost):
    with pytest.raises(ValueError, match="^cost:"):
        LocalLimiter().check("k", Policy.blocking(1.0), cost, T0)


def test_blocking_policy_never_takes_the_c_fast_path():
    """The C path handles token buckets only (and checks the cost against the limit): a
    blocking policy, even on a key holding a token bucket, goes to Python every time."""
    lim = LocalLimiter(speedups=True)
    tb = POLICIES[Algorithm.TOKEN_BUCKET]
    lim.check("k", tb, 1, T0)
    lim.check("k", tb, 1, T0)
    assert lim.check.stats() == {"fast": 1, "slow": 1}
    state = lim.state("k")
    blocking = Policy.blocking(1.0)
    for i in range(5):
        assert not lim.check("k", blocking, 1, T0 + i).allowed
    assert lim.check.stats() == {"fast": 1, "slow": 6}
    assert lim.state("k") == state
    assert not lim.check("new", blocking).allowed  # the C clock path too
    assert "new" not in lim


# ---------------------------------------------------------------------------
# reset / keys / items
# ---------------------------------------------------------------------------


def test_reset_keys_items_and_clear():
    policy = POLICIES[Algorithm.TOKEN_BUCKET]
    lim = LocalLimiter()
    for i, k in enumerate(["a", "b", "c"]):
        lim.check(k, policy, now_us=T0 + i)
    lim.check("a", policy, now_us=T0 + 10)  # a becomes most recently used
    assert lim.keys() == ["b", "c", "a"]
    assert len(lim) == 3 and "b" in lim and "zzz" not in lim

    items = list(lim.items())
    assert [i.key for i in items] == ["b", "c", "a"]
    a = items[-1]
    assert a.algorithm is Algorithm.TOKEN_BUCKET
    assert a.state == lim.state("a")
    assert a.last_seen_us == T0 + 10
    assert a.expires_us >= T0 + 10 + policy.ttl_s * SEC
    assert "a" in repr(a)

    # exhaust b, then reset it: it is fresh again
    for _ in range(10):
        lim.check("b", policy, now_us=T0)
    assert not lim.check("b", policy, now_us=T0).allowed
    assert lim.reset("b") is True
    assert lim.reset("b") is False
    assert lim.reset("never-seen") is False
    assert "b" not in lim
    assert lim.check("b", policy, now_us=T0).remaining == 4

    lim.clear()
    assert len(lim) == 0 and lim.keys() == [] and list(lim.items()) == []


def test_items_is_a_snapshot():
    policy = POLICIES[Algorithm.FIXED_WINDOW]
    lim = LocalLimiter()
    for k in "abcd":
        lim.check(k, policy, now_us=T0)
    it = lim.items()
    first = next(it)
    lim.clear()  # mutating while iterating must not break the iterator
    rest = list(it)
    assert [first.key] + [i.key for i in rest] == list("abcd")


def test_max_keys_must_be_positive():
    with pytest.raises(ValueError, match="^max_keys:"):
        LocalLimiter(max_keys=0)


# ---------------------------------------------------------------------------
# eviction
# ---------------------------------------------------------------------------


def test_eviction_drops_about_ten_percent_least_recently_used():
    policy = POLICIES[Algorithm.TOKEN_BUCKET]
    lim = LocalLimiter(max_keys=100)
    for i in range(100):
        lim.check(f"k{i}", policy, now_us=T0 + i)
    assert len(lim) == 100 and lim.evicted == 0
    # touch k0 and k5: they become the most recently used
    lim.check("k0", policy, now_us=T0 + 1000)
    lim.check("k5", policy, now_us=T0 + 1001)
    lim.check("new", policy, now_us=T0 + 1002)  # at the cap: evict 10 LRU keys
    assert lim.evicted == 10
    assert len(lim) == 91
    keys = set(lim.keys())
    evicted = {f"k{i}" for i in [1, 2, 3, 4, 6, 7, 8, 9, 10, 11]}
    assert not (evicted & keys)
    assert {"k0", "k5", "new", "k12", "k99"} <= keys
    # the survivors kept their state: k0 consumed twice
    assert lim.peek("k0", policy, now_us=T0 + 1000).tokens == pytest.approx(3.0 + 1000 * policy.rate_per_us)
    # peek does not count as a use for the LRU order
    lim.peek("k12", policy, now_us=T0 + 2000)
    for i in range(9):
        lim.check(f"fill{i}", policy, now_us=T0 + 2000)
    assert len(lim) == 100
    lim.check("one-more", policy, now_us=T0 + 3000)
    assert "k12" not in lim and "k0" in lim and "new" in lim
    assert len(lim) == 91


def test_eviction_with_a_single_key_capacity():
    policy = POLICIES[Algorithm.GCRA]
    lim = LocalLimiter(max_keys=1)
    lim.check("a", policy, now_us=T0)
    lim.check("b", policy, now_us=T0)
    assert lim.keys() == ["b"]
    # re-checking an existing key at the cap evicts nothing
    lim.check("b", policy, now_us=T0)
    assert lim.keys() == ["b"] and lim.evicted == 1


# ---------------------------------------------------------------------------
# sweep
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ALGS, ids=str)
def test_sweep_removes_keys_idle_past_their_ttl(alg):
    policy = POLICIES[alg]
    lim = LocalLimiter()
    lim.check("old", policy, cost=3, now_us=T0)
    (old,) = [i for i in lim.items() if i.key == "old"]
    # just before "old" expires (inserting a key also sweeps idle ones)
    lim.check("young", policy, now_us=old.expires_us - 1)
    assert old.expires_us >= T0 + policy.ttl_s * SEC
    assert lim.sweep(old.expires_us - 1) == 0
    assert lim.keys() == ["old", "young"]
    assert lim.sweep(old.expires_us) == 1
    assert lim.keys() == ["young"]
    assert lim.expired == 1
    assert lim.sweep(T0 + 1000 * SEC) == 1
    assert len(lim) == 0 and lim.expired == 2


def test_inserting_a_key_drops_idle_ones():
    policy = POLICIES[Algorithm.TOKEN_BUCKET]
    lim = LocalLimiter()
    lim.check("old", policy, now_us=T0)
    (old,) = list(lim.items())
    lim.check("new", policy, now_us=old.expires_us)
    assert lim.keys() == ["new"] and lim.expired == 1


@pytest.mark.parametrize("alg", ALGS, ids=str)
def test_a_swept_key_is_equivalent_to_a_fresh_one(alg):
    """At the moment a key may be swept, its state decides like no state at all."""
    policy = POLICIES[alg]
    rng = random.Random(f"fresh-{alg.value}")
    for _ in range(200):
        lim = LocalLimiter()
        now = T0 + rng.randrange(0, 3 * SEC)
        for _ in range(rng.randint(1, 12)):
            now += rng.choice([0, 0, rng.randrange(0, policy.period_us)])
            lim.check("k", policy, rng.randint(1, 3), now_us=now)
        (info,) = list(lim.items())
        t = info.expires_us
        state = lim.state("k")
        for later in (t, t + 1, t + rng.randrange(0, 5 * SEC)):
            for cost in (1, 3, 5):
                assert decide(state, later, policy, cost)[0] == decide(None, later, policy, cost)[0]
        assert lim.sweep(t) == 1


@pytest.mark.parametrize("alg", ALGS, ids=str)
def test_sweep_never_changes_a_later_decision(alg):
    """Sweeping at every step gives the same decisions as a limiter that never sweeps
    (requests may arrive out of order by less than a period)."""
    policy = POLICIES[alg]
    rng = random.Random(f"sweep-{alg.value}")
    swept = LocalLimiter()
    kept = LocalLimiter()
    keys = [f"k{i}" for i in range(6)]
    clock = T0
    dropped = 0
    for step in range(3000):
        r = rng.random()
        if r < 0.02:
            clock += rng.randrange(policy.ttl_s * SEC, 3 * policy.ttl_s * SEC)  # long idle gap
        elif r < 0.6:
            clock += rng.randrange(0, policy.period_us // 4)
        now = clock - rng.randrange(0, policy.period_us // 2) if rng.random() < 0.2 else clock
        key = rng.choice(keys)
        cost = rng.randint(1, 3)
        a = swept.check(key, policy, cost, now_us=now)
        b = kept.check(key, policy, cost, now_us=now)
        assert a == b, (step, key)
        if rng.random() < 0.3:
            dropped += swept.sweep(clock)
    assert dropped > 20  # the sweeps did drop keys along the way
    assert len(kept) == len(keys)


def test_incremental_sweep_during_checks_is_harmless():
    """Every few thousand checks the LRU end is swept; decisions stay identical."""
    policy = POLICIES[Algorithm.TOKEN_BUCKET]
    a = LocalLimiter()
    rng = random.Random(7)
    now = T0
    reqs = []
    for _ in range(10_000):
        now += rng.randrange(0, 20_000)
        reqs.append((f"k{rng.randrange(200)}", now))
    state = {}
    for key, t in reqs:
        got = a.check(key, policy, now_us=t)
        exp, state[key] = decide(state.get(key), t, policy, 1)
        assert got == exp
    assert a.expired > 0  # some idle keys were dropped on the way


# ---------------------------------------------------------------------------
# thread safety
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("alg", [Algorithm.TOKEN_BUCKET, Algorithm.GCRA], ids=str)
def test_threads_lose_no_updates(alg):
    policy = Policy(average=0.001, period=1.0, burst=5000, algorithm=alg)
    lim = LocalLimiter()
    now = T0
    start = threading.Barrier(8)
    counts = [0] * 8
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            start.wait(timeout=10)
            n = 0
            for _ in range(2000):
                if lim.check("shared", policy, now_us=now).allowed:
                    n += 1
            counts[i] = n
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert not any(t.is_alive() for t in threads)
    assert sum(counts) == 5000
    assert lim.peek("shared", policy, now_us=now).tokens < 1


def test_threads_on_many_keys_keep_the_map_consistent():
    policy = Policy(average=1, period=1.0, burst=3)
    lim = LocalLimiter(max_keys=500)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for j in range(3000):
                lim.check(f"t{i}-{j % 700}", policy, now_us=T0 + j)
                if j % 500 == 0:
                    lim.sweep(T0)
                    list(lim.items())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert 0 < len(lim) <= 500
    assert lim.evicted > 0


# ---------------------------------------------------------------------------
# cost validation and algorithm changes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cost", [-1, 1.5, "1", None, True, False, 0.0, 6, 100])
@pytest.mark.parametrize("alg", ALGS, ids=str)
def test_invalid_cost_raises(alg, cost):
    """Only an int 0 is a peek: 0.0 and False are refused like any bad cost."""
    lim = LocalLimiter()
    with pytest.raises(ValueError) as exc:
        lim.check("k", POLICIES[alg], cost=cost, now_us=T0)
    assert str(exc.value).startswith("cost:")
    assert "k" not in lim


@pytest.mark.parametrize("cost", [-3, 2.5, "x", 0.0])
def test_invalid_cost_raises_for_an_unlimited_policy_too(cost):
    with pytest.raises(ValueError, match="^cost:"):
        LocalLimiter().check("k", Policy.unlimited_policy(), cost=cost, now_us=T0)


@pytest.mark.parametrize("cost", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_cost_raises_a_cost_error(cost):
    """BUG: validate_cost evaluates ``cost != int(cost)``; int() raises its own
    ValueError ("cannot convert float NaN to integer") for nan and an OverflowError
    (not even a ValueError) for +-inf, instead of a ValueError starting "cost:"."""
    with pytest.raises(ValueError, match="^cost:"):
        LocalLimiter().check("k", POLICIES[Algorithm.TOKEN_BUCKET], cost=cost, now_us=T0)


def test_whole_float_cost_and_full_limit_cost_are_accepted():
    policy = POLICIES[Algorithm.TOKEN_BUCKET]
    lim = LocalLimiter()
    d = lim.check("k", policy, cost=2.0, now_us=T0)
    assert d.allowed and d.remaining == 3
    d = lim.check("j", policy, cost=5, now_us=T0)
    assert d.allowed and d.remaining == 0


@pytest.mark.parametrize("first", ALGS, ids=str)
@pytest.mark.parametrize("second", ALGS, ids=str)
def test_algorithm_change_starts_fresh(first, second):
    p1, p2 = POLICIES[first], POLICIES[second]
    lim = LocalLimiter()
    for _ in range(5):
        lim.check("k", p1, now_us=T0)
    assert not lim.check("k", p1, now_us=T0).allowed
    d = lim.check("k", p2, now_us=T0)
    if first is second:
        assert not d.allowed  # same algorithm: state is kept
        return
    # a different algorithm: the key starts fresh
    assert d == decide(None, T0, p2, 1)[0]
    assert d.allowed and d.remaining == 4
    (info,) = list(lim.items())
    assert info.algorithm is second
    # and switching back starts fresh again
    d = lim.check("k", p1, now_us=T0)
    assert d.allowed and d.remaining == 4


# ---------------------------------------------------------------------------
# when a bucket was made, and when the store last forgot buckets
# ---------------------------------------------------------------------------


def test_a_bucket_knows_when_it_was_made_and_when_the_store_last_forgot():
    t = [T0]
    lim = LocalLimiter(max_keys=10, clock=lambda: t[0])
    assert lim.started_us == lim.forgot_us == T0
    p = POLICIES[Algorithm.TOKEN_BUCKET]
    assert lim.birth("k") is None
    lim.check("k", p, now_us=T0 + 5)
    for i in range(20):  # the C path (a known key) leaves the birth alone
        lim.check("k", p, now_us=T0 + 10 + i)
    assert lim.birth("k") == (T0 + 5, T0)
    info = lim.info("k")
    assert info is not None and (info.created_us, info.forgot_us) == (T0 + 5, T0)
    # a change of algorithm makes a new bucket: made now, forgotten now
    lim.check("k", POLICIES[Algorithm.GCRA], now_us=T0 + 100)
    assert lim.birth("k") == (T0 + 100, T0 + 100)
    # an eviction at the cap: the store forgot buckets then, and says so to the next ones
    for i in range(10):
        lim.check(f"other-{i}", p, now_us=T0 + 200 + i)
    assert lim.evicted == 1 and lim.forgot_us == T0 + 209 and lim.birth("k") is None
    assert lim.birth("other-8") == (T0 + 208, T0)  # made before the eviction
    assert lim.birth("other-9") == (T0 + 209, T0 + 209)  # made by it
    lim.check("other-9", p, now_us=T0 + 250)
    assert lim.birth("other-9") == (T0 + 209, T0 + 209)
    assert [(i.key, i.created_us) for i in lim.items()][-1] == ("other-9", T0 + 209)
    # cleared: everything forgotten at the clock's time
    t[0] = T0 + 400
    lim.clear()
    assert lim.forgot_us == T0 + 400 and lim.birth("new") is None
