"""The compiled rules: :class:`RouteRule` (one route) and :class:`Rules` (a whole file), both immutable.

:meth:`Rules.match` finds the route of a request (user routes in file order, first match
wins, then the default route); :meth:`RouteRule.policies_for` gives a key's ``(local,
distributed)`` policies with overrides applied. :func:`default_route` is the built-in
fallback built from the settings.

>>> rules = Rules(routes=(), default=default_route(settings))  # doctest: +SKIP
>>> rules.match("GET", "/anything").name  # doctest: +SKIP
'default'
"""

from __future__ import annotations

import re
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from limiter.keys import KeyExtractor, KeyStrategy
from limiter.policy import Policy
from limiter.reservations import Terms
from limiter.resilience import FailurePolicy

from ..external import ExternalConfig
from ..model.plan import Plan
from ..model.rollout import Mode
from .lists import ListMatcher
from .paths import ANY, Segment, compile_path_pattern, match_segments, path_segments

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = [
    "DEFAULT_ROUTE",
    "HTTP_TOKEN",
    "NAMED_ROUTE_NAME",
    "RESERVED_ROUTE_NAMES",
    "ROUTE_NAME",
    "ROUTE_NAME_MAX",
    "FrozenOrigin",
    "RouteRule",
    "Rules",
    "default_route",
    "finish_steps",
]

DEFAULT_ROUTE = "default"
"""The name of the fallback route (built in, or redefined by the file)."""
ROUTE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
"""What a route name in the rules file may be."""
ROUTE_NAME_MAX = 256
"""The longest route name (a generated one; the rules file's are at most 64 characters)."""
NAMED_ROUTE_NAME = re.compile(r"(?=.{3,256}$)[A-Za-z0-9_.\-*~+@%=]+/[A-Za-z0-9_.\-*~+@%=/]+")
"""What the name of a route generated from another source may be (Envoy's descriptors:
``<domain>/<key>[=<value>]/...``, other characters percent-encoded). It always holds a
``/``, which a rules-file name never does, and never a ``:`` (bucket keys are
``rl:<ns>:<route>:<key>``)."""
HTTP_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP token (RFC 9110): what a method or a header name may be."""
# bucket keys are rl:<ns>:<route>:<key>; these names would collide with the control
# plane's own keys (rl:<ns>:div:..., rl:<ns>:hh:..., rl:<ns>:fleet, rl:<ns>:extcache:...)
RESERVED_ROUTE_NAMES = frozenset({"div", "hh", "hhid", "fleet", "extcache"})
"""Route names that would share Redis keys with the control plane's own data."""


_T = TypeVar("_T")
_NO_POLICIES: Mapping[str, Policy] = MappingProxyType({})
_NO_LIST = ListMatcher()


def _frozen_policies(value: Mapping[str, Policy] | None) -> Mapping[str, Policy]:
    if not value:
        return _NO_POLICIES  # one shared empty mapping: a file of 50,000 routes has 100,000 of them
    return MappingProxyType(dict(value))


