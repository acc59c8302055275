"""Tests for control_plane.rules: the YAML rules file, matching, overrides, errors, hot reload."""

from __future__ import annotations

import asyncio
import os
import pickle
import textwrap
from pathlib import Path

import pytest

from control_plane.model.rollout import Mode
from control_plane.rules import (
    ListMatcher,
    RouteRule,
    Rules,
    RulesError,
    RulesWatcher,
    compile_path_pattern,
    default_route,
    load_rules,
    parse_duration,
    parse_rules,
)
from control_plane.settings import Settings
from limiter.keys import KeyExtractor, KeyStrategy, api_key_id
from limiter.policy import Algorithm, Policy
from limiter.resilience import FailurePolicy

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"


@pytest.fixture
def settings() -> Settings:
    return Settings(global_capacity=60, global_refill_per_sec=2.0, trusted_proxies="10.0.0.0/8", rules_path=None)


def parse(text: str, settings: Settings, source: str | None = "rules.yaml") -> Rules:
    return parse_rules(textwrap.dedent(text), settings, source=source)


def error(text: str, settings: Settings) -> RulesError:
    with pytest.raises(RulesError) as info:
        parse(text, settings)
    return info.value


def route(path: str, methods=None, name: str = "r", **kw) -> RouteRule:
    p = Policy(average=10, burst=10)
    return RouteRule(name=name, methods=methods, path_pattern=path, key=KeyExtractor(), local=p, distributed=p, **kw)


# -- the example file -------------------------------------------------------------------


def test_example_file_loads(settings):
    rules = load_rules(EXAMPLE, settings)
    assert rules.names() == ["search", "checkout", "login", "internal", "tenants", "chat", "default"]
    assert rules.source == str(EXAMPLE)
    assert len(rules.digest) == 64

    search = rules.get("search")
    assert search.methods == frozenset({"GET"})
    assert search.local == Policy(average=20, period=1.0, burst=20)
    assert search.distributed == Policy(average=30, period=1.0, burst=30)
    assert search.key.strategy is KeyStrategy.CLIENT_IP
    assert search.key.trusted_proxies == settings.proxies  # from the settings, not the file
    assert search.initial_mode is Mode.SHADOW
    assert search.failure_policy is FailurePolicy.IN_MEMORY_FALLBACK  # from defaults
    assert search.allow.matches("1.2.3.4", "10.1.2.3") and search.deny.matches("x", "203.0.113.9")

    checkout = rules.get("checkout")
    assert checkout.key.strategy is KeyStrategy.COMPOSITE and checkout.key.header == "X-Tenant-Id"
    assert checkout.policies_for("acme:checkout") == (Policy(average=500, burst=100),) * 2
    assert checkout.deny.matches("bad-tenant:checkout", None)
    assert checkout.failure_code == 503

    tenants = rules.get("tenants")
    assert tenants.external is not None and tenants.external.url == "http://127.0.0.1:9100/limits"
    assert (tenants.external.timeout_s, tenants.external.cache_ttl_s, tenants.external.max_concurrent_requests) == (
        0.5,
        60.0,
        50,
    )
    assert tenants.external.allow_list == ("x-tenant-id", "x-plan")

    login = rules.get("login")
    assert login.local.algorithm is Algorithm.SLIDING_WINDOW and login.local.period == 60.0 and login.local.average == 5
    # the global limit being tried is stricter than today's: 3 a minute, the same window
    assert login.distributed.algorithm is Algorithm.SLIDING_WINDOW and login.distributed.period == 60.0
    assert (login.distributed.average, login.distributed.burst) == (3, 3)
    assert login.failure_policy is FailurePolicy.FAIL_CLOSED

    internal = rules.get("internal")
    assert internal.key.strategy is KeyStrategy.API_KEY
    assert internal.initial_mode is Mode.CANARY and internal.initial_canary_percent == 10
    assert internal.policies_for(api_key_id("sk-live-example-batch-importer"))[0].average == 1000
    assert internal.policies_for(api_key_id("someone-else")) == (internal.local, internal.distributed)

    d = rules.to_dict()
    assert [r["name"] for r in d["routes"]] == rules.names()
    assert d["routes"][-1]["default"] is True


def test_to_dict_is_json_safe_and_has_no_raw_keys(settings):
    import json

    rules = parse(
        """
        routes:
          - name: api
            match: {path: /api/**}
            key: {strategy: apiKey}
            local: {average: 10}
            overrides: {api_keys: {"sk-secret-1": {average: 100}}}
            allow: [internal-job]
        """,
        settings,
    )
    text = json.dumps(rules.to_dict())
    assert "sk-secret-1" not in text
    d = rules.get("api").to_dict()
    assert d["overrides"] == {"api_keys": 1, "tenants": 0}
    assert d["allow"] == 1 and d["key"]["strategy"] == "apiKey"
    assert d["local"] == {"algorithm": "token_bucket", "average": 10.0, "period": 1.0, "burst": 10}


def test_loaded_at_comes_from_the_clock(settings, tmp_path):
    assert parse_rules("routes: []\n", settings, clock=lambda: 1234.5).loaded_at == 1234.5
    assert load_rules(None, settings, clock=lambda: 99.0).loaded_at == 99.0
    f = tmp_path / "rules.yaml"
    f.write_text("routes: []\n")
    assert load_rules(f, settings, clock=lambda: 7.0).loaded_at == 7.0


