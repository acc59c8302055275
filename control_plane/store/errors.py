"""The store's errors, and the one place redis-py exceptions are translated into them.

::

    StoreError              Redis answered with an error (or any other store failure)
     ├── StoreUnavailable   Redis unreachable, timed out, or the cluster cannot serve the keys
     ├── VersionConflict    RolloutStore.change: someone else changed the route first
     ├── PlanConflict       a rollout plan's record was changed first (PlanStore, RolloutStore.change)
     └── LeaseLost          the plan driver's lease is another replica's now: nothing was written

Every redis-py failure that means "Redis is not reachable / not answering" (connection
refused or lost, timeouts, cluster down, slot not covered, ...) becomes
:class:`StoreUnavailable`; other Redis errors become :class:`StoreError`. Callers never
see redis-py exceptions::

    with translate_errors("read rollout state"):
        raw = await client.hgetall(key)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from redis import exceptions as rex

from ..model.plan_progress import PlanRecord
from ..model.rollout import RouteState

__all__ = ["LeaseLost", "PlanConflict", "StoreError", "StoreUnavailable", "VersionConflict", "translate_errors"]


class StoreError(Exception):
    """A control-plane store operation failed (Redis answered with an error)."""


class StoreUnavailable(StoreError):
    """Redis is unreachable, timed out, or the cluster cannot serve the keys."""


class VersionConflict(StoreError):
    """``RolloutStore.change`` was given an ``expected_version`` that is not the
    stored one: someone else changed the route first. ``current`` is the stored
    state (``None`` if the route has never been stored, i.e. version 0)."""

    def __init__(self, route: str, expected: int, current: RouteState | None) -> None:
        self.route = route
        self.expected = expected
        self.current = current
        actual = current.version if current is not None else 0
        super().__init__(f"route {route!r}: expected version {expected}, stored version is {actual}")


class PlanConflict(StoreError):
    """A rollout plan's record is not at the version the writer read: someone else moved the
    plan first (another replica, an operator). ``current`` is the stored record (None: none)."""

    def __init__(self, route: str, current: PlanRecord | None) -> None:
        self.route = route
        self.current = current
        actual = current.version if current is not None else 0
        super().__init__(f"the rollout plan of route {route!r} was changed first (now version {actual})")


class LeaseLost(StoreError):
    """The plan driver's lease names another holder (``holder``, "" when free): this replica
    no longer drives the plans, and wrote nothing."""

    def __init__(self, holder: str) -> None:
        self.holder = holder
        super().__init__(f"the plan driver's lease is held by {holder or 'no one'}")


_UNAVAILABLE: tuple[type[BaseException], ...] = (
    rex.ConnectionError,  # includes BusyLoadingError, MaxConnectionsError, auth failures
    rex.TimeoutError,
    rex.ClusterError,  # ClusterDownError, MasterDownError
    rex.TryAgainError,
    rex.SlotNotCoveredError,
    OSError,  # includes builtin TimeoutError / asyncio.TimeoutError, ConnectionRefusedError
)


def _is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, _UNAVAILABLE):
        return True
    # redis-py's cluster client reports "no node answers" as a bare RedisClusterException
    return isinstance(exc, rex.RedisClusterException) and "cannot be connected" in str(exc)


@contextlib.contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Translate redis-py exceptions raised in the block into store errors."""
    try:
        yield
    except StoreError:
        raise
    except (rex.RedisError, rex.RedisClusterException, OSError) as exc:
        if _is_unavailable(exc):
            raise StoreUnavailable(f"{what}: Redis unavailable: {exc}") from exc
        raise StoreError(f"{what}: {exc}") from exc
