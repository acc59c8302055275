"""A route's ``external`` block (:class:`ExternalConfig`) and the hosts a response's
``backend_url`` may name (:class:`BackendHosts`): validated, no IO."""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .headers import HeaderFilter, is_sensitive_header

__all__ = [
    "BackendHosts",
    "DEFAULT_CACHE_TTL_S",
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_TIMEOUT_S",
    "ExternalConfig",
    "MAX_CACHE_TTL_S",
    "MAX_TIMEOUT_S",
    "check_service_url",
]

# the defaults (docs/configuration.md#external-limits-external)
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_CACHE_TTL_S = 60.0
DEFAULT_MAX_CONCURRENT = 50
MAX_TIMEOUT_S = 60.0
MAX_CACHE_TTL_S = 86_400.0
_MAX_URL = 2048
_HTTP_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


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


def _seconds(value: object) -> float | None:
    """``value`` as a finite number of seconds, or None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True, kw_only=True)
class ExternalConfig:
    """A route's ``external`` block (``rate_limit.external`` of the external limits service, HTTP only).

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
        t = _seconds(self.timeout_s)
        if t is None or not 0 < t <= MAX_TIMEOUT_S:
            raise ValueError(f"timeout: must be more than 0 and at most {MAX_TIMEOUT_S:g}s, got {self.timeout_s!r}")
        s(self, "timeout_s", t)
        c = _seconds(self.cache_ttl_s)
        if c is None or not 0 <= c <= MAX_CACHE_TTL_S:
            raise ValueError(f"cache_ttl: must be from 0 to {MAX_CACHE_TTL_S:g}s, got {self.cache_ttl_s!r}")
        s(self, "cache_ttl_s", c)
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
                suffixes.add(_suffix_entry(entry, raw))
                continue
            host, port = _host_entry(entry, raw)
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


def _suffix_entry(entry: str, raw: str) -> str:
    """``*.example.com`` -> ``.example.com``."""
    host = entry[2:]
    if not host or not _valid_host(host):
        raise ValueError(f"not a host pattern: {raw.strip()!r} (use host, host:port or *.domain)")
    return "." + host


def _host_entry(entry: str, raw: str) -> tuple[str, int | None]:
    """``host``, ``host:port`` or ``[v6]:port`` -> (host, port or None)."""
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
    return host, port


_HOST = re.compile(r"[a-z0-9]([a-z0-9\-_]{0,62}[a-z0-9_])?(\.[a-z0-9]([a-z0-9\-_]{0,62}[a-z0-9_])?)*\.?")


def _valid_host(host: str) -> bool:
    if _HOST.fullmatch(host):
        return True
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False
