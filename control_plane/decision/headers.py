"""The rate-limit response headers: the legacy ``X-RateLimit-*`` and ``Retry-After``, and
draft-ietf-httpapi-ratelimit-headers-11 (May 2026)'s ``RateLimit-Policy`` / ``RateLimit``.

What each header says (docs/api.md, "Rate-limit headers"):

- ``RateLimit-Policy: "<route>";q=<quota>;w=<window>`` is the quota a client pacing itself is
  admitted: ``q`` requests every ``w`` seconds. For the buckets (token bucket, GCRA) that is the
  refill rate over the period (1000/s with burst 10 is ``q=1000;w=1``) and the burst, when it
  differs from ``q``, is the vendor parameter ``sl-burst``; for the fixed window and the sliding
  log it is the limit per window, for the sliding window counter one less (its estimate keeps the
  previous window's weighted share, so a steady client at the full limit is refused now and
  then). A period that is not a whole number of seconds is widened to the next whole second and
  the quota scaled down, so the advertised rate is never above the real one.
- ``RateLimit: "<route>";r=<remaining>;t=<seconds>``: ``t`` is the time until more quota is made
  available (the draft's reset parameter): on a rejection the Retry-After, else the time until the
  next whole unit comes back -- never more than the window.
- ``X-RateLimit-Limit/Remaining/Reset`` (the legacy set): the bucket's capacity, what is
  left, and when the key is back to its full allowance, as a Unix time (``reset="unix"``, the
  default) or in seconds from now (``reset="seconds"``, as Envoy and Kong send it).
- ``Retry-After`` on every rejection, whatever the style (it is HTTP's own field).

In shadow (and the shadowed share of canary), with ``announce_shadow``, ``RateLimit-Policy``
also describes the distributed limit that is coming, marked with the vendor parameter
``sl-shadow`` and named ``<route>-global``. It is off by default: it names internal routes and a
limit that is not enforced yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from limiter import Decision, Policy
from limiter.policy import Algorithm

__all__ = ["HeaderStyle", "PolicyHeaders", "policy_item", "quota", "rate_limit_headers"]

DRAFT = "draft-ietf-httpapi-ratelimit-headers-11"
_US = 1_000_000


@dataclass(frozen=True, slots=True)
class HeaderStyle:
    """Which rate-limit headers decisions carry (settings ``SHADOWLIMIT_HEADERS``,
    ``SHADOWLIMIT_ANNOUNCE_SHADOW``, ``SHADOWLIMIT_RESET_HEADER``)."""

    draft: bool = True  # RateLimit-Policy and RateLimit
    legacy: bool = True  # X-RateLimit-Limit/Remaining/Reset
    announce_shadow: bool = False  # the sl-shadow item in RateLimit-Policy
    reset_seconds: bool = False  # X-RateLimit-Reset in seconds from now instead of Unix time

    @classmethod
    def parse(cls, headers: str, *, announce_shadow: bool = False, reset: str = "unix") -> HeaderStyle:
        """From the settings' texts: ``headers`` is ``"draft,legacy"`` (any of the two, in
        any order) or ``"none"``; ``reset`` is ``"unix"`` or ``"seconds"``
        (``ValueError`` naming the text otherwise)."""
        parts = {p.strip().lower() for p in headers.split(",") if p.strip()}
        if parts == {"none"}:
            parts = set()
        elif not parts or not parts <= {"draft", "legacy"}:
            raise ValueError(f"must be 'draft', 'legacy', 'draft,legacy' or 'none', got {headers!r}")
        if reset not in ("unix", "seconds"):
            raise ValueError(f"must be 'unix' or 'seconds', got {reset!r}")
        return cls("draft" in parts, "legacy" in parts, announce_shadow, reset == "seconds")


def quota(policy: Policy) -> tuple[int, int]:
    """``(q, w)``: what a client pacing itself is admitted, ``q`` requests every ``w`` whole
    seconds (never a higher rate than the policy's)."""
    w = max(1, math.ceil(policy.period))
    if policy.algorithm is Algorithm.SLIDING_WINDOW:
        # the counter's estimate keeps the previous window's weighted share: a steady client is
        # admitted limit - 1 per window (a limit of 1: one every two windows)
        if policy.limit < 2:
            return 1, max(1, math.ceil(2 * policy.period))
        return policy.limit - 1, w
    if Algorithm(policy.algorithm).windowed:
        return policy.limit, w
    return max(1, math.floor(policy.average * w / policy.period + 1e-9)), w


def policy_item(name: str, policy: Policy, *, shadow: bool = False) -> str:
    """One ``RateLimit-Policy`` item for ``policy`` (``sl-shadow`` marks the coming limit)."""
    q, w = quota(policy)
    item = f'"{name}";q={q};w={w}'
    if not Algorithm(policy.algorithm).windowed and policy.burst != q:
        item += f";sl-burst={policy.burst}"
    return item + ";sl-shadow" if shadow else item


class PolicyHeaders:
    """The headers of every decision under one policy of one route (and one coming
    distributed policy): the parts that do not change per decision are computed once."""

    __slots__ = (
        "route", "style", "limit", "limit_s", "policy_h", "bucket_us", "window_us", "legacy", "draft", "reset_seconds",
        "r_prefix",
    )  # fmt: skip

    def __init__(self, route: str, limit: int, policy: Policy, shadow: Policy | None, style: HeaderStyle) -> None:
        self.route = route
        self.style = style
        self.limit = limit
        self.limit_s = str(limit)
        h = "" if policy.unlimited else policy_item(route, policy)
        if shadow is not None and style.announce_shadow and not shadow.unlimited:
            h = (h + ", " if h else "") + policy_item(f"{route}-global", shadow, shadow=True)
        self.policy_h = h
        windowed = Algorithm(policy.algorithm).windowed
        # one whole unit comes back every emission interval (buckets); windows free within w
        self.bucket_us = 0 if windowed or policy.unlimited else max(1, round(policy.emission_us))
        self.window_us = quota(policy)[1] * _US
        # the style, read once per decision
        self.legacy = style.legacy
        self.draft = style.draft and bool(h)
        self.reset_seconds = style.reset_seconds
        self.r_prefix = f'"{route}";r='

    def next_unit_s(self, d: Decision) -> int:
        """The draft's ``t``: seconds until more quota is made available."""
        if not d.allowed:
            return max(1, _ceil_s(d.retry_after_us))
        reset = d.reset_after_us
        if reset <= 0:
            return 0
        if self.bucket_us:
            part = reset % self.bucket_us
            reset = part if part else min(reset, self.bucket_us)
        return -(-min(reset, self.window_us) // _US)  # whole seconds, rounded up

    def render(self, d: Decision, now_s: float) -> dict[str, str]:
        remaining = d.remaining
        rem = str(remaining) if remaining > 0 else "0"
        if self.legacy:
            reset_s = -(-d.reset_after_us // _US)  # whole seconds, rounded up
            headers = {
                "X-RateLimit-Limit": self.limit_s,
                "X-RateLimit-Remaining": rem,
                "X-RateLimit-Reset": str(reset_s if self.reset_seconds else int(now_s) + reset_s),
            }
        else:
            headers = {}
        if self.draft:
            headers["RateLimit-Policy"] = self.policy_h
            headers["RateLimit"] = f"{self.r_prefix}{rem};t={self.next_unit_s(d)}"
        if not d.allowed:
            headers["Retry-After"] = str(max(1, _ceil_s(d.retry_after_us)))
        return headers


def _ceil_s(us: int) -> int:
    """Whole seconds, rounded up, of a time in microseconds (exact: integer arithmetic)."""
    return -(-us // _US)


_CACHE: dict[tuple[str, int, int, int, HeaderStyle], tuple[Policy, Policy | None, PolicyHeaders]] = {}


def rate_limit_headers(
    route: str,
    decision: Decision,
    policy: Policy,
    *,
    shadow_policy: Policy | None,
    now_s: float,
    style: HeaderStyle = HeaderStyle(),
) -> dict[str, str]:
    """The headers of one decision under ``policy`` (announcing ``shadow_policy``), for
    callers without a cached :class:`PolicyHeaders` (per-key policies: overrides, external
    limits, adjustments)."""
    # looked up by identity (the policies kept in the entry guard against a reused id):
    # hashing Policy dataclasses on every request is not free
    k = (route, decision.limit, id(policy), id(shadow_policy), style)
    e = _CACHE.get(k)
    if e is None or e[0] is not policy or e[1] is not shadow_policy:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        e = _CACHE[k] = (policy, shadow_policy, PolicyHeaders(route, decision.limit, policy, shadow_policy, style))
    return e[2].render(decision, now_s)
