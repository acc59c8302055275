"""What a replica remembers of the control plane's own state, so that Redis losing its
data (a restart without persistence, FLUSHALL, a failover to an empty or lagging replica)
loses no mode change and no audit entry that a live replica has seen.

Pure: no IO, no clock. The engine feeds a :class:`StateMemory` everything it sees (the
states it reads or is told about, the audit entries it writes, reads or receives) and
asks it, after each read of the store, whether the store has lost something
(:meth:`StateMemory.check`). If so, the engine hands the memory to
:meth:`control_plane.store.RolloutStore.restore`, one Lua script that writes back, with
compare-and-set, only what the store lacks or holds in an older version, so replicas
restoring at the same time agree and the newest state wins.

How a loss shows:

* **epoch** -- the store carries a random id (``rl:{ns}:meta`` field ``epoch``) set by the
  first replica that finds none. Gone, or replaced by another one, means the data went
  with it (a replica started after the loss, with no memory, sets a new epoch and so
  makes the loss visible to the others instead of hiding it).
* **versions** -- a route's stored version only ever grows. A stored version below the
  remembered one, or a route missing that was stored, means the store went back.
* **audit head** -- the newest audit entry this replica has seen is missing from a stream
  too short to have trimmed it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from .plan_progress import PlanRecord
from .rollout import RouteState

__all__ = ["AUDIT_MEMORY", "LossReport", "RememberedAudit", "StateMemory", "StoreView", "stream_id_key"]

#: how many of the newest audit entries a replica keeps in memory
AUDIT_MEMORY = 1000


def stream_id_key(sid: str) -> tuple[int, int]:
    """A Redis stream id (``"<ms>-<seq>"``) as a sortable pair; malformed ids sort first."""
    ms, _, seq = sid.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return -1, -1


@dataclass(frozen=True, slots=True)
class RememberedAudit:
    """One audit entry exactly as the stream holds it: id and its three fields."""

    id: str
    kind: str
    route: str
    json: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreView:
    """One read of the store (see :meth:`control_plane.store.RolloutStore.read_view`).

    ``head_present`` says whether the audit entry asked about (the remembered head) is
    still in the stream (True when none was asked about); ``audit_tail`` holds the entries
    from the head on (or the newest ones when there was no head), oldest first."""

    states: Mapping[str, RouteState]
    epoch: str | None
    audit_tail: tuple[RememberedAudit, ...] = ()
    head_present: bool = True
    audit_len: int = 0
    audit_first: str | None = None
    adjustments: Mapping[str, str] = field(default_factory=dict)
    plans: Mapping[str, PlanRecord] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LossReport:
    """What :meth:`StateMemory.check` found missing or older in the store."""

    epoch_changed: bool = False
    routes: tuple[str, ...] = ()
    audit_missing: bool = False
    plans: tuple[str, ...] = ()

    @property
    def lost(self) -> bool:
        return self.epoch_changed or bool(self.routes) or self.audit_missing or bool(self.plans)

    def describe(self) -> str:
        parts = []
        if self.epoch_changed:
            parts.append("the store's epoch changed")
        if self.routes:
            parts.append("older or missing state for " + ", ".join(self.routes))
        if self.audit_missing:
            parts.append("audit entries missing")
        if self.plans:
            parts.append("older or missing rollout plan records for " + ", ".join(self.plans))
        return "; ".join(parts) or "nothing lost"


class StateMemory:
    """The newest rollout state per route, the newest audit entries, the runtime
    adjustments, the newest record of each route's rollout plan and the store epoch this
    replica has seen.

    ``states`` is the engine's live view of every route's mode: a state replaces the
    remembered one only when its version is at least as new, so a store that came back
    older or empty never changes a mode on this replica.
    """

    def __init__(self, audit_capacity: int = AUDIT_MEMORY) -> None:
        self.states: dict[str, RouteState] = {}
        self.epoch: str | None = None
        self.adjustments: dict[str, str] = {}
        self.plans: dict[str, PlanRecord] = {}
        self._audit: dict[str, RememberedAudit] = {}
        self._capacity = audit_capacity
        self.head: str | None = None  # the newest audit id seen

    # -- states --------------------------------------------------------------------------

    def note_state(self, route: str, state: RouteState) -> bool:
        """Remember ``state`` unless an older version; True when it is now the route's state."""
        cur = self.states.get(route)
        if cur is not None and state.version < cur.version:
            return False
        self.states[route] = state
        return True

    def note_plan(self, route: str, record: PlanRecord) -> bool:
        """Remember a plan record unless an older version; True when it is now the route's."""
        cur = self.plans.get(route)
        if cur is not None and record.version < cur.version:
            return False
        self.plans[route] = record
        return True

    # -- audit ---------------------------------------------------------------------------

    def note_audit(self, entry: RememberedAudit) -> None:
        if not entry.id or stream_id_key(entry.id) < (0, 0):
            return
        self._audit[entry.id] = entry
        if self.head is None or stream_id_key(entry.id) > stream_id_key(self.head):
            self.head = entry.id
        if len(self._audit) > self._capacity + self._capacity // 5:
            keep = sorted(self._audit, key=stream_id_key)[-self._capacity :]
            self._audit = {k: self._audit[k] for k in keep}

    def note_audits(self, entries: Iterable[RememberedAudit]) -> None:
        for e in entries:
            self.note_audit(e)

    def audit_entries(self) -> list[RememberedAudit]:
        """The remembered audit entries, oldest first."""
        return [self._audit[k] for k in sorted(self._audit, key=stream_id_key)]

    def __len__(self) -> int:
        return len(self._audit)

    # -- comparing with the store --------------------------------------------------------

    def check(self, view: StoreView, *, audit_maxlen: int) -> LossReport:
        """Compare one read of the store with what this replica remembers (nothing is
        changed here; see :meth:`absorb`)."""
        epoch_changed = self.epoch is not None and view.epoch != self.epoch
        routes = []
        for route, mine in self.states.items():
            if mine.version <= 0:
                continue  # never stored: a default state, nothing to restore
            stored = view.states.get(route)
            if stored is None or stored.version < mine.version:
                routes.append(route)
        plans = tuple(
            sorted(
                route
                for route, mine in self.plans.items()
                if mine.version > 0 and (view.plans.get(route) is None or view.plans[route].version < mine.version)
            )
        )
        audit_missing = False
        if self.head is not None and not view.head_present:
            # the head can only have been trimmed from a full stream, and then only if
            # newer entries pushed it out
            trimmed = (
                view.audit_len >= audit_maxlen
                and view.audit_first is not None
                and stream_id_key(view.audit_first) > stream_id_key(self.head)
            )
            audit_missing = not trimmed
        return LossReport(
            epoch_changed=epoch_changed, routes=tuple(sorted(routes)), audit_missing=audit_missing, plans=plans
        )

    def absorb(self, view: StoreView) -> list[str]:
        """Take in what the store holds that is not older than what is remembered; returns
        the routes whose state changed. The epoch is adopted only when none is remembered
        (a changed epoch is adopted by :meth:`restored`, after the restore)."""
        changed = []
        for route, stored in view.states.items():
            cur = self.states.get(route)
            if cur != stored and self.note_state(route, stored):
                changed.append(route)
        for route, record in view.plans.items():
            self.note_plan(route, record)
        self.note_audits(view.audit_tail)
        if self.epoch is None:
            self.epoch = view.epoch
        if view.epoch == self.epoch:
            self.adjustments = dict(view.adjustments)
        return changed

    def forget_baselines(self, routes: Iterable[str]) -> None:
        """The plans of ``routes`` lost their records with the store's data, and the fleet's
        counters with them: their steps count from nothing now, so the counts taken when each
        step began no longer apply (:func:`~.plan_analysis.since_baseline`)."""
        for route in routes:
            record = self.plans.get(route)
            if record is not None and record.baseline is not None:
                self.plans[route] = replace(record, baseline=None)

    def restored(self, epoch: str) -> None:
        """The store now holds everything remembered, under ``epoch``."""
        self.epoch = epoch
