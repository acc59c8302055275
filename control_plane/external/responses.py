"""The limits service's answer: :func:`parse_limits` turns a response body into a typed
:class:`ExternalLimits` or raises :class:`InvalidResponse` (an invalid or partial answer
is never applied). No IO."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from limiter.keys import validate_key
from limiter.policy import Algorithm, Policy
from limiter.resilience import FailurePolicy

from ..durations import parse_duration
from .config import BackendHosts, check_service_url

__all__ = ["ExternalLimits", "InvalidResponse", "parse_limits"]

_MAX_AVERAGE = 1_000_000_000_000
_MAX_BURST = 1_000_000_000


class InvalidResponse(ValueError):
    """The limits service's answer cannot be applied (it counts as a failure)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExternalLimits:
    """A validated answer from the limits service.

    ``policy`` applies to the local and the distributed limiter alike (with the route's
    algorithm). ``tenant_key`` (if any) replaces the key: the bucket key becomes
    ``t:<tenant_key>``. ``backend_url`` is only kept when its host is allow-listed.
    """

    average: int
    burst: int
    period: str
    policy: Policy
    tenant_key: str | None = None
    failure_policy: FailurePolicy | None = None
    failure_code: int | None = None
    backend_url: str | None = None
    cache_max_age_seconds: int | None = None
    cache_no_store: bool = False
    backend_url_rejected: str | None = None  # why a backend_url in the answer was dropped

    def bucket_key(self, key: str) -> str:
        return f"t:{self.tenant_key}" if self.tenant_key else key

    def to_wire(self) -> dict[str, Any]:
        """The normalised answer, as cached in Redis (and re-validated when read)."""
        d: dict[str, Any] = {"average": self.average, "burst": self.burst, "period": self.period}
        if self.tenant_key:
            d["tenant_key"] = self.tenant_key
        if self.failure_policy is not None:
            d["failure_policy"] = self.failure_policy.value
        if self.failure_code is not None:
            d["failure_code"] = self.failure_code
        if self.backend_url is not None:
            d["backend_url"] = self.backend_url
        if self.cache_max_age_seconds is not None:
            d["cache_max_age_seconds"] = self.cache_max_age_seconds
        if self.cache_no_store:
            d["cache_no_store"] = True
        return d

    def to_dict(self) -> dict[str, Any]:
        return {**self.to_wire(), "policy": self.policy.to_dict()}


def parse_limits(
    data: Any, *, algorithm: Algorithm | str = Algorithm.TOKEN_BUCKET, backend_hosts: BackendHosts | None = None
) -> ExternalLimits:
    """Validate a response body; raise :class:`InvalidResponse` naming the bad field.

    ``average``, ``burst`` (whole numbers; ``average`` 0 = unlimited) and ``period`` (a
    duration string like ``"1s"``) are required and must make a valid policy for the
    route's ``algorithm``. Optional fields may be absent, null or their zero value
    (``""``, ``0``, ``false``) for "not set". Unknown fields are ignored. A
    well-formed ``backend_url`` whose host is not allow-listed is dropped (and
    ``backend_url_rejected`` says so), not an error.
    """
    if not isinstance(data, dict):
        raise InvalidResponse(f"the body must be a JSON object, got {type(data).__name__}")
    average, burst, period, policy = _rate(data, algorithm)
    tenant_key = _tenant_key(data)
    failure_policy, failure_code = _failure(data)
    max_age = _whole(data, "cache_max_age_seconds", 0, 2**62, required=False)
    no_store = data.get("cache_no_store")
    if no_store is not None and not isinstance(no_store, bool):
        raise InvalidResponse(f"cache_no_store: must be true or false, got {type(no_store).__name__}")
    backend_url, rejected = _backend_url(data, backend_hosts)
    return ExternalLimits(
        average=average,
        burst=burst,
        period=period,
        policy=policy,
        tenant_key=tenant_key,
        failure_policy=failure_policy,
        failure_code=failure_code,
        backend_url=backend_url,
        cache_max_age_seconds=max_age or None,
        cache_no_store=bool(no_store),
        backend_url_rejected=rejected,
    )


