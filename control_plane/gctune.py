"""Garbage-collector tuning for the control plane's own process.

CPython's full (generation 2) collection walks every tracked object. A control plane
holds a few hundred thousand of them once FastAPI, pydantic and the engine are loaded.
Under load, the objects of requests that wait on Redis (enforce, canary) survive the
young collections, so they pile into generation 2 and trigger a full collection about
every half second. On the benchmark machine each one stopped the event loop for 50 to
60 ms. That was enforce's whole p99, and about 12% of its CPU.

Two standard remedies, applied once the app has started, and undone when it stops:

- ``gc.freeze()`` moves everything alive at startup (modules, routes, schemas, the engine)
  into the permanent generation, which collections skip;
- a young-generation threshold of 20,000 objects instead of 700, so fewer collections run
  while requests are in flight, and fewer of their objects are promoted.

Reference cycles are still collected, just in fewer, cheaper passes, except among the
objects frozen at startup: garbage there (say, a rules set replaced later) waits until
the app stops.
``SHADOWLIMIT_GC_TUNING=false`` leaves the collector alone. The ASGI middleware never
touches it, because the process belongs to the host application.
"""

from __future__ import annotations

import ctypes
import gc
import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GcTuning", "YOUNG_THRESHOLD", "forget_tunings", "trim_heap", "tune_gc", "tunings_in_effect"]

YOUNG_THRESHOLD = 20_000

# Tuning is process-wide, and several apps can run in one process (tests run two replicas
# as threads): the first tune saves the collector's state, the last undo restores it.
_lock = threading.Lock()
_users = 0
_saved_threshold: tuple[int, int, int] = (700, 10, 10)
_host_froze = False  # the process had frozen objects of its own before the first tune


@dataclass
class GcTuning:
    """One user of the tuning; :meth:`undo` (once) releases it."""

    frozen: int
    _done: bool = field(default=False, repr=False)

    def undo(self) -> None:
        """Release this user; the last one restores the threshold and, unless the host
        had frozen objects of its own, unfreezes (a host's own freeze is never undone)."""
        global _users
        with _lock:
            if self._done:
                return
            self._done = True
            _users -= 1
            if _users == 0:
                gc.set_threshold(*_saved_threshold)
                if not _host_froze:
                    gc.unfreeze()


def tune_gc(young_threshold: int = YOUNG_THRESHOLD) -> GcTuning:
    """Collect once, freeze what survives, and raise the young threshold (never lower it)."""
    global _users, _saved_threshold, _host_froze
    with _lock:
        if _users == 0:
            _saved_threshold = gc.get_threshold()
            _host_froze = gc.get_freeze_count() > 0
        _users += 1
        gc.collect()
        gc.freeze()
        t0, t1, t2 = gc.get_threshold()
        gc.set_threshold(max(t0, young_threshold), t1, t2)
        return GcTuning(gc.get_freeze_count())


def tunings_in_effect() -> int:
    """How many tunings are in effect: made by :func:`tune_gc` and not undone yet."""
    with _lock:
        return _users


def forget_tunings() -> None:
    """Forget every tuning in effect without restoring anything: for a test that failed
    before its ``undo``, which then puts the collector back itself."""
    global _users
    with _lock:
        _users = 0


def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; absent elsewhere (musl, macOS)
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim(0)``); False
    where there is none. After many connections come and go, the memory they freed stays in
    the process, scattered between live blocks, and counts in its RSS: 20,000 connections
    opened and closed grew the gRPC server by about 90 MB, 30 MB once trimmed."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
