"""The rules file's schema: the document, its ``defaults`` and each route, read field by field.

:func:`read_document` turns the data and lines of
:func:`~control_plane.rules.yaml_source.load_yaml` into compiled
:class:`~control_plane.rules.model.RouteRule` objects, or raises the
:class:`~control_plane.rules.errors.RulesError` of the first problem (file, line, field).
A route is read one field at a time, always in this order (so the first problem is the one
reported): name, match, key, local and distributed policies, overrides, allow/deny lists,
failure policy and code, mode, external block, canary percent, min dwell.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from limiter.keys import KeyExtractor, KeyStrategy, api_key_id, validate_key
from limiter.policy import Policy
from limiter.resilience import FailurePolicy

from ..external import (
    DEFAULT_CACHE_TTL_S,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_TIMEOUT_S,
    ExternalConfig,
    check_service_url,
    is_sensitive_header,
)
from ..model.rollout import Mode
from .errors import API_KEY_ID, FieldPath
from .fields import FieldReader, bare, type_name
from .lists import ListMatcher
from .model import DEFAULT_ROUTE, RESERVED_ROUTE_NAMES, ROUTE_NAME, RouteRule
from .paths import ANY, compile_path_pattern

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = [
    "CACHE_TTL_MAX_S",
    "CANARY_PERCENT",
    "DEFAULTS_KEYS",
    "EXTERNAL_KEYS",
    "EXTERNAL_TIMEOUT_MAX_S",
    "HEADER_FILTER_KEYS",
    "MATCH_KEYS",
    "MAX_CONCURRENT",
    "MIN_DWELL_MAX_S",
    "OVERRIDE_KEYS",
    "ROUTE_KEYS",
    "RouteDefaults",
    "TOP_KEYS",
    "Validator",
    "read_document",
]

TOP_KEYS = ("version", "defaults", "routes")
DEFAULTS_KEYS = ("key", "failure_policy", "failure_code")
ROUTE_KEYS = (
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
    "min_dwell",
    "external",
)
"""The keys of a route."""
MATCH_KEYS = ("methods", "path")
OVERRIDE_KEYS = ("api_keys", "tenants")
EXTERNAL_KEYS = ("url", "timeout", "cache_ttl", "max_concurrent_requests", "header_filter")
HEADER_FILTER_KEYS = ("allow_list", "deny_list")
_MAX_RAW_API_KEY_BYTES = 8192
CANARY_PERCENT = (0, 100)
"""The range of a route's ``canary_percent`` (inclusive)."""
MIN_DWELL_MAX_S = 7 * 86400
"""The longest ``min_dwell`` a route may set (a week)."""
MAX_CONCURRENT = (1, 10_000)
"""The range of ``external.max_concurrent_requests`` (inclusive)."""
EXTERNAL_TIMEOUT_MAX_S = 60.0
"""The longest ``external.timeout`` (seconds; more than 0)."""
CACHE_TTL_MAX_S = 86_400.0
"""The longest ``external.cache_ttl`` (seconds; 0 allowed)."""


@dataclass(frozen=True)
class RouteDefaults:
    """What the file's ``defaults`` block gives the routes that do not set these fields."""

    key: KeyExtractor | None = None
    failure_policy: FailurePolicy | None = None
    failure_code: int | None = None


def read_document(
    data: Any, lines: Mapping[FieldPath, int], source: str | None, settings: Settings
) -> tuple[list[RouteRule], RouteRule | None]:
    """The user routes in file order and the redefined ``default`` route (None if the file has none)."""
    return Validator(lines, source, settings).document(data)


