"""The read models the API and the event stream share: every route with its state and
figures, fleet-wide divergence, the most active keys with both limiters' buckets. Each
takes the parts it reads, nothing more."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from limiter import LocalLimiter, Policy, RedisLimiter
from limiter.errors import BackendError
from limiter.reservations import Book
from limiter.resilience import BreakerState, CircuitBreaker

from ..model.candidate import Candidate, candidate_gate
from ..model.causes import FORWARD, MEANING, REVERSE, Cause, summary
from ..model.rollout import Divergence, Mode, RouteState, evaluate_gate, next_step
from ..model.units import units_view
from ..observe.activity import Activity
from ..observe.views import FleetViews
from ..rollout.adjustments import Adjustments
from ..rollout.manager import RolloutManager
from ..rollout.plans import Plans
from ..store import StoreUnavailable, gate_stats_of, totals_of
from ..store.divergence import CANDIDATE_COUNTS, candidate_stats_of, cause_field
from .deps import ApiError

if TYPE_CHECKING:
    from ..rules import RouteRule, Rules

__all__ = [
    "Buckets", "buckets_view", "candidate_totals", "candidate_view", "causes_view", "divergence_view",
    "key_policies", "limit_view", "route_views",
]  # fmt: skip


async def route_views(
    rules: Rules,
    rollout: RolloutManager,
    activity: Activity,
    views: FleetViews,
    deadlines: dict[str, dict[str, int]] | None = None,
    plans: Plans | None = None,
) -> list[dict[str, Any]]:
    """Every route with its rules, rollout state, live rate, fleet-wide divergence, the
    gate of its next step, this replica's answers given by the failure policy for want
    of time (``deadlines``: :meth:`~control_plane.observe.metrics.Metrics.deadline_counts`),
    its global limit in force against the rules' (``limit``), its candidate limit and, with
    ``plans``, its rollout plan (``plan``, :func:`~.plan_views.plan_summary`)."""
    from .plan_views import plan_summary

    deadlines = deadlines or {}
    adjustments = rollout.adjustments
    out = []
    for name in rules.names():
        rule = rules.get(name)
        assert rule is not None
        st = rollout.state_for(name)
        mode, percent = rollout.effective_mode(name)
        view: dict[str, Any] = {
            "name": name,
            "mode": mode.value,
            "stored_mode": st.mode.value,
            "canary_percent": percent if mode is Mode.CANARY else st.canary_percent,
            "state": st.to_dict(),
            "rule": rule.to_dict(),
            "decisions_per_s": round(activity.rate(name), 2),
            "deadline_answers": deadlines.get(name) or {"redis_timeout": 0, "no_time": 0},
        }
        cached = await views.route(name)
        view.update(_figures(name, st, cached, rollout, views))
        view["figures_age_s"] = views.age_s()
        view["limit"] = limit_view(rule, adjustments)
        view["candidate"] = candidate_view(adjustments.candidates.get(name), cached, rollout)
        view["plan"] = None if plans is None else plan_summary(plans, name, rollout.clock())
        out.append(view)
    return out


def limit_view(rule: RouteRule, adjustments: Adjustments) -> dict[str, Any]:
    """The route's global limit in force and the rules' (they differ after an adjustment,
    a promoted candidate's included: the rules file is never rewritten)."""
    in_force = adjustments.route_policies(rule)[1]
    return {
        "in_force": in_force.to_dict(),
        "rules": rule.distributed.to_dict(),
        "adjusted": in_force != rule.distributed,
        "describe": in_force.describe(),
    }


def candidate_view(
    candidate: Candidate | None, cached: dict[str, Any] | None, rollout: RolloutManager, *, series: bool = False
) -> dict[str, Any] | None:
    """A route's candidate: its limit, its comparisons with the current limit since it was
    set (fleet-wide, from the background views), the gate of its promotion; with
    ``series``, per minute and who it would newly reject."""
    if candidate is None:
        return None
    now = rollout.clock()
    view = candidate.to_dict(now)
    c = (cached or {}).get("candidate")
    if c is None or c.get("id") != candidate.id:
        view.update(totals=None, gate=None)
        if series:
            view.update(series=[], would_be_blocked=[])
        return view
    stats = candidate_stats_of(c["series"])
    view["totals"] = candidate_totals(c["series"], stats)
    view["gate"] = candidate_gate(candidate, stats, rollout.gate_config_for(candidate.route), now=now).to_dict()
    if series:
        view.update(series=c["series"], would_be_blocked=c["top"])
    return view


def candidate_totals(rows: list[dict[str, int]], stats: Any) -> dict[str, Any]:
    s = {n: sum(r.get(n, 0) for r in rows) for n in CANDIDATE_COUNTS}
    return {
        **s,
        "compared": stats.compared,
        "newly_rejected_share": round(stats.new_rejection_rate, 6),
        "newly_admitted_share": round(s["newly_admitted"] / stats.compared, 6) if stats.compared else 0.0,
        "sampled_share": None if stats.sampled_share is None else round(stats.sampled_share, 6),
    }


def _figures(
    name: str, st: RouteState, cached: dict[str, Any] | None, rollout: RolloutManager, views: FleetViews
) -> dict[str, Any]:
    """The last 5 minutes' divergence, the runbook's next step for the route and the gate
    of that step (None when the step is not gated: off -> shadow, or when enforced)."""
    step = next_step(st)
    out: dict[str, Any] = {
        "next_step": None if step is None else {"mode": step[0].value, "canary_percent": step[1]},
        "divergence_5m": None,
        "gate": None,
    }
    if cached is not None:
        out["divergence_5m"] = totals_of(cached["series"][-5:], 5)
    if step is None or step[0] not in (Mode.CANARY, Mode.ENFORCE):
        return out
    target = {"target": step[0].value, "target_percent": step[1]}
    if cached is None:
        reason = f"fleet figures unavailable: {views.error or 'Redis unreachable'}"
        out["gate"] = {**target, "passed": False, "required": True, "reasons": [reason]}
        return out
    # the same whole minutes DivergenceStore.window_stats sums for the real gate
    config = rollout.gate_config_for(name)
    now = rollout.clock()
    window_min = max(1, (int(now // 60) - int((now - config.window_s) // 60)) + 1)
    gate = evaluate_gate(st, step[0], step[1], gate_stats_of(cached["series"][-window_min:]), config, now=now)
    out["gate"] = {**target, **gate.to_dict()}
    return out


async def divergence_view(
    rules: Rules,
    views: FleetViews,
    minutes: int = 60,
    candidates: dict[str, Candidate] | None = None,
    rollout: RolloutManager | None = None,
) -> dict[str, Any]:
    """Fleet-wide divergence per route from the cached views (refreshed every second in
    the background), with each route's candidate against its current limit (``candidate``,
    None without one) when ``candidates`` are given; raises StoreUnavailable when there are
    none yet."""
    routes: dict[str, Any] = {}
    for name in rules.names():
        cached = await views.route(name)
        if cached is None:
            raise StoreUnavailable(views.error or "no divergence figures yet")
        series = cached["series"][-minutes:]
        totals = totals_of(series, minutes)
        rule = rules.get(name)
        routes[name] = {
            "totals": totals,
            "series": series,
            "would_be_blocked": cached["top"],
            "causes": causes_view(totals, explain=rule is not None and rule.explain),
            "units": None if rule is None or rule.budget is None else units_view(totals, rule.cost_unit),
        }
        if candidates is not None and rollout is not None:
            routes[name]["candidate"] = candidate_view(candidates.get(name), cached, rollout, series=True)
    return {"minutes": minutes, "routes": routes, "as_of": views.at, "age_s": views.age_s(), "error": views.error}


def causes_view(totals: dict[str, Any], *, explain: bool) -> dict[str, Any]:
    """Why the divergent decisions of ``totals`` (as :func:`totals_of` sums them) diverged:
    per direction, the count and share of each cause (control_plane/model/causes.py), the
    decisions left without one (``unexplained``: the route's ``explain: false``, in enforce, a
    failed or dropped evaluation) and the shares in words; ``explain``: the route's setting."""
    out: dict[str, Any] = {"explain": explain, "meaning": {c.value: MEANING[c] for c in Cause}}
    for name, div, causes in (
        ("new_rejections", Divergence.LOCAL_ALLOW_DISTRIBUTED_DENY, FORWARD),
        ("reverse", Divergence.LOCAL_DENY_DISTRIBUTED_ALLOW, REVERSE),
    ):
        total = int(totals.get(div.value, 0))
        counts = {c: int(totals.get(cause_field(c), 0)) for c in causes}
        unexplained = max(0, total - sum(counts.values()))
        out[name] = {
            "total": total,
            "by_cause": {c.value: n for c, n in counts.items()},
            "unexplained": unexplained,
            "shares": {c.value: round(n / total, 6) if total else 0.0 for c, n in counts.items()},
            "summary": summary(counts, unexplained),
        }
    return out


def key_policies(activity: Activity, adjustments: Adjustments, rule: RouteRule, key: str) -> tuple[Policy, Policy]:
    """The policies a key was last decided with: the limits service's for keys on routes
    with external limits, else the rules' (with adjustments)."""
    ext = activity.external_policies(rule.name, key)
    return ext if ext is not None else adjustments.policies(rule, key)


class Buckets:
    """What the buckets view reads: the local limiter, Redis (unless the breaker is open)
    and what this replica saw."""

    def __init__(
        self,
        activity: Activity,
        adjustments: Adjustments,
        local: LocalLimiter,
        redis: RedisLimiter,
        breaker: CircuitBreaker,
        *,
        clock_us: Callable[[], int],
    ) -> None:
        self.activity, self.adjustments, self.local, self.redis, self.breaker = (
            activity,
            adjustments,
            local,
            redis,
            breaker,
        )
        self.clock_us = clock_us  # the decisions' clock: a bucket is read at the time its decisions are made

    async def _peek(self, lkey: str, policy: Policy, now_us: int) -> Any:
        if self.breaker.state is BreakerState.OPEN:
            return None
        try:
            return await self.redis.peek(lkey, policy, now_us)
        except BackendError:
            return None

    async def _book(self, lkey: str) -> Book | None:
        if self.breaker.state is BreakerState.OPEN:
            return None
        try:
            return await self.redis.raw_book(lkey)
        except BackendError:
            return None

    async def route(self, rule: RouteRule, limit: int) -> list[dict[str, Any]]:
        """The route's most active keys, each side's bucket (and on a budget route, each side's
        reservations outstanding and debt, in the route's cost unit)."""
        name = rule.name
        hot = self.activity.hot_keys(name, limit)
        pols = [key_policies(self.activity, self.adjustments, rule, k) for k, _ in hot]
        now_us = self.clock_us()
        dists = await asyncio.gather(*[self._peek(f"{name}:{k}", dp, now_us) for (k, _), (_, dp) in zip(hot, pols)])
        books: list[Book | None] = [None] * len(hot)
        if rule.budget is not None:
            books = list(await asyncio.gather(*[self._book(f"{name}:{k}") for k, _ in hot]))
        out = []
        for (key, count), (lp, dp), dv, book in zip(hot, pols, dists, books):
            lv = self.local.peek(f"{name}:{key}", lp, now_us)
            last = self.activity.last_decision(name, key)
            local = {**lv.to_dict(), "burst": lp.limit, "policy": lp.to_dict()}
            dist = None if dv is None else {**dv.to_dict(), "burst": dp.limit, "policy": dp.to_dict()}
            entry = {
                "route": name,
                "key": key,
                "recent_requests": count,
                "local": local,
                "distributed": dist,
                "last_decision": None if not last else {"at": last[0], "allowed": last[1], "enforced_by": last[2]},
            }
            if rule.budget is not None:
                entry["unit"] = rule.cost_unit or "units"
                local.update(_held(self.local.book(f"{name}:{key}"), lv.tokens, now_us))
                if dist is not None:
                    dist.update(_held(book, dv.tokens, now_us))
            out.append(entry)
        return out


def _held(book: Book | None, tokens: float, now_us: int) -> dict[str, Any]:
    """A budget's side of a key: the estimates of its reservations outstanding now (None: the
    book could not be read) and its debt (how far below zero its balance is)."""
    reserved = None
    if book is not None:
        reserved = sum(h.estimate for h in book.held.values() if h.state == "outstanding" and h.until_us > now_us)
    return {"reserved": reserved, "debt": max(0.0, -tokens)}


async def buckets_view(rules: Rules, buckets: Buckets, route: str | None, limit: int) -> dict[str, Any]:
    """The most active keys (of one route, or of all) with both limiters' state."""
    out: list[dict[str, Any]] = []
    for name in [route] if route else rules.names():
        rule = rules.get(name)
        if rule is None:
            raise ApiError(404, "unknown_route", f"no route named {name!r}", field="route")
        out += await buckets.route(rule, limit)
    out.sort(key=lambda b: -b["recent_requests"])
    return {"buckets": out[: limit if route is None else len(out)]}
