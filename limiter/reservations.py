"""Reserve and settle: a budget's cost estimated before the answer and corrected after it (an LLM
request reserves its input tokens plus ``max_tokens``, then settles with what the answer used).
Pure, as :mod:`limiter.algorithms`: the key's state and its *book* of reservations in, the
answer and both states out; ``lua/reserve.lua`` and ``lua/settle.lua`` mirror it over the same
hash in Redis (one key: one cluster slot, atomic), and tests/integration/test_reserve_parity.py
holds them together.

* :func:`reserve`: a decision of the estimate. ``cover`` (the default) admits it only when what
  is left covers it, as any request; ``positive`` admits it while the balance is above zero (a
  request of one unit would be allowed), the way Envoy's look with ``hits_addend: 0`` admits
  until the budget is spent, and then charges the estimate whatever is left. Admitted, the
  reservation is booked under its id until ``ttl_us`` from now. A key holds at most
  ``max_held`` records (outstanding, or remembered after they ended): past it, refused.
* :func:`settle`: the actual cost charged against the estimate: the difference is a charge
  (more than estimated) or a refund (less), counted whatever is left (:mod:`limiter.charges`).
  The record is then remembered for ``keep_us`` with the answer, so settling again gives the
  first answer and charges nothing (idempotent, whichever replica asks). An unknown id, or one
  that expired, changes nothing.
* Expiry: a reservation left unsettled past its TTL is either kept at its estimate (``charge``)
  or refunded (``release``), and remembered for ``keep_us`` as expired; a remembered record past
  its time is forgotten. A reserve or settle of the key handles the record it names at once, as
  if swept then (a settle of an expired reservation says what became of it; of a forgotten one,
  that it is unknown). The others are swept together, by a reserve or settle of the key, once
  the book's ``due_us`` has come: the earliest record's time, but never sooner than a sixteenth of
  ``keep_us`` after the last sweep, so a key with a steady flow of records reads its whole book
  about once per ``keep_us / 16``, not at every call (a release of a reservation nobody settles
  is refunded that much later, at most). A key holding ``max_held`` records is swept at once.

Refunds on a window (a settle below the estimate, a release) apply only while the window the
estimate was counted in is the current one: a window that has ended keeps what it counted, as
any count (the sliding window's previous window included). The refunds of one sweep are summed
(whole numbers, in any order the same) and refunded once.

The book: ``{id: Held}`` and when the next sweep is due (``due_us``: 0 with no records), kept as
records are written (lowered to a new record's time), so no call reads the whole book unless it
sweeps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .algorithms import decide, peek
from .charges import charge
from .policy import Charge, Decision, Policy, make_decision

__all__ = ["Book", "Held", "Reserved", "Settled", "Terms", "book_from_fields", "reserve", "settle", "sweep"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Terms:
    """How a route's reservations live: an unsettled one expires ``ttl_us`` after it was made;
    ``positive`` admits while the balance is above zero (else the estimate must be covered);
    a key holds at most ``max_held`` records; an expired one is refunded (``release``) or kept
    at its estimate; an ended record (settled, expired) is remembered ``keep_us``."""

    ttl_us: int = 300_000_000
    positive: bool = False
    max_held: int = 1000
    release: bool = False
    keep_us: int = 300_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Held:
    """One record of a key's book. ``until_us``: when an outstanding reservation expires, or
    until when an ended one (settled or expired) is remembered."""

    estimate: int
    made_us: int
    until_us: int
    state: str = "outstanding"  # outstanding | settled | charged (expired, kept) | released (expired, refunded)
    actual: int | None = None  # settled: the actual cost
    answer: Decision | None = None  # settled: the settle's answer


@dataclass(frozen=True, slots=True, kw_only=True)
class Book:
    """A key's reservations by id, and when the next sweep is due (0: no records; see the module
    docstring)."""

    held: dict[str, Held]
    due_us: int = 0

    @classmethod
    def empty(cls) -> Book:
        return cls(held={})


@dataclass(frozen=True, slots=True, kw_only=True)
class Reserved:
    """A reserve's outcome: ``reserved`` (booked), else refused by the budget or, ``full``, by
    the bound on the key's records."""

    decision: Decision
    reserved: bool
    full: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Settled:
    """A settle's outcome: ``status`` is ``settled`` (now), ``again`` (before: the first answer),
    ``unknown``, ``charged`` or ``released`` (expired, and what became of its estimate)."""

    status: str
    decision: Decision | None = None
    estimate: int = 0
    actual: int | None = None


