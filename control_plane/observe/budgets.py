"""The budgets' Prometheus metrics (a part of :class:`~.metrics.Metrics`): reservations and their
settles (control_plane/decision/reservations.py), the middleware's metering, Envoy's costs the
answer did not say, and what the divergent requests of a budget route cost.

========================================  =======  =================================
metric                                    type     labels
========================================  =======  =================================
rate_limit_reservations_total             counter  route, result: reserved, refused, full
rate_limit_settles_total                  counter  route, result: settled, again, expired,
                                                   unknown, failed
rate_limit_settle_cost_ratio              hist.    route (actual cost / estimate, first settle)
rate_limit_metered_responses_total        counter  route, result: metered, early, unmetered
rate_limit_envoy_bad_costs_total          counter  route, reason: missing, not_a_number, other,
                                                   too_large
rate_limit_charges_over_budget_total      counter  route, side: local, distributed (a charge or a
                                                   settle above its estimate that did not fit what
                                                   was left: counted all the same, into debt)
rate_limit_refunded_units_total           counter  route (what settles below their estimates gave
                                                   back)
rate_limit_settle_local_total             counter  route, result: settled, again, elsewhere (made
                                                   on another replica: its local side expires there
                                                   as on_expiry says), expired
rate_limit_reservations_outstanding       gauge    route (this replica's local reservations not
                                                   settled nor expired: summed over the replicas,
                                                   the fleet's; OutstandingScan)
rate_limit_reserved_units                 gauge    route (what they hold: their estimates)
rate_limit_debt_units                     gauge    route (how far below zero its keys' local
                                                   balances are now, summed)
rate_limit_divergence_units_total         counter  route, direction, measure: cost (known at the
                                                   decision), estimate (a reservation's, at the
                                                   reserve), actual (a compared reservation's,
                                                   at its settle)
========================================  =======  =================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry

from limiter import LocalLimiter, Policy

from .families import FastCounter, FastGauge, FastHistogram

__all__ = ["UNIT_MEASURES", "BudgetMetrics", "OutstandingScan"]

#: actual cost / estimate: systematically under 1, estimates too high (budget held idle); over 1, too low
_RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
#: rate_limit_divergence_units_total's measures: what a compared request cost, known at its decision
#: (a cost, a charge); a reservation's estimate, at its reserve; its actual cost, at its settle
UNIT_MEASURES = ("cost", "estimate", "actual")


class BudgetMetrics:
    """The budgets' metrics of :class:`~.metrics.Metrics` (see the module docstring)."""

    def _add_budget_metrics(self, r: CollectorRegistry) -> None:
        route_result = ["route", "result"]
        self.reservations = FastCounter(
            "rate_limit_reservations_total",
            "Decisions with an estimate by route and result: reserved, refused (the budget), full (max_reservations).",
            route_result, r,
        )  # fmt: skip
        self.envoy_bad_costs = FastCounter(
            "rate_limit_envoy_bad_costs_total",
            "Envoy descriptors whose cost was not said (missing, not_a_number, other) or past 10^9 (too_large).",
            ["route", "reason"], r,
        )  # fmt: skip
        self.metered = FastCounter(
            "rate_limit_metered_responses_total",
            "Middleware answers on budget routes by how their cost was found: metered, early (what was produced),"
            " unmetered (none found).", route_result, r,
        )  # fmt: skip
        self.settles = FastCounter(
            "rate_limit_settles_total",
            "Settles by route and result: settled, again (the first answer), expired, unknown, failed (Redis down).",
            route_result, r,
        )  # fmt: skip
        ratio = "Each reservation's actual cost over its estimate at its first settle."
        self.cost_ratio = FastHistogram("rate_limit_settle_cost_ratio", ratio, ["route"], r, _RATIO_BUCKETS)
        self.over_budget = FastCounter(
            "rate_limit_charges_over_budget_total",
            "Charges on budget routes (and settles above their estimates) that did not fit what was left, counted"
            " all the same (into debt), by the side whose answer counted.", ["route", "side"], r,
        )  # fmt: skip
        self.refunded = FastCounter(
            "rate_limit_refunded_units_total", "What settles below their estimates gave back (cost_unit).",
            ["route"], r,
        )  # fmt: skip
        self.settle_local = FastCounter(
            "rate_limit_settle_local_total",
            "Each settle's local side: settled, again, elsewhere (the reservation was made on another replica:"
            " its local side there expires as the route's on_expiry says), expired.",
            route_result, r,
        )  # fmt: skip
        self.outstanding = FastGauge(
            "rate_limit_reservations_outstanding",
            "This replica's local reservations neither settled nor expired (summed over the replicas: the fleet's).",
            ["route"], r,
        )  # fmt: skip
        self.reserved_units = FastGauge(
            "rate_limit_reserved_units", "What this replica's outstanding reservations hold: their estimates.",
            ["route"], r,
        )  # fmt: skip
        self.debt_units = FastGauge(
            "rate_limit_debt_units", "How far below zero this replica's keys' balances are now, summed (cost_unit).",
            ["route"], r,
        )  # fmt: skip
        self.divergence_units = FastCounter(
            "rate_limit_divergence_units_total",
            "What the compared requests of a budget route cost (its cost_unit), by direction and measure: cost"
            " (known at the decision), estimate (a reservation's, at its reserve), actual (at its settle).",
            ["route", "direction", "measure"], r,
        )  # fmt: skip


