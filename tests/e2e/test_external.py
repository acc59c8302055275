"""External limits (a limits service over HTTP): the pure parts
(header filter, response validation, TTL order, per-key breakers with an injected clock,
the rules-file block) and the lookups against real limits services on loopback and the
session's real Redis: every TTL rule, singleflight, the semaphore, breakers opening,
probing and being evicted, the stale fallback, slow and garbage services, secrets."""

from __future__ import annotations

import asyncio
import email.utils
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis as redis_sync
from cp_server import metric_value
from ext_service import Answer, AppServer, RawServer, Script, closed_port_url, scripted_app

from control_plane.external import (
    STALE_TTL_S,
    BackendHosts,
    BreakerSet,
    ExternalConfig,
    ExternalManager,
    HeaderFilter,
    InvalidResponse,
    is_sensitive_header,
    parse_limits,
    resolve_ttl,
    response_forbids_storing,
)
from control_plane.observe.metrics import Metrics
from control_plane.rules import RouteRule, RulesError, parse_rules
from control_plane.settings import load_settings
from limiter.keys import KeyExtractor, KeyStrategy
from limiter.policy import Algorithm, Policy
from limiter.redis_limiter import make_redis_py_client
from limiter.resilience import BreakerState, CircuitBreaker, FailurePolicy

GOOD = {"average": 10, "burst": 5, "period": "1s"}


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


# =========================================================================== pure parts

# --------------------------------------------------------------------------- headers


def test_credentials_are_sensitive_in_any_spelling():
    for name in (
        "Authorization",
        "authorization",
        "Proxy-Authorization",
        "Cookie",
        "COOKIE",
        "Set-Cookie",
        "X-Api-Key",
        "x-api-key",
        "X-Auth-Token",
        "X-CSRF-Token",
        "X-Amz-Security-Token",
        "X-My-Secret",
        "X-Db-Password",
        "X-Service-Apikey",
        "X-Credentials",
    ):
        assert is_sensitive_header(name), name
    for name in ("X-Tenant-Id", "X-Plan", "User-Agent", "Accept", "X-Request-Id", "Content-Type"):
        assert not is_sensitive_header(name), name


def test_default_filter_forwards_everything_but_credentials():
    f = HeaderFilter()
    sent = f.apply(
        {"X-Tenant-Id": "acme", "Authorization": "Bearer s3cret", "Cookie": "sid=1", "X-Api-Key": "k", "Accept": "*/*"}
    )
    assert sent == {"X-Tenant-Id": "acme", "Accept": "*/*"}


def test_allow_list_is_exclusive_and_case_insensitive():
    f = ExternalConfig(url="http://x/", allow_list=("X-Tenant-Id", "x-plan")).header_filter
    assert f.apply({"x-tenant-id": "acme", "X-PLAN": "gold", "Accept": "*/*", "X-Other": "1"}) == {
        "x-tenant-id": "acme",
        "X-PLAN": "gold",
    }


def test_deny_list_adds_to_the_credentials():
    f = ExternalConfig(url="http://x/", deny_list=("X-Internal",)).header_filter
    assert f.apply({"X-Internal": "1", "x-internal": "2", "X-Tenant-Id": "acme", "Cookie": "c"}) == {
        "X-Tenant-Id": "acme"
    }


def test_the_routes_api_key_header_is_a_secret_too():
    f = ExternalConfig(url="http://x/", secret_headers=("X-Partner",)).header_filter
    assert f.apply({"X-Partner": "raw-key", "X-Tenant-Id": "a"}) == {"X-Tenant-Id": "a"}
    with pytest.raises(ValueError, match="carries credentials"):
        ExternalConfig(url="http://x/", allow_list=("x-partner",), secret_headers=("X-Partner",))


def test_allow_list_may_not_name_credentials_and_excludes_deny_list():
    with pytest.raises(ValueError, match="carries credentials"):
        ExternalConfig(url="http://x/", allow_list=("Authorization",))
    with pytest.raises(ValueError, match="not both"):
        ExternalConfig(url="http://x/", allow_list=("a",), deny_list=("b",))


