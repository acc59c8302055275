"""The one decision path: :meth:`Decider.decide_many` decides a batch; :meth:`Decider.decide`
decides one request, gathered with the others asked in the same pass of the event loop into
one batch (:mod:`.gather`).

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
from limiter.policy import Charge, make_decision
from limiter.resilience import Outcome

from ..observe.activity import Activity
from ..observe.metrics import Metrics
from .batch import Batch, Pending
from .compare import Comparisons
from .enforce import Path, divergence_of, failure_verdict, path_for
from .gather import MAX_GATHERED, Gathering
from .headers import HeaderStyle
from .plan import RoutePlan, check_cost
from .reservations import ReservationCalls
from .shadow import ShadowItem, ShadowPipeline, candidate_item
from .types import DecideResult, InputLike, InvalidCost, MissingTarget, PlainInput, UnknownRoute

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
_new = object.__new__  # records made per request: a new object, then its class's __init__ (RoutePlan.answer)


def wall_clock_us() -> int:
    """The wall clock in integer microseconds (the decider's default clock)."""
    return time.time_ns() // 1000


class Decider(ReservationCalls):
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
        self.recorder = recorder if recorder is not None and recorder.enabled else None
        self._plans: dict[str, RoutePlan] = {}
        self._latency: dict[str, Any] = {}  # mode -> its child of the latency histogram
        self._gathering: list[Gathering | None] = [None, None]  # the one forming, per headers flag
        self._tasks: set[asyncio.Task[Any]] = set()  # the gatherings' tasks (referenced while they run)
        self._seq = 0

    # -- the API -------------------------------------------------------------------------

    async def decide(self, inp: InputLike | PlainInput, *, headers: bool = True) -> DecideResult:
        """Decide one request (a :class:`DecideInput`, an object like it, or a
        :data:`PlainInput` tuple): gathered with the other single decisions asked in this
        pass of the event loop and decided with them as one batch (:mod:`.gather`), in the
        order asked; its error is raised; its latency observed in its mode's child of the
        histogram (looked up once per mode)."""
        t0 = time.perf_counter()
        g = self._gathering[headers]
        if g is None:  # the first of this pass: the gathering is decided by a task of its own
            g = self._gathering[headers] = Gathering(headers)
            task = asyncio.get_running_loop().create_task(self._decide_gathered(g))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        waiter = g.join(inp)
        if len(g.inputs) >= MAX_GATHERED:
            self._gathering[headers] = None  # full: the next caller opens another
        res = await waiter
        if isinstance(res, BaseException):
            raise res
        latency = self._latency.get(res.mode)
        if latency is None:
            latency = self._latency[res.mode] = self.metrics.child(self.metrics.latency, res.mode)
        latency.observe(time.perf_counter() - t0)
        return res  # type: ignore[no-any-return]

    async def decide_many(
        self,
        inputs: Sequence[InputLike | PlainInput],
        *,
        headers: bool = True,
        inline_shadow: bool = False,
        budget_s: float | None = None,
    ) -> list[Any]:
        """Decide many requests, in order: each answer is a :class:`DecideResult`, or the
        item's exception in place. An item is a :class:`DecideInput` (or an object with its
        fields) or a :data:`PlainInput` tuple. ``headers``: render the rate-limit headers of
        each answer (a front end that sends none, like Envoy's default, leaves them out).

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
        out = await self._run(inputs, headers, inline_shadow, budget_s)
        if inputs:
            self.metrics.child(self.metrics.latency, "batch").observe((time.perf_counter() - t0) / len(inputs))
        return out

    def next_id(self) -> str:
        self._seq += 1
        return f"{self.instance_id}-{self._seq}"

    def now_us(self) -> int:
        """The decisions' clock, in microseconds."""
        return _time_ns() // 1000 if self._wall_clock else self.clock_us()

    def resolve(self, inp: InputLike) -> tuple[RouteRule, str]:
        """Route and key for a request (raises MissingTarget / UnknownRoute / InvalidKeyError)."""
        if inp.route is None and inp.path is None:
            raise MissingTarget("route", "give either route or method + path")
        if inp.key is None and inp.client_ip is None and not inp.headers:
            raise MissingTarget("key", "give either key or client_ip + headers")
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
        self, inputs: Sequence[InputLike | PlainInput], headers: bool, inline: bool = False,
        budget: float | None = None,
    ) -> list[Any]:  # fmt: skip
        b = Batch(inputs, headers, inline, budget)
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

    # -- single decisions, gathered (see .gather) ----------------------------------------

    async def _decide_gathered(self, g: Gathering) -> None:
        """The single decisions asked in the pass of the loop before this task's first step,
        decided as one batch; each caller gets its answer."""
        if self._gathering[g.headers] is g:
            self._gathering[g.headers] = None  # who asks from now on opens another
        try:
            out = await self._run(g.inputs, g.headers)
        except BaseException as exc:  # the batch itself failed (items' errors are in place)
            g.fail(exc)
            if not isinstance(exc, Exception):
                raise  # cancelled: the task ends cancelled too
            return
        g.answer(out)

    async def settle(self) -> None:
        """Wait for the gatherings still being decided (their requests waiting for Redis)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    async def _shadow_inline(self, b: Batch) -> None:
        """The shadow evaluations of this call, now: the pipeline's own evaluation (same
        comparison, same counters), each verdict put on its result."""
        inline = b.inline or []
        verdicts = await self.shadow.evaluate([item for _, item in inline], timeout_s=b.budget)
        for (i, _), verdict in zip(inline, verdicts):
            res = b.out[i]
            if isinstance(res, DecideResult):
                res.shadow_allowed = verdict

    def _resolve_all(self, b: Batch) -> None:
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

    async def _lookup_external(self, b: Batch) -> None:
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

    def _step(self, b: Batch, i: int) -> None:
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
        if (
            lp is not p.lp
            or dp is not p.dp
            or not (
                (cost.__class__ is int and 1 <= cost <= p.cost_max)
                or (cost.__class__ is Charge and -p.charge_max <= cost <= p.charge_max)
            )
        ):
            try:
                cost = check_cost(lp, dp, cost)
            except InvalidCost as exc:
                exc.path = p.path_of(bkey)  # whether the refusal counts: as the decision would have
                raise
        now_us = _time_ns() // 1000 if self._wall_clock else self.clock_us()
        if p.lists and self._listed(
            b, i, p, key=key, client_ip=client_ip, policy=lp, request_id=request_id, now_us=now_us, res=res
        ):
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
            pending = _new(Pending)
            Pending.__init__(
                pending, index=i, plan=p, key=key, local=local, request_id=request_id, res=res,
                request=(lkey, dp, cost, now_us), failure=(fp, fc), ref=lp if p.explain else None,
            )  # fmt: skip
            self._pend(b, pending)
            return
        shadow = None
        if path is _SHADOW:
            shadow = dp
            item = _new(ShadowItem)
            req = (lkey, dp, cost, now_us)
            ShadowItem.__init__(item, request=req, route=p.name, key=key, local_allowed=allowed, request_id=request_id)
            item.units = p.units
            self._queue_shadow(b, i, p, item, lp)
        p.fin[allowed] += 1
        p.remaining = local.remaining
        if p.units and not allowed and cost.__class__ is Charge:
            self.comparisons.over_budget(p.name, "local")  # a budget's charge past what was left
        last[key] = (now_s, allowed, "local")
        if self._record is not None and cost:  # a look without spending (cost 0) is no request to replay
            self._record(p.name, key, cost, now_us, p.mode_value, allowed)
        b.out[i] = p.answer(
            enforced=local, enforced_by="local", status=429, key=key, request_id=request_id, path=path, local=local,
            policy=lp, shadow=shadow, now_s=now_s, headers=b.headers, res=res,
        )  # fmt: skip

    def _queue_shadow(self, b: Batch, i: int, p: RoutePlan, item: ShadowItem, lp: Policy) -> None:
        """A request's shadow evaluation (with its candidate's, when the route has one, and
        the reference's, ``lp`` fleet-wide, when it explains its divergence), in the request
        path (inline) or on the pipeline (a drop counted)."""
        lkey, _, cost, _ = item.request
        if p.cand is not None and cost:  # compared with the current global answer, evaluated with it
            item.candidate = candidate_item(p.cand, lkey or "", cost, None)
        if p.explain and cost:
            item.ref = lp
        if b.inline is not None:
            b.inline.append((i, item))
        elif not self._offer_shadow(item):
            p.dropped += 1
            if p.cand is not None and cost:
                p.cand_dropped += 1

    def _pend(self, b: Batch, pending: Pending) -> None:
        """A request whose distributed answer counts: into the burst to Redis, or (a key
        known over its global limit, in enforce) answered from the over-limit cache."""
        over = self.over_limit
        lkey, dp, cost, now_us = pending.request
        if over is not None and 0 <= cost <= 1 and pending.plan.mode_value == "enforce":
            refusal = over.get(lkey, dp, now_us)
            if refusal is not None:
                b.cached.append((pending, refusal))
                return
        b.pend.append(pending)

    def _listed(
        self, b: Batch, i: int, p: RoutePlan, *, key: str, client_ip: str | None, policy: Policy, request_id: str,
        now_us: int, res: Resolution | None,
    ) -> bool:  # fmt: skip
        """A deny-listed client gets 403, an allow-listed one 200; neither limiter is asked."""
        rule = p.rule
        if rule.deny.matches(key, client_ip):
            d = make_decision(False, 0, policy.limit, policy.period_us, 0)
            self.metrics.child(self.metrics.rejections, "deny_list").inc()
            match = "deny"
        elif rule.allow.matches(key, client_ip):
            d = make_decision(True, policy.limit, policy.limit, 0, 0)
            match = "allow"
        else:
            return False
        b.out[i] = p.answer(
            enforced=d, enforced_by="local", status=403, key=key, request_id=request_id, path=p.path_of(key), local=d,
            policy=policy, now_s=now_us / 1_000_000, headers=b.headers, list_match=match, res=res,
        )  # fmt: skip
        return True

    async def _distributed(self, b: Batch) -> None:
        """One pipelined burst for every request whose distributed answer counts."""
        try:
            if len(b.pend) == 1:  # one request (decide): the client's single-command path
                one = b.pend[0]
                (lkey, dp, cost, now_us), (fp, fc) = one.request, one.failure
                if b.budget is None:
                    outcome = await self.resilient.check(lkey, dp, cost, now_us, failure_policy=fp, failure_code=fc)
                else:
                    outcome = await self.resilient.check(
                        lkey, dp, cost, now_us, failure_policy=fp, failure_code=fc, timeout_s=b.budget
                    )
                outcomes = [outcome]
            else:
                reqs = [e.request for e in b.pend]
                ovs = [e.failure for e in b.pend]
                if b.budget is None:
                    outcomes = await self.resilient.check_many(reqs, overrides=ovs)
                else:
                    outcomes = await self.resilient.check_many(reqs, overrides=ovs, timeout_s=b.budget)
        except Exception as exc:  # noqa: BLE001 - not a backend failure (those are outcomes): each item's error
            for entry in b.pend:
                b.out[entry.index] = exc
            return
        try:
            for entry, outcome in zip(b.pend, outcomes):
                try:
                    self._settle(b, entry, outcome)
                except Exception as exc:  # noqa: BLE001 - one item never fails the batch
                    b.out[entry.index] = exc
        finally:
            self._flush(b)

    def _settle(self, b: Batch, entry: Pending, outcome: Outcome) -> None:
        """A distributed answer: the request completed, its candidate evaluation queued, a
        refusal remembered by the over-limit cache (enforce), the request recorded."""
        self._complete(b, entry, outcome)
        cost = entry.request[2]
        from_redis = outcome.source == "distributed"
        if (entry.plan.cand is not None or entry.ref is not None) and cost and from_redis:
            self._after(entry, outcome.decision)
        over = self.over_limit
        if over is not None and cost <= 1 and not outcome.decision.allowed and from_redis:
            if entry.plan.mode_value == "enforce":
                lkey, dp, _, now_us = entry.request
                over.put(lkey, dp, outcome.decision, now_us)
                self.metrics.child(self.metrics.over_limit_cache, "stored").inc()
        if self._record is not None and cost:
            p = entry.plan
            self._record(p.name, entry.key, cost, entry.request[3], p.mode_value, outcome.decision.allowed)

    def _complete(self, b: Batch, entry: Pending, outcome: Outcome) -> None:
        """The distributed answer is in: compare, then enforce (or the failure policy)."""
        if outcome.source != "distributed":
            self._failed(b, entry, outcome)
            return
        p, key, local, now_s = entry.plan, entry.key, entry.local, entry.now_s
        dist: Decision = outcome.decision
        div = divergence_of(local.allowed, dist.allowed)
        self.comparisons.pair(p.name, key, div, entry.request_id, int(entry.request[2]) if p.units else None)
        p.count_distributed(dist, div)
        if p.units and not dist.allowed and entry.request[2].__class__ is Charge:
            self.comparisons.over_budget(p.name, "distributed")
        self.activity.note_decision(p.name, key, (now_s, dist.allowed, "distributed"))
        b.out[entry.index] = p.answer(
            enforced=dist, enforced_by="distributed", status=429, key=key, request_id=entry.request_id,
            path=_DISTRIBUTED, local=local, dist=dist, div=div, policy=entry.request[1], now_s=now_s,
            headers=b.headers, res=entry.res,
        )  # fmt: skip

    def _after(self, entry: Pending, answer: Decision) -> None:
        """A request whose global answer is ``answer``: its candidate's evaluation and the
        reference's, queued on the shadow pipeline (a drop is counted as the candidate's)."""
        p = entry.plan
        lkey, dp, cost, now_us = entry.request
        cand = None if p.cand is None else candidate_item(p.cand, lkey, cost, answer.allowed)
        item = ShadowItem(
            request=(lkey, dp, cost, now_us), route=p.name, key=entry.key, local_allowed=entry.local.allowed,
            request_id=entry.request_id, candidate=cand, ref=entry.ref, known=answer,
        )  # fmt: skip
        if not self._offer_shadow(item) and cand is not None:
            p.cand_dropped += 1

    def _answer_cached(self, b: Batch) -> None:
        """The requests of keys over their global limit: the cached refusal, as Redis's."""
        record = self._record
        for entry, refusal in b.cached:
            try:
                self._complete(b, entry, Outcome(refusal, "distributed"))
                cost = entry.request[2]
                if (entry.plan.cand is not None or entry.ref is not None) and cost:
                    self._after(entry, refusal)
                if record is not None and cost:
                    record(entry.plan.name, entry.key, cost, entry.request[3], entry.plan.mode_value, False)
            except Exception as exc:  # noqa: BLE001 - one item never fails the batch
                b.out[entry.index] = exc
        self.metrics.child(self.metrics.over_limit_cache, "hit").inc(len(b.cached))

    def _failed(self, b: Batch, entry: Pending, outcome: Outcome) -> None:
        """Redis failed: the failure policy's answer counts."""
        p, key = entry.plan, entry.key
        m = self.metrics
        if outcome.deadline is not None:
            m.child(m.deadline_answers, p.name, outcome.deadline).inc()
        self.comparisons.backend_error(p.name)
        m.child(m.fallback, (entry.failure[0] or self.resilient.failure_policy).value).inc()
        status, reason = failure_verdict(outcome)
        d: Decision = outcome.decision
        if not d.allowed:
            m.child(m.rejections, reason).inc()
            m.child(m.exceeded, "failure_policy").inc()
        m.child(m.decisions, p.name, p.mode_value, "failure_policy", "true" if d.allowed else "false").inc()
        p.remaining = d.remaining
        now_s = entry.now_s
        self.activity.note_decision(p.name, key, (now_s, d.allowed, "failure_policy"))
        b.out[entry.index] = p.answer(
            enforced=d, enforced_by="failure_policy", status=status, key=key, request_id=entry.request_id,
            path=_DISTRIBUTED, local=entry.local, policy=entry.request[1], now_s=now_s, headers=b.headers,
            backend_error=outcome.error, res=entry.res,
        )  # fmt: skip

    def _flush(self, b: Batch) -> None:
        m, comparisons = self.metrics, self.comparisons
        for p in b.plans.values():
            p.flush(m, comparisons)
