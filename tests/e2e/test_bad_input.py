"""Bad input is refused early and by name, and nothing a request does is ever a bare 500
(never a 500): a real control plane under uvicorn on loopback, real HTTP, real Redis.

- rates whose arithmetic cannot be represented: 422 naming ``average`` (API), file:line
  (rules file), the setting (environment);
- an unexpected error: a generic 500 with an incident id that is in the log with the
  traceback, the connection kept; in a batch, the failing item's error in its place;
- strict types in request bodies; keys of ``PUT /ratelimit/config`` checked as
  ``/v1/decide`` checks them; more than 10,000 batch items refused before any is read;
- a rejected rules file put back to the rules in force clears the error.
"""

from __future__ import annotations

import logging

import orjson
import pytest
from cp_server import RULES_YAML, ControlPlaneServer, admin_headers, metric_value, wait_until, write_rules

from control_plane.observe.incidents import MESSAGE
from control_plane.settings import SettingsError, load_settings

ADMIN = admin_headers()


@pytest.fixture
def rules_file(tmp_path):
    return write_rules(tmp_path)


@pytest.fixture
def cp(redis_url, rules_file):
    with ControlPlaneServer(redis_url=redis_url, rules_path=rules_file, rules_poll_interval_s=0.05) as server:
        yield server


@pytest.fixture
def http(cp):
    with cp.client() as c:
        yield c


# --------------------------------------------------------------------------- tiny and huge rates


