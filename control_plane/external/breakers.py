"""One circuit breaker per key of a route, with fixed parameters (5 failures, 30 s open).

The state machine is :class:`limiter.resilience.CircuitBreaker`, the same one that guards
Redis (closed, open, half-open with one trial at a time, an abandoned trial freeing the
slot); a key's breaker opens for a fixed time instead of backing off. This module keeps
only the per-key bookkeeping: which keys have a breaker, when each was last used, which
to forget, and how they are reported.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from limiter.breaker import BreakerState, CircuitBreaker

__all__ = [
    "BREAKER_FAILURE_THRESHOLD",
    "BREAKER_IDLE_EVICT_S",
    "BREAKER_OPEN_S",
    "BreakerSet",
    "KeyBreaker",
    "MAX_BREAKERS",
]

# the fixed parameters (docs/operations.md#external-limits-services)
BREAKER_FAILURE_THRESHOLD = 5
BREAKER_OPEN_S = 30.0
BREAKER_IDLE_EVICT_S = 60.0
MAX_BREAKERS = 10_000

_SWEEP_EVERY_S = 1.0
_ORDER = {BreakerState.OPEN: 0, BreakerState.HALF_OPEN: 1, BreakerState.CLOSED: 2}


class KeyBreaker(CircuitBreaker):
    """One key's breaker: a :class:`~limiter.resilience.CircuitBreaker` that stays open
    for ``open_s`` each time (no backoff, no jitter) and logs nothing itself, plus the
    ``key`` and when it was ``last_used`` (the :class:`BreakerSet`'s clock)."""

    __slots__ = ("key", "last_used")

    def __init__(
        self,
        key: str,
        last_used: float,
        *,
        threshold: int = BREAKER_FAILURE_THRESHOLD,
        open_s: float = BREAKER_OPEN_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            threshold,
            backoff_initial_s=open_s,
            backoff_max_s=open_s,
            jitter=False,
            clock=clock,
            wall_clock=wall_clock,
            name=None,
        )
        self.key = key
        self.last_used = last_used

    @property
    def failures(self) -> int:
        """Consecutive failures (reset by a success)."""
        return self.consecutive_failures


class BreakerSet:
    """A circuit breaker per key, with the fixed parameters by default.

    Closed: calls go through; ``threshold`` consecutive failures open it. Open: no calls
    for ``open_s``; then the next request is the half-open probe (one at a time): its
    success closes the breaker, its failure re-opens it for another ``open_s``. Breakers
    not used for ``idle_s`` are evicted (checked at most once a second, on use), and at
    most ``max_breakers`` are kept (the least recently used goes first). ``clock`` is
    injected (monotonic seconds; ``wall_clock`` stamps failures);
    ``on_transition(breaker, from, to)`` sees every change.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        threshold: int = BREAKER_FAILURE_THRESHOLD,
        open_s: float = BREAKER_OPEN_S,
        idle_s: float = BREAKER_IDLE_EVICT_S,
        max_breakers: int = MAX_BREAKERS,
        on_transition: Callable[[KeyBreaker, BreakerState, BreakerState], None] | None = None,
    ) -> None:
        if threshold < 1 or open_s <= 0 or idle_s <= 0 or max_breakers < 1:
            raise ValueError("BreakerSet: threshold, open_s, idle_s and max_breakers must be positive")
        self.clock = clock
        self.wall_clock = wall_clock
        self.threshold = threshold
        self.open_s = open_s
        self.idle_s = idle_s
        self.max_breakers = max_breakers
        self.on_transition = on_transition
        self._breakers: collections.OrderedDict[str, KeyBreaker] = collections.OrderedDict()
        self._swept_at = clock()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._breakers)

    def __contains__(self, key: object) -> bool:
        return key in self._breakers

    def get(self, key: str) -> KeyBreaker | None:
        return self._breakers.get(key)

    def _touch(self, key: str) -> KeyBreaker:
        now = self.clock()
        if now - self._swept_at >= _SWEEP_EVERY_S:
            self.sweep()
        b = self._breakers.get(key)
        if b is None:
            while len(self._breakers) >= self.max_breakers:
                self._breakers.popitem(last=False)
                self.evicted += 1
            b = self._breakers[key] = KeyBreaker(
                key, now, threshold=self.threshold, open_s=self.open_s, clock=self.clock, wall_clock=self.wall_clock
            )
        else:
            self._breakers.move_to_end(key)
            b.last_used = now
        return b

    def _report(self, b: KeyBreaker, frm: BreakerState) -> None:
        if b.state is not frm and self.on_transition is not None:
            self.on_transition(b, frm, b.state)

    def allow(self, key: str) -> bool:
        """May a call for this key go to the service now? (Takes the half-open probe.)"""
        b = self._touch(key)
        frm = b.state
        ok = b.allow_request()
        self._report(b, frm)
        return ok

    def success(self, key: str) -> None:
        b = self._touch(key)
        frm = b.state
        b.record_success()
        self._report(b, frm)

    def failure(self, key: str, error: str) -> None:
        b = self._touch(key)
        frm = b.state
        b.record_failure(error)
        self._report(b, frm)

    def abandon(self, key: str) -> None:
        """A call that never reached the service (no free slot): frees the probe."""
        b = self._breakers.get(key)
        if b is not None:
            b.abandon_trial()

    def sweep(self) -> int:
        """Evict breakers idle for ``idle_s`` or more; returns how many went."""
        now = self.clock()
        self._swept_at = now
        gone = 0
        while self._breakers:
            key, b = next(iter(self._breakers.items()))
            if now - b.last_used < self.idle_s:
                break  # ordered by last use: the rest are younger
            if b.trial_in_flight:
                self._breakers.move_to_end(key)
                b.last_used = now
                continue
            del self._breakers[key]
            gone += 1
        self.evicted += gone
        return gone

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in BreakerState}
        for b in self._breakers.values():
            out[b.state.value] += 1
        return out

    def describe(self, b: KeyBreaker) -> dict[str, Any]:
        now = self.clock()
        probe = None
        if b.state is BreakerState.OPEN and b.next_probe_at is not None:
            probe = round(max(0.0, b.next_probe_at - now), 3)
        elif b.state is BreakerState.HALF_OPEN:
            probe = 0.0
        opened = b.last_opened_mono
        return {
            "key": b.key,
            "state": b.state.value,
            "failures": b.consecutive_failures,
            "total_failures": b.total_failures,
            "next_probe_in_s": probe,
            "open_for_s": round(now - opened, 3) if opened is not None and b.state is not BreakerState.CLOSED else None,
            "idle_s": round(now - b.last_used, 3),
            "last_error": b.last_error,
        }

    def snapshot(self, limit: int = 100) -> list[dict[str, Any]]:
        """Open and half-open breakers first, then the most recently used."""
        self.sweep()
        items = list(reversed(self._breakers.values()))
        items.sort(key=lambda b: _ORDER[b.state])
        return [self.describe(b) for b in items[:limit]]
