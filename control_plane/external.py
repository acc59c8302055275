"""Per-tenant limits from an external HTTP service (seed 000's External Rate Limit Service).

A route with an ``external`` block in the rules file asks a limits service for each key's
limits instead of using the file's policy, which stays as the fallback::

    POST <url>  {"key": "acme", "headers": {"X-Tenant-Id": "acme"}, "method": "GET", "path": "/api/x"}
    200         {"average": 100, "burst": 20, "period": "1s", "tenant_key": "acme", ...}

The pure parts (no IO, unit-tested on their own):

- :class:`ExternalConfig`: the rules-file block, validated;
- :class:`HeaderFilter`: which request headers are forwarded (credentials never are);
- :func:`parse_limits`: a response body to a typed :class:`ExternalLimits`, or
  :class:`InvalidResponse` (an invalid or partial answer is never applied);
- :func:`resolve_ttl`: the cache TTL in seed 000's order for HTTP responses;
- :class:`BreakerSet`: one circuit breaker per key (5 consecutive failures open it for
  30 s, then one half-open probe; breakers idle for 60 s are evicted), clock injected.

The IO parts: :class:`ExternalResolver` (one per route: httpx call bounded by the
timeout, Redis cache ``rl:<ns>:extcache:{<route>:<key>}`` shared by every replica with the
stale copy ``rl:<ns>:extcache:stale:{<route>:<key>}`` kept 5 minutes, singleflight per key,
a semaphore capping concurrent calls) and :class:`ExternalManager` (the resolvers of the
current rules, shared HTTP client, counters, metrics and events).

:meth:`ExternalManager.resolve` never raises and never takes longer than the route's
``timeout``: when the service is slow, down, returns garbage or its breaker is open, the
answer falls back to the stale copy, then to the static policy (``source`` says which).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import email.utils
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import orjson

from limiter.keys import validate_key
from limiter.policy import Algorithm, Policy
from limiter.resilience import BreakerState, FailurePolicy

from .durations import parse_duration

__all__ = [
    "BackendHosts",
    "BreakerSet",
    "DEFAULT_CACHE_TTL_S",
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_TIMEOUT_S",
    "ExternalConfig",
    "ExternalLimits",
    "ExternalManager",
    "ExternalResolver",
    "HeaderFilter",
    "InvalidResponse",
    "KeyBreaker",
    "Resolution",
    "STALE_TTL_S",
    "is_sensitive_header",
    "parse_limits",
    "resolve_ttl",
    "response_forbids_storing",
]

log = logging.getLogger("shadowlimit.external")

# seed 000's defaults and fixed parameters
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_CACHE_TTL_S = 60.0
DEFAULT_MAX_CONCURRENT = 50
STALE_TTL_S = 300
BREAKER_FAILURE_THRESHOLD = 5
BREAKER_OPEN_S = 30.0
BREAKER_IDLE_EVICT_S = 60.0
MAX_BREAKERS = 10_000
MAX_TIMEOUT_S = 60.0
MAX_CACHE_TTL_S = 86_400.0
MAX_RESPONSE_BYTES = 64 * 1024
_MAX_TTL_S = 366 * 86_400.0  # a cap on what a response may ask for (Redis EX limits)
_MAX_FORWARDED_HEADERS = 64
_MAX_HEADER_VALUE = 8192
_MAX_URL = 2048
_MAX_AVERAGE = 1_000_000_000_000
_MAX_BURST = 1_000_000_000

Source = Literal["external", "cache", "stale", "static"]
SOURCES: tuple[Source, ...] = ("external", "cache", "stale", "static")
_HTTP_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


# ---------------------------------------------------------------------------------------
# headers


#: Never forwarded, whatever the filter says (matched case-insensitively).
SENSITIVE_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "api-key",
        "x-auth-token",
        "x-access-token",
        "x-refresh-token",
        "x-csrf-token",
        "x-xsrf-token",
        "x-amz-security-token",
        "x-goog-api-key",
        "x-client-secret",
    }
)
# ... nor anything whose name says it carries a credential
_SENSITIVE_PARTS = (
    "authorization",
    "cookie",
    "api-key",
    "apikey",
    "api_key",
    "token",
    "secret",
    "password",
    "passwd",
    "credential",
)


def is_sensitive_header(name: str) -> bool:
    """True for headers that carry credentials (Authorization, Cookie, X-Api-Key, any
    ``*-Token``, ``*Secret*``, ``*Password*`` ...): they never leave the process."""
    n = name.lower()
    return n in SENSITIVE_HEADERS or any(p in n for p in _SENSITIVE_PARTS)


@dataclass(frozen=True, slots=True)
class HeaderFilter:
    """Which request headers go to the limits service.

    ``allow_list`` (exclusive): only these. Otherwise everything but ``deny_list``.
    Sensitive headers (:func:`is_sensitive_header`) and ``secret_headers`` (the route's
    API-key header) are dropped in both cases. Names compare case-insensitively; the
    forwarded names keep the caller's spelling.
    """

    allow_list: frozenset[str] | None = None
    deny_list: frozenset[str] = frozenset()
    secret_headers: frozenset[str] = frozenset()

    def allows(self, name: str) -> bool:
        n = name.lower()
        if n in self.secret_headers or is_sensitive_header(n):
            return False
        if self.allow_list is not None:
            return n in self.allow_list
        return n not in self.deny_list

    def apply(self, headers: Mapping[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, value in headers.items():
            if len(out) >= _MAX_FORWARDED_HEADERS:
                break
            if not isinstance(name, str) or not isinstance(value, str) or len(value) > _MAX_HEADER_VALUE:
                continue
            if self.allows(name):
                out[name] = value
        return out


# ---------------------------------------------------------------------------------------
# the rules-file block


def _header_names(value: Iterable[str], field_name: str) -> tuple[str, ...]:
    out: list[str] = []
    for name in value:
        if not isinstance(name, str) or _HTTP_TOKEN.fullmatch(name) is None:
            raise ValueError(f"{field_name}: {name!r} is not an HTTP header name")
        if name.lower() not in out:
            out.append(name.lower())
    return tuple(out)


def check_service_url(url: object) -> str:
    """An http(s) URL with a host and no credentials; raises ValueError (``"url: ..."``)."""
    if not isinstance(url, str):
        raise ValueError(f"url: must be a string, got {type(url).__name__}")
    if len(url) > _MAX_URL or any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError(f"url: must be a URL of at most {_MAX_URL} characters without whitespace, got {url[:80]!r}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"url: not a valid URL ({exc}): {url!r}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"url: must be an http:// or https:// URL, got {url!r}")
    if not parts.hostname:
        raise ValueError(f"url: has no host: {url!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "url: must not contain credentials (user:password@); the limits service is called without them"
        )
    if parts.fragment:
        raise ValueError(f"url: must not have a fragment ('#'), got {url!r}")
    del port
    return url


@dataclass(frozen=True)
class ExternalConfig:
    """A route's ``external`` block (seed 000's ``rate_limit.external``, HTTP only).

    ``timeout_s`` bounds the whole lookup (cache read, semaphore wait, call);
    ``cache_ttl_s`` is the TTL when the response carries no cache hints (0: do not cache
    such responses); ``max_concurrent_requests`` caps this route's concurrent calls.
    """

    url: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    cache_ttl_s: float = DEFAULT_CACHE_TTL_S
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT
    allow_list: tuple[str, ...] | None = None
    deny_list: tuple[str, ...] = ()
    secret_headers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        s = object.__setattr__
        check_service_url(self.url)
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t <= MAX_TIMEOUT_S:
            raise ValueError(f"timeout: must be more than 0 and at most {MAX_TIMEOUT_S:g}s, got {t!r}")
        s(self, "timeout_s", float(t))
        c = self.cache_ttl_s
        if (
            isinstance(c, bool)
            or not isinstance(c, (int, float))
            or not math.isfinite(c)
            or not 0 <= c <= MAX_CACHE_TTL_S
        ):
            raise ValueError(f"cache_ttl: must be from 0 to {MAX_CACHE_TTL_S:g}s, got {c!r}")
        s(self, "cache_ttl_s", float(c))
        m = self.max_concurrent_requests
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= 10_000:
            raise ValueError(f"max_concurrent_requests: must be a whole number from 1 to 10000, got {m!r}")
        if self.allow_list is not None and self.deny_list:
            raise ValueError("header_filter: give allow_list or deny_list, not both")
        if self.allow_list is not None:
            names = _header_names(self.allow_list, "allow_list")
            for n in names:
                if is_sensitive_header(n) or n in {h.lower() for h in self.secret_headers}:
                    raise ValueError(f"allow_list: {n!r} carries credentials and is never sent to the limits service")
            s(self, "allow_list", names)
        s(self, "deny_list", _header_names(self.deny_list, "deny_list"))
        s(self, "secret_headers", tuple(h.lower() for h in self.secret_headers))

    @property
    def header_filter(self) -> HeaderFilter:
        return HeaderFilter(
            frozenset(self.allow_list) if self.allow_list is not None else None,
            frozenset(self.deny_list),
            frozenset(self.secret_headers),
        )

    def to_dict(self) -> dict[str, Any]:
        hf: dict[str, Any] = (
            {"allow_list": list(self.allow_list)}
            if self.allow_list is not None
            else {"deny_list": list(self.deny_list)}
        )
        return {
            "url": self.url,
            "timeout_s": self.timeout_s,
            "cache_ttl_s": self.cache_ttl_s,
            "max_concurrent_requests": self.max_concurrent_requests,
            "header_filter": hf,
        }


# ---------------------------------------------------------------------------------------
# backend_url host allow-list


class BackendHosts:
    """Hosts a response's ``backend_url`` may point at (``SHADOWLIMIT_EXTERNAL_BACKEND_HOSTS``).

    Comma-separated entries: ``host`` (any port), ``host:port``, or ``*.example.com``
    (any subdomain, any port). Empty: every ``backend_url`` is dropped.
    """

    __slots__ = ("_exact", "_ports", "_suffixes", "text")

    def __init__(self, text: str = "") -> None:
        self.text = text or ""
        exact: set[str] = set()
        ports: set[tuple[str, int]] = set()
        suffixes: set[str] = set()
        for raw in self.text.split(","):
            entry = raw.strip().lower()
            if not entry:
                continue
            if entry.startswith("*."):
                host = entry[2:]
                if not host or not _valid_host(host):
                    raise ValueError(f"not a host pattern: {raw.strip()!r} (use host, host:port or *.domain)")
                suffixes.add("." + host)
                continue
            host, port = entry, None
            if entry.startswith("["):  # [v6]:port
                end = entry.find("]")
                if end < 0:
                    raise ValueError(f"not a host: {raw.strip()!r}")
                host, rest = entry[1:end], entry[end + 1 :]
                if rest:
                    if not rest.startswith(":") or not rest[1:].isdigit():
                        raise ValueError(f"not a host:port: {raw.strip()!r}")
                    port = int(rest[1:])
            elif entry.count(":") == 1:
                host, _, p = entry.partition(":")
                if not p.isdigit():
                    raise ValueError(f"not a host:port: {raw.strip()!r}")
                port = int(p)
            if not host or not _valid_host(host) or (port is not None and not 0 < port < 65536):
                raise ValueError(f"not a host: {raw.strip()!r} (use host, host:port or *.domain)")
            if port is None:
                exact.add(host)
            else:
                ports.add((host, port))
        self._exact = frozenset(exact)
        self._ports = frozenset(ports)
        self._suffixes = tuple(sorted(suffixes))

    def __bool__(self) -> bool:
        return bool(self._exact or self._ports or self._suffixes)

    def allows(self, url: str) -> bool:
        try:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return False
        host = (parts.hostname or "").lower()
        if not host:
            return False
        return host in self._exact or (host, port) in self._ports or any(host.endswith(s) for s in self._suffixes)

    def entries(self) -> list[str]:
        return (
            sorted(self._exact)
            + sorted(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self._ports)
            + [f"*{s}" for s in self._suffixes]
        )


_HOST = re.compile(r"[a-z0-9]([a-z0-9\-_]{0,62}[a-z0-9_])?(\.[a-z0-9]([a-z0-9\-_]{0,62}[a-z0-9_])?)*\.?")


def _valid_host(host: str) -> bool:
    if _HOST.fullmatch(host):
        return True
    try:
        import ipaddress

        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------
# responses


class InvalidResponse(ValueError):
    """The limits service's answer cannot be applied (it counts as a failure)."""


