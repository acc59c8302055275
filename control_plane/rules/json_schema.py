"""The rules file as a JSON Schema (draft-07), generated from what the loader reads.

Every object's keys come from the loader's own key lists (:data:`~.schema.ROUTE_KEYS`,
:data:`~.fields.POLICY_KEYS`, ...), the allowed values from the enums it parses with
(:class:`~limiter.policy.Algorithm`, :class:`~limiter.keys.KeyStrategy`, ...), the ranges
from its bounds and the limit and duration texts from their parsers' patterns
(:data:`~limiter.rates.LIMIT_PATTERN`, :data:`~control_plane.durations.DURATION_PATTERN`).
A key list without a schema entry (or the other way round) is an error here, so the two
cannot drift; ``tests/unit/test_rules_schema.py`` checks that ``docs/rules.schema.json`` is
this module's output.

The schema checks a file's shape (keys, types, values, ranges, required keys) for editors
and CI; it accepts every file the loader accepts. The loader checks more: path patterns,
duplicate route names, list entries, policies the limiter cannot represent, ... Run
``shadowlimit rules check FILE`` for the full check.

Regenerate with ``python -m control_plane.rules.json_schema > docs/rules.schema.json``
(or ``shadowlimit rules schema``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, get_args

from limiter.keys import ForwardedMode, KeyStrategy
from limiter.policy import MAX_AVERAGE, MAX_BURST, MAX_PERIOD_S, MIN_PERIOD_S, Algorithm
from limiter.rates import LIMIT_PATTERN, any_case
from limiter.resilience import FailurePolicy

from ..durations import DURATION_PATTERN
from ..model.rollout import Mode
from .fields import FAILURE_CODES, KEY_KEYS, KEY_MAX_LENGTH, POLICY_KEYS
from .model import DEFAULT_ROUTE, HTTP_TOKEN, RESERVED_ROUTE_NAMES, ROUTE_NAME
from .paths import MAX_PATTERN_LENGTH
from .schema import (
    CACHE_TTL_MAX_S,
    CANARY_PERCENT,
    DEFAULTS_KEYS,
    EXTERNAL_KEYS,
    EXTERNAL_TIMEOUT_MAX_S,
    HEADER_FILTER_KEYS,
    MATCH_KEYS,
    MAX_CONCURRENT,
    MIN_DWELL_MAX_S,
    OVERRIDE_KEYS,
    ROUTE_KEYS,
    TOP_KEYS,
)

__all__ = ["SCHEMA_PATH", "render", "rules_json_schema"]

SCHEMA_PATH = "docs/rules.schema.json"
"""Where the repository keeps the generated schema (relative to its root)."""

_REF = "#/definitions/"


def _obj(keys: tuple[str, ...], properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An object with exactly the loader's ``keys`` (a missing or extra entry is a bug here)."""
    if list(properties) != list(keys):
        raise AssertionError(f"schema properties {list(properties)} differ from the loader's keys {list(keys)}")
    return {"type": "object", "properties": properties, "additionalProperties": False, **extra}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _anchored(pattern: str) -> str:
    return f"^(?:{pattern})$"


def _lenient(names: Iterable[str], *, spaces: bool) -> str:
    """A pattern for names parsed ignoring case, ``_`` and ``-`` (and surrounding spaces)."""
    alternatives = []
    for name in names:
        norm = name.lower().replace("_", "").replace("-", "")
        alternatives.append("[_-]*" + "[_-]*".join(any_case(c) for c in norm) + "[_-]*")
    edge = r"\s*" if spaces else ""
    return f"^{edge}(?:{'|'.join(alternatives)}){edge}$"


def _choice(canonical: list[str], lenient: str, description: str) -> dict[str, Any]:
    """The canonical spellings (offered by editors) or any spelling the loader accepts."""
    return {"description": description, "anyOf": [{"enum": canonical}, {"type": "string", "pattern": lenient}]}


def _whole(lo: int, hi: int, description: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi, "description": description}