class FrozenOrigin(Mapping[str, Any]):
    """An immutable ``origin`` a route keeps as it is (not copied into a dict): what
    another source computes from its own compact data (one Envoy descriptor's)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True, kw_only=True)
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
    allow: ListMatcher = _NO_LIST
    deny: ListMatcher = _NO_LIST
    failure_policy: FailurePolicy | None = None
    failure_code: int | None = None
    initial_mode: Mode | None = None
    initial_canary_percent: int = 0
    min_dwell_s: float | None = None  # the gate's minimum time in a step; None: SHADOWLIMIT_GATE_MIN_DWELL_S
    rollout: Plan | None = None  # the plan the route walks on its own (control_plane/model/plan.py)
    explain: bool = True  # divergence explained by cause (the local policy evaluated fleet-wide as a reference)
    line: int | None = None
    external: ExternalConfig | None = None
    http: bool = True
    origin: Mapping[str, Any] | None = None
    budget: Terms | None = None  # reservations: how they live (None: the route takes none)
    cost_unit: str | None = None  # what the budget counts (tokens): only with a budget
    gate_weight: str = "requests"  # the gate's new-rejection rate weighs requests, or (a budget) their cost
    _segments: tuple[Segment, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        s = object.__setattr__
        if (
            not isinstance(self.name, str)
            or (ROUTE_NAME if self.http else NAMED_ROUTE_NAME).fullmatch(self.name) is None
        ):
            if not self.http:
                raise ValueError(f"name: not a generated route name (<source>/<path>), got {self.name!r}")
            raise ValueError(f"name: must be 1-64 characters of [A-Za-z0-9_.-], got {self.name!r}")
        if self.origin is not None and not isinstance(self.origin, FrozenOrigin):
            s(self, "origin", MappingProxyType(dict(self.origin)))
        if self.methods is not None:
            methods = frozenset(self.methods)
            for m in methods:
                if not isinstance(m, str) or (m != "*" and HTTP_TOKEN.fullmatch(m) is None):
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

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its fields (read-only mappings as dicts), built again (and checked) when unpickled."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        for name in ("api_key_overrides", "tenant_overrides"):
            values[name] = dict(values[name])
        if values["origin"] is not None and not isinstance(values["origin"], FrozenOrigin):
            values["origin"] = dict(values["origin"])
        return (_route_from_fields, (values,))

    @property
    def is_catch_all(self) -> bool:
        """True when the route matches every request (``/**``, any method)."""
        return self.methods is None and self._segments == (ANY,)

    def matches(self, method: str, path: str) -> bool:
        """Whether a request (method as sent, e.g. ``"GET"``; decoded path) hits this route.

        ``/a/b/`` is treated like ``/a/b`` (and ``//`` like ``/``).
        """
        if self.methods is not None and method not in self.methods:
            return False
        return match_segments(self._segments, path_segments(path))

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
            "min_dwell_s": self.min_dwell_s,
            "rollout": self.rollout.to_dict() if self.rollout is not None else None,
            "explain": self.explain,
            "line": self.line,
            "external": self.external.to_dict() if self.external is not None else None,
            "http": self.http,
            "origin": dict(self.origin) if self.origin is not None else None,
            "budget": None if self.budget is None else budget_dict(self.budget),
            "cost_unit": self.cost_unit,
            "gate_weight": self.gate_weight,
        }


def budget_dict(terms: Terms) -> dict[str, Any]:
    """A route's ``budget`` as the API shows it (the rules file's words)."""
    return {
        "reservation_ttl_s": terms.ttl_us / 1_000_000,
        "on_expiry": "release" if terms.release else "charge",
        "admit": "positive" if terms.positive else "cover",
        "max_reservations": terms.max_held,
    }


def _route_from_fields(values: dict[str, Any]) -> RouteRule:
    return RouteRule(**values)


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


@dataclass(frozen=True, kw_only=True)
class Rules:
    """A loaded rules file: user routes in file order (first match wins) and the default.

    ``routes`` may also hold routes decided by name only (``http`` False, e.g. Envoy's):
    :meth:`match` never returns them."""

    routes: tuple[RouteRule, ...]
    default: RouteRule
    source: str | None = None
    loaded_at: float  # wall-clock seconds (the loader's clock)
    digest: str = "builtin"
    _by_name: Mapping[str, RouteRule] = field(init=False, repr=False, compare=False)
    _http: tuple[RouteRule, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "routes", tuple(self.routes))
        object.__setattr__(self, "_http", tuple(r for r in self.routes if r.http))
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
        segs = path_segments(path)
        for r in self._http:
            if (r.methods is None or method in r.methods) and match_segments(r._segments, segs):
                return r
        return self.default

    def with_routes(self, extra: tuple[RouteRule, ...], digest: str) -> Rules:
        """These rules with ``extra`` routes after the file's (``digest`` names the
        whole); a name used twice is a ``ValueError``."""
        return finish_steps(self.with_routes_steps(extra, digest))

    def with_routes_steps(
        self, extra: tuple[RouteRule, ...], digest: str, step: int = 1000
    ) -> Generator[None, None, Rules]:
        """:meth:`with_routes` in steps of ``step`` routes (it yields between them, so an
        event loop can answer calls while 50,000 routes are indexed)."""
        if not extra:
            return self
        by_name = dict(self._by_name)
        http = list(self._http)
        for i, r in enumerate(extra):
            if r.name == DEFAULT_ROUTE:
                raise ValueError("the default route goes in Rules.default, not Rules.routes")
            if r.name in by_name:
                raise ValueError(f"duplicate route name {r.name!r}")
            by_name[r.name] = r
            if r.http:
                http.append(r)
            if i % step == step - 1:
                yield
        rules = object.__new__(Rules)
        fields = {"routes": (*self.routes, *extra), "default": self.default, "source": self.source}
        fields |= {"loaded_at": self.loaded_at, "digest": digest, "_by_name": MappingProxyType(by_name)}
        fields["_http"] = tuple(http)
        for name, value in fields.items():
            object.__setattr__(rules, name, value)
        return rules

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


def finish_steps(steps: Generator[Any, None, _T]) -> _T:
    """Run a generator of steps (like :meth:`Rules.with_routes_steps`) to its end: its value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            value: _T = done.value
            return value
