"""The control plane's YAML rules file: routes, their keys, their local and distributed policies.

The file is parsed strictly: unknown keys, duplicate keys, wrong types and values the
limiter would refuse are all errors, and every error is a :class:`RulesError` naming
the file, the line and the field (``rules.yaml:14: routes[1].local.burst: must be
between 1 and 1000000000, got 0``). A bad file never half-applies: :class:`RulesWatcher`
keeps serving the last good rules and reports the error.

Schema (see ``examples/rules.yaml`` for a commented example)::

    version: 1                       # optional, must be 1
    defaults:                        # optional; used by every route that does not set them
      key: {strategy: clientIP}      # strategy, header, api_key_header, forwarded_mode, max_length
      failure_policy: inMemoryFallback
      failure_code: 429
    routes:                          # required (may be empty); first match wins
      - name: search                 # required, unique, [A-Za-z0-9_.-]{1,64}
        match:
          methods: [GET, POST]       # optional (default any); "*" = any
          path: /api/v1/search/**    # required: literal, *, ** or {name} segments
        key: {strategy: header, header: X-Tenant-Id}
        local: {algorithm: token_bucket, average: 100, period: 1s, burst: 20}    # required
        distributed: {average: 300, period: 1s, burst: 60}   # optional, default = local
        overrides:
          api_keys: {"apikey:<32 hex>": {average: 1000, burst: 200}}
          tenants: {acme: {average: 500, burst: 100}}
        allow: ["10.0.0.0/8", "internal-job"]
        deny: ["203.0.113.0/24", "bad-tenant"]
        failure_policy: failClosed
        failure_code: 503
        mode: shadow                 # initial mode when Redis has no stored state
        canary_percent: 10           # only with mode: canary
        external:                    # optional: per-key limits from a limits service
          url: http://limits:8080/limits   # POSTed {key, headers, method, path}
          timeout: 5s                # default 5s, at most 60s
          cache_ttl: 60s             # default 60s; 0 caches only answers with cache hints
          max_concurrent_requests: 50
          header_filter: {allow_list: [X-Tenant-Id]}   # or deny_list; credentials never go

Details worth knowing:

- ``distributed`` and every override policy inherit ``algorithm`` and ``period`` from
  the route's ``local`` policy when they do not set them (``burst`` is never inherited:
  it defaults to ``ceil(average)`` as in :class:`~limiter.policy.Policy`).
- Overrides apply to both limiters: a privileged key gets the override policy as its
  local *and* its distributed policy. ``api_keys`` entries may be raw API keys (hashed
  with :func:`~limiter.keys.api_key_id` at load time; the raw key is never kept or
  echoed in errors) or ready-made ``apikey:<32 hex>`` ids; they are only allowed on
  routes whose key strategy is ``apiKey``.
- The route named ``default`` is the built-in fallback (``/**``, clientIP, the
  ``RATE_LIMIT_GLOBAL_*`` token bucket). A file may redefine it (its ``match`` may be
  omitted and, if given, must be ``/**`` for any method); it is always tried last.
  ``defaults`` apply to user routes (including a redefined ``default``), never to the
  built-in one.
- Trusted proxies for ``clientIP`` keys come from ``SHADOWLIMIT_TRUSTED_PROXIES``
  (``settings.proxies``), never from the file.
- A route's ``external`` answer replaces its ``local``/``distributed`` policies (and
  tenant overrides) for that key, in both limiters; the file's policies are the fallback
  when the service cannot answer (see :mod:`control_plane.external`).
- YAML 1.1 reads ``off``/``on``/``yes``/``no`` as booleans; this loader does not (only
  ``true``/``false`` are booleans), so ``mode: off`` means the mode ``"off"``.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import ipaddress
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from limiter.keys import KeyExtractor, KeyStrategy, api_key_id, validate_key
from limiter.policy import Algorithm, Policy
from limiter.resilience import FailurePolicy

from .durations import parse_duration
from .external import (
    DEFAULT_CACHE_TTL_S,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_TIMEOUT_S,
    ExternalConfig,
    check_service_url,
    is_sensitive_header,
)
from .rollout import Mode

if TYPE_CHECKING:
    from .settings import Settings

__all__ = [
    "ListMatcher",
    "RouteRule",
    "Rules",
    "RulesError",
    "RulesWatcher",
    "compile_path_pattern",
    "default_route",
    "load_rules",
    "parse_duration",
    "parse_rules",
]

log = logging.getLogger("shadowlimit.rules")

DEFAULT_ROUTE = "default"
MAX_FILE_BYTES = 4 * 1024 * 1024
_MAX_NODES = 200_000
_MAX_PATTERN_LENGTH = 1024
_API_KEY_ID = re.compile(r"apikey:[0-9a-f]{32}")
_ROUTE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
# bucket keys are rl:<ns>:<route>:<key>; these names would collide with the control
# plane's own keys (rl:<ns>:div:..., rl:<ns>:hh:..., rl:<ns>:fleet, rl:<ns>:extcache:...)
RESERVED_ROUTE_NAMES = frozenset({"div", "hh", "hhid", "fleet", "extcache"})
_HTTP_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_MAX_RAW_API_KEY_BYTES = 8192


# ---------------------------------------------------------------------------------------
# errors


class RulesError(ValueError):
    """The rules file (or one of its values) is invalid.

    ``path`` is the file (None for text given directly), ``line`` the 1-based line
    (None when unknown), ``field`` the dotted field path (``routes[0].local.burst``;
    ``""`` for file-level problems) and ``message`` the bare reason.
    ``str(err)`` is ``"<path>:<line>: <field>: <message>"`` without the unknown parts
    (``"line 3: ..."`` when only the line is known).
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None, field: str = "") -> None:
        self.message = message
        self.path = path
        self.line = line
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        parts: list[str] = []
        if self.path is not None and self.line is not None:
            parts.append(f"{self.path}:{self.line}")
        elif self.path is not None:
            parts.append(self.path)
        elif self.line is not None:
            parts.append(f"line {self.line}")
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return ": ".join(parts)

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self):  # keep the keyword-only attributes across pickling
        return (_rebuild_rules_error, (self.message, self.path, self.line, self.field))

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "line": self.line, "field": self.field, "message": self.message, "error": str(self)}


def _rebuild_rules_error(message: str, path: str | None, line: int | None, field: str) -> RulesError:
    return RulesError(message, path=path, line=line, field=field)


# ---------------------------------------------------------------------------------------
# path patterns (durations: control_plane.durations)


class _Wild:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_ONE = _Wild("*")  # exactly one segment
_ANY = _Wild("**")  # zero or more segments
_Segment = str | _Wild