def test_forwarded_headers_are_bounded():
    f = HeaderFilter()
    many = {f"X-H{i}": "v" for i in range(200)} | {"X-Big": "x" * 10_000}
    sent = f.apply(many)
    assert len(sent) == 64 and "X-Big" not in sent


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"url": "ftp://x/"}, "http:// or https://"),
        ({"url": "http:///nohost"}, "no host"),
        ({"url": "http://u:p@x/"}, "credentials"),
        ({"url": "http://x/#frag"}, "fragment"),
        ({"url": "http://x/ y"}, "whitespace"),
        ({"url": "http://x/", "timeout_s": 0}, "timeout"),
        ({"url": "http://x/", "timeout_s": 61}, "timeout"),
        ({"url": "http://x/", "cache_ttl_s": -1}, "cache_ttl"),
        ({"url": "http://x/", "max_concurrent_requests": 0}, "max_concurrent_requests"),
        ({"url": "http://x/", "deny_list": ("bad header",)}, "not an HTTP header name"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ExternalConfig(**kwargs)


def test_config_defaults_are_seed_000s():
    c = ExternalConfig(url="https://limits.internal/limits")
    assert (c.timeout_s, c.cache_ttl_s, c.max_concurrent_requests, c.allow_list, c.deny_list) == (
        5.0,
        60.0,
        50,
        None,
        (),
    )


# --------------------------------------------------------------------------- backend hosts


def test_backend_hosts_allow_list():
    h = BackendHosts("acme.internal, *.tenants.example, 10.0.0.5:8443")
    assert h.allows("http://acme.internal:9000/x")
    assert h.allows("https://eu.tenants.example/")
    assert not h.allows("https://tenants.example/")
    assert h.allows("https://10.0.0.5:8443/")
    assert not h.allows("http://10.0.0.5/")
    assert not h.allows("http://evil.example/")
    assert not BackendHosts("")
    with pytest.raises(ValueError):
        BackendHosts("http://acme.internal")
    with pytest.raises(ValueError):
        BackendHosts("host:notaport")


# --------------------------------------------------------------------------- responses


def test_full_response_is_typed():
    hosts = BackendHosts("*.backend.internal")
    lim = parse_limits(
        {
            "average": 1000,
            "burst": 200,
            "period": "1s",
            "tenant_key": "acme-corp",
            "failure_policy": "passthrough",
            "failure_code": 503,
            "backend_url": "http://acme.backend.internal:8080",
            "cache_max_age_seconds": 300,
            "cache_no_store": False,
            "future_field": [1],
        },
        backend_hosts=hosts,
    )
    assert lim.policy == Policy(average=1000, period=1.0, burst=200)
    assert lim.tenant_key == "acme-corp" and lim.bucket_key("tenant-42") == "t:acme-corp"
    assert lim.failure_policy is FailurePolicy.PASS_THROUGH and lim.failure_code == 503
    assert lim.backend_url == "http://acme.backend.internal:8080" and lim.backend_url_rejected is None
    assert lim.cache_max_age_seconds == 300 and lim.cache_no_store is False
    # what is cached is re-read identically
    assert parse_limits(lim.to_wire(), backend_hosts=hosts) == lim


def test_policy_uses_the_routes_algorithm_and_zero_average_is_unlimited():
    assert parse_limits(
        {"average": 5, "burst": 5, "period": "1m"}, algorithm=Algorithm.SLIDING_WINDOW
    ).policy == Policy(5, 60.0, 5, "sliding_window")
    assert parse_limits({"average": 0, "burst": 0, "period": "1s"}).policy.unlimited


def test_zero_values_mean_not_set():
    lim = parse_limits(
        {
            **GOOD,
            "tenant_key": "",
            "failure_policy": "",
            "failure_code": 0,
            "backend_url": "",
            "cache_max_age_seconds": 0,
            "cache_no_store": None,
        }
    )
    assert (
        lim.tenant_key,
        lim.failure_policy,
        lim.failure_code,
        lim.backend_url,
        lim.cache_max_age_seconds,
        lim.cache_no_store,
    ) == (None, None, None, None, None, False)
    assert lim.bucket_key("k") == "k"


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ([GOOD], "JSON object"),
        ("x", "JSON object"),
        ({"burst": 5, "period": "1s"}, "average: missing"),
        ({"average": 5, "period": "1s"}, "burst: missing"),
        ({"average": 5, "burst": 5}, "period: missing"),
        ({**GOOD, "average": "10"}, "average: must be a whole number"),
        ({**GOOD, "average": True}, "average: must be a whole number"),
        ({**GOOD, "average": 1.5}, "average: must be a whole number"),
        ({**GOOD, "average": -1}, "average: must be from 0"),
        ({**GOOD, "burst": 0}, "burst: must be at least 1"),
        ({**GOOD, "burst": 10**10}, "burst: must be from 0"),
        ({**GOOD, "period": 1}, "period: must be a duration string"),
        ({**GOOD, "period": "soon"}, "period: not a duration"),
        ({**GOOD, "period": "0s"}, "period"),
        ({**GOOD, "tenant_key": 42}, "tenant_key: must be a string"),
        ({**GOOD, "tenant_key": "bad\nkey"}, "tenant_key"),
        ({**GOOD, "tenant_key": " padded"}, "tenant_key"),
        ({**GOOD, "tenant_key": "x" * 300}, "tenant_key: too long"),
        ({**GOOD, "failure_policy": "sometimes"}, "failure_policy"),
        ({**GOOD, "failure_code": 200}, "failure_code"),
        ({**GOOD, "failure_code": "503"}, "failure_code"),
        ({**GOOD, "cache_max_age_seconds": -5}, "cache_max_age_seconds"),
        ({**GOOD, "cache_no_store": "yes"}, "cache_no_store"),
        ({**GOOD, "backend_url": ["http://x"]}, "backend_url: must be a string"),
    ],
)
def test_invalid_or_partial_responses_are_rejected(body, match):
    with pytest.raises(InvalidResponse, match=match):
        parse_limits(body, backend_hosts=BackendHosts("*.internal"))


def test_windowed_algorithm_needs_a_whole_request_per_window():
    with pytest.raises(InvalidResponse, match="average"):
        parse_limits({"average": 0.5, "burst": 1, "period": "1s"}, algorithm="fixed_window")


def test_backend_url_outside_the_allow_list_is_dropped_not_an_error():
    assert (
        parse_limits(
            {**GOOD, "backend_url": "http://evil.example/"}, backend_hosts=BackendHosts("*.internal")
        ).backend_url
        is None
    )
    lim = parse_limits({**GOOD, "backend_url": "http://evil.example/"}, backend_hosts=BackendHosts("*.internal"))
    assert "evil.example" in (lim.backend_url_rejected or "")
    lim = parse_limits({**GOOD, "backend_url": "http://a.internal/"}, backend_hosts=BackendHosts(""))
    assert lim.backend_url is None and "empty" in (lim.backend_url_rejected or "")
    lim = parse_limits({**GOOD, "backend_url": "javascript:alert(1)"}, backend_hosts=BackendHosts("*.internal"))
    assert lim.backend_url is None and "not a usable URL" in (lim.backend_url_rejected or "")


# --------------------------------------------------------------------------- TTL order

