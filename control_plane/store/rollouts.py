"""Rollout state, the audit log and the event channel, in Redis.

Keys (``ns`` = namespace; the ``{ns}`` hash tag keeps the keys that one Lua script
touches together in one Redis Cluster slot)::

    rl:{ns}:rollout              hash    route -> RouteState JSON
    rl:{ns}:audit                stream  audit entries (XADD MAXLEN ~ 10000)
    rl:{ns}:meta                 hash    epoch: a random id naming this copy of the data
                                         (gone or changed = the store lost its data)
    rl:{ns}:adjust               hash    runtime adjustments (written by the engine)
    rl:{ns}:plans                hash    route -> its rollout plan's PlanRecord JSON
    rl:{ns}:events               channel event JSON (PUBLISH)

The writes are the Lua scripts of :mod:`control_plane.store.scripts`; the plans' own keys
(lease, analyses) are :mod:`control_plane.store.plans`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis
from redis import exceptions as rex
from redis.asyncio.cluster import RedisCluster

from ..model.plan_progress import PlanRecord
from ..model.recovery import RememberedAudit, StateMemory, StoreView
from ..model.rollout import AuditEntry, RouteState
from .codec import audit_entry_from_dict, check_namespace, dumps, text
from .errors import LeaseLost, PlanConflict, StoreUnavailable, VersionConflict, translate_errors
from .scripts import APPEND_LUA, CHANGE_LUA, RESTORE_LUA

__all__ = ["AUDIT_MAXLEN", "AUDIT_SCAN_LIMIT", "AuditListener", "PlanWrite", "RestoreResult", "RolloutStore"]

log = logging.getLogger(__name__)

AUDIT_MAXLEN = 10_000
#: at most this many audit entries are scanned when filtering by route
AUDIT_SCAN_LIMIT = AUDIT_MAXLEN


AuditListener = Callable[[AuditEntry, RememberedAudit], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanWrite:
    """A rollout plan's record written with a mode change (:meth:`RolloutStore.change`):
    the record, the version it must replace, and the lease holder the plan driver's lease
    must name (None: an operator's change, which needs no lease)."""

    record: PlanRecord
    expected_version: int
    lease: str | None = None


def decode_plan(route: str, raw: Any) -> PlanRecord | None:
    """A stored plan record (None, logged, when unreadable)."""
    try:
        return PlanRecord.from_dict(json.loads(raw))
    except (ValueError, TypeError, AttributeError) as exc:
        log.warning("ignoring unreadable rollout plan record of route %r: %s", route, exc)
        return None


def plan_args(route: str, record: PlanRecord) -> str:
    """A plan record as a script takes it: its JSON without the version (the script sets it)."""
    d = record.to_dict()
    d.pop("version", None)
    return dumps(d)


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What :meth:`RolloutStore.restore` wrote back."""

    epoch: str
    routes: int
    audit_entries: int
    adjustments: int
    entries: tuple[AuditEntry, ...] = ()
    plans: int = 0

    @property
    def restored(self) -> bool:
        return bool(self.routes or self.audit_entries or self.adjustments or self.plans)


class RolloutStore:
    """Per-route rollout state, the audit stream and the event channel.

    ``change`` is one Lua script: version check, state write (version = old + 1),
    audit XADD and event PUBLISH happen atomically or not at all. It works on Redis
    Cluster because the hash and the stream share the ``{ns}`` hash tag (PUBLISH
    inside a script is propagated to the whole cluster by the cluster bus).
    """

    def __init__(
        self,
        client: Any,
        namespace: str = "shadowlimit",
        *,
        on_audit: AuditListener | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.namespace = check_namespace(namespace)
        #: wall-clock seconds: the time of restoration entries written without ``at``
        self.clock = clock
        self.rollout_key = f"rl:{{{namespace}}}:rollout"
        self.audit_key = f"rl:{{{namespace}}}:audit"
        self.meta_key = f"rl:{{{namespace}}}:meta"
        self.adjust_key = f"rl:{{{namespace}}}:adjust"
        self.plans_key = f"rl:{{{namespace}}}:plans"
        self.plan_lease_key = f"rl:{{{namespace}}}:plan-lease"
        self.channel = f"rl:{{{namespace}}}:events"
        #: called with every audit entry this store writes (after Redis accepted it)
        self.on_audit = on_audit
        self._change = client.register_script(CHANGE_LUA)
        self._append = client.register_script(APPEND_LUA)
        self._restore = client.register_script(RESTORE_LUA)

    def written(self, entry: AuditEntry, raw: RememberedAudit) -> AuditEntry:
        """Tell the listener (:attr:`on_audit`) of an audit entry Redis accepted; returns it."""
        if self.on_audit is not None:
            try:
                self.on_audit(entry, raw)
            except Exception:  # noqa: BLE001 - a listener never undoes a stored change
                log.exception("audit listener failed")
        return entry

    # -- state ---------------------------------------------------------------

    async def get_all(self) -> dict[str, RouteState]:
        with translate_errors("read rollout state"):
            raw = await self.client.hgetall(self.rollout_key)
        out: dict[str, RouteState] = {}
        for k, v in raw.items():
            route = text(k)
            state = self._decode_state(route, v)
            if state is not None:
                out[route] = state
        return out

    async def get(self, route: str) -> RouteState | None:
        with translate_errors("read rollout state"):
            raw = await self.client.hget(self.rollout_key, route)
        return None if raw is None else self._decode_state(route, raw)

    @staticmethod
    def _decode_state(route: str, raw: Any) -> RouteState | None:
        try:
            return RouteState.from_dict(json.loads(raw))
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("ignoring unreadable rollout state for route %r: %s", route, exc)
            return None

    async def change(
        self,
        route: str,
        new: RouteState,
        entry: AuditEntry,
        *,
        expected_version: int | None,
        plan: PlanWrite | None = None,
    ) -> AuditEntry:
        """Store ``new`` for ``route`` (its version becomes stored version + 1), append
        ``entry`` to the audit stream and publish a ``mode_change`` event -- atomically;
        with ``plan``, the route's plan record too (its own version checked, and the plan
        driver's lease when ``plan.lease`` is given).

        Raises :class:`VersionConflict` if ``expected_version`` is given and differs
        from the stored version (a never-stored route has version 0), :class:`PlanConflict`
        or :class:`LeaseLost` for the plan's checks, :class:`StoreUnavailable` if Redis cannot
        be reached. Returns ``entry`` with ``id`` set to the stream id (and ``route`` set to
        ``route``).
        """
        if expected_version is not None and (type(expected_version) is not int or expected_version < 0):
            raise ValueError(f"expected_version: must be a non-negative int or None, got {expected_version!r}")
        state = new.to_dict()
        state.pop("version", None)
        audit = entry.to_dict()
        audit.pop("id", None)
        audit["route"] = route
        args = [
            route,
            "" if expected_version is None else str(expected_version),
            dumps(state),
            dumps(audit),
            self.channel,
            str(AUDIT_MAXLEN),
            entry.kind,
            dumps(route),
        ]
        keys = [self.rollout_key, self.audit_key]
        if plan is not None:
            keys += [self.plans_key, self.plan_lease_key]
            args += [str(plan.expected_version), plan_args(route, plan.record), plan.lease or ""]
        with translate_errors(f"change route {route!r}"):
            reply = await self._change(keys=keys, args=args)
        code = int(reply[0])
        if code == 0:
            current = self._decode_state(route, reply[1]) if reply[1] else None
            raise VersionConflict(route, expected_version if expected_version is not None else -1, current)
        if code == 2:
            raise LeaseLost(text(reply[1]))
        if code == 3:
            raise PlanConflict(route, decode_plan(route, reply[1]) if reply[1] else None)
        sid = text(reply[1])
        return self.written(audit_entry_from_dict(audit, id=sid), RememberedAudit(sid, entry.kind, route, args[3]))

    # -- audit ---------------------------------------------------------------

    async def append_audit(self, entry: AuditEntry) -> AuditEntry:
        """Append a non-mode event (rules reload, reset, config change) to the audit
        stream and publish ``{"type": entry.kind, "route": ..., "audit": {...}}``,
        atomically. Returns the entry with its stream id."""
        audit = entry.to_dict()
        audit.pop("id", None)
        head = dumps({"type": entry.kind, "route": entry.route})[:-1]
        args = [entry.kind, entry.route, dumps(audit), self.channel, str(AUDIT_MAXLEN), head]
        with translate_errors(f"append audit entry ({entry.kind})"):
            sid = text(await self._append(keys=[self.audit_key], args=args))
        return self.written(
            audit_entry_from_dict(audit, id=sid), RememberedAudit(sid, entry.kind, entry.route, args[2])
        )

    # -- surviving the loss of the store's data (see control_plane.model.recovery) --------------

    async def read_view(self, head: str | None, *, tail: int = 200) -> StoreView:
        """Everything a replica compares with its memory, in one round trip: the route
        states, the epoch, the adjustments and the audit entries from ``head`` on (the
        newest ``tail`` when ``head`` is None), and whether ``head`` is still there."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.rollout_key)
        pipe.hget(self.meta_key, "epoch")
        pipe.hgetall(self.adjust_key)
        pipe.hgetall(self.plans_key)
        pipe.xlen(self.audit_key)
        pipe.xrange(self.audit_key, min="-", max="+", count=1)
        if head is None:
            pipe.xrevrange(self.audit_key, max="+", min="-", count=tail)
        else:
            pipe.xrange(self.audit_key, min=head, max="+", count=tail)
        try:
            with translate_errors("read rollout state"):
                got = dict(zip(("states", "epoch", "adjust", "plans", "xlen", "first", "rows"), await pipe.execute()))
        finally:
            with contextlib.suppress(Exception):
                await pipe.reset()
        raw_states, epoch, adjust = got["states"], got["epoch"], got["adjust"]
        xlen, first, rows = got["xlen"], got["first"], got["rows"]
        states: dict[str, RouteState] = {}
        for k, v in (raw_states or {}).items():
            route = text(k)
            state = self._decode_state(route, v)
            if state is not None:
                states[route] = state
        plans = {text(k): p for k, v in (got["plans"] or {}).items() if (p := decode_plan(text(k), v)) is not None}
        entries = [self._remembered(sid, fields) for sid, fields in (rows or [])]
        if head is None:
            entries.reverse()
        head_present = head is None or (bool(entries) and entries[0].id == head)
        return StoreView(
            states=states,
            epoch=None if epoch is None else text(epoch),
            audit_tail=tuple(entries),
            head_present=head_present,
            audit_len=int(xlen or 0),
            audit_first=text(first[0][0]) if first else None,
            adjustments={text(k): text(v) for k, v in (adjust or {}).items()},
            plans=plans,
        )

    @staticmethod
    def _remembered(sid: Any, fields: Any) -> RememberedAudit:
        f = {text(k): text(v) for k, v in fields.items()}
        return RememberedAudit(text(sid), f.get("kind", ""), f.get("route", ""), f.get("json", "{}"))

    async def restore(
        self, memory: StateMemory, *, instance: str, new_epoch: str, at: float | None = None
    ) -> RestoreResult:
        """Write back, compare-and-set, what the store lost of ``memory`` (see
        ``restore.lua``): route states whose stored version is missing or older,
        missing audit entries at their own ids, and -- when the epoch changed --
        missing runtime adjustments. Each restored route is audited (kind ``restore``,
        "restored by <instance> after the store lost its data") and announced. Atomic:
        replicas restoring at once agree, the newest version wins, a second run is a
        no-op. ``new_epoch`` is set when the store has no epoch (a remembered one is
        kept)."""
        states = {route: dumps(st.to_dict()) for route, st in memory.states.items() if st.version > 0}
        audit = [[e.id, e.kind, e.route, e.json] for e in memory.audit_entries()]
        plans = {route: dumps(r.to_dict()) for route, r in memory.plans.items() if r.version > 0}
        args = [
            instance,
            self.channel,
            str(AUDIT_MAXLEN),
            repr(self.clock() if at is None else at),
            memory.epoch or new_epoch,
            memory.epoch or "",
            dumps(states) if states else "{}",
            dumps(audit) if audit else "[]",
            dumps(memory.adjustments) if memory.adjustments else "{}",
            dumps(plans) if plans else "{}",
        ]
        with translate_errors("restore the control plane's state"):
            reply = await self._restore(
                keys=[self.rollout_key, self.audit_key, self.meta_key, self.adjust_key, self.plans_key], args=args
            )
        epoch, n_routes, n_audit, n_adjust = text(reply[0]), int(reply[1]), int(reply[2]), int(reply[3])
        entries = []
        for i in range(5, len(reply) - 1, 2):
            sid, raw = text(reply[i]), text(reply[i + 1])
            d = json.loads(raw)
            entries.append(
                self.written(
                    audit_entry_from_dict(d, id=sid), RememberedAudit(sid, "restore", str(d.get("route", "")), raw)
                )
            )
        return RestoreResult(
            epoch=epoch, routes=n_routes, audit_entries=n_audit, adjustments=n_adjust, entries=tuple(entries),
            plans=int(reply[4]),
        )  # fmt: skip

    async def ensure_epoch(self, candidate: str) -> str:
        """The store's epoch, set to ``candidate`` if it has none."""
        with translate_errors("read the store epoch"):
            await self.client.hsetnx(self.meta_key, "epoch", candidate)
            epoch = await self.client.hget(self.meta_key, "epoch")
        return text(epoch) if epoch is not None else candidate

    async def audit(self, limit: int = 100, route: str | None = None) -> list[AuditEntry]:
        """Newest first. With ``route``, only that route's entries, found by scanning
        at most :data:`AUDIT_SCAN_LIMIT` of the newest entries."""
        if limit <= 0:
            return []
        out: list[AuditEntry] = []
        page = limit if route is None else max(100, min(1000, limit * 4))
        scanned = 0
        end: str = "+"
        with translate_errors("read audit log"):
            while len(out) < limit and scanned < AUDIT_SCAN_LIMIT:
                count = min(page, AUDIT_SCAN_LIMIT - scanned)
                rows = await self.client.xrevrange(self.audit_key, max=end, min="-", count=count)
                if not rows:
                    break
                scanned += len(rows)
                for sid, fields in rows:
                    f = {text(k): v for k, v in fields.items()}
                    if route is not None and text(f.get("route", b"")) != route:
                        continue
                    try:
                        out.append(audit_entry_from_dict(json.loads(f["json"]), id=text(sid)))
                    except (KeyError, ValueError, TypeError) as exc:
                        log.warning("ignoring unreadable audit entry %s: %s", text(sid), exc)
                        continue
                    if len(out) >= limit:
                        break
                if len(rows) < count:
                    break
                end = "(" + text(rows[-1][0])
        return out

    # -- events --------------------------------------------------------------

    async def publish(self, event: dict[str, Any]) -> None:
        # execute_command: redis-py's asyncio RedisCluster has no publish() method;
        # a classic PUBLISH on any node reaches subscribers on every node.
        with translate_errors("publish event"):
            await self.client.execute_command("PUBLISH", self.channel, dumps(event))

    async def _pubsub_client(self) -> tuple[Any, bool]:
        """(client to subscribe with, whether we own it).

        redis-py's asyncio ``RedisCluster`` has no ``pubsub()``; classic (non-shard)
        PUBLISH is broadcast to every node over the cluster bus, so a plain
        connection to any one reachable node receives all events."""
        if not isinstance(self.client, RedisCluster):
            return self.client, False
        with translate_errors("subscribe"):
            await self.client.initialize()
            nodes = list(self.client.get_nodes())
        last: BaseException | None = None
        for node in nodes:
            pool = aredis.ConnectionPool(
                connection_class=node.connection_class, max_connections=2, **node.connection_kwargs
            )
            conn = aredis.Redis(connection_pool=pool)
            try:
                await conn.ping()
                return conn, True
            except (rex.RedisError, OSError) as exc:
                last = exc
                with contextlib.suppress(Exception):
                    await conn.aclose()
                    await pool.aclose()
        raise StoreUnavailable(f"subscribe: no cluster node reachable: {last}") from last

    async def subscribe(self, *, announce: bool = False) -> AsyncIterator[dict[str, Any]]:
        """Yield decoded events from the channel until cancelled / closed.

        With ``announce=True`` the first item is ``{"type": "subscribed", "channel":
        ...}``, yielded once the subscription is live: a consumer that then re-reads
        the state (``get_all``) has missed nothing. Events are hints -- published
        while nobody listened they are gone -- so after :class:`StoreUnavailable`
        (raised when the connection is lost) resubscribe and re-read the state.
        Non-JSON messages are logged and skipped. Cancellation (or ``aclose()``)
        unsubscribes and closes the connection.
        """
        conn, owned = await self._pubsub_client()
        pubsub = conn.pubsub(ignore_subscribe_messages=True)
        try:
            with translate_errors("subscribe"):
                await pubsub.subscribe(self.channel)
            _raise_if_cancelled()
            if announce:
                yield {"type": "subscribed", "channel": self.channel}
            while True:
                _raise_if_cancelled()
                with translate_errors("receive event"):
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg is None or msg.get("type") != "message":
                    continue
                try:
                    event = json.loads(msg["data"])
                except (ValueError, TypeError) as exc:
                    log.warning("ignoring undecodable event on %s: %s", self.channel, exc)
                    continue
                if isinstance(event, dict):
                    yield event
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pubsub.aclose(), 1.0)
            if owned:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.aclose(close_connection_pool=True), 1.0)


def _raise_if_cancelled() -> None:
    """Re-raise a cancellation redis-py swallowed: cancelled while ``subscribe`` connects, it
    can return normally, and the task then waits in ``get_message`` forever (its read
    timeout no longer fires in a task that is being cancelled), so stopping an engine right
    after it started left the pub/sub listener behind."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
