"""A route's ``budget`` block: how its reservations live (:class:`limiter.reservations.Terms`),
one :class:`~.spec.Key` row per key as every block of the rules file (:mod:`.spec`)."""

from __future__ import annotations

import re
from typing import Any

from limiter.policy import Algorithm, Policy
from limiter.reservations import Terms

from ..model.rollout import GATE_WEIGHTS
from .errors import FieldPath
from .fields import FieldReader
from .spec import MISSING, Block, Got, Key, duration_schema, whole

__all__ = [
    "BUDGET",
    "COST_UNIT_PATTERN",
    "DEFAULT_MAX_RESERVATIONS",
    "DEFAULT_RESERVATION_TTL_S",
    "MAX_RESERVATIONS",
    "NO_COSTS",
    "RESERVATION_TTL_MAX_S",
    "read_cost_unit",
    "read_gate_weight",
]

RESERVATION_TTL_MAX_S = 86_400.0
"""The longest ``budget.reservation_ttl`` (seconds; more than 0)."""
DEFAULT_RESERVATION_TTL_S = 300.0
"""A reservation's TTL when the route's budget gives none."""
MAX_RESERVATIONS = (1, 100_000)
"""The range of ``budget.max_reservations`` (inclusive)."""
DEFAULT_MAX_RESERVATIONS = 1000
"""The most reservations a key holds when the route's budget gives no bound."""


def _duration(hi: float) -> Any:
    def read(r: FieldReader, value: Any, path: FieldPath, got: Got) -> float:
        return r.duration(value, path, 0.0, hi, allow_zero=False)

    return read


def _word(words: tuple[str, ...]) -> Any:
    def read(r: FieldReader, value: Any, path: FieldPath, got: Got) -> str:
        if value not in words:
            raise r.error(path, f"must be {' or '.join(words)}, got {value!r}")
        return str(value)

    return read


def _build_budget(r: FieldReader, got: Got, path: FieldPath) -> Terms:
    """A route's reservation terms; refused where its limits cannot take them."""
    for side in ("local", "distributed"):
        policy: Policy = got.outer(side)
        if policy.algorithm is Algorithm.SLIDING_LOG:
            raise r.error(
                path,
                f"the {side} policy is a sliding_log, which keeps one entry per unit and takes no charges: "
                "a budget needs a token_bucket, gcra, fixed_window or sliding_window",
            )
    ttl_us = round(got["reservation_ttl"] * 1_000_000)
    return Terms(
        ttl_us=ttl_us,
        keep_us=ttl_us,
        positive=got["admit"] == "positive",
        release=got["on_expiry"] == "release",
        max_held=got["max_reservations"],
    )


BUDGET = Block(
    name="budget",
    definition=True,
    keys=(
        Key(
            name="reservation_ttl",
            read=_duration(RESERVATION_TTL_MAX_S),
            absent=lambda r, got: DEFAULT_RESERVATION_TTL_S,
            schema=duration_schema(RESERVATION_TTL_MAX_S, allow_zero=False),
            default_doc="`5m`",
            doc="How long a reservation waits for its settle (more than 0, at most `1d`); a settled or expired one is "
            "remembered as long again, so a repeated settle gets the first answer.",
        ),
        Key(
            name="on_expiry",
            read=_word(("charge", "release")),
            absent=lambda r, got: "charge",
            schema={"enum": ["charge", "release"]},
            default_doc="`charge`",
            doc="What becomes of a reservation left unsettled past its TTL: `charge` keeps its estimate spent, "
            "`release` gives it back (on a window, only while the window it was counted in lasts), when the key's "
            "records are next swept: at most a sixteenth of `reservation_ttl` later, or at once for its own settle.",
        ),
        Key(
            name="admit",
            read=_word(("cover", "positive")),
            absent=lambda r, got: "cover",
            schema={"enum": ["cover", "positive"]},
            default_doc="`cover`",
            doc="`cover`: a reservation is admitted only when what is left covers its estimate. `positive`: while "
            "anything is left (the way Envoy's look with `hits_addend: 0` admits), the estimate then taken "
            "whatever is left, into debt.",
        ),
        Key(
            name="max_reservations",
            read=lambda r, v, p, got: r.integer(v, p, *MAX_RESERVATIONS),
            absent=lambda r, got: DEFAULT_MAX_RESERVATIONS,
            schema=whole(*MAX_RESERVATIONS),
            default_doc="`1000`",
            doc="The most reservations a key holds at once, outstanding or remembered after they ended "
            "(1-100,000); past it a reservation is refused (429) until one is due.",
        ),
    ),
    build=_build_budget,
)
"""A route's ``budget`` block: how its reservations live (:class:`limiter.reservations.Terms`)."""


#: a budget's unit: a lower-case word
COST_UNIT_PATTERN = "^[a-z][a-z0-9_]{0,31}$"


def read_cost_unit(r: FieldReader, value: Any, path: FieldPath, got: Got) -> str:
    """A route's ``cost_unit``: a lower-case word, only on a route with a budget."""
    if not isinstance(value, str) or re.fullmatch(COST_UNIT_PATTERN, value) is None:
        raise r.error(path, "must be a lower-case word of at most 32 characters (tokens, credits, seconds)")
    if got.get("budget", MISSING) is MISSING:
        raise r.error(path, "this route's limits count requests: give it a budget block to count a cost in units")
    return value


#: why a cost-weighted gate is refused on a route without a budget
NO_COSTS = (
    "this route's requests have no cost to weigh (its limits count requests): give it a budget block, or weigh requests"
)


def read_gate_weight(r: FieldReader, value: Any, path: FieldPath, got: Got) -> str:
    """A route's ``gate_weight``: ``requests``, or ``cost`` on a route with a budget."""
    if value not in GATE_WEIGHTS:
        raise r.error(path, f"must be requests or cost, got {value!r}")
    if value == "cost" and got.get("budget", MISSING) is MISSING:
        raise r.error(path, NO_COSTS)
    return str(value)
