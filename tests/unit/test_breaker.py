"""The circuit breaker as a pure state machine (injected clock and jitter)."""

import pytest

from limiter import Policy
from limiter.resilience import BreakerState, CircuitBreaker, FailurePolicy, fleet_share


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def make(rng=0.0, **kw):
    clock = FakeClock()
    seen = []
    b = CircuitBreaker(
        clock=clock, wall_clock=clock, rng=lambda: rng, on_transition=lambda a, b_, r: seen.append((a, b_)), **kw
    )
    return b, clock, seen


def test_opens_after_threshold_consecutive_failures():
    b, _, seen = make(failure_threshold=3)
    for _ in range(2):
        assert b.allow_request()
        b.record_failure(TimeoutError("timed out"))
    assert b.state is BreakerState.CLOSED
    b.record_success()
    assert b.consecutive_failures == 0
    for _ in range(3):
        b.record_failure("boom")
    assert b.state is BreakerState.OPEN
    assert not b.allow_request()
    assert seen == [(BreakerState.CLOSED, BreakerState.OPEN)]
    assert b.snapshot().last_error == "boom"


def test_timeouts_count_as_failures():
    b, _, _ = make(failure_threshold=1)
    b.record_failure(TimeoutError())
    assert b.state is BreakerState.OPEN
    assert b.last_error == "TimeoutError"


def test_backoff_doubles_to_30s_with_jitter():
    b, _, _ = make(rng=0.5)
    assert [b.backoff_delay(i) for i in range(7)] == [1.5, 3.0, 6.0, 12.0, 24.0, 45.0, 45.0]
    b0, _, _ = make(rng=0.0)
    assert [b0.backoff_delay(i) for i in range(7)] == [1, 2, 4, 8, 16, 30, 30]


def test_probe_cycle_half_open_then_close():
    b, clock, seen = make(failure_threshold=1)
    b.record_failure("down")
    assert b.snapshot().next_probe_in_s == 1.0
    clock.t += 0.5
    assert not b.probe_due()
    clock.t += 0.6
    assert b.probe_due()
    b.probe_failed("still down")
    assert b.probe_attempt == 1 and b.snapshot().next_probe_in_s == 2.0
    clock.t += 2.0
    b.probe_succeeded()
    assert b.state is BreakerState.HALF_OPEN
    assert b.allow_request()  # one trial at a time
    assert not b.allow_request()
    b.record_success()
    assert b.state is BreakerState.CLOSED and b.probe_attempt == 0
    assert [t for _, t in seen] == [BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED]


def test_half_open_failure_reopens_with_longer_backoff():
    b, clock, _ = make(failure_threshold=1)
    b.record_failure("down")
    clock.t += 1.0
    assert b.allow_request()  # traffic half-opens it when the probe is due
    assert b.state is BreakerState.HALF_OPEN
    b.record_failure("again")
    assert b.state is BreakerState.OPEN
    assert b.snapshot().next_probe_in_s == 2.0
    assert b.open_for_s() == pytest.approx(1.0)


def test_failure_policy_parsing():
    assert FailurePolicy.parse("passthrough") is FailurePolicy.PASS_THROUGH
    assert FailurePolicy.parse("failClosed") is FailurePolicy.FAIL_CLOSED
    assert FailurePolicy.parse("in_memory_fallback") is FailurePolicy.IN_MEMORY_FALLBACK
    with pytest.raises(ValueError, match="^failure_policy:"):
        FailurePolicy.parse("yolo")


def test_fleet_share_divides_and_never_below_one():
    p = Policy(average=100, burst=20)
    s = fleet_share(p, 4)
    assert s.average == 25 and s.burst == 5
    tiny = fleet_share(Policy(average=1, burst=2), 8)
    assert tiny.burst == 1 and tiny.average == pytest.approx(1 / 8)
    w = fleet_share(Policy(average=3, period=1, algorithm="fixed_window"), 5)
    assert w.limit == 1
    assert fleet_share(p, 1) is p


def test_fixed_open_duration_without_jitter():
    b, clock, _ = make(rng=0.9, failure_threshold=1, backoff_initial_s=30, backoff_max_s=30, jitter=False)
    assert [b.backoff_delay(i) for i in range(3)] == [30, 30, 30]
    b.record_failure("down")
    assert b.snapshot().next_probe_in_s == 30.0
    clock.t += 29.9
    assert not b.allow_request()
    clock.t += 0.1
    assert b.allow_request() and b.state is BreakerState.HALF_OPEN
    b.record_failure("still down")  # the failed trial re-opens it for another 30 s, not longer
    assert b.snapshot().next_probe_in_s == 30.0


