"""An in-process broadcast hub for the live event stream (SSE subscribers)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from typing import Any

__all__ = ["EventHub"]


class EventHub:
    """Fan events out to subscribers; a slow subscriber loses its oldest events, never
    slows the publisher. The last ``history`` events are kept for new subscribers."""

    def __init__(self, history: int = 50, queue_size: int = 256) -> None:
        self._subs: set[asyncio.Queue[dict[str, Any]]] = set()
        self._history: deque[dict[str, Any]] = deque(maxlen=history)
        self._queue_size = queue_size
        self._seq = itertools.count(1)

    def publish(self, event: dict[str, Any]) -> None:
        event = {"seq": next(self._seq), "at": time.time(), **event}
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

    def recent(self, n: int = 50, kinds: set[str] | None = None) -> list[dict[str, Any]]:
        items = [e for e in self._history if kinds is None or e.get("type") in kinds]
        return items[-n:]

    @property
    def subscribers(self) -> int:
        return len(self._subs)
