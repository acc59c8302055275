"""Reservations in Redis: :meth:`BookedCalls.reserve` and :meth:`BookedCalls.settle` of
:class:`~limiter.redis_limiter.RedisLimiter`, each one call of ``lua/reserve.lua`` or
``lua/settle.lua`` on the key's hash (its state and its book: one cluster slot, atomic), and
:meth:`BookedCalls.raw_book`, the book as stored (:mod:`limiter.reservations` is the model)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .algorithms import blocked_decision
from .connection import Backend
from .errors import BackendReplyError
from .policy import Charge, Decision, Policy, make_decision, validate_charge
from .reservations import Book, Reserved, Settled, Terms, book_from_fields
from .resp import ReplyError, encode_command
from .scripts import BOOKED, Script, policy_args

__all__ = ["BookedCalls"]

#: settle.lua's statuses
_SETTLED = {1: "settled", 2: "again", 0: "unknown", 3: "charged", 4: "released"}


def _decision(reply: list[int]) -> Decision:
    """A decision as the scripts answer it: {allowed, remaining, limit, retry_after_us, reset_after_us}."""
    return make_decision(reply[0] == 1, reply[1], reply[2], reply[3], reply[4])


class BookedCalls:
    """The reservation calls of a :class:`~limiter.redis_limiter.RedisLimiter` (see the module
    docstring)."""

    backend: Backend
    time_source: str
    _clock: Callable[[], int]

    def redis_key(self, key: str) -> bytes:
        raise NotImplementedError

    async def _eval(self, script: Script, rkey: bytes, *args: bytes) -> Any:
        raise NotImplementedError

    def _now_arg(self, now_us: int | None) -> bytes:
        return b"r" if self.time_source == "redis" else b"%d" % (self._clock() if now_us is None else now_us)

    async def reserve(
        self, key: str, policy: Policy, estimate: int, *, rid: str, terms: Terms, now_us: int | None = None
    ) -> Reserved:
        """Reserve ``estimate`` under ``rid`` atomically in Redis (``lua/reserve.lua``,
        :func:`limiter.reservations.reserve`). A blocking policy refuses without Redis."""
        if policy.blocked:
            d = blocked_decision(self._clock() if now_us is None else now_us, policy)
            return Reserved(decision=d, reserved=False)
        validate_charge(policy, Charge(estimate))
        rkey = self.redis_key(key)
        a1, a2, a3 = policy_args(policy)
        reply = await self._eval(
            BOOKED["reserve", policy.algorithm], rkey, a1, a2, a3, self._now_arg(now_us), b"%d" % estimate,
            rid.encode(), b"%d" % terms.ttl_us, b"p" if terms.positive else b"c", b"%d" % terms.max_held,
            b"r" if terms.release else b"c", b"%d" % terms.keep_us,
        )  # fmt: skip
        return Reserved(decision=_decision(reply[1]), reserved=reply[0] == 1, full=reply[0] == -1)

    async def settle(
        self, key: str, policy: Policy, actual: int, *, rid: str, terms: Terms, now_us: int | None = None,
        unbooked: bool = False,
    ) -> Settled:  # fmt: skip
        """Settle ``rid`` at ``actual`` atomically in Redis (``lua/settle.lua``,
        :func:`limiter.reservations.settle`): the first settle charges the difference, a repeated
        one gives the first answer and charges nothing; ``unbooked``: a reservation never booked
        here is charged in full."""
        validate_charge(policy, Charge(actual))
        rkey = self.redis_key(key)
        a1, a2, a3 = policy_args(policy)
        reply = await self._eval(
            BOOKED["settle", policy.algorithm], rkey, a1, a2, a3, self._now_arg(now_us), b"%d" % actual,
            rid.encode(), b"r" if terms.release else b"c", b"%d" % terms.keep_us, b"u" if unbooked else b"b",
            b"%d" % terms.max_held,
        )  # fmt: skip
        status = _SETTLED[reply[0]]
        if status in ("settled", "again"):
            return Settled(status=status, decision=_decision(reply[1]), estimate=reply[2], actual=reply[3])
        return Settled(status=status, estimate=reply[2])

    async def raw_book(self, key: str) -> Book:
        """The reservations booked for ``key`` (:func:`limiter.reservations.book_from_fields`)."""
        rkey = self.redis_key(key)
        reply = await self.backend.call(rkey, encode_command("HGETALL", rkey))
        if isinstance(reply, ReplyError) and str(reply).startswith("WRONGTYPE"):
            return Book.empty()  # a compact state (one integer): no book
        if isinstance(reply, ReplyError):
            raise BackendReplyError(str(reply))
        items = [x.decode() if isinstance(x, bytes) else str(x) for x in reply or []]
        return book_from_fields(dict(zip(items[::2], items[1::2], strict=True)))
