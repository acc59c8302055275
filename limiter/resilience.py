"""What happens when Redis fails: circuit breaker, failure policies, recovery, fleet share.

:class:`CircuitBreaker` (in :mod:`limiter.breaker`, re-exported here)
is a pure state machine (clock and randomness injected). :class:`ResilientLimiter` puts
it in front of a :class:`~limiter.redis_limiter.RedisLimiter` and answers every request
even while Redis is down, as the failure policy says:

- ``passThrough``: allow everything;
- ``failClosed``: reject everything with the configured status (default 429);
- ``inMemoryFallback``: decide with a local limiter, enforcing the policy divided by
  the number of live instances last seen in Redis (never below 1 token of burst), so
  an outage does not multiply the limit by the replica count.

Recovery: once the breaker opens, a background probe PINGs Redis after
1 s, 2 s, 4 s ... up to 30 s, each with 0..delay of random jitter; a successful probe
moves the breaker to half-open, and the next real request that succeeds closes it.
``failClosed`` recovers too: waiting for an operator turns a Redis
blip into a full outage.

A cost of 0 is a peek (what a request of cost 1 would get, nothing spent) everywhere:
in Redis by the peek scripts, in the fallback by :class:`LocalLimiter`'s peek. A
:meth:`Policy.blocking` policy needs no store: it is denied whatever the breaker says,
and its answers neither open nor close the breaker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal, cast

from .breaker import BreakerSnapshot, BreakerState, CircuitBreaker
from .errors import BackendError, DeadlineExceeded
from .local import LocalLimiter
from .policy import Algorithm, Charge, Decision, Policy, make_decision, validate_cost
from .redis_limiter import RedisLimiter
from .resilient_booked import ResilientBooked
from .resp import encode_command

__all__ = [
    "BreakerSnapshot",
    "BreakerState",
    "CircuitBreaker",
    "FailurePolicy",
    "FleetMembership",
    "Outcome",
    "ResilientLimiter",
    "fleet_share",
]

log = logging.getLogger("shadowlimit.resilience")


class FailurePolicy(str, Enum):
    """What a decision does while Redis is down."""

    PASS_THROUGH = "passThrough"
    FAIL_CLOSED = "failClosed"
    IN_MEMORY_FALLBACK = "inMemoryFallback"

    @classmethod
    def parse(cls, value: str | FailurePolicy) -> FailurePolicy:
        if isinstance(value, FailurePolicy):
            return value
        norm = str(value).replace("_", "").replace("-", "").lower()
        for p in cls:
            if p.value.lower() == norm:
                return p
        raise ValueError(f"failure_policy: must be one of passThrough, failClosed, inMemoryFallback, got {value!r}")


Source = Literal["distributed", "fallback", "pass_through", "fail_closed", "skipped"]
Deadline = Literal["redis_timeout", "no_time"]
#: the least time worth sending to Redis (less: the failure policy answers at once)
MIN_TRY_S = 0.001
_SKIPPED = make_decision(True, 0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A decision and where it came from."""

    decision: Decision
    source: Source
    error: str | None = None
    status_code: int = 429
    #: why the failure policy answered for want of time: ``redis_timeout`` (Redis did not
    #: answer within the caller's deadline) or ``no_time`` (too little was left to ask it)
    deadline: Deadline | None = None

    @property
    def allowed(self) -> bool:
        return self.decision.allowed


def _cost(policy: Policy, cost: object) -> int:
    """:func:`validate_cost`, with an int 0 (a peek) let through."""
    if type(cost) is int and cost == 0:
        return 0
    return validate_cost(policy, cost)


