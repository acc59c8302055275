"""Reservations behind the circuit breaker: :meth:`ResilientBooked.reserve` and
:meth:`ResilientBooked.settle` of :class:`~limiter.resilience.ResilientLimiter`, each one call of
:class:`~limiter.booked.BookedCalls` when the breaker allows, else the failure policy (a reserve)
or nothing (a settle), Redis' errors counted as a decision's are."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import BackendError
from .reservations import Reserved, Settled, Terms

if TYPE_CHECKING:
    from .breaker import CircuitBreaker
    from .policy import Policy
    from .redis_limiter import RedisLimiter
    from .resilience import Deadline, FailurePolicy, Outcome

__all__ = ["ResilientBooked"]


class ResilientBooked:
    """The reservation calls of a :class:`~limiter.resilience.ResilientLimiter`."""

    redis: RedisLimiter
    breaker: CircuitBreaker
    backend_errors: int

    def _ensure_prober(self) -> None:
        raise NotImplementedError

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
        raise NotImplementedError

    async def reserve(
        self,
        key: str,
        policy: Policy,
        estimate: int,
        *,
        rid: str,
        terms: Terms,
        now_us: int | None = None,
        failure_policy: FailurePolicy | None = None,
        failure_code: int | None = None,
    ) -> tuple[Outcome, Reserved | None]:
        """Reserve ``estimate`` in Redis when the breaker allows (:meth:`RedisLimiter.reserve`):
        the outcome and what Redis booked or refused. Redis failing (or the breaker open), the
        failure policy answers the estimate as a request and nothing is booked (None): settled
        later with ``unbooked``, it is charged then."""
        from .resilience import Outcome  # the module that defines it imports this one

        if self.breaker.allow_request():
            try:
                r = await self.redis.reserve(key, policy, estimate, rid=rid, terms=terms, now_us=now_us)
            except BaseException as exc:
                if not isinstance(exc, BackendError):
                    self.breaker.abandon_trial()
                    raise
                error = self._failed(exc)
            else:
                self.breaker.record_success()
                return Outcome(r.decision, "distributed"), r
        else:
            self._ensure_prober()
            error = self.breaker.last_error or "circuit open"
        out = self._degraded(
            key, policy, estimate, now_us, error=error, failure_policy=failure_policy, failure_code=failure_code
        )
        return out, None

    async def settle(
        self,
        key: str,
        policy: Policy,
        actual: int,
        *,
        rid: str,
        terms: Terms,
        now_us: int | None = None,
        unbooked: bool = False,
    ) -> Settled | str:
        """Settle ``rid`` in Redis when the breaker allows (:meth:`RedisLimiter.settle`); else
        the error (nothing settled in Redis: an unsettled reservation there expires as its
        route says)."""
        if not self.breaker.allow_request():
            self._ensure_prober()
            return self.breaker.last_error or "circuit open"
        try:
            out = await self.redis.settle(key, policy, actual, rid=rid, terms=terms, now_us=now_us, unbooked=unbooked)
        except BaseException as exc:
            if not isinstance(exc, BackendError):
                self.breaker.abandon_trial()
                raise
            return self._failed(exc)
        self.breaker.record_success()
        return out

    def _failed(self, exc: BackendError) -> str:
        """A call Redis failed: counted, the breaker told, the prober started; the error."""
        self.backend_errors += 1
        self.breaker.record_failure(exc)
        self._ensure_prober()
        return str(exc)
