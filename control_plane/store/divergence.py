"""Fleet-wide divergence counters: per route and minute, shared by every replica.

Keys: ``rl:<ns>:div:<route>:<minute>``, hashes of :data:`DIVERGENCE_FIELDS`, the divergent
decisions per cause (:data:`CAUSE_FIELDS`), on a route with a budget what the compared
requests cost (:data:`UNIT_FIELDS`), and a candidate limit's counters (no hash tag:
they spread over the cluster; EXPIRE :data:`DIVERGENCE_TTL_S`). :func:`totals_of` and
:func:`gate_stats_of` sum rows as :meth:`DivergenceStore.series` returns them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from ..model.causes import EXCUSED, Cause
from ..model.rollout import Divergence, GateStats
from ..model.units import units_field
from .codec import check_namespace, text
from .errors import StoreError, translate_errors

__all__ = [
    "CANDIDATE_COUNTS", "CAUSE_FIELDS", "DIVERGENCE_FIELDS", "DIVERGENCE_TTL_S", "UNIT_FIELDS", "DivergenceStore",
    "candidate_stats_of", "cause_field", "gate_stats_of", "totals_of", "units_field",
]  # fmt: skip

log = logging.getLogger(__name__)

DIVERGENCE_TTL_S = 2 * 3600
DIVERGENCE_FIELDS = (
    "agree",
    "local_allow_distributed_deny",
    "local_deny_distributed_allow",
    "compared",
    "backend_errors",
    "distributed_attempts",
    "shadow_dropped",
)

#: the divergent decisions per cause (DivergenceStore.add_causes; control_plane/model/causes.py)
CAUSE_FIELDS = tuple(f"cause_{c.value}" for c in Cause)


def cause_field(cause: Cause) -> str:
    """The counter of ``cause`` in a route's minute (``cause_replicas``, ...)."""
    return f"cause_{cause.value}"


#: what the compared requests of a budget route cost, per class (DivergenceStore.add_units)
UNIT_FIELDS = tuple(units_field(d, estimated=e) for e in (False, True) for d in Divergence)


#: a candidate limit's counters (DivergenceStore.add_candidate), field ``c:<candidate id>:<name>``
CANDIDATE_COUNTS = ("agree", "newly_rejected", "newly_admitted", "errors", "dropped")

_F_AGREE, _F_LADD, _F_LDDA, _F_CMP, _F_ERR, _F_ATT, _F_DROP = range(7)
_DIV_INDEX = {
    Divergence.AGREE: _F_AGREE,
    Divergence.LOCAL_ALLOW_DISTRIBUTED_DENY: _F_LADD,
    Divergence.LOCAL_DENY_DISTRIBUTED_ALLOW: _F_LDDA,
}


