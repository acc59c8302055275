"""The in-process limiter: the pure algorithms over a bounded, thread-safe key map.

This is the per-replica limiter fleets start with, and the in-memory fallback while
Redis is down. It runs exactly the functions the Lua scripts mirror, so for the
same inputs it gives the same decisions as :class:`~limiter.redis_limiter.RedisLimiter`.

Memory is bounded by ``max_keys`` (65,536 by default): at the cap about 10% of the
least recently used keys are evicted at once. Keys idle longer than their TTL are
dropped by :meth:`LocalLimiter.sweep` (also run incrementally, a few keys each time
a new key arrives), which cannot change a decision: a key is only dropped once its state is
equivalent to a fresh one.

The store also says when it made each key's bucket and when, before that, it last forgot
buckets (it was created, evicted keys, or was cleared): :meth:`LocalLimiter.birth`. A new
bucket is full, so for a while it may admit what the one it replaced would not have (the
control plane's ``fresh_local`` divergence cause).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from . import reservations
from .algorithms import ALGORITHMS, PEEKS, blocked_decision, decide, token_bucket_tokens
from .charges import CHARGES
from .policy import (
    MAX_COST,
    Algorithm,
    BucketView,
    Charge,
    Decision,
    Policy,
    make_decision,
    validate_charge,
    validate_cost,
)
from .reservations import Book, Reserved, Settled, Terms

try:  # the C hot path (limiter/_speedups.c); optional, same answers
    from ._speedups import FastCheck as _FastCheck
except ImportError:  # pragma: no cover - only where no compiler was available at install
    _FastCheck = None

__all__ = ["LocalKeyInfo", "LocalLimiter", "speedups_available"]


def speedups_available() -> bool:
    """True when the C hot path of :meth:`LocalLimiter.check` is built and not disabled
    with ``SHADOWLIMIT_PURE_PYTHON=1``."""
    return _FastCheck is not None and os.environ.get("SHADOWLIMIT_PURE_PYTHON", "") in ("", "0")


_SWEEP_BUDGET = 8  # idle keys looked at per new key
_BIRTH = 5  # an entry's (created_us, forgot_us): the last of its six items (LocalLimiter._data)


_time_ns = time.time_ns
_LOG = Algorithm.SLIDING_LOG


def _now_us() -> int:
    return _time_ns() // 1000


class LocalKeyInfo:
    """What the limiter holds for one key (admin views)."""

    __slots__ = ("key", "algorithm", "state", "last_seen_us", "expires_us", "created_us", "forgot_us")

    def __init__(
        self,
        key: str,
        algorithm: Algorithm,
        state: Any,
        last_seen_us: int,
        expires_us: int,
        *,
        created_us: int = 0,
        forgot_us: int = 0,
    ) -> None:
        self.key = key
        self.algorithm = algorithm
        self.state = state
        self.last_seen_us = last_seen_us
        self.expires_us = expires_us
        self.created_us = created_us  # when the bucket was made (or restarted, on a change of algorithm)
        self.forgot_us = forgot_us  # when, before that, the store last forgot buckets

    def __repr__(self) -> str:
        return f"LocalKeyInfo({self.key!r}, {self.algorithm.value}, last_seen_us={self.last_seen_us})"


class LocalLimiter:
    """In-process limiter. ``check`` is O(1) and safe under threads and asyncio.

    >>> lim = LocalLimiter()
    >>> lim.check("client-1", Policy(average=100, burst=20), now_us=0).remaining
    19
    """

    def __init__(
        self, max_keys: int = 65_536, *, clock: Callable[[], int] = _now_us, speedups: bool | None = None
    ) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys: must be >= 1, got {max_keys!r}")
        self.max_keys = max_keys
        self._clock = clock
        self._custom_clock = clock is not _now_us  # the default clock is inlined in check()
        # key -> [state, algorithm, last_seen_us, expires_us, the algorithm's pure function,
        # (created_us, forgot_us)]; ordered oldest access first. The entry keeps the function so
        # a check on a known key does not look it up again (Policy only names its algorithm).
        # Six items, not seven: a list of six takes the memory of a list of five (the C path
        # measured 1% slower with seven)
        self._data: OrderedDict[str, list[Any]] = OrderedDict()
        # key -> its book of reservations (limiter.reservations), kept as long as its entry
        # (an unlimited policy's keys, which have no entry, at most max_keys of them)
        self._books: dict[str, Book] = {}
        self._lock = threading.Lock()
        self.evicted = 0
        self.expired = 0
        #: when the store was made (its clock), and when it last forgot buckets: made, evicted
        #: least recently used keys, cleared (:meth:`birth`)
        self.started_us = self.forgot_us = clock()
        if speedups is None:
            speedups = speedups_available()
        elif speedups and _FastCheck is None:
            raise RuntimeError("speedups: the C extension limiter._speedups is not built (reinstall with a C compiler)")
        self.accelerated = bool(speedups)
        if speedups:
            # an instance attribute shadows the method: lim.check(...) goes straight to C,
            # which handles a known token-bucket key and hands everything else to _check_py
            self.check = _FastCheck(  # type: ignore[method-assign]
                self._data,
                self._lock,
                self._check_py,
                clock if self._custom_clock else None,
                Decision,
                Algorithm.TOKEN_BUCKET,
                charge_type=Charge,
            )

    def check(self, key: str, policy: Policy, cost: int = 1, now_us: int | None = None) -> Decision:
        """Decide one request and record it.

        A :class:`~limiter.policy.Charge` cost is a charge: counted whatever is left, the
        key's balance going into debt (:mod:`limiter.charges`). ``cost=0`` (an int) is a
        peek: the answer a request of cost 1 would get now (:func:`limiter.algorithms.peek`
        of the stored state), recording nothing. A
        :meth:`Policy.blocking` policy is denied without touching the key map.

        With the C extension built, instances replace this method by its C version,
        which takes the same arguments and gives the same answers; this Python code is
        the reference and handles every case the C path hands back (new keys,
        eviction, algorithms other than the token bucket, bad input).
        """
        if now_us is None:
            now_us = self._clock() if self._custom_clock else _time_ns() // 1000
        table = ALGORITHMS
        if cost.__class__ is not int or cost < 1 or cost > policy.limit:
            if cost.__class__ is Charge and -MAX_COST <= cost <= MAX_COST and policy.algorithm is not _LOG:
                table = CHARGES  # counted whatever is left (limiter.charges); validate_charge's checks
                if policy.blocked:
                    return self._peek_or_block(key, policy, cost, now_us)
            elif (cost.__class__ is int and cost == 0) or policy.blocked:
                return self._peek_or_block(key, policy, cost, now_us)
            else:
                cost = validate_cost(policy, cost)
                if cost.__class__ is Charge:  # on an unlimited sliding log (past its bound: raised)
                    table = CHARGES
        if policy.unlimited:
            return make_decision(True, policy.limit, policy.limit, 0, 0)
        alg = policy.algorithm
        data = self._data
        lock = self._lock
        lock.acquire()
        try:
            entry = data.get(key)
            if entry is None:
                fn = table[alg]
                decision, state = fn(None, now_us, policy, cost)
                if state is not None:
                    # idle keys are dropped as new ones arrive (and by sweep())
                    self._sweep_front(now_us)
                    if len(data) >= self.max_keys:
                        self._evict(now_us)
                    expires = now_us + policy.ttl_us + decision.reset_after_us
                    data[key] = [state, alg, now_us, expires, ALGORITHMS[alg], (now_us, self.forgot_us)]
            else:
                data.move_to_end(key)
                if entry[1] is alg:
                    fn = entry[4] if table is ALGORITHMS else table[alg]
                    decision, state = fn(entry[0], now_us, policy, cost)
                else:  # the key's policy changed algorithm: its state starts afresh, a new bucket
                    entry[4] = ALGORITHMS[alg]
                    decision, state = table[alg](None, now_us, policy, cost)
                    entry[1] = alg
                    entry[_BIRTH] = (now_us, now_us)
                entry[0] = state
                entry[2] = now_us
                expires = now_us + policy.ttl_us + decision.reset_after_us
                if expires > entry[3]:
                    entry[3] = expires
        finally:
            lock.release()
        return decision

    _check_py = check

    def _peek_or_block(self, key: str, policy: Policy, cost: object, now_us: int) -> Decision:
        """A peek (cost 0) or any request on a blocking policy: nothing is recorded (no new
        key, no LRU move, no last-seen update)."""
        if not (cost.__class__ is int and cost == 0):
            validate_cost(policy, cost)
        if policy.blocked:
            return blocked_decision(now_us, policy)
        with self._lock:
            entry = self._data.get(key)
            state = entry[0] if entry is not None and entry[1] is policy.algorithm else None
        return PEEKS[policy.algorithm](state, now_us, policy)

    # -- reservations (limiter.reservations: the same model as lua/reserve.lua, lua/settle.lua)

    def reserve(
        self, key: str, policy: Policy, estimate: int, *, rid: str, terms: Terms, now_us: int | None = None
    ) -> Reserved:
        """Reserve ``estimate`` under ``rid`` (:func:`limiter.reservations.reserve`)."""
        now = self._clock() if now_us is None else now_us
        if policy.blocked:
            return Reserved(decision=blocked_decision(now, policy), reserved=False)
        validate_charge(policy, Charge(estimate))
        with self._lock:
            state, book = self._booked(key, policy)
            out, state, book = reservations.reserve(state, book, now, policy, estimate=estimate, rid=rid, terms=terms)
            self._keep(key, policy, state, book, now, reset_us=out.decision.reset_after_us, terms=terms)
        return out

    def settle(
        self, key: str, policy: Policy, actual: int, *, rid: str, terms: Terms, now_us: int | None = None,
        unbooked: bool = False,
    ) -> Settled:  # fmt: skip
        """Settle ``rid`` at ``actual`` (:func:`limiter.reservations.settle`)."""
        now = self._clock() if now_us is None else now_us
        validate_charge(policy, Charge(actual))
        with self._lock:
            state, book = self._booked(key, policy)
            out, state, book = reservations.settle(
                state, book, now, policy, rid=rid, actual=actual, terms=terms, unbooked=unbooked
            )
            reset_us = 0 if out.decision is None else out.decision.reset_after_us
            self._keep(key, policy, state, book, now, reset_us=reset_us, terms=terms)
        return out

    def book(self, key: str) -> Book:
        """The reservations booked for ``key``."""
        with self._lock:
            return self._books.get(key) or Book.empty()

    def booked_keys(self) -> list[str]:
        """The keys that hold reservations now (a snapshot)."""
        with self._lock:
            return list(self._books)

    def _booked(self, key: str, policy: Policy) -> tuple[Any, Book]:
        entry = self._data.get(key)
        state = entry[0] if entry is not None and entry[1] is policy.algorithm else None
        return state, self._books.get(key) or Book.empty()

    def _keep(
        self, key: str, policy: Policy, state: Any, book: Book, now_us: int, *, reset_us: int, terms: Terms
    ) -> None:
        """A reservation's state and book stored (caller holds the lock), kept at least as long
        as the book remembers anything it was written now (a reservation's TTL and then as long
        again: the bound lua/reserve.lua keeps the key by)."""
        until = now_us + terms.ttl_us + terms.keep_us if book.held else 0
        if state is not None:
            alg = policy.algorithm
            expires = max(now_us + policy.ttl_us + reset_us, until)
            entry = self._data.get(key)
            if entry is None:
                self._sweep_front(now_us)
                if len(self._data) >= self.max_keys:
                    self._evict(now_us)
                self._data[key] = [state, alg, now_us, expires, ALGORITHMS[alg], (now_us, self.forgot_us)]
            else:
                self._data.move_to_end(key)
                if entry[1] is not alg:  # the key's policy changed algorithm: a new bucket
                    entry[1], entry[4], entry[_BIRTH] = alg, ALGORITHMS[alg], (now_us, now_us)
                entry[0], entry[2] = state, now_us
                entry[3] = max(entry[3], expires)
        if not book.held:
            self._books.pop(key, None)
            return
        if key not in self._books and len(self._books) >= self.max_keys:
            self._books.pop(next(iter(self._books)))
        self._books[key] = book

    def peek(self, key: str, policy: Policy, now_us: int | None = None) -> BucketView:
        """The key's allowance now, without consuming or recording anything."""
        if now_us is None:
            now_us = self._clock()
        with self._lock:
            entry = self._data.get(key)
            state = entry[0] if entry is not None and entry[1] is policy.algorithm else None
        if policy.algorithm is Algorithm.TOKEN_BUCKET and not policy.unlimited:
            tokens = token_bucket_tokens(state, now_us, policy)
            d, _ = decide(state, now_us, policy, 0)
            return BucketView(tokens, policy.limit, state is not None, d.reset_after_us)
        d, _ = decide(state, now_us, policy, 0)
        # a key never seen is already at its full allowance: nothing to wait for
        return BucketView(
            float(d.remaining), policy.limit, state is not None, d.reset_after_us if state is not None else 0
        )

    def state(self, key: str) -> Any:
        """The raw pure-function state for ``key`` (``None`` when unknown)."""
        with self._lock:
            entry = self._data.get(key)
            return None if entry is None else entry[0]

    def info(self, key: str) -> LocalKeyInfo | None:
        """What the limiter holds for ``key`` (``None`` when unknown)."""
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return None
            return _info(key, entry)

    def birth(self, key: str) -> tuple[int, int] | None:
        """When the store made ``key``'s bucket and when, before that, it last forgot buckets
        (``(created_us, forgot_us)``), or None when it holds none. One read of the entry, no
        lock: a snapshot, as exact as the moment it is read."""
        entry = self._data.get(key)
        return None if entry is None else entry[_BIRTH]

    def reset(self, key: str) -> bool:
        """Forget ``key``; True when it was known."""
        with self._lock:
            self._books.pop(key, None)
            return self._data.pop(key, None) is not None

    def clear(self, now_us: int | None = None) -> None:
        """Forget every key (the store forgot its buckets at ``now_us``, the clock's by default)."""
        with self._lock:
            self._data.clear()
            self._books.clear()
            self.forgot_us = self._clock() if now_us is None else now_us

    def keys(self) -> list[str]:
        """Known keys, least recently used first."""
        with self._lock:
            return list(self._data)

    def items(self) -> Iterator[LocalKeyInfo]:
        """A snapshot of every key's record, least recently used first."""
        with self._lock:
            snapshot = [(k, list(v)) for k, v in self._data.items()]
        for k, entry in snapshot:
            yield _info(k, entry)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def sweep(self, now_us: int | None = None) -> int:
        """Drop every key idle past its TTL; returns how many were dropped."""
        if now_us is None:
            now_us = self._clock()
        with self._lock:
            dead = [k for k, v in self._data.items() if v[3] <= now_us]
            for k in dead:
                del self._data[k]
                self._books.pop(k, None)
            self.expired += len(dead)
            return len(dead)

    def _sweep_front(self, now_us: int) -> None:
        """Incremental sweep of the least recently used end (caller holds the lock)."""
        data = self._data
        for _ in range(_SWEEP_BUDGET):
            if not data:
                return
            k, v = next(iter(data.items()))
            if v[3] > now_us:
                return
            del data[k]
            self._books.pop(k, None)
            self.expired += 1

    def _evict(self, now_us: int) -> None:
        """Evict about 10% least recently used keys (caller holds the lock): the store forgot
        buckets at ``now_us``."""
        n = min(max(1, self.max_keys // 10), len(self._data))
        data = self._data
        for _ in range(n):
            k, _ = data.popitem(last=False)
            self._books.pop(k, None)
        self.evicted += n
        self.forgot_us = now_us


def _info(key: str, entry: list[Any]) -> LocalKeyInfo:
    state, alg, seen, expires, _fn = entry[:_BIRTH]
    created, forgot = entry[_BIRTH]
    return LocalKeyInfo(key, alg, state, seen, expires, created_us=created, forgot_us=forgot)
