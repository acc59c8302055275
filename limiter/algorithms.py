"""The decision math: one pure function per algorithm, no IO, no clock.

Every function has the shape ``(state, now_us, policy, cost) -> (Decision, new_state)``.
``state`` is ``None`` for a key never seen (or expired). The functions never mutate
their input state; when a request is denied, the returned state is the input state
unchanged (nothing is written).

Each Lua script in ``lua/`` mirrors its function here line by line and uses the
same IEEE-754 double operations in the same order, so the two give bit-identical
answers (``tests/test_differential.py`` holds them to it). That is why some
expressions below are written the way Lua writes them.

Out-of-order requests: callers' clocks differ and requests reach the store out of
timestamp order. A request older than the stored state is evaluated at the stored
time (token bucket, windows, log), so stored time never moves backwards and no
interval is credited twice.

State shapes (also the Redis layouts):

=================  =====================================  ==========================
algorithm          Python state                           Redis value at the key
=================  =====================================  ==========================
token_bucket       ``(last_us: int, tokens: float)``      hash ``t`` last, ``k`` tokens
gcra               ``tat_us: float``                      hash ``a`` TAT
fixed_window       ``(window_start_us: int, count: int)`` hash ``w``, ``n``
sliding_window     ``(window_start_us, current, previous)`` hash ``w``, ``c``, ``p``
sliding_log        ``tuple[int, ...]`` sorted timestamps  sorted set, score = time
=================  =====================================  ==========================
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from math import ceil, floor
from typing import Any

from .policy import Algorithm, Decision, Policy, make_decision

__all__ = [
    "ALGORITHMS",
    "EPSILON",
    "decide",
    "fixed_window",
    "gcra",
    "sliding_log",
    "sliding_window",
    "token_bucket",
    "token_bucket_tokens",
]

# Float remainders such as 19.999999999999996 tokens are shown as 20 whole tokens.
# Both sides add the same constant, so parity is unaffected.
EPSILON = 1e-9

State = Any
AlgorithmFn = Callable[[State, int, Policy, int], tuple[Decision, State]]


def _unlimited(state: State, policy: Policy) -> tuple[Decision, State]:
    return make_decision(True, policy.limit, policy.limit, 0, 0), state


def token_bucket(
    state: tuple[int, float] | None, now: int, policy: Policy, cost: int = 1
) -> tuple[Decision, tuple[int, float] | None]:
    """Seed 000's token bucket with a cost, and stored time that never moves back."""
    if policy.unlimited:
        return _unlimited(state, policy)
    burst = policy.burst_f
    rate = policy.rate_per_us
    if state is None:
        last = now
        tokens = burst
    else:
        last, tokens = state
        if now > last:
            tokens = min(burst, tokens + (now - last) * rate)
            last = now
    if tokens >= cost:
        tokens = tokens - cost
        reset = 0 if tokens >= burst else ceil((burst - tokens) / rate)
        return make_decision(True, floor(tokens + EPSILON), policy.limit, 0, reset), (last, tokens)
    retry = ceil((cost - tokens) / rate)
    reset = 0 if tokens >= burst else ceil((burst - tokens) / rate)
    return make_decision(False, floor(tokens + EPSILON), policy.limit, retry, reset), state


def token_bucket_tokens(state: tuple[int, float] | None, now: int, policy: Policy) -> float:
    """Tokens in the bucket at ``now`` after refill, without consuming (``peek.lua``)."""
    if policy.unlimited or state is None:
        return policy.burst_f
    last, tokens = state
    if now > last:
        tokens = min(policy.burst_f, tokens + (now - last) * policy.rate_per_us)
    return tokens


def gcra(state: float | None, now: int, policy: Policy, cost: int = 1) -> tuple[Decision, float | None]:
    """Generic cell rate algorithm: the token bucket stored as one theoretical arrival time."""
    if policy.unlimited:
        return _unlimited(state, policy)
    t = policy.emission_us
    tau = t * policy.burst_f
    tat = now if state is None else state
    if tat < now:
        tat = now
    new_tat = tat + t * cost
    allow_at = new_tat - tau
    if allow_at <= now:
        remaining = floor((tau - (new_tat - now)) / t + EPSILON)
        return make_decision(True, remaining, policy.limit, 0, ceil(new_tat - now)), new_tat
    remaining = floor((tau - (tat - now)) / t + EPSILON)
    return make_decision(False, remaining, policy.limit, ceil(allow_at - now), ceil(tat - now)), state


