"""Rate-limit policy and decision types: validated, immutable, no IO.

A :class:`Policy` says how much traffic a key may send; a :class:`Decision` is the
answer to one request. Both are shared by the in-process limiter, the Redis Lua
scripts and the control plane, so they are small frozen dataclasses.

Units: time in integer microseconds everywhere inside the engine; ``period`` is
given in seconds for humans and converted once, here.

Bounds: every time a decision derives from a policy (refill, retry, reset, key TTL)
stays below :data:`MAX_REFILL_S` plus two periods, so a microsecond timestamp plus any
of them is exact in a 64-bit integer and in a double (2^53 us is the year 2255), which
is what Python, the C path, the Lua scripts and JSON all need. A policy outside the
bounds is refused here, naming the field, instead of failing every decision later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from .rates import parse_rate

__all__ = [
    "Algorithm",
    "BucketView",
    "Charge",
    "Decision",
    "MAX_AVERAGE",
    "MAX_BURST",
    "MAX_COST",
    "MAX_LOG_LIMIT",
    "MAX_PERIOD_S",
    "MAX_REFILL_S",
    "MIN_EMISSION_US",
    "MIN_PERIOD_S",
    "NO_LOG_CHARGE",
    "Policy",
    "make_decision",
    "takes_charges",
    "validate_charge",
    "validate_cost",
]

MIN_PERIOD_S = 0.001
MAX_PERIOD_S = 366 * 86_400.0
#: the largest bucket (``burst``): budgets of up to 10^12 units (LLM tokens, bytes), every
#: balance an exact whole number in a double (docs/algorithms.md#charges)
MAX_BURST = 1_000_000_000_000
#: the most tokens (or requests) per period: the windowed limit and the default burst stay <= 10^12
MAX_AVERAGE = 1_000_000_000_000
#: the sliding log holds one entry per request counted: at most 10^9 of them a window
MAX_LOG_LIMIT = 1_000_000_000
#: a full bucket must refill within 10 years of 365 days: burst * period / average <= this
MAX_REFILL_S = 10 * 365 * 86_400
#: the largest charge (a cost known after the answer, :class:`Charge`): 10^9 units a request
MAX_COST = 1_000_000_000
#: why the sliding log takes no charge (the rules check and the API say it)
NO_LOG_CHARGE = (
    "algorithm: sliding_log keeps one entry per unit, so a charge (a cost known after the answer, up to "
    "10^9 units) would hold that many entries: use sliding_window for budgets"
)
#: GCRA adds one emission interval per token to a stored time of about 2^50 us, whose
#: resolution is 0.25 us: a shorter interval would be rounded away, so it is refused
MIN_EMISSION_US = 1.0


class Algorithm(str, Enum):
    """The decision models; each has one pure function and one Lua script."""

    TOKEN_BUCKET = "token_bucket"
    GCRA = "gcra"
    FIXED_WINDOW = "fixed_window"
    SLIDING_WINDOW = "sliding_window"
    SLIDING_LOG = "sliding_log"

    def __str__(self) -> str:  # "token_bucket", not "Algorithm.TOKEN_BUCKET"
        return self.value

    @property
    def windowed(self) -> bool:
        """True for the algorithms that count requests per window of ``period``."""
        return self in _WINDOWED


_WINDOWED = frozenset({Algorithm.FIXED_WINDOW, Algorithm.SLIDING_WINDOW, Algorithm.SLIDING_LOG})


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond the float range
        raise ValueError(f"{name}: must be finite, got an integer of {len(str(abs(value)))} digits") from None
    if not math.isfinite(v):
        raise ValueError(f"{name}: must be finite, got {value!r}")
    return v


def _span(seconds: float) -> str:
    """``"3.2 years"``, ``"40 days"``: a long time, for error messages."""
    if seconds >= 365 * 86_400:
        return f"{seconds / (365 * 86_400):.3g} years"
    return f"{seconds / 86_400:.3g} days"


def _burst(burst: object, average: float, unlimited: bool) -> int:
    """The bucket size: given (a whole number in bounds) or ``ceil(average)``."""
    if burst is None:
        return max(1, math.ceil(average)) if not unlimited else 1
    b = _number("burst", burst)
    if b != int(b):
        raise ValueError(f"burst: must be a whole number of tokens, got {burst!r}")
    if b < 1 or b > MAX_BURST:
        raise ValueError(f"burst: must be between 1 and {MAX_BURST}, got {burst!r}")
    return int(b)


def _check_rate(algorithm: Algorithm, average: float, period: float, burst: int, period_us: int) -> float:
    """Refuse a rate outside the bounds (module docstring); returns the emission interval in us."""
    refill_s = burst * period / average  # a full bucket from empty; also drives the key TTL
    if refill_s > MAX_REFILL_S:
        raise ValueError(
            f"average: {average:g} per {period:g} s takes {refill_s:.10g} s ({_span(refill_s)}) to refill "
            f"burst {burst}; at most 10 years ({MAX_REFILL_S} s) is allowed: raise average, or lower burst or period"
        )
    emission_us = period_us / average
    if algorithm is Algorithm.GCRA and emission_us < MIN_EMISSION_US:
        raise ValueError(
            f"average: gcra needs at least {MIN_EMISSION_US:g} us per token (average / period at most "
            f"{1_000_000 / MIN_EMISSION_US:.0f} per second), got {emission_us:.3g} us; "
            "use token_bucket for higher rates"
        )
    return emission_us


@dataclass(frozen=True, slots=True, init=False)
class Policy:
    """How much a key may send.

    ``average`` tokens are added per ``period`` seconds and the bucket holds at most
    ``burst`` tokens (token bucket, GCRA). The windowed algorithms allow
    ``floor(average)`` requests per window of ``period`` seconds and ignore burst
    except for the key TTL. ``average <= 0`` means unlimited; a policy that
    denies everything is :meth:`blocking` (``blocked``, ``limit == 0``).
    ``algorithm`` is an :class:`Algorithm` or its name (``"gcra"``).

    >>> Policy(average=100, period=1.0, burst=20).limit
    20
    """

    average: float
    period: float
    burst: int
    algorithm: Algorithm

    # derived, computed once in __init__ so the hot path does no arithmetic twice
    period_us: int = field(init=False, repr=False, compare=False)
    unlimited: bool = field(init=False, repr=False, compare=False)
    limit: int = field(init=False, repr=False, compare=False)
    burst_f: float = field(init=False, repr=False, compare=False)
    rate_per_us: float = field(init=False, repr=False, compare=False)
    emission_us: float = field(init=False, repr=False, compare=False)
    ttl_s: int = field(init=False, repr=False, compare=False)
    ttl_us: int = field(init=False, repr=False, compare=False)
    #: :meth:`blocking` (a limit of 0): compared and hashed, so a blocking policy never
    #: equals the unlimited one it shares ``average == 0`` with
    blocked: bool = field(init=False, repr=False, compare=True)

    def __init__(
        self,
        average: float,
        period: float = 1.0,
        burst: int | None = None,
        algorithm: Algorithm | str = Algorithm.TOKEN_BUCKET,
    ) -> None:
        s = object.__setattr__
        try:
            alg = Algorithm(algorithm)
        except ValueError:
            allowed = ", ".join(a.value for a in Algorithm)
            raise ValueError(f"algorithm: must be one of {allowed}, got {algorithm!r}") from None
        s(self, "algorithm", alg)
        s(self, "blocked", False)
        avg = _number("average", average)
        per = _number("period", period)
        if per < MIN_PERIOD_S or per > MAX_PERIOD_S:
            raise ValueError(f"period: must be between {MIN_PERIOD_S} and {MAX_PERIOD_S:.0f} seconds, got {period!r}")
        s(self, "average", avg)
        s(self, "period", per)
        period_us = round(per * 1_000_000)
        s(self, "period_us", period_us)
        unlimited = avg <= 0
        s(self, "unlimited", unlimited)
        if alg.windowed and not unlimited and avg < 1:
            raise ValueError(
                f"average: {alg.value} counts whole requests per window, so it must be >= 1 "
                f"(or <= 0 for unlimited), got {average!r}"
            )
        if avg > MAX_AVERAGE:
            raise ValueError(f"average: must be at most {MAX_AVERAGE} per period, got {avg:g}")
        if alg is Algorithm.SLIDING_LOG and avg > MAX_LOG_LIMIT:
            raise ValueError(
                f"average: sliding_log keeps one entry per request, at most {MAX_LOG_LIMIT} a window, got {avg:g}: "
                "use sliding_window for larger budgets"
            )
        b = _burst(burst, avg, unlimited)
        s(self, "burst", b)
        s(self, "burst_f", float(b))
        if unlimited:
            s(self, "limit", b)
            s(self, "rate_per_us", 0.0)
            s(self, "emission_us", 0.0)
            s(self, "ttl_s", math.ceil(per) * 2)
            s(self, "ttl_us", self.ttl_s * 1_000_000)
            return
        emission_us = _check_rate(alg, avg, per, b, period_us)
        s(self, "limit", math.floor(avg) if alg.windowed else b)
        s(self, "rate_per_us", avg / period_us)
        s(self, "emission_us", emission_us)
        # the key's TTL (docs/algorithms.md#key-expiry):
        # max(ceil(burst / average_per_second), period_seconds) + period_seconds
        per_s = avg / per
        period_s = math.ceil(per)
        s(self, "ttl_s", max(math.ceil(b / per_s), period_s) + period_s)
        s(self, "ttl_us", self.ttl_s * 1_000_000)

    @classmethod
    def parse(
        cls, text: str, *, burst: int | None = None, algorithm: Algorithm | str = Algorithm.TOKEN_BUCKET
    ) -> Policy:
        """A policy from a limit written as text (:mod:`limiter.rates`): ``"100/minute"`` is
        ``average=100, period=60``. ``burst`` defaults to the quantity (``ceil``: a full
        window's worth, as for ``Policy(average=100, period=60)``), so ``"100/minute"`` allows
        100 at once, then 100 a minute. ``"0/second"`` is unlimited, as ``average=0``.

        >>> Policy.parse("1000 per hour", burst=50).describe()
        '1000/3600s burst 50 (token_bucket)'

        Raises :class:`ValueError`: ``"limit: ..."`` naming the text (an average or period
        the policy refuses included), or ``"burst: ..."`` / ``"algorithm: ..."``.
        """
        average, period = parse_rate(text)
        try:
            return cls(average=average, period=period, burst=burst, algorithm=algorithm)
        except ValueError as exc:
            name, _, reason = str(exc).partition(": ")
            if name in ("average", "period"):
                raise ValueError(f"limit: {reason} (from {text!r})") from None
            raise

    @classmethod
    def unlimited_policy(cls) -> Policy:
        """A policy that allows everything (``average = 0``)."""
        return cls(average=0)

    def __repr__(self) -> str:  # the dataclass's, plus blocked=True for a blocking policy
        extra = ", blocked=True" if self.blocked else ""
        return (
            f"Policy(average={self.average!r}, period={self.period!r}, burst={self.burst!r}, "
            f"algorithm={self.algorithm!r}{extra})"
        )

    @classmethod
    def blocking(cls, period: float = 1.0) -> Policy:
        """A policy that denies every request: envoyproxy/ratelimit's ``requests_per_unit: 0``.

        A fixed window of ``period`` seconds with a limit of 0 (``limit == 0``,
        ``blocked == True``, ``unlimited == False``). It is decided without any store: every
        request (of any cost >= 1) is denied with ``remaining = 0`` and ``retry_after_us =
        reset_after_us`` = the time to the end of the current window; nothing is read or
        written, and :class:`~limiter.redis_limiter.RedisLimiter` does not call Redis.

        >>> Policy.blocking(60).describe()
        'blocks every request (60s windows, fixed_window)'
        """
        p = cls(average=0, period=period, burst=1, algorithm=Algorithm.FIXED_WINDOW)
        s = object.__setattr__
        s(p, "blocked", True)
        s(p, "unlimited", False)
        s(p, "limit", 0)
        # no token is ever added: rate 0; the emission interval is never used (no gcra)
        s(p, "rate_per_us", 0.0)
        s(p, "emission_us", 0.0)
        return p

    def describe(self) -> str:
        """A short human text, e.g. ``"100/1s burst 20 (token_bucket)"``."""
        per = f"{self.period:g}s"
        if self.blocked:
            return f"blocks every request ({per} windows, {self.algorithm.value})"
        if self.unlimited:
            return f"unlimited ({self.algorithm.value})"
        return f"{self.average:g}/{per} burst {self.burst} ({self.algorithm.value})"

    def to_dict(self) -> dict[str, object]:
        """The policy's fields; ``"blocked": True`` is added for a :meth:`blocking` policy only."""
        out: dict[str, object] = {
            "algorithm": self.algorithm.value,
            "average": self.average,
            "period": self.period,
            "burst": self.burst,
        }
        if self.blocked:
            out["blocked"] = True
        return out


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one request.

    ``remaining`` is whole tokens (or requests) left after this request;
    ``retry_after_us`` is 0 when allowed, else the exact wait until the same request
    would be allowed; ``reset_after_us`` is the wait until the key is back to its
    full allowance.
    """

    allowed: bool
    remaining: int
    limit: int
    retry_after_us: int
    reset_after_us: int

    def to_dict(self) -> dict[str, object]:
        return {
            "allowed": self.allowed,
            "remaining": self.remaining,
            "limit": self.limit,
            "retry_after_us": self.retry_after_us,
            "reset_after_us": self.reset_after_us,
        }


# Fast constructor for the hot path: a frozen dataclass's __init__ goes through
# object.__setattr__ once per field; setting the slots directly is ~3x cheaper.
_new = object.__new__
_set_allowed = Decision.__dict__["allowed"].__set__
_set_remaining = Decision.__dict__["remaining"].__set__
_set_limit = Decision.__dict__["limit"].__set__
_set_retry = Decision.__dict__["retry_after_us"].__set__
_set_reset = Decision.__dict__["reset_after_us"].__set__


def make_decision(allowed: bool, remaining: int, limit: int, retry_after_us: int, reset_after_us: int) -> Decision:
    """Build a :class:`Decision` without the frozen-dataclass ``__setattr__`` detour."""
    d = _new(Decision)
    _set_allowed(d, allowed)
    _set_remaining(d, remaining)
    _set_limit(d, limit)
    _set_retry(d, retry_after_us)
    _set_reset(d, reset_after_us)
    return d


@dataclass(frozen=True, slots=True)
class BucketView:
    """A key's allowance now, read without consuming anything (dashboards, admin).

    ``tokens`` is exact for the token bucket (fractional tokens included) and the
    whole requests left for the other algorithms.
    """

    tokens: float
    limit: int
    exists: bool
    reset_after_us: int

    def to_dict(self) -> dict[str, object]:
        return {
            "tokens": self.tokens,
            "limit": self.limit,
            "exists": self.exists,
            "reset_after_us": self.reset_after_us,
        }


class Charge(int):
    """A cost known only after the answer (an LLM answer's tokens): a *charge*, counted
    whatever is left, even when it takes the key into debt (:mod:`limiter.charges`), where a
    plain ``int`` cost is a request, refused when what is left cannot cover it. Negative, it is
    a refund (a settled reservation that cost less than its estimate). Pass it wherever a cost
    goes: ``limiter.check(key, policy, Charge(1200))``.

    >>> Charge(1200)
    Charge(1200)
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Charge({int(self)})"

    def __str__(self) -> str:  # the number, as an int's: written to Redis, logs, JSON
        return int.__repr__(self)


def validate_charge(policy: Policy, cost: Charge) -> Charge:
    """Check a charge: a whole number of at most :data:`MAX_COST` units either way, on a
    policy that takes charges (not the sliding log, :data:`NO_LOG_CHARGE`)."""
    if abs(cost) > MAX_COST:
        raise ValueError(f"cost: a charge is at most {MAX_COST} units, got {int(cost)}")
    if not takes_charges(policy):
        raise ValueError(NO_LOG_CHARGE)
    return cost


def takes_charges(policy: Policy) -> bool:
    """Whether a :class:`Charge` may be counted on ``policy``: every algorithm but the sliding
    log, whose log would hold one entry per unit (:data:`NO_LOG_CHARGE`); an unlimited or a
    blocking policy of any algorithm, which counts nothing."""
    return policy.algorithm is not Algorithm.SLIDING_LOG or policy.unlimited or policy.blocked


def validate_cost(policy: Policy, cost: object) -> int:
    """Check a request's cost: a whole number from 1 to the policy's limit (any cost
    from 1 for a :meth:`Policy.blocking` policy, whose answer is always a denial); a
    :class:`Charge` as :func:`validate_charge` says.

    A cost of 0 (a peek, which spends nothing) is refused here: the limiters' ``check``
    methods take an int 0 as a peek before they call this."""
    if cost.__class__ is Charge:
        return validate_charge(policy, cost)
    if type(cost) is not int:
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost != int(cost):
            raise ValueError(f"cost: must be a whole number >= 1, got {cost!r}")
        cost = int(cost)
    if cost < 1:
        raise ValueError(f"cost: must be >= 1, got {cost!r}")
    if cost > policy.limit and not policy.unlimited and not policy.blocked:
        raise ValueError(f"cost: {cost} exceeds the policy's limit of {policy.limit}, so it could never be allowed")
    return cost
