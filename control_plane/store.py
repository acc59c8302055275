"""Redis persistence of the control plane: rollout state, audit log, events, and the
fleet-wide divergence counters.

Keys (``ns`` = namespace; the ``{ns}`` hash tag keeps the keys that one Lua script
touches together in one Redis Cluster slot)::

    rl:{ns}:rollout              hash    route -> RouteState JSON
    rl:{ns}:audit                stream  audit entries (XADD MAXLEN ~ 10000)
    rl:{ns}:meta                 hash    epoch: a random id naming this copy of the data
                                         (gone or changed = the store lost its data)
    rl:{ns}:adjust               hash    runtime adjustments (written by the engine)
    rl:{ns}:events               channel event JSON (PUBLISH)
    rl:ns:div:<route>:<minute>   hash    per-minute divergence counters (no hash tag:
                                         they spread over the cluster; EXPIRE 2 h)

Limiter bucket keys (``rl:ns:<key>``) are never touched here.

Errors: every redis-py failure that means "Redis is not reachable / not answering"
(connection refused or lost, timeouts, cluster down, slot not covered, ...) is
translated at this edge into :class:`StoreUnavailable`; other Redis errors become
:class:`StoreError`. Callers never see redis-py exceptions.

Both stores take a redis-py asyncio client (``redis.asyncio.Redis`` or
``redis.asyncio.cluster.RedisCluster``, e.g. from
:func:`limiter.redis_limiter.make_redis_py_client`); they do not own or close it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis
from redis import exceptions as rex
from redis.asyncio.cluster import RedisCluster

from .recovery import RememberedAudit, StateMemory, StoreView
from .rollout import AuditEntry, Divergence, GateStats, RouteState

__all__ = [
    "AUDIT_MAXLEN",
    "AuditListener",
    "DIVERGENCE_FIELDS",
    "DIVERGENCE_TTL_S",
    "DivergenceStore",
    "RestoreResult",
    "RolloutStore",
    "StoreError",
    "StoreUnavailable",
    "VersionConflict",
    "audit_entry_from_dict",
    "translate_errors",
]

log = logging.getLogger(__name__)

AUDIT_MAXLEN = 10_000
#: at most this many audit entries are scanned when filtering by route
AUDIT_SCAN_LIMIT = AUDIT_MAXLEN
DIVERGENCE_TTL_S = 2 * 3600
DIVERGENCE_FIELDS = (
    "agree",
    "local_allow_distributed_deny",
    "local_deny_distributed_allow",
    "compared",
    "backend_errors",
    "distributed_attempts",
    "shadow_dropped",
)
_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


# --------------------------------------------------------------------------- #
# errors
# --------------------------------------------------------------------------- #


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


def _check_namespace(namespace: str) -> str:
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise ValueError(f"namespace: must be 1-64 characters of letters, digits, '_', '.', '-', got {namespace!r}")
    return namespace


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def audit_entry_from_dict(d: dict[str, Any], id: str | None = None) -> AuditEntry:
    """Inverse of :meth:`AuditEntry.to_dict` (``id`` overrides the dict's id)."""
    return AuditEntry(
        route=str(d.get("route", "")),
        actor=str(d.get("actor", "")),
        from_mode=str(d.get("from", "")),
        to_mode=str(d.get("to", "")),
        reason=str(d.get("reason", "")),
        at=float(d.get("at", 0.0)),
        from_percent=int(d.get("from_percent", 0)),
        to_percent=int(d.get("to_percent", 0)),
        forced=bool(d.get("forced", False)),
        automatic=bool(d.get("automatic", False)),
        gate=d.get("gate"),
        kind=d.get("kind", "mode_change"),
        id=id if id is not None else str(d.get("id", "")),
    )


# --------------------------------------------------------------------------- #
# rollout state, audit log, events
# --------------------------------------------------------------------------- #

# KEYS[1] rollout hash, KEYS[2] audit stream (same {ns} slot)
# ARGV: route, expected version ('' = unconditional), state JSON without "version",
#       audit JSON without "id", channel, maxlen, kind, route as a JSON string
# Returns {0, current state JSON or '', current version} on a version conflict,
#         {1, stream id, new version} on success.
# Every check happens before the first write and the writes cannot fail after the
# checks, so the script either changes everything or nothing.
_CHANGE_LUA = r"""
local t = redis.call('TYPE', KEYS[2])['ok']
if t ~= 'none' and t ~= 'stream' then
  return redis.error_reply('audit key ' .. KEYS[2] .. ' holds a ' .. t .. ', not a stream')
end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local ver = 0
if cur then
  local ok, dec = pcall(cjson.decode, cur)
  if ok and type(dec) == 'table' and tonumber(dec['version']) then
    ver = tonumber(dec['version'])
  end
end
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= ver then
  return {0, cur or '', ver}
end
local newver = ver + 1
local state = string.sub(ARGV[3], 1, -2) .. ',"version":' .. string.format('%d', newver) .. '}'
redis.call('HSET', KEYS[1], ARGV[1], state)
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'kind', ARGV[7], 'route', ARGV[1], 'json', ARGV[4])
local audit = string.sub(ARGV[4], 1, -2) .. ',"id":"' .. id .. '"}'
redis.call('PUBLISH', ARGV[5], '{"type":"mode_change","route":' .. ARGV[8] .. ',"state":' .. state .. ',"audit":' .. audit .. '}')
return {1, id, newver}
"""

# KEYS[1] audit stream; ARGV: kind, route, audit JSON without "id", channel, maxlen,
# event JSON without its closing brace (the "audit" member is appended here).
_APPEND_LUA = r"""
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'stream' then
  return redis.error_reply('audit key ' .. KEYS[1] .. ' holds a ' .. t .. ', not a stream')
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], '*', 'kind', ARGV[1], 'route', ARGV[2], 'json', ARGV[3])
local audit = string.sub(ARGV[3], 1, -2) .. ',"id":"' .. id .. '"}'
redis.call('PUBLISH', ARGV[4], ARGV[6] .. ',"audit":' .. audit .. '}')
return id
"""


# KEYS[1] rollout hash, KEYS[2] audit stream, KEYS[3] meta hash, KEYS[4] adjustments hash
# (all in the {ns} slot).
# ARGV[1] instance id, ARGV[2] channel, ARGV[3] audit maxlen, ARGV[4] time (s) of the
# restoration entries, ARGV[5] epoch to set when the store has none, ARGV[6] the epoch
# the caller remembers ('' = none), ARGV[7] JSON {route: state JSON} remembered,
# ARGV[8] JSON [[id, kind, route, json], ...] remembered audit entries, ARGV[9] JSON
# {field: value} remembered adjustments.
# Writes back, compare-and-set, what the store lacks: a route state whose stored version
# is missing or lower; audit entries missing from the stream (re-added at their own ids,
# in order); adjustments missing after the epoch changed. Each restored route gets an
# audit entry (kind "restore") and a mode_change event; restored audit entries or
# adjustments without a restored route get one entry for route "*".
# Returns {epoch in the store, routes restored, audit entries restored, adjustments
# restored, id1, json1, id2, json2, ...} (the restoration entries written).
_RESTORE_LUA = r"""
local t = redis.call('TYPE', KEYS[2])['ok']
if t ~= 'none' and t ~= 'stream' then
  return redis.error_reply('audit key ' .. KEYS[2] .. ' holds a ' .. t .. ', not a stream')
end
local maxlen = tonumber(ARGV[3])
local at = tonumber(ARGV[4])
local instance = ARGV[1]
local function idkey(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms or -1), tonumber(seq or -1)
end
local function idlt(a, b)
  local am, as = idkey(a)
  local bm, bs = idkey(b)
  if am ~= bm then return am < bm end
  return as < bs
end
local function sorted_keys(tbl)
  local ks = {}
  for k in pairs(tbl) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end
local function version_of(raw)
  local ok, dec = pcall(cjson.decode, raw)
  if ok and type(dec) == 'table' and tonumber(dec['version']) then return tonumber(dec['version']), dec end
  return 0, nil
end

local epoch = redis.call('HGET', KEYS[3], 'epoch')
local epoch_lost = (not epoch) or (ARGV[6] ~= '' and epoch ~= ARGV[6])
if not epoch then
  epoch = ARGV[5]
  redis.call('HSET', KEYS[3], 'epoch', epoch)
end

-- route states: compare-and-set, the newest version wins
local restored = {}
local states = cjson.decode(ARGV[7])
for _, route in ipairs(sorted_keys(states)) do
  local raw = states[route]
  local myver, mine = version_of(raw)
  local cur = redis.call('HGET', KEYS[1], route)
  local curver, curdec = -1, nil
  if cur then curver, curdec = version_of(cur) end
  if mine and myver > 0 and curver < myver then
    redis.call('HSET', KEYS[1], route, raw)
    restored[#restored + 1] = {route, curdec, mine, raw, cur and curver or 0, myver}
  end
end

-- audit entries missing from the stream (not merely trimmed from a full one)
local audit = cjson.decode(ARGV[8])
local xlen = redis.call('XLEN', KEYS[2])
local first = nil
if xlen > 0 then first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1][1] end
local missing = {}
for _, e in ipairs(audit) do
  if #redis.call('XRANGE', KEYS[2], e[1], e[1]) == 0 and (xlen < maxlen or (first and idlt(first, e[1]))) then
    missing[#missing + 1] = e
  end
end
if #missing > 0 then
  local merged = {}
  for _, row in ipairs(redis.call('XRANGE', KEYS[2], '-', '+')) do
    local f, m = row[2], {}
    for i = 1, #f, 2 do m[f[i]] = f[i + 1] end
    merged[#merged + 1] = {row[1], m['kind'] or '', m['route'] or '', m['json'] or '{}'}
  end
  for _, e in ipairs(missing) do merged[#merged + 1] = e end
  table.sort(merged, function(a, b) return idlt(a[1], b[1]) end)
  redis.call('DEL', KEYS[2])
  for i = math.max(1, #merged - maxlen + 1), #merged do
    local e = merged[i]
    redis.call('XADD', KEYS[2], e[1], 'kind', e[2], 'route', e[3], 'json', e[4])
  end
end

-- runtime adjustments, only when the data went with the epoch
local adj_restored = 0
if epoch_lost then
  local adj = cjson.decode(ARGV[9])
  for _, f in ipairs(sorted_keys(adj)) do
    adj_restored = adj_restored + redis.call('HSETNX', KEYS[4], f, adj[f])
  end
end

local out = {epoch, #restored, #missing, adj_restored}
local reason = 'restored by ' .. instance .. ' after the store lost its data'
local function append(route, entry, event_head)
  local json = cjson.encode(entry)
  local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'kind', 'restore', 'route', route, 'json', json)
  local audit_json = string.sub(json, 1, -2) .. ',"id":"' .. id .. '"}'
  redis.call('PUBLISH', ARGV[2], event_head .. ',"audit":' .. audit_json .. '}')
  out[#out + 1] = id
  out[#out + 1] = json
end
for _, r in ipairs(restored) do
  local route, old, new, raw, oldver, newver = r[1], r[2], r[3], r[4], r[5], r[6]
  local entry = {
    kind = 'restore', route = route, actor = 'instance/' .. instance, at = at,
    ['from'] = old and old['mode'] or '', to = new['mode'],
    from_percent = old and tonumber(old['canary_percent']) or 0, to_percent = tonumber(new['canary_percent']) or 0,
    reason = reason .. ' (stored version ' .. string.format('%d', oldver) .. ', restored version ' .. string.format('%d', newver) .. ')',
    forced = false, automatic = true, gate = cjson.null,
  }
  append(route, entry, '{"type":"mode_change","restored":true,"route":' .. cjson.encode(route) .. ',"state":' .. raw)
end
if #restored == 0 and (#missing > 0 or adj_restored > 0) then
  local entry = {
    kind = 'restore', route = '*', actor = 'instance/' .. instance, at = at, ['from'] = '', to = '',
    from_percent = 0, to_percent = 0,
    reason = reason .. ' (' .. #missing .. ' audit entries, ' .. adj_restored .. ' runtime adjustments)',
    forced = false, automatic = true, gate = cjson.null,
  }
  append('*', entry, '{"type":"restore","route":"*"')
end
return out
"""


AuditListener = Callable[[AuditEntry, RememberedAudit], None]


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What :meth:`RolloutStore.restore` wrote back."""

    epoch: str
    routes: int
    audit_entries: int
    adjustments: int
    entries: tuple[AuditEntry, ...] = ()

    @property
    def restored(self) -> bool:
        return bool(self.routes or self.audit_entries or self.adjustments)


class RolloutStore:
    """Per-route rollout state, the audit stream and the event channel.

    ``change`` is one Lua script: version check, state write (version = old + 1),
    audit XADD and event PUBLISH happen atomically or not at all. It works on Redis
    Cluster because the hash and the stream share the ``{ns}`` hash tag (PUBLISH
    inside a script is propagated to the whole cluster by the cluster bus).
    """

    def __init__(self, client: Any, namespace: str = "shadowlimit", *, on_audit: AuditListener | None = None) -> None:
        self.client = client
        self.namespace = _check_namespace(namespace)
        self.rollout_key = f"rl:{{{namespace}}}:rollout"
        self.audit_key = f"rl:{{{namespace}}}:audit"
        self.meta_key = f"rl:{{{namespace}}}:meta"
        self.adjust_key = f"rl:{{{namespace}}}:adjust"
        self.channel = f"rl:{{{namespace}}}:events"
        #: called with every audit entry this store writes (after Redis accepted it)
        self.on_audit = on_audit
        self._change = client.register_script(_CHANGE_LUA)
        self._append = client.register_script(_APPEND_LUA)
        self._restore = client.register_script(_RESTORE_LUA)

    def _written(self, entry: AuditEntry, raw: RememberedAudit) -> AuditEntry:
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
            route = _text(k)
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
        self, route: str, new: RouteState, entry: AuditEntry, *, expected_version: int | None
    ) -> AuditEntry:
        """Store ``new`` for ``route`` (its version becomes stored version + 1), append
        ``entry`` to the audit stream and publish a ``mode_change`` event -- atomically.

        Raises :class:`VersionConflict` if ``expected_version`` is given and differs
        from the stored version (a never-stored route has version 0),
        :class:`StoreUnavailable` if Redis cannot be reached. Returns ``entry`` with
        ``id`` set to the stream id (and ``route`` set to ``route``).
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
            _dumps(state),
            _dumps(audit),
            self.channel,
            str(AUDIT_MAXLEN),
            entry.kind,
            _dumps(route),
        ]
        with translate_errors(f"change route {route!r}"):
            reply = await self._change(keys=[self.rollout_key, self.audit_key], args=args)
        if int(reply[0]) == 0:
            current = self._decode_state(route, reply[1]) if reply[1] else None
            raise VersionConflict(route, expected_version if expected_version is not None else -1, current)
        sid = _text(reply[1])
        return self._written(audit_entry_from_dict(audit, id=sid), RememberedAudit(sid, entry.kind, route, args[3]))

    # -- audit ---------------------------------------------------------------

    async def append_audit(self, entry: AuditEntry) -> AuditEntry:
        """Append a non-mode event (rules reload, reset, config change) to the audit
        stream and publish ``{"type": entry.kind, "route": ..., "audit": {...}}``,
        atomically. Returns the entry with its stream id."""
        audit = entry.to_dict()
        audit.pop("id", None)
        head = _dumps({"type": entry.kind, "route": entry.route})[:-1]
        args = [entry.kind, entry.route, _dumps(audit), self.channel, str(AUDIT_MAXLEN), head]
        with translate_errors(f"append audit entry ({entry.kind})"):
            sid = _text(await self._append(keys=[self.audit_key], args=args))
        return self._written(
            audit_entry_from_dict(audit, id=sid), RememberedAudit(sid, entry.kind, entry.route, args[2])
        )

    # -- surviving the loss of the store's data (see control_plane.recovery) --------------

    async def read_view(self, head: str | None, *, tail: int = 200) -> StoreView:
        """Everything a replica compares with its memory, in one round trip: the route
        states, the epoch, the adjustments and the audit entries from ``head`` on (the
        newest ``tail`` when ``head`` is None), and whether ``head`` is still there."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.rollout_key)
        pipe.hget(self.meta_key, "epoch")
        pipe.hgetall(self.adjust_key)
        pipe.xlen(self.audit_key)
        pipe.xrange(self.audit_key, min="-", max="+", count=1)
        if head is None:
            pipe.xrevrange(self.audit_key, max="+", min="-", count=tail)
        else:
            pipe.xrange(self.audit_key, min=head, max="+", count=tail)
        try:
            with translate_errors("read rollout state"):
                raw_states, epoch, adjust, xlen, first, rows = await pipe.execute()
        finally:
            with contextlib.suppress(Exception):
                await pipe.reset()
        states: dict[str, RouteState] = {}
        for k, v in (raw_states or {}).items():
            route = _text(k)
            state = self._decode_state(route, v)
            if state is not None:
                states[route] = state
        entries = [self._remembered(sid, fields) for sid, fields in (rows or [])]
        if head is None:
            entries.reverse()
        head_present = head is None or (bool(entries) and entries[0].id == head)
        return StoreView(
            states=states,
            epoch=None if epoch is None else _text(epoch),
            audit_tail=tuple(entries),
            head_present=head_present,
            audit_len=int(xlen or 0),
            audit_first=_text(first[0][0]) if first else None,
            adjustments={_text(k): _text(v) for k, v in (adjust or {}).items()},
        )

    @staticmethod
    def _remembered(sid: Any, fields: Any) -> RememberedAudit:
        f = {_text(k): _text(v) for k, v in fields.items()}
        return RememberedAudit(_text(sid), f.get("kind", ""), f.get("route", ""), f.get("json", "{}"))

    async def restore(
        self, memory: StateMemory, *, instance: str, new_epoch: str, at: float | None = None
    ) -> RestoreResult:
        """Write back, compare-and-set, what the store lost of ``memory`` (see
        :data:`_RESTORE_LUA`): route states whose stored version is missing or older,
        missing audit entries at their own ids, and -- when the epoch changed --
        missing runtime adjustments. Each restored route is audited (kind ``restore``,
        "restored by <instance> after the store lost its data") and announced. Atomic:
        replicas restoring at once agree, the newest version wins, a second run is a
        no-op. ``new_epoch`` is set when the store has no epoch (a remembered one is
        kept)."""
        states = {route: _dumps(st.to_dict()) for route, st in memory.states.items() if st.version > 0}
        audit = [[e.id, e.kind, e.route, e.json] for e in memory.audit_entries()]
        args = [
            instance,
            self.channel,
            str(AUDIT_MAXLEN),
            repr(time.time() if at is None else at),
            memory.epoch or new_epoch,
            memory.epoch or "",
            _dumps(states) if states else "{}",
            _dumps(audit) if audit else "[]",
            _dumps(memory.adjustments) if memory.adjustments else "{}",
        ]
        with translate_errors("restore the control plane's state"):
            reply = await self._restore(
                keys=[self.rollout_key, self.audit_key, self.meta_key, self.adjust_key], args=args
            )
        epoch, n_routes, n_audit, n_adjust = _text(reply[0]), int(reply[1]), int(reply[2]), int(reply[3])
        entries = []
        for i in range(4, len(reply) - 1, 2):
            sid, raw = _text(reply[i]), _text(reply[i + 1])
            d = json.loads(raw)
            entries.append(
                self._written(
                    audit_entry_from_dict(d, id=sid), RememberedAudit(sid, "restore", str(d.get("route", "")), raw)
                )
            )
        return RestoreResult(
            epoch=epoch, routes=n_routes, audit_entries=n_audit, adjustments=n_adjust, entries=tuple(entries)
        )

    async def ensure_epoch(self, candidate: str) -> str:
        """The store's epoch, set to ``candidate`` if it has none."""
        with translate_errors("read the store epoch"):
            await self.client.hsetnx(self.meta_key, "epoch", candidate)
            epoch = await self.client.hget(self.meta_key, "epoch")
        return _text(epoch) if epoch is not None else candidate

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
                    f = {_text(k): v for k, v in fields.items()}
                    if route is not None and _text(f.get("route", b"")) != route:
                        continue
                    try:
                        out.append(audit_entry_from_dict(json.loads(f["json"]), id=_text(sid)))
                    except (KeyError, ValueError, TypeError) as exc:
                        log.warning("ignoring unreadable audit entry %s: %s", _text(sid), exc)
                        continue
                    if len(out) >= limit:
                        break
                if len(rows) < count:
                    break
                end = "(" + _text(rows[-1][0])
        return out

    # -- events --------------------------------------------------------------

    async def publish(self, event: dict[str, Any]) -> None:
        # execute_command: redis-py's asyncio RedisCluster has no publish() method;
        # a classic PUBLISH on any node reaches subscribers on every node.
        with translate_errors("publish event"):
            await self.client.execute_command("PUBLISH", self.channel, _dumps(event))

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
            if announce:
                yield {"type": "subscribed", "channel": self.channel}
            while True:
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


