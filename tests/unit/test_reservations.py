"""The reservation model (limiter/reservations.py) case by case: what a reserve admits (cover or
positive), what a settle charges or refunds, a repeated or unknown settle, expiry kept or
refunded, a window's refund rule, how long an ended record is remembered and the bound on a key's
records. The parity test holds Lua and LocalLimiter to this model; these hold the model to what
the module says."""

from __future__ import annotations

import pytest

from limiter import Algorithm, LocalLimiter, Policy
from limiter.algorithms import peek
from limiter.reservations import Book, Terms, reserve, settle, sweep

T0 = 1_700_000_000_000_000
HOUR = 3_600_000_000
# 1,000 a day: the refill adds under 42 units in an hour, nothing in a microsecond
BUDGET = Policy(average=1000, period=86_400, burst=1000)
WINDOW = Policy(average=10, period=1.0, burst=10, algorithm=Algorithm.FIXED_WINDOW)
TERMS = Terms(ttl_us=HOUR, keep_us=HOUR)
# 1,000 a month: the refill adds under 2 units a day
SLOW = Policy(average=1000, period=31 * 86_400, burst=1000)


def left(state, now=T0, policy=BUDGET):
    return peek(state, now, policy).remaining


def test_cover_admits_only_what_is_left():
    out, state, book = reserve(None, Book.empty(), T0, BUDGET, estimate=600, rid="a", terms=TERMS)
    assert out.reserved and out.decision.allowed and out.decision.remaining == 400
    out, state2, book2 = reserve(state, book, T0, BUDGET, estimate=500, rid="b", terms=TERMS)
    assert not out.reserved and not out.full and not out.decision.allowed
    assert out.decision.retry_after_us > 0
    assert (state2, book2) == (state, book) and list(book.held) == ["a"]


def test_positive_admits_while_anything_is_left_then_charges_whatever_is_left():
    t = Terms(ttl_us=HOUR, keep_us=HOUR, positive=True)
    _, state, book = reserve(None, Book.empty(), T0, BUDGET, estimate=600, rid="a", terms=t)
    out, state, book = reserve(state, book, T0, BUDGET, estimate=600, rid="b", terms=t)
    assert out.reserved and out.decision.allowed and out.decision.remaining == -200
    out, state, book = reserve(state, book, T0, BUDGET, estimate=1, rid="c", terms=t)
    assert not out.reserved and left(state) == -200 and sorted(book.held) == ["a", "b"]


def test_settle_below_the_estimate_refunds_and_above_it_charges():
    _, state, book = reserve(None, Book.empty(), T0, BUDGET, estimate=600, rid="a", terms=TERMS)
    _, state, book = reserve(state, book, T0, BUDGET, estimate=300, rid="b", terms=TERMS)
    assert left(state) == 100
    out, state, book = settle(state, book, T0, BUDGET, rid="a", actual=100, terms=TERMS)
    assert out.status == "settled" and (out.estimate, out.actual) == (600, 100)
    assert out.decision.allowed and out.decision.remaining == 600 == left(state)
    out, state, book = settle(state, book, T0, BUDGET, rid="b", actual=1000, terms=TERMS)
    assert out.status == "settled" and not out.decision.allowed and out.decision.remaining == -100 == left(state)


def test_a_repeated_settle_gives_the_first_answer_and_charges_nothing():
    _, state, book = reserve(None, Book.empty(), T0, BUDGET, estimate=600, rid="a", terms=TERMS)
    first, state, book = settle(state, book, T0, BUDGET, rid="a", actual=50, terms=TERMS)
    again, state2, book2 = settle(state, book, T0 + 5, BUDGET, rid="a", actual=999, terms=TERMS)
    assert again.status == "again" and again.decision == first.decision and again.actual == 50
    assert (state2, book2) == (state, book)


def test_an_unknown_id_changes_nothing():
    _, state, book = reserve(None, Book.empty(), T0, BUDGET, estimate=600, rid="a", terms=TERMS)
    out, state2, book2 = settle(state, book, T0, BUDGET, rid="zz", actual=0, terms=TERMS)
    assert out.status == "unknown" and out.decision is None and (state2, book2) == (state, book)


