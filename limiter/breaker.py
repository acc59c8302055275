"""The circuit breaker: one state machine for everything that calls a backend that may fail.

:class:`CircuitBreaker` is pure (clocks and randomness injected): closed, open, half-open
with one trial at a time. It guards Redis in :class:`~limiter.resilience.ResilientLimiter`
(exponential backoff with jitter between probes) and each key's calls to an external
limits service in ``control_plane.external`` (a fixed open time, ``jitter=False``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

__all__ = ["BreakerSnapshot", "BreakerState", "CircuitBreaker"]

log = logging.getLogger("shadowlimit.resilience")


class BreakerState(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerSnapshot:
    """The breaker's state, readable by the control plane and the dashboard."""

    state: BreakerState
    consecutive_failures: int
    last_error: str | None
    last_failure_at: float | None  # wall clock, seconds
    opened_at: float | None  # wall clock, seconds
    next_probe_in_s: float | None
    probe_attempt: int
    total_failures: int
    transitions: int

    def to_dict(self) -> dict[str, object]:
        return {
            "state": self.state.value,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
            "last_failure_at": self.last_failure_at,
            "opened_at": self.opened_at,
            "next_probe_in_s": self.next_probe_in_s,
            "probe_attempt": self.probe_attempt,
            "total_failures": self.total_failures,
            "transitions": self.transitions,
        }