def _minute(t: float) -> int:
    return int(t // 60) * 60


class DivergenceStore:
    """Per-route, per-minute divergence counters shared by every replica.

    Each replica ``record``\\ s only its own decisions in memory (sync, O(1), no IO)
    and ``flush``\\ es the deltas with HINCRBY into ``rl:<ns>:div:<route>:<minute>``
    -- so fleet totals are the plain sum, nothing is counted twice. The reads
    (``series``, ``window_stats``, ``totals``) are pure Redis: this replica's
    unflushed deltas (at most one flush interval, 1 s by default) are not included.

    Delivery: a failed flush puts its deltas back (``StoreUnavailable`` is raised)
    so nothing is lost; a command that Redis applied but whose reply was lost (a
    connection cut mid-pipeline) is therefore counted again -- at-least-once.

    ``clock`` (wall-clock seconds) places a call given no ``now`` in its minute.
    """

    def __init__(self, client: Any, namespace: str = "shadowlimit", *, clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.namespace = check_namespace(namespace)
        #: wall-clock seconds, read when a call is given no ``now``
        self.clock = clock
        self._prefix = f"rl:{namespace}:div:"
        self._pending: dict[tuple[str, int], list[int]] = {}
        # counters of other names in the same hashes (a candidate limit's: add_candidate)
        self._extra: dict[tuple[str, int], dict[str, int]] = {}

    def key(self, route: str, minute: int) -> str:
        return f"{self._prefix}{route}:{minute}"

    # -- hot path --------------------------------------------------------------

    def record(
        self,
        route: str,
        divergence: Divergence | None,
        *,
        backend_error: bool = False,
        distributed_attempt: bool = False,
        now: float | None = None,
    ) -> None:
        """Count one decision. ``divergence`` is the comparison result (``None`` when
        there was nothing to compare, e.g. the distributed call failed). A backend
        error always counts as a distributed attempt too."""
        slot = (route, _minute(self.clock() if now is None else now))
        c = self._pending.get(slot)
        if c is None:
            c = self._pending[slot] = [0, 0, 0, 0, 0, 0, 0]
        if divergence is not None:
            c[_DIV_INDEX[divergence]] += 1
            c[_F_CMP] += 1
        if backend_error:
            c[_F_ERR] += 1
            c[_F_ATT] += 1
        elif distributed_attempt:
            c[_F_ATT] += 1

    def add(
        self,
        route: str,
        *,
        agree: int = 0,
        ladd: int = 0,
        ldda: int = 0,
        backend_errors: int = 0,
        dropped: int = 0,
        now: float | None = None,
    ) -> None:
        """Count many decisions of one route at once, as that many :meth:`record` calls
        would: ``agree``, ``ladd`` (local allow, distributed deny) and ``ldda`` compared
        pairs, ``backend_errors`` distributed calls that failed, and ``dropped`` shadow
        evaluations dropped (the queue was full): decisions never compared, so the
        figures are a sample (see ``sampled_share``)."""
        slot = (route, _minute(self.clock() if now is None else now))
        c = self._pending.get(slot)
        if c is None:
            c = self._pending[slot] = [0, 0, 0, 0, 0, 0, 0]
        compared = agree + ladd + ldda
        c[_F_AGREE] += agree
        c[_F_LADD] += ladd
        c[_F_LDDA] += ldda
        c[_F_CMP] += compared
        c[_F_ERR] += backend_errors
        c[_F_ATT] += compared + backend_errors
        c[_F_DROP] += dropped

    def add_candidate(
        self,
        route: str,
        cid: str,
        *,
        agree: int = 0,
        newly_rejected: int = 0,
        newly_admitted: int = 0,
        errors: int = 0,
        dropped: int = 0,
        now: float | None = None,
    ) -> None:
        """Count comparisons of ``route``'s candidate limit ``cid`` with its current limit
        (see :mod:`control_plane.model.candidate`), in the route's hashes under the
        candidate's own field names (:func:`candidate_fields`)."""
        slot = (route, _minute(self.clock() if now is None else now))
        extra = self._extra.get(slot)
        if extra is None:
            extra = self._extra[slot] = {}
        for name, n in (
            ("agree", agree), ("newly_rejected", newly_rejected), ("newly_admitted", newly_admitted),
            ("errors", errors), ("dropped", dropped),
        ):  # fmt: skip
            if n:
                f = f"c:{cid}:{name}"
                extra[f] = extra.get(f, 0) + n

    def add_causes(self, route: str, counts: dict[Cause, int], *, now: float | None = None) -> None:
        """Count divergent decisions of ``route`` by cause (:data:`CAUSE_FIELDS`)."""
        slot = (route, _minute(self.clock() if now is None else now))
        extra = self._extra.get(slot)
        if extra is None:
            extra = self._extra[slot] = {}
        for cause, n in counts.items():
            if n:
                f = cause_field(cause)
                extra[f] = extra.get(f, 0) + n

    def add_units(
        self, route: str, divergence: Divergence, units: int, *, estimated: int = 0, now: float | None = None
    ) -> None:
        """Count what compared requests of one class cost (:func:`units_field`): ``units`` in
        all, ``estimated`` of them at an estimate. A settle corrects its reservation's minute
        (``now``: when it was made) by the actual cost less the estimate, and takes the
        estimate back out of ``estimated`` (a negative ``estimated``)."""
        slot = (route, _minute(self.clock() if now is None else now))
        extra = self._extra.get(slot)
        if extra is None:
            extra = self._extra[slot] = {}
        if units:
            f = units_field(divergence)
            extra[f] = extra.get(f, 0) + units
        if estimated:
            f = units_field(divergence, estimated=True)
            extra[f] = extra.get(f, 0) + estimated

    def pending(self) -> dict[tuple[str, int], dict[str, int]]:
        """Unflushed deltas (a copy), keyed by (route, minute)."""
        return {k: dict(zip(DIVERGENCE_FIELDS, v)) for k, v in self._pending.items()}

    def _merge_back(self, slot: tuple[str, int], index: int | str, delta: int) -> None:
        if isinstance(index, str):
            extra = self._extra.setdefault(slot, {})
            extra[index] = extra.get(index, 0) + delta
            return
        c = self._pending.get(slot)
        if c is None:
            c = self._pending[slot] = [0, 0, 0, 0, 0, 0, 0]
        c[index] += delta

    def _plan(
        self, pipe: Any, batch: dict[tuple[str, int], list[int]], extras: dict[tuple[str, int], dict[str, int]]
    ) -> list[tuple[tuple[str, int], int | str, int] | None]:
        """The HINCRBYs (and an EXPIRE per hash) of the deltas, queued on ``pipe``; what each
        command adds, in order (None for an EXPIRE)."""
        plan: list[tuple[tuple[str, int], int | str, int] | None] = []
        for slot in {**batch, **extras}:
            key = self.key(*slot)
            counts = batch.get(slot)
            for i, name in enumerate(DIVERGENCE_FIELDS):
                if counts and counts[i]:
                    pipe.hincrby(key, name, counts[i])
                    plan.append((slot, i, counts[i]))
            for name, n in extras.get(slot, {}).items():
                pipe.hincrby(key, name, n)
                plan.append((slot, name, n))
            pipe.expire(key, DIVERGENCE_TTL_S)
            plan.append(None)
        return plan

    async def flush(self) -> int:
        """Write the accumulated deltas to Redis (one non-transactional pipeline).
        Returns the number of (route, minute) hashes written. On failure the deltas
        not known to be applied are kept and :class:`StoreUnavailable` /
        :class:`StoreError` is raised."""
        batch, self._pending = self._pending, {}
        extras, self._extra = self._extra, {}
        if not batch and not extras:
            return 0
        pipe = self.client.pipeline(transaction=False)
        plan = self._plan(pipe, batch, extras)
        done = False
        try:
            with translate_errors("flush divergence counters"):
                results = await pipe.execute(raise_on_error=False)
            done = True
        finally:
            if not done:  # nothing known to be applied: keep every delta
                for item in plan:
                    if item is not None:
                        self._merge_back(*item)
            with contextlib.suppress(Exception):
                await pipe.reset()
        failed: list[BaseException] = []
        for item, res in zip(plan, results):
            if isinstance(res, BaseException):
                failed.append(res)
                if item is not None:
                    self._merge_back(*item)
        if failed:
            with translate_errors("flush divergence counters"):
                raise failed[0]
        return len(set(batch) | set(extras))

    async def run(self, interval_s: float = 1.0) -> None:
        """Flush every ``interval_s`` until cancelled; errors are logged, not raised.
        On cancellation one last flush is attempted (bounded to 1 s)."""
        try:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await self.flush()
                except StoreError as exc:
                    log.warning("divergence flush failed (deltas kept): %s", exc)
                except Exception:  # noqa: BLE001 - the loop must survive
                    log.exception("divergence flush failed")
        except asyncio.CancelledError:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.flush(), 1.0)
            raise

    # -- reads ---------------------------------------------------------------

    async def _read(self, route: str, minutes: list[int]) -> list[dict[str, int]]:
        pipe = self.client.pipeline(transaction=False)
        for m in minutes:
            pipe.hgetall(self.key(route, m))
        try:
            with translate_errors("read divergence counters"):
                rows = await pipe.execute()
        finally:
            with contextlib.suppress(Exception):
                await pipe.reset()
        out = []
        for m, raw in zip(minutes, rows):
            d = {text(k): int(v) for k, v in (raw or {}).items()}
            out.append({"minute": m, **{f: d.get(f, 0) for f in (*DIVERGENCE_FIELDS, *CAUSE_FIELDS, *UNIT_FIELDS)}})
        return out

    async def series(self, route: str, minutes: int = 60, now: float | None = None) -> list[dict[str, int]]:
        """Fleet-wide counts of the last ``minutes`` minutes (the current one
        included), oldest first, zeros for minutes without data."""
        if minutes <= 0:
            return []
        cur = _minute(self.clock() if now is None else now)
        return await self._read(route, [cur - 60 * i for i in range(minutes - 1, -1, -1)])

    async def candidate_series(
        self, route: str, cid: str, since: float, now: float | None = None, max_minutes: int = 120
    ) -> list[dict[str, int]]:
        """The fleet-wide comparisons of ``route``'s candidate ``cid`` per minute since the
        minute of ``since`` (at most ``max_minutes``, the counters' lifetime), oldest first:
        ``agree``, ``newly_rejected``, ``newly_admitted``, ``errors``, ``dropped``."""
        cur = _minute(self.clock() if now is None else now)
        first = max(_minute(since), cur - 60 * (max_minutes - 1))
        minutes = list(range(first, cur + 1, 60))
        names = [f"c:{cid}:{n}" for n in CANDIDATE_COUNTS]
        pipe = self.client.pipeline(transaction=False)
        for m in minutes:
            pipe.hmget(self.key(route, m), names)
        try:
            with translate_errors("read candidate counters"):
                rows = await pipe.execute()
        finally:
            with contextlib.suppress(Exception):
                await pipe.reset()
        return [
            {"minute": m, **{n: int(v or 0) for n, v in zip(CANDIDATE_COUNTS, row or [])}}
            for m, row in zip(minutes, rows)
        ]

    async def window_stats(self, route: str, window_s: float, now: float | None = None) -> GateStats:
        """Gate figures over the minutes covering ``[now - window_s, now]`` (whole
        minutes: the first may start up to 59 s before the window)."""
        t = self.clock() if now is None else now
        minutes = max(1, (_minute(t) - _minute(t - window_s)) // 60 + 1)
        rows = await self.series(route, minutes, now=t)
        return gate_stats_of(rows)

    async def totals(self, route: str, minutes: int = 60, now: float | None = None) -> dict[str, Any]:
        """Sums over :meth:`series` plus ``new_rejection_rate``, ``reverse_rate``
        (local_deny_distributed_allow / compared) and ``backend_error_rate``
        (backend_errors / distributed_attempts); rates are 0.0 without samples."""
        return totals_of(await self.series(route, minutes, now=now), minutes)


def totals_of(rows: list[dict[str, int]], minutes: int) -> dict[str, Any]:
    """Sum per-minute rows (as :meth:`DivergenceStore.series` returns) and add the rates
    and ``sampled_share``: the share of the decisions that should have been compared
    that the distributed limiter did evaluate (1.0 unless shadow evaluations were
    dropped; None with no decisions at all)."""
    s: dict[str, Any] = {f: sum(r.get(f, 0) for r in rows) for f in (*DIVERGENCE_FIELDS, *CAUSE_FIELDS, *UNIT_FIELDS)}
    cmp, att = s["compared"], s["distributed_attempts"]
    s["minutes"] = minutes
    s["new_rejection_rate"] = s["local_allow_distributed_deny"] / cmp if cmp else 0.0
    s["reverse_rate"] = s["local_deny_distributed_allow"] / cmp if cmp else 0.0
    s["backend_error_rate"] = s["backend_errors"] / att if att else 0.0
    s["sampled_share"] = gate_stats_of(rows).sampled_share
    return s


def candidate_stats_of(rows: list[dict[str, int]]) -> GateStats:
    """A candidate's comparisons (rows as :meth:`DivergenceStore.candidate_series` returns)
    as the gate's figures: newly rejected are its new rejections."""
    s = {n: sum(r.get(n, 0) for r in rows) for n in CANDIDATE_COUNTS}
    compared = s["agree"] + s["newly_rejected"] + s["newly_admitted"]
    return GateStats(
        compared=compared,
        new_rejections=s["newly_rejected"],
        backend_errors=s["errors"],
        distributed_attempts=compared + s["errors"],
        shadow_dropped=s["dropped"],
    )


def gate_stats_of(rows: list[dict[str, int]]) -> GateStats:
    """The rollout gate's figures from per-minute rows (as :meth:`DivergenceStore.series` returns):
    ``excused``, the new rejections explained by a cause in :data:`~control_plane.model.causes.EXCUSED`."""
    s = {f: sum(r.get(f, 0) for r in rows) for f in (*DIVERGENCE_FIELDS, *UNIT_FIELDS)}
    return GateStats(
        compared=s["compared"],
        new_rejections=s["local_allow_distributed_deny"],
        backend_errors=s["backend_errors"],
        distributed_attempts=s["distributed_attempts"],
        shadow_dropped=s["shadow_dropped"],
        excused=sum(r.get(cause_field(c), 0) for r in rows for c in EXCUSED),
        units_compared=sum(s[units_field(d)] for d in Divergence),
        units_new_rejections=s[units_field(Divergence.LOCAL_ALLOW_DISTRIBUTED_DENY)],
    )
