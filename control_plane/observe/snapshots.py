"""Shared snapshots for the event stream: one build per view per interval, however many
subscribers, and a cap on the number of subscribers.

:class:`SnapshotCache` is a singleflight cache keyed by view (for the stream: the route
filter and the divergence window). A subscriber asks for a view's snapshot no older than
its interval; the first one to find it stale starts a build, every other subscriber that
asks meanwhile awaits that same build, and all of them get the same encoded bytes::

    cache = SnapshotCache(build=lambda view: encode(make_snapshot(*view)))
    data = await cache.get(("search", 30), max_age=1.0)

:class:`StreamSlots` counts open streams against a limit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

__all__ = ["SnapshotCache", "StreamSlots"]


@dataclass(slots=True)
class _Entry:
    data: bytes | None = None
    built_at: float = float("-inf")
    version: int = -1
    used_at: float = 0.0
    inflight: asyncio.Task[bytes] | None = field(default=None, repr=False)
    inflight_version: int = -1


class SnapshotCache:
    """The newest encoded snapshot of each view, rebuilt at most once per requested age.

    ``build(view)`` returns the encoded snapshot; it runs as its own task, so a subscriber
    that goes away while waiting does not cancel it for the others. A build that raises
    is not cached: its waiters get the exception and the next :meth:`get` builds again.

    ``version()`` says what state a build starting now would show (for the stream: the
    sequence number of the newest event). A subscriber that has already been sent event
    ``n`` asks for ``min_version=n``, and is never handed a snapshot from before that
    event, even a fresh one. Views nobody asked for in ``forget_after_s`` are dropped.
    ``clock`` is monotonic seconds.
    """

    def __init__(
        self,
        build: Callable[[Hashable], Awaitable[bytes]],
        *,
        version: Callable[[], int] = lambda: 0,
        on_build: Callable[[], None] | None = None,
        forget_after_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._build = build
        self._version = version
        self._on_build = on_build
        self._forget_after_s = forget_after_s
        self._clock = clock
        self._entries: dict[Hashable, _Entry] = {}
        #: builds started so far (every view)
        self.builds = 0

    @property
    def views(self) -> int:
        """Views currently cached."""
        return len(self._entries)

    async def get(self, view: Hashable, max_age: float, min_version: int = 0) -> bytes:
        """The view's snapshot, built at most ``max_age`` seconds ago (or by a build that
        was already running when this was called) and showing at least ``min_version``."""
        now = self._clock()
        entry = self._entries.get(view)
        if entry is None:
            self._forget_idle(now)
            entry = self._entries[view] = _Entry()
        entry.used_at = now
        if entry.data is not None and now - entry.built_at < max_age and entry.version >= min_version:
            return entry.data
        task = entry.inflight
        if task is None or entry.inflight_version < min_version:
            # the running build (if any) started before what this caller has seen: a new one,
            # which later callers join; the old one still answers its own waiters
            entry.inflight_version = self._version()
            task = entry.inflight = asyncio.get_running_loop().create_task(
                self._run(view, entry, entry.inflight_version), name=f"snapshot-build {view!r}"
            )
            task.add_done_callback(_retrieve)  # a failure nobody waits for any more is not an error
        # shield: one waiter's cancellation (its client went away) must not cancel the build
        return await asyncio.shield(task)

    async def _run(self, view: Hashable, entry: _Entry, version: int) -> bytes:
        started = self._clock()
        self.builds += 1
        if self._on_build is not None:
            self._on_build()
        try:
            data = await self._build(view)
        finally:
            if entry.inflight is asyncio.current_task():
                entry.inflight = None
        # age counts from the start of the build: what it shows is as of then
        if version >= entry.version:
            entry.data, entry.built_at, entry.version = data, started, version
        return data

    async def aclose(self) -> None:
        """Cancel the builds still running (the app is stopping)."""
        tasks = [e.inflight for e in self._entries.values() if e.inflight is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        self._entries.clear()

    def _forget_idle(self, now: float) -> None:
        idle = [v for v, e in self._entries.items() if e.inflight is None and now - e.used_at > self._forget_after_s]
        for v in idle:
            del self._entries[v]


def _retrieve(task: asyncio.Task[bytes]) -> None:
    if not task.cancelled():
        task.exception()


class StreamSlots:
    """How many event streams are open, against ``limit``.

    :meth:`acquire` returns False when all slots are taken; every True must be matched by
    exactly one :meth:`release`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        #: streams refused because all slots were taken
        self.refused = 0

    def acquire(self) -> bool:
        if self.active >= self.limit:
            self.refused += 1
            return False
        self.active += 1
        return True

    def release(self) -> None:
        self.active = max(0, self.active - 1)