# -- path patterns and methods ----------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("/api/v1/users", "/api/v1/users", True),
        ("/api/v1/users", "/api/v1/users/", True),  # trailing slash ignored
        ("/api/v1/users/", "/api/v1/users", True),
        ("/api/v1/users", "/api/v1/user", False),
        ("/api/v1/users", "/api/v1/users/1", False),
        ("/api/v1/users", "/API/v1/users", False),  # case-sensitive
        ("/api/*/users", "/api/v2/users", True),
        ("/api/*/users", "/api/users", False),  # * is exactly one segment
        ("/api/*/users", "/api/a/b/users", False),
        ("/users/{id}", "/users/42", True),
        ("/users/{id}", "/users/42/", True),
        ("/users/{id}", "/users", False),
        ("/users/{id}/orders/{order}", "/users/1/orders/2", True),
        ("/api/**", "/api", True),  # ** includes zero segments
        ("/api/**", "/api/", True),
        ("/api/**", "/api/a/b/c", True),
        ("/api/**", "/apix", False),
        ("/**", "/", True),
        ("/**", "/anything/at/all", True),
        ("/", "/", True),
        ("/", "/a", False),
        ("/a/**/z", "/a/z", True),
        ("/a/**/z", "/a/b/c/z", True),
        ("/a/**/z", "/a/b/c/y", False),
        ("/a/**/b/**/c", "/a/x/b/y/y/c", True),
        ("/a/**/b/**/c", "/a/c/b", False),
        ("/**/health", "/svc/health", True),
        ("/**/health", "/health", True),
        ("/a/*/**", "/a", False),
        ("/a/*/**", "/a/b", True),
    ],
)
def test_path_patterns(pattern, path, expected):
    assert route(pattern).matches("GET", path) is expected


@pytest.mark.parametrize(
    "pattern",
    ["api/x", "", "/a//b", "/a/b*", "/v{id}", "/{id", "/{a}/{a}", "/a b", "/a?x=1", "/a\x00"],
)
def test_bad_path_patterns(pattern):
    with pytest.raises(ValueError):
        compile_path_pattern(pattern)


def test_methods():
    r = route("/x", methods=["GET", "POST"])
    assert r.matches("GET", "/x") and r.matches("POST", "/x")
    assert not r.matches("DELETE", "/x")
    assert route("/x").matches("PATCH", "/x")  # None = any
    assert route("/x", methods=["*"]).methods is None


def test_methods_from_yaml(settings):
    rules = parse(
        """
        routes:
          - {name: a, match: {methods: [GET, HEAD], path: /a}, local: {average: 1}}
          - {name: b, match: {methods: "*", path: /b}, local: {average: 1}}
          - {name: c, match: {methods: DELETE, path: /c}, local: {average: 1}}
        """,
        settings,
    )
    assert rules.get("a").methods == frozenset({"GET", "HEAD"})
    assert rules.get("b").methods is None
    assert rules.get("c").methods == frozenset({"DELETE"})
    assert rules.match("POST", "/a").name == "default"
    assert rules.match("HEAD", "/a").name == "a"


def test_first_match_wins_and_default_fallback(settings):
    rules = parse(
        """
        routes:
          - {name: special, match: {path: /api/v1/special}, local: {average: 1}}
          - {name: writes, match: {methods: [POST], path: /api/**}, local: {average: 2}}
          - {name: api, match: {path: /api/**}, local: {average: 3}}
          - {name: special-late, match: {path: /api/v1/special}, local: {average: 4}}
        """,
        settings,
    )
    assert rules.match("GET", "/api/v1/special").name == "special"
    assert rules.match("POST", "/api/v1/special").name == "special"
    assert rules.match("POST", "/api/v1/other").name == "writes"
    assert rules.match("GET", "/api/v1/other").name == "api"
    fallback = rules.match("GET", "/elsewhere")
    assert fallback is rules.default and fallback.name == "default"
    assert rules.get("default") is rules.default
    assert rules.get("nope") is None
    assert rules.names() == ["special", "writes", "api", "special-late", "default"]


def test_default_route_from_settings(settings):
    d = default_route(settings)
    assert d.name == "default" and d.path_pattern == "/**" and d.methods is None
    assert d.local == d.distributed == Policy(average=2.0, period=1.0, burst=60)
    assert d.key.strategy is KeyStrategy.CLIENT_IP and d.key.trusted_proxies == settings.proxies
    assert d.matches("DELETE", "/a/b/c")
    unlimited = default_route(Settings(global_capacity=5, global_refill_per_sec=0, rules_path=None))
    assert unlimited.local.unlimited

    builtin = load_rules(None, settings)
    assert builtin.routes == () and builtin.digest == "builtin" and builtin.source is None
    assert builtin.names() == ["default"]
    assert builtin.match("GET", "/x") is builtin.default


def test_redefined_default(settings):
    rules = parse(
        """
        defaults:
          failure_policy: passThrough
        routes:
          - name: default
            local: {average: 7, burst: 14}
          - {name: a, match: {path: /a}, local: {average: 1}}
        """,
        settings,
    )
    assert rules.names() == ["a", "default"]
    assert rules.default.local == Policy(average=7, burst=14)
    assert rules.default.line == 5
    assert rules.default.failure_policy is FailurePolicy.PASS_THROUGH
    assert rules.match("GET", "/b") is rules.default

    err = error(
        """
        routes:
          - name: default
            match: {path: /api/**}
            local: {average: 7}
        """,
        settings,
    )
    assert err.field == "routes[0].match" and err.line == 4


def test_unreachable_route_after_catch_all(settings):
    err = error(
        """
        routes:
          - {name: all, match: {path: /**}, local: {average: 1}}
          - {name: never, match: {path: /x}, local: {average: 1}}
        """,
        settings,
    )
    assert err.field == "routes[1]" and err.line == 4 and "never match" in err.message


# -- overrides --------------------------------------------------------------------------