class Validator(FieldReader):
    """Reads a whole rules document (see :func:`read_document`)."""

    # -- the document --

    def document(self, data: Any) -> tuple[list[RouteRule], RouteRule | None]:
        """The user routes in file order and the redefined ``default`` route, if any."""
        top = self.mapping(data, (), TOP_KEYS, required=("routes",))
        if "version" in top:
            v = top["version"]
            if isinstance(v, bool) or v != 1:
                raise self.error(("version",), f"must be 1, got {v!r}")
        defaults = self.defaults(top["defaults"], ("defaults",)) if "defaults" in top else RouteDefaults()
        routes_value = top["routes"]
        if routes_value is None:
            routes_value = []
        if not isinstance(routes_value, list):
            raise self.error(("routes",), f"must be a list of routes, got {type_name(routes_value)}")
        routes: list[RouteRule] = []
        redefined_default: RouteRule | None = None
        seen: dict[str, int | None] = {}
        catch_all: RouteRule | None = None
        for i, rv in enumerate(routes_value):
            rule = self.route(rv, ("routes", i), defaults)
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

    def defaults(self, value: Any, path: FieldPath) -> RouteDefaults:
        """The ``defaults`` block."""
        d = self.mapping(value, path, DEFAULTS_KEYS)
        return RouteDefaults(
            key=self.key(d["key"], (*path, "key")) if "key" in d else None,
            failure_policy=(
                self.failure_policy(d["failure_policy"], (*path, "failure_policy")) if "failure_policy" in d else None
            ),
            failure_code=self.failure_code(d["failure_code"], (*path, "failure_code")) if "failure_code" in d else None,
        )

    # -- a route --

    def route(self, value: Any, path: FieldPath, defaults: RouteDefaults) -> RouteRule:
        """One route, its fields read one step each in the order the module docstring gives."""
        if not isinstance(value, dict):
            raise self.error(path, f"each route must be a mapping (name, match, local, ...), got {type_name(value)}")
        is_default = value.get("name") == DEFAULT_ROUTE
        required = ("name", "local") if is_default else ("name", "match", "local")
        r = self.mapping(value, path, ROUTE_KEYS, required=required)
        name = self.route_name(r["name"], (*path, "name"))
        methods, pattern = self.match(r["match"], (*path, "match"), is_default) if "match" in r else (None, "/**")
        key = self.key(r["key"], (*path, "key")) if "key" in r else self._default_key(defaults)
        local = self.policy(r["local"], (*path, "local"))
        distributed = (
            self.policy(r["distributed"], (*path, "distributed"), inherit=local) if "distributed" in r else local
        )
        api_overrides, tenant_overrides = (
            self.overrides(r["overrides"], (*path, "overrides"), key, local) if "overrides" in r else ({}, {})
        )
        allow, deny = self._lists(r, path, key.strategy)
        composite = key.strategy is KeyStrategy.COMPOSITE
        fp = (
            self.failure_policy(r["failure_policy"], (*path, "failure_policy"))
            if "failure_policy" in r
            else defaults.failure_policy
        )
        fc = (
            self.failure_code(r["failure_code"], (*path, "failure_code"))
            if "failure_code" in r
            else defaults.failure_code
        )
        mode = self.mode(r["mode"], (*path, "mode")) if "mode" in r else None
        external = self.external(r["external"], (*path, "external"), key) if "external" in r else None
        percent = (
            self.canary_percent(r["canary_percent"], (*path, "canary_percent"), mode) if "canary_percent" in r else 0
        )
        dwell = (
            self.duration(r["min_dwell"], (*path, "min_dwell"), 0, MIN_DWELL_MAX_S, allow_zero=True)
            if "min_dwell" in r
            else None
        )
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
                min_dwell_s=dwell,
                line=self.line(path),
                external=external,
            )
        except ValueError as exc:  # already checked above; kept as a safety net
            raise self.value_error(path, exc, ROUTE_KEYS) from None

    def route_name(self, value: Any, path: FieldPath) -> str:
        """A route's ``name``: 1-64 characters of ``[A-Za-z0-9_.-]``, not a reserved name."""
        name = self.string(value, path)
        if ROUTE_NAME.fullmatch(name) is None:
            raise self.error(path, f"must be 1-64 characters of [A-Za-z0-9_.-], got {name!r}")
        if name in RESERVED_ROUTE_NAMES:
            raise self.error(
                path,
                f"{name!r} is reserved (it would share Redis keys with shadowlimit's own data); "
                f"reserved: {', '.join(sorted(RESERVED_ROUTE_NAMES))}",
            )
        return name

    def match(self, value: Any, path: FieldPath, is_default: bool) -> tuple[frozenset[str] | None, str]:
        """A route's ``match`` block: ``(methods, path pattern)``; the ``default`` route's must be ``/**``."""
        m = self.mapping(value, path, MATCH_KEYS, required=("path",))
        methods = self.methods(m["methods"], (*path, "methods")) if "methods" in m else None
        pattern = self.string(m["path"], (*path, "path"))
        try:
            segments = compile_path_pattern(pattern)
        except ValueError as exc:
            raise self.error((*path, "path"), str(exc)) from None
        if is_default and (segments != (ANY,) or methods is not None):
            raise self.error(
                path,
                f"the {DEFAULT_ROUTE!r} route is the fallback for every request no other route matches; "
                "its match must be path /** for any method (or be omitted)",
            )
        return methods, pattern

    def _default_key(self, defaults: RouteDefaults) -> KeyExtractor:
        if defaults.key is not None:
            return defaults.key
        return KeyExtractor(KeyStrategy.CLIENT_IP, trusted_proxies=self.proxies)

    def overrides(
        self, value: Any, path: FieldPath, key: KeyExtractor, local: Policy
    ) -> tuple[dict[str, Policy], dict[str, Policy]]:
        """A route's ``overrides``: ``(API key id -> policy, tenant -> policy)``, inheriting from ``local``."""
        o = self.mapping(value, path, OVERRIDE_KEYS)
        api_overrides = (
            self.api_key_overrides(o["api_keys"], (*path, "api_keys"), key, local) if "api_keys" in o else {}
        )
        tenant_overrides = self.tenant_overrides(o["tenants"], (*path, "tenants"), local) if "tenants" in o else {}
        return api_overrides, tenant_overrides

    def api_key_overrides(self, value: Any, path: FieldPath, key: KeyExtractor, local: Policy) -> dict[str, Policy]:
        """``overrides.api_keys``: raw API keys are hashed to their ids (and never echoed)."""
        if key.strategy is not KeyStrategy.API_KEY:
            raise self.error(
                path,
                "API key overrides only apply to routes whose key strategy is apiKey "
                f"(this route uses {key.strategy.value})",
            )
        entries = value or {}
        if not isinstance(entries, dict):
            raise self.error(path, f"must be a mapping of API key (or apikey:<id>) to policy, got {type_name(entries)}")
        overrides: dict[str, Policy] = {}
        for raw, pv in entries.items():
            kp = (*path, raw)
            if API_KEY_ID.fullmatch(raw):
                kid = raw
            else:
                try:
                    validate_key(raw, field="api key", max_length=_MAX_RAW_API_KEY_BYTES)
                    kid = api_key_id(raw)
                except ValueError as exc:
                    raise self.error(kp, bare(exc, "api key")) from None
            if kid in overrides:
                raise self.error(kp, f"API key {kid} is listed twice (once raw, once as its id)")
            overrides[kid] = self.policy(pv, kp, inherit=local)
        return overrides

    def tenant_overrides(self, value: Any, path: FieldPath, local: Policy) -> dict[str, Policy]:
        """``overrides.tenants``: tenant (or exact key) to policy."""
        entries = value or {}
        if not isinstance(entries, dict):
            raise self.error(path, f"must be a mapping of tenant (or key) to policy, got {type_name(entries)}")
        overrides: dict[str, Policy] = {}
        for tenant, pv in entries.items():
            kp = (*path, tenant)
            try:
                validate_key(tenant, field="tenant")
            except ValueError as exc:
                raise self.error(kp, bare(exc, "tenant")) from None
            overrides[tenant] = self.policy(pv, kp, inherit=local)
        return overrides

    def _lists(self, r: dict[str, Any], path: FieldPath, strategy: KeyStrategy) -> tuple[list[str], list[str]]:
        allow = self.entries(r["allow"], (*path, "allow"), strategy) if "allow" in r else []
        deny = self.entries(r["deny"], (*path, "deny"), strategy) if "deny" in r else []
        both = set(allow) & set(deny)
        if both:
            raise self.error((*path, "deny"), f"{sorted(both)[0]!r} is in both allow and deny")
        return allow, deny

    def mode(self, value: Any, path: FieldPath) -> Mode:
        """A route's initial ``mode``."""
        try:
            mode = Mode(value) if isinstance(value, str) else None
        except ValueError:
            mode = None
        if mode is None:
            raise self.error(path, f"must be one of {', '.join(m.value for m in Mode)}, got {value!r}")
        return mode

    def canary_percent(self, value: Any, path: FieldPath, mode: Mode | None) -> int:
        """A route's initial ``canary_percent`` (only with ``mode: canary``)."""
        percent = self.integer(value, path, *CANARY_PERCENT)
        if mode is not Mode.CANARY:
            raise self.error(path, "only meaningful with mode: canary")
        return percent

    # -- the external block --

    def external(self, value: Any, path: FieldPath, key: KeyExtractor) -> ExternalConfig:
        """A route's ``external`` block (see :mod:`control_plane.external`)."""
        m = self.mapping(value, path, EXTERNAL_KEYS, required=("url",))
        url = self.string(m["url"], (*path, "url"))
        try:
            check_service_url(url)
        except ValueError as exc:
            raise self.error((*path, "url"), bare(exc, "url")) from None
        timeout = (
            self.duration(m["timeout"], (*path, "timeout"), 0.0, EXTERNAL_TIMEOUT_MAX_S, allow_zero=False)
            if "timeout" in m
            else DEFAULT_TIMEOUT_S
        )
        cache_ttl = (
            self.duration(m["cache_ttl"], (*path, "cache_ttl"), 0.0, CACHE_TTL_MAX_S, allow_zero=True)
            if "cache_ttl" in m
            else DEFAULT_CACHE_TTL_S
        )
        conc = (
            self.integer(m["max_concurrent_requests"], (*path, "max_concurrent_requests"), *MAX_CONCURRENT)
            if "max_concurrent_requests" in m
            else DEFAULT_MAX_CONCURRENT
        )
        secret = (key.api_key_header,) if key.strategy is KeyStrategy.API_KEY and key.api_key_header else ()
        allow, deny = (
            self.header_filter(m["header_filter"], (*path, "header_filter"), secret)
            if "header_filter" in m
            else (None, [])
        )
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
            raise self.value_error(path, exc, EXTERNAL_KEYS) from None

    def header_filter(self, value: Any, path: FieldPath, secret: tuple[str, ...]) -> tuple[list[str] | None, list[str]]:
        """``external.header_filter``: ``(allow_list or None, deny_list)``; credentials are never allowed."""
        hf = self.mapping(value, path, HEADER_FILTER_KEYS)
        if "allow_list" in hf and "deny_list" in hf:
            raise self.error(
                (*path, "deny_list"),
                "give allow_list (only these headers are sent) or deny_list (these are not), not both",
            )
        allow: list[str] | None = None
        deny: list[str] = []
        if "allow_list" in hf:
            allow = self.header_list(hf["allow_list"], (*path, "allow_list"))
            for i, name in enumerate(allow):
                if is_sensitive_header(name) or name.lower() in {h.lower() for h in secret}:
                    raise self.error(
                        (*path, "allow_list", i),
                        f"{name!r} carries credentials and is never sent to the limits service",
                    )
        if "deny_list" in hf:
            deny = self.header_list(hf["deny_list"], (*path, "deny_list"))
        return allow, deny
