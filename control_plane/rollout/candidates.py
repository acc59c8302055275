"""Changing a limit the way it was migrated: a candidate limit in shadow beside the enforced
one (:mod:`control_plane.model.candidate`), then promoted behind a gate, or dropped.

:class:`Candidates` sets, drops and promotes a route's candidate, fleet-wide and audited
(kind ``candidate``). The candidate is kept in the runtime adjustments hash, so every
replica reads it with its adjustments (:attr:`Adjustments.candidates`: the decision plans
follow it) and the store restores it after Redis lost its data. Promoting makes the
candidate the route's distributed limit as a runtime adjustment (audited as one, kept
across restarts; the rules file is not rewritten). A candidate survives a rules reload that
keeps its route, and is dropped, audited, when the route disappears.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from limiter import Policy
from limiter.errors import BackendError
from limiter.policy import NO_LOG_CHARGE, takes_charges

from ..decision.types import UnknownRoute
from ..model.candidate import Candidate, candidate_field, candidate_gate
from ..model.rollout import AuditEntry, GateConfig, GateResult, GateStats, Mode
from ..store import RolloutStore, StoreUnavailable
from ..store.divergence import DivergenceStore, candidate_stats_of
from .adjustments import Adjustments, unavailable

if TYPE_CHECKING:
    from ..rules import Rules

__all__ = ["CandidateRefused", "Candidates", "NoCandidate"]

log = logging.getLogger("shadowlimit.engine")


class CandidateRefused(ValueError):
    """A candidate that cannot be set; ``field`` names what is wrong (a 422)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NoCandidate(LookupError):
    """The route has no candidate (a 404)."""

    def __init__(self, route: str) -> None:
        super().__init__(f"route {route!r} has no candidate limit")
        self.route = route


