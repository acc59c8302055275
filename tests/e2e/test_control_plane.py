"""The control plane end to end: a real app under uvicorn on loopback, real HTTP, real
Redis (the session server, or a private one for outages). Every endpoint, every mode,
the admin API, the event stream, metrics, restarts and Redis outages."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
import redis as redis_sync
from cp_server import (
    RULES_YAML,
    ControlPlaneServer,
    admin_headers,
    hour_aligned_clocks,
    metric_value,
    wait_until,
    write_rules,
)

from control_plane.model.rollout import canary_bucket, classify
from limiter.embedded import EmbeddedRedis

ADMIN = admin_headers()
# draft-ietf-httpapi-ratelimit-headers-11: a structured-field List of named items
_POLICY_ITEM = r'"[A-Za-z0-9_.-]+";q=\d+;w=\d+(?:;sl-burst=\d+)?(?:;sl-shadow)?'
POLICY_RE = re.compile(rf"^{_POLICY_ITEM}(?:, {_POLICY_ITEM})*$")
RATELIMIT_RE = re.compile(r'^"[A-Za-z0-9_.-]+";r=\d+;t=\d+$')


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def rules_file(tmp_path):
    return write_rules(tmp_path)


@pytest.fixture
def make_cp(redis_url, rules_file):
    """Start control planes (stopped at teardown); overrides are settings field names."""
    servers: list[ControlPlaneServer] = []

    def make(**overrides):
        overrides.setdefault("redis_url", redis_url)
        overrides.setdefault("rules_path", rules_file)
        cp = ControlPlaneServer(**overrides)
        servers.append(cp)
        return cp.start()

    yield make
    for s in reversed(servers):
        s.stop()


@pytest.fixture
def cp(make_cp):
    return make_cp()


@pytest.fixture
def http(cp):
    with cp.client() as c:
        yield c


@pytest.fixture
def private_redis():
    """A Redis of this test's own (outages must never touch the session server); AOF
    with fsync always, so what was written before a kill is still there afterwards."""
    server = EmbeddedRedis(extra_config={"appendonly": "yes", "appendfsync": "always"}).start()
    yield server
    server.stop()


def decide(c: httpx.Client, **body):
    return c.post("/v1/decide", json=body)


def set_mode(
    c: httpx.Client,
    route: str,
    mode: str,
    *,
    percent: int = 0,
    reason: str = "test",
    force: bool = False,
    headers=ADMIN,
):
    return c.put(
        f"/v1/routes/{route}/mode",
        json={"mode": mode, "canary_percent": percent, "reason": reason, "force": force},
        headers=headers,
    )


def route_view(c: httpx.Client, name: str) -> dict:
    r = c.get("/v1/routes")
    assert r.status_code == 200, r.text
    return next(v for v in r.json()["routes"] if v["name"] == name)


def div_totals(c: httpx.Client, route: str, minutes: int = 60) -> dict:
    r = c.get("/v1/divergence", params={"minutes": minutes})
    assert r.status_code == 200, r.text
    return r.json()["routes"][route]["totals"]


# --------------------------------------------------------------------------- decide


def test_decide_by_route_and_key(http):
    r = decide(http, route="search", key="alice", request_id="req-1")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["allowed"] is True
    assert body["route"] == "search"
    assert body["key"] == "alice"
    assert body["request_id"] == "req-1"
    assert body["mode"] == "shadow"
    assert body["enforced_by"] == "local"
    assert body["status_code"] == 200
    assert body["local"]["limit"] == 10 and body["local"]["remaining"] == 9
    assert r.headers["X-RateLimit-Limit"] == "10"
    assert r.headers["X-RateLimit-Remaining"] == "9"


def test_decide_by_method_path_and_headers_uses_route_key_strategy(http):
    r = decide(http, method="GET", path="/api/search/books/42", headers={"X-Client-Id": "bob"}, cost=5)
    assert r.status_code == 200, r.text
    assert r.json()["route"] == "search"
    assert r.json()["key"] == "bob"
    # the same client through route+key shares the bucket (a fresh one would leave 9)
    r2 = decide(http, route="search", key="bob")
    assert r2.json()["local"]["remaining"] <= 5
    # unmatched method/path falls back to the default route, keyed by client IP
    r3 = decide(http, method="DELETE", path="/elsewhere", client_ip="198.51.100.7")
    assert r3.status_code == 200, r3.text
    assert r3.json()["route"] == "default"
    assert r3.json()["key"] == "198.51.100.7"
    # the header the strategy needs is missing: 422 naming it
    r4 = decide(http, method="GET", path="/api/search/x", headers={"X-Other": "1"})
    assert r4.status_code == 422, r4.text
    assert "X-Client-Id" in r4.json()["field"]


def test_decide_unknown_route_is_404_naming_the_field(http):
    r = decide(http, route="nope", key="alice")
    assert r.status_code == 404
    body = r.json()
    assert body["error"] == "unknown_route"
    assert body["field"] == "route"
    assert "nope" in body["message"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"route": "search", "key": "a", "cost": "many"}, "cost"),
        ({"route": "search", "key": "a", "bogus": 1}, "bogus"),
        ({"route": "search", "key": "a", "cost": 0}, "cost"),
        ({"route": "search", "key": "a", "method": "G E T"}, "method"),
        ({"route": "search", "key": "a", "path": "no-slash"}, "path"),
        ({"key": "a"}, "route"),
        ({"route": "search"}, "key"),
        ({"route": "search", "key": "bad\nkey"}, "key"),
    ],
)
def test_decide_bad_body_is_422_naming_the_field(http, body, field):
    r = http.post("/v1/decide", json=body)
    assert r.status_code == 422, r.text
    data = r.json()
    assert data["field"] == field, data
    assert data["error"] in ("invalid_request", "invalid_key")
    assert field in data["message"]


def test_decide_malformed_json_is_422(http):
    r = http.post("/v1/decide", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["error"] == "invalid_request"


def test_decide_cost_above_burst_is_422_naming_cost(http):
    r = decide(http, route="search", key="alice", cost=11)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "cost"
    assert "cost" in r.json()["message"]
    # at the burst it is fine
    assert decide(http, route="search", key="alice", cost=10).status_code == 200


def test_decide_denied_is_429_with_seed_body_and_headers(http):
    # login: 5 per 10 s sliding window; the whole allowance in one request, then one more
    assert decide(http, route="login", key="carl", cost=5).status_code == 200
    r = decide(http, route="login", key="carl")
    assert r.status_code == 429, r.text
    body = r.json()
    assert body["error"] == "rate limit exceeded"
    assert isinstance(body["message"], str) and body["message"]
    assert body["identifier"] == "login:carl"
    assert body["allowed"] is False
    h = r.headers
    assert 1 <= int(h["Retry-After"]) <= 20  # sliding window: the weighted previous window counts too
    assert h["X-RateLimit-Limit"] == "5"
    assert h["X-RateLimit-Remaining"] == "0"
    # a sliding window is back to its full allowance within two windows
    assert int(time.time()) <= int(h["X-RateLimit-Reset"]) <= int(time.time()) + 21
    assert POLICY_RE.match(h["RateLimit-Policy"]), h["RateLimit-Policy"]
    # a sliding window of 5 per 10 s admits a steady client 4 per window (docs/api.md)
    assert h["RateLimit-Policy"] == '"login";q=4;w=10'
    assert RATELIMIT_RE.match(h["RateLimit"]), h["RateLimit"]
    assert h["RateLimit"].startswith('"login";r=0;t=')
    # no announcement of the coming distributed limit unless SHADOWLIMIT_ANNOUNCE_SHADOW is set
    assert "sl-shadow" not in h["RateLimit-Policy"]
    # a token bucket route: 10 per second, its burst equal to the quota
    ok = decide(http, route="search", key="carl")
    assert ok.headers["RateLimit-Policy"] == '"search";q=10;w=1'
    assert ok.headers["RateLimit"] == '"search";r=9;t=1'  # one token back within a second
    assert "Retry-After" not in ok.headers


def test_header_styles_and_the_shadow_announcement(make_cp):
    """SHADOWLIMIT_ANNOUNCE_SHADOW adds the sl-shadow item (shadow only); SHADOWLIMIT_HEADERS
    picks the sets; SHADOWLIMIT_RESET_HEADER=seconds sends X-RateLimit-Reset as a delay."""
    with make_cp(announce_shadow=True, gate_min_samples=0).client() as c:
        r = decide(c, route="export", key="ann")
        assert r.headers["RateLimit-Policy"] == '"export";q=100;w=1, "export-global";q=1;w=10;sl-burst=3;sl-shadow'
        assert POLICY_RE.match(r.headers["RateLimit-Policy"])
        assert set_mode(c, "export", "enforce").status_code == 200
        r = decide(c, route="export", key="ann")
        assert r.headers["RateLimit-Policy"] == '"export";q=1;w=10;sl-burst=3'
    with make_cp(headers="legacy", reset_header="seconds").client() as c:
        codes = []
        for _ in range(6):
            r = decide(c, route="login", key="leg")
            codes.append(r.status_code)
            assert "RateLimit-Policy" not in r.headers and "RateLimit" not in r.headers
            assert 0 <= int(r.headers["X-RateLimit-Reset"]) <= 20  # seconds from now, not a Unix time
        assert codes == [200] * 5 + [429] and int(r.headers["Retry-After"]) >= 1
    with make_cp(headers="none").client() as c:
        for _ in range(6):
            r = decide(c, route="login", key="none")
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1  # HTTP's own field stays
        assert not [k for k in r.headers if "ratelimit" in k.lower()]
        assert r.json()["headers"] == {"Retry-After": r.headers["Retry-After"]}


def test_deny_list_is_403(http):
    r = decide(http, route="login", client_ip="203.0.113.9")
    assert r.status_code == 403, r.text
    body = r.json()
    assert body["allowed"] is False
    assert body["list_match"] == "deny"
    assert body["error"] == "denied"
    # by method + path too
    r2 = decide(http, method="POST", path="/api/login", client_ip="203.0.113.200")
    assert r2.status_code == 403, r2.text


def test_allow_list_bypasses_the_limit(http):
    for _ in range(8):  # login allows 5 per 10 s
        r = decide(http, route="login", key="internal-job")
        assert r.status_code == 200, r.text
        assert r.json()["allowed"] is True
        assert r.json()["list_match"] == "allow"
    # an ordinary key is limited after 5
    codes = [decide(http, route="login", key="someone").status_code for _ in range(6)]
    assert codes == [200] * 5 + [429]


# --------------------------------------------------------------------------- modes


def test_mode_off(cp, http):
    assert set_mode(http, "search", "off").status_code == 200
    r = decide(http, route="search", key="olga")
    body = r.json()
    assert body["mode"] == "off"
    assert body["enforced_by"] == "local"
    assert body["distributed"] is None
    assert body["divergence"] is None
    assert "sl-shadow" not in r.headers["RateLimit-Policy"]
    cp.settle()  # everything buffered is counted and visible now: nothing was compared in off mode
    assert div_totals(http, "search")["compared"] == 0


def test_mode_shadow_compares_off_the_hot_path(http):
    for i in range(7):
        r = decide(http, route="search", key="sam", request_id=f"s{i}")
        assert r.json()["mode"] == "shadow"
        assert r.json()["distributed"] is None
        assert r.json()["divergence"] is None
        assert "sl-shadow" not in r.headers["RateLimit-Policy"]  # not announced by default
    totals = wait_until(
        lambda: (t := div_totals(http, "search"))["compared"] >= 7 and t, 5.0, 0.1, "shadow comparisons"
    )
    assert totals["compared"] == 7
    assert totals["agree"] == 7
    assert totals["distributed_attempts"] == 7


def test_mode_canary_is_stable_per_key(make_cp):
    cp = make_cp(gate_min_samples=0)
    with cp.client() as c:
        assert set_mode(c, "search", "canary", percent=0).status_code == 422
        r = set_mode(c, "search", "canary", percent=101)
        assert r.status_code == 422 and r.json()["field"] == "canary_percent"
        r = set_mode(c, "search", "canary", percent=0)
        assert r.json()["field"] == "canary_percent"
        r = set_mode(c, "search", "canary", percent=30)
        assert r.status_code == 200, r.text
        assert r.json()["state"]["canary_percent"] == 30
        enforced: dict[str, str] = {}
        for i in range(100):
            key = f"user-{i}"
            first = decide(c, route="search", key=key).json()
            assert first["mode"] == "canary" and first["canary_percent"] == 30
            enforced[key] = first["enforced_by"]
            for _ in range(2):
                assert decide(c, route="search", key=key).json()["enforced_by"] == enforced[key]
        for key, by in enforced.items():
            assert by == ("distributed" if canary_bucket("search", key) < 30 else "local")
        share = sum(by == "distributed" for by in enforced.values())
        assert 10 <= share <= 50, share
        assert route_view(c, "search")["mode"] == "canary"


def test_mode_enforce_classifies_divergence(make_cp):
    cp = make_cp(gate_min_samples=0)
    with cp.client() as c:
        assert set_mode(c, "export", "enforce").status_code == 200
        results = [decide(c, route="export", key="eve") for _ in range(5)]
        for r in results:
            b = r.json()
            assert b["mode"] == "enforce"
            assert b["enforced_by"] == "distributed"
            assert b["distributed"] is not None
            assert b["divergence"] == classify(b["local"]["allowed"], b["distributed"]["allowed"]).value
            assert "sl-shadow" not in r.headers["RateLimit-Policy"]
        assert [r.json()["divergence"] for r in results] == ["agree"] * 3 + ["local_allow_distributed_deny"] * 2
        assert [r.status_code for r in results] == [200, 200, 200, 429, 429]
        assert results[-1].headers["X-RateLimit-Limit"] == "3"
        assert results[-1].json()["error"] == "rate limit exceeded"
        totals = wait_until(
            lambda: (t := div_totals(c, "export"))["compared"] >= 5 and t, 5.0, 0.1, "enforce comparisons"
        )
        assert totals["local_allow_distributed_deny"] == 2


def test_kill_switch_makes_every_route_off(make_cp):
    cp = make_cp(enable_distributed_rate_limiting=False, gate_min_samples=0)
    with cp.client() as c:
        assert set_mode(c, "search", "enforce").status_code == 200
        assert set_mode(c, "export", "canary", percent=100).status_code == 200
        for route in ("search", "export", "login", "default"):
            b = decide(c, route=route, key="kim").json()
            assert b["mode"] == "off", b
            assert b["enforced_by"] == "local"
            assert b["distributed"] is None
        data = c.get("/v1/routes").json()
        assert data["distributed_enabled"] is False
        views = {v["name"]: v for v in data["routes"]}
        assert views["search"]["mode"] == "off" and views["search"]["stored_mode"] == "enforce"
        assert all(v["mode"] == "off" for v in views.values())
        cp.settle()  # nothing was queued for shadow evaluation
        assert c.get("/ratelimit/stats").json()["shadow"]["evaluated"] == 0


# --------------------------------------------------------------------------- batch


def test_decide_batch_keeps_order_and_errors_in_place(http):
    items = [
        {"route": "search", "key": "b1"},
        {"route": "nope", "key": "b1"},
        {"route": "search", "key": "b1", "cost": 11},
        {"method": "GET", "path": "/api/export/x", "headers": {"X-Client-Id": "zed"}},
        {"key": "lonely"},
        {"route": "search", "key": "b1"},
    ]
    r = http.post("/v1/decide/batch", json={"requests": items})
    assert r.status_code == 200, r.text
    out = r.json()["decisions"]
    assert len(out) == len(items)
    assert out[0]["route"] == "search" and out[0]["local"]["remaining"] == 9
    assert out[1]["error"] == "unknown_route" and out[1]["index"] == 1 and out[1]["field"] == "route"
    assert out[2]["error"] == "invalid_request" and out[2]["index"] == 2 and out[2]["field"] == "cost"
    assert out[3]["route"] == "export" and out[3]["key"] == "zed"
    assert out[4]["index"] == 4 and out[4]["field"] == "route"
    assert out[5]["route"] == "search" and out[5]["local"]["remaining"] <= 8  # same bucket as item 0
    # a malformed item is a 422 for the whole body, naming where
    bad = http.post("/v1/decide/batch", json={"requests": [{"route": "search", "key": "x", "cost": "lots"}]})
    assert bad.status_code == 422
    assert bad.json()["field"] == "requests.0.cost"
    assert http.post("/v1/decide/batch", json={"requests": []}).status_code == 422


# --------------------------------------------------------------------------- rollout API


def test_routes_listing(http, rules_file):
    data = http.get("/v1/routes").json()
    assert [v["name"] for v in data["routes"]] == ["search", "login", "export", "default"]
    assert data["distributed_enabled"] is True
    assert data["rules_source"] == str(rules_file)
    assert data["rules_error"] is None
    search = data["routes"][0]
    assert search["mode"] == "shadow"
    assert search["rule"]["local"]["burst"] == 10
    assert search["rule"]["key"] == {"strategy": "header", "header": "X-Client-Id"}
    assert search["gate"]["target"] == "canary"
    assert search["divergence_5m"]["compared"] == 0


def test_mode_change_auth(http):
    r = http.put("/v1/routes/search/mode", json={"mode": "off", "reason": "x"})
    assert r.status_code == 401
    assert r.json()["error"] == "unauthorized"
    r = set_mode(http, "search", "off", headers=admin_headers("wrong-token"))
    assert r.status_code == 401
    assert "not valid" in r.json()["message"]
    r = set_mode(http, "search", "off", headers={"Authorization": "Basic abc"})
    assert r.status_code == 401
    assert route_view(http, "search")["mode"] == "shadow"
    r = set_mode(http, "nope", "off")
    assert r.status_code == 404 and r.json()["field"] == "route"
    r = http.put("/v1/routes/search/mode", json={"mode": "off"}, headers=ADMIN)
    assert r.status_code == 422 and r.json()["field"] == "reason"
    r = http.put("/v1/routes/search/mode", json={"mode": "sideways", "reason": "x"}, headers=ADMIN)
    assert r.status_code == 422 and r.json()["field"] == "mode"


def test_mode_change_403_without_admin_token_configured(make_cp):
    cp = make_cp(admin_token=None)
    with cp.client() as c:
        r = set_mode(c, "search", "off")
        assert r.status_code == 403
        assert r.json()["error"] == "admin_disabled"
        assert "no admin token is configured" in r.json()["message"]
        assert "SHADOWLIMIT_ADMIN_TOKEN" in r.json()["message"]
        assert c.post("/ratelimit/reset/alice", headers=ADMIN).status_code == 403


def test_gate_refuses_then_force_overrides_and_is_audited(make_cp):
    cp = make_cp(gate_min_samples=1000)
    with cp.client() as c:
        for i in range(5):
            decide(c, route="search", key=f"g{i}")
        r = set_mode(c, "search", "canary", percent=10)
        assert r.status_code == 409, r.text
        body = r.json()
        assert body["error"] == "gate_failed"
        gate = body["gate"]
        assert gate["passed"] is False and gate["required"] is True
        assert gate["min_samples"] == 1000
        assert gate["compared"] < 1000
        assert gate["reasons"] and "need 1000" in gate["reasons"][0]
        assert {"new_rejection_rate", "max_new_rejection_rate", "backend_error_rate", "window_s"} <= set(gate)
        assert route_view(c, "search")["mode"] == "shadow"
        assert c.get("/v1/rollout/audit").json()["entries"] == []
        # demotions are never gated
        assert set_mode(c, "login", "off").status_code == 200
        # force with a reason
        r = set_mode(c, "search", "enforce", reason="incident 42: enforce now", force=True)
        assert r.status_code == 200, r.text
        assert r.json()["audit"]["forced"] is True
        assert r.json()["state"]["mode"] == "enforce"
        newest = c.get("/v1/rollout/audit").json()["entries"][0]
        assert newest["route"] == "search" and newest["forced"] is True
        assert newest["reason"] == "incident 42: enforce now"
        assert newest["from"] == "shadow" and newest["to"] == "enforce"
        assert newest["gate"]["passed"] is False
        assert decide(c, route="search", key="g0").json()["enforced_by"] == "distributed"


def test_audit_newest_first_with_route_filter(make_cp):
    cp = make_cp(gate_min_samples=0)
    with cp.client() as c:
        assert set_mode(c, "search", "off", reason="one").status_code == 200
        assert set_mode(c, "login", "off", reason="two").status_code == 200
        assert set_mode(c, "search", "canary", percent=20, reason="three").status_code == 200
        entries = c.get("/v1/rollout/audit").json()["entries"]
        assert [e["reason"] for e in entries] == ["three", "two", "one"]
        assert [e["at"] for e in entries] == sorted((e["at"] for e in entries), reverse=True)
        assert entries[0]["from"] == "off" and entries[0]["to"] == "canary" and entries[0]["to_percent"] == 20
        assert entries[0]["actor"].startswith("admin@")
        only = c.get("/v1/rollout/audit", params={"route": "search"}).json()["entries"]
        assert [e["reason"] for e in only] == ["three", "one"]
        assert [e["reason"] for e in c.get("/v1/rollout/audit", params={"limit": 1}).json()["entries"]] == ["three"]
        assert c.get("/v1/rollout/audit", params={"route": "nope"}).json()["entries"] == []
        assert c.get("/v1/rollout/audit", params={"limit": 0}).status_code == 422


# --------------------------------------------------------------------------- read models


def test_divergence_view(make_cp):
    # the "would be blocked" view covers the current 5-minute window: the replica's clock
    # starts one in, so the test never crosses into the next. That clock is up to an hour
    # from Redis' on purpose: the skew tolerance is widened to an hour so the divergence
    # is put down to the limits, not to the clock
    with make_cp(clocks=hour_aligned_clocks(), clock_skew_tolerance_ms=3_600_000).client() as http:
        for i in range(6):
            r = decide(
                http, method="GET", path="/api/export/all", headers={"X-Client-Id": "mallory"}, request_id=f"m-{i}"
            )
            assert r.status_code == 200  # local allows 100, shadow enforces local
        decide(http, route="search", key="nice")

        def ready():
            data = http.get("/v1/divergence").json()["routes"]
            return data if data["export"]["totals"]["compared"] >= 6 and data["export"]["would_be_blocked"] else None

        data = wait_until(ready, 5.0, 0.1, "export divergence")
        exp = data["export"]
        t = exp["totals"]
        assert t["compared"] == 6
        assert t["agree"] == 3
        assert t["local_allow_distributed_deny"] == 3
        assert t["local_deny_distributed_allow"] == 0
        assert t["new_rejection_rate"] == pytest.approx(0.5)
        assert t["reverse_rate"] == 0.0
        assert t["backend_error_rate"] == 0.0
        assert len(exp["series"]) == 60
        assert sum(m["compared"] for m in exp["series"]) == 6
        assert [m["minute"] for m in exp["series"]] == sorted(m["minute"] for m in exp["series"])
        # one replica, a global limit stricter than the local one: the new limit is tighter
        mallory = {"key": "mallory", "count": 3, "last_request_id": "m-5", "cause": "tighter", "units": None}
        assert exp["would_be_blocked"] == [mallory]  # (units: a budget route's)
        why = exp["causes"]["new_rejections"]
        assert (why["total"], why["by_cause"]["tighter"], why["unexplained"]) == (3, 3, 0)
        assert why["shares"]["tighter"] == 1.0 and why["summary"] == "100% the new limit is tighter"
        assert exp["causes"]["explain"] is True and exp["causes"]["reverse"]["total"] == 0
        assert set(data) == {"search", "login", "export", "default"}
        assert data["search"]["would_be_blocked"] == []
        short = http.get("/v1/divergence", params={"minutes": 5}).json()
        assert short["minutes"] == 5 and len(short["routes"]["export"]["series"]) == 5
        assert http.get("/v1/divergence", params={"minutes": 0}).status_code == 422


def test_buckets_read_without_consuming(make_cp):
    # login is a sliding window of 10 s: all of this within one window, or the previous
    # window's weight would give back part of the 3 requests between two reads (the
    # replica's clock starts at the beginning of one)
    with make_cp(clocks=hour_aligned_clocks()).client() as http:
        for _ in range(3):
            assert decide(http, route="login", key="carol").status_code == 200

        def with_dist():
            # the three shadow evaluations may land in different batches: wait for all of
            # them (the same requests at the same timestamps leave Redis where local is)
            b = http.get("/v1/buckets", params={"route": "login", "limit": 5}).json()["buckets"]
            if not b or b[0]["distributed"] is None or not b[0]["distributed"]["exists"]:
                return None
            return b if b[0]["distributed"]["tokens"] == pytest.approx(b[0]["local"]["tokens"], abs=0.01) else None

        first = wait_until(with_dist, 5.0, 0.1, "distributed bucket")[0]
        assert first["route"] == "login" and first["key"] == "carol"
        assert first["recent_requests"] == 3
        assert first["local"]["limit"] == 5 and first["local"]["burst"] == 5
        assert first["local"]["tokens"] <= 2
        assert first["distributed"]["tokens"] <= 2
        assert first["last_decision"]["allowed"] is True and first["last_decision"]["enforced_by"] == "local"
        prev = first
        for _ in range(4):
            b = http.get("/v1/buckets", params={"route": "login", "limit": 5}).json()["buckets"][0]
            assert b["local"]["tokens"] >= prev["local"]["tokens"]
            assert b["distributed"]["tokens"] >= prev["distributed"]["tokens"]
            prev = b
        # five peeks later two requests are still left (3 used of 5)
        assert decide(http, route="login", key="carol").status_code == 200
        assert decide(http, route="login", key="carol").status_code == 200
        # all routes, and the limit
        for i in range(3):
            decide(http, route="search", key=f"k{i}")
        allb = http.get("/v1/buckets", params={"limit": 2}).json()["buckets"]
        assert len(allb) == 2
        assert http.get("/v1/buckets", params={"route": "nope"}).status_code == 404


def test_backend_view(http):
    b = http.get("/v1/backend").json()
    assert b["state"] == "closed"
    for k in (
        "consecutive_failures",
        "total_failures",
        "transitions",
        "last_error",
        "opened_at",
        "next_probe_in_s",
        "probe_attempt",
    ):
        assert k in b
    assert b["failure_policy"] == "inMemoryFallback"
    assert b["pending_rollbacks"] == []
    assert b["distributed_enabled"] is True
    assert b["auto_rollback_after_s"] == 30.0
    assert b["instance_id"] == http.get("/healthz").json()["instance_id"]


def test_stats_clients_and_reset(http):
    codes = [decide(http, route="login", key="alice", cost=c).status_code for c in (1, 4, 1)]
    assert codes == [200, 200, 429]
    decide(http, route="search", key="bert")
    stats = http.get("/ratelimit/stats").json()
    assert stats["requests"]["local"]["allowed"] >= 3
    assert stats["requests"]["local"]["denied"] >= 1
    assert stats["exceeded"]["local"] >= 1
    assert stats["routes"]["search"] == "shadow"
    assert stats["active_clients"]["local"] >= 2
    clients = http.get("/ratelimit/clients").json()
    assert {"route": "login", "key": "alice"}.items() <= next(
        c for c in clients["clients"] if c["key"] == "alice"
    ).items()
    assert clients["total"] >= 2
    only_search = http.get("/ratelimit/clients", params={"route": "search"}).json()["clients"]
    assert [c["key"] for c in only_search] == ["bert"]
    # reset is admin only
    assert http.post("/ratelimit/reset/alice", params={"route": "login"}).status_code == 401
    assert http.post("/ratelimit/reset/alice", params={"route": "nope"}, headers=ADMIN).status_code == 404
    r = http.post("/ratelimit/reset/alice", params={"route": "login"}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["local_reset"] == 1
    assert r.json()["routes"] == ["login"]
    after = decide(http, route="login", key="alice")
    assert after.status_code == 200
    assert after.json()["local"]["remaining"] == 4
    audit = http.get("/v1/rollout/audit").json()["entries"]
    assert audit[0]["kind"] == "reset" and "alice" in audit[0]["reason"]


def test_reset_in_enforce_mode_resets_the_distributed_bucket(make_cp):
    cp = make_cp(gate_min_samples=0)
    with cp.client() as c:
        assert set_mode(c, "export", "enforce").status_code == 200
        codes = [decide(c, route="export", key="rex").status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]  # distributed: burst 3, one token per 10 s
        r = c.post("/ratelimit/reset/rex", params={"route": "export"}, headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json()["distributed_reset"] >= 1
        after = decide(c, route="export", key="rex")
        assert after.status_code == 200, after.text
        assert after.json()["enforced_by"] == "distributed"
        assert after.json()["distributed"]["remaining"] == 2


def test_config_adjust(http):
    body = {"route": "search", "average": 1, "period": 10, "burst": 2, "reason": "tighten search"}
    assert http.put("/ratelimit/config", json=body).status_code == 401
    r = http.put("/ratelimit/config", json=body, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert any(a["route"] == "search" and a["local"]["burst"] == 2 for a in r.json()["adjustments"])
    assert r.json()["audit"]["kind"] == "config_change"
    codes = []
    for _ in range(3):
        resp = decide(http, route="search", key="dora")
        codes.append(resp.status_code)
        assert resp.headers["X-RateLimit-Limit"] == "2"
    assert codes == [200, 200, 429]
    entry = http.get("/v1/rollout/audit").json()["entries"][0]
    assert entry["kind"] == "config_change" and "tighten search" in entry["reason"]
    # one key only, then clear the route-wide adjustment
    r = http.put(
        "/ratelimit/config",
        json={"route": "search", "key": "vip", "average": 50, "burst": 50, "reason": "vip"},
        headers=ADMIN,
    )
    assert r.status_code == 200
    assert decide(http, route="search", key="vip").headers["X-RateLimit-Limit"] == "50"
    assert (
        http.put(
            "/ratelimit/config", json={"route": "search", "average": 0, "clear": True, "reason": "undo"}, headers=ADMIN
        ).status_code
        == 200
    )
    assert decide(http, route="search", key="fresh").headers["X-RateLimit-Limit"] == "10"
    # errors
    assert http.put("/ratelimit/config", json={**body, "route": "nope"}, headers=ADMIN).status_code == 404
    bad = http.put("/ratelimit/config", json={**body, "average": "fast"}, headers=ADMIN)
    assert bad.status_code == 422 and bad.json()["field"] == "average"


def test_rules_reload_good_and_bad(http, rules_file):
    def errors() -> float:
        return metric_value(http.get("/metrics").text, "rate_limit_rules_reload_total", result="error")

    assert http.post("/ratelimit/rules/reload").status_code == 401
    rules_file.write_text(
        RULES_YAML.replace("local: {average: 10, period: 1s, burst: 10}", "local: {average: 20, period: 1s, burst: 20}")
    )
    r = http.post("/ratelimit/rules/reload", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["routes"] == ["search", "login", "export", "default"]
    assert decide(http, route="search", key="ria").headers["X-RateLimit-Limit"] == "20"
    before = errors()
    rules_file.write_text(
        RULES_YAML.replace("local: {average: 10, period: 1s, burst: 10}", "local: {average: 10, period: 1s, burst: 0}")
    )
    r = http.post("/ratelimit/rules/reload", headers=ADMIN)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "invalid_rules"
    assert body["line"] == 6
    assert body["field"] == "routes[0].local.burst"
    assert str(rules_file) in body["message"]
    # the last good rules stay
    assert decide(http, route="search", key="ria").headers["X-RateLimit-Limit"] == "20"
    assert errors() >= before + 1
    assert "routes[0].local.burst" in http.get("/v1/routes").json()["rules_error"]
    assert metric_value(http.get("/metrics").text, "rate_limit_rules_valid") == 0.0
    audit = http.get("/v1/rollout/audit").json()["entries"]
    assert any(e["kind"] == "rules_reload" and e["to"] == "error" for e in audit)


def _sse_events(resp: httpx.Response):
    """(event, data) pairs from an SSE response (snapshots arrive every interval, so
    the caller's deadline checks run at least that often)."""
    event, data = None, []
    for line in resp.iter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "":
            if event is not None:
                yield event, json.loads("\n".join(data)) if data else None
            event, data = None, []


def test_stream_snapshot_then_mode_change_event(http, cp):
    with httpx.Client(base_url=cp.url, timeout=httpx.Timeout(5.0)) as sc:
        t_open = time.monotonic()
        with sc.stream("GET", "/v1/stream", params={"interval": 0.5}) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            events = _sse_events(resp)
            kind, snap = next(events)
            assert kind == "snapshot"
            assert time.monotonic() - t_open < 5.0
            assert {"routes", "divergence", "buckets", "backend", "instance_id"} <= set(snap)
            assert [r["name"] for r in snap["routes"]] == ["search", "login", "export", "default"]
            t0 = time.monotonic()
            assert set_mode(http, "search", "off", reason="stream test").status_code == 200
            seen = None
            for kind, data in events:
                if kind == "event" and data.get("type") == "mode_change":
                    seen = data
                    break
                if time.monotonic() - t0 > 2.0:
                    break
            assert seen is not None, "no mode_change event within 2 s"
            assert time.monotonic() - t0 < 2.0
            assert seen["route"] == "search"
            assert seen["state"]["mode"] == "off"
            assert seen["audit"]["reason"] == "stream test"


def test_metrics_exposition(http):
    for _ in range(10):
        decide(http, route="search", key="met")
    assert decide(http, route="login", key="met", cost=5).status_code == 200
    assert decide(http, route="login", key="met").status_code == 429
    wait_until(lambda: http.get("/ratelimit/stats").json()["shadow"]["evaluated"] >= 12, 5.0, 0.05, "shadow evaluation")
    r = http.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in (
        "rate_limit_shadow_divergence_total",
        "rate_limit_rejections_total",
        "rate_limit_backend_errors_total",
        "rate_limit_decision_duration_seconds",
        "rate_limit_requests_total",
    ):
        assert name in text, name
    assert metric_value(text, "rate_limit_shadow_divergence_total", route="search", direction="agree") >= 10
    assert metric_value(text, "rate_limit_rejections_total", reason="local_exhausted") >= 1
    assert metric_value(text, "rate_limit_requests_total", limiter_type="local", status="allowed") >= 10
    assert metric_value(text, "rate_limit_decision_duration_seconds_count", mode="shadow") >= 12
    assert metric_value(text, "rate_limit_backend_errors_total") == 0.0
    assert metric_value(text, "rate_limit_route_mode", route="search", mode="shadow") == 1.0


def test_health_and_ready(http):
    r = http.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    r = http.get("/readyz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["status"], body["can_decide"], body["reasons"]) == ("ready", True, [])
    assert body["redis"] == {"reachable": True, "scripts": True} and body["breaker"] == "closed"


# --------------------------------------------------------------------------- restarts and outages


def test_restart_keeps_modes_and_audit(make_cp):
    cp = make_cp(gate_min_samples=0)
    with cp.client() as c:
        assert set_mode(c, "search", "enforce", reason="go").status_code == 200
        assert set_mode(c, "login", "off", reason="quiet").status_code == 200
        old_instance = c.get("/healthz").json()["instance_id"]
    cp.restart()
    with cp.client() as c:
        assert c.get("/healthz").json()["instance_id"] != old_instance
        views = {v["name"]: v for v in c.get("/v1/routes").json()["routes"]}
        assert views["search"]["mode"] == "enforce"
        assert views["login"]["mode"] == "off"
        assert views["export"]["mode"] == "shadow"
        assert [e["reason"] for e in c.get("/v1/rollout/audit").json()["entries"]] == ["quiet", "go"]
        assert decide(c, route="search", key="x").json()["enforced_by"] == "distributed"


def test_readyz_stays_200_while_redis_is_down_and_says_so(make_cp, private_redis):
    """A load balancer must not take every replica out exactly when the failure policies
    should serve: ready while the replica can decide, Redis and breaker in the body."""
    cp = make_cp(redis_url=private_redis.url, failure_policy="failClosed", gate_min_samples=0)
    with cp.client() as c:
        assert set_mode(c, "search", "enforce", reason="go").status_code == 200
        assert c.get("/readyz").status_code == 200
        private_redis.kill()
        r = c.get("/readyz")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "ready" and body["can_decide"] is True
        assert body["redis"]["reachable"] is False and body["redis"]["error"]
        for _ in range(10):  # the breaker opens; the replica still decides (failClosed: 429)
            decide(c, route="search", key="k")
        r = c.get("/readyz")
        assert r.status_code == 200 and r.json()["breaker"] in ("open", "half_open")
        private_redis.start()
        wait_until(lambda: c.get("/readyz").json()["redis"]["reachable"], 5.0, 0.1, "Redis reachable again")


def test_readyz_503_when_redis_is_down_and_readiness_requires_it(make_cp, private_redis):
    cp = make_cp(redis_url=private_redis.url, ready_requires_redis=True)
    with cp.client() as c:
        assert c.get("/readyz").status_code == 200
        private_redis.kill()
        r = c.get("/readyz")
        assert r.status_code == 503
        body = r.json()
        assert body["status"] == "not_ready" and body["can_decide"] is True and body["redis"]["reachable"] is False
        assert "SHADOWLIMIT_READY_REQUIRES_REDIS" in body["reasons"][0]
        assert c.get("/healthz").status_code == 200
        private_redis.start()
        wait_until(lambda: c.get("/readyz").status_code == 200, 5.0, 0.1, "ready again")


def test_readyz_503_when_the_engine_cannot_decide(make_cp):
    cp = make_cp()
    with cp.client() as c:
        assert c.get("/readyz").status_code == 200
        cp.engine.running = False  # as while stopping
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["can_decide"] is False
        cp.engine.running = True


def test_mode_change_refused_with_503_when_redis_is_down(make_cp, private_redis):
    cp = make_cp(redis_url=private_redis.url, gate_min_samples=0)
    with cp.client() as c:
        assert set_mode(c, "search", "off", reason="before").status_code == 200
        private_redis.kill()
        t0 = time.monotonic()
        r = set_mode(c, "search", "enforce", reason="during outage", force=True)
        assert time.monotonic() - t0 < 5.0
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "backend_unavailable"
        assert "nothing was written" in r.json()["message"]
        assert route_view(c, "search")["mode"] == "off"
        assert c.get("/v1/rollout/audit").status_code == 503
        private_redis.start()
        wait_until(lambda: c.get("/v1/rollout/audit").status_code == 200, 5.0, 0.1, "audit readable again")
        assert [e["reason"] for e in c.get("/v1/rollout/audit").json()["entries"]] == ["before"]
        raw = redis_sync.Redis.from_url(private_redis.url).hget(f"rl:{{{cp.namespace}}}:rollout", "search")
        assert json.loads(raw)["mode"] == "off"
        assert route_view(c, "search")["mode"] == "off"


def test_auto_rollback_when_redis_stays_down(make_cp, private_redis):
    cp = make_cp(
        redis_url=private_redis.url, gate_min_samples=0, auto_rollback_after_s=1.0, breaker_failure_threshold=1
    )
    with cp.client() as c:
        assert set_mode(c, "search", "enforce", reason="rollout").status_code == 200
        assert decide(c, route="search", key="ann").json()["enforced_by"] == "distributed"
        private_redis.kill()
        b = decide(c, route="search", key="ann").json()
        assert b["enforced_by"] == "failure_policy" and b["backend_error"]
        wait_until(lambda: route_view(c, "search")["mode"] == "shadow", 8.0, 0.1, "automatic rollback to shadow")
        backend = c.get("/v1/backend").json()
        assert backend["state"] in ("open", "half_open")
        assert backend["pending_rollbacks"] == ["search"]
        assert decide(c, route="search", key="ann").json()["enforced_by"] == "local"
        private_redis.start()

        def automatic_entry():
            r = c.get("/v1/rollout/audit", params={"route": "search"})
            if r.status_code != 200:
                return None
            return next((e for e in r.json()["entries"] if e["automatic"]), None)

        entry = wait_until(automatic_entry, 10.0, 0.2, "automatic audit entry")
        assert entry["from"] == "enforce" and entry["to"] == "shadow"
        assert entry["actor"] == "shadowlimit/auto-rollback"
        assert c.get("/v1/backend").json()["pending_rollbacks"] == []
        assert route_view(c, "search")["stored_mode"] == "shadow"