NOW = 1_700_000_000.0


def _http_date(t: float) -> str:
    return email.utils.formatdate(t, usegmt=True)


@pytest.mark.parametrize(
    ("cc", "expires", "no_store", "max_age", "ttl"),
    [
        # 1. Cache-Control: max-age=N
        ("max-age=120", None, False, None, 120.0),
        ('public, MAX-AGE="45"', None, False, None, 45.0),
        ("max-age=0", None, False, 300, 0.0),
        # 1 beats everything after it
        ("max-age=120, no-store", _http_date(NOW + 10), True, 300, 120.0),
        # 2. no-cache / no-store
        ("no-cache", None, False, 300, 0.0),
        ("no-store", _http_date(NOW + 100), False, 300, 0.0),
        # 3. Expires
        (None, _http_date(NOW + 90), False, None, 90.0),
        (None, _http_date(NOW + 90), True, 300, 90.0),  # beats the body
        (None, _http_date(NOW - 90), False, 300, 0.0),  # in the past
        (None, "0", False, 300, 0.0),  # invalid: already expired
        ("private", _http_date(NOW + 30), False, None, 30.0),  # other directives do not stop step 3
        # 4. body cache_no_store
        (None, None, True, 300, 0.0),
        # 5. body cache_max_age_seconds
        (None, None, False, 300, 300.0),
        ("max-age=abc", None, False, 300, 300.0),  # an unreadable max-age is no hint
        # 6. the route's default
        (None, None, False, None, 60.0),
        ("", "", False, None, 60.0),
    ],
)
def test_ttl_resolution_order(cc, expires, no_store, max_age, ttl):
    got = resolve_ttl(cc, expires, body_no_store=no_store, body_max_age=max_age, default_ttl_s=60.0, now=NOW)
    assert got == pytest.approx(ttl, abs=1.0)


def test_no_store_keeps_no_copy_at_all():
    assert response_forbids_storing("no-store", False)
    assert response_forbids_storing(None, True)
    assert not response_forbids_storing("no-cache", False)
    assert not response_forbids_storing("max-age=5", False)


# --------------------------------------------------------------------------- breakers


def test_breaker_opens_after_five_consecutive_failures():
    clock = FakeClock()
    seen: list[tuple[str, str, str]] = []
    bs = BreakerSet(clock=clock, on_transition=lambda b, f, t: seen.append((b.key, f.value, t.value)))
    for _ in range(4):
        assert bs.allow("k")
        bs.failure("k", "boom")
    bs.success("k")  # a success resets the count
    for _ in range(4):
        assert bs.allow("k")
        bs.failure("k", "boom")
    assert bs.get("k").state is BreakerState.CLOSED
    assert bs.allow("k")
    bs.failure("k", "boom")
    assert bs.get("k").state is BreakerState.OPEN and seen == [("k", "closed", "open")]
    assert not bs.allow("k")
    assert bs.allow("other")  # per key: other keys are not affected


def test_half_open_after_30s_lets_one_probe_through():
    clock = FakeClock()
    bs = BreakerSet(clock=clock)
    for _ in range(5):
        bs.allow("k")
        bs.failure("k", "boom")
    clock.advance(29.9)
    assert not bs.allow("k")
    assert bs.describe(bs.get("k"))["next_probe_in_s"] == pytest.approx(0.1)
    clock.advance(0.1)
    assert bs.allow("k")  # the probe
    assert bs.get("k").state is BreakerState.HALF_OPEN
    assert not bs.allow("k")  # one at a time
    bs.failure("k", "still down")  # re-opens for another 30 s
    assert bs.get("k").state is BreakerState.OPEN
    clock.advance(29)
    assert not bs.allow("k")
    clock.advance(1)
    assert bs.allow("k")
    bs.success("k")
    assert bs.get("k").state is BreakerState.CLOSED and bs.get("k").failures == 0
    assert bs.allow("k") and bs.allow("k")


def test_abandoned_probe_frees_the_slot():
    clock = FakeClock()
    bs = BreakerSet(clock=clock)
    for _ in range(5):
        bs.allow("k")
        bs.failure("k", "x")
    clock.advance(30)
    assert bs.allow("k")
    bs.abandon("k")
    assert bs.allow("k")


def test_idle_breakers_are_evicted_after_60s():
    clock = FakeClock()
    bs = BreakerSet(clock=clock)
    for k in ("a", "b"):
        for _ in range(5):
            bs.allow(k)
            bs.failure(k, "x")
    clock.advance(30)
    bs.allow("b")  # b used (its probe), a idle
    bs.failure("b", "x")
    clock.advance(30.5)  # a idle 60.5 s, b 30.5 s
    assert bs.sweep() == 1
    assert "a" not in bs and "b" in bs
    clock.advance(60)
    bs.allow("c")  # use triggers the sweep
    assert "b" not in bs and "c" in bs and bs.evicted == 2
    assert bs.allow("a") and bs.get("a").state is BreakerState.CLOSED  # a fresh breaker


def test_key_breakers_are_the_shared_state_machine():
    clock = FakeClock()
    bs = BreakerSet(clock=clock)
    for _ in range(5):
        bs.allow("k")
        bs.failure("k", "x")
    b = bs.get("k")
    assert isinstance(b, CircuitBreaker) and b.failures == b.consecutive_failures == 5
    clock.advance(30)
    assert bs.allow("k") and b.trial_in_flight
    clock.advance(2)
    bs.failure("k", "still down")  # the probe failed: open again, counted from this opening
    assert bs.describe(b)["open_for_s"] == 0.0 and bs.describe(b)["next_probe_in_s"] == 30.0
    clock.advance(5)
    assert bs.describe(b)["open_for_s"] == 5.0 and b.open_for_s() == 37.0  # the outage is older


