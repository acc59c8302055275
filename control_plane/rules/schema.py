"""A route of the rules file and the blocks in it (``match``, ``overrides``, ``external`` and its
``header_filter``), as tables (:mod:`.spec`): each key with its reader, its default, the field it
goes into, its JSON Schema and its documentation. The ``key`` block and policies are in
:mod:`.fields`, the document around the routes in :mod:`.document`.

A route's keys are read in the order of :data:`ROUTE` (so the first problem is the one
reported, and a key can depend on an earlier one: ``distributed`` inherits from ``local``).
A new key is one :class:`~.spec.Key` row in its block: what it reads, what it is when absent,
the compiled object's field it goes ``into``; the loader, ``docs/rules.schema.json`` and the
tables of docs/configuration.md follow (``python -m control_plane.rules.json_schema --write``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from limiter.keys import KeyExtractor, KeyStrategy, api_key_id, validate_key
from limiter.policy import Policy
from limiter.resilience import FailurePolicy

from ..external import (
    DEFAULT_CACHE_TTL_S,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_TIMEOUT_S,
    ExternalConfig,
    is_sensitive_header,
)
from ..model.plan import Plan
from ..model.rollout import GATE_WEIGHTS, Mode
from .budget import BUDGET, COST_UNIT_PATTERN, NO_COSTS, read_cost_unit, read_gate_weight
from .errors import API_KEY_ID, FieldPath
from .fields import FieldReader, bare, type_name
from .lists import ListMatcher
from .model import DEFAULT_ROUTE, HTTP_TOKEN, RESERVED_ROUTE_NAMES, ROUTE_NAME, RouteRule
from .paths import ANY, MAX_PATTERN_LENGTH, compile_path_pattern
from .plan import ROLLOUT
from .spec import MISSING, Block, Got, Key, anchored, duration_schema, header_name, ref, whole

if TYPE_CHECKING:
    from .document import RouteDefaults

__all__ = [
    "CACHE_TTL_MAX_S",
    "CANARY_PERCENT",
    "EXTERNAL",
    "EXTERNAL_TIMEOUT_MAX_S",
    "MAX_CONCURRENT",
    "MIN_DWELL_MAX_S",
    "ROUTE",
    "failure_code",
    "failure_policy",
]

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


# -- readers of a route's keys (each: reader, value, path, what the block has read so far) -----


def _route_name(r: FieldReader, value: Any, path: FieldPath, got: Got) -> str:
    """1-64 characters of ``[A-Za-z0-9_.-]``, not a reserved name."""
    name = r.string(value, path)
    if ROUTE_NAME.fullmatch(name) is None:
        raise r.error(path, f"must be 1-64 characters of [A-Za-z0-9_.-], got {name!r}")
    if name in RESERVED_ROUTE_NAMES:
        raise r.error(
            path,
            f"{name!r} is reserved (it would share Redis keys with shadowlimit's own data); "
            f"reserved: {', '.join(sorted(RESERVED_ROUTE_NAMES))}",
        )
    return name


def _path_pattern(r: FieldReader, value: Any, path: FieldPath, got: Got) -> str:
    pattern = r.string(value, path)
    try:
        compile_path_pattern(pattern)
    except ValueError as exc:
        raise r.error(path, str(exc)) from None
    return pattern


def _build_match(r: FieldReader, got: Got, path: FieldPath) -> tuple[frozenset[str] | None, str]:
    """``(methods, path pattern)``; the ``default`` route's must be ``/**`` for any method."""
    methods = got["methods"]
    if got.outer("name") == DEFAULT_ROUTE and (compile_path_pattern(got["path"]) != (ANY,) or methods is not None):
        raise r.error(
            path,
            f"the {DEFAULT_ROUTE!r} route is the fallback for every request no other route matches; "
            "its match must be path /** for any method (or be omitted)",
        )
    return methods, got["path"]


def _route_key(r: FieldReader, got: Got) -> KeyExtractor:
    """A route without a ``key``: the file's ``defaults.key``, else the client's address."""
    defaults: RouteDefaults = got.outer("defaults")
    if defaults.key is not None:
        return defaults.key
    return KeyExtractor(KeyStrategy.CLIENT_IP, trusted_proxies=r.proxies)


