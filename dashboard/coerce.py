"""Lenient coercions for the control plane's JSON: a missing or malformed field becomes
a neutral default instead of an error, so a newer (or older) control plane still renders::

    as_int("12") == 12, as_int(None) == 0, opt_float(None) is None, as_dict([]) == {}, as_list(3) == []
"""

from __future__ import annotations

from typing import Any

__all__ = ["as_dict", "as_float", "as_int", "as_list", "as_str", "opt_float", "opt_str"]


def as_dict(v: Any) -> dict[str, Any]:
    """``v`` if it is a dict, else an empty one."""
    return v if isinstance(v, dict) else {}


def as_list(v: Any) -> list[Any]:
    """``v`` if it is a list, else an empty one (a string or a number is not a list of items)."""
    return v if isinstance(v, list) else []


def as_float(v: Any, default: float = 0.0) -> float:
    """``float(v)``, or ``default`` when ``v`` is not a number."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def opt_float(v: Any) -> float | None:
    """``None`` stays ``None``; anything else as :func:`as_float`."""
    return None if v is None else as_float(v)


def as_int(v: Any, default: int = 0) -> int:
    """``int(v)``, or ``default`` when ``v`` is not a number."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def as_str(v: Any, default: str = "") -> str:
    """``str(v)``, or ``default`` for ``None``."""
    return default if v is None else str(v)


def opt_str(v: Any) -> str | None:
    """``None`` stays ``None``; anything else as ``str(v)``."""
    return None if v is None else str(v)