def _whole(data: Mapping[str, Any], name: str, lo: int, hi: int, *, required: bool) -> int | None:
    v = data.get(name)
    if v is None:
        if required:
            raise InvalidResponse(f"{name}: missing (average, burst and period are required)")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidResponse(f"{name}: must be a whole number, got {type(v).__name__} {v!r}"[:200])
    if isinstance(v, float) and (not math.isfinite(v) or v != int(v)):
        raise InvalidResponse(f"{name}: must be a whole number, got {v!r}")
    n = int(v)
    if not lo <= n <= hi:
        raise InvalidResponse(f"{name}: must be from {lo} to {hi}, got {n}")
    return n


def _required_whole(data: Mapping[str, Any], name: str, hi: int) -> int:
    n = _whole(data, name, 0, hi, required=True)
    assert n is not None  # required: missing raised
    return n


def _opt_str(data: Mapping[str, Any], name: str) -> str | None:
    v = data.get(name)
    if v is None or v == "":
        return None
    if not isinstance(v, str):
        raise InvalidResponse(f"{name}: must be a string, got {type(v).__name__}")
    return v


def _rate(data: Mapping[str, Any], algorithm: Algorithm | str) -> tuple[int, int, str, Policy]:
    """The required ``average``, ``burst`` and ``period``, and the policy they make."""
    average = _required_whole(data, "average", _MAX_AVERAGE)
    burst = _required_whole(data, "burst", _MAX_BURST)
    period = data.get("period")
    if period is None:
        raise InvalidResponse("period: missing (average, burst and period are required)")
    if not isinstance(period, str):
        raise InvalidResponse(f'period: must be a duration string like "1s", got {type(period).__name__}')
    try:
        period_s = parse_duration(period)
    except ValueError:
        raise InvalidResponse(f"period: not a duration: {period[:40]!r}") from None
    if average > 0 and burst < 1:
        raise InvalidResponse(f"burst: must be at least 1 when average is not 0, got {burst}")
    try:
        policy = Policy(average=average, period=period_s, burst=burst if burst >= 1 else None, algorithm=algorithm)
    except ValueError as exc:
        raise InvalidResponse(str(exc)) from None
    return average, burst, period, policy


def _tenant_key(data: Mapping[str, Any]) -> str | None:
    tenant_key = _opt_str(data, "tenant_key")
    if tenant_key is not None:
        try:
            validate_key(tenant_key, field="tenant_key")
            validate_key(f"t:{tenant_key}", field="tenant_key")
        except ValueError as exc:
            raise InvalidResponse(str(exc)) from None
    return tenant_key


def _failure(data: Mapping[str, Any]) -> tuple[FailurePolicy | None, int | None]:
    """The optional ``failure_policy`` and ``failure_code`` (0: not set)."""
    fp_raw = _opt_str(data, "failure_policy")
    failure_policy = None
    if fp_raw is not None:
        try:
            failure_policy = FailurePolicy.parse(fp_raw)
        except ValueError:
            raise InvalidResponse(
                f"failure_policy: must be passthrough, failclosed or inmemoryfallback, got {fp_raw[:40]!r}"
            ) from None
    fc = _whole(data, "failure_code", 0, 599, required=False)
    if fc is not None and fc != 0 and fc < 400:
        raise InvalidResponse(f"failure_code: must be an HTTP error status (400-599), got {fc}")
    return failure_policy, fc or None


def _backend_url(data: Mapping[str, Any], backend_hosts: BackendHosts | None) -> tuple[str | None, str | None]:
    """(the ``backend_url`` kept, why one in the answer was dropped)."""
    backend_url = _opt_str(data, "backend_url")
    if backend_url is None:
        return None, None
    try:
        check_service_url(backend_url)
    except ValueError as exc:
        return None, f"not a usable URL: {str(exc).removeprefix('url: ')}"
    if backend_hosts is None or not backend_hosts:
        return None, "no backend hosts are allowed (SHADOWLIMIT_EXTERNAL_BACKEND_HOSTS is empty)"
    if not backend_hosts.allows(backend_url):
        host = urlsplit(backend_url).hostname
        return None, f"host {host!r} is not in SHADOWLIMIT_EXTERNAL_BACKEND_HOSTS"
    return backend_url, None