def test_breaker_count_is_bounded():
    bs = BreakerSet(clock=FakeClock(), max_breakers=3)
    for k in "abcd":
        bs.allow(k)
    assert len(bs) == 3 and "a" not in bs


def test_breaker_snapshot_lists_open_first():
    clock = FakeClock()
    bs = BreakerSet(clock=clock)
    bs.allow("fine")
    for _ in range(5):
        bs.allow("bad")
        bs.failure("bad", "HTTP 500")
    snap = bs.snapshot()
    assert [b["key"] for b in snap] == ["bad", "fine"]
    assert snap[0] == {
        "key": "bad",
        "state": "open",
        "failures": 5,
        "total_failures": 5,
        "next_probe_in_s": 30.0,
        "open_for_s": 0.0,
        "idle_s": 0.0,
        "last_error": "HTTP 500",
    }


# --------------------------------------------------------------------------- rules file

RULES = """\
version: 1
routes:
  - name: tenants
    match: {path: /api/**}
    key: {strategy: header, header: X-Tenant-Id}
    local: {average: 3, period: 1s}
    external:
      url: http://127.0.0.1:9100/limits
"""


def _rules(extra: str) -> Any:
    return parse_rules(RULES + extra, load_settings(), source="rules.yaml")


def test_rules_external_block_defaults():
    rule = _rules("").get("tenants")
    assert rule.external == ExternalConfig(url="http://127.0.0.1:9100/limits")
    assert rule.to_dict()["external"] == {
        "url": "http://127.0.0.1:9100/limits",
        "timeout_s": 5.0,
        "cache_ttl_s": 60.0,
        "max_concurrent_requests": 50,
        "header_filter": {"deny_list": []},
    }


def test_rules_external_block_full():
    rule = _rules(
        "      timeout: 250ms\n"
        "      cache_ttl: 2m\n"
        "      max_concurrent_requests: 8\n"
        "      header_filter:\n"
        "        allow_list: [X-Tenant-Id, X-Plan]\n"
    ).get("tenants")
    assert rule.external == ExternalConfig(
        url="http://127.0.0.1:9100/limits",
        timeout_s=0.25,
        cache_ttl_s=120.0,
        max_concurrent_requests=8,
        allow_list=("x-tenant-id", "x-plan"),
    )


def test_api_key_routes_never_forward_their_key_header():
    text = RULES.replace("{strategy: header, header: X-Tenant-Id}", "{strategy: apiKey, api_key_header: X-Partner-Key}")
    rule = parse_rules(text, load_settings()).get("tenants")
    assert rule.external.header_filter.apply({"X-Partner-Key": "raw", "X-Tenant-Id": "a"}) == {"X-Tenant-Id": "a"}


@pytest.mark.parametrize(
    ("extra", "line", "field", "message"),
    [
        ("      timeout: 0s\n", 9, "routes[0].external.timeout", "more than 0s"),
        ("      timeout: soon\n", 9, "routes[0].external.timeout", "invalid duration"),
        ("      cache_ttl: 2d\n", 9, "routes[0].external.cache_ttl", "up to 86400s"),
        ("      max_concurrent_requests: 0\n", 9, "routes[0].external.max_concurrent_requests", "from 1 to 10000"),
        ("      max_concurrent_requests: many\n", 9, "routes[0].external.max_concurrent_requests", "whole number"),
        (
            "      header_filter:\n        allow_list: [X-Tenant-Id]\n        deny_list: [X-Other]\n",
            11,
            "routes[0].external.header_filter.deny_list",
            "not both",
        ),
        (
            "      header_filter:\n        allow_list: [X-Tenant-Id, Cookie]\n",
            10,
            "routes[0].external.header_filter.allow_list[1]",
            "carries credentials",
        ),
        (
            "      header_filter:\n        allow_list: X-Tenant-Id\n",
            10,
            "routes[0].external.header_filter.allow_list",
            "must be a list",
        ),
        (
            "      header_filter:\n        allowlist: [X-Tenant-Id]\n",
            10,
            "routes[0].external.header_filter.allowlist",
            "did you mean 'allow_list'",
        ),
        ("      enabled: true\n", 9, "routes[0].external.enabled", "remove the block"),
        ("      grpc: {address: x}\n", 9, "routes[0].external.grpc", "only HTTP"),
    ],
)
def test_rules_external_errors_name_file_line_and_field(extra, line, field, message):
    with pytest.raises(RulesError) as ei:
        _rules(extra)
    err = ei.value
    assert (err.path, err.line, err.field) == ("rules.yaml", line, field), str(err)
    assert message in err.message


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://limits/x", "http:// or https://"),
        ("http://user:pw@limits/x", "credentials"),
        ("limits:9100", "http:// or https://"),
    ],
)
def test_rules_external_url_errors(url, message):
    with pytest.raises(RulesError) as ei:
        parse_rules(RULES.replace("http://127.0.0.1:9100/limits", url), load_settings(), source="rules.yaml")
    assert (ei.value.line, ei.value.field) == (8, "routes[0].external.url") and message in ei.value.message


def test_rules_external_needs_a_url():
    with pytest.raises(RulesError) as ei:
        parse_rules(
            RULES.replace("      url: http://127.0.0.1:9100/limits\n", "      timeout: 1s\n"),
            load_settings(),
            source="rules.yaml",
        )
    assert (ei.value.line, ei.value.field) == (
        7,
        "routes[0].external",
    ) and "missing required key 'url'" in ei.value.message


# =========================================================================== lookups (IO)