def test_overrides(settings):
    raw = "sk-live-123"
    hashed = api_key_id("other-key")
    rules = parse(
        f"""
        routes:
          - name: api
            match: {{path: /api/**}}
            key: {{strategy: apiKey}}
            local: {{average: 10, period: 1m, burst: 10}}
            distributed: {{average: 20, burst: 20}}
            overrides:
              api_keys:
                "{raw}": {{average: 1000, burst: 200}}
                "{hashed}": {{average: 50, period: 1s, algorithm: gcra}}
          - name: tenants
            match: {{path: /t/**}}
            key: {{strategy: header, header: X-Tenant-Id}}
            local: {{average: 10}}
            overrides:
              tenants:
                acme: {{average: 500, burst: 100}}
          - name: comp
            match: {{path: /c/**}}
            key: {{strategy: composite, header: X-Tenant-Id}}
            local: {{average: 10}}
            overrides:
              tenants:
                acme: {{average: 500, burst: 100}}
                "globex:c": {{average: 7}}
        """,
        settings,
    )
    api = rules.get("api")
    assert set(api.api_key_overrides) == {api_key_id(raw), hashed}
    assert raw not in api.api_key_overrides
    big = api.api_key_overrides[api_key_id(raw)]
    # overrides inherit algorithm and period from local; burst is their own
    assert big == Policy(average=1000, period=60.0, burst=200)
    assert api.policies_for(api_key_id(raw)) == (big, big)  # both limiters
    assert api.policies_for(hashed)[1] == Policy(average=50, period=1.0, algorithm="gcra")
    assert api.policies_for(api_key_id("nobody")) == (api.local, api.distributed)
    assert api.distributed == Policy(average=20, period=60.0, burst=20)  # period inherited
    with pytest.raises(TypeError):
        api.api_key_overrides["x"] = big  # type: ignore[index]

    t = rules.get("tenants")
    assert t.policies_for("acme") == (Policy(average=500, burst=100),) * 2
    assert t.policies_for("acme:x") == (t.local, t.distributed)  # header keys: exact only

    c = rules.get("comp")
    acme = Policy(average=500, burst=100)
    assert c.policies_for("acme:c") == (acme, acme)  # tenant part of a composite key
    assert c.policies_for("acme") == (acme, acme)
    assert c.policies_for("globex:c")[0].average == 7
    assert c.policies_for("globex:d") == (c.local, c.distributed)
    assert c.policies_for("acmeco:c") == (c.local, c.distributed)


def test_api_key_overrides_need_api_key_strategy(settings):
    err = error(
        """
        routes:
          - name: api
            match: {path: /api/**}
            local: {average: 10}
            overrides:
              api_keys:
                "sk-secret": {average: 100}
        """,
        settings,
    )
    assert err.field == "routes[0].overrides.api_keys" and err.line == 7
    assert "apiKey" in err.message


def test_errors_never_echo_raw_api_keys(settings):
    err = error(
        """
        routes:
          - name: api
            match: {path: /api/**}
            key: {strategy: apiKey}
            local: {average: 10}
            overrides:
              api_keys:
                "sk-secret-zzz": {average: 100, burst: 0}
        """,
        settings,
    )
    assert "sk-secret-zzz" not in str(err)
    assert err.field == f'routes[0].overrides.api_keys["{api_key_id("sk-secret-zzz")}"].burst'
    assert err.line == 9

    err = error(
        """
        routes:
          - name: api
            match: {path: /api/**}
            key: {strategy: apiKey}
            local: {average: 10}
            overrides:
              api_keys:
                "sk-secret-zzz": {average: 100}
                "sk-secret-zzz": {average: 100}
        """,
        settings,
    )
    assert "sk-secret-zzz" not in str(err) and err.line == 10 and "duplicate key" in err.message


# -- allow / deny -----------------------------------------------------------------------


def test_list_matcher():
    m = ListMatcher(["10.0.0.0/8", "127.0.0.1", "2001:db8::/32", "internal-job", "10.1.0.0/16"])
    assert len(m) == 5
    assert m.matches("whatever", "10.20.30.40")
    assert m.matches("whatever", "127.0.0.1")
    assert not m.matches("whatever", "127.0.0.2")
    assert m.matches("whatever", "2001:db8::1")
    assert m.matches("whatever", "::ffff:10.0.0.1")  # IPv4-mapped
    assert m.matches("internal-job", "8.8.8.8")
    assert m.matches("internal-job", None)
    assert not m.matches("internal-job-2", "8.8.8.8")
    assert not m.matches("10.0.0.1", None)  # IP entries match the client IP, never the key
    assert not m.matches("x", "not-an-ip")
    assert not ListMatcher().matches("x", "10.0.0.1") and len(ListMatcher()) == 0
    assert len(ListMatcher(["a", "a", "10.0.0.1/8", "10.0.0.0/8"])) == 2
    comp = ListMatcher(["bad-tenant"], composite=True)
    assert comp.matches("bad-tenant:api", None) and not comp.matches("bad-tenant-2:api", None)
    with pytest.raises(ValueError):
        ListMatcher(["10.0.0.300"])
    with pytest.raises(ValueError):
        ListMatcher(["bad\nkey"])


def test_allow_deny_from_yaml(settings):
    rules = parse(
        """
        routes:
          - name: r
            match: {path: /r}
            key: {strategy: header, header: X-Tenant-Id}
            local: {average: 1}
            allow: ["10.0.0.0/8", "127.0.0.1", internal-job]
            deny: ["203.0.113.0/24", bad-tenant]
        """,
        settings,
    )
    r = rules.get("r")
    assert len(r.allow) == 3 and len(r.deny) == 2
    assert r.allow.matches("acme", "10.9.9.9") and r.allow.matches("internal-job", "8.8.8.8")
    assert not r.allow.matches("acme", "8.8.8.8")
    assert r.deny.matches("acme", "203.0.113.77") and r.deny.matches("bad-tenant", "8.8.8.8")
    assert not r.deny.matches("acme", "203.0.114.1")


def test_allow_deny_errors(settings):
    err = error(
        """
        routes:
          - name: r
            match: {path: /r}
            local: {average: 1}
            allow:
              - 10.0.0.0/8
              - 10.0.0.256
        """,
        settings,
    )
    assert err.field == "routes[0].allow[1]" and err.line == 8
    err = error(
        """
        routes:
          - name: r
            match: {path: /r}
            local: {average: 1}
            allow: [x]
            deny: [x]
        """,
        settings,
    )
    assert err.field == "routes[0].deny" and "both" in err.message


def test_api_key_route_hashes_raw_list_entries(settings):
    rules = parse(
        """
        routes:
          - name: r
            match: {path: /r}
            key: {strategy: apiKey}
            local: {average: 1}
            deny: ["sk-revoked", "127.0.0.2"]
        """,
        settings,
    )
    assert rules.get("r").deny.matches(api_key_id("sk-revoked"), None)
    assert rules.get("r").deny.matches(api_key_id("x"), "127.0.0.2")


# -- errors: file, line, field ----------------------------------------------------------


