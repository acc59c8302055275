"""What happens when Redis fails: circuit breaker, failure policies, recovery, fleet share.

Seeds 000 and 004. :class:`CircuitBreaker` is a pure state machine (clock and
randomness injected). :class:`ResilientLimiter` puts it in front of a
:class:`~limiter.redis_limiter.RedisLimiter` and answers every request even while
Redis is down, as the failure policy says:

- ``passThrough``: allow everything;
- ``failClosed``: reject everything with the configured status (default 429);
- ``inMemoryFallback``: decide with a local limiter, enforcing the policy divided by
  the number of live instances last seen in Redis (never below 1 token of burst), so
  an outage does not multiply the limit by the replica count.

Recovery (seed 000): once the breaker opens, a background probe PINGs Redis after
1 s, 2 s, 4 s ... up to 30 s, each with 0..delay of random jitter; a successful probe
moves the breaker to half-open, and the next real request that succeeds closes it.
Unlike seed 000, ``failClosed`` recovers too: waiting for an operator turns a Redis
blip into a full outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal, cast

from .errors import BackendError
from .local import LocalLimiter
from .policy import Algorithm, Decision, Policy, make_decision, validate_cost
from .redis_limiter import RedisLimiter
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


class BreakerState(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class FailurePolicy(str, Enum):
    """Seed 000's Redis-down behaviours."""

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


@dataclass(frozen=True, slots=True)
class BreakerSnapshot:
    """The breaker's state, readable by the control plane and the dashboard."""

    state: BreakerState
    consecutive_failures: int
    last_error: str | None
    last_failure_at: float | None  # wall clock, seconds
    opened_at: float | None  # wall clock, seconds
    next_probe_in_s: float | None
    probe_attempt: int
    total_failures: int
    transitions: int

    def to_dict(self) -> dict[str, object]:
        return {
            "state": self.state.value,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
            "last_failure_at": self.last_failure_at,
            "opened_at": self.opened_at,
            "next_probe_in_s": self.next_probe_in_s,
            "probe_attempt": self.probe_attempt,
            "total_failures": self.total_failures,
            "transitions": self.transitions,
        }