# --------------------------------------------------------------------------- #
# fleet-wide divergence counters
# --------------------------------------------------------------------------- #

_F_AGREE, _F_LADD, _F_LDDA, _F_CMP, _F_ERR, _F_ATT, _F_DROP = range(7)
_DIV_INDEX = {
    Divergence.AGREE: _F_AGREE,
    Divergence.LOCAL_ALLOW_DISTRIBUTED_DENY: _F_LADD,
    Divergence.LOCAL_DENY_DISTRIBUTED_ALLOW: _F_LDDA,
}


def _minute(t: float) -> int:
    return int(t // 60) * 60


class DivergenceStore:
    """Per-route, per-minute divergence counters shared by every replica.

    Each replica ``record``\\ s only its own decisions in memory (sync, O(1), no IO)
    and ``flush``\\ es the deltas with HINCRBY into ``rl:<ns>:div:<route>:<minute>``
    -- so fleet totals are the plain sum, nothing is counted twice. The reads
    (``series``, ``window_stats``, ``totals``) are pure Redis: this replica's
    unflushed deltas (at most one flush interval, 1 s by default) are not included.

    Delivery: a failed flush puts its deltas back (``StoreUnavailable`` is raised)
    so nothing is lost; a command that Redis applied but whose reply was lost (a
    connection cut mid-pipeline) is therefore counted again -- at-least-once.
    """

    def __init__(self, client: Any, namespace: str = "shadowlimit") -> None:
        self.client = client
        self.namespace = _check_namespace(namespace)
        self._prefix = f"rl:{namespace}:div:"
        self._pending: dict[tuple[str, int], list[int]] = {}

    def key(self, route: str, minute: int) -> str:
        return f"{self._prefix}{route}:{minute}"

    # -- hot path --------------------------------------------------------------

    def record(
        self,
        route: str,
        divergence: Divergence | None,
        *,
        backend_error: bool = False,
        distributed_attempt: bool = False,
        now: float | None = None,
    ) -> None:
        """Count one decision. ``divergence`` is the comparison result (``None`` when
        there was nothing to compare, e.g. the distributed call failed). A backend
        error always counts as a distributed attempt too."""
        slot = (route, _minute(time.time() if now is None else now))
        c = self._pending.get(slot)
        if c is None:
            c = self._pending[slot] = [0, 0, 0, 0, 0, 0, 0]
        if divergence is not None:
            c[_DIV_INDEX[divergence]] += 1
            c[_F_CMP] += 1
        if backend_error:
            c[_F_ERR] += 1
            c[_F_ATT] += 1
        elif distributed_attempt:
            c[_F_ATT] += 1

    def add(
        self,
        route: str,
        *,
        agree: int = 0,
        ladd: int = 0,
        ldda: int = 0,
        backend_errors: int = 0,
        dropped: int = 0,
        now: float | None = None,
    ) -> None:
        """Count many decisions of one route at once, as that many :meth:`record` calls
        would: ``agree``, ``ladd`` (local allow, distributed deny) and ``ldda`` compared
        pairs, ``backend_errors`` distributed calls that failed, and ``dropped`` shadow
        evaluations dropped (the queue was full): decisions never compared, so the
        figures are a sample (see ``sampled_share``)."""
        slot = (route, _minute(time.time() if now is None else now))
        c = self._pending.get(slot)
        if c is None:
            c = self._pending[slot] = [0, 0, 0, 0, 0, 0, 0]
        compared = agree + ladd + ldda
        c[_F_AGREE] += agree
        c[_F_LADD] += ladd
        c[_F_LDDA] += ldda
        c[_F_CMP] += compared
        c[_F_ERR] += backend_errors
        c[_F_ATT] += compared + backend_errors
        c[_F_DROP] += dropped

    def pending(self) -> dict[tuple[str, int], dict[str, int]]:
        """Unflushed deltas (a copy), keyed by (route, minute)."""
        return {k: dict(zip(DIVERGENCE_FIELDS, v)) for k, v in self._pending.items()}

    def _merge_back(self, slot: tuple[str, int], index: int, delta: int) -> None:
        c = self._pending.get(slot)
        if c is None:
            c = self._pending[slot] = [0, 0, 0, 0, 0, 0, 0]
        c[index] += delta

    async def flush(self) -> int:
        """Write the accumulated deltas to Redis (one non-transactional pipeline).
        Returns the number of (route, minute) hashes written. On failure the deltas
        not known to be applied are kept and :class:`StoreUnavailable` /
        :class:`StoreError` is raised."""
        batch, self._pending = self._pending, {}
        if not batch:
            return 0
        plan: list[tuple[tuple[str, int], int, int] | None] = []
        pipe = self.client.pipeline(transaction=False)
        for slot, counts in batch.items():
            key = self.key(*slot)
            for i, name in enumerate(DIVERGENCE_FIELDS):
                if counts[i]:
                    pipe.hincrby(key, name, counts[i])
                    plan.append((slot, i, counts[i]))
            pipe.expire(key, DIVERGENCE_TTL_S)
            plan.append(None)
        done = False
        try:
            with translate_errors("flush divergence counters"):
                results = await pipe.execute(raise_on_error=False)
            done = True
        finally:
            if not done:  # nothing known to be applied: keep every delta
                for slot, counts in batch.items():
                    for i, v in enumerate(counts):
                        if v:
                            self._merge_back(slot, i, v)
            with contextlib.suppress(Exception):
                await pipe.reset()
        failed: list[BaseException] = []
        for item, res in zip(plan, results):
            if isinstance(res, BaseException):
                failed.append(res)
                if item is not None:
                    self._merge_back(*item)
        if failed:
            with translate_errors("flush divergence counters"):
                raise failed[0]
        return len(batch)

    async def run(self, interval_s: float = 1.0) -> None:
        """Flush every ``interval_s`` until cancelled; errors are logged, not raised.
        On cancellation one last flush is attempted (bounded to 1 s)."""
        try:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await self.flush()
                except StoreError as exc:
                    log.warning("divergence flush failed (deltas kept): %s", exc)
                except Exception:  # noqa: BLE001 - the loop must survive
                    log.exception("divergence flush failed")
        except asyncio.CancelledError:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.flush(), 1.0)
            raise

    # -- reads ---------------------------------------------------------------

    async def _read(self, route: str, minutes: list[int]) -> list[dict[str, int]]:
        pipe = self.client.pipeline(transaction=False)
        for m in minutes:
            pipe.hgetall(self.key(route, m))
        try:
            with translate_errors("read divergence counters"):
                rows = await pipe.execute()
        finally:
            with contextlib.suppress(Exception):
                await pipe.reset()
        out = []
        for m, raw in zip(minutes, rows):
            d = {_text(k): int(v) for k, v in (raw or {}).items()}
            out.append({"minute": m, **{f: d.get(f, 0) for f in DIVERGENCE_FIELDS}})
        return out

    async def series(self, route: str, minutes: int = 60, now: float | None = None) -> list[dict[str, int]]:
        """Fleet-wide counts of the last ``minutes`` minutes (the current one
        included), oldest first, zeros for minutes without data."""
        if minutes <= 0:
            return []
        cur = _minute(time.time() if now is None else now)
        return await self._read(route, [cur - 60 * i for i in range(minutes - 1, -1, -1)])

    async def window_stats(self, route: str, window_s: float, now: float | None = None) -> GateStats:
        """Gate figures over the minutes covering ``[now - window_s, now]`` (whole
        minutes: the first may start up to 59 s before the window)."""
        t = time.time() if now is None else now
        minutes = max(1, (_minute(t) - _minute(t - window_s)) // 60 + 1)
        rows = await self.series(route, minutes, now=t)
        return gate_stats_of(rows)

    async def totals(self, route: str, minutes: int = 60, now: float | None = None) -> dict[str, Any]:
        """Sums over :meth:`series` plus ``new_rejection_rate``, ``reverse_rate``
        (local_deny_distributed_allow / compared) and ``backend_error_rate``
        (backend_errors / distributed_attempts); rates are 0.0 without samples."""
        return totals_of(await self.series(route, minutes, now=now), minutes)


def totals_of(rows: list[dict[str, int]], minutes: int) -> dict[str, Any]:
    """Sum per-minute rows (as :meth:`DivergenceStore.series` returns) and add the rates
    and ``sampled_share``: the share of the decisions that should have been compared
    that the distributed limiter did evaluate (1.0 unless shadow evaluations were
    dropped; None with no decisions at all)."""
    s: dict[str, Any] = {f: sum(r.get(f, 0) for r in rows) for f in DIVERGENCE_FIELDS}
    cmp, att = s["compared"], s["distributed_attempts"]
    s["minutes"] = minutes
    s["new_rejection_rate"] = s["local_allow_distributed_deny"] / cmp if cmp else 0.0
    s["reverse_rate"] = s["local_deny_distributed_allow"] / cmp if cmp else 0.0
    s["backend_error_rate"] = s["backend_errors"] / att if att else 0.0
    s["sampled_share"] = gate_stats_of(rows).sampled_share
    return s


def gate_stats_of(rows: list[dict[str, int]]) -> GateStats:
    s = {f: sum(r.get(f, 0) for r in rows) for f in DIVERGENCE_FIELDS}
    return GateStats(
        compared=s["compared"],
        new_rejections=s["local_allow_distributed_deny"],
        backend_errors=s["backend_errors"],
        distributed_attempts=s["distributed_attempts"],
        shadow_dropped=s["shadow_dropped"],
    )
