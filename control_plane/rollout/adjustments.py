"""Runtime adjustments (the admin API's ``adjust``, ``PUT /ratelimit/config``): a route's or
one key's limit changed at run time, fleet-wide, audited. Stored in ``rl:{ns}:adjust`` (field ``<route>`` or
``<route>\\x00<key>``, value ``{"local": {...}, "distributed": {...}}``); each replica
keeps the parsed policies and re-reads them with every rollout resync (through the
state memory, so a store that lost its data never takes them away). The routes' candidate
limits live in the same hash (:func:`~control_plane.model.candidate.candidate_field`), read
here with the adjustments (:attr:`Adjustments.candidates`) and changed by
:class:`~control_plane.rollout.candidates.Candidates`."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from limiter import Policy
from limiter.errors import BackendError

from ..decision.types import UnknownRoute
from ..model.candidate import Candidate, route_of_field
from ..model.recovery import StateMemory
from ..model.rollout import AuditEntry
from ..store import RolloutStore, StoreUnavailable

if TYPE_CHECKING:
    from ..rules import RouteRule, Rules

__all__ = ["Adjustments", "unavailable"]

log = logging.getLogger("shadowlimit.engine")


def unavailable(exc: Exception) -> Exception:
    """A failure of Redis (the connection, a reply, redis-py's own errors) as
    :class:`StoreUnavailable`; anything else as it is."""
    if isinstance(exc, (OSError, BackendError, StoreUnavailable, ConnectionError)) or type(exc).__module__.startswith(
        "redis"
    ):
        return exc if isinstance(exc, StoreUnavailable) else StoreUnavailable(str(exc))
    return exc


class Adjustments:
    """The runtime adjustments in force on this replica, and the way to change them."""

    def __init__(
        self,
        client: Any,
        store: RolloutStore,
        memory: StateMemory,
        rules: Callable[[], Rules],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.clock = clock  # wall-clock seconds: the adjustments' audit entries
        self.store = store
        self.memory = memory
        self._rules = rules
        self.by_field: dict[str, dict[str, Policy]] = {}
        #: the candidate limits in force, by route (see :mod:`control_plane.model.candidate`)
        self.candidates: dict[str, Candidate] = {}
        self._key_routes: frozenset[str] = frozenset()
        #: grows with every change of the adjustments in force (decision plans follow it)
        self.generation = 0

    # -- reading -------------------------------------------------------------------------

    def policies(self, rule: RouteRule, key: str, base: tuple[Policy, Policy] | None = None) -> tuple[Policy, Policy]:
        """The (local, distributed) policies for a key: the rules (or ``base``, the limits
        service's answer), then the key's adjustment, else the route's."""
        local, dist = base if base is not None else rule.policies_for(key)
        if self.by_field:
            for k in (f"{rule.name}\x00{key}", rule.name):
                adj = self.by_field.get(k)
                if adj is not None:
                    return adj.get("local", local), adj.get("distributed", dist)
        return local, dist

    def rule(self, route: str) -> RouteRule | None:
        """The route of that name in the rules in force."""
        return self._rules().get(route)

    def route_policies(self, rule: RouteRule) -> tuple[Policy, Policy]:
        """A route's own policies with its route-wide adjustment."""
        adj = self.by_field.get(rule.name)
        if adj is None:
            return rule.local, rule.distributed
        return adj.get("local", rule.local), adj.get("distributed", rule.distributed)

    def has_key_adjustments(self, route: str) -> bool:
        return route in self._key_routes

    def listing(self) -> list[dict[str, Any]]:
        out = []
        for k, v in self.by_field.items():
            route, _, key = k.partition("\x00")
            out.append({"route": route, "key": key or None, **{t: p.to_dict() for t, p in v.items()}})
        return out

    # -- loading -------------------------------------------------------------------------

    def apply(self) -> None:
        """Parse the remembered adjustments (the hash's raw fields) into policies."""
        parsed: dict[str, dict[str, Policy]] = {}
        candidates: dict[str, Candidate] = {}
        for k, v in self.memory.adjustments.items():
            route = route_of_field(k)
            if route is not None:  # a candidate limit (rollout/candidates.py), kept in the same hash
                try:
                    candidates[route] = Candidate.from_json(route, v)
                except ValueError as exc:
                    log.warning("ignoring bad candidate of %r: %s", route, exc)
                continue
            try:
                d = json.loads(v)
                parsed[k] = {t: Policy(**p) for t, p in d.items() if t in ("local", "distributed")}
            except (ValueError, TypeError, AttributeError) as exc:
                log.warning("ignoring bad adjustment %r: %s", k, exc)
        if parsed != self.by_field or candidates != self.candidates:
            self.by_field = parsed
            self.candidates = candidates
            self._key_routes = frozenset(k.partition("\x00")[0] for k in parsed if "\x00" in k)
            self.generation += 1

    async def load(self) -> None:
        raw = await self.client.hgetall(self.store.adjust_key)
        self.memory.adjustments = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in (raw or {}).items()
        }
        self.apply()

    # -- changing ------------------------------------------------------------------------

    async def adjust(
        self, route: str, key: str | None, target: str, policy: Policy | None, *, reason: str, actor: str
    ) -> AuditEntry:
        """Set (or clear, with ``policy=None``) a runtime limit for a route or one key,
        fleet-wide and audited. Raises :class:`UnknownRoute` or :class:`StoreUnavailable`."""
        if self._rules().get(route) is None:
            raise UnknownRoute(route)
        try:
            await self._write(route, key, target, policy)
            entry = AuditEntry(
                route=route,
                actor=actor,
                from_mode="",
                to_mode="cleared" if policy is None else policy.describe(),
                reason=reason + (f" (key {key}, {target})" if key else f" ({target})"),
                at=self.clock(),
                kind="config_change",
            )
            entry = await self.store.append_audit(entry)
            await self.load()
        except Exception as exc:  # noqa: BLE001 - Redis's errors, translated; the rest re-raised
            raise unavailable(exc) from exc
        return entry

    async def _write(self, route: str, key: str | None, target: str, policy: Policy | None) -> None:
        field = route if key is None else f"{route}\x00{key}"
        if policy is None:
            await self.client.hdel(self.store.adjust_key, field)
            return
        cur = json.loads(await self.client.hget(self.store.adjust_key, field) or "{}")
        for t in ("local", "distributed") if target == "both" else (target,):
            cur[t] = policy.to_dict()
        await self.client.hset(self.store.adjust_key, field, json.dumps(cur))