@dataclass(frozen=True, slots=True)
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


def _opt_str(data: Mapping[str, Any], name: str) -> str | None:
    v = data.get(name)
    if v is None or v == "":
        return None
    if not isinstance(v, str):
        raise InvalidResponse(f"{name}: must be a string, got {type(v).__name__}")
    return v


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
    average = _whole(data, "average", 0, _MAX_AVERAGE, required=True)
    burst = _whole(data, "burst", 0, _MAX_BURST, required=True)
    assert average is not None and burst is not None
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

    tenant_key = _opt_str(data, "tenant_key")
    if tenant_key is not None:
        try:
            validate_key(tenant_key, field="tenant_key")
            validate_key(f"t:{tenant_key}", field="tenant_key")
        except ValueError as exc:
            raise InvalidResponse(str(exc)) from None

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
    failure_code = fc or None

    max_age = _whole(data, "cache_max_age_seconds", 0, 2**62, required=False)
    no_store = data.get("cache_no_store")
    if no_store is not None and not isinstance(no_store, bool):
        raise InvalidResponse(f"cache_no_store: must be true or false, got {type(no_store).__name__}")

    backend_url = _opt_str(data, "backend_url")
    rejected = None
    if backend_url is not None:
        try:
            check_service_url(backend_url)
        except ValueError as exc:
            rejected, backend_url = f"not a usable URL: {str(exc).removeprefix('url: ')}", None
        else:
            if backend_hosts is None or not backend_hosts:
                rejected, backend_url = (
                    "no backend hosts are allowed (SHADOWLIMIT_EXTERNAL_BACKEND_HOSTS is empty)",
                    None,
                )
            elif not backend_hosts.allows(backend_url):
                host = urlsplit(backend_url).hostname
                rejected, backend_url = f"host {host!r} is not in SHADOWLIMIT_EXTERNAL_BACKEND_HOSTS", None

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


