"""Recording decided requests for what-if replays: every replica's, in one bounded store in Redis.

The decider hands every request it answers to :meth:`Recorder.offer` (a tuple appended to
a bounded deque: never a wait, never IO); :meth:`Recorder.flush` (every second, with the
divergence counters) writes them as a few stream entries per route and minute:

    rl:<ns>:rec:<route>:<minute>   stream, one entry per flush: e = a line per key (see _encode)
    rl:<ns>:recn:<route>:<minute>  counter: the requests the fleet decided on the route that minute

Both expire after ``SHADOWLIMIT_RECORD_MINUTES`` (+ 2 minutes). A route gets a budget of
recorded events per minute, fleet-wide (``SHADOWLIMIT_RECORD_BUDGET``). Above it, whole keys
are sampled: a key is recorded when its hash point is below the route's rate (budget /
the fleet's requests in the last full minute), so every sampled key's sequence stays whole,
and each event carries its weight (1 / rate) for the replay to scale by. The queue is
bounded, and each replica records at most 4x the budget per route and minute itself (a
heavy key, or the minute before a rate applies, cannot outgrow that; what is cut there is
missing from the replay, which then undercounts); what does not fit is dropped and counted
(``rate_limit_record_events_total{result="dropped"}``). Rates are powers of two (sampled
key sets nest, so a key recorded at one rate stays recorded at a higher one) and tighten
within a minute as soon as the fleet's count for the minute projects past the budget.
While Redis is unreachable (``ready()`` false) nothing is encoded: the queue is dropped.

A budget route's charges are written ``c<cost>``, its reserves ``r<estimate>.<tag>`` and settles
``s<actual>.<tag>`` (:class:`~.replay.Booked`), in entries of format ``2`` (a replica that reads
only format ``1`` skips them, never misreads them); a settle is recorded with its key, but is no
request: it counts in no minute's requests.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from itertools import accumulate, repeat
from typing import Any

from limiter.policy import Charge

from .replay import Booked, Event, _ts

__all__ = ["FORMAT", "FORMATS", "Recorder", "TooManyEvents", "decode", "key_point"]

log = logging.getLogger("shadowlimit.whatif")

_MAX_POINTS = 200_000
#: the stream entries' format (field ``v``): ``2`` when one holds a budget's charges, reserves or
#: settles; entries of another format are skipped
FORMAT = "1"
FORMATS = ("1", "2")
_MODE_LETTER = {"off": "o", "shadow": "s", "canary": "c", "enforce": "e"}


def _encode(keys: dict[tuple[str, float], list[Any]]) -> str:
    """One flush's requests of one route and minute: a line per key,
    ``key TAB weight TAB ts,+d,+d... TAB cost,cost,... TAB modes TAB allowed`` (the first time
    in microseconds, then each one's difference to the one before; modes one letter each:
    o s c e; allowed 1 or 0 each), in decision order."""
    return "\n".join(
        f"{key}\t{w:.6g}\t{_deltas(ts)}\t{','.join(map(_cost_text, costs))}\t{''.join(modes)}\t{''.join(ok)}"
        for (key, _), (w, ts, costs, modes, ok) in keys.items()
    )


def _cost_text(cost: Any) -> str:
    """A cost as recorded: an int's digits, ``c`` and a charge's, a reserve's or settle's code."""
    return f"c{int(cost)}" if cost.__class__ is Charge else str(cost)


def _cost_of(text: str) -> Any:
    """A recorded cost back: an int, a Charge (``c``) or a reserve or settle (``r``, ``s``)."""
    head = text[:1]
    if head == "c":
        return Charge(int(text[1:]))
    if head in ("r", "s"):
        amount, _, tag = text[1:].partition(".")
        return Booked(kind=head, amount=int(amount), tag=tag)
    return int(text)


def _deltas(ts: list[int]) -> str:
    return ",".join(map(str, [ts[0], *(b - a for a, b in zip(ts, ts[1:]))]))


def _decode(text: str, by_key: dict[str, list[Event]]) -> int:
    """Add one stream entry's requests to ``by_key``; how many there were."""
    n = 0
    for line in text.split("\n"):
        key, weight, ts, costs, _modes_and_verdicts = line.split("\t", 4)
        t = list(accumulate(map(int, ts.split(","))))
        evs = by_key.get(key)
        if evs is None:
            evs = by_key[key] = []
        evs.extend(zip(t, map(_cost_of, costs.split(",")), repeat(float(weight))))
        n += len(t)
    return n


