"""The shadow pipeline: requests whose distributed decision does not count (shadow, and the
keys outside a canary's share) are queued on the request path and evaluated later, off
it, in pipelined batches; each pair is then compared and counted.

The queue is bounded: when it is full the shadow evaluation is dropped and counted (the
divergence figures then say they are a sample), the request is never delayed. The
worker takes up to ``batch_size`` items at a time and sends them to Redis as one burst;
when fewer are waiting it first lingers ``linger_s`` for more, so a steady trickle costs
one round trip per few milliseconds instead of one per request.

The same burst carries a route's candidate limit's evaluations and, on a route that explains
its divergence, the reference's (:mod:`.explain`): each divergent decision is then counted
by cause.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

from limiter import Decision, Policy

from ..model.candidate import blocked_view_name
from ..model.causes import FORWARD, Cause, needs_reference
from .compare import Comparisons
from .explain import REFERENCE_PREFIX, Explainer

__all__ = ["CandidateItem", "ShadowItem", "ShadowPipeline", "ShadowQueue", "candidate_item"]

log = logging.getLogger("shadowlimit.engine")


class CandidateItem(NamedTuple):
    """A request's evaluation under its route's candidate limit (:func:`candidate_item`)."""

    key: str  # the candidate's bucket key
    policy: Policy | None  # None: a cost the candidate refuses outright (no Redis)
    id: str  # the candidate's id
    current: bool | None  # the current global answer (None: the one this very item's evaluation gives)


@dataclass(slots=True, kw_only=True)
class ShadowItem:
    """One request waiting for its shadow evaluation, built by keyword on the request path:
    RedisLimiter's request (``request``: bucket key, policy, cost, time in microseconds) and
    what the comparison needs (``route``, ``key``, ``local_allowed``, ``request_id``). A route
    with a candidate limit adds its ``candidate``; a route that explains its divergence, ``ref``
    (the request's local policy, evaluated fleet-wide as the reference). A request whose
    global answer is already ``known`` (decided on the request path: enforce, a canary's
    share) is queued for its candidate and reference alone. On a route with a budget, ``units``:
    what the request cost (``request``'s cost) is counted with its comparison."""

    request: tuple[str | None, Policy | None, int, int]
    route: str
    key: str
    local_allowed: bool
    request_id: str
    candidate: CandidateItem | None = None
    ref: Policy | None = None
    known: Decision | None = None
    units: bool = False  # a budget route's: what it cost is counted with its comparison


def candidate_item(cand: tuple[str, Policy, str, float], lkey: str, cost: int, current: bool | None) -> CandidateItem:
    """A request's candidate evaluation, from its plan's ``cand`` (prefix, policy, id, the
    largest cost it admits) and the current global answer if known."""
    prefix, policy, cid, most = cand
    return CandidateItem(prefix + lkey, policy if cost <= most else None, cid, current)


class ShadowQueue:
    """The bounded queue between the request path and the shadow worker.

    A request appends without ever waiting (``offer`` says False when full); the one
    worker waits for work and takes it in batches. Leaner than ``asyncio.Queue``, which
    keeps getter/putter futures and task accounting that a single consumer does not need."""

    __slots__ = ("_queue", "_waiter", "maxsize")

    def __init__(self, maxsize: int) -> None:
        self._queue: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.maxsize = maxsize

    def __len__(self) -> int:
        return len(self._queue)

    def offer(self, item: Any) -> bool:
        """Append ``item``; False (nothing appended) when the queue is full."""
        q = self._queue
        if len(q) >= self.maxsize:
            return False
        q.append(item)
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)
        return True

    def take(self, n: int) -> list[Any]:
        """Up to ``n`` items, oldest first."""
        q = self._queue
        if len(q) <= n:
            batch = list(q)
            q.clear()
            return batch
        popleft = q.popleft
        return [popleft() for _ in range(n)]

    async def wait(self) -> None:
        """Until something is queued."""
        while not self._queue:
            w = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await w
            finally:
                if self._waiter is w:
                    self._waiter = None


class ShadowPipeline:
    """The queue, its worker and the evaluation of a batch."""

    def __init__(
        self,
        resilient: Any,
        comparisons: Comparisons,
        *,
        queue_size: int,
        batch_size: int,
        linger_s: float,
        explainer: Explainer | None = None,
    ):
        self.resilient = resilient
        self.comparisons = comparisons
        self.explainer = explainer  # None: nothing is explained (a ShadowItem's ref is ignored)
        self.queue = ShadowQueue(queue_size)
        self.batch_size = batch_size
        self.linger_s = linger_s

    def __len__(self) -> int:
        return len(self.queue)

    @property
    def capacity(self) -> int:
        return self.queue.maxsize

    def offer(self, item: ShadowItem) -> bool:
        """Queue a request's shadow evaluation; False when the queue is full (the caller
        counts the drop)."""
        return self.queue.offer(item)

    async def run(self) -> None:
        """The worker: evaluate what is queued, batch after batch, until cancelled."""
        q = self.queue
        metrics = self.comparisons.metrics
        while True:
            await q.wait()
            if self.linger_s and len(q) < self.batch_size:
                # off the hot path: a few ms of waiting turns many one-item round trips
                # into one pipelined batch, which leaves the event loop to the requests
                await asyncio.sleep(self.linger_s)
            # a backlog (a batch request queues hundreds at once) goes in bigger bursts:
            # one round trip for up to 4x the batch size costs less than four
            backlog = len(q)
            batch = q.take(self.batch_size if backlog <= self.batch_size else min(backlog, 4 * self.batch_size))
            metrics.shadow_queue.set(len(q))
            try:
                await self.evaluate(batch)
            except Exception:  # noqa: BLE001 - the shadow path must never die
                log.exception("shadow evaluation failed")

    async def drain(self) -> int:
        """Evaluate everything queued now (tests, benchmarks, shutdown); returns how many."""
        batch = self.queue.take(len(self.queue))
        if batch:
            await self.evaluate(batch)
        return len(batch)

    async def evaluate(self, batch: list[ShadowItem], *, timeout_s: float | None = None) -> list[bool | None]:
        """Redis's verdict on each queued request, compared with its local decision and
        counted per route at once (the would-be-blocked keys one by one); returns the
        verdicts (None: Redis failed, or did not answer within ``timeout_s``; or the item's
        global answer was already known). Candidate and reference evaluations go in the same
        burst (:meth:`_with_extras`)."""
        for item in batch:
            if item.candidate is not None or item.ref is not None:
                return await self._with_extras(batch, timeout_s)
        verdicts = await self._ask([item.request for item in batch], timeout_s)
        self._count(batch, verdicts)
        return verdicts

    async def _ask(self, requests: list[Any], timeout_s: float | None, full: set[int] | None = None) -> list[Any]:
        if full:
            return await self.resilient.compare_many(requests, timeout_s=timeout_s, decisions=full)  # type: ignore[no-any-return]
        if timeout_s is None:
            return await self.resilient.compare_many(requests)  # type: ignore[no-any-return]
        return await self.resilient.compare_many(requests, timeout_s=timeout_s)  # type: ignore[no-any-return]

    async def _with_extras(self, batch: list[ShadowItem], timeout_s: float | None) -> list[bool | None]:
        """A batch with candidate or reference evaluations: the global answers not known yet,
        the candidates' and the references' in one burst; then each pair compared and
        counted, each candidate against its current answer, each divergence by its cause."""
        # one pass, three groups sent one after another (each in order: its runs under one
        # policy stay whole): the global answers not known yet, the candidates', the references'
        mains: list[Any] = []
        cand_reqs: list[Any] = []
        ref_reqs: list[Any] = []
        main: dict[int, int] = {}  # batch index -> its request's index in its group
        cands: dict[int, int] = {}
        refs: dict[int, int] = {}
        explainer = self.explainer
        last_policy = last_ref = None
        need = False
        for i, item in enumerate(batch):
            request = item.request
            lkey, policy, cost, now_us = request
            if item.known is None and lkey is not None:
                main[i] = len(mains)
                mains.append(request)
            c = item.candidate
            if c is not None and c.policy is not None:
                cands[i] = len(cand_reqs)
                cand_reqs.append((c.key, c.policy, cost, now_us))
            ref = item.ref
            # the reference, where its answer can change a cause (one question per pair of policies)
            if ref is not None and explainer is not None and lkey is not None and policy is not None:
                if policy is not last_policy or ref is not last_ref:
                    last_policy, last_ref, need = policy, ref, needs_reference(policy, ref)
                if need:
                    refs[i] = len(ref_reqs)
                    ref_reqs.append((REFERENCE_PREFIX + lkey, ref, cost, now_us))
        full = explainer.first_requests(batch, main) if explainer is not None else None
        requests = mains + cand_reqs + ref_reqs
        results = await self._ask(requests, timeout_s, full) if requests else []
        n_main, n_cand = len(mains), len(cand_reqs)
        verdicts: list[bool | None] = [None] * len(batch)
        for i, j in main.items():
            r = results[j]
            if r.__class__ is Decision:
                assert explainer is not None
                explainer.learn(batch[i], r)
                r = r.allowed
            verdicts[i] = r
        self._count([batch[i] for i in main], [verdicts[i] for i in main])
        self._count_candidates(batch, verdicts, {i: results[n_main + j] for i, j in cands.items()})
        if explainer is not None:
            self._count_causes(batch, verdicts, {i: results[n_main + n_cand + j] for i, j in refs.items()})
        return verdicts

    def _count_causes(self, batch: list[ShadowItem], verdicts: list[bool | None], refs: dict[int, Any]) -> None:
        """Each explained divergence's cause, counted per route (and, for a new rejection,
        its key's, in the would-be-blocked view)."""
        explainer = self.explainer
        assert explainer is not None
        per: dict[str, dict[Cause, int]] = {}
        record = self.comparisons.blocked.record_cause
        for i, item in enumerate(batch):
            if item.ref is None:
                continue
            known = item.known
            glob = verdicts[i] if known is None else known.allowed
            if glob is None or glob == item.local_allowed:
                continue
            cause = explainer.cause(item, glob, refs.get(i))
            if cause is None:
                continue
            counts = per.setdefault(item.route, {})
            counts[cause] = counts.get(cause, 0) + 1
            if cause in FORWARD:
                record(item.route, item.key, cause)
        for route, counts in per.items():
            self.comparisons.causes_batch(route, counts)

    def _count_candidates(
        self, batch: list[ShadowItem], verdicts: list[bool | None], answers: dict[int, bool | None]
    ) -> None:
        """Each candidate's answer compared with the current global one, counted per route and id."""
        per: dict[tuple[str, str], list[int]] = {}  # (route, id) -> [agree, newly rejected, newly admitted, errors]
        blocked = self.comparisons.blocked.record
        for i, item in enumerate(batch):
            c = item.candidate
            if c is None:
                continue
            current = verdicts[i] if c.current is None else c.current
            mine = answers.get(i) if c.policy is not None else False
            counts = per.setdefault((item.route, c.id), [0, 0, 0, 0])
            if current is None or mine is None:
                counts[3] += 1
            elif current == mine:
                counts[0] += 1
            elif current:
                counts[1] += 1
                blocked(blocked_view_name(item.route), item.key, item.request_id)
            else:
                counts[2] += 1
        for (route, cid), (agree, rejected, admitted, errors) in per.items():
            self.comparisons.candidate_batch(route, cid, agree, rejected, admitted, errors)

    def _count(self, batch: list[ShadowItem], verdicts: list[bool | None]) -> None:
        """The shadow evaluations compared with their local decisions, counted per route."""
        # route -> [agree, ladd, ldda, backend errors], and on a budget route what each cost
        per_route: dict[str, list[int]] = {}
        units: dict[str, list[int]] = {}
        blocked = self.comparisons.blocked.record
        try:
            for item, dist_allowed in zip(batch, verdicts):
                route = item.route
                c = per_route.get(route)
                if c is None:
                    c = per_route[route] = [0, 0, 0, 0]
                if dist_allowed is None:
                    c[3] += 1
                    continue
                at = 0 if item.local_allowed == dist_allowed else 2 if dist_allowed else 1
                c[at] += 1
                cost = None
                if item.units:
                    cost = int(item.request[2])
                    u = units.get(route)
                    if u is None:
                        u = units[route] = [0, 0, 0]
                    u[at] += cost
                if at == 1:
                    blocked(route, item.key, item.request_id, units=cost)
        finally:
            for route, (agree, ladd, ldda, errors) in per_route.items():
                self.comparisons.evaluated_batch(route, agree, ladd, ldda, errors, units.get(route))