def _api_key_overrides(r: FieldReader, value: Any, path: FieldPath, got: Got) -> dict[str, Policy]:
    """``overrides.api_keys``: raw API keys are hashed to their ids (and never echoed)."""
    key: KeyExtractor = got.outer("key")
    local: Policy = got.outer("local")
    if key.strategy is not KeyStrategy.API_KEY:
        raise r.error(
            path,
            "API key overrides only apply to routes whose key strategy is apiKey "
            f"(this route uses {key.strategy.value})",
        )
    entries = value or {}
    if not isinstance(entries, dict):
        raise r.error(path, f"must be a mapping of API key (or apikey:<id>) to policy, got {type_name(entries)}")
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
                raise r.error(kp, bare(exc, "api key")) from None
        if kid in overrides:
            raise r.error(kp, f"API key {kid} is listed twice (once raw, once as its id)")
        overrides[kid] = r.policy(pv, kp, inherit=local)
    return overrides


def _tenant_overrides(r: FieldReader, value: Any, path: FieldPath, got: Got) -> dict[str, Policy]:
    """``overrides.tenants``: tenant (or exact key) to policy."""
    local: Policy = got.outer("local")
    entries = value or {}
    if not isinstance(entries, dict):
        raise r.error(path, f"must be a mapping of tenant (or key) to policy, got {type_name(entries)}")
    overrides: dict[str, Policy] = {}
    for tenant, pv in entries.items():
        kp = (*path, tenant)
        try:
            validate_key(tenant, field="tenant")
        except ValueError as exc:
            raise r.error(kp, bare(exc, "tenant")) from None
        overrides[tenant] = r.policy(pv, kp, inherit=local)
    return overrides


def _entries(r: FieldReader, value: Any, path: FieldPath, got: Got) -> list[str]:
    return r.entries(value, path, got["key"].strategy)


def _deny(r: FieldReader, value: Any, path: FieldPath, got: Got) -> list[str]:
    deny = _entries(r, value, path, got)
    both = set(got["allow"]) & set(deny)
    if both:
        raise r.error(path, f"{sorted(both)[0]!r} is in both allow and deny")
    return deny


def _mode(r: FieldReader, value: Any, path: FieldPath, got: Got) -> Mode:
    try:
        mode = Mode(value) if isinstance(value, str) else None
    except ValueError:
        mode = None
    if mode is None:
        raise r.error(path, f"must be one of {', '.join(m.value for m in Mode)}, got {value!r}")
    return mode


def _canary_percent(r: FieldReader, value: Any, path: FieldPath, got: Got) -> int:
    percent = r.integer(value, path, *CANARY_PERCENT)
    if got["mode"] is not Mode.CANARY:
        raise r.error(path, "only meaningful with mode: canary")
    return percent


def _build_route(r: FieldReader, got: Got, path: FieldPath) -> RouteRule:
    plan = got.get("rollout", None)
    if isinstance(plan, Plan) and plan.analysis.gate_weight == "cost" and got.get("budget", MISSING) in (MISSING, None):
        raise r.error((*path, "rollout", "analysis", "gate_weight"), NO_COSTS)
    methods, pattern = got["match"]
    api_overrides, tenant_overrides = got["overrides"]
    composite = got["key"].strategy is KeyStrategy.COMPOSITE
    try:
        return RouteRule(
            **ROUTE.fields(got),
            methods=methods,
            path_pattern=pattern,
            api_key_overrides=api_overrides,
            tenant_overrides=tenant_overrides,
            allow=ListMatcher(got["allow"], composite=composite),
            deny=ListMatcher(got["deny"], composite=composite),
            line=r.line(path),
        )
    except ValueError as exc:  # already checked by the readers; kept as a safety net
        raise r.value_error(path, exc, ROUTE.names) from None


# -- the external block ---------------------------------------------------------------------


def _secret_headers(key: KeyExtractor) -> tuple[str, ...]:
    """The route's own credential header (an apiKey route's), never sent to the limits service."""
    return (key.api_key_header,) if key.strategy is KeyStrategy.API_KEY and key.api_key_header else ()


def _one_filter(r: FieldReader, raw: Mapping[str, Any], path: FieldPath) -> None:
    if "allow_list" in raw and "deny_list" in raw:
        raise r.error(
            (*path, "deny_list"), "give allow_list (only these headers are sent) or deny_list (these are not), not both"
        )


def _allow_list(r: FieldReader, value: Any, path: FieldPath, got: Got) -> tuple[str, ...]:
    """Only these headers are sent; credentials never are."""
    allow = r.header_list(value, path)
    secret = {h.lower() for h in _secret_headers(got.outer("key"))}
    for i, name in enumerate(allow):
        if is_sensitive_header(name) or name.lower() in secret:
            raise r.error((*path, i), f"{name!r} carries credentials and is never sent to the limits service")
    return tuple(allow)