def test_open_times_first_and_latest_opening():
    b, clock, _ = make(failure_threshold=1, backoff_initial_s=10, backoff_max_s=10, jitter=False)
    assert b.last_opened_mono is None and b.open_for_s() == 0.0
    b.record_failure("down")
    assert b.last_opened_mono == 1000.0 and b.opened_at == 1000.0
    clock.t += 10
    assert b.allow_request()
    b.record_failure("again")
    assert b.last_opened_mono == 1010.0  # re-opened now ...
    assert b.open_for_s() == 10.0 and b.opened_at == 1000.0  # ... in an outage that began earlier
    clock.t += 10
    assert b.allow_request()
    b.record_success()
    assert b.last_opened_mono is None and b.opened_at is None and b.open_for_s() == 0.0


def test_trial_in_flight_and_abandoned_trial():
    b, clock, _ = make(failure_threshold=1)
    b.record_failure("down")
    clock.t += 1.0
    assert not b.trial_in_flight
    assert b.allow_request() and b.trial_in_flight
    assert not b.allow_request()
    b.abandon_trial()  # the trial was cancelled: the next request becomes the trial
    assert not b.trial_in_flight and b.state is BreakerState.HALF_OPEN
    assert b.allow_request()


def test_transitions_are_logged_under_the_breakers_name(caplog):
    caplog.set_level("WARNING", logger="shadowlimit.resilience")
    b, _, _ = make(failure_threshold=1, name="billing")
    b.record_failure("down")
    assert [r.getMessage() for r in caplog.records] == ["billing circuit breaker closed -> open (down)"]
    caplog.clear()
    quiet, _, seen = make(failure_threshold=1, name=None)
    quiet.record_failure("down")
    assert caplog.records == [] and seen == [(BreakerState.CLOSED, BreakerState.OPEN)]  # the owner still hears it


def test_redis_breaker_stays_open_through_failed_trials_and_half_opens_only_on_success(caplog):
    """trial_half_opens=False (the Redis breaker): a trial let through once the probe is due
    leaves the state open (no open -> half_open line, no gauge flip that resets a "for 1m"
    alert); a failed trial reschedules the probe; a successful probe half-opens it; a
    successful trial closes it."""
    caplog.set_level("WARNING", logger="shadowlimit.resilience")
    b, clock, seen = make(failure_threshold=1, trial_half_opens=False, jitter=False)
    b.record_failure("down")
    assert seen == [(BreakerState.CLOSED, BreakerState.OPEN)]
    for attempt in range(1, 4):
        clock.t += b.snapshot().next_probe_in_s
        assert b.allow_request() and b.state is BreakerState.OPEN and b.trial_in_flight
        assert not b.allow_request()  # still one trial at a time
        b.record_failure("still down")
        assert b.state is BreakerState.OPEN and b.probe_attempt == attempt
        assert b.snapshot().next_probe_in_s == min(2.0**attempt, 30.0)
    assert seen == [(BreakerState.CLOSED, BreakerState.OPEN)]  # no flapping in between
    assert [r.getMessage() for r in caplog.records if "->" in r.getMessage()] == [
        "redis circuit breaker closed -> open (down)"
    ]
    b.probe_succeeded()  # Redis answered the background probe: now one request checks
    assert b.state is BreakerState.HALF_OPEN and b.allow_request()
    b.record_success()
    assert b.state is BreakerState.CLOSED
    assert [t for _, t in seen] == [BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED]
    # a trial that succeeds while still open closes it directly
    b.record_failure("down again")
    clock.t += b.snapshot().next_probe_in_s
    assert b.allow_request() and b.state is BreakerState.OPEN
    b.record_success()
    assert b.state is BreakerState.CLOSED and seen[-1] == (BreakerState.OPEN, BreakerState.CLOSED)


def test_late_failures_while_open_do_not_push_the_probe_out():
    b, clock, _ = make(failure_threshold=1, trial_half_opens=False, jitter=False)
    b.record_failure("down")
    clock.t += 0.5
    b.record_failure("a request sent before the breaker opened")  # not a trial
    assert b.probe_attempt == 0 and b.snapshot().next_probe_in_s == 0.5
