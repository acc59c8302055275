"""Fleet-wide figures, read in the background: every route's last two hours of divergence
counters and its top would-be-blocked keys, refreshed every second so that the API and
the event stream never wait on Redis (a stale view says how old it is and why).

At most ``max_routes`` routes (``SHADOWLIMIT_METRICS_MAX_ROUTES``, in the rules' order) are
read in the background, a slice at a time; a route past them (one of thousands of Envoy
descriptors) is read when the API asks for it, and kept a few seconds."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from limiter.errors import BackendError

from ..model.candidate import Candidate, blocked_view_name
from ..store import DivergenceStore, StoreUnavailable
from .hitters import WouldBeBlocked

if TYPE_CHECKING:
    from ..rules import Rules

__all__ = ["ASKED_FRESH_S", "ASKED_KEPT", "CHUNK", "SLICE_PAUSE_S", "FleetViews"]

#: routes read per slice of a pass (a pass of more routes takes a second per slice)
CHUNK = 200
#: the pause between two slices of a pass
SLICE_PAUSE_S = 1.0
#: a route past max_routes read when asked is kept this long, the last ASKED_KEPT of them
ASKED_FRESH_S = 5.0
ASKED_KEPT = 256


class FleetViews:
    """The cached fleet-wide views (see the module docstring)."""

    def __init__(
        self,
        divergence: DivergenceStore,
        blocked: WouldBeBlocked,
        client: Any,
        rules: Callable[[], Rules],
        *,
        clock: Callable[[], float] = time.time,
        max_routes: int = 1000,
        candidate_of: Callable[[str], Candidate | None] = lambda route: None,
    ) -> None:
        self.divergence = divergence
        self.candidate_of = candidate_of  # a route's candidate limit, whose figures are read with it
        self.max_routes = max_routes  # routes read in the background; the others when asked
        self._asked: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()  # (read at, view)
        self.blocked = blocked
        self.client = client
        self._rules = rules
        self._clock = clock
        self._views: dict[str, dict[str, Any]] = {}
        self.at: float = 0.0
        self.error: str | None = None
        self._pass: list[str] = []  # the routes of the pass in progress (run)
        self._pass_rules: Any = None  # the rules it is over
        self._pass_at = 0.0
        self._next: dict[str, dict[str, Any]] = {}
        self._cursor = 0

    async def refresh(self) -> None:
        """Read every route's last two hours of fleet-wide counters and top blocked keys."""
        names = self._rules().names()[: self.max_routes]
        views: dict[str, dict[str, Any]] = {}
        for start in range(0, len(names), CHUNK):
            views.update(await self._read(names[start : start + CHUNK]))
        self._views = views
        self.at = self._clock()
        self.error = None

    async def _read(self, names: list[str]) -> dict[str, dict[str, Any]]:
        views: dict[str, dict[str, Any]] = {}
        for name in names:
            series = await self.divergence.series(name, minutes=120)
            try:
                top = await self.blocked.fleet_top(self.client, name, n=10)
            except (StoreUnavailable, BackendError, OSError):
                top = self.blocked.top(name, n=10)
            views[name] = {"series": series, "top": top, "candidate": await self._candidate(name)}
        return views

    async def _candidate(self, name: str) -> dict[str, Any] | None:
        """A route's candidate's comparisons per minute since it was set, and the keys it
        would newly reject (fleet-wide); None without a candidate."""
        c = self.candidate_of(name)
        if c is None:
            return None
        series = await self.divergence.candidate_series(name, c.id, c.since)
        view = blocked_view_name(name)
        try:
            top = await self.blocked.fleet_top(self.client, view, n=10)
        except (StoreUnavailable, BackendError, OSError):
            top = self.blocked.top(view, n=10)
        return {"id": c.id, "series": series, "top": top}

    async def step(self) -> bool:
        """The next :data:`CHUNK` routes of the pass in progress; True when a pass ended
        (every route read once since it began: :attr:`at` is when it began)."""
        rules = self._rules()
        if rules is not self._pass_rules:  # new rules: a new pass, over the routes that are
            self._pass_rules = rules
            self._cursor = 0
            self._next = {}
        if not self._cursor:
            self._pass = list(rules.names()[: self.max_routes])
            self._pass_at = self._clock()
        names = self._pass[self._cursor : self._cursor + CHUNK]
        read = await self._read(names)
        self._next.update(read)
        self._cursor += len(names)
        if self._cursor < len(self._pass):
            return False
        current = set(self._rules().names())  # routes removed during the pass are dropped
        self._views = {k: v for k, v in self._next.items() if k in current}
        self._next, self._cursor = {}, 0
        self.at = self._pass_at
        self.error = None
        return True

    async def run(self, interval_s: float = 1.0) -> None:
        """A pass every ``interval_s``: :data:`CHUNK` routes at a time, :data:`SLICE_PAUSE_S`
        apart, so that thousands of routes (an Envoy configuration's descriptors) are read a
        slice at a time, a small share of a core, instead of in one burst that never ends
        (a pass over 54,000 routes takes about 4.5 minutes); new rules start a new pass; a
        slice that takes over 3 s is abandoned (the views
        stay as they were, flagged stale with the reason)."""
        while True:
            try:
                async with asyncio.timeout(3.0):
                    done = await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - stale views are flagged, never fatal
                self.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                self._next, self._cursor = {}, 0
                done = True
            await asyncio.sleep(interval_s if done else SLICE_PAUSE_S)

    async def route(self, name: str) -> dict[str, Any] | None:
        """Cached fleet-wide figures for a route (None until the first refresh). A route
        past :attr:`max_routes` in the rules (thousands of Envoy descriptors) is read when
        asked, and kept :data:`ASKED_FRESH_S` (the last :data:`ASKED_KEPT` of them)."""
        v = self._views.get(name)
        if v is None and not self._views:
            try:
                async with asyncio.timeout(2.0):
                    await self.refresh()
            except Exception as exc:  # noqa: BLE001
                self.error = f"{type(exc).__name__}: {exc}"
            v = self._views.get(name)
        if v is None and self._views and self._rules().get(name) is not None:
            v = await self._asked_for(name)
        return v

    async def _asked_for(self, name: str) -> dict[str, Any] | None:
        kept = self._asked.get(name)
        if kept is not None and self._clock() - kept[0] < ASKED_FRESH_S:
            return kept[1]
        try:
            async with asyncio.timeout(2.0):
                view = (await self._read([name]))[name]
        except Exception as exc:  # noqa: BLE001 - stale or missing figures are flagged, never fatal
            self.error = f"{type(exc).__name__}: {exc}"
            return None if kept is None else kept[1]
        self._asked[name] = (self._clock(), view)
        self._asked.move_to_end(name)
        while len(self._asked) > ASKED_KEPT:
            self._asked.popitem(last=False)
        return view

    def decided_before(self, name: str, t: float) -> bool:
        """Whether the fleet compared decisions of route ``name`` in a whole minute before ``t``
        (Unix seconds), as far as the cached figures say (False without them): the fleet was
        already deciding it then."""
        v = self._views.get(name)
        if v is None:
            kept = self._asked.get(name)
            v = None if kept is None else kept[1]
        if v is None:
            return False
        return any(row["compared"] > 0 for row in v["series"] if row["minute"] + 60 <= t)

    def age_s(self) -> float | None:
        return None if not self.at else self._clock() - self.at
