"""Durations as written in the rules file and by the external limits service."""

from __future__ import annotations

import math
import re

__all__ = ["DURATION_PATTERN", "parse_duration"]

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_BARE_NUMBER = re.compile(r"(\d+(?:\.\d*)?|\.\d+)")
_JSON_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_JSON_UNITS = "|".join(sorted(_UNITS, key=len, reverse=True))
DURATION_PATTERN = rf"^\s*(?:{_JSON_NUMBER}|(?:{_JSON_NUMBER} *(?:{_JSON_UNITS}) *)+)\s*$"
"""A duration string (as :func:`parse_duration` reads it) as one regular expression valid in
JSON Schema (ECMA-262): what ``docs/rules.schema.json`` checks periods and timeouts with."""


def parse_duration(value: object) -> float:
    """Seconds from a number (``1``, ``0.5``) or a duration string.

    Strings are a bare number of seconds (``"1.5"``) or one or more number+unit parts
    with units ``ms s m h d`` (``"500ms"``, ``"1s"``, ``"1.5s"``, ``"1m30s"``).
    Raises :class:`ValueError` (``"period: ..."``).
    """
    if isinstance(value, bool):
        raise ValueError(f"period: must be a number of seconds or a duration like 500ms, 1s, 1m, 1h, got {value!r}")
    if isinstance(value, (int, float)):
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"period: must be finite, got {value!r}")
        return v
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        if _BARE_NUMBER.fullmatch(text):
            return float(text)
        pos, total = 0, 0.0
        for m in _DURATION_PART.finditer(text):
            if m.start() != pos:
                break
            total += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if text and pos == len(text):
            return total
    raise ValueError(
        f"period: invalid duration {value!r}; use a number of seconds or a duration like 500ms, 1s, 1.5s, 1m, 1h"
    )
