"""What this replica has seen lately, per route: requests per key (this minute and the
last), decisions per second, each key's last decision and the last limits a limits
service gave it. Bounded; read by the buckets view, ``/ratelimit/clients`` and the
routes' rates."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from limiter import Policy

__all__ = ["MAX_ACTIVE_KEYS", "Activity", "RouteActivity"]

MAX_ACTIVE_KEYS = 2000

#: (when, allowed, enforced by)
LastDecision = tuple[float, bool, str]


@dataclass(slots=True, kw_only=True)
class RouteActivity:
    """Recent activity of one route (all bounded)."""

    counts: dict[str, int]
    previous: dict[str, int]
    last: dict[str, LastDecision]
    minute: int
    per_second: dict[int, int] = field(default_factory=dict)  # unix second -> decisions
    external: dict[str, tuple[Policy, Policy]] = field(default_factory=dict)  # key -> last external policies
    second: int = -1  # the unix second of the last request counted


class Activity:
    """Every route's recent activity; ``clock`` gives the wall time in seconds."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._routes: dict[str, RouteActivity] = {}
        self._clock = clock

    def note(self, route: str, key: str, now_s: float) -> dict[str, LastDecision]:
        """Count one request; returns the route's last-decision map (for the caller to
        record the decision in). Per request: a dict lookup or two; what changes once a
        second (the minute, old seconds, a bound) is done when the second changes."""
        act = self._routes.get(route)
        sec = int(now_s)
        if act is None or act.second != sec:
            act = self._next_second(route, act, sec)
        counts = act.counts
        n = counts.get(key)
        if n is not None:
            counts[key] = n + 1
        elif len(counts) < MAX_ACTIVE_KEYS:
            counts[key] = 1
        act.per_second[sec] += 1
        last = act.last
        if len(last) > MAX_ACTIVE_KEYS:
            _trim(last)
        return last

    def _next_second(self, route: str, act: RouteActivity | None, sec: int) -> RouteActivity:
        minute = sec // 60
        if act is None or act.minute != minute:
            act = self._next_minute(route, act, minute)
        act.second = sec
        ps = act.per_second
        ps.setdefault(sec, 0)
        if len(ps) > 20:
            for old_sec in [t for t in ps if t < sec - 15]:
                del ps[old_sec]
        return act

    def _next_minute(self, route: str, old: RouteActivity | None, minute: int) -> RouteActivity:
        act = RouteActivity(
            counts={},
            previous=old.counts if old is not None and old.minute == minute - 1 else {},
            last=old.last if old is not None else {},
            minute=minute,
        )
        if old is not None:
            act.external = old.external
            act.per_second = old.per_second  # decisions/s must not drop at the minute boundary
        self._routes[route] = act
        return act

    def note_decision(self, route: str, key: str, last: LastDecision) -> None:
        """Record a key's last decision (one that was not known when it was counted)."""
        act = self._routes.get(route)
        if act is not None:
            act.last[key] = last

    def remember_external(self, route: str, key: str, local: Policy, dist: Policy) -> None:
        act = self._routes.get(route)
        if act is not None:
            act.external[key] = (local, dist)
            if len(act.external) > MAX_ACTIVE_KEYS:
                _trim(act.external)

    # -- reads ---------------------------------------------------------------------------

    def rate(self, route: str, window_s: int = 10) -> float:
        """Decisions per second on this replica over the last ``window_s`` whole seconds."""
        act = self._routes.get(route)
        if act is None:
            return 0.0
        now = int(self._clock())
        total = sum(n for sec, n in list(act.per_second.items()) if now - window_s <= sec < now)
        return total / window_s

    def hot_keys(self, route: str, n: int) -> list[tuple[str, int]]:
        """The most active keys: requests this minute plus half of last minute's."""
        act = self._routes.get(route)
        if act is None:
            return []
        score: dict[str, int] = {k: v // 2 for k, v in act.previous.items()}
        for k, v in act.counts.items():
            score[k] = score.get(k, 0) + v
        return sorted(score.items(), key=lambda kv: -kv[1])[:n]

    def external_policies(self, route: str, key: str) -> tuple[Policy, Policy] | None:
        act = self._routes.get(route)
        return None if act is None else act.external.get(key)

    def last_decision(self, route: str, key: str) -> LastDecision | None:
        act = self._routes.get(route)
        return None if act is None else act.last.get(key)


def _trim(kept: dict[str, Any]) -> None:
    """Forget the 500 oldest entries of a map past its bound."""
    for k in list(kept)[:500]:
        del kept[k]
