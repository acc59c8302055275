"""The "who would be blocked" view: heavy hitters among the requests that the
distributed limiter denies while the local one allows them.

:class:`SpaceSaving` is the Space-Saving algorithm (Metwally, Agrawal, El Abbadi,
"Efficient Computation of Frequent and Top-k Elements in Data Streams", 2005):
at most ``capacity`` counters; a new key that finds the summary full takes over the
counter with the smallest count ``m`` and starts at ``m + count`` with error bound
``m``. For every monitored key ``count - error <= true count <= count``, and every
key whose true count exceeds ``N / capacity`` (``N`` = stream total) is monitored.

Implementation: a dict ``key -> [count, error, last_request_id]`` plus a min-heap of
``(count, seq, key)`` with lazy updates. Increments only touch the dict (O(1)); the
heap holds exactly one entry per monitored key, possibly with a stale (too small)
count. To find the minimum on eviction, stale tops are popped and re-pushed with
their current count until the top is current. Every re-push pays for at least one
earlier increment, so ``add`` is amortised O(log k).

:class:`WouldBeBlocked` keeps one summary per route for the current time window
(``window index = floor(now / window_s)``) and merges the replicas' views in Redis
(``rl:<ns>:hh:<route>:<window>`` sorted set, ``rl:<ns>:hhid:<route>:<window>`` hash), with
the causes of each key's new rejections (``rl:<ns>:hhid:<route>#why:<window>`` hash of
``<cause>:<key>`` -> count; ``#`` is in no route name), so each key of the fleet's top says
its main cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..model.causes import FORWARD, Cause, main_cause
from ..store import StoreError, translate_errors
from ..store.codec import text

__all__ = ["FLEET_TOP_KEEP", "HitterEntry", "SpaceSaving", "WouldBeBlocked"]

log = logging.getLogger(__name__)

#: the fleet sorted set is trimmed to this many members after every flush
FLEET_TOP_KEEP = 1000


@dataclass(frozen=True, slots=True)
class HitterEntry:
    key: str
    count: int  # upper bound of the true count
    error: int  # overestimation bound: count - error <= true count
    last_request_id: str | None = None

    @property
    def guaranteed(self) -> int:
        """Lower bound of the true count."""
        return self.count - self.error

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "count": self.count, "error": self.error, "last_request_id": self.last_request_id}


class SpaceSaving:
    """Bounded-memory heavy hitters (see the module docstring)."""

    __slots__ = ("capacity", "total", "_items", "_heap", "_seq")

    def __init__(self, capacity: int = 100) -> None:
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"capacity: must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self.total = 0  # N: sum of all counts added
        self._items: dict[str, list[Any]] = {}  # key -> [count, error, last_request_id]
        self._heap: list[tuple[int, int, str]] = []  # one (count, seq, key) per key; count may be stale (low)
        self._seq = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def heap_size(self) -> int:
        """Entries in the eviction heap: exactly one per monitored key (the memory bound)."""
        return len(self._heap)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def add(self, key: str, count: int = 1, request_id: str | None = None) -> None:
        if count <= 0:
            return
        self.total += count
        item = self._items.get(key)
        if item is not None:
            item[0] += count
            if request_id is not None:
                item[2] = request_id
            return
        if len(self._items) < self.capacity:
            self._items[key] = [count, 0, request_id]
            self._push(count, key)
            return
        # evict the minimum: pop until the heap top's count is current
        heap, items = self._heap, self._items
        while True:
            c, _, victim = heap[0]
            actual = items[victim][0]
            if c == actual:
                break
            heapq.heapreplace(heap, (actual, self._next_seq(), victim))
        heapq.heappop(heap)
        del items[victim]
        items[key] = [c + count, c, request_id]
        self._push(c + count, key)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _push(self, count: int, key: str) -> None:
        heapq.heappush(self._heap, (count, self._next_seq(), key))

    def get(self, key: str) -> HitterEntry | None:
        item = self._items.get(key)
        return None if item is None else HitterEntry(key, item[0], item[1], item[2])

    def top(self, n: int = 10) -> list[HitterEntry]:
        """The ``n`` largest counters, largest first (O(k log n))."""
        if n <= 0:
            return []
        best = heapq.nlargest(n, self._items.items(), key=lambda kv: (kv[1][0], -kv[1][1]))
        return [HitterEntry(k, v[0], v[1], v[2]) for k, v in best]

    def entries(self) -> list[HitterEntry]:
        return [HitterEntry(k, v[0], v[1], v[2]) for k, v in self._items.items()]

    def clear(self) -> None:
        self._items.clear()
        self._heap.clear()
        self.total = 0


class WouldBeBlocked:
    """Per route: who would be blocked by the distributed limit, in the current window.

    ``record`` (sync, no IO) feeds two summaries per route: the window's local view
    (``top``) and the deltas since the last ``flush``. ``flush`` adds the deltas to
    the fleet-wide sorted set with ZINCRBY, so every replica adds only what it saw
    itself. Both summaries are bounded (``capacity`` keys), so the fleet counts are
    Space-Saving upper bounds: exact while a replica sees fewer than ``capacity``
    distinct keys per route between two flushes, and overestimated by at most the
    evicted counters' values otherwise. The id hash is not trimmed with the sorted
    set; it is bounded by ``capacity`` keys per replica per flush and expires after
    two windows like the sorted set.
    """

    def __init__(
        self,
        namespace: str = "shadowlimit",
        window_s: int = 300,
        capacity: int = 100,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s: must be positive, got {window_s!r}")
        self.namespace = namespace
        #: wall-clock seconds, read when a call is given no ``now``
        self.clock = clock
        self.window_s = int(window_s)
        self.capacity = capacity
        self._windows: dict[str, tuple[int, SpaceSaving]] = {}  # route -> (window, local view)
        self._deltas: dict[tuple[str, int], SpaceSaving] = {}  # (route, window) -> unflushed
        # (route, window) -> {(key, cause): n}, unflushed; at most capacity x 4 pairs per flush
        self._causes: dict[tuple[str, int], dict[tuple[str, Cause], int]] = {}
        # (route, window) -> {key: units}, unflushed (budget routes: what the refusals would cost)
        self._units: dict[tuple[str, int], dict[str, int]] = {}

    def window_index(self, now: float | None = None) -> int:
        return int((self.clock() if now is None else now) // self.window_s)

    def zset_key(self, route: str, window: int) -> str:
        return f"rl:{self.namespace}:hh:{route}:{window}"

    def ids_key(self, route: str, window: int) -> str:
        return f"rl:{self.namespace}:hhid:{route}:{window}"

    def causes_key(self, route: str, window: int) -> str:
        return f"rl:{self.namespace}:hhid:{route}#why:{window}"

    def units_key(self, route: str, window: int) -> str:
        return f"rl:{self.namespace}:hhid:{route}#units:{window}"

    # -- local ---------------------------------------------------------------

    def record(
        self, route: str, key: str, request_id: str | None = None, now: float | None = None, units: int | None = None
    ) -> None:
        """One of ``key``'s requests the distributed limit would refuse; on a budget route,
        ``units``: what it costs (a reservation's estimate), summed per key (the keys past the
        bound between two flushes are not: the top keys come back soon enough)."""
        w = self.window_index(now)
        if units is not None:
            u = self._units.get((route, w))
            if u is None:
                u = self._units[(route, w)] = {}
            n = u.get(key)
            if n is not None:
                u[key] = n + units
            elif len(u) < 4 * self.capacity:
                u[key] = units
        cur = self._windows.get(route)
        if cur is None or cur[0] < w:  # a new window starts with an empty local view
            cur = self._windows[route] = (w, SpaceSaving(self.capacity))
        if cur[0] == w:  # (a late record for an older window only reaches the fleet view)
            cur[1].add(key, 1, request_id)
        d = self._deltas.get((route, w))
        if d is None:
            d = self._deltas[(route, w)] = SpaceSaving(self.capacity)
        d.add(key, 1, request_id)

    def record_cause(self, route: str, key: str, cause: Cause, now: float | None = None) -> None:
        """The cause of one of ``key``'s new rejections (recorded with :meth:`record`, or later:
        the cause of a request decided on the request path comes with its reference). Keys past
        the bound between two flushes are not counted (the top keys come back soon enough)."""
        slot = (route, self.window_index(now))
        d = self._causes.get(slot)
        if d is None:
            d = self._causes[slot] = {}
        pair = (key, cause)
        n = d.get(pair)
        if n is not None:
            d[pair] = n + 1
        elif len(d) < 4 * self.capacity:
            d[pair] = 1

    def top(self, route: str, n: int = 10, now: float | None = None) -> list[dict[str, Any]]:
        """This replica's view of the current window."""
        cur = self._windows.get(route)
        if cur is None or cur[0] != self.window_index(now):
            return []
        return [{**e.to_dict(), "cause": None, "units": None} for e in cur[1].top(n)]  # causes, units: the fleet's

    def routes(self) -> list[str]:
        return sorted(self._windows)

    # -- fleet ---------------------------------------------------------------

    async def flush(self, client: Any) -> int:
        """Add the unflushed deltas to the fleet view. Returns the number of
        (route, window) summaries written. On failure the deltas are kept and
        :class:`~control_plane.store.StoreUnavailable` is raised."""
        batch, self._deltas = self._deltas, {}
        causes, self._causes = self._causes, {}
        units, self._units = self._units, {}
        if not batch and not causes and not units:
            return 0
        ttl = 2 * self.window_s
        pipe = client.pipeline(transaction=False)
        for (route, w), counts in causes.items():
            ckey = self.causes_key(route, w)
            for (key, cause), n in counts.items():
                pipe.hincrby(ckey, f"{cause.value}:{key}", n)
            pipe.expire(ckey, ttl)
        for (route, w), per_key in units.items():
            ukey = self.units_key(route, w)
            for key, n in per_key.items():
                pipe.hincrby(ukey, key, n)
            pipe.expire(ukey, ttl)
        for (route, w), ss in batch.items():
            zkey, ikey = self.zset_key(route, w), self.ids_key(route, w)
            ids: dict[str, str] = {}
            for e in ss.entries():
                pipe.zincrby(zkey, e.count, e.key)
                if e.last_request_id is not None:
                    ids[e.key] = e.last_request_id
            pipe.zremrangebyrank(zkey, 0, -(FLEET_TOP_KEEP + 1))
            pipe.expire(zkey, ttl)
            if ids:
                pipe.hset(ikey, mapping=ids)
                pipe.expire(ikey, ttl)
        ok = False
        try:
            with translate_errors("flush heavy hitters"):
                await pipe.execute()
            ok = True
        finally:
            if not ok:
                self._merge_back(batch)
                for slot, counts in causes.items():
                    d = self._causes.setdefault(slot, {})
                    for pair, n in counts.items():
                        d[pair] = d.get(pair, 0) + n
                for slot, per_key in units.items():
                    du = self._units.setdefault(slot, {})
                    for key, n in per_key.items():
                        du[key] = du.get(key, 0) + n
        return len(batch)

    def _merge_back(self, batch: dict[tuple[str, int], SpaceSaving]) -> None:
        for slot, ss in batch.items():
            d = self._deltas.get(slot)
            if d is None:
                self._deltas[slot] = ss
                continue
            for e in ss.entries():
                d.add(e.key, e.count, e.last_request_id)

    async def fleet_top(self, client: Any, route: str, n: int = 10, now: float | None = None) -> list[dict[str, Any]]:
        """The fleet-wide top ``n`` of the current window (as flushed by every replica), each
        key with its main cause (None: its new rejections were not explained) and, on a budget
        route, what its refusals would cost (``units``; None elsewhere)."""
        if n <= 0:
            return []
        w = self.window_index(now)
        with translate_errors("read heavy hitters"):
            rows = await client.zrevrange(self.zset_key(route, w), 0, n - 1, withscores=True)
            if not rows:
                return []
            keys = [text(k) for k, _ in rows]
            pipe = client.pipeline(transaction=False)
            pipe.hmget(self.ids_key(route, w), keys)
            pipe.hmget(self.causes_key(route, w), [f"{c.value}:{k}" for k in keys for c in FORWARD])
            pipe.hmget(self.units_key(route, w), keys)
            try:
                ids, why, costs = await pipe.execute()
            finally:
                with contextlib.suppress(Exception):
                    await pipe.reset()
        out = []
        for i, ((k, score), rid, cost) in enumerate(zip(rows, ids, costs)):
            counts = {c: int(why[i * len(FORWARD) + j] or 0) for j, c in enumerate(FORWARD)}
            cause = main_cause(counts)
            out.append(
                {
                    "key": text(k),
                    "count": int(score),
                    "last_request_id": None if rid is None else text(rid),
                    "cause": None if cause is None else cause.value,
                    "units": None if cost is None else int(cost),
                }
            )
        return out

    async def run(self, client: Any, interval_s: float = 1.0) -> None:
        """Flush every ``interval_s`` until cancelled; errors are logged, not raised."""
        try:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await self.flush(client)
                except StoreError as exc:
                    log.warning("heavy-hitter flush failed (deltas kept): %s", exc)
                except Exception:  # noqa: BLE001 - the loop must survive
                    log.exception("heavy-hitter flush failed")
        except asyncio.CancelledError:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.flush(client), 1.0)
            raise
