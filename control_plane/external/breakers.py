"""One circuit breaker per key of a route, with seed 000's fixed parameters."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from limiter.resilience import BreakerState

__all__ = [
    "BREAKER_FAILURE_THRESHOLD",
    "BREAKER_IDLE_EVICT_S",
    "BREAKER_OPEN_S",
    "BreakerSet",
    "KeyBreaker",
    "MAX_BREAKERS",
]

# seed 000's fixed parameters
BREAKER_FAILURE_THRESHOLD = 5
BREAKER_OPEN_S = 30.0
BREAKER_IDLE_EVICT_S = 60.0
MAX_BREAKERS = 10_000


@dataclass(slots=True)
class KeyBreaker:
    """One key's breaker. Times are the :class:`BreakerSet`'s clock (monotonic)."""

    key: str
    last_used: float
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0  # consecutive
    total_failures: int = 0
    opened_at: float | None = None
    probe_at: float | None = None
    last_error: str | None = None
    probe_in_flight: bool = False


class BreakerSet:
    """A circuit breaker per key, with seed 000's fixed parameters by default.

    Closed: calls go through; ``threshold`` consecutive failures open it. Open: no calls
    for ``open_s``; then the next request is the half-open probe (one at a time): its
    success closes the breaker, its failure re-opens it for another ``open_s``. Breakers
    not used for ``idle_s`` are evicted (checked at most once a second, on use), and at
    most ``max_breakers`` are kept (the least recently used goes first). ``clock`` is
    injected (monotonic seconds); ``on_transition(breaker, from, to)`` sees every change.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        threshold: int = BREAKER_FAILURE_THRESHOLD,
        open_s: float = BREAKER_OPEN_S,
        idle_s: float = BREAKER_IDLE_EVICT_S,
        max_breakers: int = MAX_BREAKERS,
        on_transition: Callable[[KeyBreaker, BreakerState, BreakerState], None] | None = None,
    ) -> None:
        if threshold < 1 or open_s <= 0 or idle_s <= 0 or max_breakers < 1:
            raise ValueError("BreakerSet: threshold, open_s, idle_s and max_breakers must be positive")
        self.clock = clock
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
        if now - self._swept_at >= 1.0:
            self.sweep()
        b = self._breakers.get(key)
        if b is None:
            while len(self._breakers) >= self.max_breakers:
                self._breakers.popitem(last=False)
                self.evicted += 1
            b = self._breakers[key] = KeyBreaker(key, now)
        else:
            self._breakers.move_to_end(key)
            b.last_used = now
        return b

    def _move(self, b: KeyBreaker, to: BreakerState) -> None:
        frm = b.state
        if frm is to:
            return
        b.state = to
        if self.on_transition is not None:
            self.on_transition(b, frm, to)

    def allow(self, key: str) -> bool:
        """May a call for this key go to the service now? (Takes the half-open probe.)"""
        b = self._touch(key)
        if b.state is BreakerState.CLOSED:
            return True
        if b.state is BreakerState.OPEN:
            if b.probe_at is None or self.clock() < b.probe_at:
                return False
            self._move(b, BreakerState.HALF_OPEN)
        if b.probe_in_flight:
            return False
        b.probe_in_flight = True
        return True

    def success(self, key: str) -> None:
        b = self._touch(key)
        b.probe_in_flight = False
        b.failures = 0
        b.opened_at = b.probe_at = None
        self._move(b, BreakerState.CLOSED)

    def failure(self, key: str, error: str) -> None:
        b = self._touch(key)
        b.probe_in_flight = False
        b.failures += 1
        b.total_failures += 1
        b.last_error = error
        if b.state is BreakerState.HALF_OPEN or (b.state is BreakerState.CLOSED and b.failures >= self.threshold):
            now = self.clock()
            b.opened_at = now
            b.probe_at = now + self.open_s
            self._move(b, BreakerState.OPEN)

    def abandon(self, key: str) -> None:
        """A call that never reached the service (no free slot): frees the probe."""
        b = self._breakers.get(key)
        if b is not None:
            b.probe_in_flight = False

    def sweep(self) -> int:
        """Evict breakers idle for ``idle_s`` or more; returns how many went."""
        now = self.clock()
        self._swept_at = now
        gone = 0
        while self._breakers:
            key, b = next(iter(self._breakers.items()))
            if now - b.last_used < self.idle_s:
                break  # ordered by last use: the rest are younger
            if b.probe_in_flight:
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
        if b.state is BreakerState.OPEN and b.probe_at is not None:
            probe = round(max(0.0, b.probe_at - now), 3)
        elif b.state is BreakerState.HALF_OPEN:
            probe = 0.0
        return {
            "key": b.key,
            "state": b.state.value,
            "failures": b.failures,
            "total_failures": b.total_failures,
            "next_probe_in_s": probe,
            "open_for_s": round(now - b.opened_at, 3)
            if b.opened_at is not None and b.state is not BreakerState.CLOSED
            else None,
            "idle_s": round(now - b.last_used, 3),
            "last_error": b.last_error,
        }

    def snapshot(self, limit: int = 100) -> list[dict[str, Any]]:
        """Open and half-open breakers first, then the most recently used."""
        self.sweep()
        items = list(reversed(self._breakers.values()))
        items.sort(key=lambda b: 0 if b.state is BreakerState.OPEN else 1 if b.state is BreakerState.HALF_OPEN else 2)
        return [self.describe(b) for b in items[:limit]]