def compile_path_pattern(pattern: object) -> tuple[_Segment, ...]:
    """Validate a path pattern and return its segments.

    Literal segments match exactly (case-sensitive); ``*`` and ``{name}`` match exactly
    one segment; ``**`` matches any number of segments, including none. Wildcards must
    be whole segments. A trailing ``/`` is ignored. Raises :class:`ValueError`.
    """
    if not isinstance(pattern, str):
        raise ValueError(f"must be a string, got {type(pattern).__name__}")
    if not pattern.startswith("/"):
        raise ValueError(f"must start with '/', got {pattern!r}")
    if len(pattern) > _MAX_PATTERN_LENGTH:
        raise ValueError(f"too long ({len(pattern)} characters, max {_MAX_PATTERN_LENGTH})")
    if any(c.isspace() or not c.isprintable() for c in pattern):
        raise ValueError(f"must not contain whitespace or control characters, got {pattern!r}")
    if "?" in pattern or "#" in pattern:
        raise ValueError(f"a path pattern has no query string or fragment ('?', '#'), got {pattern!r}")
    body = pattern[1:]
    if body.endswith("/"):
        body = body[:-1]
    if not body:
        return ()
    segments: list[_Segment] = []
    params: set[str] = set()
    for part in body.split("/"):
        if part == "":
            raise ValueError(f"empty path segment ('//') in {pattern!r}")
        if part == "**":
            if segments and segments[-1] is _ANY:
                continue  # '/**/**' is the same as '/**'
            segments.append(_ANY)
        elif part == "*":
            segments.append(_ONE)
        elif (m := _PARAM.fullmatch(part)) is not None:
            if m.group(1) in params:
                raise ValueError(f"parameter {{{m.group(1)}}} appears twice in {pattern!r}")
            params.add(m.group(1))
            segments.append(_ONE)
        elif any(c in part for c in "*{}"):
            raise ValueError(
                f"wildcards must be whole segments ('*', '**' or '{{name}}'), got segment {part!r} in {pattern!r}"
            )
        else:
            segments.append(part)
    return tuple(segments)


def _match_segments(pattern: tuple[_Segment, ...], segs: list[str]) -> bool:
    n = len(segs)
    if _ANY not in pattern:  # fast path: one segment per pattern element
        if len(pattern) != n:
            return False
        for p, s in zip(pattern, segs):
            if p is not _ONE and p != s:
                return False
        return True
    # positions in ``segs`` reachable after each pattern element: O(len(pattern) * n)
    reach = [0]
    for p in pattern:
        if p is _ANY:
            reach = list(range(reach[0], n + 1))
        elif p is _ONE:
            reach = [i + 1 for i in reach if i < n]
        else:
            reach = [i + 1 for i in reach if i < n and segs[i] == p]
        if not reach:
            return False
    return reach[-1] == n


def _path_segments(path: str) -> list[str]:
    """Request path to segments: empty segments (trailing or doubled '/') are dropped."""
    return [s for s in path.split("/") if s]


# ---------------------------------------------------------------------------------------
# allow / deny lists

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_LOOKS_LIKE_V4 = re.compile(r"[0-9.]+(/[0-9]*)?")
_LOOKS_LIKE_V6 = re.compile(r"\[?[0-9A-Fa-f:.]*::?[0-9A-Fa-f:.]*\]?(/[0-9]*)?")


def _parse_list_entry(entry: object) -> _IPNetwork | str:
    """An IP address or CIDR block (host bits masked), else an exact key."""
    if not isinstance(entry, str):
        raise ValueError(f"must be a string (an IP address, a CIDR block or a key), got {type(entry).__name__}")
    text = entry.strip()
    if text != entry or not text:
        raise ValueError("must not be empty or start or end with whitespace")
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        pass
    if _LOOKS_LIKE_V4.fullmatch(text) or (text.count(":") >= 2 and _LOOKS_LIKE_V6.fullmatch(text)):
        raise ValueError(f"{text!r} looks like an IP address or CIDR block but is not a valid one")
    validate_key(text, field="entry")
    return text


def _client_address(client_ip: object) -> _IPAddress | None:
    if isinstance(client_ip, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        ip: _IPAddress = client_ip
    elif isinstance(client_ip, str) and 0 < len(client_ip) <= 64:
        text = client_ip.strip()
        if text.startswith("[") and "]" in text:
            text = text[1 : text.index("]")]
        elif text.count(":") == 1:  # IPv4 with a port
            text = text.partition(":")[0]
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            return None
    else:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.scope_id is not None:
            return ipaddress.IPv6Address(ip.packed)
    return ip


class ListMatcher:
    """An allow or deny list: IP/CIDR entries match the client IP, others the key exactly.

    ``ListMatcher(["10.0.0.0/8", "127.0.0.1", "internal-job"])``. With ``composite=True``
    (routes whose key strategy is ``composite``, keys ``"<tenant>:<segment>"``) a key
    entry also matches the key's tenant part, i.e. everything before the last ``:``.
    Pass the resolved client address as ``client_ip`` if the service sits behind proxies
    (an IP entry is never compared with the key, so a header value cannot pose as an
    address). Invalid entries raise :class:`ValueError`. Immutable.
    """

    __slots__ = ("_entries", "_keys", "_networks", "_composite")

    def __init__(self, entries: Iterable[str] = (), *, composite: bool = False) -> None:
        if isinstance(entries, str):
            raise ValueError("entries: expected a list of strings, got a single string")
        ordered: list[str] = []
        keys: set[str] = set()
        networks: list[_IPNetwork] = []
        for entry in entries:
            parsed = _parse_list_entry(entry)
            if isinstance(parsed, str):
                if parsed in keys:
                    continue
                keys.add(parsed)
                ordered.append(parsed)
            else:
                if parsed in networks:
                    continue
                networks.append(parsed)
                ordered.append(str(parsed))
        self._entries: tuple[str, ...] = tuple(ordered)
        self._keys = frozenset(keys)
        self._networks: tuple[_IPNetwork, ...] = tuple(networks)
        self._composite = composite

    @property
    def entries(self) -> tuple[str, ...]:
        """The distinct entries in order (CIDR blocks normalised, e.g. ``10.0.0.0/8``)."""
        return self._entries

    @property
    def networks(self) -> tuple[_IPNetwork, ...]:
        return self._networks

    @property
    def keys(self) -> frozenset[str]:
        return self._keys

    def matches(self, key: str | None, client_ip: str | None = None) -> bool:
        if key is not None and self._keys:
            if key in self._keys:
                return True
            if self._composite and ":" in key and key.rpartition(":")[0] in self._keys:
                return True
        if client_ip is not None and self._networks:
            addr = _client_address(client_ip)
            if addr is not None:
                return any(addr.version == net.version and addr in net for net in self._networks)
        return False

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ListMatcher):
            return NotImplemented
        return (
            self._keys == other._keys
            and set(self._networks) == set(other._networks)
            and self._composite == other._composite
        )

    def __hash__(self) -> int:
        return hash((self._keys, frozenset(self._networks), self._composite))

    def __repr__(self) -> str:
        return f"ListMatcher({list(self._entries)!r})"