class CircuitBreaker:
    """Closed, open, half-open. Timeouts count as failures like any other.

    ``failure_threshold`` consecutive failures open it. While open, nothing is sent;
    a probe is due after ``min(backoff_initial * 2**attempt, backoff_max)`` plus
    jitter in ``[0, delay]`` (``jitter=False``: none, so ``backoff_initial_s ==
    backoff_max_s`` gives a fixed open duration). :meth:`probe_succeeded` half-opens
    it, and so does the first request once the probe is due; in half-open one request
    at a time goes through (the trial), and its success closes the breaker.

    ``clock`` (monotonic) drives the state machine, ``wall_clock`` only stamps
    ``opened_at`` and ``last_failure_at``; ``rng`` draws the jitter. Each transition is
    logged as a warning naming the breaker ``name`` (None: not logged, the owner
    reports it) and passed to ``on_transition(from, to, reason)``.
    """

    __slots__ = (
        "_clock",
        "_opened_mono",
        "_rng",
        "_trial_in_flight",
        "_wall",
        "backoff_initial_s",
        "backoff_max_s",
        "consecutive_failures",
        "failure_threshold",
        "jitter",
        "last_error",
        "last_failure_at",
        "last_opened_mono",
        "name",
        "next_probe_at",
        "on_transition",
        "opened_at",
        "probe_attempt",
        "state",
        "total_failures",
        "transitions",
    )

    def __init__(
        self,
        failure_threshold: int = 5,
        *,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        jitter: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        on_transition: Callable[[BreakerState, BreakerState, str | None], None] | None = None,
        name: str | None = "redis",
    ) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold: must be >= 1, got {failure_threshold!r}")
        if backoff_initial_s <= 0 or backoff_max_s < backoff_initial_s:
            raise ValueError("backoff: need 0 < backoff_initial_s <= backoff_max_s")
        self.failure_threshold = failure_threshold
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.jitter = jitter
        self._clock = clock
        self._wall = wall_clock
        self._rng = rng
        self.on_transition = on_transition
        self.name = name
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.total_failures = 0
        self.last_error: str | None = None
        self.last_failure_at: float | None = None
        self.opened_at: float | None = None  # wall clock, when this outage began
        self._opened_mono: float | None = None
        #: monotonic time of the latest move to open (a failed trial re-opens); None when closed
        self.last_opened_mono: float | None = None
        self.next_probe_at: float | None = None  # monotonic
        self.probe_attempt = 0
        self.transitions = 0
        self._trial_in_flight = False

    @property
    def trial_in_flight(self) -> bool:
        """True while the request let through in half-open has not reported back."""
        return self._trial_in_flight

    # -- decisions --------------------------------------------------------------------

    def allow_request(self) -> bool:
        """May a request go to the backend now?"""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            # no background prober (or it is late): traffic may trigger the probe itself
            if self.next_probe_at is not None and self._clock() >= self.next_probe_at:
                self._move(BreakerState.HALF_OPEN, "probe due")
            else:
                return False
        if self._trial_in_flight:
            return False
        self._trial_in_flight = True
        return True

    def abandon_trial(self) -> None:
        """The request let through by :meth:`allow_request` ended without an answer
        either way (cancelled, or an error that says nothing about the backend): a
        half-open breaker lets the next request be the trial instead of waiting forever."""
        self._trial_in_flight = False

    def record_success(self) -> None:
        self._trial_in_flight = False
        self.consecutive_failures = 0
        if self.state is not BreakerState.CLOSED:
            self.probe_attempt = 0
            self.next_probe_at = None
            self.opened_at = None
            self._opened_mono = None
            self.last_opened_mono = None
            self._move(BreakerState.CLOSED, None)

    def record_failure(self, error: BaseException | str) -> None:
        self._trial_in_flight = False
        self.consecutive_failures += 1
        self.total_failures += 1
        self.last_error = str(error) or type(error).__name__
        self.last_failure_at = self._wall()
        if self.state is BreakerState.HALF_OPEN:
            self.probe_attempt += 1
            self._open()
        elif self.state is BreakerState.CLOSED and self.consecutive_failures >= self.failure_threshold:
            self.probe_attempt = 0
            self._open()

    def probe_due(self) -> bool:
        return (
            self.state is BreakerState.OPEN and self.next_probe_at is not None and self._clock() >= self.next_probe_at
        )

    def probe_succeeded(self) -> None:
        if self.state is BreakerState.OPEN:
            self._move(BreakerState.HALF_OPEN, "probe succeeded")

    def probe_failed(self, error: BaseException | str) -> None:
        self.last_error = str(error) or type(error).__name__
        self.last_failure_at = self._wall()
        self.total_failures += 1
        if self.state is BreakerState.OPEN:
            self.probe_attempt += 1
            self.next_probe_at = self._clock() + self.backoff_delay(self.probe_attempt)

    def backoff_delay(self, attempt: int) -> float:
        """Exponential backoff with full jitter on top: delay + uniform(0, delay) (the
        delay alone without ``jitter``)."""
        delay: float = min(self.backoff_initial_s * (2 ** min(attempt, 30)), self.backoff_max_s)
        if not self.jitter:
            return delay
        return delay + self._rng() * delay

    def open_for_s(self) -> float:
        """How long the breaker has been open (0 when closed)."""
        if self._opened_mono is None:
            return 0.0
        return self._clock() - self._opened_mono

    def snapshot(self) -> BreakerSnapshot:
        nxt = None
        if self.next_probe_at is not None and self.state is BreakerState.OPEN:
            nxt = max(0.0, self.next_probe_at - self._clock())
        return BreakerSnapshot(
            state=self.state,
            consecutive_failures=self.consecutive_failures,
            last_error=self.last_error,
            last_failure_at=self.last_failure_at,
            opened_at=self.opened_at,
            next_probe_in_s=nxt,
            probe_attempt=self.probe_attempt,
            total_failures=self.total_failures,
            transitions=self.transitions,
        )

    def _open(self) -> None:
        now = self._clock()
        if self._opened_mono is None:
            self._opened_mono = now
            self.opened_at = self._wall()
        self.last_opened_mono = now
        self.next_probe_at = now + self.backoff_delay(self.probe_attempt)
        self._move(BreakerState.OPEN, self.last_error)

    def _move(self, to: BreakerState, reason: str | None) -> None:
        frm = self.state
        if frm is to:
            return
        self.state = to
        self.transitions += 1
        if to is not BreakerState.HALF_OPEN:
            self._trial_in_flight = False
        if self.name is not None:
            log.warning("%s circuit breaker %s -> %s (%s)", self.name, frm.value, to.value, reason or "")
        if self.on_transition is not None:
            self.on_transition(frm, to, reason)