@pytest.mark.parametrize("release", [False, True])
def test_an_expired_reservation_is_kept_or_refunded(release):
    t = Terms(ttl_us=1_000_000, keep_us=HOUR, release=release)
    _, state, book = reserve(None, Book.empty(), T0, BUDGET, estimate=600, rid="a", terms=t)
    _, state, book = reserve(state, book, T0, BUDGET, estimate=300, rid="b", terms=t)
    # one microsecond before its TTL the reservation stands; at its TTL it has expired
    out, state, book = settle(state, book, T0 + 999_999, BUDGET, rid="b", actual=300, terms=t)
    assert out.status == "settled"
    at = T0 + 1_000_000
    out, state, book = settle(state, book, at, BUDGET, rid="a", actual=0, terms=t)
    assert out.status == ("released" if release else "charged") and out.estimate == 600
    assert left(state, at) == (700 if release else 100)
    assert book.held["a"].state == out.status and book.held["a"].until_us == at + HOUR


def test_expiries_of_one_sweep_are_refunded_together():
    t = Terms(ttl_us=10, keep_us=HOUR, release=True)
    state, book = None, Book.empty()
    for i, est in enumerate([100, 200, 300]):
        _, state, book = reserve(state, book, T0 + i, BUDGET, estimate=est, rid=f"r{i}", terms=t)
    assert left(state, T0 + 2) == 400
    state, book = sweep(state, book, T0 + 12, BUDGET, t)
    assert left(state, T0 + 12) == 1000
    assert {h.state for h in book.held.values()} == {"released"} and book.due_us == T0 + 12 + HOUR


def test_a_window_refunds_only_while_its_window_is_the_current_one():
    t = Terms(ttl_us=HOUR, keep_us=HOUR)
    start = T0 - T0 % 1_000_000
    _, state, book = reserve(None, Book.empty(), start, WINDOW, estimate=6, rid="a", terms=t)
    _, state, book = reserve(state, book, start, WINDOW, estimate=4, rid="b", terms=t)
    out, state, book = settle(state, book, start + 999_999, WINDOW, rid="a", actual=1, terms=t)
    assert out.decision.remaining == 5  # 6 reserved, 1 used: 5 back in the same window
    nxt = start + 1_000_000
    out, state, book = settle(state, book, nxt, WINDOW, rid="b", actual=0, terms=t)
    assert out.status == "settled" and out.decision.remaining == 10  # a new window: nothing to refund
    assert left(state, nxt, WINDOW) == 10
    # more than estimated is charged in the window it is settled in
    _, state, book = reserve(state, book, nxt, WINDOW, estimate=2, rid="c", terms=t)
    later = nxt + 1_000_000
    out, state, book = settle(state, book, later, WINDOW, rid="c", actual=5, terms=t)
    assert out.decision.remaining == 7


def test_an_ended_record_is_remembered_for_keep_then_forgotten():
    t = Terms(ttl_us=HOUR, keep_us=1_000)
    _, state, book = reserve(None, Book.empty(), T0, BUDGET, estimate=10, rid="a", terms=t)
    _, state, book = settle(state, book, T0, BUDGET, rid="a", actual=10, terms=t)
    out, state, book = settle(state, book, T0 + 999, BUDGET, rid="a", actual=10, terms=t)
    assert out.status == "again"
    out, state, book = settle(state, book, T0 + 1_000, BUDGET, rid="a", actual=10, terms=t)
    assert out.status == "unknown" and book.held == {} and book.due_us == 0


def test_a_key_holds_at_most_max_held_records_and_says_when_one_is_due():
    t = Terms(ttl_us=HOUR, keep_us=HOUR, max_held=2)
    _, state, book = reserve(None, Book.empty(), T0, BUDGET, estimate=1, rid="a", terms=t)
    _, state, book = reserve(state, book, T0 + 10, BUDGET, estimate=1, rid="b", terms=t)
    out, state2, book2 = reserve(state, book, T0 + 20, BUDGET, estimate=1, rid="c", terms=t)
    assert not out.reserved and out.full and not out.decision.allowed
    assert out.decision.retry_after_us == HOUR - 20 and out.decision.remaining == 998
    assert (state2, book2) == (state, book)
    # an id already booked is refused the same way, whatever room there is
    out, *_ = reserve(state, Book(held={"a": book.held["a"]}, due_us=book.due_us), T0, BUDGET, estimate=1,
                      rid="a", terms=t)  # fmt: skip
    assert out.full and not out.reserved


