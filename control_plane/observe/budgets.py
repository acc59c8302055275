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
rate_limit_divergence_units_total         counter  route, direction, measure: cost (known at the
                                                   decision), estimate (a reservation's, at the
                                                   reserve), actual (a compared reservation's,
                                                   at its settle)
========================================  =======  =================================
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from .families import FastCounter, FastHistogram

__all__ = ["UNIT_MEASURES", "BudgetMetrics"]

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
        self.divergence_units = FastCounter(
            "rate_limit_divergence_units_total",
            "What the compared requests of a budget route cost (its cost_unit), by direction and measure: cost"
            " (known at the decision), estimate (a reservation's, at its reserve), actual (at its settle).",
            ["route", "direction", "measure"], r,
        )  # fmt: skip
