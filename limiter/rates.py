"""Limits written as text: ``"100/minute"``, ``"1000 per hour"``, ``"100/5 minutes"``, ``"5/1s"``.

The grammar is the ``limits`` library's (``N/unit``, ``N per unit``, an optional multiplier
before the unit, plural units, any case), with short units too::

    LIMIT  := N ("/" | "per") [M] UNIT         (spaces between the parts optional)
    N, M   := a whole or decimal number (0.5, 10, 2.5)
    UNIT   := ms | msec | millisecond(s)   s | sec(s) | second(s)   m | min(s) | minute(s)
              h | hr(s) | hour(s)           d | day(s)

``N`` is the quantity per window and ``M UNIT`` the window (``M`` defaults to 1):
``"100/5 minutes"`` is 100 per 300 seconds. One limit per text (``limits``' ``"1/second;
5/minute"`` lists are refused), and no months or years (they have no fixed length: write
``"30 days"``). Pure parsing, no IO: :meth:`limiter.policy.Policy.parse` builds a policy
from it.

>>> parse_rate("100/minute")
(100.0, 60.0)
>>> parse_rate("1000 per 2 hours")
(1000.0, 7200.0)
"""

from __future__ import annotations

import re

__all__ = ["LIMIT_EXAMPLES", "LIMIT_PATTERN", "UNIT_SECONDS", "any_case", "parse_rate"]

#: every unit word (lower case) and its length in seconds
UNIT_SECONDS: dict[str, float] = {
    **dict.fromkeys(("ms", "msec", "msecs", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86_400.0),
}
#: what error messages show as examples of the grammar
LIMIT_EXAMPLES = '"100/minute", "5/1s", "1000 per hour", "100/5 minutes"'

_NUMBER = r"[0-9]+(?:\.[0-9]+)?"


def any_case(word: str) -> str:
    """``"per"`` -> ``"[pP][eE][rR]"``: case-insensitive without a flag, so the same
    pattern works in Python and in a JSON Schema (ECMA-262 patterns have no flags)."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


_UNITS = "|".join(any_case(u) for u in sorted(UNIT_SECONDS, key=lambda u: (-len(u), u)))
LIMIT_PATTERN = rf"^\s*({_NUMBER})\s*(?:/|{any_case('per')})\s*(?:({_NUMBER})\s*)?({_UNITS})\s*$"
"""The grammar as one regular expression, valid in Python and in JSON Schema (ECMA-262);
groups: the quantity, the multiplier (or None), the unit."""

_LIMIT = re.compile(LIMIT_PATTERN)
_UNFIXED = re.compile(rf"(?:{_NUMBER}\s*)?({any_case('month')}|{any_case('year')})[sS]?\s*$")


def parse_rate(text: object) -> tuple[float, float]:
    """``(quantity, window in seconds)`` from a limit text; :class:`ValueError` (``"limit: ..."``)
    naming the text otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"limit: must be a text like {LIMIT_EXAMPLES}, got {type(text).__name__} {text!r}")
    m = _LIMIT.match(text)
    if m is None:
        if _UNFIXED.search(text):
            raise ValueError(
                f"limit: months and years have no fixed length; write days (30 days, 365 days), got {text!r}"
            )
        raise ValueError(f"limit: expected N/period or N per period like {LIMIT_EXAMPLES}, got {text!r}")
    quantity = float(m.group(1))
    multiplier = float(m.group(2)) if m.group(2) is not None else 1.0
    if multiplier <= 0:
        raise ValueError(f"limit: the period must be longer than 0, got {text!r}")
    return quantity, multiplier * UNIT_SECONDS[m.group(3).lower()]