class Candidates:
    """Set, drop and promote candidate limits (see the module docstring)."""

    def __init__(
        self,
        client: Any,
        store: RolloutStore,
        adjustments: Adjustments,
        divergence: DivergenceStore,
        rules: Callable[[], Rules],
        modes: Any,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.store = store
        self.adjustments = adjustments
        self.divergence = divergence
        self._rules = rules
        self.modes = modes  # effective_mode(route) -> (Mode, percent); gate_config_for(route)
        self.clock = clock

    def get(self, route: str) -> Candidate | None:
        return self.adjustments.candidates.get(route)

    # -- figures -------------------------------------------------------------------------

    async def series(self, candidate: Candidate) -> list[dict[str, int]]:
        """Its comparisons per minute since it was set (fleet-wide)."""
        return await self.divergence.candidate_series(candidate.route, candidate.id, candidate.since)

    async def stats(self, candidate: Candidate) -> GateStats:
        return candidate_stats_of(await self.series(candidate))

    async def gate(self, candidate: Candidate) -> GateResult:
        config: GateConfig = self.modes.gate_config_for(candidate.route)
        return candidate_gate(candidate, await self.stats(candidate), config, now=self.clock())

    # -- changing ------------------------------------------------------------------------

    async def set(self, route: str, policy: Policy, *, reason: str, actor: str) -> tuple[Candidate, AuditEntry]:
        """Set (or replace) ``route``'s candidate: raises :class:`UnknownRoute`,
        :class:`CandidateRefused` (a route in ``off``, a limit equal to the current one) or
        :class:`StoreUnavailable`."""
        rule = self._rules().get(route)
        if rule is None:
            raise UnknownRoute(route)
        mode, _ = self.modes.effective_mode(route)
        if mode is Mode.OFF:
            raise CandidateRefused(
                "route", f"{route} is off: a candidate is compared with the route's global limit, which off never asks"
            )
        current = self.adjustments.route_policies(rule)[1]
        if policy == current:
            raise CandidateRefused("limit", f"equal to the route's current limit ({current.describe()})")
        if policy.blocked or policy.unlimited:
            raise CandidateRefused("limit", "a candidate must be a limit (not unlimited, not a ban)")
        if rule.budget is not None and not takes_charges(policy):
            raise CandidateRefused("algorithm", f"{route} is a budget: {NO_LOG_CHARGE.removeprefix('algorithm: ')}")
        candidate = Candidate(route, policy, reason, actor, since=self.clock())
        replaced = self.get(route)
        detail = f"candidate {policy.describe()}" + (f" (replaces {replaced.policy.describe()})" if replaced else "")
        entry = await self._changed(route, candidate.to_json(), detail, reason, actor)
        assert entry is not None  # a write is always audited
        return candidate, entry

    async def drop(self, route: str, *, reason: str, actor: str) -> AuditEntry:
        """Drop ``route``'s candidate (:class:`NoCandidate` when it has none)."""
        candidate = self.get(route)
        if candidate is None:
            raise NoCandidate(route)
        entry = await self._changed(route, None, f"dropped candidate {candidate.policy.describe()}", reason, actor)
        if entry is None:
            raise NoCandidate(route)  # another replica dropped it meanwhile
        return entry

    async def promote(
        self, route: str, *, reason: str, actor: str, force: bool = False
    ) -> tuple[AuditEntry, AuditEntry, GateResult]:
        """Make ``route``'s candidate its distributed limit (a runtime adjustment, audited),
        behind the gate (``force`` passes it, said in the audit entry); raises
        :class:`NoCandidate`, :class:`~control_plane.rollout.manager.GateRefused` or
        :class:`StoreUnavailable`. Returns the adjustment's and the candidate's audit
        entries and the gate."""
        from .manager import GateRefused

        candidate = self.get(route)
        if candidate is None:
            raise NoCandidate(route)
        try:
            gate = await self.gate(candidate)
        except BackendError as exc:
            raise StoreUnavailable(str(exc)) from exc
        if not gate.passed and not force:
            raise GateRefused(gate)
        adjusted = await self.adjustments.adjust(
            route, None, "distributed", candidate.policy, reason=f"promoted candidate: {reason}", actor=actor
        )
        forced = force and not gate.passed
        entry = await self._changed(
            route, None, f"promoted candidate {candidate.policy.describe()}", reason, actor, gate=gate, forced=forced
        )
        if entry is None:  # dropped meanwhile by another replica: the promotion stands, say so
            entry = adjusted
        return adjusted, entry, gate

    async def rules_changed(self, rules: Rules) -> list[str]:
        """Drop (audited once, by the replica that removes it) the candidates of routes no
        longer in ``rules``; returns those routes."""
        gone = [route for route in self.adjustments.candidates if rules.get(route) is None]
        for route in gone:
            try:
                await self._changed(
                    route, None, "dropped candidate", "its route is no longer in the rules", "rules", automatic=True
                )
            except StoreUnavailable as exc:
                log.warning("could not drop the candidate of %s (its route left the rules): %s", route, exc)
        return gone

    async def _changed(
        self, route: str, value: str | None, detail: str, reason: str, actor: str, *,
        gate: GateResult | None = None, forced: bool = False, automatic: bool = False,
    ) -> AuditEntry | None:  # fmt: skip
        """Write (``value``) or remove the candidate's field, audit it (a removal only when
        this call removed it) and read the adjustments again."""
        field = candidate_field(route)
        try:
            if value is None:
                if not await self.client.hdel(self.store.adjust_key, field):
                    await self.adjustments.load()
                    return None
            else:
                await self.client.hset(self.store.adjust_key, field, value)
            entry = AuditEntry(
                route=route, actor=actor, from_mode="", to_mode=detail, reason=reason, at=self.clock(),
                kind="candidate", forced=forced, automatic=automatic, gate=None if gate is None else gate.to_dict(),
            )  # fmt: skip
            entry = await self.store.append_audit(entry)
            await self.adjustments.load()
        except Exception as exc:  # noqa: BLE001 - Redis's errors, translated; the rest re-raised
            raise unavailable(exc) from exc
        return entry