def key_point(route: str, key: str) -> float:
    """A key's stable place in [0, 1) for sampling (the same on every replica)."""
    h = hashlib.blake2b(f"{route}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


class _Minute:
    """One route's minute on this replica: requests decided (``seen``, since the last flush)
    and recorded (``kept``, against the cap). The request path finds its route's current
    minute in one lookup and counts in place."""

    __slots__ = ("end_us", "kept", "seen", "slot", "start_us")

    def __init__(self, route: str, minute: int) -> None:
        self.slot = (route, minute)  # how flush groups the minute's events and counters
        self.start_us = minute * 1_000_000
        self.end_us = (minute + 60) * 1_000_000
        self.seen = 0
        self.kept = 0


class Recorder:
    """This replica's recording (see the module docstring)."""

    def __init__(
        self,
        client: Any,
        namespace: str,
        *,
        budget: int,
        minutes: int,
        queue_size: int = 100_000,
        enabled: bool = True,
        clock: Callable[[], float] = time.time,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.client = client
        self.enabled = enabled
        self.budget = budget
        self.cap = 4 * budget  # what one replica records per route and minute, whatever the rate
        self.minutes = minutes
        self.ttl_s = (minutes + 2) * 60
        self.queue: deque[tuple[Any, ...]] = deque()
        self.queue_size = queue_size
        self.clock = clock
        self.ready = ready
        self.dropped = 0
        self.recorded = 0
        self._prefix = f"rl:{namespace}:rec:"
        self._nprefix = f"rl:{namespace}:recn:"
        self._rates: dict[str, float] = {}  # route -> sampling rate (absent: 1)
        self._points: dict[tuple[str, str], float] = {}
        self._minutes: dict[tuple[str, int], _Minute] = {}  # (route, minute) -> its counts here
        self._current: dict[str, _Minute] = {}  # route -> the minute of its last request

    def key(self, route: str, minute: int) -> str:
        return f"{self._prefix}{route}:{minute}"

    # -- the request path ------------------------------------------------------------------

    def offer(self, route: str, key: str, cost: Any, ts_us: int, mode: str, allowed: bool, *, seen: int = 1) -> None:
        """Note one decided request (sampled, bounded; never waits): ``cost`` an int, a Charge,
        or a reservation's reserve (:class:`~.replay.Booked` ``r``); ``seen`` 0 for what is no
        request (:meth:`offer_settle`)."""
        if not self.enabled:
            return
        m = self._current.get(route)
        if m is None or not m.start_us <= ts_us < m.end_us:
            m = self._minute(route, ts_us)
        m.seen += seen
        rate = self._rates.get(route)
        if rate is not None:
            pk = (route, key)
            point = self._points.get(pk)
            if point is None:
                if len(self._points) > _MAX_POINTS:
                    self._points.clear()
                point = self._points[pk] = key_point(route, key)
            if point >= rate:
                return
        if len(self.queue) >= self.queue_size or m.kept >= self.cap:
            self.dropped += 1
            return
        m.kept += 1
        # grouped as flush writes it: the stream (route, minute), the line (key, sampling weight), the event
        self.queue.append((m.slot, (key, 1.0 if rate is None else 1.0 / rate), ts_us, cost, (mode, allowed)))

    def offer_settle(self, route: str, key: str, settle: Booked, ts_us: int) -> None:
        """Note a settle (recorded with its key's requests; itself no request)."""
        self.offer(route, key, settle, ts_us, "settle", True, seen=0)

    def _minute(self, route: str, ts_us: int) -> _Minute:
        """The route's minute that holds ``ts_us``, made current."""
        minute = ts_us // 60_000_000 * 60
        m = self._minutes.get((route, minute))
        if m is None:
            m = self._minutes[(route, minute)] = _Minute(route, minute)
        self._current[route] = m
        return m

    # -- the background work ---------------------------------------------------------------

    async def flush(self) -> int:
        """Write what is queued (one pipeline) and update the sampling rates; the events written."""
        if not self.enabled:
            return 0
        items = list(self.queue)
        self.queue.clear()
        seen: dict[tuple[str, int], int] = {}
        for slot, m in self._minutes.items():
            if m.seen:
                seen[slot] = m.seen
                m.seen = 0
        if len(self._minutes) > 4 * len(seen) + 64:  # past minutes: their caps are done
            now_m = int(self.clock() // 60) * 60
            self._minutes = {k: m for k, m in self._minutes.items() if k[1] >= now_m - 60}
            self._current = {r: m for r, m in self._current.items() if m.slot in self._minutes}
        if not self.ready():  # Redis unreachable: do not spend the loop encoding what cannot be sent
            self.dropped += len(items)
            return 0
        groups: dict[tuple[str, int], dict[tuple[str, float], list[Any]]] = {}
        for slot, line, ts, cost, (mode, allowed) in items:
            keys = groups.get(slot)
            if keys is None:
                keys = groups[slot] = {}
            k = keys.get(line)  # a key's requests under one sampling weight per line
            if k is None:
                k = keys[line] = [line[1], [], [], [], []]
            k[1].append(ts)
            k[2].append(cost)
            k[3].append(_MODE_LETTER.get(mode, "?"))
            k[4].append("1" if allowed else "0")
        if not groups and not seen:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for (route, minute), keys in groups.items():
            name = self.key(route, minute)
            plain = all(c.__class__ is int for k in keys.values() for c in k[2])
            pipe.xadd(name, {"v": FORMAT if plain else FORMATS[1], "e": _encode(keys)})
            pipe.expire(name, self.ttl_s)
        for (route, minute), n in seen.items():
            name = f"{self._nprefix}{route}:{minute}"
            pipe.incrby(name, n)
            pipe.expire(name, self.ttl_s)
        try:
            replies = await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - a recording lost, never a decision
            self.dropped += len(items)
            log.debug("recording flush failed: %s", exc)
            return 0
        finally:
            with contextlib.suppress(Exception):
                await pipe.reset()
        self.recorded += len(items)
        totals = replies[2 * len(groups) :: 2]  # INCRBY: the fleet's requests so far in each (route, minute)
        await self._update_rates(dict(zip(seen, totals)))
        return len(items)

    async def _update_rates(self, totals: dict[tuple[str, int], Any]) -> None:
        """Each route's rate: the budget over the fleet's requests in the last full minute,
        or over this minute's count projected to the whole minute when that is larger;
        rounded down to a power of two."""
        if not totals:
            return
        now = self.clock()
        minute = int(now // 60) * 60
        elapsed = max(10.0, now - minute)  # a few seconds' count does not project well
        routes = sorted({route for route, _ in totals})
        pipe = self.client.pipeline(transaction=False)
        for r in routes:  # GETs, not one MGET: on a cluster the keys live in different slots
            pipe.get(f"{self._nprefix}{r}:{minute - 60}")
        try:
            last = await pipe.execute()
        except Exception:  # noqa: BLE001 - keep the current rates
            return
        finally:
            with contextlib.suppress(Exception):
                await pipe.reset()
        for route, raw in zip(routes, last):
            now_total = max((int(n or 0) for (r, m), n in totals.items() if r == route and m == minute), default=0)
            expected = max(int(raw or 0), now_total * 60 / elapsed)
            if expected > self.budget:
                self._rates[route] = 2.0 ** -math.ceil(math.log2(expected / self.budget))
            else:
                self._rates.pop(route, None)

    # -- reading ---------------------------------------------------------------------------

    async def read_raw(self, route: str, minutes: int, now_s: float | None = None) -> tuple[list[Any], int]:
        """The route's stream entries of the last ``minutes`` minutes (the current one
        included), one list per minute, and the fleet's decided requests in them (IO only:
        decoding is :func:`decode`'s, to run off the event loop)."""
        now_m = int((self.clock() if now_s is None else now_s) // 60) * 60
        slots = [now_m - 60 * i for i in range(minutes)]
        pipe = self.client.pipeline(transaction=False)
        for m in slots:
            pipe.xrange(self.key(route, m))
        for m in slots:
            pipe.get(f"{self._nprefix}{route}:{m}")
        try:
            replies = await pipe.execute()
        finally:
            with contextlib.suppress(Exception):
                await pipe.reset()
        return replies[: len(slots)], sum(int(x or 0) for x in replies[len(slots) :])

    async def read(self, route: str, minutes: int, now_s: float | None = None) -> tuple[dict[str, Any], float, int]:
        """:meth:`read_raw` and :func:`decode` in one (tests, benchmarks)."""
        raw, decided = await self.read_raw(route, minutes, now_s)
        return decode(raw, decided)


class TooManyEvents(ValueError):
    """More recorded requests than a replay may take (``max_events``)."""


def decode(per_minute: list[Any], decided: int, max_events: int | None = None) -> tuple[dict[str, Any], float, int]:
    """Stream entries into (events by key in time order, the recorded share of the decided
    requests, the minutes that hold a recording); :class:`TooManyEvents` past ``max_events``."""
    by_key: dict[str, list[Event]] = {}
    with_data = 0
    recorded = 0
    for entries in per_minute:
        if entries:
            with_data += 1
        for _, fields in entries:
            v = fields.get(b"v") or fields.get("v")
            if (v.decode() if isinstance(v, bytes) else v) not in FORMATS:
                continue  # not this format: skipped, never misread
            blob = fields.get(b"e") or fields.get("e") or b""
            recorded += _decode(blob.decode() if isinstance(blob, bytes) else blob, by_key)
            if max_events is not None and recorded > max_events:
                raise TooManyEvents(f"more than {max_events:,} recorded requests")
    share = min(1.0, recorded / decided) if decided else (1.0 if recorded else 0.0)
    for evs in by_key.values():
        evs.sort(key=_ts)  # stable: the same microsecond stays in recorded order
    return by_key, share, with_data