def test_local_limiter_keeps_a_book_while_it_remembers_anything():
    lim = LocalLimiter()
    t = Terms(ttl_us=1_000, keep_us=1_000)
    assert lim.reserve("k", BUDGET, 10, rid="a", terms=t, now_us=T0).reserved
    assert list(lim.book("k").held) == ["a"]
    assert lim.settle("k", BUDGET, 3, rid="a", terms=t, now_us=T0 + 1).status == "settled"
    assert lim.settle("k", BUDGET, 3, rid="a", terms=t, now_us=T0 + 500).status == "again"
    assert lim.settle("k", BUDGET, 3, rid="a", terms=t, now_us=T0 + 1_001).status == "unknown"
    assert lim.book("k") == Book.empty()
    assert lim.reserve("k", BUDGET, 10, rid="b", terms=t, now_us=T0 + 2_000).reserved
    assert lim.reset("k") and lim.book("k") == Book.empty()


def test_a_reservation_never_booked_here_is_charged_in_full_once():
    t = Terms(ttl_us=HOUR, keep_us=HOUR, max_held=2)
    out, state, book = settle(None, Book.empty(), T0, BUDGET, rid="x", actual=300, terms=t, unbooked=True)
    assert out.status == "settled" and out.estimate == 0 and out.decision.remaining == 700 == left(state)
    again, state, book = settle(state, book, T0 + 1, BUDGET, rid="x", actual=300, terms=t, unbooked=True)
    assert again.status == "again" and again.decision == out.decision and left(state, T0 + 1) == 700
    # a full book: still charged, no longer remembered
    _, state, book = settle(state, book, T0 + 2, BUDGET, rid="y", actual=100, terms=t, unbooked=True)
    out, state, book = settle(state, book, T0 + 3, BUDGET, rid="z", actual=100, terms=t, unbooked=True)
    assert out.status == "settled" and left(state, T0 + 3) == 500 and sorted(book.held) == ["x", "y"]


def test_records_past_their_time_are_swept_together_at_most_once_a_sixteenth_of_keep():
    """A steady flow of reservations: the book is read whole at a sweep, and the next sweep waits
    for the earliest record's time but at least keep / 16; the records due meanwhile wait for it."""
    t = Terms(ttl_us=HOUR, keep_us=HOUR, release=True)
    grace = HOUR // 16
    state, book = None, Book.empty()
    for i in range(4):  # a reservation a minute, none settled
        _, state, book = reserve(state, book, T0 + i * 60_000_000, SLOW, estimate=10, rid=f"r{i}", terms=t)
    _, state, book = reserve(state, book, T0 + 1_800_000_000, SLOW, estimate=500, rid="z", terms=t)  # held on
    assert book.due_us == T0 + HOUR  # the earliest record's time
    swept_at = T0 + HOUR
    before = left(state, swept_at, SLOW)
    state, book = sweep(state, book, swept_at, SLOW, t)
    assert left(state, swept_at, SLOW) - before == 10  # r0's release
    assert book.held["r0"].state == "released" and book.held["r1"].state == "outstanding"
    assert book.due_us == swept_at + grace  # r1 falls due a minute later, but waits for the next sweep
    later = swept_at + 2 * 60_000_000  # r1 and r2 are past their time, not yet swept
    state2, book2 = sweep(state, book, later, SLOW, t)
    assert (state2, book2) == (state, book)
    assert (
        left(state, later, SLOW) - left(state, swept_at, SLOW) < 10
    )  # their releases wait too (a unit of refill at most)
    before = left(state, swept_at + grace, SLOW)
    state, book = sweep(state, book, swept_at + grace, SLOW, t)
    assert [book.held[f"r{i}"].state for i in range(4)] == ["released"] * 4  # r3 too: 3 min < grace
    assert left(state, swept_at + grace, SLOW) - before == 30  # r1, r2, r3 released together


