"""The causes of a divergence, pure: each cause from the figures that make it, in the documented
order (clock, fresh_local, then the reference's answer; looser or uneven the other way), the
refill times, what "remembers earlier use" means per algorithm, and the shares in words."""

from __future__ import annotations

from dataclasses import replace

import pytest

from control_plane.model.causes import (
    EXCUSED,
    FORWARD,
    MEANING,
    REVERSE,
    Birth,
    Cause,
    CauseFigures,
    cause_of,
    direction_of,
    is_fresh,
    main_cause,
    more_generous,
    needs_reference,
    no_stricter,
    refill_us,
    remembers,
    summary,
)
from control_plane.model.rollout import Divergence
from limiter import Algorithm, Policy
from limiter.algorithms import decide

T0 = 1_800_000_000_000_000
SEC = 1_000_000
LOCAL = Policy(average=10, period=1.0, burst=10)  # refills in 1 s

#: a new rejection the reference also makes, on an old bucket, clocks in sync
BASE = CauseFigures(
    local_allowed=True,
    global_allowed=False,
    reference_allowed=False,
    now_us=T0,
    local_policy=LOCAL,
    global_policy=LOCAL,
    birth=Birth(created_us=T0 - 60 * SEC, forgot_us=T0 - 3600 * SEC),
    fleet_before=True,
    remembered=True,
    skew_us=1_000,
    tolerance_us=250_000,
    caller_clock=True,
    fleet_size=3,
)
#: the same on a bucket made 0.5 s ago, 0.2 s after the replica started
FRESH = replace(BASE, birth=Birth(created_us=T0 - SEC // 2, forgot_us=T0 - 7 * SEC // 10))


def test_the_reference_tells_the_leak_from_a_tighter_limit():
    assert cause_of(BASE) is Cause.REPLICAS
    stricter = replace(BASE, global_policy=Policy(average=5, period=1.0, burst=5))
    assert cause_of(replace(stricter, reference_allowed=True)) is Cause.TIGHTER
    assert cause_of(stricter) is Cause.REPLICAS
    # only under a stricter global limit is the reference needed: without its answer a new
    # rejection there has no cause (counted unexplained)
    assert needs_reference(stricter.global_policy, LOCAL) and not needs_reference(LOCAL, LOCAL)
    assert cause_of(replace(stricter, reference_allowed=None)) is None
    # under one as generous it is the leak whatever the reference says, so it is not evaluated
    assert cause_of(replace(BASE, reference_allowed=None)) is Cause.REPLICAS
    assert cause_of(replace(BASE, reference_allowed=True)) is Cause.REPLICAS
    looser = Policy(average=30, period=1.0, burst=30)
    assert not needs_reference(looser, LOCAL) and not needs_reference(Policy(average=0, period=1.0), LOCAL)


def test_a_fresh_local_bucket_comes_before_the_reference_and_needs_all_of_its_conditions():
    for reference in (True, False, None):
        assert cause_of(replace(FRESH, reference_allowed=reference)) is Cause.FRESH_LOCAL
    # the global state did not remember earlier use: a new client, not an artifact
    assert cause_of(replace(FRESH, remembered=False)) is Cause.REPLICAS
    # the fleet was not deciding the route before the replica started: nothing to forget
    assert cause_of(replace(FRESH, fleet_before=False)) is Cause.REPLICAS
    # made long after the replica started: the replica never held this key (a new client here)
    late = Birth(created_us=T0 - SEC // 2, forgot_us=T0 - 10 * SEC)
    assert cause_of(replace(FRESH, birth=late)) is Cause.REPLICAS
    # older than the refill time: it has caught up with the bucket it replaced
    old = Birth(created_us=T0 - SEC, forgot_us=T0 - SEC - 1)
    assert cause_of(replace(FRESH, birth=old)) is Cause.REPLICAS
    assert cause_of(replace(FRESH, birth=None)) is Cause.REPLICAS


def test_a_clock_past_the_tolerance_comes_first_on_a_caller_clock_only():
    for skew in (250_001, -3 * SEC):
        assert cause_of(replace(FRESH, skew_us=skew)) is Cause.CLOCK
        assert cause_of(replace(BASE, skew_us=skew, reference_allowed=None)) is Cause.CLOCK
        # Redis' own clock decides (RATE_LIMIT_TIME_SOURCE=redis): the replica's does not matter
        assert cause_of(replace(BASE, skew_us=skew, caller_clock=False)) is Cause.REPLICAS
    assert cause_of(replace(BASE, skew_us=250_000)) is Cause.REPLICAS  # at the tolerance: within it
    assert cause_of(replace(BASE, skew_us=None)) is Cause.REPLICAS  # not measured yet


def test_the_reverse_is_looser_when_the_global_limit_gives_more_than_the_whole_fleet_did():
    reverse = replace(BASE, local_allowed=False, global_allowed=True, skew_us=5 * SEC)
    assert cause_of(replace(reverse, global_policy=Policy(average=30, burst=30))) is Cause.UNEVEN  # = 3 x local
    assert cause_of(replace(reverse, global_policy=Policy(average=31, burst=30))) is Cause.LOOSER  # rate above
    assert cause_of(replace(reverse, global_policy=Policy(average=30, burst=31))) is Cause.LOOSER  # burst above
    assert cause_of(replace(reverse, global_policy=Policy(average=31, burst=31), fleet_size=4)) is Cause.UNEVEN
    assert cause_of(replace(reverse, global_policy=Policy(average=0))) is Cause.LOOSER  # unlimited
    assert not more_generous(Policy(average=1e6), Policy(average=0), 3)  # an unlimited local limit
    # a per-minute global limit against a per-second local one: rates compared per second
    assert more_generous(Policy(average=1800, period=60, burst=10), LOCAL, 3) is False  # 30/s
    assert more_generous(Policy(average=1900, period=60, burst=10), LOCAL, 3) is True  # 31.7/s
    assert more_generous(Policy(average=1800, period=60, burst=31), LOCAL, 3) is True


@pytest.mark.parametrize(
    ("global_policy", "tighter"),
    [
        (LOCAL, False),  # the same limit
        (Policy(average=30, period=1.0, burst=30), False),  # more generous in both
        (Policy(average=5, period=1.0, burst=5), True),  # stricter in both
        (Policy(average=30, period=1.0, burst=5), True),  # a higher rate, a smaller burst
        (Policy(average=5, period=1.0, burst=30), True),  # a larger burst, a lower rate
        (Policy(average=600, period=60.0, burst=10), False),  # the same rate, said per minute
        (Policy.unlimited_policy(), False),
        (Policy.blocking(), True),
    ],
)
def test_only_a_global_limit_stricter_in_rate_or_burst_can_be_tighter(global_policy, tighter):
    """Two buckets at their limits admit different requests of the same traffic: under a
    global limit as generous as the local one, a rejection the reference happens to admit is
    still the fleet multiplying the old limit."""
    figures = replace(BASE, global_policy=global_policy, reference_allowed=True)
    assert no_stricter(global_policy, LOCAL) is not tighter
    assert cause_of(figures) is (Cause.TIGHTER if tighter else Cause.REPLICAS)
    assert no_stricter(global_policy, Policy.unlimited_policy()) is global_policy.unlimited


def test_agreement_has_no_cause():
    assert cause_of(replace(BASE, global_allowed=True)) is None
    assert cause_of(replace(BASE, local_allowed=False, global_allowed=False)) is None


@pytest.mark.parametrize(
    ("policy", "refill"),
    [
        (Policy(average=10, period=1.0, burst=10), SEC),
        (Policy(average=10, period=1.0, burst=5, algorithm="gcra"), SEC // 2),
        (Policy(average=1, period=3600.0, burst=100), 360_000 * SEC),
        (Policy(average=5, period=60.0, algorithm="fixed_window"), 60 * SEC),
        (Policy(average=5, period=60.0, algorithm="sliding_log"), 60 * SEC),
        (Policy(average=5, period=60.0, algorithm="sliding_window"), 120 * SEC),
        (Policy(average=0), 0),
        (Policy.blocking(), 0),
    ],
)
def test_refill_is_the_time_a_policy_takes_to_forget(policy, refill):
    assert refill_us(policy) == refill


def test_fresh_means_young_and_made_soon_after_the_store_forgot():
    assert is_fresh(Birth(created_us=T0, forgot_us=T0 - SEC + 1), T0 + SEC - 1, LOCAL)
    assert not is_fresh(Birth(created_us=T0, forgot_us=T0 - SEC + 1), T0 + SEC, LOCAL)
    assert not is_fresh(Birth(created_us=T0, forgot_us=T0 - SEC), T0, LOCAL)


@pytest.mark.parametrize("alg", list(Algorithm), ids=str)
def test_a_decision_remembers_earlier_use_when_it_differs_from_a_new_keys(alg):
    p = Policy(average=5, period=10.0, burst=5, algorithm=alg)
    new_key, state = decide(None, T0, p, 1)
    assert not remembers(new_key, new_key, alg)
    later, _ = decide(state, T0 + 1_000, p, 1)  # one request 1 ms before
    assert remembers(later, decide(None, T0 + 1_000, p, 1)[0], alg)
    # a bucket full again is a new key's: nothing remembered
    refilled, _ = decide(state, T0 + 100 * SEC, p, 1)
    assert not remembers(refilled, decide(None, T0 + 100 * SEC, p, 1)[0], alg)


def test_the_windows_reset_is_not_compared_a_clock_difference_moves_it():
    p = Policy(average=5, period=10.0, algorithm="fixed_window")
    mine = decide(None, T0, p, 1)[0]
    redis_time = decide(None, T0 + 3_000, p, 1)[0]  # RATE_LIMIT_TIME_SOURCE=redis: another clock
    assert mine.reset_after_us != redis_time.reset_after_us
    assert not remembers(redis_time, mine, p.algorithm)


def test_directions_meanings_and_the_gate_excuses():
    assert set(FORWARD) | set(REVERSE) == set(Cause) and not set(FORWARD) & set(REVERSE)
    assert all(direction_of(c) is Divergence.LOCAL_ALLOW_DISTRIBUTED_DENY for c in FORWARD)
    assert all(direction_of(c) is Divergence.LOCAL_DENY_DISTRIBUTED_ALLOW for c in REVERSE)
    assert set(MEANING) == set(Cause)
    assert Cause.TIGHTER not in EXCUSED and set(EXCUSED) < set(FORWARD)


def test_the_shares_in_words_largest_first():
    assert summary({Cause.TIGHTER: 26, Cause.REPLICAS: 74}) == (
        "74% the fleet multiplied the old limit · 26% the new limit is tighter"
    )
    assert summary({Cause.REPLICAS: 999, Cause.CLOCK: 1}) == (
        ">99% the fleet multiplied the old limit · <1% a replica's clock is off"
    )
    assert summary({Cause.REPLICAS: 1}, unexplained=3) == (
        "75% not explained (no reference evaluated) · 25% the fleet multiplied the old limit"
    )
    assert summary({}) == "" and summary({Cause.TIGHTER: 0}) == ""


def test_the_main_cause_is_the_most_frequent_earlier_on_a_tie():
    assert main_cause({Cause.TIGHTER: 3, Cause.REPLICAS: 2}) is Cause.TIGHTER
    assert main_cause({Cause.TIGHTER: 2, Cause.REPLICAS: 2}) is Cause.REPLICAS
    assert main_cause({Cause.FRESH_LOCAL: 1, Cause.REPLICAS: 1}) is Cause.FRESH_LOCAL
    assert main_cause({}) is None and main_cause({Cause.CLOCK: 0}) is None