def test_error_format():
    assert str(RulesError("bad", path="f.yaml", line=3, field="routes[0].x")) == "f.yaml:3: routes[0].x: bad"
    assert str(RulesError("bad", path="f.yaml")) == "f.yaml: bad"
    assert str(RulesError("bad", line=2)) == "line 2: bad"
    assert str(RulesError("bad")) == "bad"
    e = pickle.loads(pickle.dumps(RulesError("bad", path="f", line=1, field="x")))
    assert (e.path, e.line, e.field, e.message) == ("f", 1, "x", "bad")
    assert isinstance(e, ValueError)


def test_unknown_top_level_key(settings):
    err = error(
        """
        version: 1
        rotues: []
        """,
        settings,
    )
    assert err.line == 3 and err.field == "rotues" and err.path == "rules.yaml"
    assert "unknown key 'rotues'" in err.message and "allowed keys: version, defaults, routes" in err.message
    assert str(err).startswith("rules.yaml:3: rotues: unknown key")


def test_unknown_key_inside_route(settings):
    err = error(
        """
        routes:
          - name: a
            match: {path: /a}
            local: {average: 1}
          - name: b
            match: {path: /b}
            local: {average: 1}
            failure_polcy: failClosed
        """,
        settings,
    )
    assert err.line == 9 and err.field == "routes[1].failure_polcy"
    assert "did you mean 'failure_policy'" in err.message and "allowed keys:" in err.message


def test_explain_is_true_unless_a_route_says_false_and_nothing_else_passes(settings):
    rules = parse(
        """
        routes:
          - name: a
            match: {path: /a}
            local: {average: 1}
          - name: b
            match: {path: /b}
            local: {average: 1}
            explain: false
        """,
        settings,
    )
    assert (rules.get("a").explain, rules.get("b").explain) == (True, False)
    assert rules.get("b").to_dict()["explain"] is False
    for bad in ("yes-please", "1", "null", "[true]"):
        err = error(
            f"""
            routes:
              - name: a
                match: {{path: /a}}
                local: {{average: 1}}
                explain: {bad}
            """,
            settings,
        )
        assert (err.line, err.field) == (6, "routes[0].explain") and "must be true or false" in err.message, bad


def test_trusted_proxies_in_file_is_rejected_with_a_hint(settings):
    err = error(
        """
        routes:
          - name: a
            match: {path: /a}
            key: {strategy: clientIP, trusted_proxies: [10.0.0.0/8]}
            local: {average: 1}
        """,
        settings,
    )
    assert err.field == "routes[0].key.trusted_proxies" and "SHADOWLIMIT_TRUSTED_PROXIES" in err.message


def test_bad_burst(settings):
    err = error(
        """
        routes:
          - name: a
            match: {path: /a}
            local:
              average: 10
              burst: 0
        """,
        settings,
    )
    assert err.line == 7 and err.field == "routes[0].local.burst"
    assert "between 1 and" in err.message  # the Policy's own message
    assert str(err) == f"rules.yaml:7: routes[0].local.burst: {err.message}"
    err = error(
        """
        routes:
          - name: a
            match: {path: /a}
            local: {average: 10, burst: 2.5}
        """,
        settings,
    )
    assert err.field == "routes[0].local.burst" and "whole number" in err.message and err.line == 5


def test_bad_algorithm(settings):
    err = error(
        """
        routes:
          - name: a
            match: {path: /a}
            local: {average: 10}
            distributed:
              average: 10
              algorithm: leaky_bucket
        """,
        settings,
    )
    assert err.line == 8 and err.field == "routes[0].distributed.algorithm"
    assert "must be one of" in err.message and "leaky_bucket" in err.message


def test_bad_period(settings):
    err = error(
        """
        routes:
          - name: a
            match: {path: /a}
            local:
              average: 10
              period: 5 minutes
        """,
        settings,
    )
    assert err.line == 7 and err.field == "routes[0].local.period" and "invalid duration" in err.message
    err = error(
        """
        routes:
          - name: a
            match: {path: /a}
            local: {average: 10, period: 0s}
        """,
        settings,
    )
    assert err.field == "routes[0].local.period" and "between" in err.message


def test_windowed_average_error_names_average(settings):
    err = error(
        """
        routes:
          - name: a
            match: {path: /a}
            local: {algorithm: sliding_window, average: 0.5, period: 1m}
        """,
        settings,
    )
    assert err.field == "routes[0].local.average"


def test_missing_path(settings):
    err = error(
        """
        routes:
          - name: a
            match:
              methods: [GET]
            local: {average: 10}
        """,
        settings,
    )
    assert err.line == 4 and err.field == "routes[0].match" and "'path'" in err.message
    err = error(
        """
        routes:
          - name: a
            local: {average: 10}
        """,
        settings,
    )
    assert err.line == 3 and err.field == "routes[0]" and "'match'" in err.message


def test_bad_path_in_yaml(settings):
    err = error(
        """
        routes:
          - name: a
            match: {path: "api/**"}
            local: {average: 10}
        """,
        settings,
    )
    assert err.field == "routes[0].match.path" and err.line == 4 and "start with '/'" in err.message


def test_duplicate_route_name(settings):
    err = error(
        """
        routes:
          - name: a
            match: {path: /a}
            local: {average: 10}
          - name: a
            match: {path: /b}
            local: {average: 10}
        """,
        settings,
    )
    assert err.line == 6 and err.field == "routes[1].name"
    assert "duplicate route name 'a'" in err.message and "line 3" in err.message


def test_duplicate_yaml_key(settings):
    err = error(
        """
        routes:
          - name: a
            match: {path: /a}
            local:
              average: 10
              burst: 5
              average: 20
        """,
        settings,
    )
    assert err.line == 8 and err.field == "routes[0].local.average"
    assert "duplicate key 'average'" in err.message and "line 6" in err.message


def test_duplicate_top_level_key(settings):
    err = error("routes: []\nroutes: []\n", settings)
    assert err.line == 2 and err.field == "routes"


def test_yaml_syntax_error(settings):
    err = error(
        """
        routes:
          - name: a
            match: {path: /a
            local: {average: 10}
        """,
        settings,
    )
    assert err.path == "rules.yaml" and err.line is not None and err.line >= 4
    assert "YAML syntax error" in err.message and err.field == ""
    err = error("routes:\n  - name: a\n   bad: indentation\n", settings)
    assert err.line == 3


