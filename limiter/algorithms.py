"""The decision math: one pure function per algorithm, no IO, no clock.

Every function has the shape ``(state, now_us, policy, cost) -> (Decision, new_state)``.
``state`` is ``None`` for a key never seen (or expired). The functions never mutate
their input state; when a request is denied, the returned state is the input state
unchanged (nothing is written).

Each Lua script in ``lua/`` mirrors its function here line by line and uses the
same IEEE-754 double operations in the same order, so the two give bit-identical
answers (``tests/test_differential.py`` holds them to it). That is why some
expressions below are written the way Lua writes them.

Peeks (a cost of 0, envoyproxy/ratelimit's ``hits_addend: 0``): ``peek_<algorithm>(state,
now, policy) -> Decision`` (and :func:`peek`) answer what a request of cost 1 would get now,
writing nothing; ``lua/peek_<algorithm>.lua`` mirrors each. A :meth:`Policy.blocking` policy
(limit 0) is denied by :func:`blocked_decision` without any state.

Out-of-order requests: callers' clocks differ and requests reach the store out of
timestamp order. A request older than the stored state is evaluated at the stored
time (token bucket, windows, log), so stored time never moves backwards and no
interval is credited twice.

State shapes (and the Redis layouts of state format 1; format 2 holds GCRA's and the windows'
as one number, docs/state-format.md):

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
    "PEEKS",
    "blocked_decision",
    "decide",
    "fixed_window",
    "gcra",
    "peek",
    "peek_fixed_window",
    "peek_gcra",
    "peek_sliding_log",
    "peek_sliding_window",
    "peek_token_bucket",
    "sliding_log",
    "sliding_window",
    "sliding_window_counts",
    "sliding_window_retry",
    "token_bucket",
    "token_bucket_tokens",
    "unlimited_answer",
]

# Float remainders such as 19.999999999999996 tokens are shown as 20 whole tokens.
# Both sides add the same constant, so parity is unaffected.
EPSILON = 1e-9

State = Any
AlgorithmFn = Callable[[State, int, Policy, int], tuple[Decision, State]]
PeekFn = Callable[[State, int, Policy], Decision]


def unlimited_answer(state: State, policy: Policy) -> tuple[Decision, State]:
    """An unlimited policy's answer (allowed, the whole limit left) and the state unchanged."""
    return make_decision(True, policy.limit, policy.limit, 0, 0), state


def token_bucket(
    state: tuple[int, float] | None, now: int, policy: Policy, cost: int = 1
) -> tuple[Decision, tuple[int, float] | None]:
    """The token bucket with a cost, and stored time that never moves back."""
    if policy.unlimited:
        return unlimited_answer(state, policy)
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
        return unlimited_answer(state, policy)
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
        return unlimited_answer(state, policy)
    w = policy.period_us
    limit = policy.limit
    if limit <= 0:  # Policy.blocking: no store is read, nothing is written
        return blocked_decision(now, policy), state
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


def blocked_decision(now: int, policy: Policy) -> Decision:
    """The answer to every request on a :meth:`Policy.blocking` policy (a fixed window with
    a limit of 0), whatever its cost, peeks included: denied, nothing left, and the wait to
    the end of the current window as both retry and reset. No state is involved."""
    w = policy.period_us
    ws = now - now % w
    reset = ws + w - now
    return make_decision(False, 0, policy.limit, reset, reset)


def sliding_window_counts(state: tuple[int, int, int] | None, now: int, w: int) -> tuple[int, int, int, int]:
    """The sliding window's (window start, time it is evaluated at, current count, previous
    count) at ``now``: the previous window's count when the stored one has just ended; an older
    request evaluated at the stored window's start."""
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
    return ws, now, cur, prev


def sliding_window_retry(ws: int, now: int, w: int, *, limit: int, cur: int, prev: int, cost: int) -> int:
    """How long a request of ``cost`` waits on a sliding window that refuses it now (at least 1 us)."""
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
    return 1 if retry < 1 else retry


def sliding_window(
    state: tuple[int, int, int] | None, now: int, policy: Policy, cost: int = 1
) -> tuple[Decision, tuple[int, int, int] | None]:
    """The two-counter sliding window: previous window weighted by its overlap."""
    if policy.unlimited:
        return unlimited_answer(state, policy)
    w = policy.period_us
    limit = policy.limit
    ws, now, cur, prev = sliding_window_counts(state, now, w)
    weight = (w - (now - ws)) / w
    weighted = prev * weight + cur
    if weighted + cost <= limit:
        cur = cur + cost
        used = prev * weight + cur
        remaining = floor(limit - used + EPSILON)
        if remaining < 0:
            remaining = 0
        return make_decision(True, remaining, limit, 0, ws + 2 * w - now), (ws, cur, prev)
    retry = sliding_window_retry(ws, now, w, limit=limit, cur=cur, prev=prev, cost=cost)
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
    """The sliding log: one entry per token in a sorted set, exact over any window."""
    if policy.unlimited:
        return unlimited_answer(state, policy)
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