class CircuitBreaker:
    """Closed, open, half-open. Timeouts count as failures like any other.

    ``failure_threshold`` consecutive failures open it. While open, nothing is sent;
    a probe is due after ``min(backoff_initial * 2**attempt, backoff_max)`` plus
    jitter in ``[0, delay]`` (``jitter=False``: none, so ``backoff_initial_s ==
    backoff_max_s`` gives a fixed open duration). :meth:`probe_succeeded` half-opens
    it, and so does the first request once the probe is due; in half-open one request
    at a time goes through (the trial), and its success closes the breaker.

    With ``trial_half_opens=False`` (the Redis breaker, which has a background prober) the
    request let through once the probe is due is a trial *while still open*: the state (and
    the gauge an alert watches "for 1m") stays open until something has succeeded; a
    successful probe half-opens it, a successful trial closes it, a failed trial only
    reschedules the next probe. Half-open then always means "Redis answered, one request
    is checking".

    ``clock`` (monotonic) drives the state machine, ``wall_clock`` only stamps
    ``opened_at`` and ``last_failure_at``; ``rng`` draws the jitter. Each transition is
    logged as a warning naming the breaker ``name`` (None: not logged, the owner
    reports it) and passed to ``on_transition(from, to, reason)``.
    """

    __slots__ = (
        "_clock",
        "_opened_mono",
        "_rng",
        "_trial_in_flight",
        "_wall",
        "backoff_initial_s",
        "backoff_max_s",
        "consecutive_failures",
        "failure_threshold",
        "jitter",
        "last_error",
        "last_failure_at",
        "last_opened_mono",
        "name",
        "next_probe_at",
        "on_transition",
        "opened_at",
        "probe_attempt",
        "state",
        "total_failures",
        "transitions",
        "trial_half_opens",
    )

    def __init__(
        self,
        failure_threshold: int = 5,
        *,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        jitter: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        on_transition: Callable[[BreakerState, BreakerState, str | None], None] | None = None,
        name: str | None = "redis",
        trial_half_opens: bool = True,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold: must be >= 1, got {failure_threshold!r}")
        if backoff_initial_s <= 0 or backoff_max_s < backoff_initial_s:
            raise ValueError("backoff: need 0 < backoff_initial_s <= backoff_max_s")
        self.failure_threshold = failure_threshold
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.jitter = jitter
        self._clock = clock
        self._wall = wall_clock
        self._rng = rng
        self.on_transition = on_transition
        self.name = name
        self.trial_half_opens = trial_half_opens
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.total_failures = 0
        self.last_error: str | None = None
        self.last_failure_at: float | None = None
        self.opened_at: float | None = None  # wall clock, when this outage began
        self._opened_mono: float | None = None
        #: monotonic time of the latest move to open (a failed trial re-opens); None when closed
        self.last_opened_mono: float | None = None
        self.next_probe_at: float | None = None  # monotonic
        self.probe_attempt = 0
        self.transitions = 0
        self._trial_in_flight = False

    @property
    def trial_in_flight(self) -> bool:
        """True while the request let through in half-open has not reported back."""
        return self._trial_in_flight

    # -- decisions --------------------------------------------------------------------

    def allow_request(self) -> bool:
        """May a request go to the backend now?"""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            # no background prober (or it is late): traffic may trigger the probe itself
            if self.next_probe_at is None or self._clock() < self.next_probe_at:
                return False
            if self.trial_half_opens:
                self._move(BreakerState.HALF_OPEN, "probe due")
        if self._trial_in_flight:
            return False
        self._trial_in_flight = True
        return True

    def abandon_trial(self) -> None:
        """The request let through by :meth:`allow_request` ended without an answer
        either way (cancelled, or an error that says nothing about the backend): a
        half-open breaker lets the next request be the trial instead of waiting forever."""
        self._trial_in_flight = False

    def record_success(self) -> None:
        self._trial_in_flight = False
        self.consecutive_failures = 0
        if self.state is not BreakerState.CLOSED:
            self.probe_attempt = 0
            self.next_probe_at = None
            self.opened_at = None
            self._opened_mono = None
            self.last_opened_mono = None
            self._move(BreakerState.CLOSED, None)

    def record_failure(self, error: BaseException | str) -> None:
        trial = self._trial_in_flight
        self._trial_in_flight = False
        self.consecutive_failures += 1
        self.total_failures += 1
        self.last_error = str(error) or type(error).__name__
        self.last_failure_at = self._wall()
        if self.state is BreakerState.HALF_OPEN or (self.state is BreakerState.OPEN and trial):
            self.probe_attempt += 1
            self._open()
        elif self.state is BreakerState.CLOSED and self.consecutive_failures >= self.failure_threshold:
            self.probe_attempt = 0
            self._open()

    def probe_due(self) -> bool:
        return (
            self.state is BreakerState.OPEN and self.next_probe_at is not None and self._clock() >= self.next_probe_at
        )

    def probe_succeeded(self) -> None:
        if self.state is BreakerState.OPEN:
            self._move(BreakerState.HALF_OPEN, "probe succeeded")

    def probe_failed(self, error: BaseException | str) -> None:
        self.last_error = str(error) or type(error).__name__
        self.last_failure_at = self._wall()
        self.total_failures += 1
        if self.state is BreakerState.OPEN:
            self.probe_attempt += 1
            self.next_probe_at = self._clock() + self.backoff_delay(self.probe_attempt)

    def backoff_delay(self, attempt: int) -> float:
        """Exponential backoff with full jitter on top: delay + uniform(0, delay) (the
        delay alone without ``jitter``)."""
        delay: float = min(self.backoff_initial_s * (2 ** min(attempt, 30)), self.backoff_max_s)
        if not self.jitter:
            return delay
        return delay + self._rng() * delay

    def open_for_s(self) -> float:
        """How long the breaker has been open (0 when closed)."""
        if self._opened_mono is None:
            return 0.0
        return self._clock() - self._opened_mono

    def snapshot(self) -> BreakerSnapshot:
        nxt = None
        if self.next_probe_at is not None and self.state is BreakerState.OPEN:
            nxt = max(0.0, self.next_probe_at - self._clock())
        return BreakerSnapshot(
            state=self.state,
            consecutive_failures=self.consecutive_failures,
            last_error=self.last_error,
            last_failure_at=self.last_failure_at,
            opened_at=self.opened_at,
            next_probe_in_s=nxt,
            probe_attempt=self.probe_attempt,
            total_failures=self.total_failures,
            transitions=self.transitions,
        )

    def _open(self) -> None:
        now = self._clock()
        if self._opened_mono is None:
            self._opened_mono = now
            self.opened_at = self._wall()
        self.last_opened_mono = now
        self.next_probe_at = now + self.backoff_delay(self.probe_attempt)
        self._move(BreakerState.OPEN, self.last_error)

    def _move(self, to: BreakerState, reason: str | None) -> None:
        frm = self.state
        if frm is to:
            return
        self.state = to
        self.transitions += 1
        if to is not BreakerState.HALF_OPEN:
            self._trial_in_flight = False
        if self.name is not None:
            log.warning("%s circuit breaker %s -> %s (%s)", self.name, frm.value, to.value, reason or "")
        if self.on_transition is not None:
            self.on_transition(frm, to, reason)
