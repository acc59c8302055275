"""Fleet-wide figures, read in the background: every route's last two hours of divergence
counters and its top would-be-blocked keys, refreshed every second so that the API and
the event stream never wait on Redis (a stale view says how old it is and why)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from limiter.errors import BackendError

from .hitters import WouldBeBlocked
from .store import DivergenceStore, StoreUnavailable

if TYPE_CHECKING:
    from .rules import Rules

__all__ = ["FleetViews"]


class FleetViews:
    """The cached fleet-wide views (see the module docstring)."""

    def __init__(
        self,
        divergence: DivergenceStore,
        blocked: WouldBeBlocked,
        client: Any,
        rules: Callable[[], Rules],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.divergence = divergence
        self.blocked = blocked
        self.client = client
        self._rules = rules
        self._clock = clock
        self._views: dict[str, dict[str, Any]] = {}
        self.at: float = 0.0
        self.error: str | None = None

    async def refresh(self) -> None:
        """Read every route's last two hours of fleet-wide counters and top blocked keys."""
        views: dict[str, dict[str, Any]] = {}
        for name in self._rules().names():
            series = await self.divergence.series(name, minutes=120)
            try:
                top = await self.blocked.fleet_top(self.client, name, n=10)
            except (StoreUnavailable, BackendError, OSError):
                top = self.blocked.top(name, n=10)
            views[name] = {"series": series, "top": top}
        self._views = views
        self.at = self._clock()
        self.error = None

    async def run(self, interval_s: float = 1.0) -> None:
        while True:
            try:
                await asyncio.wait_for(self.refresh(), timeout=3.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - stale views are flagged, never fatal
                self.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            await asyncio.sleep(interval_s)

    async def route(self, name: str) -> dict[str, Any] | None:
        """Cached fleet-wide figures for a route (None until the first refresh)."""
        v = self._views.get(name)
        if v is None and not self._views:
            try:
                await asyncio.wait_for(self.refresh(), timeout=2.0)
            except Exception as exc:  # noqa: BLE001
                self.error = f"{type(exc).__name__}: {exc}"
            v = self._views.get(name)
        return v

    def age_s(self) -> float | None:
        return None if not self.at else self._clock() - self.at