def fixed_window(
    state: tuple[int, int] | None, now: int, policy: Policy, cost: int = 1
) -> tuple[Decision, tuple[int, int] | None]:
    """A counter per window of ``period``; windows aligned to the epoch."""
    if policy.unlimited:
        return _unlimited(state, policy)
    w = policy.period_us
    limit = policy.limit
    ws = now - now % w
    count = 0
    if state is not None:
        sw, sn = state
        if ws <= sw:  # same window, or an older request evaluated in the stored window
            ws = sw
            count = sn
    reset = ws + w - now
    if count + cost <= limit:
        count = count + cost
        return make_decision(True, limit - count, limit, 0, reset), (ws, count)
    return make_decision(False, limit - count, limit, reset, reset), state


def sliding_window(
    state: tuple[int, int, int] | None, now: int, policy: Policy, cost: int = 1
) -> tuple[Decision, tuple[int, int, int] | None]:
    """Seed 003's two-counter sliding window: previous window weighted by its overlap."""
    if policy.unlimited:
        return _unlimited(state, policy)
    w = policy.period_us
    limit = policy.limit
    ws = now - now % w
    cur = 0
    prev = 0
    if state is not None:
        sw, sc, sp = state
        if ws > sw:
            prev = sc if ws - sw == w else 0
        else:  # same window, or an older request evaluated at the stored window start
            if ws < sw:
                ws = sw
                now = sw
            cur = sc
            prev = sp
    weight = (w - (now - ws)) / w
    weighted = prev * weight + cur
    if weighted + cost <= limit:
        cur = cur + cost
        used = prev * weight + cur
        remaining = floor(limit - used + EPSILON)
        if remaining < 0:
            remaining = 0
        return make_decision(True, remaining, limit, 0, ws + 2 * w - now), (ws, cur, prev)
    if prev > 0 and cur + cost <= limit:
        need = w * (1 - (limit - cost - cur) / prev)
        retry = ceil(ws + need - now)
    else:
        need = 0.0
        if cur > 0:
            need = w * (1 - (limit - cost) / cur)
            if need < 0:
                need = 0.0
        retry = ceil(ws + w + need - now)
    if retry < 1:
        retry = 1
    remaining = floor(limit - weighted + EPSILON)
    if remaining < 0:
        remaining = 0
    if cur > 0:
        reset = ws + 2 * w - now
    elif prev > 0:
        reset = ws + w - now
    else:
        reset = 0
    return make_decision(False, remaining, limit, retry, reset), state


def sliding_log(
    state: tuple[int, ...] | None, now: int, policy: Policy, cost: int = 1
) -> tuple[Decision, tuple[int, ...] | None]:
    """Seed 001's sliding log: one entry per token in a sorted set, exact over any window."""
    if policy.unlimited:
        return _unlimited(state, policy)
    w = policy.period_us
    limit = policy.limit
    entries: tuple[int, ...] = state or ()
    if entries and now < entries[-1]:
        now = entries[-1]
    cutoff = now - w
    live = entries[bisect_right(entries, cutoff) :]
    count = len(live)
    if count + cost <= limit:
        # expired entries are pruned only here, where 'now' becomes the newest entry:
        # a later, older request is evaluated at that time, never before the prune
        return make_decision(True, limit - count - cost, limit, 0, w), live + (now,) * cost
    k = count + cost - limit
    retry = live[k - 1] + w - now
    reset = live[-1] + w - now
    return make_decision(False, limit - count, limit, retry, reset), state


ALGORITHMS: dict[Algorithm, AlgorithmFn] = {
    Algorithm.TOKEN_BUCKET: token_bucket,
    Algorithm.GCRA: gcra,
    Algorithm.FIXED_WINDOW: fixed_window,
    Algorithm.SLIDING_WINDOW: sliding_window,
    Algorithm.SLIDING_LOG: sliding_log,
}


def decide(state: State, now: int, policy: Policy, cost: int = 1) -> tuple[Decision, State]:
    """Dispatch to the policy's algorithm."""
    return ALGORITHMS[policy.algorithm](state, now, policy, cost)