def test_non_mapping_route(settings):
    err = error(
        """
        routes:
          - name: a
            match: {path: /a}
            local: {average: 10}
          - just-a-string
        """,
        settings,
    )
    assert err.line == 6 and err.field == "routes[1]" and "must be a mapping" in err.message


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ("", "", "empty"),
        ("- a\n- b\n", "", "must be a mapping"),
        ("version: 2\nroutes: []\n", "version", "must be 1"),
        ("defaults: {}\n", "", "missing required key 'routes'"),
        ("routes: {a: 1}\n", "routes", "must be a list"),
        ("routes:\n  - {name: 'bad name', match: {path: /a}, local: {average: 1}}\n", "routes[0].name", "A-Za-z0-9"),
        (
            "routes:\n  - {name: a, match: {path: /a, methods: [get]}, local: {average: 1}}\n",
            "routes[0].match.methods[0]",
            "'GET'",
        ),
        (
            "routes:\n  - {name: a, match: {path: /a, methods: []}, local: {average: 1}}\n",
            "routes[0].match.methods",
            "empty",
        ),
        ("routes:\n  - {name: a, match: {path: /a}, local: {average: fast}}\n", "routes[0].local.average", "number"),
        ("routes:\n  - {name: a, match: {path: /a}, local: {burst: 3}}\n", "routes[0].local", "'average'"),
        (
            "routes:\n  - {name: a, match: {path: /a}, local: {average: 1}, key: {strategy: ip}}\n",
            "routes[0].key.strategy",
            "unknown key strategy",
        ),
        (
            "routes:\n  - {name: a, match: {path: /a}, local: {average: 1}, key: {strategy: header}}\n",
            "routes[0].key.header",
            "required",
        ),
        (
            "routes:\n  - {name: a, match: {path: /a}, local: {average: 1},"
            " key: {strategy: header, header: 'X Bad'}}\n",
            "routes[0].key.header",
            "header name",
        ),
        (
            "routes:\n  - {name: a, match: {path: /a}, local: {average: 1}, key: {forwarded_mode: last}}\n",
            "routes[0].key.forwarded_mode",
            "first",
        ),
        (
            "routes:\n  - {name: a, match: {path: /a}, local: {average: 1}, failure_policy: explode}\n",
            "routes[0].failure_policy",
            "passThrough",
        ),
        (
            "routes:\n  - {name: a, match: {path: /a}, local: {average: 1}, failure_code: 200}\n",
            "routes[0].failure_code",
            "400 to 599",
        ),
        (
            "routes:\n  - {name: a, match: {path: /a}, local: {average: 1}, mode: turbo}\n",
            "routes[0].mode",
            "off, shadow, canary, enforce",
        ),
        (
            "routes:\n  - {name: a, match: {path: /a}, local: {average: 1}, mode: canary, canary_percent: 101}\n",
            "routes[0].canary_percent",
            "0 to 100",
        ),
        (
            "routes:\n  - {name: a, match: {path: /a}, local: {average: 1}, mode: shadow, canary_percent: 5}\n",
            "routes[0].canary_percent",
            "canary",
        ),
        (
            "routes:\n  - {name: a, match: {path: /a}, local: {average: 1}, allow: 10.0.0.0/8}\n",
            "routes[0].allow",
            "list",
        ),
        ("defaults: {key: {strategy: composite}}\nroutes: []\n", "defaults.key.header", "required"),
        ("routes:\n  - {name: a, match: {path: /a}, local: !!python/object:os.system {}}\n", "routes[0].local", "tag"),
        ("routes:\n  - {name: a, match: {path: /a}, local: {average: !ruby 1}}\n", "", "!ruby"),
    ],
)
def test_assorted_errors(settings, text, field, fragment):
    err = error(text, settings)
    assert err.field == field, str(err)
    assert fragment in str(err), str(err)


def test_mode_off_is_a_string_not_a_boolean(settings):
    rules = parse(
        """
        routes:
          - {name: a, match: {path: /a}, local: {average: 1}, mode: off}
          - {name: b, match: {path: /b}, local: {average: 1}, mode: canary, canary_percent: 25}
        """,
        settings,
    )
    assert rules.get("a").initial_mode is Mode.OFF
    assert rules.get("b").initial_mode is Mode.CANARY and rules.get("b").initial_canary_percent == 25


def test_defaults_and_anchors(settings):
    rules = parse(
        """
        defaults:
          key: {strategy: header, header: X-Tenant-Id}
          failure_policy: failClosed
          failure_code: 503
        routes:
          - {name: a, match: {path: /a}, local: &std {average: 10, period: 500ms, burst: 5}}
          - name: b
            match: {path: /b}
            key: {strategy: clientIP}
            local: {<<: *std, burst: 9}
            failure_policy: passThrough
        """,
        settings,
    )
    a, b = rules.get("a"), rules.get("b")
    assert (
        a.key.strategy is KeyStrategy.HEADER and a.failure_policy is FailurePolicy.FAIL_CLOSED and a.failure_code == 503
    )
    assert a.local == Policy(average=10, period=0.5, burst=5)
    assert b.key.strategy is KeyStrategy.CLIENT_IP and b.failure_policy is FailurePolicy.PASS_THROUGH
    assert b.local == Policy(average=10, period=0.5, burst=9)
    assert rules.default.key.strategy is KeyStrategy.CLIENT_IP  # defaults never touch the built-in default


def test_recursive_alias_is_an_error(settings):
    err = error("routes: &a [*a]\n", settings)
    assert "recursive" in err.message


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (1, 1.0),
        (0.25, 0.25),
        ("500ms", 0.5),
        ("1s", 1.0),
        ("1.5s", 1.5),
        ("1m", 60.0),
        ("1h", 3600.0),
        ("1m30s", 90.0),
        ("2", 2.0),
        ("1d", 86400.0),
    ],
)
def test_parse_duration(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["", "s", "1x", "1 minute", "-1s", "1s2", True, None, [1]])
def test_parse_duration_rejects(value):
    with pytest.raises(ValueError):
        parse_duration(value)