Source = Literal["distributed", "fallback", "pass_through", "fail_closed", "skipped"]
_SKIPPED = make_decision(True, 0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A decision and where it came from."""

    decision: Decision
    source: Source
    error: str | None = None
    status_code: int = 429

    @property
    def allowed(self) -> bool:
        return self.decision.allowed


def fleet_share(policy: Policy, instances: int) -> Policy:
    """The policy one of ``instances`` replicas enforces alone: rate and burst divided,
    never below 1 token of burst (or 1 request per window)."""
    if instances <= 1 or policy.unlimited:
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


class FleetMembership:
    """Each instance's heartbeat in one sorted set: ``rl:<ns>:fleet`` (score = last beat, ms).

    ``live_instances`` is the number of members that beat within ``stale_after_s``,
    as last read from Redis; it is kept while Redis is down, which is the point.
    ``wall_clock`` (Unix seconds) stamps the beats: every replica compares its clock
    with the others' stamps, so it must be the wall clock, not a monotonic one.
    """

    def __init__(
        self,
        redis: RedisLimiter,
        *,
        instance_id: str | None = None,
        interval_s: float = 2.0,
        stale_after_s: float | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.redis = redis
        self.wall_clock = wall_clock
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
        await b.call(self.key, encode_command("ZADD", self.key, now_ms, self.instance_id))
        await b.call(
            self.key, encode_command("ZREMRANGEBYSCORE", self.key, "-inf", now_ms - int(self.stale_after_s * 1000))
        )
        await b.call(self.key, encode_command("PEXPIRE", self.key, int(self.stale_after_s * 1000) * 2))
        members = await b.call(self.key, encode_command("ZRANGE", self.key, 0, -1))
        if not isinstance(members, list):
            raise BackendError(f"fleet heartbeat: unexpected reply {members!r}")
        self.members = sorted(m.decode() for m in members)
        self.live_instances = max(1, len(self.members))
        self.last_beat_ok = self.wall_clock()
        return self.live_instances

    async def leave(self) -> None:
        with contextlib.suppress(BackendError, OSError):
            await self.redis.backend.call(self.key, encode_command("ZREM", self.key, self.instance_id))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.beat()
            except (BackendError, OSError) as exc:
                log.debug("fleet heartbeat failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.leave()


class ResilientLimiter:
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
        self.breaker = breaker if breaker is not None else CircuitBreaker()
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
    ) -> Outcome:
        """Decide in Redis when the breaker allows, else by the failure policy."""
        cost = validate_cost(policy, cost)
        if self.breaker.allow_request():
            try:
                d = await self.redis.check(key, policy, cost, now_us)
            except BaseException as exc:
                if not isinstance(exc, BackendError):
                    self.breaker.abandon_trial()
                    raise
                self.backend_errors += 1
                self.breaker.record_failure(exc)
                self._ensure_prober()
                return self._degraded(key, policy, cost, now_us, str(exc), failure_policy, failure_code)
            self.breaker.record_success()
            return Outcome(d, "distributed")
        self._ensure_prober()
        return self._degraded(
            key, policy, cost, now_us, self.breaker.last_error or "circuit open", failure_policy, failure_code
        )

    async def check_many(
        self,
        requests: Sequence[tuple[str, Policy, int, int | None]],
        *,
        overrides: Sequence[tuple[FailurePolicy | None, int | None]] | None = None,
        degrade: bool = True,
    ) -> list[Outcome]:
        """Many decisions in one pipelined burst; per-item fallback on failure.

        ``overrides`` gives each item's own (failure policy, failure code), if any.
        With ``degrade=False`` (shadow evaluation) a failed item is not decided by the
        failure policy at all: its outcome has source ``"skipped"``."""
        ov = overrides if overrides is not None else [(None, None)] * len(requests)
        if not self.breaker.allow_request():
            self._ensure_prober()
            err = self.breaker.last_error or "circuit open"
            if not degrade:
                return [Outcome(_SKIPPED, "skipped", err) for _ in requests]
            return [
                self._degraded(k, p, validate_cost(p, c), n, err, fp, fc)
                for (k, p, c, n), (fp, fc) in zip(requests, ov)
            ]
        try:
            results = await self.redis.check_many(requests)
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
                out.append(
                    self._degraded(k, p, c, n, str(r), fp, fc) if degrade else Outcome(_SKIPPED, "skipped", str(r))
                )
        if failed:
            self.breaker.record_failure(next(r for r in results if not isinstance(r, Decision)))
            self._ensure_prober()
        else:
            self.breaker.record_success()
        return out

    async def compare_many(self, requests: Sequence[tuple[str, Policy, int, int | None]]) -> list[bool | None]:
        """Shadow evaluation: Redis's verdict on each request (``True`` allowed), or
        ``None`` where it could not give one (breaker open, or the call failed). Nothing
        is degraded to the failure policy; failures are counted and feed the breaker as
        in :meth:`check_many`."""
        if not self.breaker.allow_request():
            self._ensure_prober()
            return [None] * len(requests)
        try:
            results = await self.redis.allowed_many(requests)
        except BaseException:
            self.breaker.abandon_trial()
            raise
        error: BackendError | None = None
        for r in results:
            if type(r) is not bool:
                error = r
                break
        if error is None:
            self.breaker.record_success()
            return cast("list[bool | None]", results)  # every item is a bool: no copy needed
        out: list[bool | None] = []
        for r in results:
            if type(r) is bool:
                out.append(r)
            else:
                self.backend_errors += 1
                out.append(None)
        self.breaker.record_failure(error)
        self._ensure_prober()
        return out

    def _degraded(
        self,
        key: str,
        policy: Policy,
        cost: int,
        now_us: int | None,
        error: str,
        failure_policy: FailurePolicy | None,
        failure_code: int | None,
    ) -> Outcome:
        fp = failure_policy or self.failure_policy
        if fp is FailurePolicy.PASS_THROUGH:
            return Outcome(make_decision(True, policy.limit, policy.limit, 0, 0), "pass_through", error)
        if fp is FailurePolicy.FAIL_CLOSED:
            snap = self.breaker.snapshot()
            retry_s = snap.next_probe_in_s if snap.next_probe_in_s is not None else 1.0
            retry_us = max(1_000_000, int(retry_s * 1_000_000))
            return Outcome(
                make_decision(False, 0, policy.limit, retry_us, 0),
                "fail_closed",
                error,
                failure_code or self.failure_code,
            )
        self.fallback_decisions += 1
        share = self.shared_policy(policy)
        if cost > share.limit and not share.unlimited:
            d = make_decision(False, 0, share.limit, share.period_us, 0)
        else:
            d = self.fallback.check(key, share, cost, now_us)
        return Outcome(d, "fallback", error)

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