def test_a_settle_of_a_record_past_its_time_is_answered_as_if_swept_then():
    t = Terms(ttl_us=HOUR, keep_us=HOUR, release=True)
    grace = HOUR // 16
    _, state, book = reserve(None, Book.empty(), T0, SLOW, estimate=100, rid="a", terms=t)
    _, state, book = reserve(state, book, T0 + 60_000_000, SLOW, estimate=100, rid="b", terms=t)
    _, state, book = reserve(state, book, T0 + 1_800_000_000, SLOW, estimate=500, rid="c", terms=t)  # held on
    before = left(state, T0 + HOUR, SLOW)
    state, book = sweep(state, book, T0 + HOUR, SLOW, t)  # a released; the next sweep a sixteenth on
    assert left(state, T0 + HOUR, SLOW) - before == 100 and book.due_us == T0 + HOUR + grace
    late = T0 + HOUR + 2 * 60_000_000  # b past its TTL, not yet swept
    before = left(state, late, SLOW)
    out, state, book = settle(state, book, late, SLOW, rid="b", actual=30, terms=t)
    assert out.status == "released" and left(state, late, SLOW) - before == 100  # its own release, at once
    assert book.held["b"].until_us == late + HOUR and book.due_us == T0 + HOUR + grace
    out, _, _ = settle(state, book, late + HOUR, SLOW, rid="b", actual=30, terms=t)
    assert out.status == "unknown"  # remembered for keep, then forgotten, whether swept or not


def test_a_full_book_is_swept_at_once_before_a_reservation_is_refused():
    t = Terms(ttl_us=HOUR, keep_us=HOUR, max_held=2)
    _, state, book = reserve(None, Book.empty(), T0, SLOW, estimate=10, rid="a", terms=t)
    _, state, book = settle(state, book, T0, SLOW, rid="a", actual=10, terms=t)
    state, book = sweep(state, book, T0 + HOUR + 1, SLOW, t, force=True)  # nothing past its time but a
    _, state, book = reserve(state, book, T0 + HOUR + 2, SLOW, estimate=10, rid="b", terms=t)
    _, state, book = reserve(state, book, T0 + HOUR + 3, SLOW, estimate=10, rid="c", terms=t)
    assert sorted(book.held) == ["b", "c"]
    full, state, book = reserve(state, book, T0 + HOUR + 4, SLOW, estimate=10, rid="d", terms=t)
    assert full.full and full.decision.retry_after_us == HOUR + 2 - 4  # until b's time
    out, state, book = settle(state, book, T0 + HOUR + 5, SLOW, rid="b", actual=10, terms=t)
    # at 2h+6 the sweep is due (b's TTL at 2h+2 set it): b, settled, remembered until 2h+5, is forgotten;
    # c, past its TTL at 2h+3, is expired (kept at its estimate) and held another hour: room for e
    again, state, book = reserve(state, book, T0 + 2 * HOUR + 6, SLOW, estimate=10, rid="e", terms=t)
    assert again.reserved and sorted(book.held) == ["c", "e"] and book.held["c"].state == "charged"


def test_the_api_shows_a_book_as_a_sweep_now_would_leave_it():
    from control_plane.decision.reservations import book_dict

    t = Terms(ttl_us=HOUR, keep_us=HOUR, release=True)
    _, state, book = reserve(None, Book.empty(), T0, SLOW, estimate=100, rid="a", terms=t)  # expires at T0 + 1h
    _, state, book = reserve(state, book, T0, SLOW, estimate=50, rid="b", terms=t)
    _, state, book = settle(state, book, T0, SLOW, rid="b", actual=40, terms=t)  # remembered until T0 + 1h
    _, state, book = reserve(state, book, T0 + HOUR - 1, SLOW, estimate=7, rid="c", terms=t)
    shown = book_dict(book, T0 + HOUR, SLOW, t)  # nothing swept yet in the book itself
    assert sorted(book.held) == ["a", "b", "c"]
    assert (shown["outstanding"], shown["released"], shown["settled"], shown["charged"]) == (1, 1, 0, 0)
    assert [(r["state"], r["estimate"]) for r in shown["records"]] == [("outstanding", 7), ("released", 100)]
    kept = book_dict(book, T0 + HOUR, SLOW, Terms(ttl_us=HOUR, keep_us=HOUR))  # on_expiry: charge
    assert kept["charged"] == 1 and kept["released"] == 0
