"""envoyproxy/ratelimit's per-descriptor stats, as shadowlimit counts them: hits (the
cost, ``hits_addend``) per route in ``rate_limit_envoy_hits_total{route, stat}``.

=============  =================================================================
stat           hits
=============  =================================================================
total_hits     every hit of the descriptor (a look with ``hits_addend`` 0 adds 0)
over_limit     hits the limit found over (counted even when shadowed, as the peer)
near_limit     hits above ``NEAR_LIMIT_RATIO`` (0.8) of the limit, not over it
within_limit   hits within the limit (near ones included, as the peer counts them)
shadow_mode    over-limit hits answered OK because the descriptor is shadowed
=============  =================================================================

The split of one request's hits is the peer's (``base_limiter.go``): when a request
crosses the limit, the hits past it are over and the ones between the near-limit
threshold and the limit are near. The verdict is the limit's answer for that request:
the global one where the request path has it (enforce, a canary's share, a shadowed
route when the would-limit header makes it ask Redis inline), the local one otherwise.
"""

from __future__ import annotations

import math
from typing import Any

from ..observe.metrics import ENVOY_STATS as STATS
from ..observe.metrics import Metrics

__all__ = ["STATS", "HitStats", "split_hits"]


def split_hits(over: bool, limit: int, used_before: int, cost: int, ratio: float) -> tuple[int, int, int]:
    """``(over_limit, near_limit, within_limit)`` hits of one request of ``cost`` hits on a
    limit of ``limit`` of which ``used_before`` was used (pure)."""
    near_t = math.floor(limit * ratio)
    after = used_before + cost
    if over:
        if used_before >= limit or after <= limit:
            return cost, 0, 0
        return after - limit, max(0, limit - max(near_t, used_before)), 0
    near = 0
    if after > near_t:
        near = cost if used_before >= near_t else after - near_t
    return 0, near, cost


class HitStats:
    """Adds a descriptor's hits to the route's series (created at 0 by
    :meth:`~control_plane.observe.metrics.Metrics.add_route` for every Envoy route)."""

    __slots__ = ("metrics", "ratio", "_children")

    def __init__(self, metrics: Metrics, ratio: float) -> None:
        self.metrics = metrics
        self.ratio = ratio
        self._children: dict[str, tuple[Any, ...]] = {}

    def _of(self, route: str) -> tuple[Any, ...]:
        c = self._children.get(route)
        if c is None:
            m = self.metrics
            c = self._children[route] = tuple(m.child(m.envoy_hits, route, s) for s in STATS)
            if len(self._children) > 100_000:  # routes come and go with reloads: stay bounded
                self._children.clear()
        return c

    def add(self, route: str, cost: int, *, over: bool, limit: int, used_before: int, shadowed: bool) -> None:
        """Count one descriptor's ``cost`` hits."""
        total, over_c, near_c, within_c, shadow_c = self._of(route)
        total.inc(cost)
        if not cost:
            return
        o, n, w = split_hits(over, limit, used_before, cost, self.ratio)
        if o:
            over_c.inc(o)
            if shadowed:
                shadow_c.inc(o)
        if n:
            near_c.inc(n)
        if w:
            within_c.inc(w)