def make_rule(
    url: str,
    *,
    name: str = "tenants",
    algorithm: str = "token_bucket",
    strategy: KeyStrategy = KeyStrategy.HEADER,
    **ext: Any,
) -> RouteRule:
    key = (
        KeyExtractor(strategy, header="X-Tenant-Id")
        if strategy is KeyStrategy.HEADER
        else KeyExtractor(strategy, api_key_header="X-Partner-Key")
    )
    policy = Policy(3, 1.0, 3, algorithm)
    secret = ("X-Partner-Key",) if strategy is KeyStrategy.API_KEY else ()
    return RouteRule(
        name=name,
        methods=None,
        path_pattern="/**",
        key=key,
        local=policy,
        distributed=policy,
        external=ExternalConfig(url=url, secret_headers=secret, **ext),
    )


@asynccontextmanager
async def manager(redis_url: str | None, **kwargs: Any) -> AsyncIterator[ExternalManager]:
    client = make_redis_py_client(redis_url) if redis_url else None
    m = ExternalManager(
        namespace=kwargs.pop("namespace", f"ext-{uuid.uuid4().hex[:8]}"),
        client=client,
        metrics=kwargs.pop("metrics", Metrics()),
        **kwargs,
    )
    try:
        yield m
    finally:
        await m.aclose()
        if client is not None:
            await client.aclose()


@pytest.fixture
def script():
    return Script()


@pytest.fixture
def service(script):
    with AppServer(scripted_app(script)) as srv:
        yield srv


def limits_url(srv: AppServer) -> str:
    return srv.url + "/limits"


async def resolve(m: ExternalManager, rule: RouteRule, key: str = "acme", headers: dict[str, str] | None = None):
    return await m.resolve(rule, key, "GET", "/api/orders", headers or {"X-Tenant-Id": key})


async def settle(m: ExternalManager, timeout: float = 2.0) -> None:
    """Wait for the background cache writes to land."""
    await m.join(timeout)


# --------------------------------------------------------------------------- the happy path


async def test_answer_is_applied_and_cached_in_redis_for_every_replica(redis_url, script, service):
    script.default = Answer(
        body={"average": 100, "burst": 20, "period": "1s", "tenant_key": "acme-corp"},
        headers={"Cache-Control": "max-age=120"},
    )
    rule = make_rule(limits_url(service))
    ns = f"ext-{uuid.uuid4().hex[:8]}"
    async with manager(redis_url, namespace=ns) as m:
        res = await resolve(m, rule)
        assert (
            res.source == "external"
            and res.limits.policy == Policy(100, 1.0, 20)
            and res.limits.bucket_key("acme") == "t:acme-corp"
        )
        await settle(m)
        assert (await resolve(m, rule)).source == "cache"
    r = redis_sync.Redis.from_url(redis_url)
    assert 110_000 < r.pttl(f"rl:{ns}:extcache:{{tenants:acme}}") <= 120_000
    assert STALE_TTL_S - 5 < r.ttl(f"rl:{ns}:extcache:stale:{{tenants:acme}}") <= STALE_TTL_S
    async with manager(redis_url, namespace=ns) as other:  # another replica: same cache
        res = await resolve(other, rule)
        assert res.source == "cache" and res.limits.tenant_key == "acme-corp"
    assert script.calls == 1
    req = script.requests[0]["json"]
    assert req == {"key": "acme", "headers": {"X-Tenant-Id": "acme"}, "method": "GET", "path": "/api/orders"}


@pytest.mark.parametrize(
    ("headers", "body_extra", "fresh_ttl", "stale"),
    [
        ({"Cache-Control": "max-age=45"}, {"cache_max_age_seconds": 300}, 45, True),  # 1
        (
            {"Cache-Control": "no-cache"},
            {"cache_max_age_seconds": 300},
            None,
            True,
        ),  # 2 (no-cache: the stale copy stays)
        ({"Cache-Control": "no-store"}, {}, None, False),  # 2 (no-store: no copy at all)
        (
            {"Expires": "@+90"},
            {"cache_no_store": True},
            90,
            False,
        ),  # 3 (beats the body's TTL; no-store still means no copy)
        ({"Expires": "@-90"}, {}, None, True),  # 3, in the past
        ({}, {"cache_no_store": True, "cache_max_age_seconds": 300}, None, False),  # 4
        ({}, {"cache_max_age_seconds": 300}, 300, True),  # 5
        ({}, {}, 7, True),  # 6: the route's cache_ttl
    ],
)
async def test_each_ttl_rule_end_to_end(redis_url, script, service, headers, body_extra, fresh_ttl, stale):
    hdrs = {k: (_http_date(time.time() + int(v[1:])) if v.startswith("@") else v) for k, v in headers.items()}
    script.default = Answer(body={**GOOD, **body_extra}, headers=hdrs)
    rule = make_rule(limits_url(service), cache_ttl_s=7)
    ns = f"ext-{uuid.uuid4().hex[:8]}"
    async with manager(redis_url, namespace=ns) as m:
        assert (await resolve(m, rule)).source == "external"
        await settle(m)
        second = await resolve(m, rule)
        assert second.source == ("cache" if fresh_ttl else "external")
        await settle(m)
    r = redis_sync.Redis.from_url(redis_url)
    pttl = r.pttl(f"rl:{ns}:extcache:{{tenants:acme}}")
    if fresh_ttl is None:
        assert pttl == -2 and script.calls == 2
    else:
        assert (fresh_ttl - 3) * 1000 < pttl <= fresh_ttl * 1000 and script.calls == 1
    assert r.exists(f"rl:{ns}:extcache:stale:{{tenants:acme}}") == (1 if stale else 0)


