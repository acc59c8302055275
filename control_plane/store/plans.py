"""Rollout plans in Redis: each route's plan record, the plan driver's lease, the latest analyses.

Keys (``ns`` = namespace, all in the ``{ns}`` slot with the rollout state)::

    rl:{ns}:plans           hash    route -> PlanRecord JSON (restored with the rollout state
                                    when Redis loses its data: control_plane/store/restore.lua)
    rl:{ns}:plan-lease      string  "<instance>#<fence>": the replica driving the plans (PX)
    rl:{ns}:plan-fence      string  the fencing counter: one more at each taking of the lease
    rl:{ns}:plan-analysis   hash    route -> the latest analysis and the last outcomes (JSON;
                                    what every replica shows; not restored: the next is seconds away)

A record is written with compare-and-set on its version (``plan.lua``; with a mode change,
``change.lua``), and a write of the driver's names its lease, so a driver that lost the
lease writes nothing: two replicas never apply the same step, and none is skipped.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ..model.plan_progress import PlanRecord
from ..model.recovery import RememberedAudit
from ..model.rollout import AuditEntry
from .codec import audit_entry_from_dict, dumps, text
from .errors import LeaseLost, PlanConflict, translate_errors
from .rollouts import AUDIT_MAXLEN, RolloutStore, decode_plan, plan_args
from .scripts import LEASE_LUA, PLAN_LUA

__all__ = ["PlanStore"]

log = logging.getLogger(__name__)


class PlanStore:
    """The rollout plans' keys (see the module docstring), beside a :class:`RolloutStore`
    (the same client, namespace, audit stream and event channel)."""

    def __init__(self, store: RolloutStore) -> None:
        self.store = store
        self.client = store.client
        ns = store.namespace
        self.plans_key = store.plans_key
        self.lease_key = store.plan_lease_key
        self.fence_key = f"rl:{{{ns}}}:plan-fence"
        self.analysis_key = f"rl:{{{ns}}}:plan-analysis"
        self._plan = self.client.register_script(PLAN_LUA)
        self._lease = self.client.register_script(LEASE_LUA)

    # -- records -------------------------------------------------------------------------

    async def get_all(self) -> dict[str, PlanRecord]:
        with translate_errors("read rollout plans"):
            raw = await self.client.hgetall(self.plans_key)
        out = {}
        for k, v in (raw or {}).items():
            record = decode_plan(text(k), v)
            if record is not None:
                out[text(k)] = record
        return out

    async def get(self, route: str) -> PlanRecord | None:
        with translate_errors("read a rollout plan"):
            raw = await self.client.hget(self.plans_key, route)
        return None if raw is None else decode_plan(route, raw)

    async def write(
        self,
        route: str,
        record: PlanRecord,
        *,
        expected_version: int,
        entry: AuditEntry | None,
        lease: str | None = None,
    ) -> tuple[PlanRecord, AuditEntry | None]:
        """Write ``route``'s plan record if the stored one is at ``expected_version`` (0: none),
        with ``entry`` audited (kind ``plan``) and a ``plan`` event, atomically. ``lease``: the
        plan driver's lease must name it. Raises :class:`PlanConflict` or :class:`LeaseLost`.
        Returns the record with its new version and the entry with its id."""
        audit = ""
        if entry is not None:
            d = entry.to_dict()
            d.pop("id", None)
            d["route"] = route
            audit = dumps(d)
        args = [
            route, str(expected_version), plan_args(route, record), lease or "", audit, self.store.channel,
            str(AUDIT_MAXLEN), dumps(route),
        ]  # fmt: skip
        with translate_errors(f"write the rollout plan of {route!r}"):
            reply = await self._plan(keys=[self.plans_key, self.store.audit_key, self.lease_key], args=args)
        code = int(reply[0])
        if code == 2:
            raise LeaseLost(text(reply[1]))
        if code == 3:
            raise PlanConflict(route, decode_plan(route, reply[1]) if reply[1] else None)
        written = PlanRecord.from_dict({**record.to_dict(), "version": int(reply[1])})
        sid = text(reply[2])
        if entry is None or not sid:
            return written, None
        stored = audit_entry_from_dict(json.loads(audit), id=sid)
        return written, self.store.written(stored, RememberedAudit(sid, "plan", route, audit))

    # -- the driver's lease --------------------------------------------------------------

    async def lease(self, instance: str, ttl_s: float, held: str | None) -> str:
        """Take or renew the plan driver's lease: its holder afterwards (``held`` when this
        replica keeps it, a new ``<instance>#<fence>`` when it took it, another's otherwise)."""
        with translate_errors("take the plan driver's lease"):
            reply = await self._lease(
                keys=[self.lease_key, self.fence_key], args=[instance, str(int(ttl_s * 1000)), held or "", "0"]
            )
        return text(reply)

    async def release(self, held: str) -> None:
        """Give the lease up (a replica stopping: another takes over at once, not after its time)."""
        with translate_errors("release the plan driver's lease"):
            await self._lease(keys=[self.lease_key, self.fence_key], args=["", "0", held, "1"])

    async def holder(self) -> str | None:
        with translate_errors("read the plan driver's lease"):
            raw = await self.client.get(self.lease_key)
        return None if raw is None else text(raw)

    # -- analyses ------------------------------------------------------------------------

    async def put_analysis(self, route: str, value: dict[str, Any]) -> None:
        with translate_errors("write a plan's analysis"):
            await self.client.hset(self.analysis_key, route, dumps(value))

    async def analyses(self) -> dict[str, dict[str, Any]]:
        """The latest analysis of every plan, as the driver wrote them."""
        with translate_errors("read the plans' analyses"):
            raw = await self.client.hgetall(self.analysis_key)
        out: dict[str, dict[str, Any]] = {}
        for k, v in (raw or {}).items():
            try:
                d = json.loads(v)
            except ValueError:
                log.warning("ignoring an unreadable analysis of %r", text(k))
                continue
            if isinstance(d, dict):
                out[text(k)] = d
        return out
