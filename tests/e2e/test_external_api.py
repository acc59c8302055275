"""External limits through a real control plane: uvicorn on loopback, real Redis, the
example limits service (``examples/limits_service.py``) and scripted ones. Decisions take
the tenant's limits (and say where they came from), ``GET /v1/external``, the event
stream, metrics, batches, fallbacks when the service misbehaves, secrets."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import redis as redis_sync
from cp_server import ControlPlaneServer, metric_value, wait_until, write_rules
from ext_service import Answer, AppServer, RawServer, Script, closed_port_url, load_example_service, scripted_app


def rules_for(url: str, *, timeout: str = "2s", extra: str = "") -> str:
    return f"""\
version: 1
routes:
  - name: tenants
    match: {{path: /api/tenants/**}}
    key: {{strategy: header, header: X-Tenant-Id}}
    local: {{average: 3, period: 1s, burst: 3}}
    distributed: {{average: 3, period: 1s, burst: 3}}
    external:
      url: {url}
      timeout: {timeout}
      cache_ttl: 60s
      header_filter: {{allow_list: [X-Tenant-Id, X-Plan]}}
{extra}  - name: search
    match: {{path: /api/search/**}}
    key: {{strategy: header, header: X-Client-Id}}
    local: {{average: 10, period: 1s, burst: 10}}
"""


@pytest.fixture(scope="module")
def example_service():
    module = load_example_service()
    with AppServer(module.create_app()) as srv:
        yield srv


@pytest.fixture
def make_cp(redis_url, tmp_path):
    servers: list[ControlPlaneServer] = []

    def make(rules: str, **overrides: Any) -> ControlPlaneServer:
        overrides.setdefault("redis_url", redis_url)
        overrides.setdefault("rules_path", write_rules(tmp_path, rules, name=f"rules-{len(servers)}.yaml"))
        cp = ControlPlaneServer(**overrides)
        servers.append(cp)
        return cp.start()

    yield make
    for s in reversed(servers):
        s.stop()


def tenant(c: httpx.Client, name: str, **extra: Any) -> httpx.Response:
    headers = {"X-Tenant-Id": name, **extra.pop("headers", {})}
    return c.post("/v1/decide", json={"method": "GET", "path": "/api/tenants/orders", "headers": headers, **extra})


def test_decisions_take_each_tenants_limits_from_the_service(make_cp, example_service):
    cp = make_cp(rules_for(example_service.url + "/limits"), external_backend_hosts="*.backend.internal")
    with cp.client() as c:
        r = tenant(c, "acme")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["limits_source"] == "external"
        assert body["key"] == "t:acme"  # tenant_key: the bucket is the tenant's
        assert body["backend_url"] == "http://acme.backend.internal:8080"
        assert r.headers["X-RateLimit-Limit"] == "50"
        second = tenant(c, "acme").json()
        assert second["limits_source"] == "cache" and second["local"]["limit"] == 50
        # acme-eu maps to the same tenant key: one shared bucket
        eu = tenant(c, "acme-eu").json()
        assert eu["key"] == "t:acme" and eu["limits_source"] == "external"
        shared = [
            b for b in c.get("/v1/buckets", params={"route": "tenants"}).json()["buckets"] if b["key"] == "t:acme"
        ]
        assert shared and shared[0]["recent_requests"] == 3
        # globex: 5 per second, enforced by the (local) limiter in shadow mode
        batch = c.post(
            "/v1/decide/batch",
            json={"requests": [{"method": "GET", "path": "/api/tenants/x", "headers": {"X-Tenant-Id": "globex"}}] * 7},
        ).json()
        codes = [d["status_code"] for d in batch["decisions"]]
        assert codes == [200] * 5 + [429] * 2, codes  # decided within microseconds: no refill
        g = tenant(c, "globex")
        assert (
            g.json()["limits_source"] == "cache"
            and g.json()["key"] == "globex"
            and g.headers["X-RateLimit-Limit"] == "5"
        )
        # an unknown tenant gets the service's free plan (2/s), not the file's 3/s
        free = tenant(c, "hooli")
        assert free.json()["limits_source"] == "external" and free.headers["X-RateLimit-Limit"] == "2"
        # routes without external limits are unchanged
        s = c.post("/v1/decide", json={"route": "search", "key": "alice"}).json()
        assert s["limits_source"] is None and s["backend_url"] is None
    r = redis_sync.Redis.from_url(cp.settings.redis_url)
    ns = cp.namespace
    assert 25_000 < r.pttl(f"rl:{ns}:extcache:{{tenants:acme}}") <= 30_000  # Cache-Control: max-age=30
    assert 5_000 < r.pttl(f"rl:{ns}:extcache:{{tenants:globex}}") <= 10_000  # body cache_max_age_seconds: 10
    assert 55_000 < r.pttl(f"rl:{ns}:extcache:{{tenants:hooli}}") <= 60_000  # no hints: the route's cache_ttl
    assert r.exists(f"rl:{ns}:extcache:stale:{{tenants:acme}}") == 1


def test_backend_url_is_dropped_without_an_allow_list(make_cp, example_service):
    cp = make_cp(rules_for(example_service.url + "/limits"))
    with cp.client() as c:
        body = tenant(c, "acme").json()
        assert body["limits_source"] == "external" and body["backend_url"] is None and body["key"] == "t:acme"
        ext = c.get("/v1/external").json()
        assert ext["backend_url_rejected"] == 1 and ext["backend_hosts"] == []
        assert metric_value(c.get("/metrics").text, "rate_limit_external_backend_url_rejected_total") == 1


def test_failure_policy_and_code_come_from_the_tenant(make_cp, redis_url):
    """initech fails closed with 503 when Redis is down; the route itself would fall back."""
    script = Script()
    script.default = Answer(
        body={"average": 100, "burst": 20, "period": "1m", "failure_policy": "failclosed", "failure_code": 503}
    )
    with AppServer(scripted_app(script)) as svc:
        cp = make_cp(rules_for(svc.url + "/limits"), redis_url=redis_url)
        with cp.client() as c:
            admin = {"Authorization": "Bearer test-admin-token-0123456789"}
            r = c.put(
                "/v1/routes/tenants/mode", json={"mode": "enforce", "reason": "test", "force": True}, headers=admin
            )
            assert r.status_code == 200, r.text
            ok = tenant(c, "initech")
            assert ok.status_code == 200 and ok.json()["enforced_by"] == "distributed"
            engine = cp.engine
            # Redis "down" for the limiter: the breaker open, no probe due
            engine.breaker.record_failure("test outage")
            for _ in range(10):
                engine.breaker.record_failure("test outage")
            engine.breaker.next_probe_at = time.monotonic() + 60
            down = tenant(c, "initech")
            assert down.status_code == 503 and down.json()["enforced_by"] == "failure_policy", down.text
            # while Redis is down the cache is skipped, the service still answers
            assert down.json()["limits_source"] == "external"


def test_service_down_falls_back_to_the_static_policy_quickly(make_cp):
    cp = make_cp(rules_for(closed_port_url()))
    with cp.client() as c:
        t0 = time.monotonic()
        r = tenant(c, "acme")
        assert time.monotonic() - t0 < 1.5
        assert r.status_code == 200 and r.json()["limits_source"] == "static" and r.json()["key"] == "acme"
        assert r.headers["X-RateLimit-Limit"] == "3"  # the file's policy


@pytest.mark.parametrize("mode", ["hang", "drip", "garbage"])
def test_misbehaving_service_never_delays_a_decision_beyond_the_timeout(make_cp, mode):
    with RawServer(mode) as raw:
        cp = make_cp(rules_for(raw.url, timeout="400ms"))
        with cp.client() as c:
            for _ in range(3):
                t0 = time.monotonic()
                r = tenant(c, "acme")
                assert time.monotonic() - t0 < 0.4 + 0.4
                assert r.status_code == 200 and r.json()["limits_source"] == "static"
            batch = c.post(
                "/v1/decide/batch",
                json={
                    "requests": [
                        {"method": "GET", "path": "/api/tenants/x", "headers": {"X-Tenant-Id": f"t{i}"}}
                        for i in range(5)
                    ]
                },
            )
            assert batch.status_code == 200
            assert {d["limits_source"] for d in batch.json()["decisions"]} == {"static"}


def test_breakers_cache_and_calls_are_visible(make_cp):
    script = Script()
    script.default = Answer(status=500, body={"error": "tenant db down"})
    script.answers["acme"] = Answer(body={"average": 50, "burst": 50, "period": "1s"})
    with AppServer(scripted_app(script)) as svc:
        cp = make_cp(rules_for(svc.url + "/limits"))
        with cp.client() as c:
            stream = c.stream("GET", "/v1/stream", params={"interval": 0.5})
            resp = stream.__enter__()
            try:
                assert tenant(c, "acme").json()["limits_source"] == "external"
                wait_until(lambda: tenant(c, "acme").json()["limits_source"] == "cache", 3.0, what="a cache hit")
                for _ in range(6):
                    assert tenant(c, "broken").json()["limits_source"] == "static"
                ext = c.get("/v1/external").json()
                assert ext["instance_id"] == cp.engine.instance_id
                assert ext["routes"][0]["route"] == "tenants" and ext["routes"][0]["url"] == svc.url + "/limits"
                assert ext["breakers_open"] == 1 and ext["breakers_total"] == 2
                b = ext["breakers"][0]
                assert (b["route"], b["key"], b["state"], b["failures"]) == ("tenants", "broken", "open", 5)
                assert 25 < b["next_probe_in_s"] <= 30 and "HTTP 500" in b["last_error"]
                assert ext["cache"]["hit"] >= 1 and ext["cache"]["miss"] >= 7 and 0 < ext["cache"]["hit_ratio"] < 1
                assert ext["calls"]["ok"] == 1 and ext["calls"]["error"] == 5
                assert ext["errors"]["circuit_open"] == 1
                assert ext["sources"]["static"] == 6
                assert c.get("/v1/external", params={"route": "search"}).json()["routes"] == []
                assert c.get("/v1/external", params={"route": "nope"}).status_code == 404
                assert c.get("/v1/external", params={"limit": 1}).json()["breakers"][0]["key"] == "broken"
                text = c.get("/metrics").text
                assert metric_value(text, "rate_limit_external_calls_total", result="ok") == 1
                assert metric_value(text, "rate_limit_external_calls_total", result="error") == 5
                assert metric_value(text, "rate_limit_external_errors_total", reason="error") == 5
                assert metric_value(text, "rate_limit_external_cache_total", result="hit") >= 1
                assert metric_value(text, "rate_limit_external_breaker_transitions_total", to="open") == 1
                assert metric_value(text, "rate_limit_external_limits_total", route="tenants", source="static") == 6
                # the stream carries the same figures and the breaker event
                seen_event = seen_snapshot = False
                deadline = time.monotonic() + 10
                lines = resp.iter_lines()
                event = None
                for line in lines:
                    if time.monotonic() > deadline or (seen_event and seen_snapshot):
                        break
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        data = json.loads(line[6:])
                        if event == "snapshot" and data.get("external", {}).get("breakers_open") == 1:
                            seen_snapshot = True
                            if any(
                                e.get("type") == "external_breaker"
                                and e.get("key") == "broken"
                                and e.get("to") == "open"
                                for e in data["events"]
                            ):
                                seen_event = True
                        elif event == "event" and data.get("type") == "external_breaker" and data.get("to") == "open":
                            seen_event = True
                assert seen_snapshot and seen_event
            finally:
                stream.__exit__(None, None, None)


def test_sensitive_headers_never_reach_the_service_through_the_api(make_cp):
    script = Script()
    with AppServer(scripted_app(script)) as svc:
        text = rules_for(svc.url + "/limits").replace("      header_filter: {allow_list: [X-Tenant-Id, X-Plan]}\n", "")
        cp = make_cp(text)
        secrets = {
            "Authorization": "Bearer sk-live-9",
            "Cookie": "sid=abc123",
            "X-Api-Key": "k-777",
            "X-Session-Token": "st-888",
        }
        with cp.client() as c:
            r = tenant(c, "acme", headers={**secrets, "X-Plan": "gold"})
            assert r.status_code == 200 and r.json()["limits_source"] == "external"
    assert script.calls == 1
    req = script.requests[0]
    wire = req["raw"] + repr(req["http_headers"]).encode()
    for value in secrets.values():
        assert value.encode() not in wire
    assert req["json"]["headers"] == {"X-Tenant-Id": "acme", "X-Plan": "gold"}
    assert req["json"]["method"] == "GET" and req["json"]["path"] == "/api/tenants/orders"


def test_batch_mixes_external_and_static_routes(make_cp, example_service):
    cp = make_cp(rules_for(example_service.url + "/limits"))
    with cp.client() as c:
        items = [
            {"method": "GET", "path": "/api/tenants/a", "headers": {"X-Tenant-Id": "globex"}},
            {"method": "GET", "path": "/api/search/a", "headers": {"X-Client-Id": "bob"}},
            {"route": "nope", "key": "x"},
            {"method": "GET", "path": "/api/tenants/b", "headers": {"X-Tenant-Id": "globex"}},
            {"method": "GET", "path": "/api/tenants/c", "headers": {"X-Tenant-Id": "acme"}},
        ]
        out = c.post("/v1/decide/batch", json={"requests": items}).json()["decisions"]
    assert [d.get("limits_source") for d in out] == ["external", None, None, "external", "external"]
    assert out[2]["error"] == "unknown_route"
    assert out[0]["local"]["limit"] == 5 and out[3]["local"]["remaining"] == 3  # one shared lookup, one bucket
    assert out[4]["key"] == "t:acme"


def test_deny_listed_keys_are_not_looked_up(make_cp):
    script = Script()
    with AppServer(scripted_app(script)) as svc:
        extra = '    deny: ["bad-tenant"]\n    allow: ["internal-job"]\n'
        text = rules_for(svc.url + "/limits").replace("    external:\n", extra + "    external:\n")
        cp = make_cp(text)
        with cp.client() as c:
            assert tenant(c, "bad-tenant").status_code == 403
            assert tenant(c, "internal-job").json()["list_match"] == "allow"
    assert script.calls == 0


def test_buckets_show_the_tenants_limits(make_cp, example_service):
    cp = make_cp(rules_for(example_service.url + "/limits"))
    with cp.client() as c:
        for _ in range(3):
            tenant(c, "globex")
        b = c.get("/v1/buckets", params={"route": "tenants"}).json()["buckets"]
        assert b[0]["key"] == "globex" and b[0]["local"]["burst"] == 5 and b[0]["local"]["policy"]["average"] == 5.0


def test_rules_reload_with_a_bad_external_block_keeps_the_last_good_rules(make_cp, example_service, tmp_path):
    cp = make_cp(rules_for(example_service.url + "/limits"))
    path = cp.settings.rules_path
    path.write_text(rules_for("ftp://nope/limits"))
    with cp.client() as c:
        r = c.post("/ratelimit/rules/reload", headers={"Authorization": "Bearer test-admin-token-0123456789"})
        assert r.status_code == 422 and r.json()["field"] == "routes[0].external.url" and r.json()["line"] == 9
        assert tenant(c, "acme").json()["limits_source"] in ("external", "cache")
        routes = c.get("/v1/routes").json()["routes"]
        assert routes[0]["rule"]["external"]["url"] == example_service.url + "/limits"