def _window_of(policy: Policy, t: int) -> int:
    """The start of the window ``t`` falls in (0 for the buckets: one everlasting window)."""
    w = policy.period_us
    return t - t % w if policy.algorithm.windowed else 0


def _refundable(policy: Policy, made_us: int, now: int) -> bool:
    """A refund of what was counted at ``made_us`` applies now (see the module docstring)."""
    return not policy.algorithm.windowed or _window_of(policy, made_us) == _window_of(policy, now)


def _due(held: dict[str, Held]) -> int:
    return min((h.until_us for h in held.values()), default=0)


def _lower(due: int, until: int) -> int:
    """The book's earliest ``until_us`` once a record with ``until`` is written (no other changed)."""
    return until if not due or until < due else due


def _expire(state: Any, h: Held, now: int, policy: Policy, terms: Terms) -> tuple[Any, Held, int]:
    """An outstanding record past its TTL, expired: kept at its estimate or released; the
    refund it is owed (0 unless released while its window lasts)."""
    refund = h.estimate if terms.release and _refundable(policy, h.made_us, now) else 0
    return state, replace(h, state="released" if terms.release else "charged", until_us=now + terms.keep_us), refund


def _grace(terms: Terms) -> int:
    """How long after a sweep the next one waits at least: a sixteenth of how long an ended
    record is remembered (the records in between are swept together)."""
    return terms.keep_us // 16


def sweep(state: Any, book: Book, now: int, policy: Policy, terms: Terms, *, force: bool = False) -> tuple[Any, Book]:
    """The records due at ``now`` handled (see the module docstring): outstanding ones expired
    (refunded together when ``release``), ended ones forgotten; then the next sweep is due at
    the earliest record's time but not before :func:`_grace` from now. ``force``: whether due
    or not (a key that holds ``max_held`` records)."""
    if not force and (not book.due_us or now < book.due_us):
        return state, book
    held = dict(book.held)
    refund = 0
    for rid in sorted(held):
        h = held[rid]
        if h.until_us > now:
            continue
        if h.state != "outstanding":
            del held[rid]
            continue
        state, held[rid], owed = _expire(state, h, now, policy, terms)
        refund += owed
    if refund:
        _, state = charge(state, now, policy, Charge(-refund))
    earliest = _due(held)
    return state, Book(held=held, due_us=max(earliest, now + _grace(terms)) if earliest else 0)


def _at(state: Any, book: Book, now: int, policy: Policy, terms: Terms, rid: str) -> tuple[Any, Book, Held | None]:
    """``rid``'s record as a sweep at ``now`` would leave it: an outstanding one past its TTL
    expired now, an ended one past its time forgotten (None)."""
    h = book.held.get(rid)
    if h is None or h.until_us > now:
        return state, book, h
    held = dict(book.held)
    if h.state != "outstanding":
        del held[rid]
        return state, Book(held=held, due_us=book.due_us if held else 0), None
    state, h, owed = _expire(state, h, now, policy, terms)
    if owed:
        _, state = charge(state, now, policy, Charge(-owed))
    held[rid] = h
    return state, Book(held=held, due_us=_lower(book.due_us, h.until_us)), h


