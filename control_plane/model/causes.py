"""Why the local and the global limiter disagree, pure: the cause of one divergent decision,
from figures passed in (nothing here does IO or reads a clock). This is the one place the
causes are defined; docs/rollout-runbook.md#why-they-disagree says what to do about each.

A decision the local limiter admits and the global one would reject
(``local_allow_distributed_deny``, a new rejection) gets the first of these that holds:

1. ``clock``: this replica's clock is off from Redis' ``TIME`` by more than the tolerance
   (``SHADOWLIMIT_CLOCK_SKEW_TOLERANCE_MS``) and the policies are decided on the caller's clock
   (``RATE_LIMIT_TIME_SOURCE=local``): the global state is stamped with a wrong time. Fix NTP,
   not the limit.
2. ``fresh_local``: the replica's bucket for the key is younger than the local policy's refill
   time (:func:`refill_us`), it was made less than that after the replica's store forgot its
   buckets (the replica started, or evicted keys), the fleet was already deciding the route
   before that moment, and the global state remembered earlier use when the bucket was made
   (the global answer to the bucket's first request was not a new key's: :func:`remembers`).
   A restart or eviction artifact: it passes with the refill time.
3. ``replicas``: the *reference* -- the route's local policy evaluated fleet-wide in Redis, as
   if the whole fleet were one replica -- rejects it too: the old limit would have stopped this
   client had it not been spread over replicas. The leak the migration closes.
4. ``tighter``: the reference admits it: even one replica under the old limit would have let it
   through; the global limit is stricter. A change of policy, for someone to decide. Only a
   global limit stricter than the local one in its rate or its burst can be tighter
   (:func:`no_stricter`): under one as generous in both, a rejection the reference happens to
   admit is ``replicas`` too. Two buckets at their limits admit different requests of the same
   traffic (which one finds a token depends on how far each has refilled), so under a looser
   global limit the reference admits some requests the global one refuses, though it refuses
   more of them.

A decision the local limiter rejects and the global one would admit
(``local_deny_distributed_allow``):

5. ``looser``: the global limit gives more than the fleet's local limits together (its rate or
   its burst above the live replicas times the local one's): it is more generous than the old
   limit ever was.
6. ``uneven``: otherwise: this replica's bucket is empty while the fleet, counted as a whole,
   has room: the load is not balanced over the replicas.

The reference is evaluated only where its answer matters (:func:`needs_reference`: a global
limit stricter than the local one); under any other a new rejection is ``replicas`` as it
stands. A forward divergence whose reference was needed and not evaluated (the route's
``explain: false``, a failed or dropped evaluation) has no cause (:func:`cause_of` returns
None): it is counted as unexplained.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from limiter import Algorithm, Decision, Policy

from .rollout import Divergence

__all__ = [
    "EXCUSED",
    "FORWARD",
    "MEANING",
    "REVERSE",
    "Birth",
    "Cause",
    "CauseFigures",
    "cause_of",
    "direction_of",
    "is_fresh",
    "main_cause",
    "more_generous",
    "needs_reference",
    "no_stricter",
    "refill_us",
    "remembers",
    "summary",
]


class Cause(str, Enum):
    """Why a decision diverged (the module docstring defines each)."""

    REPLICAS = "replicas"
    TIGHTER = "tighter"
    FRESH_LOCAL = "fresh_local"
    CLOCK = "clock"
    UNEVEN = "uneven"
    LOOSER = "looser"


#: the causes of a new rejection (local admits, global would reject), in precedence order
FORWARD = (Cause.CLOCK, Cause.FRESH_LOCAL, Cause.REPLICAS, Cause.TIGHTER)
#: the causes of the reverse (local rejects, global would admit)
REVERSE = (Cause.LOOSER, Cause.UNEVEN)
#: new rejections that enforcing would not make a policy question of: the gate's
#: ``gate_counts: tighter`` leaves them out (a new rejection with no cause counts)
EXCUSED = (Cause.REPLICAS, Cause.FRESH_LOCAL, Cause.CLOCK)

#: what each cause means, in words (the API's summary, the dashboard, the CLI)
MEANING: Mapping[Cause, str] = {
    Cause.REPLICAS: "the fleet multiplied the old limit",
    Cause.TIGHTER: "the new limit is tighter",
    Cause.FRESH_LOCAL: "a replica's bucket was new (restart or eviction)",
    Cause.CLOCK: "a replica's clock is off",
    Cause.UNEVEN: "the load was uneven over the replicas",
    Cause.LOOSER: "the new limit is looser",
}


def direction_of(cause: Cause) -> Divergence:
    """The divergence class a cause explains."""
    return Divergence.LOCAL_ALLOW_DISTRIBUTED_DENY if cause in FORWARD else Divergence.LOCAL_DENY_DISTRIBUTED_ALLOW


@dataclass(frozen=True, slots=True, kw_only=True)
class Birth:
    """When the replica's store made a key's bucket (``created_us``) and when, before that, it
    last forgot its buckets (``forgot_us``: the replica's start, or its last eviction)."""

    created_us: int
    forgot_us: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CauseFigures:
    """Everything :func:`cause_of` looks at for one divergent decision.

    ``reference_allowed``: the reference's answer (None: not evaluated). ``birth``: the local
    bucket's (None: unknown). ``fleet_before``: the fleet was deciding the route before the
    store forgot its buckets (``birth.forgot_us``). ``remembered``: the global state remembered
    earlier use when the bucket was made. ``skew_us``: this replica's clock minus Redis'
    (None: not measured). ``caller_clock``: the policies are decided on the replica's clock.
    ``fleet_size``: live replicas."""

    local_allowed: bool
    global_allowed: bool
    reference_allowed: bool | None
    now_us: int
    local_policy: Policy
    global_policy: Policy
    birth: Birth | None = None
    fleet_before: bool = False
    remembered: bool = False
    skew_us: int | None = None
    tolerance_us: int = 250_000
    caller_clock: bool = True
    fleet_size: int = 1


def cause_of(f: CauseFigures) -> Cause | None:
    """The cause of a divergent decision (the module docstring's order); None for a new
    rejection whose reference was needed (:func:`needs_reference`) and not evaluated, and for
    a pair that agrees."""
    if f.local_allowed == f.global_allowed:
        return None
    if f.local_allowed:
        if f.caller_clock and f.skew_us is not None and abs(f.skew_us) > f.tolerance_us:
            return Cause.CLOCK
        if f.remembered and f.fleet_before and f.birth is not None and is_fresh(f.birth, f.now_us, f.local_policy):
            return Cause.FRESH_LOCAL
        if no_stricter(f.global_policy, f.local_policy):
            return Cause.REPLICAS  # whatever the reference answers (it is not evaluated: needs_reference)
        if f.reference_allowed is None:
            return None
        return Cause.TIGHTER if f.reference_allowed else Cause.REPLICAS
    return Cause.LOOSER if more_generous(f.global_policy, f.local_policy, f.fleet_size) else Cause.UNEVEN


def refill_us(policy: Policy) -> int:
    """How long the policy takes to forget what a key did: an empty bucket's time to refill
    (token bucket, GCRA), a window (fixed window, sliding log), two windows (sliding window:
    the previous one still counts); 0 for an unlimited or blocking policy."""
    if policy.unlimited or policy.blocked:
        return 0
    if policy.algorithm in (Algorithm.TOKEN_BUCKET, Algorithm.GCRA):
        return math.ceil(policy.burst * policy.period_us / policy.average)
    if policy.algorithm is Algorithm.SLIDING_WINDOW:
        return 2 * policy.period_us
    return policy.period_us


def is_fresh(birth: Birth, now_us: int, policy: Policy) -> bool:
    """The bucket is younger than the policy's refill time and was made less than that after
    the store forgot its buckets: it may hold more than the bucket it replaced would have."""
    refill = refill_us(policy)
    return now_us - birth.created_us < refill and birth.created_us - birth.forgot_us < refill


def remembers(answer: Decision, new_key: Decision, algorithm: Algorithm) -> bool:
    """Whether a limiter's ``answer`` shows earlier use, against ``new_key``, the answer a key
    never seen gets to the same request: what is left differs, or (the buckets, whose reset
    does not depend on the clock) the time to the full allowance does."""
    if (answer.allowed, answer.remaining) != (new_key.allowed, new_key.remaining):
        return True
    return algorithm in (Algorithm.TOKEN_BUCKET, Algorithm.GCRA) and answer.reset_after_us != new_key.reset_after_us


def more_generous(global_policy: Policy, local_policy: Policy, fleet_size: int) -> bool:
    """The global policy admits more than ``fleet_size`` replicas' local policies together: a
    higher rate or a larger burst (limit) than theirs summed."""
    if local_policy.unlimited:
        return False
    if global_policy.unlimited:
        return True
    n = max(1, fleet_size)
    g_rate = global_policy.average / global_policy.period
    l_rate = local_policy.average / local_policy.period
    return g_rate > n * l_rate or global_policy.limit > n * local_policy.limit


def no_stricter(global_policy: Policy, local_policy: Policy) -> bool:
    """The global policy admits at least what one replica's local policy does: a rate and a
    burst (limit) no lower than its own. A new rejection under it is never ``tighter``."""
    if global_policy.unlimited:
        return True
    if local_policy.unlimited or global_policy.blocked:
        return False
    g_rate = global_policy.average / global_policy.period
    l_rate = local_policy.average / local_policy.period
    return g_rate >= l_rate and global_policy.limit >= local_policy.limit


def needs_reference(global_policy: Policy, local_policy: Policy) -> bool:
    """Whether a new rejection's cause depends on the reference's answer: only under a global
    limit stricter than the local one (:func:`no_stricter`); under any other it is ``replicas``
    whatever the reference answers, so the reference is not evaluated."""
    return not no_stricter(global_policy, local_policy)


def main_cause(counts: Mapping[Cause, int]) -> Cause | None:
    """The cause with the most decisions (in precedence order on a tie); None without any."""
    best: Cause | None = None
    for cause in (*FORWARD, *REVERSE):
        n = counts.get(cause, 0)
        if n > 0 and (best is None or n > counts.get(best, 0)):
            best = cause
    return best


def summary(counts: Mapping[Cause, int], unexplained: int = 0) -> str:
    """The shares in words, largest first: ``74% the fleet multiplied the old limit · 26% the
    new limit is tighter`` (``unexplained``: decisions without a cause); empty without any."""
    total = sum(counts.values()) + unexplained
    if total <= 0:
        return ""
    parts = [(n, MEANING[c]) for c, n in counts.items() if n > 0]
    if unexplained > 0:
        parts.append((unexplained, "not explained (no reference evaluated)"))
    parts.sort(key=lambda p: -p[0])
    return " · ".join(f"{_percent(n / total)} {words}" for n, words in parts)


def _percent(share: float) -> str:
    """A share as a whole percentage, never rounded to 0% or 100% when it is not."""
    p = round(share * 100)
    if p == 0 and share > 0:
        return "<1%"
    if p == 100 and share < 1:
        return ">99%"
    return f"{p}%"