# ---------------------------------------------------------------------------------------
# cache TTL


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
    """Seconds to cache an HTTP response (0: do not cache), seed 000's order:

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
        return min(float(max_age), _MAX_TTL_S)
    if "no-cache" in cc or "no-store" in cc:
        return 0.0
    if expires is not None and expires.strip():
        try:
            at = email.utils.parsedate_to_datetime(expires.strip())
        except (TypeError, ValueError, IndexError, OverflowError):
            return 0.0
        if at.tzinfo is None:
            return 0.0
        return min(max(0.0, at.timestamp() - now), _MAX_TTL_S)
    if body_no_store:
        return 0.0
    if body_max_age is not None and body_max_age > 0:
        return min(float(body_max_age), _MAX_TTL_S)
    return max(0.0, default_ttl_s)


def response_forbids_storing(cache_control: str | None, body_no_store: bool) -> bool:
    """``no-store`` (header or body): keep no copy at all, not even the stale one."""
    return body_no_store or "no-store" in _cache_directives(cache_control)


# ---------------------------------------------------------------------------------------
# per-key circuit breakers


@dataclass(slots=True)
class KeyBreaker:
    """One key's breaker. Times are the :class:`BreakerSet`'s clock (monotonic)."""

    key: str
    last_used: float
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0  # consecutive
    total_failures: int = 0
    opened_at: float | None = None
    probe_at: float | None = None
    last_error: str | None = None
    probe_in_flight: bool = False


class BreakerSet:
    """A circuit breaker per key, with seed 000's fixed parameters by default.

    Closed: calls go through; ``threshold`` consecutive failures open it. Open: no calls
    for ``open_s``; then the next request is the half-open probe (one at a time): its
    success closes the breaker, its failure re-opens it for another ``open_s``. Breakers
    not used for ``idle_s`` are evicted (checked at most once a second, on use), and at
    most ``max_breakers`` are kept (the least recently used goes first). ``clock`` is
    injected (monotonic seconds); ``on_transition(breaker, from, to)`` sees every change.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        threshold: int = BREAKER_FAILURE_THRESHOLD,
        open_s: float = BREAKER_OPEN_S,
        idle_s: float = BREAKER_IDLE_EVICT_S,
        max_breakers: int = MAX_BREAKERS,
        on_transition: Callable[[KeyBreaker, BreakerState, BreakerState], None] | None = None,
    ) -> None:
        if threshold < 1 or open_s <= 0 or idle_s <= 0 or max_breakers < 1:
            raise ValueError("BreakerSet: threshold, open_s, idle_s and max_breakers must be positive")
        self.clock = clock
        self.threshold = threshold
        self.open_s = open_s
        self.idle_s = idle_s
        self.max_breakers = max_breakers
        self.on_transition = on_transition
        self._breakers: collections.OrderedDict[str, KeyBreaker] = collections.OrderedDict()
        self._swept_at = clock()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._breakers)

    def __contains__(self, key: object) -> bool:
        return key in self._breakers

    def get(self, key: str) -> KeyBreaker | None:
        return self._breakers.get(key)

    def _touch(self, key: str) -> KeyBreaker:
        now = self.clock()
        if now - self._swept_at >= 1.0:
            self.sweep()
        b = self._breakers.get(key)
        if b is None:
            while len(self._breakers) >= self.max_breakers:
                self._breakers.popitem(last=False)
                self.evicted += 1
            b = self._breakers[key] = KeyBreaker(key, now)
        else:
            self._breakers.move_to_end(key)
            b.last_used = now
        return b

    def _move(self, b: KeyBreaker, to: BreakerState) -> None:
        frm = b.state
        if frm is to:
            return
        b.state = to
        if self.on_transition is not None:
            self.on_transition(b, frm, to)

    def allow(self, key: str) -> bool:
        """May a call for this key go to the service now? (Takes the half-open probe.)"""
        b = self._touch(key)
        if b.state is BreakerState.CLOSED:
            return True
        if b.state is BreakerState.OPEN:
            if b.probe_at is None or self.clock() < b.probe_at:
                return False
            self._move(b, BreakerState.HALF_OPEN)
        if b.probe_in_flight:
            return False
        b.probe_in_flight = True
        return True

    def success(self, key: str) -> None:
        b = self._touch(key)
        b.probe_in_flight = False
        b.failures = 0
        b.opened_at = b.probe_at = None
        self._move(b, BreakerState.CLOSED)

    def failure(self, key: str, error: str) -> None:
        b = self._touch(key)
        b.probe_in_flight = False
        b.failures += 1
        b.total_failures += 1
        b.last_error = error
        if b.state is BreakerState.HALF_OPEN or (b.state is BreakerState.CLOSED and b.failures >= self.threshold):
            now = self.clock()
            b.opened_at = now
            b.probe_at = now + self.open_s
            self._move(b, BreakerState.OPEN)

    def abandon(self, key: str) -> None:
        """A call that never reached the service (no free slot): frees the probe."""
        b = self._breakers.get(key)
        if b is not None:
            b.probe_in_flight = False

    def sweep(self) -> int:
        """Evict breakers idle for ``idle_s`` or more; returns how many went."""
        now = self.clock()
        self._swept_at = now
        gone = 0
        while self._breakers:
            key, b = next(iter(self._breakers.items()))
            if now - b.last_used < self.idle_s:
                break  # ordered by last use: the rest are younger
            if b.probe_in_flight:
                self._breakers.move_to_end(key)
                b.last_used = now
                continue
            del self._breakers[key]
            gone += 1
        self.evicted += gone
        return gone

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in BreakerState}
        for b in self._breakers.values():
            out[b.state.value] += 1
        return out

    def describe(self, b: KeyBreaker) -> dict[str, Any]:
        now = self.clock()
        probe = None
        if b.state is BreakerState.OPEN and b.probe_at is not None:
            probe = round(max(0.0, b.probe_at - now), 3)
        elif b.state is BreakerState.HALF_OPEN:
            probe = 0.0
        return {
            "key": b.key,
            "state": b.state.value,
            "failures": b.failures,
            "total_failures": b.total_failures,
            "next_probe_in_s": probe,
            "open_for_s": round(now - b.opened_at, 3)
            if b.opened_at is not None and b.state is not BreakerState.CLOSED
            else None,
            "idle_s": round(now - b.last_used, 3),
            "last_error": b.last_error,
        }

    def snapshot(self, limit: int = 100) -> list[dict[str, Any]]:
        """Open and half-open breakers first, then the most recently used."""
        self.sweep()
        items = list(reversed(self._breakers.values()))
        items.sort(key=lambda b: 0 if b.state is BreakerState.OPEN else 1 if b.state is BreakerState.HALF_OPEN else 2)
        return [self.describe(b) for b in items[:limit]]


