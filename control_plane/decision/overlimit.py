"""Keys already over their global limit, answered without Redis (envoyproxy/ratelimit's
``LOCAL_CACHE_SIZE_IN_BYTES``).

When Redis refuses a request of a route in **enforce** under a fixed window (Envoy's limits,
and the rules' ``fixed_window`` routes) with a cost of at most one (a cost of 0 is a look:
its retry is a one-hit request's), the window is full: no request can be admitted before it
ends, ``now + retry_after``. Until then, this replica answers that key's requests of a cost
of at most one OVER_LIMIT itself, exactly as the global limit would (the same remaining,
retry and reset), without a Redis call. Shadow and canary keep asking Redis, so divergence stays the
traffic's truth; a change of the route's policy (its plan's distributed policy) ignores the
old entries; an admin reset of the key forgets it here.

Bounded: at most ``max_keys`` entries, the least recently used dropped first; an expired
entry is dropped when met. ``max_keys`` 0 switches it off (``SHADOWLIMIT_OVER_LIMIT_CACHE_KEYS``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from limiter import Decision, Policy
from limiter.policy import Algorithm, make_decision

__all__ = ["OverLimitCache"]


class OverLimitCache:
    """The cache (see the module docstring). Not thread-safe: the event loop's alone."""

    __slots__ = ("max_keys", "hits", "stored", "_entries")

    def __init__(self, max_keys: int) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys: must be >= 1, got {max_keys!r}")
        self.max_keys = max_keys
        self.hits = 0
        self.stored = 0
        # bucket key -> (until_us, reset_at_us, remaining, the distributed policy it was found under)
        self._entries: OrderedDict[str, tuple[int, int, int, Policy]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, policy: Policy, now_us: int) -> Decision | None:
        """The refusal the global limit gives ``key`` now, or None (not cached, expired, or
        found under another policy)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        until, reset_at, remaining, found_under = entry
        if now_us >= until or found_under is not policy:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return make_decision(False, remaining, policy.limit, until - now_us, max(0, reset_at - now_us))

    def put(self, key: str, policy: Policy, decision: Decision, now_us: int) -> None:
        """Remember a refusal of a request of cost <= 1 (see the module docstring); only a
        fixed window's is exact until it ends, so other algorithms' are not kept."""
        if decision.allowed or decision.retry_after_us <= 0 or policy.algorithm is not Algorithm.FIXED_WINDOW:
            return
        entries = self._entries
        if key not in entries and len(entries) >= self.max_keys:
            entries.popitem(last=False)
        entries[key] = (
            now_us + decision.retry_after_us,
            now_us + decision.reset_after_us,
            decision.remaining,
            policy,
        )
        entries.move_to_end(key)
        self.stored += 1

    def forget(self, key: str) -> None:
        """Drop ``key`` (an admin reset)."""
        self._entries.pop(key, None)

    def forget_prefix(self, prefix: str) -> int:
        """Drop every key starting with ``prefix`` (a route's keys); returns how many."""
        dead = [k for k in self._entries if k.startswith(prefix)]
        for k in dead:
            del self._entries[k]
        return len(dead)

    def stats(self) -> dict[str, Any]:
        return {"keys": len(self._entries), "max_keys": self.max_keys, "hits": self.hits, "stored": self.stored}
