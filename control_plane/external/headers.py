"""Which request headers go to the limits service: credentials never do."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "HeaderFilter",
    "SENSITIVE_HEADERS",
    "is_sensitive_header",
]

_MAX_FORWARDED_HEADERS = 64  # at most this many headers are forwarded ...
_MAX_HEADER_VALUE = 8192  # ... and none with a longer value

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