@pytest.mark.parametrize(
    "body",
    [
        {"route": "search", "average": 1e-9, "period": 86_400, "burst": 1},
        {"route": "search", "average": 1e-300},
        {
            "route": "search",
            "key": "k1",
            "average": 1,
            "period": 86_400,
            "burst": 1_000_000_000,
            "algorithm": "fixed_window",
        },
        {"route": "search", "average": 1e9, "period": 0.001, "algorithm": "gcra"},
    ],
)
def test_adjustment_that_cannot_be_represented_is_422_naming_average(http, body):
    r = http.put("/ratelimit/config", json={**body, "reason": "tiny"}, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request" and r.json()["field"] == "average"
    assert r.json()["message"].startswith("average: ")
    # nothing was stored: the route still decides, one item and in a batch
    assert http.get("/ratelimit/stats").json()["adjustments"] == []
    assert http.post("/v1/decide", json={"route": "search", "key": "k1"}).status_code == 200
    out = http.post(
        "/v1/decide/batch", json={"requests": [{"route": "search", "key": "k2"}, {"route": "login", "key": "k3"}]}
    )
    assert out.status_code == 200 and all(d["allowed"] for d in out.json()["decisions"])


def test_rules_file_with_a_tiny_average_is_refused_with_file_and_line(http, rules_file):
    rules_file.write_text(
        RULES_YAML.replace(
            "local: {average: 10, period: 1s, burst: 10}", "local:\n      average: 1.0e-300\n      burst: 10"
        )
    )
    r = http.post("/ratelimit/rules/reload", headers=ADMIN)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "invalid_rules" and body["field"] == "routes[0].local.average" and body["line"] == 7
    assert body["message"].startswith(f"{rules_file}:7: routes[0].local.average: 1e-300 per 1 s takes ")
    assert http.post("/v1/decide", json={"route": "search", "key": "k"}).status_code == 200  # the last good rules


@pytest.mark.parametrize(
    ("env", "overrides"),
    [
        ("RATE_LIMIT_GLOBAL_REFILL_PER_SEC", {"global_refill_per_sec": 1e-12}),
        ("RATE_LIMIT_GLOBAL_CAPACITY", {"global_capacity": 2_000_000_000_000}),
    ],
)
def test_a_default_route_that_cannot_be_represented_is_a_settings_error(env, overrides):
    with pytest.raises(SettingsError, match=rf"\n  {env}: "):
        load_settings(**overrides)


# --------------------------------------------------------------------------- unexpected errors


def test_unexpected_error_is_a_generic_500_with_an_incident_id(cp, http, caplog):
    async def broken(_inp, **_options):
        raise RuntimeError("secret internals /var/lib/thing")

    cp.engine.decider.decide = broken
    with caplog.at_level(logging.ERROR, logger="shadowlimit.incident"):
        r = http.post("/v1/decide", json={"route": "search", "key": "k"})
    assert r.status_code == 500
    body = r.json()
    assert body == {"error": "internal_error", "message": MESSAGE, "incident": body["incident"]}
    assert "secret" not in r.text and "RuntimeError" not in r.text
    logged = [rec for rec in caplog.records if body["incident"] in rec.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info[0] is RuntimeError  # once, with the traceback
    # the keep-alive connection still serves the next request
    assert http.get("/healthz").status_code == 200


@pytest.mark.parametrize("mode", ["shadow", "enforce"])
def test_batch_item_that_fails_unexpectedly_gets_an_error_in_its_place(cp, http, caplog, mode):
    assert (
        http.put("/v1/routes/search/mode", json={"mode": mode, "reason": "t", "force": True}, headers=ADMIN).status_code
        == 200
    )
    check = cp.engine.local.check

    def flaky(key, policy, cost=1, now_us=None):
        if key == "search:boom":
            raise OverflowError("cannot convert float infinity to integer")
        return check(key, policy, cost, now_us)

    cp.engine.local.check = flaky
    items = [
        {"route": "search", "key": "a"},
        {"route": "search", "key": "boom"},
        {"route": "nope", "key": "b"},
        {"route": "search", "key": "c"},
    ]
    with caplog.at_level(logging.ERROR, logger="shadowlimit.incident"):
        r = http.post("/v1/decide/batch", json={"requests": items})
    assert r.status_code == 200, r.text
    out = r.json()["decisions"]
    assert [d.get("allowed") for d in out] == [True, None, None, True]
    assert out[1] == {
        "error": "internal_error",
        "message": MESSAGE,
        "index": 1,
        "field": None,
        "status": 500,
        "incident": out[1]["incident"],
    }
    assert out[2]["error"] == "unknown_route" and out[2]["status"] == 404 and "incident" not in out[2]
    assert "OverflowError" not in r.text and "infinity" not in r.text
    assert any(out[1]["incident"] in rec.getMessage() and rec.exc_info for rec in caplog.records)


def test_batch_keeps_the_local_answers_when_the_distributed_step_fails_unexpectedly(cp, http):
    assert (
        http.put(
            "/v1/routes/export/mode", json={"mode": "enforce", "reason": "t", "force": True}, headers=ADMIN
        ).status_code
        == 200
    )

    async def broken(*args, **kwargs):
        raise KeyError("slot table")

    cp.engine.resilient.check_many = broken
    items = [{"route": "export", "key": "a"}, {"route": "search", "key": "b"}, {"route": "export", "key": "c"}]
    r = http.post("/v1/decide/batch", json={"requests": items})
    assert r.status_code == 200, r.text
    out = r.json()["decisions"]
    assert [d.get("status") for d in out] == [500, None, 500]
    assert out[1]["allowed"] is True and out[1]["mode"] == "shadow"  # search is not enforced: decided locally
    assert "slot table" not in r.text


# --------------------------------------------------------------------------- strict types


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/v1/decide", {"route": "search", "key": "k", "cost": "5"}, "cost"),
        ("POST", "/v1/decide", {"route": "search", "key": "k", "cost": True}, "cost"),
        ("POST", "/v1/decide", {"route": "search", "key": "k", "cost": 2.0}, "cost"),
        ("POST", "/v1/decide/batch", {"requests": [{"route": "search", "key": "k", "cost": "5"}]}, "requests.0.cost"),
        (
            "POST",
            "/v1/decide/batch",
            {"requests": [{"route": "search", "key": "k"}, {"route": "search", "key": "k", "cost": True}]},
            "requests.1.cost",
        ),
        ("PUT", "/v1/routes/search/mode", {"mode": "canary", "canary_percent": "10", "reason": "r"}, "canary_percent"),
        ("PUT", "/v1/routes/search/mode", {"mode": "shadow", "reason": "r", "force": "true"}, "force"),
        ("PUT", "/v1/routes/search/mode", {"mode": "shadow", "reason": "r", "force": 1}, "force"),
        ("PUT", "/ratelimit/config", {"route": "search", "average": 5, "burst": "5"}, "burst"),
        ("PUT", "/ratelimit/config", {"route": "search", "average": 5, "burst": True}, "burst"),
        ("PUT", "/ratelimit/config", {"route": "search", "average": 5, "burst": 5.0}, "burst"),
        ("PUT", "/ratelimit/config", {"route": "search", "average": "5"}, "average"),
        ("PUT", "/ratelimit/config", {"route": "search", "average": True}, "average"),
        ("PUT", "/ratelimit/config", {"route": "search", "average": 5, "period": "1"}, "period"),
        ("PUT", "/ratelimit/config", {"route": "search", "average": 5, "clear": "true"}, "clear"),
        ("PUT", "/ratelimit/config", {"route": "search", "average": 5, "clear": 1}, "clear"),
    ],
)
def test_strict_types_in_request_bodies(http, method, path, body, field):
    r = http.request(method, path, json=body, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request" and r.json()["field"] == field


def test_whole_numbers_are_fine_where_a_float_is_expected(http):
    r = http.put(
        "/ratelimit/config",
        json={"route": "search", "average": 5, "period": 2, "burst": 5, "reason": "ints"},
        headers=ADMIN,
    )
    assert r.status_code == 200, r.text
    assert r.json()["adjustments"][0]["local"] == {
        "algorithm": "token_bucket",
        "average": 5.0,
        "period": 2.0,
        "burst": 5,
    }


# --------------------------------------------------------------------------- keys of adjustments


@pytest.mark.parametrize("key", [" lead", "tab\tkey", "x" * 257, "zero\u200bwidth", "é" * 200])
def test_adjustment_keys_are_checked_as_decide_checks_them(http, key):
    decided = http.post("/v1/decide", json={"route": "search", "key": key})
    adjusted = http.put(
        "/ratelimit/config", json={"route": "search", "key": key, "average": 5, "reason": "k"}, headers=ADMIN
    )
    assert decided.status_code == adjusted.status_code == 422
    assert adjusted.json()["field"] == "key"
    if len(key) <= 256:  # longer keys are refused by the body schema first, on both
        assert adjusted.json() == decided.json()
        assert adjusted.json()["error"] == "invalid_key"
    assert http.get("/ratelimit/stats").json()["adjustments"] == []


# --------------------------------------------------------------------------- batch size


def test_more_than_10000_items_are_refused_before_any_is_validated(http):
    # the items are all bad: pydantic would name requests.0.cost first
    body = orjson.dumps({"requests": [{"route": "search", "key": "k", "cost": "x"}] * 10_001})
    r = http.post("/v1/decide/batch", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text[:300]
    assert r.json()["field"] == "requests"
    assert r.json()["message"] == "requests: at most 10000 items per batch, got 10001"
    assert len(r.json()["errors"]) == 1


# --------------------------------------------------------------------------- rules error recovery


def test_restoring_the_good_rules_file_clears_the_error(http, rules_file):
    good = rules_file.read_bytes()

    def state() -> tuple[str | None, float]:
        return http.get("/v1/routes").json()["rules_error"], metric_value(
            http.get("/metrics").text, "rate_limit_rules_valid"
        )

    rules_file.write_text(RULES_YAML.replace("burst: 10}", "burst: 0}", 1))
    err, valid = wait_until(lambda: (s := state())[0] is not None and s, timeout=10, what="the bad file to be reported")
    assert "routes[0].local.burst" in err and valid == 0.0
    rules_file.write_bytes(good)  # the rules in force: same digest, nothing to reload
    wait_until(lambda: state() == (None, 1.0), timeout=10, what="the error to clear")
    audit = wait_until(
        lambda: (a := http.get("/v1/rollout/audit").json()["entries"]) and a[0]["to"] == "ok" and a,
        timeout=10,
        what="the recovery's audit entry",
    )
    assert audit[0]["kind"] == "rules_reload" and "back to the rules in force" in audit[0]["reason"]
    assert audit[1]["kind"] == "rules_reload" and audit[1]["to"] == "error"
