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

Reference cycles are still collected, just in fewer, cheaper passes.
``SHADOWLIMIT_GC_TUNING=false`` leaves the collector alone. The ASGI middleware never
touches it, because the process belongs to the host application.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

__all__ = ["GcTuning", "YOUNG_THRESHOLD", "tune_gc"]

YOUNG_THRESHOLD = 20_000


@dataclass(frozen=True)
class GcTuning:
    """What :func:`tune_gc` changed, so that :meth:`undo` can put it back."""

    previous_threshold: tuple[int, int, int]
    frozen: int

    def undo(self) -> None:
        gc.set_threshold(*self.previous_threshold)
        gc.unfreeze()


def tune_gc(young_threshold: int = YOUNG_THRESHOLD) -> GcTuning:
    """Collect once, freeze what survives, and raise the young threshold (never lower it)."""
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(max(previous[0], young_threshold), previous[1], previous[2])
    return GcTuning(previous, gc.get_freeze_count())