def fleet_share(policy: Policy, instances: int) -> Policy:
    """The policy one of ``instances`` replicas enforces alone: rate and burst divided,
    never below 1 token of burst (or 1 request per window). A blocking policy stays one."""
    if instances <= 1 or policy.unlimited or policy.blocked:
        return policy
    avg = policy.average / instances
    if Algorithm(policy.algorithm).windowed:
        avg = max(1.0, math.floor(avg))
    return Policy(
        average=avg,
        period=policy.period,
        burst=max(1, int(policy.burst_f) // instances),
        algorithm=policy.algorithm,
    )


#: the state formats this release reads (its fleet record, before the beat's stamp)
READS = "1 2"


def _stamp(record: list[str]) -> int:
    """The stamp (ms) of a fleet record (formats, then the beat's time); 0 when it has none."""
    return int(record[-1]) if record and record[-1].isdigit() and len(record) > 1 else 0


class FleetMembership:
    """Each instance's heartbeat in one sorted set: ``rl:<ns>:fleet`` (score = last beat, ms).

    ``live_instances`` is the number of members that beat within ``stale_after_s``,
    as last read from Redis; it is kept while Redis is down, which is the point.
    ``wall_clock`` (Unix seconds) stamps the beats: every replica compares its clock
    with the others' stamps, so it must be the wall clock, not a monotonic one.

    ``joins=False`` (a replica whose kill switch keeps Redis off its request path) only
    reads the set: it takes no share of the global limit, so it must not shrink the
    others' fallback share by counting as live.

    The fleet's state formats (docs/state-format.md): each joining instance also records the
    formats it reads, with its beat's time, in ``rl:<ns>:fleet:reads``; a member missing there,
    or whose record lags its heartbeat by more than two beats, runs a release that reads only
    the hash (format 1). ``state_format="auto"`` has the limiter write the compact form (2)
    only while every live member reads it, and the hash otherwise (and once the fleet has gone
    unread for ``stale_after_s``); ``1`` or ``2`` pins it (the limiter is left as it was built).
    """

    def __init__(
        self,
        redis: RedisLimiter,
        *,
        instance_id: str | None = None,
        interval_s: float = 2.0,
        stale_after_s: float | None = None,
        wall_clock: Callable[[], float] = time.time,
        joins: bool = True,
        state_format: str = "auto",
    ) -> None:
        if state_format not in ("auto", "1", "2"):
            raise ValueError(f"state_format: must be auto, 1 or 2, got {state_format!r}")
        self.redis = redis
        self.state_format = state_format
        self.reads_key = f"rl:{redis.namespace}:fleet:reads".encode()
        #: whether every live member reads the compact form, as last read (None: not read yet)
        self.all_read_compact: bool | None = None
        self._formats_read_at: float | None = None
        self.wall_clock = wall_clock
        self.joins = joins
        self.instance_id = instance_id or uuid.uuid4().hex[:12]
        self.interval_s = interval_s
        self.stale_after_s = stale_after_s if stale_after_s is not None else interval_s * 3
        self.key = f"rl:{redis.namespace}:fleet".encode()
        self.live_instances = 1
        self.members: list[str] = []
        self.last_beat_ok: float | None = None
        self._task: asyncio.Task[None] | None = None

    async def beat(self) -> int:
        """One heartbeat: record this instance, drop stale ones, read the live count."""
        now_ms = int(self.wall_clock() * 1000)
        b = self.redis.backend
        if self.joins:
            await b.call(self.key, encode_command("ZADD", self.key, now_ms, self.instance_id))
        await b.call(
            self.key, encode_command("ZREMRANGEBYSCORE", self.key, "-inf", now_ms - int(self.stale_after_s * 1000))
        )
        if self.joins:
            await b.call(self.key, encode_command("PEXPIRE", self.key, int(self.stale_after_s * 1000) * 2))
        members = await b.call(self.key, encode_command("ZRANGE", self.key, 0, -1, "WITHSCORES"))
        if not isinstance(members, list):
            raise BackendError(f"fleet heartbeat: unexpected reply {members!r}")
        beats = {members[i].decode(): int(float(members[i + 1])) for i in range(0, len(members), 2)}
        self.members = sorted(beats)
        self.live_instances = max(1, len(self.members))
        await self._formats(now_ms, beats)
        self.last_beat_ok = self.wall_clock()
        return self.live_instances

    async def _formats(self, now_ms: int, beats: dict[str, int]) -> None:
        """Record the formats this instance reads (with this beat's stamp), forget the records
        of instances gone a while, and (auto) write the compact form only while every live
        member's record is its own: one whose stamp keeps pace with the member's last beat. A
        record that falls behind was left by a process gone; the one beating now under the
        same id (a release before the compact form, which records nothing) reads only hashes."""
        b, key = self.redis.backend, self.reads_key
        if self.joins:
            await b.call(key, encode_command("HSET", key, self.instance_id, f"{READS} {now_ms}"))
            await b.call(key, encode_command("PEXPIRE", key, int(self.stale_after_s * 1000) * 2))
        raw = await b.call(key, encode_command("HGETALL", key))
        if not isinstance(raw, list):
            raise BackendError(f"fleet formats: unexpected reply {raw!r}")
        reads = {raw[i].decode(): raw[i + 1].decode().split() for i in range(0, len(raw), 2)}
        stale_ms = int(self.stale_after_s * 1000)
        gone = [m for m, rec in reads.items() if m not in beats and now_ms - _stamp(rec) > stale_ms]
        if gone and self.joins:
            await b.call(key, encode_command("HDEL", key, *gone))
        pace_ms = int(self.interval_s * 2000)  # a record may lag its member's beat by one beat
        self.all_read_compact = all(
            "2" in reads.get(m, ())[:-1] and at - _stamp(reads[m]) <= pace_ms for m, at in beats.items()
        )
        self._formats_read_at = self.wall_clock()
        if self.state_format == "auto":
            self.redis.set_state_format(2 if self.all_read_compact else 1)

    def _fleet_unread(self) -> None:
        """A beat failed: once the fleet has gone unread for ``stale_after_s`` (a replica of an
        older release may have joined meanwhile), auto writes the hash again."""
        read_at = self._formats_read_at
        if self.state_format == "auto" and (read_at is None or self.wall_clock() - read_at > self.stale_after_s):
            self.all_read_compact = None
            self.redis.set_state_format(1)

    async def leave(self) -> None:
        with contextlib.suppress(BackendError, OSError):
            await self.redis.backend.call(self.key, encode_command("ZREM", self.key, self.instance_id))
        if self.joins:
            with contextlib.suppress(BackendError, OSError):
                await self.redis.backend.call(self.reads_key, encode_command("HDEL", self.reads_key, self.instance_id))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.beat()
            except (BackendError, OSError) as exc:
                log.debug("fleet heartbeat failed: %s", exc)
                self._fleet_unread()
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.leave()


class ResilientLimiter(ResilientBooked):
    """A :class:`RedisLimiter` behind a circuit breaker, with a failure policy."""

    def __init__(
        self,
        redis: RedisLimiter,
        *,
        failure_policy: FailurePolicy | str = FailurePolicy.IN_MEMORY_FALLBACK,
        failure_code: int = 429,
        fallback: LocalLimiter | None = None,
        breaker: CircuitBreaker | None = None,
        fleet: FleetMembership | None = None,
    ) -> None:
        if not 400 <= failure_code <= 599:
            raise ValueError(f"failure_code: must be an HTTP error status (400-599), got {failure_code!r}")
        self.redis = redis
        self.failure_policy = FailurePolicy.parse(failure_policy)
        self.failure_code = failure_code
        self.fallback = fallback if fallback is not None else LocalLimiter()
        self.breaker = breaker if breaker is not None else CircuitBreaker(trial_half_opens=False)
        self.fleet = fleet
        self._shares: dict[tuple[Policy, int], Policy] = {}
        self._probe_task: asyncio.Task[None] | None = None
        self.fallback_decisions = 0
        self.backend_errors = 0

    @property
    def live_instances(self) -> int:
        return self.fleet.live_instances if self.fleet is not None else 1

    def shared_policy(self, policy: Policy) -> Policy:
        n = self.live_instances
        k = (policy, n)
        p = self._shares.get(k)
        if p is None:
            if len(self._shares) > 4096:
                self._shares.clear()
            p = self._shares[k] = fleet_share(policy, n)
        return p

    async def check(
        self,
        key: str,
        policy: Policy,
        cost: int = 1,
        now_us: int | None = None,
        *,
        failure_policy: FailurePolicy | None = None,
        failure_code: int | None = None,
        timeout_s: float | None = None,
    ) -> Outcome:
        """Decide in Redis when the breaker allows, else by the failure policy.

        ``cost=0`` is a peek (nothing spent, in Redis or in the fallback); a blocking policy
        is denied without Redis and without the breaker. ``timeout_s`` is what is left of the
        caller's deadline: Redis not answering within it is a failure (the breaker learns
        it) answered by the failure policy in time; less than :data:`MIN_TRY_S` is answered
        by the failure policy at once (not Redis's fault: the breaker is not told)."""
        cost = _cost(policy, cost)
        if policy.blocked:
            return Outcome(await self.redis.check(key, policy, cost, now_us), "distributed")
        if timeout_s is not None and timeout_s < MIN_TRY_S:
            return self._no_time(key, policy, cost, now_us, failure_policy, failure_code)
        if self.breaker.allow_request():
            try:
                if timeout_s is None:
                    d = await self.redis.check(key, policy, cost, now_us)
                else:
                    d = await self.redis.check(key, policy, cost, now_us, timeout_s=timeout_s)
            except BaseException as exc:
                if not isinstance(exc, BackendError):
                    self.breaker.abandon_trial()
                    raise
                self.backend_errors += 1
                self.breaker.record_failure(exc)
                self._ensure_prober()
                late: Deadline | None = "redis_timeout" if isinstance(exc, DeadlineExceeded) else None
                return self._degraded(
                    key, policy, cost, now_us, error=str(exc), failure_policy=failure_policy,
                    failure_code=failure_code, deadline=late,
                )  # fmt: skip
            self.breaker.record_success()
            return Outcome(d, "distributed")
        self._ensure_prober()
        return self._degraded(
            key, policy, cost, now_us, error=self.breaker.last_error or "circuit open", failure_policy=failure_policy,
            failure_code=failure_code,
        )  # fmt: skip

    async def check_many(
        self,
        requests: Sequence[tuple[str, Policy, int, int | None]],
        *,
        overrides: Sequence[tuple[FailurePolicy | None, int | None]] | None = None,
        degrade: bool = True,
        timeout_s: float | None = None,
    ) -> list[Outcome]:
        """Many decisions in one pipelined burst; per-item fallback on failure.

        ``overrides`` gives each item's own (failure policy, failure code), if any.
        With ``degrade=False`` (shadow evaluation) a failed item is not decided by the
        failure policy at all: its outcome has source ``"skipped"``. A cost of 0 is a
        peek; blocking policies are answered without Redis or the breaker. ``timeout_s``:
        as for :meth:`check`, for the whole burst."""
        ov = overrides if overrides is not None else [(None, None)] * len(requests)
        if any(r[1].blocked for r in requests):
            return await self._many_with_blocked(requests, ov, degrade, timeout_s)
        if timeout_s is not None and timeout_s < MIN_TRY_S and degrade:
            return [self._no_time(k, p, _cost(p, c), n, fp, fc) for (k, p, c, n), (fp, fc) in zip(requests, ov)]
        if not self.breaker.allow_request():
            self._ensure_prober()
            err = self.breaker.last_error or "circuit open"
            if not degrade:
                return [Outcome(_SKIPPED, "skipped", err) for _ in requests]
            return [
                self._degraded(k, p, _cost(p, c), n, error=err, failure_policy=fp, failure_code=fc)
                for (k, p, c, n), (fp, fc) in zip(requests, ov)
            ]
        try:
            if timeout_s is None:
                results = await self.redis.check_many(requests)
            else:
                results = await self.redis.check_many(requests, timeout_s=timeout_s)
        except BaseException:
            self.breaker.abandon_trial()
            raise
        out: list[Outcome] = []
        failed = False
        for (k, p, c, n), r, (fp, fc) in zip(requests, results, ov):
            if isinstance(r, Decision):
                out.append(Outcome(r, "distributed"))
            else:
                failed = True
                self.backend_errors += 1
                late: Deadline | None = "redis_timeout" if isinstance(r, DeadlineExceeded) else None
                out.append(
                    self._degraded(k, p, c, n, error=str(r), failure_policy=fp, failure_code=fc, deadline=late)
                    if degrade
                    else Outcome(_SKIPPED, "skipped", str(r), 429, late)
                )
        if failed:
            self.breaker.record_failure(next(r for r in results if not isinstance(r, Decision)))
            self._ensure_prober()
        else:
            self.breaker.record_success()
        return out

    async def _many_with_blocked(
        self,
        requests: Sequence[tuple[str, Policy, int, int | None]],
        ov: Sequence[tuple[FailurePolicy | None, int | None]],
        degrade: bool,
        timeout_s: float | None = None,
    ) -> list[Outcome]:
        """:meth:`check_many` for a batch with blocking policies: those are denied here (no
        store, whatever the breaker says, and no breaker success or failure); the rest go
        through :meth:`check_many` as a batch of their own."""
        out: list[Outcome | None] = [None] * len(requests)
        rest: list[int] = []
        for i, (k, p, c, n) in enumerate(requests):
            if p.blocked:
                out[i] = Outcome(await self.redis.check(k, p, _cost(p, c), n), "distributed")
            else:
                rest.append(i)
        if rest:
            sub = await self.check_many(
                [requests[i] for i in rest], overrides=[ov[i] for i in rest], degrade=degrade, timeout_s=timeout_s
            )
            for i, o in zip(rest, sub):
                out[i] = o
        return cast("list[Outcome]", out)

    async def compare_many(
        self,
        requests: Sequence[tuple[str, Policy, int, int | None]],
        *,
        timeout_s: float | None = None,
        decisions: Collection[int] = (),
    ) -> list[bool | Decision | None]:
        """Shadow evaluation: Redis's verdict on each request (``True`` allowed), its
        :class:`Decision` for the indexes in ``decisions``, or ``None`` where it could not
        give one (breaker open, the call failed, or it did not answer within ``timeout_s``).
        Nothing is degraded to the failure policy; failures are counted and feed the breaker
        as in :meth:`check_many`. A blocking policy's verdict is ``False`` without Redis
        (in ``decisions`` too: the verdict is the whole answer)."""
        if any(r[1].blocked for r in requests):
            return await self._compare_with_blocked(requests, timeout_s, decisions)
        if timeout_s is not None and timeout_s < MIN_TRY_S:
            return [None] * len(requests)
        if not self.breaker.allow_request():
            self._ensure_prober()
            return [None] * len(requests)
        try:
            if decisions:
                results = await self.redis.allowed_many(requests, timeout_s=timeout_s, decisions=decisions)
            elif timeout_s is None:
                results = await self.redis.allowed_many(requests)
            else:
                results = await self.redis.allowed_many(requests, timeout_s=timeout_s)
        except BaseException:
            self.breaker.abandon_trial()
            raise
        error: BackendError | None = None
        for r in results:
            if type(r) is not bool and type(r) is not Decision:
                error = cast("BackendError", r)
                break
        if error is None:
            self.breaker.record_success()
            return cast("list[bool | Decision | None]", results)  # every item is an answer: no copy needed
        out: list[bool | Decision | None] = []
        for r in results:
            if type(r) is bool or type(r) is Decision:
                out.append(r)
            else:
                self.backend_errors += 1
                out.append(None)
        self.breaker.record_failure(error)
        self._ensure_prober()
        return out

    async def _compare_with_blocked(
        self,
        requests: Sequence[tuple[str, Policy, int, int | None]],
        timeout_s: float | None,
        decisions: Collection[int],
    ) -> list[bool | Decision | None]:
        """:meth:`compare_many` for a batch with blocking policies (False, without Redis)."""
        verdicts: list[bool | Decision | None] = [False] * len(requests)
        rest: list[int] = []
        for i, (_, p, c, _n) in enumerate(requests):
            if p.blocked:
                _cost(p, c)  # an invalid cost raises, as allowed_many would
            else:
                rest.append(i)
        if rest:
            sub = [k for k, i in enumerate(rest) if i in decisions]
            answers = await self.compare_many([requests[i] for i in rest], timeout_s=timeout_s, decisions=sub)
            for i, v in zip(rest, answers):
                verdicts[i] = v
        return verdicts

    def _degraded(
        self,
        key: str,
        policy: Policy,
        cost: int,
        now_us: int | None,
        *,
        error: str,
        failure_policy: FailurePolicy | None,
        failure_code: int | None,
        deadline: Deadline | None = None,
    ) -> Outcome:
        fp = failure_policy or self.failure_policy
        if fp is FailurePolicy.PASS_THROUGH:
            return Outcome(make_decision(True, policy.limit, policy.limit, 0, 0), "pass_through", error, 429, deadline)
        if fp is FailurePolicy.FAIL_CLOSED:
            snap = self.breaker.snapshot()
            retry_s = snap.next_probe_in_s if snap.next_probe_in_s is not None else 1.0
            retry_us = max(1_000_000, int(retry_s * 1_000_000))
            return Outcome(
                make_decision(False, 0, policy.limit, retry_us, 0),
                "fail_closed",
                error,
                failure_code or self.failure_code,
                deadline,
            )
        self.fallback_decisions += 1
        share = self.shared_policy(policy)
        if cost > share.limit and not share.unlimited and cost.__class__ is not Charge:
            d = make_decision(False, 0, share.limit, share.period_us, 0)
        else:
            d = self.fallback.check(key, share, cost, now_us)
        return Outcome(d, "fallback", error, 429, deadline)

    def _no_time(
        self, key: str, policy: Policy, cost: int, now_us: int | None, fp: FailurePolicy | None, fc: int | None
    ) -> Outcome:
        """Too little time left to ask Redis: the failure policy, at once."""
        return self._degraded(
            key, policy, cost, now_us, error="too little time left before the caller's deadline", failure_policy=fp,
            failure_code=fc, deadline="no_time",
        )  # fmt: skip

    # -- recovery ---------------------------------------------------------------------

    def _ensure_prober(self) -> None:
        if self.breaker.state is BreakerState.OPEN and (self._probe_task is None or self._probe_task.done()):
            try:
                self._probe_task = asyncio.get_running_loop().create_task(self._probe_loop())
            except RuntimeError:  # no running loop: traffic will half-open the breaker itself
                self._probe_task = None

    async def _probe_loop(self) -> None:
        b = self.breaker
        while b.state is BreakerState.OPEN:
            wait = b.snapshot().next_probe_in_s
            await asyncio.sleep(wait if wait is not None else b.backoff_initial_s)
            if b.state is not BreakerState.OPEN:
                return
            if not b.probe_due():
                continue
            try:
                await self.redis.ping()
            except BackendError as exc:
                b.probe_failed(exc)
                continue
            b.probe_succeeded()
            if self.fleet is not None:
                with contextlib.suppress(BackendError):
                    await self.fleet.beat()
            return

    async def start(self) -> None:
        """Start the fleet heartbeat (if any)."""
        if self.fleet is not None:
            with contextlib.suppress(BackendError):
                await self.fleet.beat()
            self.fleet.start()

    async def aclose(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
        if self.fleet is not None:
            await self.fleet.stop()