def test_load_rules_missing_file(settings, tmp_path):
    with pytest.raises(RulesError) as info:
        load_rules(tmp_path / "nope.yaml", settings)
    assert info.value.path == str(tmp_path / "nope.yaml") and "cannot read" in info.value.message


def test_load_rules_errors_name_the_file(settings, tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("routes:\n  - name: a\n    match: {path: /a}\n    local: {average: 1, burst: -1}\n")
    with pytest.raises(RulesError) as info:
        load_rules(f, settings)
    assert str(info.value).startswith(f"{f}:4: routes[0].local.burst: ")


# -- hot reload -------------------------------------------------------------------------

GOOD_1 = "routes:\n  - {name: a, match: {path: /a}, local: {average: 10}}\n"
GOOD_2 = "routes:\n  - {name: b, match: {path: /b}, local: {average: 20}}\n"
BAD = "routes:\n  - {name: b, match: {path: /b}, local: {average: 20, burst: 0}}\n"


def _write(path: Path, text: str, bump: int) -> None:
    path.write_text(text)
    st = path.stat()
    # a later mtime, as if written `bump` seconds later (and old enough not to be "racy")
    t = st.st_mtime_ns - 100_000_000_000 + bump * 1_000_000_000
    os.utime(path, ns=(t, t))


def test_watcher_reloads_keeps_last_good_and_recovers(settings, tmp_path):
    f = tmp_path / "rules.yaml"
    _write(f, GOOD_1, 0)
    changes: list[Rules] = []
    errors: list[RulesError] = []
    w = RulesWatcher(f, settings, on_change=changes.append, on_error=errors.append)
    assert w.rules.names() == ["a", "default"]
    assert not w.check()  # nothing changed
    assert changes == [] and errors == []

    _write(f, GOOD_2, 1)
    assert w.check()
    assert w.rules.names() == ["b", "default"] and changes == [w.rules] and w.reload_count == 1
    good = w.rules

    _write(f, BAD, 2)
    assert not w.check()
    assert w.rules is good  # last good kept
    assert len(errors) == 1 and errors[0].field == "routes[0].local.burst" and errors[0].line == 2
    assert w.last_error is errors[0] and w.error_count == 1
    assert not w.check()  # the same bad file is reported once
    assert len(errors) == 1

    _write(f, GOOD_1, 3)
    assert w.check()
    assert w.rules.names() == ["a", "default"] and w.last_error is None
    assert len(changes) == 2 and w.reload_count == 2 and w.error_count == 1


def test_watcher_same_size_rewrite_detected_by_mtime(settings, tmp_path):
    f = tmp_path / "rules.yaml"
    _write(f, GOOD_1, 0)
    w = RulesWatcher(f, settings, on_change=lambda r: None, on_error=lambda e: None)
    same_size = GOOD_1.replace("average: 10", "average: 11")
    assert len(same_size) == len(GOOD_1)
    _write(f, same_size, 5)
    assert w.check()
    assert w.rules.get("a").local.average == 11


def test_watcher_touch_without_change_does_not_reload(settings, tmp_path):
    f = tmp_path / "rules.yaml"
    _write(f, GOOD_1, 0)
    changes: list[Rules] = []
    w = RulesWatcher(f, settings, on_change=changes.append, on_error=lambda e: None)
    _write(f, GOOD_1, 9)
    assert not w.check() and changes == []


def test_watcher_rereads_a_file_whose_mtime_is_racy_by_its_clock(settings, tmp_path):
    """A same-size rewrite within the same mtime is invisible to the stat; the watcher re-reads
    the file while its mtime is within 2 s of the last read, the read time coming from ``clock``."""
    f = tmp_path / "rules.yaml"
    f.write_text(GOOD_1)
    mtime_ns = f.stat().st_mtime_ns
    same_size = GOOD_1.replace("average: 10", "average: 11")

    def rewrite(text: str) -> None:
        f.write_text(text)
        os.utime(f, ns=(mtime_ns, mtime_ns))  # same mtime, same size: the stat cannot tell

    now = mtime_ns / 1e9  # read at the moment the file was written: its mtime is racy
    w = RulesWatcher(f, settings, on_change=lambda r: None, on_error=lambda e: None, clock=lambda: now)
    rewrite(same_size)
    assert w.check() and w.rules.get("a").local.average == 11 and w.rules.loaded_at == now

    later = now + 3600  # read an hour after the file was written: its stat is trusted
    w = RulesWatcher(f, settings, on_change=lambda r: None, on_error=lambda e: None, clock=lambda: later)
    rewrite(GOOD_1)
    assert not w.check() and w.rules.get("a").local.average == 11
    assert w.reload(force=False).get("a").local.average == 10 and w.rules.loaded_at == later


def test_watcher_missing_file_reports_once(settings, tmp_path):
    f = tmp_path / "rules.yaml"
    _write(f, GOOD_1, 0)
    errors: list[RulesError] = []
    w = RulesWatcher(f, settings, on_change=lambda r: None, on_error=errors.append)
    f.unlink()
    assert not w.check() and not w.check()
    assert len(errors) == 1 and "cannot read" in errors[0].message
    assert w.rules.names() == ["a", "default"]
    _write(f, GOOD_2, 4)
    assert w.check() and w.rules.names() == ["b", "default"] and w.last_error is None


def test_watcher_reports_a_return_to_the_rules_in_force(settings, tmp_path):
    """A rejected file put back to the rules in force has nothing to reload (same digest),
    so on_change is not called: on_recover is, once, whichever way the watcher sees it."""
    f = tmp_path / "rules.yaml"
    _write(f, GOOD_1, 0)
    recovered: list[Rules] = []
    w = RulesWatcher(
        f,
        settings,
        on_change=lambda r: pytest.fail("nothing to reload"),
        on_error=lambda e: None,
        on_recover=recovered.append,
    )
    _write(f, BAD, 1)
    assert not w.check() and w.last_error is not None
    _write(f, GOOD_1, 2)  # the next check sees it
    assert not w.check() and w.last_error is None and recovered == [w.rules]
    assert not w.check() and len(recovered) == 1  # reported once
    _write(f, BAD, 3)
    assert not w.check() and w.last_error is not None  # the same bad version again: reported again
    _write(f, GOOD_1, 4)  # the admin reload (not forced) sees it
    assert w.reload(force=False) is w.rules and w.last_error is None and len(recovered) == 2
    f.unlink()  # an unreadable file, then the same content back
    assert not w.check() and w.last_error is not None
    _write(f, GOOD_1, 5)
    assert not w.check() and w.last_error is None and len(recovered) == 3


def test_watcher_reload_admin_call(settings, tmp_path):
    f = tmp_path / "rules.yaml"
    _write(f, GOOD_1, 0)
    changes: list[Rules] = []
    errors: list[RulesError] = []
    w = RulesWatcher(f, settings, on_change=changes.append, on_error=errors.append)
    first = w.rules
    again = w.reload(force=True)
    assert again is not first and again.digest == first.digest and changes == [again]
    assert w.reload(force=False) is again  # unchanged content, not forced

    _write(f, BAD, 1)
    with pytest.raises(RulesError) as info:
        w.reload()
    assert info.value.line == 2 and w.rules is again and errors == [info.value]
    assert w.last_error is info.value

    with pytest.raises(RulesError):
        RulesWatcher(None, settings).reload()


def test_watcher_without_path_and_initial_rules(settings, tmp_path):
    w = RulesWatcher(None, settings)
    assert w.rules.names() == ["default"] and not w.check()
    f = tmp_path / "rules.yaml"
    _write(f, BAD, 0)
    with pytest.raises(RulesError):
        RulesWatcher(f, settings)
    initial = load_rules(None, settings)
    w = RulesWatcher(f, settings, on_change=lambda r: None, on_error=lambda e: None, initial=initial)
    assert w.rules is initial
    assert not w.check() and w.last_error is not None and w.rules is initial


async def test_watcher_run_loop(settings, tmp_path):
    f = tmp_path / "rules.yaml"
    _write(f, GOOD_1, 0)
    seen = asyncio.Event()
    w = RulesWatcher(f, settings, on_change=lambda r: seen.set(), on_error=lambda e: None)
    task = asyncio.create_task(w.run(0.01))
    try:
        _write(f, GOOD_2, 1)
        await asyncio.wait_for(seen.wait(), 2.0)
        assert w.rules.names() == ["b", "default"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_watcher_run_survives_a_failing_callback(settings, tmp_path):
    f = tmp_path / "rules.yaml"
    _write(f, GOOD_1, 0)
    calls = []

    def boom(rules: Rules) -> None:
        calls.append(rules)
        raise RuntimeError("callback failed")

    w = RulesWatcher(f, settings, on_change=boom, on_error=lambda e: None)
    task = asyncio.create_task(w.run(0.01))
    try:
        _write(f, GOOD_2, 1)
        for _ in range(200):
            if calls:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert not task.done() and len(calls) == 1 and w.rules.names() == ["b", "default"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_alias_bombs_are_refused(settings):
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    err = error("\n".join(lines) + "\nroutes: []\n", settings)
    assert "too large" in err.message


def test_keys_are_read_as_written(settings):
    rules = parse(
        """
        routes:
          - name: t
            match: {path: /t}
            key: {strategy: header, header: X-Tenant-Id}
            local: {average: 1}
            overrides:
              tenants:
                123: {average: 9}
                true: {average: 8}
        """,
        settings,
    )
    t = rules.get("t")
    assert t.policies_for("123")[0].average == 9 and t.policies_for("true")[0].average == 8


# -- limits written as text ---------------------------------------------------------------


def test_policies_as_limit_texts(settings):
    rules = parse(
        """
        routes:
          - name: a
            match: {path: /a}
            local: 100/minute
            distributed: "1000 per hour"
          - name: b
            match: {path: /b}
            key: {strategy: header, header: X-Tenant}
            local: {limit: 100/5 minutes, burst: 20, algorithm: gcra}
            distributed: 5/1s
            overrides:
              tenants:
                acme: {limit: 50/s, burst: 100}
                big: 10/2m
          - name: c
            match: {path: /c}
            local: {algorithm: sliding_window, average: 5, period: 1m}
            distributed: {average: 9}
        """,
        settings,
    )
    a, b, c = rules.get("a"), rules.get("b"), rules.get("c")
    # burst defaults to the quantity: a full window's worth
    assert a.local == Policy(average=100, period=60, burst=100)
    assert a.distributed == Policy(average=1000, period=3600, burst=1000)
    assert b.local == Policy(average=100, period=300, burst=20, algorithm=Algorithm.GCRA)
    # a text sets the period; the algorithm is inherited from local as for average/period
    assert b.distributed == Policy(average=5, period=1, burst=5, algorithm=Algorithm.GCRA)
    assert b.policies_for("acme")[0] == Policy(average=50, period=1, burst=100, algorithm=Algorithm.GCRA)
    assert b.policies_for("big")[0] == Policy(average=10, period=120, algorithm=Algorithm.GCRA)
    assert c.distributed == Policy(average=9, period=60, algorithm=Algorithm.SLIDING_WINDOW)


@pytest.mark.parametrize(
    ("policy", "line", "field", "message"),
    [
        ("local: 100/fortnight", 5, "routes[0].local", "expected N/period or N per period like"),
        ("local: 10/month", 5, "routes[0].local", "months and years have no fixed length"),
        ("local:\n      limit: 100/fortnight", 6, "routes[0].local.limit", "'100/fortnight'"),
        ("local:\n      limit: 100", 6, "routes[0].local.limit", "must be a text like"),
        ("local:\n      limit: 5/s\n      burst: 0", 7, "routes[0].local.burst", "between 1 and"),
        ("local:\n      limit: 5/s\n      algorithm: leaky", 7, "routes[0].local.algorithm", "must be one of"),
        ("local:\n      limit: 5/s\n      period: 1s", 7, "routes[0].local.period", "not both"),
        ("local:\n      average: 5\n      limit: 5/s", 6, "routes[0].local.average", "not both"),
        (
            "local: {algorithm: fixed_window, average: 5}\n    distributed: 0.5/s",
            6,
            "routes[0].distributed",
            "fixed_window counts whole requests",
        ),
        ("local: {burst: 5}", 5, "routes[0].local", "missing required key 'average' (or a limit text like"),
        (
            "local:\n      algorithm: gcra\n      limit: 2000000/second",
            7,
            "routes[0].local.limit",
            "gcra needs at least 1 us per token (average / period at most 1000000 per second), got 0.5 us; use "
            "token_bucket for higher rates (from '2000000/second')",
        ),
    ],
)
def test_limit_text_errors_name_file_line_and_field(settings, policy, line, field, message):
    err = error(
        f"""
        routes:
          - name: a
            match: {{path: /a}}
            {textwrap.indent(policy, "        ").strip()}
        """,
        settings,
    )
    assert (err.line, err.field) == (line, field), str(err)
    assert message in err.message
    assert str(err).startswith(f"rules.yaml:{line}: {field}: ")


# -- budget: reservations ---------------------------------------------------------------


_BUDGET_ROUTE = """
    routes:
      - name: chat
        match: {path: /chat}
        key: {strategy: header, header: X-Tenant}
        local: {average: 1000, period: 1m, burst: 1000%s}
%s"""


def test_a_budget_block_sets_the_routes_reservation_terms(settings):
    from limiter.reservations import Terms

    plain = parse(_BUDGET_ROUTE % ("", ""), settings).get("chat")
    assert plain.budget is None and plain.to_dict()["budget"] is None
    defaults = parse(_BUDGET_ROUTE % ("", "        budget: {}"), settings).get("chat")
    assert defaults.budget == Terms(
        ttl_us=300_000_000, keep_us=300_000_000, positive=False, release=False, max_held=1000
    )
    text = "        budget: {reservation_ttl: 90s, on_expiry: release, admit: positive, max_reservations: 7}"
    rule = parse(_BUDGET_ROUTE % (", algorithm: fixed_window", text), settings).get("chat")
    assert rule.budget == Terms(ttl_us=90_000_000, keep_us=90_000_000, positive=True, release=True, max_held=7)
    assert rule.to_dict()["budget"] == {
        "reservation_ttl_s": 90.0, "on_expiry": "release", "admit": "positive", "max_reservations": 7,
    }  # fmt: skip
    assert rule.cost_unit is None and rule.to_dict()["cost_unit"] is None
    tokens = parse(_BUDGET_ROUTE % ("", "        budget: {}\n        cost_unit: tokens"), settings).get("chat")
    assert tokens.cost_unit == "tokens" and tokens.to_dict()["cost_unit"] == "tokens"
    assert tokens.gate_weight == "requests" and tokens.rollout is None
    text = (
        "        budget: {}\n        gate_weight: cost\n"
        "        rollout: {steps: [shadow: 1m, enforce], analysis: {gate_weight: cost}}"
    )
    weighed = parse(_BUDGET_ROUTE % ("", text), settings).get("chat")
    assert weighed.gate_weight == "cost" and weighed.to_dict()["gate_weight"] == "cost"
    assert weighed.rollout.analysis.gate_weight == "cost"
    # a budget whose limits come from a limits service, per tenant
    text = "        external: {url: 'http://127.0.0.1:9/limits'}\n        budget: {}\n        cost_unit: tokens"
    tenants = parse(_BUDGET_ROUTE % ("", text), settings).get("chat")
    assert tenants.external is not None and tenants.budget is not None
    assert weighed.rollout.analysis.to_dict()["gate_weight"] == "cost"


@pytest.mark.parametrize(
    ("policy", "budget", "message"),
    [
        ("", "budget: {admit: maybe}", "routes[0].budget.admit: must be cover or positive, got 'maybe'"),
        ("", "budget: {on_expiry: refund}", "routes[0].budget.on_expiry: must be charge or release, got 'refund'"),
        ("", "budget: {max_reservations: 0}", "routes[0].budget.max_reservations: must be from 1 to 100000, got 0"),
        ("", "budget: {max_reservations: 100001}", "routes[0].budget.max_reservations: must be from 1 to 100000"),
        ("", "budget: {reservation_ttl: 0}", "routes[0].budget.reservation_ttl: must be more than 0s up to 86400s"),
        ("", "budget: {reservation_ttl: 2d}", "routes[0].budget.reservation_ttl: must be more than 0s up to 86400s"),
        ("", "budget: {ttl: 5m}", "routes[0].budget.ttl: unknown key 'ttl'"),
        (", algorithm: sliding_log", "budget: {}", "routes[0].budget: the local policy is a sliding_log"),
        (
            "",
            "distributed: {average: 1000, period: 1m, algorithm: sliding_log}\n        budget: {}",
            "the distributed policy is a sliding_log",
        ),
        ("", "cost_unit: tokens", "routes[0].cost_unit: this route's limits count requests: give it a budget block"),
        ("", "budget: {}\n        cost_unit: Tokens", "routes[0].cost_unit: must be a lower-case word of at most 32"),
        ("", "budget: {}\n        cost_unit: 12", "routes[0].cost_unit: must be a lower-case word"),
        ("", "budget: {}\n        cost_unit: " + "t" * 33, "routes[0].cost_unit: must be a lower-case word"),
        ("", "gate_weight: cost", "routes[0].gate_weight: this route's requests have no cost to weigh"),
        (
            "",
            "budget: {}\n        gate_weight: tokens",
            "routes[0].gate_weight: must be requests or cost, got 'tokens'",
        ),
        (
            "",
            "rollout: {steps: [shadow: 1m, enforce], analysis: {gate_weight: cost}}",
            "routes[0].rollout.analysis.gate_weight: this route's requests have no cost to weigh",
        ),
        (
            "",
            "budget: {}\n        rollout: {steps: [shadow: 1m, enforce], analysis: {gate_weight: bytes}}",
            "routes[0].rollout.analysis.gate_weight: must be requests or cost, got 'bytes'",
        ),
    ],
)
def test_a_budget_the_route_cannot_keep_is_refused_naming_the_field(settings, policy, budget, message):
    err = error(_BUDGET_ROUTE % (policy, "        " + budget), settings)
    assert message in str(err) and "rules.yaml:" in str(err)
