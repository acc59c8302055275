"""This replica's clock against Redis': the offset, measured every few seconds with Redis'
``TIME`` and the round trip taken off. Past the tolerance
(``SHADOWLIMIT_CLOCK_SKEW_TOLERANCE_MS``), a new rejection on a policy decided on the
caller's clock is put down to the clock (control_plane/model/causes.py).

One measurement is a few round trips: the clock is read before (``t0``) and after (``t1``)
each ``TIME`` (``r``), and the one with the shortest round trip gives the offset
``(t0 + t1) / 2 - r``, exact to half that round trip (Redis answers at some moment in
between). The clock is the decisions' (``clock_us``): the offset is the one their stamps carry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from limiter.errors import BackendError

__all__ = ["CHECK_S", "ClockSkew"]

log = logging.getLogger("shadowlimit.engine")

#: how often a replica measures its clock against Redis'
CHECK_S = 5.0


class ClockSkew:
    """The last measured offset of ``clock_us`` from Redis' clock (see the module docstring).

    ``redis_time_us`` asks Redis for its ``TIME`` (integer microseconds); ``on_measure`` gets
    each new offset in microseconds (the gauge). ``offset_us`` is None until a measurement
    succeeded; a failed one keeps the last."""

    def __init__(
        self,
        redis_time_us: Callable[[], Awaitable[int]],
        *,
        clock_us: Callable[[], int],
        tolerance_us: int,
        on_measure: Callable[[int], None] = lambda offset_us: None,
        round_trips: int = 3,
    ) -> None:
        self.redis_time_us = redis_time_us
        self.clock_us = clock_us
        self.tolerance_us = tolerance_us
        self.on_measure = on_measure
        self.round_trips = round_trips
        self.offset_us: int | None = None
        self.round_trip_us: int | None = None
        self.measured_at_us: int | None = None
        self.error: str | None = None

    async def measure(self) -> int:
        """One measurement (raises :class:`~limiter.errors.BackendError` when Redis fails)."""
        best: tuple[int, int] | None = None  # (round trip, offset)
        for _ in range(self.round_trips):
            t0 = self.clock_us()
            r = await self.redis_time_us()
            t1 = self.clock_us()
            sample = (t1 - t0, (t0 + t1) // 2 - r)
            if best is None or sample[0] < best[0]:
                best = sample
        assert best is not None
        self.round_trip_us, self.offset_us = best
        self.measured_at_us = self.clock_us()
        self.error = None
        self.on_measure(self.offset_us)
        return self.offset_us

    @property
    def past_tolerance(self) -> bool:
        return self.offset_us is not None and abs(self.offset_us) > self.tolerance_us

    async def run(self, interval_s: float = CHECK_S) -> None:
        """Measure now, then every ``interval_s``, until cancelled; failures are kept in
        :attr:`error` (and logged once each), never raised."""
        while True:
            try:
                await self.measure()
            except (BackendError, OSError) as exc:
                if self.error is None:
                    log.warning("clock check against Redis failed (the last offset is kept): %s", exc)
                self.error = str(exc) or type(exc).__name__
            await asyncio.sleep(interval_s)

    def snapshot(self) -> dict[str, Any]:
        """``/v1/backend``'s ``clock``."""
        return {
            "offset_ms": None if self.offset_us is None else round(self.offset_us / 1000, 3),
            "round_trip_ms": None if self.round_trip_us is None else round(self.round_trip_us / 1000, 3),
            "tolerance_ms": self.tolerance_us / 1000,
            "past_tolerance": self.past_tolerance,
            "measured_at_us": self.measured_at_us,
            "error": self.error,
        }