async def test_without_redis_there_is_no_cache(script, service):
    rule = make_rule(limits_url(service))
    async with manager(None) as m:
        for _ in range(3):
            assert (await resolve(m, rule)).source == "external"
        assert m.snapshot()["cache"]["enabled"] is False
    assert script.calls == 3


async def test_cache_is_skipped_while_redis_is_down(script, service):
    """``cache_ok`` false (the engine's Redis breaker is open): no Redis command at all."""
    rule = make_rule(limits_url(service))
    dead = f"redis://127.0.0.1:{closed_port_url().split(':')[2].split('/')[0]}"
    async with manager(dead, cache_ok=lambda: False) as m:
        t0 = time.monotonic()
        assert (await resolve(m, rule)).source == "external"
        assert time.monotonic() - t0 < 1.0
        await settle(m)
        assert m.cache_errors == 0
    # and with Redis unreachable but not yet known to be down, the cache costs at most its bound
    async with manager(dead, cache_timeout_s=0.2) as m:
        t0 = time.monotonic()
        assert (await resolve(m, rule)).source == "external"
        assert time.monotonic() - t0 < rule.external.timeout_s
        await settle(m)
        assert m.cache_errors >= 1


async def test_a_bad_cached_value_is_a_miss(redis_url, script, service):
    rule = make_rule(limits_url(service))
    ns = f"ext-{uuid.uuid4().hex[:8]}"
    r = redis_sync.Redis.from_url(redis_url)
    r.set(f"rl:{ns}:extcache:{{tenants:acme}}", b'{"average": "lots"}', ex=60)
    async with manager(redis_url, namespace=ns) as m:
        assert (await resolve(m, rule)).source == "external"
    assert script.calls == 1


# --------------------------------------------------------------------------- concurrency


async def test_singleflight_concurrent_misses_share_one_call(redis_url, script, service):
    script.default = Answer(body={"average": 42, "burst": 42, "period": "1s"}, delay_s=0.3)
    rule = make_rule(limits_url(service))
    async with manager(redis_url) as m:
        results = await asyncio.gather(*[resolve(m, rule) for _ in range(25)])
        assert {r.source for r in results} == {"external"}
        assert {r.limits.average for r in results} == {42}
        assert m.shared_calls == 24
        # distinct keys are not merged
        results = await asyncio.gather(*[resolve(m, rule, key=f"t{i % 3}") for i in range(12)])
        assert {r.source for r in results} == {"external"}
    assert script.calls == 1 + 3
    assert script.calls_by_key["acme"] == 1


async def test_semaphore_caps_concurrent_calls(script, service):
    script.default = Answer(delay_s=0.2)
    rule = make_rule(limits_url(service), max_concurrent_requests=3)
    async with manager(None) as m:
        results = await asyncio.gather(*[resolve(m, rule, key=f"k{i}") for i in range(12)])
    assert {r.source for r in results} == {"external"}
    assert script.calls == 12
    assert script.peak == 3


async def test_waiting_for_a_slot_is_bounded_by_the_timeout(script, service):
    script.default = Answer(delay_s=2.0)
    rule = make_rule(limits_url(service), max_concurrent_requests=1, timeout_s=0.3)
    async with manager(None) as m:
        t0 = time.monotonic()
        results = await asyncio.gather(*[resolve(m, rule, key=f"k{i}") for i in range(4)])
        elapsed = time.monotonic() - t0
        await asyncio.sleep(0.1)
        errors = dict(m.errors)
        breakers = m.snapshot()["breakers"]
    assert elapsed < 0.3 + 0.25
    assert {r.source for r in results} == {"static"}
    assert script.peak == 1
    # at most one more call starts in the instant the first slot frees up; the rest never get one
    assert script.calls <= 2 and errors.get("overloaded", 0) >= 2
    assert errors.get("timeout", 0) == script.calls and errors.get("timeout", 0) + errors.get("overloaded", 0) == 4
    # only calls that really failed count against their key's breaker
    assert sum(b["failures"] for b in breakers) == script.calls


# --------------------------------------------------------------------------- breakers


async def test_breaker_opens_after_five_failures_and_probes_after_30s(redis_url, script, service):
    clock = FakeClock()
    events: list[dict[str, Any]] = []
    script.default = Answer(status=500, body={"error": "db down"})
    rule = make_rule(limits_url(service))
    metrics = Metrics()
    async with manager(redis_url, clock=clock, publish=events.append, metrics=metrics) as m:
        for _ in range(5):
            res = await resolve(m, rule)
            assert res.source == "static" and "HTTP 500" in res.error
        assert script.calls == 5
        snap = m.snapshot()
        assert snap["breakers_open"] == 1
        assert snap["breakers"][0] | {"idle_s": 0} == {
            "route": "tenants",
            "key": "acme",
            "state": "open",
            "failures": 5,
            "total_failures": 5,
            "next_probe_in_s": 30.0,
            "open_for_s": 0.0,
            "idle_s": 0,
            "last_error": "the limits service answered HTTP 500",
        }
        # open: no calls, immediately
        t0 = time.monotonic()
        for _ in range(10):
            res = await resolve(m, rule)
            assert res.source == "static" and "circuit open" in res.error
        assert time.monotonic() - t0 < 0.5 and script.calls == 5
        assert (await resolve(m, rule, key="other")).source == "static" and script.calls == 6  # per key
        clock.advance(29.9)
        await resolve(m, rule)
        assert script.calls == 6
        # half-open after 30 s: one probe, shared by everyone asking meanwhile
        clock.advance(0.1)
        script.default = Answer(body=GOOD, delay_s=0.2)
        results = await asyncio.gather(*[resolve(m, rule) for _ in range(5)])
        assert {r.source for r in results} == {"external"} and script.calls == 7
        b = m.snapshot()["breakers"]
        assert [x for x in b if x["key"] == "acme"][0]["state"] == "closed"
    assert [(e["key"], e["from"], e["to"]) for e in events if e["key"] == "acme"] == [
        ("acme", "closed", "open"),
        ("acme", "open", "half_open"),
        ("acme", "half_open", "closed"),
    ]
    text = metrics.render().decode()
    assert metric_value(text, "rate_limit_external_breaker_transitions_total", to="open") == 1
    assert metric_value(text, "rate_limit_external_calls_total", result="error") == 6
    assert metric_value(text, "rate_limit_external_errors_total", reason="circuit_open") == 11