# -- peeks: the answer a request of cost 1 would get now, with nothing written -------------
#
# remaining is what is left before spending (each denied branch above reports exactly
# that); retry_after_us is 0 when a cost-1 request would be allowed, else the denied
# branch's wait for cost 1; reset_after_us is computed from the un-spent state. A state
# older than 'now' and a 'now' older than the state are handled as the decide functions
# handle them. Each lua/peek_<algorithm>.lua mirrors its function line by line.


def peek_token_bucket(state: tuple[int, float] | None, now: int, policy: Policy) -> Decision:
    """:func:`token_bucket` for cost 1 without spending: the tokens after refill."""
    if policy.unlimited:
        return unlimited_answer(state, policy)[0]
    burst = policy.burst_f
    rate = policy.rate_per_us
    if state is None:
        tokens = burst
    else:
        last, tokens = state
        if now > last:
            tokens = min(burst, tokens + (now - last) * rate)
    reset = 0 if tokens >= burst else ceil((burst - tokens) / rate)
    if tokens >= 1:
        return make_decision(True, floor(tokens + EPSILON), policy.limit, 0, reset)
    retry = ceil((1 - tokens) / rate)
    return make_decision(False, floor(tokens + EPSILON), policy.limit, retry, reset)


def peek_gcra(state: float | None, now: int, policy: Policy) -> Decision:
    """:func:`gcra` for cost 1 without moving the TAT."""
    if policy.unlimited:
        return unlimited_answer(state, policy)[0]
    t = policy.emission_us
    tau = t * policy.burst_f
    tat = now if state is None else state
    if tat < now:
        tat = now
    allow_at = tat + t - tau
    remaining = floor((tau - (tat - now)) / t + EPSILON)
    reset = ceil(tat - now)
    if allow_at <= now:
        return make_decision(True, remaining, policy.limit, 0, reset)
    return make_decision(False, remaining, policy.limit, ceil(allow_at - now), reset)


def peek_fixed_window(state: tuple[int, int] | None, now: int, policy: Policy) -> Decision:
    """:func:`fixed_window` for cost 1 without counting. ``reset_after_us`` is the end of
    the window once anything is counted in it (or when denied, as the denied branch
    says), else 0: an empty window is already at its full allowance."""
    if policy.unlimited:
        return unlimited_answer(state, policy)[0]
    w = policy.period_us
    limit = policy.limit
    if limit <= 0:
        return blocked_decision(now, policy)
    ws = now - now % w
    count = 0
    if state is not None:
        sw, sn = state
        if ws <= sw:
            ws = sw
            count = sn
    end = ws + w - now
    if count + 1 <= limit:
        return make_decision(True, limit - count, limit, 0, end if count > 0 else 0)
    return make_decision(False, limit - count, limit, end, end)


def peek_sliding_window(state: tuple[int, int, int] | None, now: int, policy: Policy) -> Decision:
    """:func:`sliding_window` for cost 1 without counting."""
    if policy.unlimited:
        return unlimited_answer(state, policy)[0]
    w = policy.period_us
    limit = policy.limit
    ws, now, cur, prev = sliding_window_counts(state, now, w)
    weight = (w - (now - ws)) / w
    weighted = prev * weight + cur
    remaining = floor(limit - weighted + EPSILON)
    if remaining < 0:
        remaining = 0
    if cur > 0:
        reset = ws + 2 * w - now
    elif prev > 0:
        reset = ws + w - now
    else:
        reset = 0
    if weighted + 1 <= limit:
        return make_decision(True, remaining, limit, 0, reset)
    return make_decision(
        False, remaining, limit, sliding_window_retry(ws, now, w, limit=limit, cur=cur, prev=prev, cost=1), reset
    )


def peek_sliding_log(state: tuple[int, ...] | None, now: int, policy: Policy) -> Decision:
    """:func:`sliding_log` for cost 1 without adding an entry (or pruning one)."""
    if policy.unlimited:
        return unlimited_answer(state, policy)[0]
    w = policy.period_us
    limit = policy.limit
    entries: tuple[int, ...] = state or ()
    if entries and now < entries[-1]:
        now = entries[-1]
    live = entries[bisect_right(entries, now - w) :]
    count = len(live)
    reset = live[-1] + w - now if live else 0
    if count + 1 <= limit:
        return make_decision(True, limit - count, limit, 0, reset)
    retry = live[count - limit] + w - now  # the k-th live entry, k = count + 1 - limit
    return make_decision(False, limit - count, limit, retry, reset)


PEEKS: dict[Algorithm, PeekFn] = {
    Algorithm.TOKEN_BUCKET: peek_token_bucket,
    Algorithm.GCRA: peek_gcra,
    Algorithm.FIXED_WINDOW: peek_fixed_window,
    Algorithm.SLIDING_WINDOW: peek_sliding_window,
    Algorithm.SLIDING_LOG: peek_sliding_log,
}


def peek(state: State, now: int, policy: Policy) -> Decision:
    """The decision a request of cost 1 would get now, with nothing written (a descriptor
    with ``hits_addend: 0``): dispatch to the policy's algorithm."""
    return PEEKS[policy.algorithm](state, now, policy)
