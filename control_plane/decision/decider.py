"""The one decision path: :meth:`Decider.decide_many` decides a batch, :meth:`Decider.decide`
is that path with one item.

Every request goes through the same steps, with one timestamp from the injected clock:

1. **resolve** the route (named, or matched by method and path) and the key (given, or
   extracted by the route's key strategy); bad ones are errors in place;
2. **external limits**: on a route with an ``external`` block, the key's limits are
   looked up (concurrently for the batch) and replace the route's policies;
3. **local**: the route's plan (:class:`~.plan.RoutePlan`) gives the policies; the cost is
   checked; a deny/allow-listed client is answered at once (403/200); the local limiter
   decides; the path (:mod:`.enforce`) says what counts: the local answer (off), the
   local answer with the distributed one evaluated later (shadow, and the keys outside a
   canary's share: queued on the shadow pipeline), or the distributed answer;
4. **distributed**: every request whose distributed answer counts goes to Redis in one
   pipelined burst; each pair is compared and counted; a failed call is answered by the
   failure policy;
5. **enforce**: the answer that counts gives the status and the headers.

Metric increments are added up per route plan and applied before every await, so nothing
can observe them pending. An item that fails (unknown route, bad key or cost, an
unexpected error) comes back as its exception, in place: one item never fails a batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from limiter import Decision, LocalLimiter, Policy
from limiter.keys import DEFAULT_MAX_KEY_LENGTH, validate_key
from limiter.policy import make_decision
from limiter.resilience import FailurePolicy, Outcome

from ..observe.activity import Activity
from ..observe.metrics import Metrics
from .compare import Comparisons
from .enforce import Path, divergence_of, failure_verdict, path_for
from .headers import HeaderStyle
from .plan import RoutePlan, check_cost
from .shadow import ShadowPipeline, candidate_item
from .types import DecideInput, DecideResult, PlainInput, UnknownRoute

if TYPE_CHECKING:
    from ..external import ExternalManager, Resolution
    from ..rollout.adjustments import Adjustments
    from ..rules import RouteRule, Rules
    from ..whatif.recorder import Recorder
    from .overlimit import OverLimitCache

__all__ = ["Decider", "wall_clock_us"]

_time_ns = time.time_ns
_DISTRIBUTED = Path.DISTRIBUTED
_SHADOW = Path.SHADOW


def wall_clock_us() -> int:
    """The wall clock in integer microseconds (the decider's default clock)."""
    return time.time_ns() // 1000


class _Batch:
    """One call's items and what is known about each so far."""

    __slots__ = (
        "inputs", "items", "as_dict", "out", "rules", "keys", "lookups", "ext", "plans", "pend", "reqs", "ovs",
        "inline", "budget", "cached",
    )  # fmt: skip

    def __init__(
        self, inputs: Sequence[DecideInput | PlainInput], as_dict: bool, inline: bool = False,
        budget: float | None = None,
    ) -> None:  # fmt: skip
        n = len(inputs)
        self.inputs = inputs
        self.items: Sequence[Any] = inputs  # becomes a copy when a tuple is turned into a DecideInput
        self.as_dict = as_dict
        self.out: list[Any] = [None] * n
        self.rules: list[RouteRule | None] = [None] * n
        self.keys: list[Any] = [None] * n  # the key, or the item's exception
        self.lookups: list[int] = []
        self.ext: dict[int, Resolution] = {}
        self.plans: dict[str, RoutePlan] = {}  # the plans this batch has used
        self.pend: list[tuple[Any, ...]] = []  # requests waiting for their distributed answer
        self.reqs: list[tuple[str, Policy, int, int]] = []
        self.ovs: list[tuple[FailurePolicy | None, int | None]] = []
        # shadow evaluations made in the request path (inline_shadow): (index, the ShadowItem)
        self.inline: list[tuple[int, tuple[Any, ...]]] | None = [] if inline else None
        self.budget = budget  # seconds left for Redis (the caller's deadline), None: no deadline
        # requests the over-limit cache answers: (pending entry, its request, the refusal)
        self.cached: list[tuple[tuple[Any, ...], tuple[Any, ...], Decision]] = []

    def full(self, i: int) -> DecideInput:
        """Item ``i`` as a DecideInput (a PlainInput is converted, in a copy of the list)."""
        inp = self.items[i]
        if inp.__class__ is not tuple:
            return inp  # type: ignore[no-any-return]
        if self.items is self.inputs:
            self.items = list(self.inputs)
        route, key, cost, request_id = inp
        full = DecideInput(route=route, key=key, cost=cost, request_id=request_id)
        self.items[i] = full  # type: ignore[index]
        return full


class Decider:
    """Decides requests under their routes' modes (see the module docstring)."""

    def __init__(
        self,
        *,
        rules: Callable[[], Rules],
        modes: Any,
        adjustments: Adjustments,
        local: LocalLimiter,
        resilient: Any,
        shadow: ShadowPipeline,
        comparisons: Comparisons,
        external: ExternalManager,
        activity: Activity,
        metrics: Metrics,
        instance_id: str,
        clock_us: Callable[[], int] = wall_clock_us,
        recorder: Recorder | None = None,
        headers: HeaderStyle = HeaderStyle(),
        over_limit: OverLimitCache | None = None,
    ) -> None:
        self._rules = rules
        self.headers = headers
        self.over_limit = over_limit  # keys over their global limit, answered without Redis (enforce)
        self.modes = modes  # effective_mode(route) -> (Mode, percent); .generation
        self.adjustments = adjustments
        self.local = local
        self.resilient = resilient
        self.shadow = shadow
        self.comparisons = comparisons
        self.external = external
        self.activity = activity
        self.metrics = metrics
        self.instance_id = instance_id
        self.clock_us = clock_us
        self._wall_clock = clock_us is wall_clock_us  # read inline: no Python call per request
        self._offer_shadow = shadow.queue.offer
        self._note = activity.note  # bound once: no attribute lookups per request
        self._record = recorder.offer if recorder is not None and recorder.enabled else None
        self._plans: dict[str, RoutePlan] = {}
        self._latency: dict[str, Any] = {}  # mode -> its child of the latency histogram
        self._seq = 0

    # -- the API -------------------------------------------------------------------------

    async def decide(self, inp: DecideInput | PlainInput) -> DecideResult:
        """Decide one request (a :class:`DecideInput` or a :data:`PlainInput` tuple):
        :meth:`decide_many` with one item (its error is raised)."""
        res: DecideResult = await self._one(inp, False)
        return res

    async def decide_dict(self, inp: DecideInput | PlainInput) -> dict[str, Any]:
        """:meth:`decide` in the result's ``to_dict()`` form, built without the object
        (the hot path sends it as it is)."""
        res: dict[str, Any] = await self._one(inp, True)
        return res

    async def _one(self, inp: DecideInput | PlainInput, as_dict: bool) -> Any:
        """One item through :meth:`_run` (its error raised), its latency observed in its
        mode's child of the histogram (looked up once per mode)."""
        t0 = time.perf_counter()
        res = (await self._run((inp,), as_dict))[0]
        if isinstance(res, BaseException):
            raise res
        mode = res["mode"] if as_dict else res.mode
        latency = self._latency.get(mode)
        if latency is None:
            latency = self._latency[mode] = self.metrics.child(self.metrics.latency, mode)
        latency.observe(time.perf_counter() - t0)
        return res

    async def decide_many(
        self,
        inputs: Sequence[DecideInput | PlainInput],
        *,
        as_dicts: bool = False,
        inline_shadow: bool = False,
        budget_s: float | None = None,
    ) -> list[Any]:
        """Decide many requests, in order: each answer is a :class:`DecideResult` (its
        ``to_dict()`` form with ``as_dicts``), or the item's exception in place. An item
        is a :class:`DecideInput` or a :data:`PlainInput` tuple.

        With ``inline_shadow``, the requests whose distributed answer does not count
        (shadow, a canary's shadowed share) are evaluated in Redis before this returns
        instead of on the shadow pipeline, compared and counted the same way, and their
        :attr:`DecideResult.shadow_allowed` says Redis's verdict (what Envoy's would-limit
        header needs); the local answer still counts. A cost of 0 looks without spending
        (the limiters' peek).

        ``budget_s`` is the time Redis may take (what is left of the caller's deadline, a
        margin kept): past it, or when it is too short to try, the failure policy answers
        (:class:`~limiter.resilience.ResilientLimiter`), counted per route and reason in
        ``rate_limit_deadline_answers_total``."""
        t0 = time.perf_counter()
        out = await self._run(inputs, as_dicts, inline_shadow, budget_s)
        if inputs:
            self.metrics.child(self.metrics.latency, "batch").observe((time.perf_counter() - t0) / len(inputs))
        return out

    def next_id(self) -> str:
        self._seq += 1
        return f"{self.instance_id}-{self._seq}"

    def resolve(self, inp: DecideInput) -> tuple[RouteRule, str]:
        """Route and key for a request (raises UnknownRoute / InvalidKeyError / ValueError)."""
        rules = self._rules()
        if inp.route is not None:
            found = rules.get(inp.route)
            if found is None:
                raise UnknownRoute(inp.route)
            rule = found
        else:
            rule = rules.match((inp.method or "GET").upper(), inp.path or "/")
        if inp.key is not None:
            return rule, validate_key(inp.key, field="key")
        return rule, rule.key.extract(client_ip=inp.client_ip, headers=inp.headers, path=inp.path or "/")

    def plan(self, rule: RouteRule) -> RoutePlan:
        """The route's plan, rebuilt when its rules, mode or adjustments changed."""
        modes, adjustments = self.modes, self.adjustments
        p = self._plans.get(rule.name)
        if p is not None and p.rule is rule:
            stamp = p.stamp
            if stamp[0] == modes.generation and stamp[1] == adjustments.generation:
                return p
        stamp = (modes.generation, adjustments.generation)
        mode, percent = modes.effective_mode(rule.name)
        p = self._plans[rule.name] = RoutePlan(rule, mode, percent, adjustments, stamp, self.headers)
        return p

    # -- the steps -----------------------------------------------------------------------

    async def _run(
        self, inputs: Sequence[DecideInput | PlainInput], as_dict: bool, inline: bool = False,
        budget: float | None = None,
    ) -> list[Any]:  # fmt: skip
        b = _Batch(inputs, as_dict, inline, budget)
        self._resolve_all(b)
        if b.lookups:
            await self._lookup_external(b)
        step = self._step
        try:
            for i in range(len(inputs)):
                try:
                    step(b, i)
                except Exception as exc:  # noqa: BLE001 - one item never fails the batch
                    b.out[i] = exc
        finally:
            if b.cached:
                self._answer_cached(b)
            self._flush(b)
        if b.inline:
            if b.pend:
                await asyncio.gather(self._distributed(b), self._shadow_inline(b))
            else:
                await self._shadow_inline(b)
        elif b.pend:
            await self._distributed(b)
        return b.out

    async def _shadow_inline(self, b: _Batch) -> None:
        """The shadow evaluations of this call, now: the pipeline's own evaluation (same
        comparison, same counters), each verdict put on its result."""
        inline = b.inline or []
        verdicts = await self.shadow.evaluate([item for _, item in inline], timeout_s=b.budget)
        for (i, _), verdict in zip(inline, verdicts):
            res = b.out[i]
            if isinstance(res, DecideResult):
                res.shadow_allowed = verdict
            elif isinstance(res, dict):
                res["shadow_allowed"] = verdict

    def _resolve_all(self, b: _Batch) -> None:
        rules_get = self._rules().get
        rules, keys = b.rules, b.keys
        for i, inp in enumerate(b.inputs):
            route: str | None
            key: Any
            if inp.__class__ is tuple:
                route, key = inp[0], inp[1]
            else:
                route, key = inp.route, inp.key  # type: ignore[union-attr]
            if (  # a key validate_key returns unchanged (printable ASCII, no surrounding space), checked inline
                route is not None
                and key.__class__ is str
                and 0 < len(key) <= DEFAULT_MAX_KEY_LENGTH
                and key.isascii()
                and key.isprintable()
                and key[0] != " "
                and key[-1] != " "
            ):
                rule = rules_get(route)
                if rule is None:
                    keys[i] = UnknownRoute(route)
                    continue
            else:
                try:
                    rule, key = self.resolve(b.full(i))
                except Exception as exc:  # noqa: BLE001 - UnknownRoute, ValueError, or unexpected: in place
                    keys[i] = exc
                    continue
            rules[i] = rule
            keys[i] = key
            if rule.external is not None:
                full = b.full(i)
                if not (rule.deny.matches(key, full.client_ip) or rule.allow.matches(key, full.client_ip)):
                    b.lookups.append(i)

    async def _lookup_external(self, b: _Batch) -> None:
        items = b.items
        got = await asyncio.gather(
            *[
                self.external.resolve(b.rules[i], b.keys[i], items[i].method, items[i].path, items[i].headers)
                for i in b.lookups
            ],
            return_exceptions=True,
        )
        for i, res in zip(b.lookups, got):
            if isinstance(res, BaseException):
                if not isinstance(res, Exception):
                    raise res
                b.rules[i], b.keys[i] = None, res  # in place, like an invalid item
            else:
                b.ext[i] = res

    def _step(self, b: _Batch, i: int) -> None:
        """Item ``i`` up to its answer, or its place in the distributed burst: the plan's
        policies, the lists, the local decision, then what the path says (answer now,
        with the shadow evaluation queued, or wait for the distributed answer)."""
        rule = b.rules[i]
        if rule is None:
            b.out[i] = b.keys[i]
            return
        key = b.keys[i]
        p = b.plans.get(rule.name)
        if p is None or p.rule is not rule:
            p = b.plans[rule.name] = self.plan(rule)
        inp = b.items[i]
        if inp.__class__ is tuple:
            cost, request_id, client_ip = inp[2], inp[3], None
        else:
            cost, request_id, client_ip = inp.cost, inp.request_id, inp.client_ip
        if not request_id:
            self._seq += 1
            request_id = f"{self.instance_id}-{self._seq}"
        res = b.ext.get(i) if b.ext else None
        if p.simple and res is None:
            lp, dp, bkey, (fp, fc) = p.lp, p.dp, key, p.failure
        else:
            lp, dp, bkey, fp, fc = p.policies(key, None if res is None else res.limits)
        if cost.__class__ is not int or not 1 <= cost <= p.cost_max or lp is not p.lp or dp is not p.dp:
            cost = check_cost(lp, dp, cost)
        now_us = _time_ns() // 1000 if self._wall_clock else self.clock_us()
        if p.lists and self._listed(b, i, p, key, client_ip, lp, request_id, now_us, res):
            return
        key = bkey  # from here on, the bucket's key (an external tenant's, when it has one)
        now_s = now_us / 1_000_000
        lkey = p.prefix + key
        local = self.local.check(lkey, lp, cost, now_us)
        last = self._note(p.name, key, now_s)
        if res is not None:
            self.activity.remember_external(p.name, key, lp, dp)
        allowed = local.allowed
        p.req[allowed] += 1
        path = p.path or path_for(p.mode, p.percent, p.name, key)
        if path is _DISTRIBUTED:
            self._pend(b, (i, p, key, local, request_id, now_s, dp, res, fp), (lkey, dp, cost, now_us), fc)
            return
        shadow = None
        if path is _SHADOW:
            shadow = dp
            self._queue_shadow(b, i, p, (lkey, dp, cost, now_us, p.name, key, allowed, request_id))
        p.fin[allowed] += 1
        p.remaining = local.remaining
        last[key] = (now_s, allowed, "local")
        if self._record is not None and cost:  # a look without spending (cost 0) is no request to replay
            self._record(p.name, key, cost, now_us, p.mode_value, allowed)
        if res is None:
            b.out[i] = p.answer(b.as_dict, local, "local", 429, key, request_id, local, None, None, lp, shadow, now_s)
        else:
            b.out[i] = p.answer(
                b.as_dict, local, "local", 429, key, request_id, local, None, None, lp, shadow, now_s, (None, None, res)
            )

    def _queue_shadow(self, b: _Batch, i: int, p: RoutePlan, item: tuple[Any, ...]) -> None:
        """A request's shadow evaluation (with its candidate's, when the route has one), in
        the request path (inline) or on the pipeline (a drop counted)."""
        cost = item[2]
        if p.cand is not None and cost:  # compared with the current global answer, evaluated with it
            item += (candidate_item(p.cand, item[0], cost, None),)
        if b.inline is not None:
            b.inline.append((i, item))
        elif not self._offer_shadow(item):
            p.dropped += 1
            if p.cand is not None and cost:
                p.cand_dropped += 1

    def _pend(self, b: _Batch, entry: tuple[Any, ...], req: tuple[str, Policy, int, int], fc: int | None) -> None:
        """A request whose distributed answer counts: into the burst to Redis, or (a key
        known over its global limit, in enforce) answered from the over-limit cache."""
        over = self.over_limit
        if over is not None and req[2] <= 1 and entry[1].mode_value == "enforce":
            refusal = over.get(req[0], req[1], req[3])
            if refusal is not None:
                b.cached.append((entry, req, refusal))
                return
        b.pend.append(entry)
        b.reqs.append(req)
        b.ovs.append((entry[8], fc))

    def _listed(
        self, b: _Batch, i: int, p: RoutePlan, key: str, client_ip: str | None, lp: Policy, request_id: str,
        now_us: int, res: Resolution | None,
    ) -> bool:  # fmt: skip
        """A deny-listed client gets 403, an allow-listed one 200; neither limiter is asked."""
        rule = p.rule
        if rule.deny.matches(key, client_ip):
            d = make_decision(False, 0, lp.limit, lp.period_us, 0)
            self.metrics.child(self.metrics.rejections, "deny_list").inc()
            match = "deny"
        elif rule.allow.matches(key, client_ip):
            d = make_decision(True, lp.limit, lp.limit, 0, 0)
            match = "allow"
        else:
            return False
        b.out[i] = p.answer(
            b.as_dict, d, "local", 403, key, request_id, d, None, None, lp, None, now_us / 1_000_000, (match, None, res)
        )
        return True

    async def _distributed(self, b: _Batch) -> None:
        """One pipelined burst for every request whose distributed answer counts."""
        try:
            if len(b.reqs) == 1:  # one request (decide): the client's single-command path
                (lkey, dp, cost, now_us), (fp, fc) = b.reqs[0], b.ovs[0]
                if b.budget is None:
                    outcome = await self.resilient.check(lkey, dp, cost, now_us, failure_policy=fp, failure_code=fc)
                else:
                    outcome = await self.resilient.check(
                        lkey, dp, cost, now_us, failure_policy=fp, failure_code=fc, timeout_s=b.budget
                    )
                outcomes = [outcome]
            elif b.budget is None:
                outcomes = await self.resilient.check_many(b.reqs, overrides=b.ovs)
            else:
                outcomes = await self.resilient.check_many(b.reqs, overrides=b.ovs, timeout_s=b.budget)
        except Exception as exc:  # noqa: BLE001 - not a backend failure (those are outcomes): each item's error
            for entry in b.pend:
                b.out[entry[0]] = exc
            return
        record = self._record
        over = self.over_limit
        try:
            for entry, outcome, req in zip(b.pend, outcomes, b.reqs):
                try:
                    self._complete(b, entry, outcome)
                    if entry[1].cand is not None and req[2] and outcome.source == "distributed":
                        self._candidate(entry, req, outcome.decision.allowed)
                    if (
                        over is not None
                        and req[2] <= 1
                        and not outcome.decision.allowed
                        and outcome.source == "distributed"
                        and entry[1].mode_value == "enforce"
                    ):
                        over.put(req[0], req[1], outcome.decision, req[3])
                        self.metrics.child(self.metrics.over_limit_cache, "stored").inc()
                    if record is not None and req[2]:
                        record(entry[1].name, entry[2], req[2], req[3], entry[1].mode_value, outcome.decision.allowed)
                except Exception as exc:  # noqa: BLE001 - one item never fails the batch
                    b.out[entry[0]] = exc
        finally:
            self._flush(b)

    def _complete(self, b: _Batch, entry: tuple[Any, ...], outcome: Outcome) -> None:
        """The distributed answer is in: compare, then enforce (or the failure policy)."""
        i, p, key, local, request_id, now_s, dp, res, fp = entry
        if outcome.source != "distributed":
            self._failed(b, entry, outcome)
            return
        dist: Decision = outcome.decision
        div = divergence_of(local.allowed, dist.allowed)
        self.comparisons.pair(p.name, key, div, request_id)
        p.count_distributed(dist, div)
        self.activity.note_decision(p.name, key, (now_s, dist.allowed, "distributed"))
        b.out[i] = p.answer(
            b.as_dict, dist, "distributed", 429, key, request_id, local, dist, div, dp, None, now_s, (None, None, res)
        )

    def _candidate(self, entry: tuple[Any, ...], req: tuple[str, Policy, int, int], current: bool) -> None:
        """A request whose current global answer is ``current``: its candidate evaluation
        queued on the shadow pipeline (a drop is counted as the candidate's)."""
        p = entry[1]
        lkey, _, cost, now_us = req
        cand = candidate_item(p.cand, lkey, cost, current)
        if not self._offer_shadow((None, None, cost, now_us, p.name, entry[2], current, entry[4], cand)):
            p.cand_dropped += 1

    def _answer_cached(self, b: _Batch) -> None:
        """The requests of keys over their global limit: the cached refusal, as Redis's."""
        record = self._record
        for entry, req, refusal in b.cached:
            try:
                self._complete(b, entry, Outcome(refusal, "distributed"))
                if entry[1].cand is not None and req[2]:
                    self._candidate(entry, req, False)
                if record is not None and req[2]:
                    record(entry[1].name, entry[2], req[2], req[3], entry[1].mode_value, False)
            except Exception as exc:  # noqa: BLE001 - one item never fails the batch
                b.out[entry[0]] = exc
        self.metrics.child(self.metrics.over_limit_cache, "hit").inc(len(b.cached))

    def _failed(self, b: _Batch, entry: tuple[Any, ...], outcome: Outcome) -> None:
        """Redis failed: the failure policy's answer counts."""
        i, p, key, local, request_id, now_s, dp, res, fp = entry
        m = self.metrics
        if outcome.deadline is not None:
            m.child(m.deadline_answers, p.name, outcome.deadline).inc()
        self.comparisons.backend_error(p.name)
        m.child(m.fallback, (fp or self.resilient.failure_policy).value).inc()
        status, reason = failure_verdict(outcome)
        d: Decision = outcome.decision
        if not d.allowed:
            m.child(m.rejections, reason).inc()
            m.child(m.exceeded, "failure_policy").inc()
        m.child(m.decisions, p.name, p.mode_value, "failure_policy", "true" if d.allowed else "false").inc()
        p.remaining = d.remaining
        self.activity.note_decision(p.name, key, (now_s, d.allowed, "failure_policy"))
        extra = (None, outcome.error, res)
        b.out[i] = p.answer(
            b.as_dict, d, "failure_policy", status, key, request_id, local, None, None, dp, None, now_s, extra
        )

    def _flush(self, b: _Batch) -> None:
        m, comparisons = self.metrics, self.comparisons
        for p in b.plans.values():
            p.flush(m, comparisons)