def reserve(
    state: Any, book: Book, now: int, policy: Policy, *, estimate: int, rid: str, terms: Terms
) -> tuple[Reserved, Any, Book]:
    """Reserve ``estimate`` under ``rid`` (see the module docstring)."""
    state, book = sweep(state, book, now, policy, terms)
    state, book, mine = _at(state, book, now, policy, terms, rid)
    if len(book.held) >= terms.max_held:  # the records past their time may be what fills it
        state, book = sweep(state, book, now, policy, terms, force=True)
    if len(book.held) >= terms.max_held or mine is not None:
        d = peek(state, now, policy)
        earliest = _due(book.held)  # when a record can go (the sweep a full key forces takes it then)
        wait = max(1, earliest - now) if earliest else 1
        return Reserved(decision=make_decision(False, d.remaining, d.limit, wait, d.reset_after_us), reserved=False,
                        full=True), state, book  # fmt: skip
    if terms.positive:
        if not peek(state, now, policy).allowed:
            return Reserved(decision=peek(state, now, policy), reserved=False), state, book
        d, state = charge(state, now, policy, Charge(estimate))
        d = make_decision(True, d.remaining, d.limit, d.retry_after_us, d.reset_after_us)
    else:
        d, state = decide(state, now, policy, estimate)
        if not d.allowed:
            return Reserved(decision=d, reserved=False), state, book
    held = {**book.held, rid: Held(estimate=estimate, made_us=now, until_us=now + terms.ttl_us)}
    return Reserved(decision=d, reserved=True), state, Book(held=held, due_us=_lower(book.due_us, now + terms.ttl_us))


def settle(
    state: Any, book: Book, now: int, policy: Policy, *, rid: str, actual: int, terms: Terms, unbooked: bool = False
) -> tuple[Settled, Any, Book]:
    """Settle ``rid`` at ``actual`` (see the module docstring). ``unbooked``: the reservation
    was never booked here (made while this store was not asked, or could not answer), so an
    unknown ``rid`` is charged ``actual`` in full and remembered as settled from an estimate of
    0 (a repeated settle charges nothing), unless the key holds ``max_held`` records already
    (charged all the same, not remembered)."""
    state, book = sweep(state, book, now, policy, terms)
    state, book, h = _at(state, book, now, policy, terms, rid)
    if h is None:
        if not unbooked:
            return Settled(status="unknown"), state, book
        d, state = charge(state, now, policy, Charge(actual))
        if len(book.held) < terms.max_held:
            h = Held(estimate=0, made_us=now, until_us=now + terms.keep_us, state="settled", actual=actual, answer=d)
            held = {**book.held, rid: h}
            book = Book(held=held, due_us=_lower(book.due_us, h.until_us))
        return Settled(status="settled", decision=d, estimate=0, actual=actual), state, book
    if h.state == "settled":
        return Settled(status="again", decision=h.answer, estimate=h.estimate, actual=h.actual), state, book
    if h.state != "outstanding":
        return Settled(status=h.state, estimate=h.estimate), state, book
    delta = actual - h.estimate
    if delta < 0 and not _refundable(policy, h.made_us, now):
        delta = 0
    d, state = charge(state, now, policy, Charge(delta))
    until = now + terms.keep_us
    settled = Held(estimate=h.estimate, made_us=h.made_us, until_us=until, state="settled", actual=actual, answer=d)
    held = {**book.held, rid: settled}
    due = _lower(book.due_us, until)
    return Settled(status="settled", decision=d, estimate=h.estimate, actual=actual), state, Book(held=held, due_us=due)


_STATES = {"o": "outstanding", "s": "settled", "c": "charged", "r": "released"}


def book_from_fields(fields: dict[str, str]) -> Book:
    """A key's book as ``lua/reservations.lua`` stores it in the key's hash (its ``r:<id>``
    fields; the others are the key's state)."""
    held: dict[str, Held] = {}
    for name, text in fields.items():
        if not name.startswith("r:"):
            continue
        code, *numbers = text.split()
        estimate, made, until, *ended = (int(float(x)) for x in numbers)
        held[name[2:]] = Held(estimate=estimate, made_us=made, until_us=until, state=_STATES[code])
        if ended:  # settled: the actual cost and the answer
            actual, allowed, *answer = ended
            held[name[2:]] = replace(held[name[2:]], actual=actual, answer=make_decision(allowed == 1, *answer))
    return Book(held=held, due_us=int(float(fields.get("rx", 0))))