# ---------------------------------------------------------------------------------------
# routes


def _frozen_policies(value: Mapping[str, Policy] | None) -> Mapping[str, Policy]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class RouteRule:
    """One route: which requests it matches, how they are keyed and limited.

    ``methods`` None means any method. ``api_key_overrides`` is keyed by
    :func:`~limiter.keys.api_key_id` ids (``"apikey:<32 hex>"``), ``tenant_overrides``
    by tenant (header value) or exact key. ``initial_mode`` is the mode used when Redis
    holds no stored state for the route. ``line`` is where the route starts in the file
    (None for the built-in default).
    """

    name: str
    methods: frozenset[str] | None
    path_pattern: str
    key: KeyExtractor
    local: Policy
    distributed: Policy
    api_key_overrides: Mapping[str, Policy] = field(default_factory=dict)
    tenant_overrides: Mapping[str, Policy] = field(default_factory=dict)
    allow: ListMatcher = field(default_factory=ListMatcher)
    deny: ListMatcher = field(default_factory=ListMatcher)
    failure_policy: FailurePolicy | None = None
    failure_code: int | None = None
    initial_mode: Mode | None = None
    initial_canary_percent: int = 0
    line: int | None = None
    external: ExternalConfig | None = None
    _segments: tuple[_Segment, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        s = object.__setattr__
        if not isinstance(self.name, str) or _ROUTE_NAME.fullmatch(self.name) is None:
            raise ValueError(f"name: must be 1-64 characters of [A-Za-z0-9_.-], got {self.name!r}")
        if self.methods is not None:
            methods = frozenset(self.methods)
            for m in methods:
                if not isinstance(m, str) or (m != "*" and _HTTP_TOKEN.fullmatch(m) is None):
                    raise ValueError(f"methods: {m!r} is not an HTTP method")
            s(self, "methods", None if "*" in methods or not methods else methods)
        try:
            s(self, "_segments", compile_path_pattern(self.path_pattern))
        except ValueError as exc:
            raise ValueError(f"path: {exc}") from None
        s(self, "api_key_overrides", _frozen_policies(self.api_key_overrides))
        s(self, "tenant_overrides", _frozen_policies(self.tenant_overrides))
        if self.initial_mode is not None:
            s(self, "initial_mode", Mode(self.initial_mode))
        if self.failure_policy is not None:
            s(self, "failure_policy", FailurePolicy.parse(self.failure_policy))
        pct = self.initial_canary_percent
        if isinstance(pct, bool) or not isinstance(pct, int) or not 0 <= pct <= 100:
            raise ValueError(f"canary_percent: must be a whole number from 0 to 100, got {pct!r}")

    def __hash__(self) -> int:
        return hash((self.name, self.path_pattern, self.methods, self.line))

    @property
    def is_catch_all(self) -> bool:
        """True when the route matches every request (``/**``, any method)."""
        return self.methods is None and self._segments == (_ANY,)

    def matches(self, method: str, path: str) -> bool:
        """Whether a request (method as sent, e.g. ``"GET"``; decoded path) hits this route.

        ``/a/b/`` is treated like ``/a/b`` (and ``//`` like ``/``).
        """
        if self.methods is not None and method not in self.methods:
            return False
        return _match_segments(self._segments, _path_segments(path))

    def policies_for(self, key: str) -> tuple[Policy, Policy]:
        """``(local, distributed)`` for a key, overrides applied.

        An override (API key id first, then tenant) matches the key exactly; for the
        ``composite`` strategy (keys ``"<tenant>:<segment>"``) the tenant part, before the
        last ``:``, is tried too. A privileged key gets its override in both limiters.
        """
        if self.api_key_overrides:
            p = self.api_key_overrides.get(key)
            if p is not None:
                return p, p
        if self.tenant_overrides:
            p = self.tenant_overrides.get(key)
            if p is None and self.key.strategy is KeyStrategy.COMPOSITE and ":" in key:
                p = self.tenant_overrides.get(key.rpartition(":")[0])
            if p is not None:
                return p, p
        return self.local, self.distributed

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe summary for the API (no raw keys; override and list entries are counted)."""
        key: dict[str, Any] = {"strategy": self.key.strategy.value}
        if self.key.header is not None:
            key["header"] = self.key.header
        if self.key.strategy is KeyStrategy.API_KEY:
            key["api_key_header"] = self.key.api_key_header
        if self.key.strategy is KeyStrategy.CLIENT_IP:
            key["forwarded_mode"] = self.key.forwarded_mode
        return {
            "name": self.name,
            "methods": sorted(self.methods) if self.methods is not None else None,
            "path": self.path_pattern,
            "key": key,
            "local": self.local.to_dict(),
            "distributed": self.distributed.to_dict(),
            "local_describe": self.local.describe(),
            "distributed_describe": self.distributed.describe(),
            "overrides": {"api_keys": len(self.api_key_overrides), "tenants": len(self.tenant_overrides)},
            "allow": len(self.allow),
            "deny": len(self.deny),
            "failure_policy": self.failure_policy.value if self.failure_policy is not None else None,
            "failure_code": self.failure_code,
            "mode": self.initial_mode.value if self.initial_mode is not None else None,
            "canary_percent": self.initial_canary_percent,
            "line": self.line,
            "external": self.external.to_dict() if self.external is not None else None,
        }


def default_route(settings: Settings) -> RouteRule:
    """The built-in fallback: ``/**``, any method, clientIP (trusted proxies from settings),
    a token bucket of ``RATE_LIMIT_GLOBAL_CAPACITY`` refilled at
    ``RATE_LIMIT_GLOBAL_REFILL_PER_SEC`` per second (0 = unlimited) for both limiters."""
    policy = Policy(average=settings.global_refill_per_sec, period=1.0, burst=settings.global_capacity)
    return RouteRule(
        name=DEFAULT_ROUTE,
        methods=None,
        path_pattern="/**",
        key=KeyExtractor(KeyStrategy.CLIENT_IP, trusted_proxies=settings.proxies),
        local=policy,
        distributed=policy,
    )


@dataclass(frozen=True)
class Rules:
    """A loaded rules file: user routes in file order (first match wins) and the default."""

    routes: tuple[RouteRule, ...]
    default: RouteRule
    source: str | None = None
    loaded_at: float = field(default_factory=time.time)
    digest: str = "builtin"
    _by_name: Mapping[str, RouteRule] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "routes", tuple(self.routes))
        by_name: dict[str, RouteRule] = {}
        for r in self.routes:
            if r.name == DEFAULT_ROUTE:
                raise ValueError("the default route goes in Rules.default, not Rules.routes")
            if r.name in by_name:
                raise ValueError(f"duplicate route name {r.name!r}")
            by_name[r.name] = r
        if self.default.name != DEFAULT_ROUTE:
            raise ValueError(f"the default route must be named {DEFAULT_ROUTE!r}, got {self.default.name!r}")
        by_name[DEFAULT_ROUTE] = self.default
        object.__setattr__(self, "_by_name", MappingProxyType(by_name))

    def __hash__(self) -> int:
        return hash((self.digest, self.source, self.loaded_at))

    @property
    def all_routes(self) -> tuple[RouteRule, ...]:
        """User routes then the default: the order :meth:`match` tries them."""
        return (*self.routes, self.default)

    def match(self, method: str, path: str) -> RouteRule:
        """The first user route matching the request, else the default route."""
        segs = _path_segments(path)
        for r in self.routes:
            if (r.methods is None or method in r.methods) and _match_segments(r._segments, segs):
                return r
        return self.default

    def get(self, name: str) -> RouteRule | None:
        """A route by name (``"default"`` included), or None."""
        return self._by_name.get(name)

    def names(self) -> list[str]:
        """User route names in file order, then ``"default"``."""
        return [r.name for r in self.routes] + [DEFAULT_ROUTE]

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "digest": self.digest,
            "loaded_at": self.loaded_at,
            "routes": [dict(r.to_dict(), default=r is self.default) for r in self.all_routes],
        }


# ---------------------------------------------------------------------------------------
# YAML: a strict loader that records the line of every field


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2-style booleans (only true/false) and duplicate-key errors.

    :func:`_load_yaml` builds the data itself from the composed node tree (so it can
    record lines); :meth:`construct_mapping` also refuses duplicates for anyone using
    this loader with ``yaml.load``.
    """

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                k = self.construct_object(key_node, deep=deep)
                if k in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {k!r} (first on line {seen[k]})",
                        key_node.start_mark,
                    )
                seen[k] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)

_MERGE_TAG = "tag:yaml.org,2002:merge"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"

_Path = tuple[str | int, ...]


def _format_path(path: _Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]*", part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out


def _redact_api_key(raw: str) -> str:
    if _API_KEY_ID.fullmatch(raw):
        return raw
    try:
        return api_key_id(raw)
    except ValueError:
        return "<api key>"


def _display_path(path: _Path) -> _Path:
    """Raw API keys (map keys under ``overrides.api_keys``) are shown as their ids."""
    out: list[str | int] = []
    for i, part in enumerate(path):
        if isinstance(part, str) and i >= 2 and path[i - 2 : i] == ("overrides", "api_keys"):
            part = _redact_api_key(part)
        out.append(part)
    return tuple(out)


class _Fail(Exception):
    def __init__(self, path: _Path, line: int | None, message: str) -> None:
        self.path, self.line, self.message = path, line, message


class _Builder:
    """Python data from the node tree, recording ``{path: line}`` for every field."""

    def __init__(self, loader: _StrictLoader) -> None:
        self.loader = loader
        self.lines: dict[_Path, int] = {}
        self.count = 0
        self.active: set[int] = set()

    def build(self, node: Node, path: _Path) -> Any:
        self.count += 1
        if self.count > _MAX_NODES:
            raise _Fail(
                path,
                node.start_mark.line + 1,
                f"the document is too large (more than {_MAX_NODES} values, aliases included)",
            )
        if isinstance(node, ScalarNode):
            return self.loader.construct_object(node, deep=True)
        if id(node) in self.active:
            raise _Fail(path, node.start_mark.line + 1, "recursive alias")
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                if node.tag != _SEQ_TAG:
                    raise _Fail(path, node.start_mark.line + 1, f"unsupported YAML tag {node.tag!r}")
                items = []
                for i, item in enumerate(node.value):
                    p = (*path, i)
                    self.lines[p] = item.start_mark.line + 1
                    items.append(self.build(item, p))
                return items
            if isinstance(node, MappingNode):
                if node.tag != _MAP_TAG:
                    raise _Fail(path, node.start_mark.line + 1, f"unsupported YAML tag {node.tag!r}")
                return self._mapping(node, path)
            raise _Fail(path, node.start_mark.line + 1, f"unsupported YAML node {type(node).__name__}")
        finally:
            self.active.discard(id(node))

    def _mapping(self, node: MappingNode, path: _Path) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        explicit: list[tuple[str, Node, Node]] = []
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:
                sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
                for src in sources:
                    if not isinstance(src, MappingNode):
                        raise _Fail(path, line, "a merge key (<<) needs a mapping or a list of mappings")
                    for k, v in self.build(src, path).items():
                        merged.setdefault(k, v)
                continue
            if not isinstance(key_node, ScalarNode):
                raise _Fail(path, line, "mapping keys must be plain strings")
            key = key_node.value  # the text as written: `1:` is "1", `null:` is "null"
            if key in first_line:
                shown = _display_path((*path, key))[-1]
                raise _Fail((*path, key), line, f"duplicate key {shown!r} (first defined on line {first_line[key]})")
            first_line[key] = line
            explicit.append((key, key_node, value_node))
        result = dict(merged)
        for key, key_node, value_node in explicit:
            p = (*path, key)
            self.lines[p] = key_node.start_mark.line + 1
            result[key] = self.build(value_node, p)
        return result


def _load_yaml(text: str, source: str | None) -> tuple[Any, dict[_Path, int]]:
    loader = _StrictLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            problem = exc.problem or exc.context or "invalid YAML"
            if exc.context and exc.problem:
                problem = f"{exc.problem} ({exc.context})"
            raise RulesError(
                f"YAML syntax error: {problem}", path=source, line=mark.line + 1 if mark else None
            ) from None
        except yaml.YAMLError as exc:
            raise RulesError(f"YAML syntax error: {exc}", path=source) from None
        if node is None:
            raise RulesError("the file is empty; expected a mapping with a 'routes' list", path=source, line=1)
        builder = _Builder(loader)
        try:
            data = builder.build(node, ())
        except _Fail as exc:
            raise RulesError(
                exc.message, path=source, line=exc.line, field=_format_path(_display_path(exc.path))
            ) from None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            raise RulesError(
                f"{exc.problem or exc.context}", path=source, line=mark.line + 1 if mark else None
            ) from None
        builder.lines.setdefault((), node.start_mark.line + 1)
        return data, builder.lines
    finally:
        loader.dispose()


# ---------------------------------------------------------------------------------------
# validation

_TOP_KEYS = ("version", "defaults", "routes")
_DEFAULTS_KEYS = ("key", "failure_policy", "failure_code")
_ROUTE_KEYS = (
    "name",
    "match",
    "key",
    "local",
    "distributed",
    "overrides",
    "allow",
    "deny",
    "failure_policy",
    "failure_code",
    "mode",
    "canary_percent",
    "external",
)
_MATCH_KEYS = ("methods", "path")
_KEY_KEYS = ("strategy", "header", "api_key_header", "forwarded_mode", "max_length")
_POLICY_KEYS = ("algorithm", "average", "period", "burst")
_OVERRIDE_KEYS = ("api_keys", "tenants")
_EXTERNAL_KEYS = ("url", "timeout", "cache_ttl", "max_concurrent_requests", "header_filter")
_HEADER_FILTER_KEYS = ("allow_list", "deny_list")
_HINTS = {
    (
        "key",
        "trusted_proxies",
    ): "trusted proxies are not set in the rules file; they come from SHADOWLIMIT_TRUSTED_PROXIES",
    (
        "external",
        "enabled",
    ): "a route asks its limits service whenever it has an external block; remove the block to turn that off",
    ("external", "http"): "give the service's address as external.url (only HTTP limits services are supported)",
    ("external", "grpc"): "only HTTP limits services are supported: give external.url",
}
_MISSING = object()


class _Validator:
    def __init__(self, lines: dict[_Path, int], source: str | None, settings: Settings) -> None:
        self.lines = lines
        self.source = source
        self.settings = settings
        self.proxies = settings.proxies

    # -- errors --

    def line(self, path: _Path) -> int | None:
        p = path
        while True:
            if p in self.lines:
                return self.lines[p]
            if not p:
                return None
            p = p[:-1]

    def error(self, path: _Path, message: str) -> RulesError:
        return RulesError(message, path=self.source, line=self.line(path), field=_format_path(_display_path(path)))

    def value_error(self, path: _Path, exc: ValueError, names: Iterable[str] = ()) -> RulesError:
        """A Policy/KeyExtractor message ``"burst: ..."`` becomes field ``path.burst``."""
        msg = getattr(exc, "message", None) or str(exc)
        m = re.match(r"([A-Za-z_]+): (.*)", msg, re.S)
        if m and m.group(1) in names:
            return self.error((*path, m.group(1)), m.group(2))
        return self.error(path, msg)

    # -- shapes --

    def mapping(
        self, value: Any, path: _Path, allowed: tuple[str, ...], required: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(path, f"must be a mapping, got {_type_name(value)}")
        for k in value:
            if k not in allowed:
                hint = _HINTS.get((path[-1] if path and isinstance(path[-1], str) else "", k))
                close = difflib.get_close_matches(k, allowed, n=1)
                msg = f"unknown key {k!r}"
                if hint:
                    msg += f"; {hint}"
                elif close:
                    msg += f" (did you mean {close[0]!r}?)"
                raise self.error((*path, k), f"{msg}; allowed keys: {', '.join(allowed)}")
        for k in required:
            if k not in value:
                raise self.error(path, f"missing required key {k!r}")
        return value

    def string(self, value: Any, path: _Path) -> str:
        if not isinstance(value, str):
            raise self.error(path, f"must be a string, got {_type_name(value)}")
        return value

    def integer(self, value: Any, path: _Path, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(path, f"must be a whole number from {lo} to {hi}, got {_type_name(value)} {value!r}")
        if not lo <= value <= hi:
            raise self.error(path, f"must be from {lo} to {hi}, got {value}")
        return value

    # -- pieces --

    def policy(self, value: Any, path: _Path, inherit: Policy | None = None) -> Policy:
        m = self.mapping(value, path, _POLICY_KEYS, required=("average",))
        if "algorithm" in m:
            algorithm: Any = self.string(m["algorithm"], (*path, "algorithm"))
        else:
            algorithm = inherit.algorithm if inherit is not None else Algorithm.TOKEN_BUCKET
        if "period" in m:
            try:
                period = parse_duration(m["period"])
            except ValueError as exc:
                raise self.value_error(path, exc, _POLICY_KEYS) from None
        else:
            period = inherit.period if inherit is not None else 1.0
        try:
            return Policy(average=m["average"], period=period, burst=m.get("burst"), algorithm=algorithm)
        except ValueError as exc:
            raise self.value_error(path, exc, _POLICY_KEYS) from None

    def key(self, value: Any, path: _Path) -> KeyExtractor:
        m = self.mapping(value, path, _KEY_KEYS)
        try:
            strategy = KeyStrategy.parse(m.get("strategy", KeyStrategy.CLIENT_IP))
        except ValueError as exc:
            raise self.error((*path, "strategy"), str(exc)) from None
        kwargs: dict[str, Any] = {}
        for name in ("header", "api_key_header", "forwarded_mode"):
            if name in m:
                kwargs[name] = self.string(m[name], (*path, name))
        if "max_length" in m:
            kwargs["max_length"] = self.integer(m["max_length"], (*path, "max_length"), 1, 65_536)
        if "forwarded_mode" in m and strategy is not KeyStrategy.CLIENT_IP:
            raise self.error((*path, "forwarded_mode"), "only applies to the clientIP strategy")
        if "header" in m and strategy not in (KeyStrategy.HEADER, KeyStrategy.COMPOSITE):
            raise self.error(
                (*path, "header"), f"only applies to the header and composite strategies, not {strategy.value}"
            )
        if "api_key_header" in m and strategy is not KeyStrategy.API_KEY:
            raise self.error((*path, "api_key_header"), f"only applies to the apiKey strategy, not {strategy.value}")
        try:
            return KeyExtractor(strategy, trusted_proxies=self.proxies, **kwargs)
        except ValueError as exc:
            raise self.value_error(path, exc, _KEY_KEYS) from None

    def failure_policy(self, value: Any, path: _Path) -> FailurePolicy:
        self.string(value, path)
        try:
            return FailurePolicy.parse(value)
        except ValueError as exc:
            raise self.value_error(path[:-1], exc, ("failure_policy",)) from None

    def failure_code(self, value: Any, path: _Path) -> int:
        return self.integer(value, path, 400, 599)

    def duration(self, value: Any, path: _Path, lo: float, hi: float, *, allow_zero: bool) -> float:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise self.error(path, _bare(exc, "period")) from None
        if not (lo <= seconds <= hi) or (seconds == 0 and not allow_zero):
            low = f"from {lo:g}s" if allow_zero else "more than 0s"
            raise self.error(path, f"must be {low} up to {hi:g}s, got {value!r}")
        return seconds

    def header_list(self, value: Any, path: _Path) -> list[str]:
        if not isinstance(value, list):
            raise self.error(path, f"must be a list of header names, got {_type_name(value)}")
        out: list[str] = []
        for i, item in enumerate(value):
            name = self.string(item, (*path, i))
            if _HTTP_TOKEN.fullmatch(name) is None:
                raise self.error((*path, i), f"{name!r} is not an HTTP header name")
            out.append(name)
        return out

    def external(self, value: Any, path: _Path, key: KeyExtractor) -> ExternalConfig:
        m = self.mapping(value, path, _EXTERNAL_KEYS, required=("url",))
        url = self.string(m["url"], (*path, "url"))
        try:
            check_service_url(url)
        except ValueError as exc:
            raise self.error((*path, "url"), _bare(exc, "url")) from None
        timeout = (
            self.duration(m["timeout"], (*path, "timeout"), 0.0, 60.0, allow_zero=False)
            if "timeout" in m
            else DEFAULT_TIMEOUT_S
        )
        cache_ttl = (
            self.duration(m["cache_ttl"], (*path, "cache_ttl"), 0.0, 86_400.0, allow_zero=True)
            if "cache_ttl" in m
            else DEFAULT_CACHE_TTL_S
        )
        conc = (
            self.integer(m["max_concurrent_requests"], (*path, "max_concurrent_requests"), 1, 10_000)
            if "max_concurrent_requests" in m
            else DEFAULT_MAX_CONCURRENT
        )
        secret = (key.api_key_header,) if key.strategy is KeyStrategy.API_KEY and key.api_key_header else ()
        allow: list[str] | None = None
        deny: list[str] = []
        if "header_filter" in m:
            hp = (*path, "header_filter")
            hf = self.mapping(m["header_filter"], hp, _HEADER_FILTER_KEYS)
            if "allow_list" in hf and "deny_list" in hf:
                raise self.error(
                    (*hp, "deny_list"),
                    "give allow_list (only these headers are sent) or deny_list (these are not), not both",
                )
            if "allow_list" in hf:
                allow = self.header_list(hf["allow_list"], (*hp, "allow_list"))
                for i, name in enumerate(allow):
                    if is_sensitive_header(name) or name.lower() in {h.lower() for h in secret}:
                        raise self.error(
                            (*hp, "allow_list", i),
                            f"{name!r} carries credentials and is never sent to the limits service",
                        )
            if "deny_list" in hf:
                deny = self.header_list(hf["deny_list"], (*hp, "deny_list"))
        try:
            return ExternalConfig(
                url=url,
                timeout_s=timeout,
                cache_ttl_s=cache_ttl,
                max_concurrent_requests=conc,
                allow_list=tuple(allow) if allow is not None else None,
                deny_list=tuple(deny),
                secret_headers=secret,
            )
        except ValueError as exc:  # checked above; kept as a safety net
            raise self.value_error(path, exc, _EXTERNAL_KEYS) from None

    def methods(self, value: Any, path: _Path) -> frozenset[str] | None:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise self.error(path, f'must be a list of HTTP methods (or "*"), got {_type_name(value)}')
        if not items:
            raise self.error(path, 'must not be empty (omit it, or use "*", for any method)')
        out: set[str] = set()
        for i, item in enumerate(items):
            p = (*path, i) if isinstance(value, list) else path
            m = self.string(item, p)
            if m == "*":
                return None
            if _HTTP_TOKEN.fullmatch(m) is None:
                raise self.error(p, f"{m!r} is not an HTTP method")
            if m != m.upper():
                raise self.error(
                    p, f"HTTP methods are case-sensitive and written in upper case: use {m.upper()!r}, not {m!r}"
                )
            out.add(m)
        return frozenset(out)

    def entries(self, value: Any, path: _Path, strategy: KeyStrategy) -> list[str]:
        if not isinstance(value, list):
            raise self.error(path, f"must be a list of IP addresses, CIDR blocks or keys, got {_type_name(value)}")
        out: list[str] = []
        for i, item in enumerate(value):
            try:
                parsed = _parse_list_entry(item)
            except ValueError as exc:
                raise self.error((*path, i), _bare(exc, "entry")) from None
            if isinstance(parsed, str) and strategy is KeyStrategy.API_KEY and not _API_KEY_ID.fullmatch(parsed):
                parsed = api_key_id(parsed)  # keys on apiKey routes are ids; hash raw keys like overrides
            out.append(parsed if isinstance(parsed, str) else str(parsed))
        return out

    # -- the document --

    def document(self, data: Any) -> tuple[list[RouteRule], RouteRule | None]:
        top = self.mapping(data, (), _TOP_KEYS, required=("routes",))
        if "version" in top:
            v = top["version"]
            if isinstance(v, bool) or v != 1:
                raise self.error(("version",), f"must be 1, got {v!r}")
        default_key: KeyExtractor | None = None
        default_fp: FailurePolicy | None = None
        default_fc: int | None = None
        if "defaults" in top:
            d = self.mapping(top["defaults"], ("defaults",), _DEFAULTS_KEYS)
            if "key" in d:
                default_key = self.key(d["key"], ("defaults", "key"))
            if "failure_policy" in d:
                default_fp = self.failure_policy(d["failure_policy"], ("defaults", "failure_policy"))
            if "failure_code" in d:
                default_fc = self.failure_code(d["failure_code"], ("defaults", "failure_code"))
        routes_value = top["routes"]
        if routes_value is None:
            routes_value = []
        if not isinstance(routes_value, list):
            raise self.error(("routes",), f"must be a list of routes, got {_type_name(routes_value)}")
        routes: list[RouteRule] = []
        redefined_default: RouteRule | None = None
        seen: dict[str, int | None] = {}
        catch_all: RouteRule | None = None
        for i, rv in enumerate(routes_value):
            rule = self.route(rv, ("routes", i), default_key, default_fp, default_fc)
            if rule.name in seen:
                first = seen[rule.name]
                where = f" (first defined on line {first})" if first else ""
                raise self.error(("routes", i, "name"), f"duplicate route name {rule.name!r}{where}")
            seen[rule.name] = rule.line
            if rule.name == DEFAULT_ROUTE:
                redefined_default = rule
                continue
            if catch_all is not None:
                raise self.error(
                    ("routes", i),
                    f"route {rule.name!r} can never match: route {catch_all.name!r} (line {catch_all.line}) before it "
                    f"matches every request; move it down or name it {DEFAULT_ROUTE!r} to make it the fallback",
                )
            if rule.is_catch_all:
                catch_all = rule
            routes.append(rule)
        return routes, redefined_default

    def route(
        self,
        value: Any,
        path: _Path,
        default_key: KeyExtractor | None,
        default_fp: FailurePolicy | None,
        default_fc: int | None,
    ) -> RouteRule:
        if not isinstance(value, dict):
            raise self.error(path, f"each route must be a mapping (name, match, local, ...), got {_type_name(value)}")
        is_default = value.get("name") == DEFAULT_ROUTE
        required = ("name", "local") if is_default else ("name", "match", "local")
        r = self.mapping(value, path, _ROUTE_KEYS, required=required)
        name = self.string(r["name"], (*path, "name"))
        if _ROUTE_NAME.fullmatch(name) is None:
            raise self.error((*path, "name"), f"must be 1-64 characters of [A-Za-z0-9_.-], got {name!r}")
        if name in RESERVED_ROUTE_NAMES:
            raise self.error(
                (*path, "name"),
                f"{name!r} is reserved (it would share Redis keys with shadowlimit's own data); reserved: {', '.join(sorted(RESERVED_ROUTE_NAMES))}",
            )

        # match
        methods: frozenset[str] | None = None
        pattern = "/**"
        if "match" in r:
            mp = (*path, "match")
            m = self.mapping(r["match"], mp, _MATCH_KEYS, required=("path",))
            if "methods" in m:
                methods = self.methods(m["methods"], (*mp, "methods"))
            pattern = self.string(m["path"], (*mp, "path"))
            try:
                segments = compile_path_pattern(pattern)
            except ValueError as exc:
                raise self.error((*mp, "path"), str(exc)) from None
            if is_default and (segments != (_ANY,) or methods is not None):
                raise self.error(
                    mp,
                    f"the {DEFAULT_ROUTE!r} route is the fallback for every request no other route matches; its match must be path /** for any method (or be omitted)",
                )

        # key
        if "key" in r:
            key = self.key(r["key"], (*path, "key"))
        elif default_key is not None:
            key = default_key
        else:
            key = KeyExtractor(KeyStrategy.CLIENT_IP, trusted_proxies=self.proxies)

        # policies
        local = self.policy(r["local"], (*path, "local"))
        distributed = (
            self.policy(r["distributed"], (*path, "distributed"), inherit=local) if "distributed" in r else local
        )

        # overrides
        api_overrides: dict[str, Policy] = {}
        tenant_overrides: dict[str, Policy] = {}
        if "overrides" in r:
            op = (*path, "overrides")
            o = self.mapping(r["overrides"], op, _OVERRIDE_KEYS)
            if "api_keys" in o:
                ap = (*op, "api_keys")
                if key.strategy is not KeyStrategy.API_KEY:
                    raise self.error(
                        ap,
                        f"API key overrides only apply to routes whose key strategy is apiKey (this route uses {key.strategy.value})",
                    )
                entries = o["api_keys"] or {}
                if not isinstance(entries, dict):
                    raise self.error(
                        ap, f"must be a mapping of API key (or apikey:<id>) to policy, got {_type_name(entries)}"
                    )
                for raw, pv in entries.items():
                    kp = (*ap, raw)
                    if _API_KEY_ID.fullmatch(raw):
                        kid = raw
                    else:
                        try:
                            validate_key(raw, field="api key", max_length=_MAX_RAW_API_KEY_BYTES)
                            kid = api_key_id(raw)
                        except ValueError as exc:
                            raise self.error(kp, _bare(exc, "api key")) from None
                    if kid in api_overrides:
                        raise self.error(kp, f"API key {kid} is listed twice (once raw, once as its id)")
                    api_overrides[kid] = self.policy(pv, kp, inherit=local)
            if "tenants" in o:
                tp = (*op, "tenants")
                entries = o["tenants"] or {}
                if not isinstance(entries, dict):
                    raise self.error(tp, f"must be a mapping of tenant (or key) to policy, got {_type_name(entries)}")
                for tenant, pv in entries.items():
                    kp = (*tp, tenant)
                    try:
                        validate_key(tenant, field="tenant")
                    except ValueError as exc:
                        raise self.error(kp, _bare(exc, "tenant")) from None
                    tenant_overrides[tenant] = self.policy(pv, kp, inherit=local)

        # allow / deny
        allow = self.entries(r["allow"], (*path, "allow"), key.strategy) if "allow" in r else []
        deny = self.entries(r["deny"], (*path, "deny"), key.strategy) if "deny" in r else []
        both = set(allow) & set(deny)
        if both:
            raise self.error((*path, "deny"), f"{sorted(both)[0]!r} is in both allow and deny")
        composite = key.strategy is KeyStrategy.COMPOSITE

        fp = (
            self.failure_policy(r["failure_policy"], (*path, "failure_policy")) if "failure_policy" in r else default_fp
        )
        fc = self.failure_code(r["failure_code"], (*path, "failure_code")) if "failure_code" in r else default_fc

        mode: Mode | None = None
        if "mode" in r:
            mv = r["mode"]
            try:
                mode = Mode(mv) if isinstance(mv, str) else None
            except ValueError:
                mode = None
            if mode is None:
                raise self.error((*path, "mode"), f"must be one of {', '.join(m.value for m in Mode)}, got {mv!r}")
        external = self.external(r["external"], (*path, "external"), key) if "external" in r else None

        percent = 0
        if "canary_percent" in r:
            percent = self.integer(r["canary_percent"], (*path, "canary_percent"), 0, 100)
            if mode is not Mode.CANARY:
                raise self.error((*path, "canary_percent"), "only meaningful with mode: canary")

        try:
            return RouteRule(
                name=name,
                methods=methods,
                path_pattern=pattern,
                key=key,
                local=local,
                distributed=distributed,
                api_key_overrides=api_overrides,
                tenant_overrides=tenant_overrides,
                allow=ListMatcher(allow, composite=composite),
                deny=ListMatcher(deny, composite=composite),
                failure_policy=fp,
                failure_code=fc,
                initial_mode=mode,
                initial_canary_percent=percent,
                line=self.line(path),
                external=external,
            )
        except ValueError as exc:  # already checked above; kept as a safety net
            raise self.value_error(path, exc, _ROUTE_KEYS) from None


def _bare(exc: ValueError, prefix: str) -> str:
    """An error message without its ``"<prefix>: "`` (the field path already says it)."""
    msg = getattr(exc, "message", None) or str(exc)
    return msg[len(prefix) + 2 :] if msg.startswith(f"{prefix}: ") else msg


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


# ---------------------------------------------------------------------------------------
# entry points


def _parse(text: str, settings: Settings, source: str | None, digest: str) -> Rules:
    data, lines = _load_yaml(text, source)
    v = _Validator(lines, source, settings)
    routes, redefined = v.document(data)
    return Rules(
        routes=tuple(routes),
        default=redefined if redefined is not None else default_route(settings),
        source=source,
        loaded_at=time.time(),
        digest=digest,
    )


def parse_rules(text: str, settings: Settings, *, source: str | None = None) -> Rules:
    """Parse rules from YAML text; raises :class:`RulesError` (``source`` names the file)."""
    if not isinstance(text, str):
        raise RulesError(f"expected YAML text, got {type(text).__name__}", path=source)
    return _parse(text, settings, source, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest())


def _decode(data: bytes, source: str) -> str:
    if len(data) > MAX_FILE_BYTES:
        raise RulesError(f"the file is too large ({len(data)} bytes, max {MAX_FILE_BYTES})", path=source)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise RulesError(f"not valid UTF-8 (byte {exc.start})", path=source, line=line) from None


def _read(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise RulesError(f"cannot read the rules file: {exc.strerror or exc}", path=str(path)) from None


def load_rules(path: str | Path | None, settings: Settings) -> Rules:
    """Load the rules file (``None``: only the built-in default route)."""
    if path is None or str(path).strip() == "":
        return Rules(routes=(), default=default_route(settings), source=None, digest="builtin")
    p = Path(path)
    data = _read(p)
    return _parse(_decode(data, str(p)), settings, str(p), hashlib.sha256(data).hexdigest())


# ---------------------------------------------------------------------------------------
# hot reload


class RulesWatcher:
    """Reloads the rules file when it changes; a bad file never replaces good rules.

    The constructor loads the file (raising :class:`RulesError` if it is invalid) unless
    ``initial`` rules are given. :meth:`check` (called every ``interval_s`` by
    :meth:`run`) re-reads the file when its ``(mtime_ns, size)`` changed, or while the
    modification time is too recent to tell same-size rewrites apart, and reloads when
    the content digest differs from the current rules. A valid new file calls
    ``on_change(rules)``; an invalid one calls ``on_error(err)`` once per bad version
    and the last good rules stay in place (``last_error`` says why until the file is
    fixed). A file put back to the rules in force after an error (same digest, so
    nothing to reload) calls ``on_recover(rules)``: the error is over. A file caught
    mid-write (its stat changes while being read) is retried on the next check.
    """

    _RACY_S = 2.0  # mtimes newer than this (relative to the last read) are not trusted

    def __init__(
        self,
        path: str | Path | None,
        settings: Settings,
        on_change: Callable[[Rules], None] | None = None,
        on_error: Callable[[RulesError], None] | None = None,
        *,
        initial: Rules | None = None,
        on_recover: Callable[[Rules], None] | None = None,
    ) -> None:
        self.path = Path(path) if path is not None and str(path).strip() else None
        self.settings = settings
        self.on_change = on_change
        self.on_error = on_error
        self.on_recover = on_recover
        self.last_error: RulesError | None = None
        self.reload_count = 0
        self.error_count = 0
        self._lock = threading.RLock()
        self._sig: tuple[int, int] | None = None
        self._read_at = 0.0
        self._bad_digest: str | None = None
        self._bad_sig: object = None
        if initial is not None:
            self._rules = initial
        else:
            self._rules = load_rules(self.path, settings)
            if self.path is not None:
                self._remember_stat()

    @property
    def rules(self) -> Rules:
        """The last good rules."""
        return self._rules

    def _remember_stat(self) -> None:
        try:
            st = os.stat(self.path)  # type: ignore[arg-type]
        except OSError:
            return
        self._sig = (st.st_mtime_ns, st.st_size)
        self._read_at = time.time()

    def _report(self, err: RulesError) -> None:
        self.last_error = err
        self.error_count += 1
        log.warning("rules file rejected, keeping the last good rules: %s", err)
        if self.on_error is not None:
            self.on_error(err)

    def _recovered(self) -> None:
        """The file is back to the rules in force: clear the error and say so."""
        if self.last_error is None:
            return
        self.last_error = None
        self._bad_digest = None
        log.info("rules file %s is back to the rules in force (digest %s)", self.path, self._rules.digest[:12])
        if self.on_recover is not None:
            self.on_recover(self._rules)

    def _apply(self, rules: Rules) -> None:
        self._rules = rules
        self.last_error = None
        self._bad_digest = None
        self._bad_sig = None
        self.reload_count += 1
        log.info("rules reloaded from %s: %d routes, digest %s", rules.source, len(rules.routes), rules.digest[:12])
        if self.on_change is not None:
            self.on_change(rules)

    def check(self) -> bool:
        """Reload if the file changed; True when new rules were applied."""
        if self.path is None:
            return False
        with self._lock:
            try:
                st = os.stat(self.path)
            except OSError as exc:
                sig_err = ("stat", exc.errno)
                if self._bad_sig != sig_err:
                    self._bad_sig = sig_err
                    self._report(RulesError(f"cannot read the rules file: {exc.strerror or exc}", path=str(self.path)))
                return False
            sig = (st.st_mtime_ns, st.st_size)
            racy = st.st_mtime_ns / 1e9 >= self._read_at - self._RACY_S
            if sig == self._sig and not racy:
                return False
            read_at = time.time()
            try:
                data = _read(self.path)
                st2 = os.stat(self.path)
            except (RulesError, OSError) as exc:
                err = (
                    exc
                    if isinstance(exc, RulesError)
                    else RulesError(f"cannot read the rules file: {exc.strerror or exc}", path=str(self.path))
                )
                if self._bad_sig != ("read", str(err)):
                    self._bad_sig = ("read", str(err))
                    self._report(err)
                return False
            if (st2.st_mtime_ns, st2.st_size) != sig or len(data) != st2.st_size:
                return False  # being written right now: try again next time
            self._sig = sig
            self._read_at = read_at
            self._bad_sig = None  # readable (again)
            digest = hashlib.sha256(data).hexdigest()
            if digest == self._rules.digest:
                self._recovered()  # if it had been rejected: it went back to the good version
                return False
            if digest == self._bad_digest:
                return False  # already reported
            try:
                rules = _parse(_decode(data, str(self.path)), self.settings, str(self.path), digest)
            except RulesError as err:
                self._bad_digest = digest
                self._report(err)
                return False
            self._apply(rules)
            return True

    def reload(self, force: bool = True) -> Rules:
        """Re-read the file now (the admin call). Returns the rules now in force.

        ``force`` reloads (and notifies ``on_change``) even if the content is unchanged.
        An invalid file raises :class:`RulesError` (after calling ``on_error``) and the
        previous rules stay in force.
        """
        if self.path is None:
            raise RulesError("no rules file is configured (RATE_LIMIT_RULES_PATH)")
        with self._lock:
            try:
                st = os.stat(self.path)
            except OSError as exc:
                err = RulesError(f"cannot read the rules file: {exc.strerror or exc}", path=str(self.path))
                self._report(err)
                raise err from None
            try:
                data = _read(self.path)
            except RulesError as err:
                self._report(err)
                raise
            digest = hashlib.sha256(data).hexdigest()
            if not force and digest == self._rules.digest:
                self._recovered()
                return self._rules
            try:
                rules = _parse(_decode(data, str(self.path)), self.settings, str(self.path), digest)
            except RulesError as err:
                self._bad_digest = digest
                self._report(err)
                raise
            self._sig = (st.st_mtime_ns, st.st_size)
            self._read_at = time.time()
            self._bad_sig = None
            self._apply(rules)
            return rules

    async def run(self, interval_s: float) -> None:
        """Call :meth:`check` every ``interval_s`` seconds until cancelled."""
        if interval_s <= 0:
            raise ValueError(f"interval_s: must be > 0, got {interval_s!r}")
        while True:
            try:
                self.check()
            except Exception:  # a failing callback must not stop the watcher
                log.exception("rules watcher check failed")
            await asyncio.sleep(interval_s)
