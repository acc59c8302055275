"""Charges: costs known only after the answer (an LLM answer's tokens, the bytes sent), counted
even when they take a key past its budget. Pure, as :mod:`limiter.algorithms`: one function
per algorithm of the shape ``(state, now_us, policy, cost) -> (Decision, new_state)``, the
same states, and a Lua script each (``lua/charge_<algorithm>.lua``) that mirrors it line by
line with the same double operations (tests/integration/test_charge_parity.py holds them to
it).

A charge is never refused for the budget's sake. ``cost`` is a whole number; negative, it is
a refund (a settled reservation that cost less than its estimate):

* **token bucket, GCRA**: the balance goes below zero, a *debt*, and later requests wait until
  the refill has repaid it; a refund adds back, up to a full bucket;
* **fixed window, sliding window**: the charge counts in the current window, past the limit,
  as envoyproxy/ratelimit's counter does, and ends with the window (the sliding window's
  weighted previous window carries it into the next, as it carries any count); a refund takes
  back from the current window's count, down to zero;
* **sliding log**: no charge. Its log holds one entry per unit, so a cost of up to 10^9 units
  would hold 10^9 entries: ``charge`` raises ``ValueError`` saying so; use the sliding window.

The answer: ``allowed`` says whether the charge fitted in what was left (a request of that
cost would have been allowed), ``remaining`` is the balance after it, **negative in debt**
(or past the window's limit), ``retry_after_us`` the wait until a request of one unit would be
allowed again (0: now), ``reset_after_us`` the wait until the key is back to its full allowance.

Exact bounds (:data:`MAX_DEBT`, docs/algorithms.md#charges): Python's and Lua's numbers are
doubles, whole numbers exact up to 2^53. Budgets reach 10^12 units a period and a charge 10^9
(:data:`~limiter.policy.MAX_COST`), so every count and balance stays within +-2^52 and every
sum of them below 2^53: a debt deeper than the bound is held at it. A bucket's debt is also
held at what its refill repays in :data:`~limiter.policy.MAX_REFILL_S` (10 years), so its
refill time and its key's TTL stay within 20 years, as exact microseconds; GCRA's theoretical
arrival time is held the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from math import ceil, floor
from typing import Any

from .algorithms import EPSILON, blocked_decision, sliding_window_counts, sliding_window_retry, unlimited_answer
from .policy import MAX_REFILL_S, NO_LOG_CHARGE, Algorithm, Decision, Policy, make_decision

__all__ = [
    "CHARGES",
    "MAX_DEBT",
    "MAX_DEBT_US",
    "charge",
    "charge_fixed_window",
    "charge_gcra",
    "charge_sliding_window",
    "charge_token_bucket",
]

#: the deepest a count or a balance goes (units): 2^52, half the exact-integer range of a double
MAX_DEBT = 4503599627370496.0
#: the longest a debt takes to repay (microseconds): the 10 years a full bucket may take to refill
MAX_DEBT_US = MAX_REFILL_S * 1_000_000.0

State = Any
ChargeFn = Callable[[State, int, Policy, int], tuple[Decision, State]]


def charge_token_bucket(
    state: tuple[int, float] | None, now: int, policy: Policy, cost: int
) -> tuple[Decision, tuple[int, float] | None]:
    """The token bucket charged ``cost`` tokens whatever is left (see the module docstring)."""
    if policy.unlimited:
        return unlimited_answer(state, policy)
    burst = policy.burst_f
    rate = policy.rate_per_us
    max_debt = min(rate * MAX_DEBT_US, MAX_DEBT)
    if state is None:
        last = now
        tokens = burst
    else:
        last, tokens = state
        if now > last:
            tokens = min(burst, tokens + (now - last) * rate)
            last = now
    fits = tokens >= cost
    tokens = tokens - cost
    if tokens > burst:
        tokens = burst
    if tokens < -max_debt:
        tokens = -max_debt
    reset = 0 if tokens >= burst else ceil((burst - tokens) / rate)
    retry = 0 if tokens >= 1 else ceil((1 - tokens) / rate)
    return make_decision(fits, floor(tokens + EPSILON), policy.limit, retry, reset), (last, tokens)


def charge_gcra(state: float | None, now: int, policy: Policy, cost: int) -> tuple[Decision, float | None]:
    """GCRA charged ``cost`` tokens: the theoretical arrival time moves by ``cost`` emission
    intervals whatever it reaches (held within :data:`MAX_DEBT_US` past a full burst), and a
    refund moves it back, never before now (a full bucket)."""
    if policy.unlimited:
        return unlimited_answer(state, policy)
    t = policy.emission_us
    tau = t * policy.burst_f
    tat = now if state is None else state
    if tat < now:
        tat = now
    fits = tat + t * cost - tau <= now
    new_tat = tat + t * cost
    if new_tat < now:
        new_tat = now
    if new_tat > now + tau + MAX_DEBT_US:
        new_tat = now + tau + MAX_DEBT_US
    balance = floor((tau - (new_tat - now)) / t + EPSILON)
    allow_at = new_tat + t - tau
    retry = 0 if allow_at <= now else ceil(allow_at - now)
    return make_decision(fits, balance, policy.limit, retry, ceil(new_tat - now)), new_tat


def charge_fixed_window(
    state: tuple[int, int] | None, now: int, policy: Policy, cost: int
) -> tuple[Decision, tuple[int, int] | None]:
    """The fixed window charged ``cost`` requests in the current window (past the limit, held
    within :data:`MAX_DEBT`; a refund down to zero). A blocking policy counts nothing."""
    if policy.unlimited:
        return unlimited_answer(state, policy)
    w = policy.period_us
    limit = policy.limit
    if limit <= 0:
        return blocked_decision(now, policy), state
    ws = now - now % w
    count = 0
    if state is not None:
        sw, sn = state
        if ws <= sw:
            ws = sw
            count = sn
    reset = ws + w - now
    fits = count + cost <= limit
    count = count + cost
    if count < 0:
        count = 0
    if count > MAX_DEBT:
        count = int(MAX_DEBT)
    retry = 0 if count + 1 <= limit else reset
    return make_decision(fits, limit - count, limit, retry, reset), (ws, count)


def charge_sliding_window(
    state: tuple[int, int, int] | None, now: int, policy: Policy, cost: int
) -> tuple[Decision, tuple[int, int, int] | None]:
    """The sliding window charged ``cost`` requests in the current window (past the limit,
    held within :data:`MAX_DEBT`; a refund down to zero)."""
    if policy.unlimited:
        return unlimited_answer(state, policy)
    w = policy.period_us
    limit = policy.limit
    ws, now, cur, prev = sliding_window_counts(state, now, w)
    weight = (w - (now - ws)) / w
    fits = prev * weight + cur + cost <= limit
    cur = cur + cost
    if cur < 0:
        cur = 0
    if cur > MAX_DEBT:
        cur = int(MAX_DEBT)
    weighted = prev * weight + cur
    balance = floor(limit - weighted + EPSILON)
    if cur > 0:
        reset = ws + 2 * w - now
    elif prev > 0:
        reset = ws + w - now
    else:
        reset = 0
    retry = 0 if weighted + 1 <= limit else sliding_window_retry(ws, now, w, limit=limit, cur=cur, prev=prev, cost=1)
    return make_decision(fits, balance, limit, retry, reset), (ws, cur, prev)


def _no_charge(state: State, now: int, policy: Policy, cost: int) -> tuple[Decision, State]:
    raise ValueError(NO_LOG_CHARGE)


CHARGES: dict[Algorithm, ChargeFn] = {
    Algorithm.TOKEN_BUCKET: charge_token_bucket,
    Algorithm.GCRA: charge_gcra,
    Algorithm.FIXED_WINDOW: charge_fixed_window,
    Algorithm.SLIDING_WINDOW: charge_sliding_window,
    Algorithm.SLIDING_LOG: _no_charge,
}


def charge(state: State, now: int, policy: Policy, cost: int) -> tuple[Decision, State]:
    """Dispatch to the policy's algorithm (``ValueError`` for the sliding log)."""
    return CHARGES[policy.algorithm](state, now, policy, cost)
