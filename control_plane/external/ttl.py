"""How long an answer from the limits service is cached: the order of the HTTP
cache headers and the body's hints (:func:`resolve_ttl`). No IO; the clock is an argument."""

from __future__ import annotations

import email.utils

__all__ = ["MAX_TTL_S", "STALE_TTL_S", "resolve_ttl", "response_forbids_storing"]

#: how long the stale copy (the fallback when the service fails) is kept, in seconds
STALE_TTL_S = 300
#: a cap on what a response may ask for (Redis EX limits)
MAX_TTL_S = 366 * 86_400.0


def _cache_directives(cache_control: str | None) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    if not cache_control:
        return out
    for part in cache_control.split(","):
        name, eq, value = part.strip().partition("=")
        name = name.strip().lower()
        if name and name not in out:
            out[name] = value.strip().strip('"') if eq else None
    return out


def resolve_ttl(
    cache_control: str | None,
    expires: str | None,
    *,
    body_no_store: bool,
    body_max_age: int | None,
    default_ttl_s: float,
    now: float,
) -> float:
    """Seconds to cache an HTTP response (0: do not cache), in this order:

    1. ``Cache-Control: max-age=N``: N seconds (``max-age=0``: not cached);
    2. ``Cache-Control: no-cache`` or ``no-store``: not cached;
    3. ``Expires``: the time until then (a date in the past, or one that does not
       parse, means already expired: not cached, as RFC 9111 says);
    4. body ``cache_no_store: true``: not cached;
    5. body ``cache_max_age_seconds: N`` (N > 0): N seconds;
    6. otherwise the route's ``cache_ttl`` (``default_ttl_s``).

    ``now`` is the wall clock (Unix seconds) that ``Expires`` is compared with.
    """
    cc = _cache_directives(cache_control)
    max_age = cc.get("max-age")
    if max_age is not None and max_age.isdigit():
        return min(float(max_age), MAX_TTL_S)
    if "no-cache" in cc or "no-store" in cc:
        return 0.0
    if expires is not None and expires.strip():
        return _until(expires.strip(), now)
    if body_no_store:
        return 0.0
    if body_max_age is not None and body_max_age > 0:
        return min(float(body_max_age), MAX_TTL_S)
    return max(0.0, default_ttl_s)


def _until(expires: str, now: float) -> float:
    """Seconds from ``now`` to an ``Expires`` date; 0 if it is past or does not parse."""
    try:
        at = email.utils.parsedate_to_datetime(expires)
    except (TypeError, ValueError, IndexError, OverflowError):
        return 0.0
    if at.tzinfo is None:
        return 0.0
    return min(max(0.0, at.timestamp() - now), MAX_TTL_S)


def response_forbids_storing(cache_control: str | None, body_no_store: bool) -> bool:
    """``no-store`` (header or body): keep no copy at all, not even the stale one."""
    return body_no_store or "no-store" in _cache_directives(cache_control)