class OutstandingScan:
    """Per budget route, what this replica's local limiter holds: its reservations outstanding
    (count and units) and its keys' debt (how far below zero their balances are now), for the
    gauges. A whole scan of every book and key on every flush would cost the event loop what
    they hold (up to ``max_reservations`` records a key), so each :meth:`step` reads keys until
    about ``per_step`` records, continuing where the last one stopped, and the gauges take a
    pass's sums when it ends (a few seconds behind, at most). While no route has a budget,
    nothing is listed or read. A key's debt is read under the route's local policy (a key with a
    limits service's or an override's own reads as the route's)."""

    def __init__(self, local: LocalLimiter, metrics: BudgetMetrics, *, per_step: int = 20_000) -> None:
        self.local = local
        self.metrics = metrics
        self.per_step = per_step
        self.passes = 0
        self._keys: list[str] = []
        self._at = 0
        self._sums: dict[str, list[float]] = {}

    def step(self, now_us: int, routes: Callable[[], Mapping[str, Policy]]) -> None:
        """Read the next slice of keys; at the end of a pass, set every budget route's gauges
        (``routes``: each one's local policy; a route holding nothing, 0)."""
        policies = routes()
        if self._at >= len(self._keys):
            if not policies:  # no budget: nothing to list, nothing to set
                return
            prefixes = tuple(f"{r}:" for r in policies)
            keys = {*self.local.booked_keys(), *(k for k in self.local.keys() if k.startswith(prefixes))}
            self._keys, self._at, self._sums = sorted(keys), 0, {}
        records = 0
        while self._at < len(self._keys) and records < self.per_step:
            key = self._keys[self._at]
            self._at += 1
            route = key.split(":", 1)[0]
            policy = policies.get(route)
            if policy is None:
                records += 1
                continue
            held = self.local.book(key).held
            records += len(held) + 1
            sums = self._sums.setdefault(route, [0, 0, 0.0])
            for h in held.values():
                if h.state == "outstanding" and h.until_us > now_us:
                    sums[0] += 1
                    sums[1] += h.estimate
            tokens = self.local.peek(key, policy, now_us).tokens
            if tokens < 0:
                sums[2] += -tokens
        if self._at >= len(self._keys):
            self.passes += 1
            m = self.metrics
            for route in policies:
                count, units, debt = self._sums.get(route, (0, 0, 0.0))
                m.outstanding.labels(route).set(count)
                m.reserved_units.labels(route).set(units)
                m.debt_units.labels(route).set(debt)
