"""An in-process broadcast hub for the live event stream (SSE subscribers).

Every event gets an id ``<boot>-<seq>``: ``boot`` is random per hub (so per process and per
app), ``seq`` counts from 1. An id therefore names one event of one boot, and a client that
reconnects with ``Last-Event-ID`` is answered by :meth:`EventHub.replay`: the events after
that id still held, or the whole history and a :class:`Gap` saying why when the id is from
another boot, older than the history, or not an id at all.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["EventHub", "Gap"]


@dataclass(frozen=True, slots=True)
class Gap:
    """Why a replay could not start right after the client's last id.

    ``reason``: ``other_boot`` (the id is from another boot of this replica, or from
    another replica), ``too_old`` (events after it were already dropped from the history)
    or ``malformed`` (not an id this hub hands out)."""

    reason: str
    last_event_id: str
    boot: str
    oldest_id: str | None

    def to_dict(self, replayed: int) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "last_event_id": self.last_event_id,
            "boot": self.boot,
            "oldest_id": self.oldest_id,
            "replayed": replayed,
        }


class EventHub:
    """Fan events out to subscribers; a slow subscriber loses its oldest events, never
    slows the publisher. The last ``history`` events are kept for :meth:`recent` and for
    :meth:`replay` to clients that reconnect."""

    def __init__(
        self,
        history: int = 1000,
        queue_size: int = 256,
        *,
        boot: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.boot = boot or uuid.uuid4().hex[:8]
        self.clock = clock  # wall-clock seconds: each event's "at"
        self._subs: set[asyncio.Queue[dict[str, Any]]] = set()
        self._history: deque[dict[str, Any]] = deque(maxlen=history)
        self._queue_size = queue_size
        self._seq = itertools.count(1)
        self._last_seq = 0

    def publish(self, event: dict[str, Any]) -> None:
        seq = self._last_seq = next(self._seq)
        eid = f"{self.boot}-{seq}"
        event = {"seq": seq, "id": eid, "at": self.clock(), **event}
        event["seq"], event["id"] = seq, eid  # the hub's numbering wins over anything passed in
        self._history.append(event)
        for q in list(self._subs):
            if q.full():
                try:
                    q.get_nowait()
                except asyncio.QueueEmpty:  # pragma: no cover
                    pass
            q.put_nowait(event)

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(self._queue_size)
        self._subs.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[dict[str, Any]]) -> None:
        self._subs.discard(q)

    def replay(self, last_event_id: str) -> tuple[list[dict[str, Any]], Gap | None]:
        """The held events after ``last_event_id``, oldest first, and ``None``; or, when
        that id cannot be placed in this boot's history, the whole history and a :class:`Gap`.

        Called right after :meth:`subscribe` (no ``await`` between), the replay and the
        subscriber's queue neither miss nor repeat an event."""
        boot, _, seq_text = last_event_id.strip().rpartition("-")
        seq = int(seq_text) if seq_text.isdigit() and len(seq_text) <= 18 else None
        oldest = self._history[0]["seq"] if self._history else self._last_seq + 1
        reason = None
        if not boot or seq is None or (boot == self.boot and seq > self._last_seq):
            reason = "malformed"
        elif boot != self.boot:
            reason = "other_boot"
        elif seq < oldest - 1:
            reason = "too_old"
        if reason is not None:
            gap = Gap(reason, last_event_id[:64], self.boot, self._history[0]["id"] if self._history else None)
            return list(self._history), gap
        assert seq is not None
        # seqs in the history are consecutive: the events after `seq` are its tail
        return list(itertools.islice(self._history, seq - oldest + 1, None)), None

    def recent(self, n: int = 50, kinds: set[str] | None = None) -> list[dict[str, Any]]:
        if kinds is None:
            start = max(0, len(self._history) - n)
            return list(itertools.islice(self._history, start, None))
        items = [e for e in self._history if e.get("type") in kinds]
        return items[-n:]

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest event (0 before the first)."""
        return self._last_seq

    @property
    def last_id(self) -> str | None:
        """The id of the newest event, ``None`` before the first."""
        return f"{self.boot}-{self._last_seq}" if self._last_seq else None

    @property
    def subscribers(self) -> int:
        return len(self._subs)