def _build_external(r: FieldReader, got: Got, path: FieldPath) -> ExternalConfig:
    filters = got["header_filter"]
    try:
        return ExternalConfig(**EXTERNAL.fields(got), **filters, secret_headers=_secret_headers(got.outer("key")))
    except ValueError as exc:  # checked by the readers; kept as a safety net
        raise r.value_error(path, exc, EXTERNAL.names) from None


def _duration(hi: float, *, allow_zero: bool) -> Any:
    def read(r: FieldReader, value: Any, path: FieldPath, got: Got) -> float:
        return r.duration(value, path, 0.0, hi, allow_zero=allow_zero)

    return read


HEADER_FILTER = Block(
    name="header_filter",
    keys=(
        Key(
            name="allow_list",
            read=_allow_list,
            into="allow_list",
            schema={"type": "array", "items": header_name()},
            doc="Only these request headers are sent (case-insensitive).",
        ),
        Key(
            name="deny_list",
            read=lambda r, v, p, got: tuple(r.header_list(v, p)),
            into="deny_list",
            schema={"type": "array", "items": header_name()},
            doc="These headers are not sent (besides the credentials, below). Give `allow_list` or `deny_list`, "
            "not both.",
        ),
    ),
    before=_one_filter,
    schema_extra={"not": {"required": ["allow_list", "deny_list"]}},
)

EXTERNAL = Block(
    name="external",
    definition=True,
    keys=(
        Key(
            name="url",
            read=lambda r, v, p, got: r.service_url(v, p),
            into="url",
            required=True,
            schema={"type": "string", "pattern": r"^[hH][tT][tT][pP][sS]?://\S+$"},
            doc="`http://` or `https://` URL of the service, POSTed to. No credentials in it (`user:pass@` is "
            "refused).",
        ),
        Key(
            name="timeout",
            read=_duration(EXTERNAL_TIMEOUT_MAX_S, allow_zero=False),
            absent=lambda r, got: DEFAULT_TIMEOUT_S,
            into="timeout_s",
            schema=duration_schema(EXTERNAL_TIMEOUT_MAX_S, allow_zero=False),
            default_doc="`5s`",
            doc="The longest a decision waits for its limits (cache read, a free call slot and the call together), "
            "more than 0 and at most `60s`. Past it the decision goes ahead with the fallback.",
        ),
        Key(
            name="cache_ttl",
            read=_duration(CACHE_TTL_MAX_S, allow_zero=True),
            absent=lambda r, got: DEFAULT_CACHE_TTL_S,
            into="cache_ttl_s",
            schema=duration_schema(CACHE_TTL_MAX_S, allow_zero=True),
            default_doc="`60s`",
            doc="TTL of the Redis cache for answers that carry no cache hints (0-1 day; `0`: such answers are not "
            "cached).",
        ),
        Key(
            name="max_concurrent_requests",
            read=lambda r, v, p, got: r.integer(v, p, *MAX_CONCURRENT),
            absent=lambda r, got: DEFAULT_MAX_CONCURRENT,
            into="max_concurrent_requests",
            schema=whole(*MAX_CONCURRENT),
            default_doc="`50`",
            doc="Calls to the service in flight at once for this route (1-10,000); more wait for a slot, within "
            "`timeout`.",
        ),
        Key(
            name="header_filter",
            block=HEADER_FILTER,
            absent=lambda r, got: {},
            doc="Which request headers are sent.",
        ),
    ),
    build=_build_external,
    hints={
        "enabled": "a route asks its limits service whenever it has an external block; remove the block to turn "
        "that off",
        "http": "give the service's address as external.url (only HTTP limits services are supported)",
        "grpc": "only HTTP limits services are supported: give external.url",
    },
)
"""A route's ``external`` block (see :mod:`control_plane.external`)."""

_METHOD = {"type": "string", "pattern": anchored(r"\*|" + HTTP_TOKEN.pattern.replace("A-Za-z", "A-Z"))}
if "A-Za-z" not in HTTP_TOKEN.pattern:  # the upper-case method pattern above is derived from it
    raise AssertionError(f"HTTP_TOKEN changed ({HTTP_TOKEN.pattern}): derive the upper-case method pattern anew")

MATCH = Block(
    name="match",
    keys=(
        Key(
            name="methods",
            read=lambda r, v, p, got: r.methods(v, p),
            absent=lambda r, got: None,
            schema={"anyOf": [_METHOD, {"type": "array", "items": _METHOD, "minItems": 1}]},
            default_doc="any",
            doc='List of upper-case HTTP methods (or one string); `"*"` = any.',
        ),
        Key(
            name="path",
            read=_path_pattern,
            required=True,
            schema={"type": "string", "pattern": r"^/[^\s?#]*$", "maxLength": MAX_PATTERN_LENGTH},
            doc="A path pattern: literal segments (case-sensitive), `*` or `{name}` = exactly one segment, `**` = any "
            "number of segments including none. Wildcards are whole segments; a trailing `/` is ignored; no `?`/`#`. "
            "A route matching everything (`/**`, any method) must be the last user route.",
        ),
    ),
    build=_build_match,
)

