"""Rate-limit key extraction and validation: pure functions, no IO.

A *key* names the bucket a request is counted against. This module turns one
request (peer address, headers, path) into that key, following the key
strategies of the design docs (EdgeQuota key strategies; Konsul per-IP and
per-API-key limiting):

``clientIP``
    The client's IP address. ``X-Forwarded-For`` / ``X-Real-IP`` are honoured
    only when the TCP peer is a trusted proxy; otherwise anyone could pick their
    own bucket by sending a fake header.
``header``
    The value of one configured header (e.g. ``X-Tenant-Id``).
``composite``
    Header value plus the first path segment: ``acme-corp:api``.
``apiKey``
    A *hash* of the API key (``X-API-Key`` or ``Authorization: Bearer``), never
    the raw credential.

Every key that leaves :meth:`KeyExtractor.extract` has passed
:func:`validate_key`: non-empty, at most ``max_length`` UTF-8 bytes, no control
or format characters (so it is safe in Redis keys, log lines and metric
labels), no surrounding whitespace. :func:`redis_key` then places it in a
namespace.

Errors are :class:`InvalidKeyError` (a :class:`ValueError`) carrying ``field``,
the input that was bad (``"key"``, ``"client_ip"``, ``"path"``,
``"header:X-Tenant-Id"``), so an HTTP layer can answer 400 with a useful reason.
Error messages never echo the offending value: it may be a credential, or
contain characters that would corrupt a log line.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Literal, get_args
from urllib.parse import quote

from .proxies import IPAddress, TrustedProxies, parse_ip

__all__ = [
    "DEFAULT_MAX_KEY_LENGTH",
    "ForwardedMode",
    "InvalidKeyError",
    "KeyExtractor",
    "KeyStrategy",
    "MissingKeyError",
    "TrustedProxies",
    "api_key_id",
    "redis_key",
    "validate_key",
]

DEFAULT_MAX_KEY_LENGTH = 256

ForwardedMode = Literal["first", "rightmost_untrusted"]
_FORWARDED_MODES: tuple[str, ...] = get_args(ForwardedMode)

# Rejected anywhere in a key. Cc/Cf are the control and format characters
# (\x00-\x1f, DEL, C1 controls, zero-width and bidi marks); Cs are lone
# surrogates, which cannot be encoded as UTF-8 at all; Zl/Zp (U+2028, U+2029)
# are line breaks to any log viewer that speaks Unicode.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

_CATEGORY_NAMES = {
    "Cc": "control character",
    "Cf": "format (invisible) character",
    "Cs": "surrogate code point",
    "Zl": "line separator",
    "Zp": "paragraph separator",
}

# RFC 9110 section 5.6.2: token = 1*tchar.
_HTTP_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_NAMESPACE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

_API_KEY_PREFIX = "apikey:"
_API_KEY_HEX_CHARS = 32
_API_KEY_ID_LENGTH = len(_API_KEY_PREFIX) + _API_KEY_HEX_CHARS
_MAX_RAW_API_KEY_BYTES = 8192  # bearer tokens (JWTs) are long; only the hash is kept
_LONGEST_IP_TEXT = 39  # "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"

# Segment characters kept verbatim by :meth:`KeyExtractor.extract` (composite):
# RFC 3986 pchar minus ":" and "%", so the key stays unambiguous.
_SEGMENT_SAFE = "!$&'()*+,;=@-._~"


class InvalidKeyError(ValueError):
    """A rate-limit key, or an input it is built from, is not acceptable.

    ``field`` names the input: ``"key"`` for the final key, ``"client_ip"``,
    ``"path"``, or ``"header:<Name>"`` for a request header.
    """

    def __init__(self, message: str, *, field: str = "key") -> None:
        super().__init__(message)
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[Callable[..., InvalidKeyError], tuple[type[InvalidKeyError], str, str]]:
        # keep ``field`` across pickling (kw-only init)
        return (_rebuild_error, (type(self), self.message, self.field))


class MissingKeyError(InvalidKeyError):
    """A header the key strategy needs is absent or empty."""


def _rebuild_error(cls: type[InvalidKeyError], message: str, field: str) -> InvalidKeyError:
    return cls(message, field=field)


def _check_max_length(max_length: object) -> int:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length: must be a positive integer, got {max_length!r}")
    return max_length


def validate_key(key: str, *, field: str = "key", max_length: int = DEFAULT_MAX_KEY_LENGTH) -> str:
    """Return ``key`` unchanged if it is a valid rate-limit key, else raise.

    Raises :class:`InvalidKeyError` (with ``field``) when ``key`` is not a
    string, is empty, is longer than ``max_length`` bytes once UTF-8 encoded,
    contains a control or format character (Unicode category Cc or Cf, e.g.
    ``\\r \\n \\t \\x00 DEL``, zero-width spaces, bidi overrides), a lone
    surrogate or a Unicode line/paragraph separator, or starts or ends with
    whitespace. ``:``, ``/``, inner spaces and non-ASCII letters are allowed.
    """
    max_length = _check_max_length(max_length)
    if not isinstance(key, str):
        raise InvalidKeyError(f"{field}: must be a string, got {type(key).__name__}", field=field)
    if not key:
        raise InvalidKeyError(f"{field}: must not be empty", field=field)
    if len(key) > max_length:  # every character is at least one byte: cheap early out
        raise InvalidKeyError(f"{field}: too long (more than {max_length} bytes of UTF-8)", field=field)
    if not (key.isascii() and key.isprintable()):  # fast path for plain ASCII keys
        for index, char in enumerate(key):
            category = unicodedata.category(char)
            if category in _FORBIDDEN_CATEGORIES:
                raise InvalidKeyError(
                    f"{field}: contains {_CATEGORY_NAMES[category]} U+{ord(char):04X} at index {index}",
                    field=field,
                )
    if key != key.strip():
        raise InvalidKeyError(f"{field}: must not start or end with whitespace", field=field)
    size = len(key.encode("utf-8"))
    if size > max_length:
        raise InvalidKeyError(f"{field}: too long ({size} bytes of UTF-8, max {max_length})", field=field)
    return key


def api_key_id(raw: str) -> str:
    """The rate-limit key for an API key: ``"apikey:" + sha256(raw)[:32 hex]``.

    Keys end up in Redis (visible to anyone with ``SCAN``/``MONITOR``), in logs,
    and as labels in metrics and dashboards; none of those may hold a working
    credential. 128 bits of SHA-256 identify a key without colliding in
    practice, and cannot be reversed for high-entropy API keys. (It is not a
    password hash: a guessable key stays guessable.) Operators can compute the
    same id to configure per-key overrides without ever storing the key.
    ``raw`` is hashed exactly as given (UTF-8); :class:`KeyExtractor` strips the
    header value first.
    """
    if not isinstance(raw, str) or not raw:
        raise InvalidKeyError("api key: must be a non-empty string", field="api_key")
    try:
        data = raw.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidKeyError("api key: is not valid Unicode text", field="api_key") from None
    return _API_KEY_PREFIX + hashlib.sha256(data).hexdigest()[:_API_KEY_HEX_CHARS]


def redis_key(namespace: str, key: str, *, max_length: int = DEFAULT_MAX_KEY_LENGTH) -> str:
    """``f"rl:{namespace}:{key}"`` after validating both parts.

    ``namespace`` must be 1-64 characters of ``[A-Za-z0-9_.-]`` (in particular
    no ``{``/``}``, so a namespace never becomes an accidental Redis Cluster
    hash tag); otherwise :class:`ValueError` naming ``namespace``. ``key`` goes
    through :func:`validate_key`.
    """
    if not isinstance(namespace, str) or _NAMESPACE.fullmatch(namespace) is None:
        raise ValueError(f"namespace: must be 1-64 characters of [A-Za-z0-9_.-], got {namespace!r}")
    validate_key(key, field="key", max_length=max_length)
    return f"rl:{namespace}:{key}"


class KeyStrategy(str, Enum):
    """How a request is mapped to its rate-limit key."""

    CLIENT_IP = "clientIP"
    HEADER = "header"
    COMPOSITE = "composite"
    API_KEY = "apiKey"

    def __str__(self) -> str:  # "clientIP", not "KeyStrategy.CLIENT_IP"
        return self.value

    @classmethod
    def parse(cls, value: str | KeyStrategy) -> KeyStrategy:
        """Parse a strategy name leniently.

        Case, ``_``, ``-`` and surrounding spaces are ignored, so ``"clientIP"``,
        ``"client_ip"``, ``"clientip"``, ``"API_KEY"`` and ``"apikey"`` all work.
        Raises :class:`ValueError` naming the allowed values.
        """
        if isinstance(value, cls):
            return value
        found = _lookup_strategy(value)
        if found is None:
            allowed = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown key strategy {value!r}; allowed values: {allowed}")
        return found

    @classmethod
    def _missing_(cls, value: object) -> KeyStrategy | None:  # KeyStrategy("client_ip")
        return _lookup_strategy(value)


def _normalise_strategy_name(value: str) -> str:
    return value.strip().lower().replace("_", "").replace("-", "")


_STRATEGY_BY_NAME = {_normalise_strategy_name(m.value): m for m in KeyStrategy}


def _lookup_strategy(value: object) -> KeyStrategy | None:
    if not isinstance(value, str):
        return None
    return _STRATEGY_BY_NAME.get(_normalise_strategy_name(value))


def _header_values(headers: Mapping[str, str], name: str) -> list[str]:
    """All values of header ``name``, matched case-insensitively, in order.

    Works for a plain dict with keys in any case and for Starlette ``Headers``
    (whose ``items()`` includes repeated headers).
    """
    wanted = name.lower()
    values: list[str] = []
    for key, value in headers.items():
        if isinstance(key, bytes):
            key = key.decode("latin-1")
        if not isinstance(key, str) or key.lower() != wanted:
            continue
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if isinstance(value, str):
            values.append(value)
    return values


def _first_header(headers: Mapping[str, str], name: str) -> str | None:
    """The first non-blank value of header ``name``, stripped; None if none."""
    for value in _header_values(headers, name):
        value = value.strip()
        if value:
            return value
    return None


def _forwarded_hops(headers: Mapping[str, str]) -> list[str]:
    """X-Forwarded-For entries, left (client) to right (nearest proxy).

    Repeated X-Forwarded-For headers are joined in order, as RFC 9110 allows.
    """
    hops: list[str] = []
    for value in _header_values(headers, "X-Forwarded-For"):
        hops.extend(value.split(","))
    return hops


def _check_header_name(name: object, what: str) -> str:
    if not isinstance(name, str) or _HTTP_TOKEN.fullmatch(name) is None:
        raise ValueError(f"{what}: {name!r} is not a valid HTTP header name")
    return name


@dataclass(frozen=True, slots=True)
class KeyExtractor:
    """Turns a request into its rate-limit key according to ``strategy``.

    ``header`` is required for ``header`` and ``composite`` and must be a valid
    HTTP header name, as must ``api_key_header``. ``trusted_proxies`` (also
    accepted as a list or comma-separated string) and ``forwarded_mode`` only
    matter for ``clientIP``. ``max_length`` is the limit in UTF-8 bytes passed to
    :func:`validate_key`. Strategy names are parsed with
    :meth:`KeyStrategy.parse`.
    """

    strategy: KeyStrategy = KeyStrategy.CLIENT_IP
    header: str | None = None
    api_key_header: str = "X-API-Key"
    trusted_proxies: TrustedProxies = TrustedProxies(())
    max_length: int = DEFAULT_MAX_KEY_LENGTH
    forwarded_mode: ForwardedMode = "first"

    def __post_init__(self) -> None:
        strategy = KeyStrategy.parse(self.strategy)
        object.__setattr__(self, "strategy", strategy)
        if not isinstance(self.trusted_proxies, TrustedProxies):
            object.__setattr__(self, "trusted_proxies", TrustedProxies(self.trusted_proxies))
        _check_max_length(self.max_length)
        if self.forwarded_mode not in _FORWARDED_MODES:
            raise ValueError(
                f"forwarded_mode: must be one of {', '.join(_FORWARDED_MODES)}, got {self.forwarded_mode!r}"
            )
        _check_header_name(self.api_key_header, "api_key_header")
        if strategy in (KeyStrategy.HEADER, KeyStrategy.COMPOSITE):
            if self.header is None:
                raise ValueError(f"header: required for the {strategy.value!r} key strategy")
            _check_header_name(self.header, "header")
        elif self.header is not None:
            _check_header_name(self.header, "header")
        if strategy in (KeyStrategy.CLIENT_IP, KeyStrategy.API_KEY):
            needed = _LONGEST_IP_TEXT if strategy is KeyStrategy.CLIENT_IP else _API_KEY_ID_LENGTH
            if self.max_length < needed:
                raise ValueError(
                    f"max_length: the {strategy.value!r} strategy needs at least {needed}, got {self.max_length}"
                )

    def extract(
        self,
        *,
        client_ip: str | None,
        headers: Mapping[str, str],
        path: str = "/",
    ) -> str:
        """The rate-limit key for one request; always passes :func:`validate_key`.

        ``client_ip`` is the TCP peer (``request.client.host``; ``None`` if
        unknown). ``headers`` is any mapping (a dict in any case, or Starlette
        ``Headers``); names are matched case-insensitively. ``path`` is the
        decoded request path (``request.url.path``).

        ``clientIP``
            Forwarding headers are honoured **only** when the peer is in
            ``trusted_proxies``; from anyone else they are attacker-controlled
            and ignored, and the key is the peer address. From a trusted peer,
            with ``forwarded_mode="first"`` (the classic behaviour), the key is
            the first valid ``X-Forwarded-For`` entry (spaces stripped, empty or
            invalid entries skipped, an IPv4 ``:port`` or IPv6 ``[...]``
            removed), else ``X-Real-IP``, else the peer.

            The first entry is whatever the client sent if the client itself
            added an ``X-Forwarded-For`` header, because proxies *append*. With
            a chain of trusted proxies the stricter choice is the right-most
            untrusted hop, ``forwarded_mode="rightmost_untrusted"``: walk
            ``X-Forwarded-For`` from the right, skip addresses of trusted
            proxies, and take the first untrusted one, i.e. the address the
            outermost trusted proxy actually saw. If every hop is trusted the
            left-most is used; the walk stops at an unparsable hop (everything
            left of it is unverifiable) and uses the last trusted hop passed.
            Without any usable ``X-Forwarded-For`` entry it falls back to
            ``X-Real-IP``, then the peer, like ``first``.

            The result is a normalised address (IPv6 compressed, lower-case, no
            zone id; IPv4-mapped IPv6 as IPv4). No usable address at all (e.g.
            Starlette's ``TestClient`` peer ``"testclient"`` with no trusted
            proxy) raises :class:`InvalidKeyError` with ``field="client_ip"``.
        ``header``
            The stripped value of ``header``; absent or blank raises
            :class:`MissingKeyError` (``field="header:<Name>"``).
        ``composite``
            ``"<header value>:<first path segment>"``, e.g. ``"acme-corp:api"``
            for ``/api/v1/users``; just the header value for ``/``. The segment
            is percent-encoded (``:``, ``%``, spaces, control and non-ASCII
            characters), so the split at the last ``:`` is unambiguous and the
            path can never inject characters into the key. Note that clients
            choose the path: unrouted segments also get buckets of their own.
        ``apiKey``
            :func:`api_key_id` of the ``api_key_header`` value, else of the
            ``Authorization: Bearer <token>`` token; absent raises
            :class:`MissingKeyError` (``field="header:<api_key_header>"``). The
            raw key is never returned and never appears in error messages.

        Header values that are invalid (control characters, too long) raise
        :class:`InvalidKeyError` with ``field="header:<Name>"``.
        """
        strategy = self.strategy
        if strategy is KeyStrategy.CLIENT_IP:
            key = self._client_ip_key(client_ip, headers)
        elif strategy is KeyStrategy.HEADER:
            key = self._required_header(headers)
        elif strategy is KeyStrategy.COMPOSITE:
            key = self._required_header(headers)
            segment = _first_segment(path)
            if segment:
                key = f"{key}:{segment}"
        else:
            key = self._api_key(headers)
        return validate_key(key, field="key", max_length=self.max_length)

    # -- strategies -------------------------------------------------------------

    def _client_ip_key(self, client_ip: str | None, headers: Mapping[str, str]) -> str:
        peer = parse_ip(client_ip)
        chosen: IPAddress | None = peer
        if peer is not None and self.trusted_proxies.contains_address(peer):
            forwarded = (
                self._rightmost_untrusted(headers)
                if self.forwarded_mode == "rightmost_untrusted"
                else _first_valid(_forwarded_hops(headers))
            )
            if forwarded is None:
                forwarded = _first_valid(_header_values(headers, "X-Real-IP"))
            if forwarded is not None:
                chosen = forwarded
        if chosen is None:
            raise InvalidKeyError(
                "client_ip: no usable client IP address (peer address missing or invalid)",
                field="client_ip",
            )
        return str(chosen)

    def _rightmost_untrusted(self, headers: Mapping[str, str]) -> IPAddress | None:
        last_trusted: IPAddress | None = None
        for hop in reversed(_forwarded_hops(headers)):
            if not hop.strip():
                continue
            ip = parse_ip(hop)
            if ip is None:
                break  # cannot vouch for anything further left
            if not self.trusted_proxies.contains_address(ip):
                return ip
            last_trusted = ip
        return last_trusted

    def _required_header(self, headers: Mapping[str, str]) -> str:
        name = self.header
        assert name is not None  # guaranteed by __post_init__ for these strategies
        value = _first_header(headers, name)
        if value is None:
            raise MissingKeyError(
                f"header {name} is required by this route's key strategy",
                field=f"header:{name}",
            )
        return validate_key(value, field=f"header:{name}", max_length=self.max_length)

    def _api_key(self, headers: Mapping[str, str]) -> str:
        name = self.api_key_header
        raw = _first_header(headers, name)
        source = name
        if raw is None:
            raw = _bearer_token(headers)
            source = "Authorization"
        if raw is None:
            raise MissingKeyError(
                f"header {name} (or Authorization: Bearer <token>) is required by this route's key strategy",
                field=f"header:{name}",
            )
        validate_key(raw, field=f"header:{source}", max_length=_MAX_RAW_API_KEY_BYTES)
        return api_key_id(raw)


def _first_valid(tokens: Iterable[str]) -> IPAddress | None:
    for token in tokens:
        ip = parse_ip(token)
        if ip is not None:
            return ip
    return None


def _bearer_token(headers: Mapping[str, str]) -> str | None:
    for value in _header_values(headers, "Authorization"):
        parts = value.split(None, 1)
        if len(parts) == 2 and parts[0].lower() == "bearer":
            token = parts[1].strip()
            if token:
                return token
    return None


def _first_segment(path: str) -> str:
    """First non-empty segment of ``path`` (query/fragment ignored), percent-encoded."""
    if not isinstance(path, str):
        raise InvalidKeyError(f"path: must be a string, got {type(path).__name__}", field="path")
    path = path.split("?", 1)[0].split("#", 1)[0]
    segment = path.lstrip("/").split("/", 1)[0]
    if not segment:
        return ""
    return quote(segment, safe=_SEGMENT_SAFE, errors="surrogatepass")