# ---------------------------------------------------------------------------------------
# IO: one resolver per route


@dataclass(frozen=True, slots=True)
class Resolution:
    """Where a decision's limits came from: ``limits`` is None for ``static``."""

    source: Source
    limits: ExternalLimits | None = None
    error: str | None = None


@dataclass(slots=True)
class _Fetched:
    limits: ExternalLimits | None
    error: str | None = None
    ttl_s: float = 0.0
    keep_stale: bool = False
    raw: bytes = b""


@dataclass(slots=True)
class _Lookup:
    stale: ExternalLimits | None = None
    error: str | None = None


class _CallFailed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # timeout | error | invalid
        self.message = message


_REQUEST_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json",
    "User-Agent": "shadowlimit-external/1",
}
_MEMO_SIZE = 4096


class ExternalResolver:
    """One route's lookups: cache, singleflight, breakers, semaphore, the call."""

    def __init__(self, route: str, config: ExternalConfig, algorithm: Algorithm, manager: ExternalManager) -> None:
        self.route = route
        self.config = config
        self.algorithm = algorithm
        self.manager = manager
        self.filter = config.header_filter
        self.breakers = BreakerSet(clock=manager.clock, on_transition=self._on_transition)
        self.semaphore = asyncio.Semaphore(config.max_concurrent_requests)
        self.active = 0
        self.waiting = 0
        self._inflight: dict[str, asyncio.Future[_Fetched]] = {}
        self._memo: collections.OrderedDict[bytes, ExternalLimits | None] = collections.OrderedDict()
        self._ns = manager.namespace
        self._logged_at = 0.0

    # -- keys and cached values ---------------------------------------------------------

    def cache_key(self, key: str) -> str:
        return f"rl:{self._ns}:extcache:{{{self.route}:{key}}}"

    def stale_key(self, key: str) -> str:
        return f"rl:{self._ns}:extcache:stale:{{{self.route}:{key}}}"

    def _decode(self, raw: Any) -> ExternalLimits | None:
        if not raw:
            return None
        if isinstance(raw, str):
            raw = raw.encode()
        memo = self._memo
        if raw in memo:
            return memo[raw]
        try:
            limits: ExternalLimits | None = parse_limits(
                orjson.loads(raw), algorithm=self.algorithm, backend_hosts=self.manager.backend_hosts
            )
        except (InvalidResponse, orjson.JSONDecodeError):
            limits = None
        memo[raw] = limits
        if len(memo) > _MEMO_SIZE:
            memo.popitem(last=False)
        return limits

    # -- the lookup ---------------------------------------------------------------------

    async def resolve(self, key: str, method: str | None, path: str | None, headers: Mapping[str, str]) -> Resolution:
        """Limits for ``key``: cache, else the service, else stale, else static. Never
        raises; returns within the route's timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout_s
        state = _Lookup()
        try:
            async with asyncio.timeout_at(deadline):
                res = await self._lookup(key, method, path, headers, state, deadline)
            if res is not None:
                return res
        except TimeoutError:
            state.error = state.error or f"no answer within the timeout ({self.config.timeout_s:g}s)"
        except Exception as exc:  # noqa: BLE001 - a lookup must never fail a decision
            state.error = f"{type(exc).__name__}: {exc}"
            self.manager.count_error("internal")
            log.exception("external limits lookup failed on route %s", self.route)
        return self._fallback(state)

    def _fallback(self, state: _Lookup) -> Resolution:
        self._log_failure(state.error)
        if state.stale is not None:
            self.manager.count_cache("stale")
            return Resolution("stale", state.stale, state.error)
        return Resolution("static", None, state.error)

    async def _lookup(
        self,
        key: str,
        method: str | None,
        path: str | None,
        headers: Mapping[str, str],
        state: _Lookup,
        deadline: float,
    ) -> Resolution | None:
        m = self.manager
        client = m.cache_client()
        if client is not None:
            fresh_raw = stale_raw = None
            try:
                async with asyncio.timeout(
                    min(m.cache_timeout_s, max(0.0, deadline - asyncio.get_running_loop().time()))
                ):
                    fresh_raw, stale_raw = await client.mget(self.cache_key(key), self.stale_key(key))
            except Exception as exc:  # noqa: BLE001 - an unreadable cache is a miss, not a failure
                m.cache_errors += 1
                log.debug("external cache read failed: %s", exc)
            fresh = self._decode(fresh_raw)
            if fresh is not None:
                m.count_cache("hit")
                return Resolution("cache", fresh)
            state.stale = self._decode(stale_raw)
            m.count_cache("miss")
        else:
            m.count_cache("miss")

        fut = self._inflight.get(key)
        if fut is None:
            if not self.breakers.allow(key):
                b = self.breakers.get(key)
                state.error = f"circuit open for this key ({b.last_error if b is not None else 'failing'})"
                m.count_error("circuit_open")
                return None
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            self._inflight[key] = fut
            body = {"key": key, "headers": self.filter.apply(headers), "method": method or "", "path": path or ""}
            m.spawn(self._fetch(key, orjson.dumps(body), fut, client is not None, deadline))
        else:
            m.shared_calls += 1
        fetched = await asyncio.shield(fut)
        if fetched.limits is not None:
            return Resolution("external", fetched.limits)
        state.error = fetched.error
        return None

    async def _fetch(self, key: str, payload: bytes, fut: asyncio.Future[_Fetched], cache: bool, end: float) -> None:
        """One call for ``key`` by the singleflight leader, within the leader's deadline
        ``end`` (loop time); sets ``fut``, then caches the answer."""
        m = self.manager
        loop = asyncio.get_running_loop()
        result = _Fetched(None, "cancelled")
        try:
            self.waiting += 1
            try:
                async with asyncio.timeout_at(end):
                    await self.semaphore.acquire()
            except TimeoutError:
                self.breakers.abandon(key)
                m.count_error("overloaded")
                result = _Fetched(
                    None,
                    f"no free slot for a call within the timeout ({self.config.max_concurrent_requests} calls in flight)",
                )
                return
            finally:
                self.waiting -= 1
            if end - loop.time() < max(0.01, self.config.timeout_s * 0.05):  # too late to start a call
                self.semaphore.release()
                self.breakers.abandon(key)
                m.count_error("overloaded")
                result = _Fetched(
                    None,
                    f"no free slot for a call within the timeout ({self.config.max_concurrent_requests} calls in flight)",
                )
                return
            self.active += 1
            try:
                async with asyncio.timeout_at(end):
                    result = await self._call(payload)
                m.count_call("ok")
                if result.limits is not None and result.limits.backend_url_rejected:
                    m.note_backend_url_rejected(self.route, result.limits.backend_url_rejected)
                self.breakers.success(key)
            except TimeoutError:
                result = _Fetched(None, f"the limits service did not answer within {self.config.timeout_s:g}s")
                m.count_call("timeout")
                m.count_error("timeout")
                self.breakers.failure(key, "timeout")
            except _CallFailed as exc:
                result = _Fetched(None, exc.message)
                m.count_call(exc.kind)
                m.count_error(exc.kind)
                self.breakers.failure(key, exc.message)
            finally:
                self.active -= 1
                self.semaphore.release()
        except BaseException:
            self.breakers.abandon(key)
            raise
        finally:
            if not fut.done():
                fut.set_result(result)
            try:
                if cache and result.limits is not None:
                    await self._store(key, result)  # still in flight: late arrivals join, no second call
            finally:
                if self._inflight.get(key) is fut:
                    del self._inflight[key]

    async def _call(self, payload: bytes) -> _Fetched:
        http = self.manager.http()
        try:
            async with http.stream(
                "POST", self.config.url, content=payload, headers=_REQUEST_HEADERS, timeout=self.config.timeout_s
            ) as resp:
                if not 200 <= resp.status_code < 300:
                    raise _CallFailed("error", f"the limits service answered HTTP {resp.status_code}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_RESPONSE_BYTES:
                        raise _CallFailed("invalid", f"response body larger than {MAX_RESPONSE_BYTES // 1024} KiB")
                    chunks.append(chunk)
                cache_control = ", ".join(resp.headers.get_list("cache-control")) or None
                expires = resp.headers.get("expires")
        except httpx.TimeoutException:
            raise TimeoutError from None
        except httpx.HTTPError as exc:
            raise _CallFailed("error", f"{type(exc).__name__}: {exc}".rstrip(": ")[:300]) from None
        raw = b"".join(chunks)
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise _CallFailed("invalid", f"invalid response: not JSON ({raw[:40]!r})") from None
        try:
            limits = parse_limits(data, algorithm=self.algorithm, backend_hosts=self.manager.backend_hosts)
        except InvalidResponse as exc:
            raise _CallFailed("invalid", f"invalid response: {exc}") from None
        ttl = resolve_ttl(
            cache_control,
            expires,
            body_no_store=limits.cache_no_store,
            body_max_age=limits.cache_max_age_seconds,
            default_ttl_s=self.config.cache_ttl_s,
            now=self.manager.wall_clock(),
        )
        keep = not response_forbids_storing(cache_control, limits.cache_no_store)
        return _Fetched(limits, None, ttl, keep, orjson.dumps(limits.to_wire()))

    async def _store(self, key: str, fetched: _Fetched) -> None:
        client = self.manager.cache_client()
        if client is None:
            return
        try:
            async with asyncio.timeout(self.manager.cache_timeout_s):
                pipe = client.pipeline(transaction=False)
                if fetched.ttl_s > 0:
                    pipe.set(self.cache_key(key), fetched.raw, px=max(1, int(fetched.ttl_s * 1000)))
                if fetched.keep_stale:
                    pipe.set(self.stale_key(key), fetched.raw, ex=STALE_TTL_S)
                else:
                    pipe.delete(self.stale_key(key))
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - caching is best effort
            self.manager.cache_errors += 1
            log.debug("external cache write failed: %s", exc)

    # -- reporting ----------------------------------------------------------------------

    def _on_transition(self, b: KeyBreaker, frm: BreakerState, to: BreakerState) -> None:
        self.manager.on_breaker(self.route, b, frm, to)

    def _log_failure(self, error: str | None) -> None:
        now = time.monotonic()
        if error and now - self._logged_at >= 10.0:
            self._logged_at = now
            log.warning("external limits for route %s unavailable (%s); using the fallback", self.route, error)

    def describe(self) -> dict[str, Any]:
        return {
            "route": self.route,
            **self.config.to_dict(),
            "algorithm": self.algorithm.value,
            "in_flight": len(self._inflight),
            "active_calls": self.active,
            "waiting_calls": self.waiting,
            "breakers": self.breakers.counts(),
        }


# ---------------------------------------------------------------------------------------
# IO: the engine's entry point


class ExternalManager:
    """The resolvers of the current rules and what they share.

    ``client`` is the engine's redis-py client (None: no cache, every lookup calls the
    service); ``cache_ok`` says whether Redis is usable now (the engine passes "its
    breaker is not open"), so an outage costs no cache timeouts. ``metrics`` and
    ``publish`` (the event hub) are optional; ``clock`` drives the breakers (monotonic)
    and ``wall_clock`` the ``Expires`` header.
    """

    def __init__(
        self,
        *,
        namespace: str,
        client: Any = None,
        backend_hosts: BackendHosts | str = "",
        cache_ok: Callable[[], bool] | None = None,
        cache_timeout_s: float = 0.5,
        metrics: Any = None,
        publish: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        instance_id: str = "",
    ) -> None:
        self.namespace = namespace
        self.client = client
        self.backend_hosts = backend_hosts if isinstance(backend_hosts, BackendHosts) else BackendHosts(backend_hosts)
        self.cache_ok = cache_ok
        self.cache_timeout_s = cache_timeout_s
        self.metrics = metrics
        self.publish = publish
        self.clock = clock
        self.wall_clock = wall_clock
        self.instance_id = instance_id
        self._resolvers: dict[str, ExternalResolver] = {}
        self._http: Any = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.calls: dict[str, int] = {"ok": 0, "timeout": 0, "error": 0, "invalid": 0}
        self.errors: dict[str, int] = {}
        self.cache: dict[str, int] = {"hit": 0, "miss": 0, "stale": 0}
        self.sources: dict[str, int] = dict.fromkeys(SOURCES, 0)
        self.transitions: dict[str, int] = {s.value: 0 for s in BreakerState}
        self.shared_calls = 0
        self.cache_errors = 0
        self.backend_url_rejected = 0
        self._rejected_logged: set[str] = set()
        self._events_second = 0
        self._events_in_second = 0
        self.events_suppressed = 0

    # -- resolvers ----------------------------------------------------------------------

    def resolver(self, route: str, config: ExternalConfig, algorithm: Algorithm) -> ExternalResolver:
        r = self._resolvers.get(route)
        if r is not None and r.config is config and r.algorithm is algorithm:
            return r
        if r is None or r.config != config or r.algorithm is not algorithm:
            r = self._resolvers[route] = ExternalResolver(route, config, algorithm, self)
        else:
            r.config = config  # an identical block from reloaded rules: keep the breakers
        return r

    def configure(self, routes: Iterable[Any]) -> None:
        """Keep the resolvers (and their breakers) of routes whose ``external`` block is
        unchanged; drop the others (rebuilt on first use)."""
        wanted = {r.name: r for r in routes if getattr(r, "external", None) is not None}
        for name in list(self._resolvers):
            rule = wanted.get(name)
            if (
                rule is None
                or self._resolvers[name].config != rule.external
                or self._resolvers[name].algorithm is not rule.local.algorithm
            ):
                del self._resolvers[name]
        for name, rule in wanted.items():
            self.resolver(name, rule.external, rule.local.algorithm)

    async def resolve(
        self, rule: Any, key: str, method: str | None, path: str | None, headers: Mapping[str, str]
    ) -> Resolution:
        """The limits for one request on a route with an ``external`` block."""
        try:
            r = self.resolver(rule.name, rule.external, rule.local.algorithm)
            res = await r.resolve(key, method, path, headers)
        except Exception as exc:  # noqa: BLE001 - belt and braces: never fail a decision
            log.exception("external limits lookup failed")
            res = Resolution("static", None, f"{type(exc).__name__}: {exc}")
        self.sources[res.source] += 1
        if self.metrics is not None:
            self.metrics.child(self.metrics.external_limits, rule.name, res.source).inc()
        return res

    # -- shared resources ---------------------------------------------------------------

    def http(self) -> Any:
        if self._http is None:
            import httpx

            self._http = httpx.AsyncClient(
                trust_env=False,
                follow_redirects=False,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            )
        return self._http

    def cache_client(self) -> Any:
        if self.client is None:
            return None
        if self.cache_ok is not None and not self.cache_ok():
            return None
        return self.client

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        if self._http is not None:
            http, self._http = self._http, None
            with contextlib.suppress(Exception):
                await http.aclose()

    # -- counters, metrics, events ------------------------------------------------------

    def count_call(self, result: str) -> None:
        self.calls[result] = self.calls.get(result, 0) + 1
        if self.metrics is not None:
            self.metrics.child(self.metrics.external_calls, result).inc()

    def count_error(self, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1
        if self.metrics is not None:
            self.metrics.child(self.metrics.external_errors, reason).inc()

    def count_cache(self, result: str) -> None:
        self.cache[result] += 1
        if self.metrics is not None:
            self.metrics.child(self.metrics.external_cache, result).inc()

    def note_backend_url_rejected(self, route: str, why: str) -> None:
        self.backend_url_rejected += 1
        if self.metrics is not None:
            self.metrics.child(self.metrics.external_backend_url_rejected).inc()
        if why not in self._rejected_logged and len(self._rejected_logged) < 100:
            self._rejected_logged.add(why)
            log.warning("route %s: dropped a backend_url from the limits service: %s", route, why)

    def on_breaker(self, route: str, b: KeyBreaker, frm: BreakerState, to: BreakerState) -> None:
        self.transitions[to.value] += 1
        if self.metrics is not None:
            self.metrics.child(self.metrics.external_breaker_transitions, to.value).inc()
        if to is BreakerState.OPEN:
            log.warning(
                "external limits breaker for route %s key %r opened after %d failures: %s",
                route,
                b.key,
                b.failures,
                b.last_error,
            )
        if self.publish is None:
            return
        sec = int(self.wall_clock())
        if sec != self._events_second:
            self._events_second, self._events_in_second = sec, 0
        self._events_in_second += 1
        if self._events_in_second > 20:  # a dead service with many tenants must not flood the stream
            self.events_suppressed += 1
            return
        self.publish(
            {
                "type": "external_breaker",
                "route": route,
                "key": b.key,
                "from": frm.value,
                "to": to.value,
                "failures": b.failures,
                "reason": b.last_error,
                "instance": self.instance_id,
            }
        )

    # -- the read model -----------------------------------------------------------------

    def snapshot(self, limit: int = 100, route: str | None = None) -> dict[str, Any]:
        """Routes, breakers (open first), cache and call figures; for ``GET /v1/external``,
        the event stream and the dashboard."""
        resolvers = [r for name, r in sorted(self._resolvers.items()) if route is None or name == route]
        for r in resolvers:
            r.breakers.sweep()
        breakers: list[dict[str, Any]] = []
        counts = {s.value: 0 for s in BreakerState}
        for r in resolvers:
            for s, n in r.breakers.counts().items():
                counts[s] += n
        for r in resolvers:
            breakers.extend({"route": r.route, **b} for b in r.breakers.snapshot(limit))
        order = {"open": 0, "half_open": 1, "closed": 2}
        breakers.sort(key=lambda b: order.get(b["state"], 3))
        looked_up = self.cache["hit"] + self.cache["miss"]
        return {
            "routes": [r.describe() for r in resolvers],
            "breakers": breakers[:limit],
            "breakers_total": sum(counts.values()),
            "breakers_open": counts["open"],
            "breakers_half_open": counts["half_open"],
            "cache": {
                "enabled": self.client is not None,
                "available": self.cache_client() is not None,
                **self.cache,
                "hit_ratio": round(self.cache["hit"] / looked_up, 4) if looked_up else None,
                "errors": self.cache_errors,
            },
            "calls": dict(self.calls),
            "errors": dict(self.errors),
            "sources": dict(self.sources),
            "shared_calls": self.shared_calls,
            "breaker_transitions": dict(self.transitions),
            "backend_hosts": self.backend_hosts.entries(),
            "backend_url_rejected": self.backend_url_rejected,
        }