_OVERRIDES_SCHEMA = {"type": ["object", "null"], "additionalProperties": ref("policy")}
OVERRIDES = Block(
    name="overrides",
    keys=(
        Key(
            name="api_keys",
            read=_api_key_overrides,
            absent=lambda r, got: {},
            schema=_OVERRIDES_SCHEMA,
            doc='`{API key or "apikey:<32 hex>": policy}`. Only on `apiKey` routes. Raw keys are hashed at load time '
            "and never kept or echoed in errors.",
        ),
        Key(
            name="tenants",
            read=_tenant_overrides,
            absent=lambda r, got: {},
            schema=_OVERRIDES_SCHEMA,
            doc="`{tenant or exact key: policy}`. On `composite` routes a tenant also covers every "
            "`<tenant>:<segment>` key.",
        ),
    ),
    build=lambda r, got, path: (got["api_keys"], got["tenants"]),
)


def failure_policy(r: FieldReader, value: Any, path: FieldPath, got: Got) -> FailurePolicy:
    """A route's (or the defaults') ``failure_policy``."""
    return r.failure_policy(value, path)


def failure_code(r: FieldReader, value: Any, path: FieldPath, got: Got) -> int:
    """A route's (or the defaults') ``failure_code``."""
    return r.failure_code(value, path)


def _from_defaults(name: str) -> Any:
    """A route without ``name``: the file's ``defaults`` value (None: the settings')."""
    return lambda r, got: getattr(got.outer("defaults"), name)


_LISTS = {"type": "array", "items": {"type": "string", "pattern": r"^\S(?:.*\S)?$"}}