async def test_failed_probe_reopens_for_another_30s(script, service):
    clock = FakeClock()
    script.default = Answer(status=503)
    rule = make_rule(limits_url(service))
    async with manager(None, clock=clock) as m:
        for _ in range(5):
            await resolve(m, rule)
        clock.advance(30)
        assert (await resolve(m, rule)).source == "static" and script.calls == 6  # the probe failed
        assert m.snapshot()["breakers"][0]["state"] == "open"
        clock.advance(15)
        await resolve(m, rule)
        assert script.calls == 6
        clock.advance(15)
        await resolve(m, rule)
        assert script.calls == 7


async def test_idle_breakers_are_evicted(script, service):
    clock = FakeClock()
    script.default = Answer(status=500)
    rule = make_rule(limits_url(service))
    async with manager(None, clock=clock) as m:
        for key in ("a", "b"):
            for _ in range(5):
                await resolve(m, rule, key=key)
        assert m.snapshot()["breakers_total"] == 2 and m.snapshot()["breakers_open"] == 2
        clock.advance(59)
        await resolve(m, rule, key="b")  # probe due: b is used
        clock.advance(2)  # a idle for 61 s
        snap = m.snapshot()
        assert [b["key"] for b in snap["breakers"]] == ["b"]
        clock.advance(61)
        assert m.snapshot()["breakers_total"] == 0


# --------------------------------------------------------------------------- fallbacks


async def test_stale_copy_then_static_when_the_service_fails(redis_url, script, service):
    clock = FakeClock()
    script.default = Answer(body={"average": 77, "burst": 7, "period": "1s"}, headers={"Cache-Control": "max-age=1"})
    rule = make_rule(limits_url(service))
    ns = f"ext-{uuid.uuid4().hex[:8]}"
    r = redis_sync.Redis.from_url(redis_url)
    async with manager(redis_url, namespace=ns, clock=clock) as m:
        assert (await resolve(m, rule)).source == "external"
        await settle(m)
        r.delete(f"rl:{ns}:extcache:{{tenants:acme}}")  # the fresh copy expired
        script.default = Answer(status=500)
        res = await resolve(m, rule)
        assert res.source == "stale" and res.limits.average == 77 and "HTTP 500" in res.error
        for _ in range(4):
            await resolve(m, rule)
        # breaker open: stale without a call
        calls = script.calls
        res = await resolve(m, rule)
        assert res.source == "stale" and "circuit open" in res.error and script.calls == calls
        # a key with no stale copy gets the static policy
        res = await resolve(m, rule, key="newcomer")
        assert res.source == "static" and res.limits is None
        assert m.snapshot()["cache"]["stale"] == 6


async def test_slow_service_never_delays_beyond_the_timeout(script, service):
    script.default = Answer(delay_s=3.0)
    rule = make_rule(limits_url(service), timeout_s=0.3)
    async with manager(None) as m:
        for key in ("a", "b"):
            t0 = time.monotonic()
            res = await resolve(m, rule, key=key)
            assert time.monotonic() - t0 < 0.3 + 0.2
            assert res.source == "static" and "0.3s" in res.error
        await asyncio.sleep(0.1)
        assert m.calls["timeout"] == 2


@pytest.mark.parametrize("mode", ["garbage", "drip", "hang", "close", "huge", "bad_length"])
async def test_misbehaving_transport_falls_back_within_the_timeout(mode):
    with RawServer(mode) as raw:
        rule = make_rule(raw.url, timeout_s=0.5)
        async with manager(None) as m:
            for _ in range(3):
                t0 = time.monotonic()
                res = await resolve(m, rule)
                assert time.monotonic() - t0 < 0.5 + 0.3, mode
                assert res.source == "static" and res.error, mode


@pytest.mark.parametrize(
    "answer",
    [
        Answer(raw=b"<html>oops</html>"),
        Answer(raw=b""),
        Answer(raw=b'{"average": 10, "burst": 5'),
        Answer(body=[GOOD]),
        Answer(body={"average": 10, "burst": 5}),
        Answer(body={**GOOD, "average": "ten"}),
        Answer(body={**GOOD, "period": "forever"}),
        Answer(body={**GOOD, "tenant_key": "bad\r\nkey"}),
        Answer(body={**GOOD, "failure_policy": "shrug"}),
        Answer(body=GOOD, status=404),
        Answer(body=GOOD, status=302, headers={"Location": "http://127.0.0.1:1/"}),
        Answer(body=GOOD, status=204),
    ],
)
async def test_garbage_answers_are_never_applied(redis_url, script, service, answer):
    script.default = answer
    rule = make_rule(limits_url(service), timeout_s=1.0)
    ns = f"ext-{uuid.uuid4().hex[:8]}"
    async with manager(redis_url, namespace=ns) as m:
        t0 = time.monotonic()
        res = await resolve(m, rule)
        assert time.monotonic() - t0 < 1.0
        assert res.source == "static" and res.limits is None and res.error
        await settle(m)
    assert redis_sync.Redis.from_url(redis_url).keys(f"rl:{ns}:extcache*") == []


