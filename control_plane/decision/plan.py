"""The per-route plan: what is the same for every request of a route until its rules,
mode or adjustments change -- the policies, the path (which limiter counts), the cached
parts of the headers, the metric increments waiting to be applied -- and the one place
that says what a request of that route needs beyond it (overrides, per-key adjustments,
external limits, lists, an unusual cost).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from limiter import Decision, Policy
from limiter.policy import MAX_COST, Charge, takes_charges, validate_charge, validate_cost
from limiter.resilience import FailurePolicy

from ..model.candidate import candidate_key_prefix
from ..model.rollout import Divergence, Mode
from ..observe.metrics import Metrics
from .enforce import Path, path_for, route_path
from .headers import HeaderStyle, PolicyHeaders, rate_limit_headers
from .types import DecideResult, InvalidCost

if TYPE_CHECKING:
    from ..external import ExternalLimits, Resolution
    from ..rollout.adjustments import Adjustments
    from ..rules import RouteRule
    from .compare import Comparisons

__all__ = ["ItemPolicies", "RoutePlan", "check_cost"]

_new = object.__new__

#: what one request is decided with: (local policy, distributed policy, bucket key,
#: failure policy, failure code)
ItemPolicies = tuple[Policy, Policy, str, FailurePolicy | None, int | None]


def check_cost(local: Policy, dist: Policy, cost: object, path: Path = Path.LOCAL) -> int:
    """A whole number from 1 to both policies' limits (:class:`~.types.InvalidCost`, carrying
    the request's ``path``, otherwise), or 0: a look at the key without spending anything
    (Envoy's ``hits_addend`` of 0; the HTTP API refuses it at its edge)."""
    if cost == 0 and cost.__class__ is int:
        return 0
    try:
        c = validate_cost(local, cost)
        if c.__class__ is Charge:  # any size fits both; the algorithms must take charges
            validate_charge(dist, c)
        elif not dist.unlimited and c > dist.limit:
            validate_cost(dist, c)
    except ValueError as exc:
        message = str(exc)
        raise InvalidCost(message.removeprefix("cost: "), path) from None
    return c


class RoutePlan:
    """One route's plan (see the module docstring) and its pending metric increments.

    Counters, each ``[denied, allowed]`` (indexed by the decision's ``allowed``): ``req`` =
    rate_limit_requests_total{local}, ``fin`` = decisions enforced by the local answer,
    ``dreq`` = distributed answers; ``div`` = divergence per class,
    ``dropped`` = shadow evaluations dropped, ``remaining`` = the last value for
    rate_limit_tokens_remaining{route}. They are applied by :meth:`flush`, which the
    decider calls before every await, so nothing can observe them pending.
    """

    __slots__ = (
        "rule", "name", "prefix", "mode", "mode_value", "percent", "path", "lp", "dp", "simple", "lists",
        "failure", "cost_max", "charge_max", "units", "adjust", "stamp", "l_shadow", "cand", "cand_dropped", "explain",
        "req", "fin", "dreq", "div", "remaining", "dropped",
        "style", "l_hdr", "d_hdr",
        "_children_of", "_local_children", "_gauge", "_gauge_of",
    )  # fmt: skip

    def __init__(
        self,
        rule: RouteRule,
        mode: Mode,
        percent: int,
        adjust: Adjustments,
        stamp: tuple[int, int],
        style: HeaderStyle = HeaderStyle(),
    ) -> None:
        self.rule = rule
        self.name = rule.name
        self.prefix = f"{rule.name}:"
        self.mode = mode
        self.mode_value = mode.value
        self.percent = percent
        self.path = route_path(mode)
        self.adjust = adjust
        self.stamp = stamp
        lp, dp = adjust.route_policies(rule)
        self.lp, self.dp = lp, dp
        self.l_shadow = None if mode is Mode.OFF else dp
        # the route's candidate limit, compared on the shadow pipeline: (its keys' prefix,
        # policy, id, the largest cost it can admit); None without one, or in off
        c = adjust.candidates.get(rule.name) if adjust.candidates else None
        self.cand: tuple[str, Policy, str, float] | None = None
        if c is not None and mode is not Mode.OFF:
            self.cand = (candidate_key_prefix(c.id), c.policy, c.id, math.inf if c.policy.unlimited else c.policy.limit)
        self.cand_dropped = 0
        # divergence explained by cause (the local policy evaluated fleet-wide as a reference,
        # on the shadow pipeline): in shadow and canary, where the old limit still counts
        self.explain = rule.explain and mode in (Mode.SHADOW, Mode.CANARY)
        # a route with a budget: what each compared request cost is counted with its comparison
        self.units = rule.budget is not None
        # requests that need nothing beyond the route's own policies
        self.simple = (
            rule.external is None
            and not rule.api_key_overrides
            and not rule.tenant_overrides
            and not adjust.has_key_adjustments(rule.name)
        )
        self.lists = bool(rule.deny) or bool(rule.allow)
        self.failure = (rule.failure_policy, rule.failure_code)
        # check_cost(lp, dp, cost) passes for an int 1 <= cost <= cost_max
        self.cost_max = min(math.inf if lp.unlimited else lp.limit, math.inf if dp.unlimited else dp.limit)
        # ... and for a Charge within +-charge_max (-1: never, a policy that takes no charge)
        self.charge_max = MAX_COST if takes_charges(lp) and takes_charges(dp) else -1
        self.req = [0, 0]
        self.fin = [0, 0]
        self.dreq = [0, 0]
        self.dropped = 0
        self.div: dict[Divergence, int] = {}
        self.remaining: int | None = None
        self.style = style
        self.l_hdr: PolicyHeaders | None = None
        self.d_hdr: PolicyHeaders | None = None
        self._children_of: Metrics | None = None
        self._local_children: tuple[Any, Any] = (None, None)
        self._gauge: Any = None
        self._gauge_of: Metrics | None = None

    # -- what a request needs ------------------------------------------------------------

    def policies(self, key: str, ext: ExternalLimits | None) -> ItemPolicies:
        """The policies, bucket key and failure handling of a request that is not simple:
        the limits service's answer replaces the rules' policies (in both limiters), its
        ``tenant_key`` the bucket key and its failure policy/code the route's; then the
        rules' overrides and the runtime adjustments apply."""
        fp, fc = self.failure
        if ext is None:
            lp, dp = self.adjust.policies(self.rule, key)
            return lp, dp, key, fp, fc
        bkey = ext.bucket_key(key)
        lp, dp = self.adjust.policies(self.rule, bkey, (ext.policy, ext.policy))
        return lp, dp, bkey, ext.failure_policy or fp, ext.failure_code or fc

    def path_of(self, key: str) -> Path:
        path = self.path
        return path if path is not None else path_for(self.mode, self.percent, self.name, key)

    # -- answers -------------------------------------------------------------------------

    def answer(
        self,
        *,
        enforced: Decision,
        enforced_by: str,
        status: int,
        key: str,
        request_id: str,
        path: Path,
        local: Decision,
        policy: Policy,
        now_s: float,
        headers: bool,
        dist: Decision | None = None,
        div: Divergence | None = None,
        shadow: Policy | None = None,
        list_match: str | None = None,
        backend_error: str | None = None,
        res: Resolution | None = None,
    ) -> DecideResult:
        """The :class:`DecideResult` of a request whose answer is ``enforced`` (the status
        ``status`` when it rejects), with the rate-limit headers of ``enforced`` under
        ``policy`` (announcing ``shadow``) when ``headers`` is asked for, from cached parts
        when these are the route's own policies; ``res`` is the external limits' resolution."""
        # a new object and DecideResult's own __init__: calling the class with keywords would
        # first pack them into a dict for __init__ (twice the cost, on every answer)
        result = _new(DecideResult)
        DecideResult.__init__(
            result,
            route=self.name,
            mode=self.mode_value,
            canary_percent=self.percent,
            key=key,
            request_id=request_id,
            path=path,
            enforced=enforced,
            enforced_by=enforced_by,
            status_code=200 if enforced.allowed else status,
            local=local,
            headers=self._headers(enforced, policy, shadow, now_s) if headers else {},
        )
        # what most answers do not have, set only when there is one (each keyword passed costs)
        if dist is not None:
            result.distributed = dist
            result.divergence = div
        if list_match is not None:
            result.list_match = list_match
        if backend_error is not None:
            result.backend_error = backend_error
        if res is not None:
            result.limits_source = res.source
            result.backend_url = res.limits.backend_url if res.limits is not None else None
        return result

    def _headers(self, enforced: Decision, policy: Policy, shadow: Policy | None, now_s: float) -> dict[str, str]:
        limit = enforced.limit
        if policy is self.lp and shadow is self.l_shadow:
            h = self.l_hdr
            if h is None or h.limit != limit:
                h = self.l_hdr = PolicyHeaders(self.name, limit, policy, shadow, self.style)
            return h.render(enforced, now_s)
        if policy is self.dp and shadow is None:
            h = self.d_hdr
            if h is None or h.limit != limit:
                h = self.d_hdr = PolicyHeaders(self.name, limit, policy, None, self.style)
            return h.render(enforced, now_s)
        return rate_limit_headers(self.name, enforced, policy, shadow_policy=shadow, now_s=now_s, style=self.style)

    # -- metrics -------------------------------------------------------------------------

    def count_distributed(self, d: Decision, div: Divergence) -> None:
        self.div[div] = self.div.get(div, 0) + 1
        self.dreq[d.allowed] += 1
        self.remaining = d.remaining

    def flush(self, m: Metrics, comparisons: Comparisons) -> None:
        """Apply the pending increments."""
        name, mode = self.name, self.mode_value
        if self.dropped:
            comparisons.shadow_dropped(name, self.dropped)
            self.dropped = 0
        if self.cand_dropped:
            n, self.cand_dropped = self.cand_dropped, 0
            if self.cand is not None:
                comparisons.candidate_dropped(name, self.cand[2], n)
        req, fin = self.req, self.fin
        if req[1] or fin[1]:  # the usual case: allowed by the local answer
            c = self._local_children if self._children_of is m else self._resolve_children(m)
            c[0].value += req[1]
            c[1].value += fin[1]
            req[1] = fin[1] = 0
        if req[0]:
            m.child(m.requests, "local", "denied").inc(req[0])
            req[0] = 0
        if fin[0]:
            n, fin[0] = fin[0], 0
            m.child(m.rejections, "local_exhausted").inc(n)
            m.child(m.exceeded, "local").inc(n)
            m.child(m.decisions, name, mode, "local", "false").inc(n)
        if self.div:
            for div, n in self.div.items():
                m.child(m.divergence, name, div.value).inc(n)
            self.div.clear()
        dreq = self.dreq
        if dreq[0] or dreq[1]:
            self._flush_distributed(m, name, mode)
        if self.remaining is not None:
            g = self._gauge if self._gauge_of is m else self._resolve_gauge(m)
            g.value = self.remaining
            self.remaining = None

    def _resolve_gauge(self, m: Metrics) -> Any:
        """rate_limit_tokens_remaining{route}, looked up once per plan and registry (when
        first set: a route that never counted a bucket has no such series)."""
        self._gauge = m.child(m.tokens_remaining, "route", self.name)
        self._gauge_of = m
        return self._gauge

    def _resolve_children(self, m: Metrics) -> tuple[Any, Any]:
        """The counters of an allowed local answer, looked up once per plan and registry."""
        self._local_children = (
            m.child(m.requests, "local", "allowed"),
            m.child(m.decisions, self.name, self.mode_value, "local", "true"),
        )
        self._children_of = m
        return self._local_children

    def _flush_distributed(self, m: Metrics, name: str, mode: str) -> None:
        dreq = self.dreq
        if dreq[1]:
            n, dreq[1] = dreq[1], 0
            m.child(m.requests, "distributed", "allowed").inc(n)
            m.child(m.decisions, name, mode, "distributed", "true").inc(n)
        if dreq[0]:
            n, dreq[0] = dreq[0], 0
            m.child(m.requests, "distributed", "denied").inc(n)
            m.child(m.rejections, "distributed_exhausted").inc(n)
            m.child(m.exceeded, "distributed").inc(n)
            m.child(m.decisions, name, mode, "distributed", "false").inc(n)
