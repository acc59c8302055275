"""Where comparisons are counted: every pair of decisions (and every distributed call that
failed, and every shadow evaluation dropped, and every divergence's cause) goes to the
fleet-wide divergence counters, the Prometheus counters and, for the requests enforcement
would newly reject, the "who would be blocked" view. Used by the decider (pairs decided on the request path) and the
shadow pipeline (pairs evaluated later), so both count the same way."""

from __future__ import annotations

from ..model.candidate import CandidateDirection
from ..model.causes import Cause, direction_of
from ..model.rollout import Divergence
from ..observe.hitters import WouldBeBlocked
from ..observe.metrics import Metrics
from ..store import DivergenceStore

__all__ = ["Comparisons"]

_LADD = Divergence.LOCAL_ALLOW_DISTRIBUTED_DENY
_ORDER = (Divergence.AGREE, _LADD, Divergence.LOCAL_DENY_DISTRIBUTED_ALLOW)
_AGREE, _REJECTED, _ADMITTED = CandidateDirection.ALL


class Comparisons:
    """Counts comparisons in this replica's divergence deltas and metrics."""

    def __init__(self, divergence: DivergenceStore, blocked: WouldBeBlocked, metrics: Metrics) -> None:
        self.divergence = divergence
        self.blocked = blocked
        self.metrics = metrics
        self.evaluated = 0  # shadow evaluations compared
        self.dropped = 0  # shadow evaluations dropped (queue full)

    def pair(
        self, route: str, key: str, div: Divergence, request_id: str, units: int | None = None, measure: str = "cost"
    ) -> None:
        """One pair compared on the request path (its Prometheus count is the caller's); on a
        budget route, what the request cost (``units``: its cost, or a reservation's estimate,
        ``measure`` ``estimate``)."""
        self.divergence.record(route, div, distributed_attempt=True)
        if units is not None:
            self.units(route, div, units, measure)
        if div is _LADD:
            self.blocked.record(route, key, request_id, units=units)

    def units(self, route: str, div: Divergence, units: int, measure: str = "cost") -> None:
        """What compared requests of one class cost, counted (``measure``: ``cost`` known at
        the decision, or ``estimate``, a reservation's, corrected at its settle)."""
        self.divergence.add_units(route, div, units, estimated=units if measure == "estimate" else 0)
        if units > 0:
            m = self.metrics
            m.child(m.divergence_units, route, div.value, measure).inc(units)

    def over_budget(self, route: str, side: str) -> None:
        """A charge on a budget route that did not fit what was left (counted all the same: the
        key goes into debt), by the side whose answer counted (``local``, ``distributed``)."""
        m = self.metrics
        m.child(m.over_budget, route, side).inc()

    def settled(self, route: str, div: Divergence, estimate: int, actual: int, made_s: float) -> None:
        """A compared reservation settled: its units in the minute it was made go from its
        estimate to its ``actual`` cost (the who-would-be-blocked view keeps the estimate)."""
        self.divergence.add_units(route, div, actual - estimate, estimated=-estimate, now=made_s)
        if actual > 0:
            m = self.metrics
            m.child(m.divergence_units, route, div.value, "actual").inc(actual)

    def backend_error(self, route: str) -> None:
        """A distributed call on the request path failed (nothing to compare)."""
        self.divergence.record(route, None, backend_error=True, distributed_attempt=True)
        self.metrics.backend_errors.inc()

    def evaluated_batch(
        self, route: str, agree: int, ladd: int, ldda: int, errors: int, units: list[int] | None = None
    ) -> None:
        """Shadow evaluations of one route, counted at once (their would-be-blocked keys
        are recorded by the caller, one by one); on a budget route, ``units``: what the
        agreeing, ladd and ldda requests cost."""
        m = self.metrics
        self.divergence.add(route, agree=agree, ladd=ladd, ldda=ldda, backend_errors=errors)
        self.evaluated += agree + ladd + ldda
        for div, n in ((Divergence.AGREE, agree), (_LADD, ladd), (Divergence.LOCAL_DENY_DISTRIBUTED_ALLOW, ldda)):
            if n:
                m.child(m.divergence, route, div.value).inc(n)
        if units is not None:
            for div, n in zip(_ORDER, units, strict=True):
                if n:
                    self.units(route, div, n)
        if errors:
            m.backend_errors.inc(errors)

    def causes_batch(self, route: str, counts: dict[Cause, int]) -> None:
        """Divergent decisions of one route explained by cause (control_plane/model/causes.py),
        counted at once (their keys' causes are recorded by the caller, one by one)."""
        self.divergence.add_causes(route, counts)
        m = self.metrics
        for cause, n in counts.items():
            m.child(m.divergence_cause, route, direction_of(cause).value, cause.value).inc(n)

    def candidate_batch(self, route: str, cid: str, agree: int, rejected: int, admitted: int, errors: int) -> None:
        """Comparisons of a route's candidate limit ``cid`` with its current limit, counted
        at once (their newly rejected keys are recorded by the caller, one by one)."""
        self.divergence.add_candidate(
            route, cid, agree=agree, newly_rejected=rejected, newly_admitted=admitted, errors=errors
        )
        m = self.metrics
        for direction, n in ((_AGREE, agree), (_REJECTED, rejected), (_ADMITTED, admitted)):
            if n:
                m.child(m.candidate_divergence, route, direction).inc(n)
        if errors:
            m.backend_errors.inc(errors)

    def candidate_dropped(self, route: str, cid: str, n: int) -> None:
        """``n`` evaluations of a route's candidate dropped (the shadow queue was full)."""
        self.divergence.add_candidate(route, cid, dropped=n)

    def shadow_dropped(self, route: str, n: int) -> None:
        """``n`` shadow evaluations of ``route`` dropped: the figures become a sample."""
        self.dropped += n
        self.metrics.child(self.metrics.shadow_dropped, route).inc(n)
        self.divergence.add(route, dropped=n)