async def test_unreachable_service_falls_back_quickly():
    rule = make_rule(closed_port_url(), timeout_s=2.0)
    async with manager(None) as m:
        t0 = time.monotonic()
        res = await resolve(m, rule)
        assert res.source == "static" and "ConnectError" in res.error
        assert time.monotonic() - t0 < 1.0


# --------------------------------------------------------------------------- secrets

SECRETS = {
    "Authorization": "Bearer sk-live-111",
    "Proxy-Authorization": "Basic c2VjcmV0",
    "Cookie": "session=sess-222",
    "X-Api-Key": "apikey-333",
    "X-Auth-Token": "tok-444",
    "X-Partner-Key": "partner-555",
    "X-Internal-Secret": "int-666",
}


@pytest.mark.parametrize("filter_kwargs", [{}, {"deny_list": ("X-Other",)}, {"allow_list": ("X-Tenant-Id", "X-Plan")}])
async def test_sensitive_headers_never_leave_the_process(redis_url, script, service, filter_kwargs):
    script.default = Answer(body={**GOOD, "tenant_key": "acme"})
    rule = make_rule(limits_url(service), strategy=KeyStrategy.API_KEY, **filter_kwargs)
    ns = f"ext-{uuid.uuid4().hex[:8]}"
    async with manager(redis_url, namespace=ns) as m:
        res = await m.resolve(
            rule,
            "apikey:0123456789abcdef0123456789abcdef",
            "POST",
            "/api/x",
            {**SECRETS, "X-Tenant-Id": "acme", "X-Plan": "gold"},
        )
        assert res.source == "external"
        await settle(m)
    assert script.calls == 1
    seen = script.requests[0]
    wire = seen["raw"] + repr(seen["http_headers"]).encode()
    for name, value in SECRETS.items():
        assert value.encode() not in wire, name
        assert name.lower() not in {h.lower() for h in seen["json"]["headers"]}, name
    assert seen["json"]["headers"]["X-Tenant-Id"] == "acme"
    # and nothing secret is cached either
    r = redis_sync.Redis.from_url(redis_url)
    for k in r.keys(f"rl:{ns}:*"):
        assert not any(v.encode() in r.get(k) for v in SECRETS.values())


# --------------------------------------------------------------------------- reporting


async def test_snapshot_reports_cache_calls_and_sources(redis_url, script, service):
    rule = make_rule(limits_url(service), max_concurrent_requests=7)
    metrics = Metrics()
    async with manager(redis_url, metrics=metrics, backend_hosts="*.backend.internal") as m:
        await resolve(m, rule)
        await settle(m)
        await resolve(m, rule)
        await resolve(m, rule)
        snap = m.snapshot()
    assert snap["routes"][0]["route"] == "tenants" and snap["routes"][0]["max_concurrent_requests"] == 7
    assert snap["cache"] == {
        "enabled": True,
        "available": True,
        "hit": 2,
        "miss": 1,
        "stale": 0,
        "hit_ratio": 0.6667,
        "errors": 0,
    }
    assert snap["calls"]["ok"] == 1 and snap["sources"] == {"external": 1, "cache": 2, "stale": 0, "static": 0}
    assert snap["backend_hosts"] == ["*.backend.internal"]
    text = metrics.render().decode()
    assert metric_value(text, "rate_limit_external_cache_total", result="hit") == 2
    assert metric_value(text, "rate_limit_external_cache_total", result="miss") == 1
    assert metric_value(text, "rate_limit_external_calls_total", result="ok") == 1
    assert metric_value(text, "rate_limit_external_limits_total", route="tenants", source="cache") == 2


async def test_breaker_events_are_throttled(script, service):
    events: list[dict[str, Any]] = []
    script.default = Answer(status=500)
    rule = make_rule(limits_url(service))
    async with manager(None, publish=events.append, wall_clock=lambda: 5.0) as m:
        for _ in range(5):
            await asyncio.gather(*[resolve(m, rule, key=f"k{i}") for i in range(30)])
        assert m.snapshot()["breakers_open"] == 30
        assert len(events) == 20 and m.events_suppressed == 10


def test_resolvers_survive_reloads_with_the_same_block():
    m = ExternalManager(namespace="x")
    a = make_rule("http://127.0.0.1:1/limits")
    m.configure([a])
    first = m.resolvers["tenants"]
    first.breakers.failure("k", "x")
    m.configure([make_rule("http://127.0.0.1:1/limits")])  # reloaded, identical
    assert m.resolvers["tenants"] is first and first.breakers.get("k").failures == 1
    m.configure([make_rule("http://127.0.0.1:2/limits")])  # changed
    assert m.resolvers["tenants"] is not first
    m.configure([])
    assert m.resolvers == {}


async def test_cache_and_stale_copy_on_standalone_and_cluster(any_redis_url, script, service):
    """The fresh and stale copies share a hash tag: one MGET reads both, on a cluster too."""
    script.default = Answer(body={"average": 31, "burst": 3, "period": "1s"}, headers={"Cache-Control": "max-age=1"})
    rule = make_rule(limits_url(service))
    ns = f"ext-{uuid.uuid4().hex[:8]}"
    async with manager(any_redis_url, namespace=ns) as m:
        assert (await resolve(m, rule)).source == "external"
        await settle(m)
        assert (await resolve(m, rule)).source == "cache"
        await asyncio.sleep(1.1)  # the fresh copy expires; the stale one stays
        script.default = Answer(status=500)
        res = await resolve(m, rule)
        assert res.source == "stale" and res.limits.average == 31
        assert m.cache_errors == 0
    assert script.calls == 2