def _duration(hi: float, *, allow_zero: bool, description: str) -> dict[str, Any]:
    low = {"minimum": 0} if allow_zero else {"exclusiveMinimum": 0}
    return {
        "description": description,
        "anyOf": [{"type": "number", **low, "maximum": hi}, {"type": "string", "pattern": DURATION_PATTERN}],
    }


def _strategy_is(*strategies: KeyStrategy) -> dict[str, Any]:
    pattern = _lenient((s.value for s in strategies), spaces=True)
    return {"required": ["strategy"], "properties": {"strategy": {"type": "string", "pattern": pattern}}}


def _header_name(description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": _anchored(HTTP_TOKEN.pattern), "description": description}


def _definitions_policy() -> dict[str, Any]:
    policy_object = _obj(
        POLICY_KEYS,
        {
            "algorithm": {
                "enum": [a.value for a in Algorithm],
                "description": "The algorithm (default token_bucket, or the route's local one).",
            },
            "average": {
                "type": "number",
                "maximum": MAX_AVERAGE,
                "description": "Tokens added (requests allowed) per period; <= 0 means unlimited.",
            },
            "period": _ref("period"),
            "burst": _whole(1, MAX_BURST, "Bucket size (default ceil(average), never inherited)."),
            "limit": _ref("limit"),
        },
        anyOf=[{"required": ["average"]}, {"required": ["limit"]}],
        dependencies={"limit": {"properties": {"average": False, "period": False}}},
    )
    return {
        "limit": {
            "type": "string",
            "pattern": LIMIT_PATTERN,
            "description": 'A limit as text: "100/minute", "5/1s", "1000 per hour", "100/5 minutes" '
            "(burst defaults to the quantity).",
        },
        "period": {
            "description": "Seconds (1, 0.5) or a duration (500ms, 1s, 1m30s, 1h, 1d).",
            "anyOf": [
                {"type": "number", "minimum": MIN_PERIOD_S, "maximum": MAX_PERIOD_S},
                {"type": "string", "pattern": DURATION_PATTERN},
            ],
        },
        "policy": {
            "description": 'A limit text ("100/minute") or {average, period, burst, algorithm} '
            "or {limit, burst, algorithm}.",
            "anyOf": [_ref("limit"), policy_object],
        },
    }


def _definitions_key() -> dict[str, Any]:
    strategies = [s.value for s in KeyStrategy]
    key = _obj(
        KEY_KEYS,
        {
            "strategy": _choice(
                strategies, _lenient(strategies, spaces=True), "How a request maps to its bucket (default clientIP)."
            ),
            "header": _header_name("header and composite: the header whose value is the key."),
            "api_key_header": _header_name("apiKey: the header carrying the API key (default X-API-Key)."),
            "forwarded_mode": {
                "enum": list(get_args(ForwardedMode)),
                "description": "clientIP: how X-Forwarded-For is read (default first).",
            },
            "max_length": _whole(*KEY_MAX_LENGTH, "Longest key in UTF-8 bytes (default 256)."),
        },
        allOf=[
            {"if": _strategy_is(KeyStrategy.HEADER, KeyStrategy.COMPOSITE), "then": {"required": ["header"]}},
        ],
    )
    policies = [p.value for p in FailurePolicy]
    return {
        "key": key,
        "failure_policy": _choice(policies, _lenient(policies, spaces=False), "What the route does while Redis fails."),
        "failure_code": _whole(*FAILURE_CODES, "The status of failClosed rejections."),
    }


def _definitions_route() -> dict[str, Any]:
    if "A-Za-z" not in HTTP_TOKEN.pattern:
        raise AssertionError(f"HTTP_TOKEN changed ({HTTP_TOKEN.pattern}): derive the upper-case method pattern anew")
    # an HTTP token in upper case (the loader refuses "get"), or "*"
    method = {"type": "string", "pattern": _anchored(r"\*|" + HTTP_TOKEN.pattern.replace("A-Za-z", "A-Z"))}
    match = _obj(
        MATCH_KEYS,
        {
            "methods": {
                "description": 'Upper-case HTTP methods (or one); "*" = any (the default).',
                "anyOf": [method, {"type": "array", "items": method, "minItems": 1}],
            },
            "path": {
                "type": "string",
                "pattern": r"^/[^\s?#]*$",
                "maxLength": MAX_PATTERN_LENGTH,
                "description": "Literal segments, * or {name} (one segment), ** (any number).",
            },
        },
        required=["path"],
    )
    entries = {
        "type": "array",
        "items": {"type": "string", "pattern": r"^\S(?:.*\S)?$"},
        "description": "IP addresses or CIDR blocks (matched against the client) or keys.",
    }
    overrides = {"type": ["object", "null"], "additionalProperties": _ref("policy")}
    route = _obj(
        ROUTE_KEYS,
        {
            "name": {
                "type": "string",
                "pattern": _anchored(ROUTE_NAME.pattern),
                "not": {"enum": sorted(RESERVED_ROUTE_NAMES)},
                "description": f"Unique; {DEFAULT_ROUTE!r} replaces the built-in fallback route.",
            },
            "match": match,
            "key": _ref("key"),
            "local": {**_ref("policy"), "description": "What each replica enforces on its own."},
            "distributed": {**_ref("policy"), "description": "The global limit (default: local)."},
            "overrides": _obj(OVERRIDE_KEYS, {"api_keys": overrides, "tenants": overrides}),
            "allow": entries,
            "deny": entries,
            "failure_policy": _ref("failure_policy"),
            "failure_code": _ref("failure_code"),
            "mode": {"enum": [m.value for m in Mode], "description": "The mode until an operator changes it."},
            "canary_percent": _whole(*CANARY_PERCENT, "Only with mode: canary."),
            "min_dwell": _duration(
                MIN_DWELL_MAX_S,
                allow_zero=True,
                description="The gate's minimum time in each step (default SHADOWLIMIT_GATE_MIN_DWELL_S, 10m).",
            ),
            "external": _ref("external"),
        },
        required=["name", "local"],
        dependencies={"canary_percent": {"required": ["mode"], "properties": {"mode": {"const": "canary"}}}},
        **{"if": {"properties": {"name": {"const": DEFAULT_ROUTE}}}, "else": {"required": ["match"]}},
    )
    return {"route": route}


def _definitions_external() -> dict[str, Any]:
    headers = {"type": "array", "items": _header_name("A header name.")}
    external = _obj(
        EXTERNAL_KEYS,
        {
            "url": {"type": "string", "pattern": r"^[hH][tT][tT][pP][sS]?://\S+$", "description": "POSTed to."},
            "timeout": _duration(EXTERNAL_TIMEOUT_MAX_S, allow_zero=False, description="Default 5s."),
            "cache_ttl": _duration(CACHE_TTL_MAX_S, allow_zero=True, description="Default 60s."),
            "max_concurrent_requests": _whole(*MAX_CONCURRENT, "Calls in flight at once (default 50)."),
            "header_filter": _obj(
                HEADER_FILTER_KEYS,
                {"allow_list": headers, "deny_list": headers},
                **{"not": {"required": ["allow_list", "deny_list"]}},
            ),
        },
        required=["url"],
    )
    return {"external": external}


def rules_json_schema() -> dict[str, Any]:
    """The rules file's JSON Schema (draft-07) as a dict."""
    definitions = {
        **_definitions_policy(),
        **_definitions_key(),
        **_definitions_route(),
        **_definitions_external(),
    }
    document = _obj(
        TOP_KEYS,
        {
            "version": {"const": 1},
            "defaults": _obj(
                DEFAULTS_KEYS,
                {"key": _ref("key"), "failure_policy": _ref("failure_policy"), "failure_code": _ref("failure_code")},
            ),
            "routes": {"type": ["array", "null"], "items": _ref("route"), "description": "First match wins."},
        },
        required=["routes"],
    )
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "shadowlimit rules file",
        "description": "Routes, keys and limits for shadowlimit (RATE_LIMIT_RULES_PATH). Generated by "
        "python -m control_plane.rules.json_schema; `shadowlimit rules check FILE` checks everything.",
        **document,
        "definitions": definitions,
    }


def render() -> str:
    """The schema as the repository keeps it: indented JSON and a final newline."""
    return json.dumps(rules_json_schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    print(render(), end="")
