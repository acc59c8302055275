"""The rate-limit response headers: seed 002's ``X-RateLimit-*`` and ``Retry-After``, and
draft-ietf-httpapi-ratelimit-headers-11's ``RateLimit-Policy`` / ``RateLimit``.

In shadow (and the shadowed share of canary), ``RateLimit-Policy`` also describes the
distributed limit that is coming, marked with the vendor parameter ``sl-shadow``, so
clients can adapt before enforcement starts.
"""

from __future__ import annotations

import math

from limiter import Decision, Policy
from limiter.policy import Algorithm

__all__ = ["policy_header", "rate_limit_headers", "render_headers", "shadow_policy_text", "window_s"]

_WINDOWS: dict[int, tuple[Policy, int]] = {}  # id(policy) -> (policy, window)
_SHADOW_POLICIES: dict[tuple[str, int], tuple[Policy, str]] = {}  # (route, id(policy)) -> (policy, text)


def window_s(policy: Policy) -> int:
    """The IETF header's window: how long the full quota takes to come back."""
    # looked up by identity (the policy kept in the entry guards against a reused id):
    # hashing a Policy dataclass on every request is not free
    e = _WINDOWS.get(id(policy))
    if e is not None and e[0] is policy:
        return e[1]
    if policy.unlimited:
        w = 0
    elif Algorithm(policy.algorithm).windowed:
        w = max(1, math.ceil(policy.period))
    else:
        w = max(1, math.ceil(policy.burst_f / (policy.average / policy.period)))
    if len(_WINDOWS) > 4096:
        _WINDOWS.clear()
    _WINDOWS[id(policy)] = (policy, w)
    return w


def shadow_policy_text(route: str, policy: Policy) -> str:
    """The ``RateLimit-Policy`` item that announces the distributed limit to come."""
    k = (route, id(policy))
    e = _SHADOW_POLICIES.get(k)
    if e is not None and e[0] is policy:
        return e[1]
    text = f', "{route}-global";q={policy.limit};w={window_s(policy)};sl-shadow'
    if len(_SHADOW_POLICIES) > 4096:
        _SHADOW_POLICIES.clear()
    _SHADOW_POLICIES[k] = (policy, text)
    return text


def policy_header(route: str, limit: int, policy: Policy, shadow_policy: Policy | None) -> str:
    """``RateLimit-Policy`` for a limit under ``policy`` (shadowing ``shadow_policy``)."""
    h = f'"{route}";q={limit};w={window_s(policy)}'
    return h if shadow_policy is None else h + shadow_policy_text(route, shadow_policy)


def render_headers(route: str, decision: Decision, limit_s: str, policy_h: str, now_s: float) -> dict[str, str]:
    """The headers of one decision, given its limit as text and its ``RateLimit-Policy``
    (both the same for every decision of a route under one policy: callers cache them)."""
    remaining = decision.remaining
    rem = str(remaining) if remaining > 0 else "0"
    reset_s = math.ceil(decision.reset_after_us / 1_000_000)
    headers = {
        "X-RateLimit-Limit": limit_s,
        "X-RateLimit-Remaining": rem,
        "X-RateLimit-Reset": str(int(now_s) + reset_s),
        "RateLimit-Policy": policy_h,
        "RateLimit": f'"{route}";r={rem};t={reset_s}',
    }
    if not decision.allowed:
        headers["Retry-After"] = str(max(1, math.ceil(decision.retry_after_us / 1_000_000)))
    return headers


def rate_limit_headers(
    route: str, decision: Decision, policy: Policy, *, shadow_policy: Policy | None, now_s: float
) -> dict[str, str]:
    """The headers of one decision under ``policy`` (announcing ``shadow_policy``)."""
    return render_headers(
        route, decision, str(decision.limit), policy_header(route, decision.limit, policy, shadow_policy), now_s
    )