ROUTE = Block(
    name="route",
    definition=True,
    keys=(
        Key(
            name="name",
            read=_route_name,
            into="name",
            required=True,
            schema={
                "type": "string",
                "pattern": anchored(ROUTE_NAME.pattern),
                "not": {"enum": sorted(RESERVED_ROUTE_NAMES)},
            },
            doc="Unique, `[A-Za-z0-9_.-]{1,64}`. Used in the API, metrics and Redis keys. `default` replaces the "
            "built-in fallback route (its `match` may be omitted and, if given, must be `/**` for any method).",
        ),
        Key(
            name="match",
            block=MATCH,
            required=lambda raw: raw.get("name") != DEFAULT_ROUTE,
            absent=lambda r, got: (None, "/**"),
            doc="Which requests the route takes.",
        ),
        Key(
            name="key",
            read=lambda r, v, p, got: r.key(v, p),
            absent=_route_key,
            into="key",
            schema=ref("key"),
            default_doc="`defaults.key`, else `{strategy: clientIP}`",
            doc="How a request maps to its bucket ([keys](#keys-key)).",
        ),
        Key(
            name="local",
            read=lambda r, v, p, got: r.policy(v, p),
            into="local",
            required=True,
            schema=ref("policy"),
            doc="Policy enforced by each replica on its own.",
        ),
        Key(
            name="distributed",
            read=lambda r, v, p, got: r.policy(v, p, inherit=got["local"]),
            absent=lambda r, got: got["local"],
            into="distributed",
            schema=ref("policy"),
            default_doc="= `local`",
            doc="The global policy. Inherits `algorithm` and `period` from `local` when it omits them.",
        ),
        Key(name="overrides", block=OVERRIDES, absent=lambda r, got: ({}, {}), doc="Per-key policies."),
        Key(
            name="allow",
            read=_entries,
            absent=lambda r, got: [],
            schema=_LISTS,
            doc="Entries never limited (200, no limiter consulted). An IP or CIDR entry matches the client IP; "
            "anything else matches the key exactly (a tenant on `composite` routes; raw API keys are hashed on "
            "`apiKey` routes).",
        ),
        Key(
            name="deny",
            read=_deny,
            absent=lambda r, got: [],
            schema=_LISTS,
            doc="Entries always rejected with **403**. Same entry syntax; an entry may not be in both lists.",
        ),
        Key(
            name="failure_policy",
            read=failure_policy,
            absent=_from_defaults("failure_policy"),
            into="failure_policy",
            schema=ref("failure_policy"),
            default_doc="`defaults.failure_policy`, else `RATE_LIMIT_FAILURE_POLICY`",
            doc="`passThrough`, `failClosed`, `inMemoryFallback`.",
        ),
        Key(
            name="failure_code",
            read=failure_code,
            absent=_from_defaults("failure_code"),
            into="failure_code",
            schema=ref("failure_code"),
            default_doc="`defaults.failure_code`, else `RATE_LIMIT_FAILURE_CODE`",
            doc="400-599; used by `failClosed` rejections.",
        ),
        Key(
            name="mode",
            read=_mode,
            absent=lambda r, got: None,
            into="initial_mode",
            schema={"enum": [m.value for m in Mode]},
            default_doc="`SHADOWLIMIT_DEFAULT_MODE`",
            doc="`off`, `shadow`, `canary`, `enforce`: the mode used **until an operator changes it**; a mode stored "
            "in Redis always wins.",
        ),
        Key(
            name="canary_percent",
            read=_canary_percent,
            into="initial_canary_percent",
            schema=whole(*CANARY_PERCENT),
            default_doc="`0`",
            doc="0-100, only with `mode: canary`.",
        ),
        Key(
            name="min_dwell",
            read=_duration(MIN_DWELL_MAX_S, allow_zero=True),
            into="min_dwell_s",
            schema=duration_schema(MIN_DWELL_MAX_S, allow_zero=True),
            default_doc="`SHADOWLIMIT_GATE_MIN_DWELL_S`",
            doc="A duration (`10m`, `90s`, `0`; at most 7 days): how long this route must stay in a rollout step "
            "before the gate lets it be promoted to the next ([runbook](rollout-runbook.md#2-gates)).",
        ),
        Key(
            name="rollout",
            block=ROLLOUT,
            into="rollout",
            own_table=True,
            schema=ref("rollout"),
            doc="A plan the route walks on its own: steps toward enforce, each left when its analysis passes "
            "([below](#rollout-plans-rollout); [runbook](rollout-runbook.md#letting-a-plan-drive)).",
        ),
        Key(
            name="explain",
            read=lambda r, v, p, got: r.boolean(v, p),
            into="explain",
            schema={"type": "boolean"},
            default_doc="`true`",
            doc="Say why the route's local and global limits disagree (`replicas`, `tighter`, `fresh_local`, "
            "`clock`; `uneven`, `looser`). Under a global limit stricter than the local one (in rate or burst), its "
            "local policy is also evaluated fleet-wide in Redis, as a reference beside the global one, which halves "
            "the shadow pipeline's comparisons per second and doubles Redis' CPU per comparison "
            "([measured](benchmarks.md#explaining-divergence-the-references-cost)); under any other, a new rejection "
            "is `replicas` whatever the reference would say, and none is evaluated. `false` leaves its divergence "
            "unexplained ([runbook](rollout-runbook.md#why-they-disagree)).",
        ),
        Key(
            name="external",
            block=EXTERNAL,
            into="external",
            own_table=True,
            doc="Take each key's limits from a limits service over HTTP; the route's policies become the fallback "
            "([below](#external-limits-external)).",
        ),
        Key(
            name="budget",
            block=BUDGET,
            into="budget",
            own_table=True,
            doc="How the route's reservations live: an estimate reserved by a decision, settled with the actual "
            "cost ([below](#budgets-budget); [API](api.md#reserve-and-settle)).",
        ),
        Key(
            name="cost_unit",
            read=read_cost_unit,
            into="cost_unit",
            schema={"type": "string", "pattern": COST_UNIT_PATTERN},
            doc="What the route's budget counts (`tokens`, `credits`, `seconds`: a lower-case word of at most 32 "
            "characters), shown with its figures; only on a route with a `budget` block (a route without one "
            "counts requests). Not `unit`, which is a time unit in envoyproxy/ratelimit's files.",
        ),
        Key(
            name="gate_weight",
            read=read_gate_weight,
            into="gate_weight",
            absent=lambda r, got: "requests",
            schema={"enum": list(GATE_WEIGHTS)},
            default_doc="`requests`",
            doc="What the promotion gate's `SHADOWLIMIT_GATE_MAX_NEW_REJECTION_RATE` weighs: `requests`, or `cost`, "
            "the share of what the compared requests cost that the new rejections would have cost (only on a "
            "route with a `budget` block; [runbook](rollout-runbook.md#budgets-counted-in-cost)).",
        ),
    ),
    build=_build_route,
    schema_extra={
        "dependencies": {"canary_percent": {"required": ["mode"], "properties": {"mode": {"const": "canary"}}}},
        "if": {"properties": {"name": {"const": DEFAULT_ROUTE}}},
        "else": {"required": ["match"]},
    },
)
"""A route of the rules file."""
