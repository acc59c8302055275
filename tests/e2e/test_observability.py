"""deploy/'s dashboard and alert rules against real control planes and a real Prometheus.

- a fresh replica's ``/metrics`` has every known label set at 0 (a second replica too, and a
  route a rules reload adds), so the first event is an increase Prometheus sees;
- every metric the dashboard's and the rules' PromQL names is on a running control plane's
  ``/metrics`` -- but Envoy's, which the rules read as Prometheus scrapes them from Envoy: those
  are the documented ``promql.ENVOY_METRICS``, each on a real Envoy's ``/stats/prometheus``;
- a real Prometheus (Debian's ``/usr/bin/prometheus``: its own configuration, storage and
  loopback port, scraping every second, ``alerts.yaml`` loaded) scrapes a control plane: every
  dashboard query runs, the key ones return series, the first manual mode change shows as an
  increase, every rule evaluates, and ``ShadowlimitNoLiveInstances`` goes pending once the only
  replica is gone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from cp_server import RULES_YAML, ControlPlaneServer, admin_headers, free_port, started, unique_namespace, write_rules
from envoy_proxy import EnvoyProxy, rate_limit, request_headers
from envoy_proxy import route as envoy_route
from prom_server import prometheus
from prometheus_client.parser import text_string_to_metric_families
from promql import ENVOY_METRICS, alert_rules, dashboard_queries, exported_names, metric_names
from support import eventually

from control_plane.observe.metrics import DECISION_ENFORCERS

ROUTES = ("search", "login", "export", "default")
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def series(text: str) -> Series:
    """Every sample of a Prometheus text exposition, by name and labels."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def at(s: Series, name: str, **labels: str) -> float | None:
    """The sample's value, None when the series does not exist."""
    return s.get((name, frozenset(labels.items())))


def assert_route_series_at_0(s: Series, route: str) -> None:
    for mode, enforcers in DECISION_ENFORCERS.items():
        for automatic in ("true", "false", "plan"):
            assert at(s, "rate_limit_mode_changes_total", route=route, to=mode, automatic=automatic) == 0, (route, mode)
        for by in enforcers:
            for allowed in ("true", "false"):
                got = at(s, "rate_limit_decisions_total", route=route, mode=mode, enforced_by=by, allowed=allowed)
                assert got == 0, (route, mode, by, allowed)
    for direction in ("agree", "local_allow_distributed_deny", "local_deny_distributed_allow"):
        assert at(s, "rate_limit_shadow_divergence_total", route=route, direction=direction) == 0, (route, direction)
    assert at(s, "rate_limit_shadow_dropped_total", route=route) == 0, route
    assert at(s, "rate_limit_plan_step", route=route) == 0, route
    for state in ("running", "waiting", "waiting_for_approval", "paused", "completed", "aborted"):
        assert at(s, "rate_limit_plan_state", route=route, state=state) == 0, (route, state)
    for outcome in ("pass", "fail", "inconclusive", "refused"):
        assert at(s, "rate_limit_plan_analysis_total", route=route, outcome=outcome) == 0, (route, outcome)


def metrics_of(cp: ControlPlaneServer) -> str:
    r = httpx.get(cp.url + "/metrics", timeout=10)
    assert r.status_code == 200, r.text
    return r.text


@pytest.fixture
def fleet(redis_url, tmp_path):
    rules = write_rules(tmp_path)
    ns = unique_namespace("obs")
    a = ControlPlaneServer(redis_url=redis_url, rules_path=rules, namespace=ns, instance_id="obs-a")
    b = ControlPlaneServer(redis_url=redis_url, rules_path=rules, namespace=ns, instance_id="obs-b")
    with started(a, b):
        yield a, b, rules


def test_fresh_replicas_export_every_known_series_at_0(fleet):
    a, b, rules = fleet
    for cp in (a, b):
        s = series(metrics_of(cp))
        for route in ROUTES:
            assert_route_series_at_0(s, route)
        for policy in ("passThrough", "failClosed", "inMemoryFallback"):
            assert at(s, "rate_limit_fallback_decisions_total", policy=policy) == 0
        for reason in ("local_exhausted", "distributed_exhausted", "backend_error", "fallback_exhausted", "deny_list"):
            assert at(s, "rate_limit_rejections_total", reason=reason) == 0
        for to in ("closed", "open", "half_open"):
            assert at(s, "rate_limit_breaker_transitions_total", to=to) == 0
        for result in ("sent", "retried", "failed", "dropped"):
            assert at(s, "rate_limit_notifications_total", result=result) == 0
        assert at(s, "rate_limit_state_restorations_total") == 0
    # a manual change on a: a's series goes 0 -> 1; b follows the mode but applied nothing
    with a.client() as c:
        r = c.put(
            "/v1/routes/search/mode",
            json={"mode": "canary", "canary_percent": 50, "reason": "obs test", "force": True},
            headers=admin_headers(),
        )
        assert r.status_code == 200, r.text
    sa = series(metrics_of(a))
    assert at(sa, "rate_limit_mode_changes_total", route="search", to="canary", automatic="false") == 1
    eventually(
        lambda: at(series(metrics_of(b)), "rate_limit_route_mode", route="search", mode="canary") == 1,
        10,
        what="b to follow the mode change",
    )
    sb = series(metrics_of(b))
    assert at(sb, "rate_limit_mode_changes_total", route="search", to="canary", automatic="false") == 0
    assert at(sb, "rate_limit_mode_changes_total", route="search", to="shadow", automatic="true") == 0
    # a route a reload adds gets its series at 0 at once
    rules.write_text(rules.read_text() + _EXTRA_ROUTE)
    with a.client() as c:
        r = c.post("/ratelimit/rules/reload", headers=admin_headers())
        assert r.status_code == 200, r.text
    assert_route_series_at_0(series(metrics_of(a)), "reports")


_EXTRA_ROUTE = """\
  - name: reports
    match: {methods: [GET], path: /api/reports/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 5, period: 1s, burst: 5}
"""


#: a budget route: its estimates' histogram exists at 0 from the start
BUDGET_ROUTE = """\
  - name: chat
    match: {methods: [POST], path: /v1/chat/**}
    key: {strategy: header, header: X-Tenant}
    local: {average: 1000, period: 1m, burst: 1000}
    budget: {reservation_ttl: 1m}
"""


def test_dashboard_and_rules_name_only_exported_metrics(redis_url, test_pki, tmp_path):
    envoy = tmp_path / "envoy.yaml"  # Envoy's series exist for the routes of an Envoy config
    envoy.write_text("domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
    rules = write_rules(tmp_path, RULES_YAML + BUDGET_ROUTE)
    # the TLS series exist for a port with TLS: the HTTP port's settings say so (this harness serves
    # it in cleartext), the gRPC port stays cleartext for the real Envoy below
    tls = {"tls_cert_file": test_pki.server_cert, "tls_key_file": test_pki.server_key, "grpc_tls": False}
    with ControlPlaneServer(
        redis_url=redis_url, rules_path=rules, envoy_config=str(envoy), grpc_port=free_port(), **tls
    ) as cp:
        exported = exported_names(metrics_of(cp))  # a fresh replica: nothing decided yet
        envoy_exported = envoy_metric_names(cp.settings.grpc_port, tmp_path)
    assert ENVOY_METRICS <= envoy_exported, sorted(ENVOY_METRICS - envoy_exported)
    named: dict[str, set[str]] = {}
    for where, expr in dashboard_queries():
        named[f"dashboard {where}: {expr}"] = metric_names(expr)
    for name, rule in alert_rules().items():
        named[f"alert {name}"] = metric_names(rule["expr"])
    assert all(named.values()), [k for k, v in named.items() if not v]
    # shadowlimit's metrics from its /metrics; Envoy's only from the documented list, read above
    # from a real Envoy (the dashboard reads none of them)
    missing = {
        where: sorted(gone)
        for where, names in named.items()
        if (gone := (names - ENVOY_METRICS - exported) | (names & ENVOY_METRICS) - envoy_exported)
    }
    assert not missing, missing
    assert not any(metric_names(expr) & ENVOY_METRICS for _, expr in dashboard_queries())


def envoy_metric_names(grpc_port: int, tmp_path: Path) -> set[str]:
    """The names on real Envoys' admin ``/stats/prometheus`` once their rate limit filter has
    counted each outcome (its counters appear at their first increment): calls answered OK and
    OVER_LIMIT by the control plane on ``grpc_port`` (descriptor ``k``: 5 per second), and calls
    failing against a closed port (let through: ``failure_mode_deny: false``)."""
    names: set[str] = set()
    routes = [envoy_route("/k", rate_limit(request_headers("x-k", "k")))]
    with EnvoyProxy(grpc_port, domain="edge", routes=routes, timeout_ms=1000, workdir=tmp_path / "envoy") as envoy:
        for _ in range(50):
            assert envoy.get("/k", headers={"x-k": "v"}).status_code in (200, 429)
            counted = envoy.ratelimit_stats()
            if counted["ok"] and counted["over_limit"]:
                break
        assert counted["ok"] and counted["over_limit"], counted
        names |= exported_names(envoy.admin("/stats/prometheus").text)
    with EnvoyProxy(free_port(), domain="edge", routes=routes, workdir=tmp_path / "envoy-down") as envoy:
        assert envoy.get("/k", headers={"x-k": "v"}).status_code == 200  # let through
        assert envoy.ratelimit_stats()["failure_mode_allowed"] == 1
        names |= exported_names(envoy.admin("/stats/prometheus").text)
    return names


# -- a real Prometheus ---------------------------------------------------------------------


def grafana(expr: str) -> str:
    """A dashboard expression as Grafana would send it: all routes, a 1m rate interval."""
    return expr.replace("$route", ".*").replace("$__rate_interval", "1m")


def value(sample: dict[str, Any]) -> float:
    return float(sample["value"][1])


def where(samples: list[dict[str, Any]], **labels: str) -> list[float]:
    return [value(s) for s in samples if all(s["metric"].get(k) == v for k, v in labels.items())]


#: the dashboard's key panels and what their first query must show once traffic was scraped
KEY_PANELS: dict[str, Callable[[list[dict[str, Any]]], bool]] = {
    "Route modes": lambda r: bool(where(r, route="search", mode="canary")) and bool(where(r, route="export")),
    "New-rejection ratio (would-be rejections / compared)": lambda r: any(v > 0 for v in where(r, route="export")),
    "Divergence per route and direction": lambda r: any(
        v > 0 for v in where(r, route="export", direction="local_allow_distributed_deny")
    ),
    "Would-be rejections": lambda r: any(v > 0 for v in where(r, route="export")),
    # export's global limit is far stricter than its local one, on one replica: the new limit is tighter
    "Why new rejections happen (share by cause)": lambda r: any(
        v > 0.9 for v in where(r, route="export", cause="tighter")
    ),
    "Mode changes": lambda r: any(v > 0 for v in where(r, route="search", to="canary", automatic="false")),
    "Decisions by mode": lambda r: (
        any(v > 0 for v in where(r, mode="shadow")) and any(v > 0 for v in where(r, mode="canary"))
    ),
    "Rejections by enforcer": lambda r: bool(where(r, route="export", enforced_by="local")),
    "Decision latency": lambda r: any(math.isfinite(v) for v in where(r, mode="shadow")),
    "Breaker state": lambda r: where(r, state="closed") == [1.0] and where(r, state="open") == [0.0],
    "Fallback decisions": lambda r: (
        sorted(s["metric"]["policy"] for s in r) == ["failClosed", "inMemoryFallback", "passThrough"]
    ),
    "Shadow drops": lambda r: sorted(s["metric"]["route"] for s in r) == sorted(ROUTES),
    "Replicas and rules": lambda r: len(r) == 1 and value(r[0]) == 1,
    "Replica clock against Redis": lambda r: len(r) == 1 and abs(value(r[0])) < 0.25,
}


def _traffic(c: httpx.Client, n: int, tag: str) -> None:
    for i in range(n):
        for route in ("search", "export"):
            r = c.post("/v1/decide", json={"route": route, "key": f"{tag}-{i % 3}"})
            assert r.status_code in (200, 429), r.text


def test_real_prometheus_scrapes_a_control_plane(redis_url, tmp_path):
    cp = ControlPlaneServer(redis_url=redis_url, rules_path=write_rules(tmp_path)).start()
    try:
        with prometheus(tmp_path / "prometheus", {"shadowlimit": [f"127.0.0.1:{cp.port}"]}) as prom, cp.client() as c:
            eventually(lambda: where(prom.query('up{job="shadowlimit"}'), job="shadowlimit") == [1.0], 30)
            # the zero was scraped before the change: the change is an increase
            zero = 'rate_limit_mode_changes_total{route="search",to="canary",automatic="false"}'
            eventually(lambda: [value(s) for s in prom.query(zero)] == [0.0], 30, what="the series at 0")
            _traffic(c, 20, "before")
            r = c.put(
                "/v1/routes/search/mode",
                json={"mode": "canary", "canary_percent": 50, "reason": "obs test", "force": True},
                headers=admin_headers(),
            )
            assert r.status_code == 200, r.text
            _traffic(c, 20, "after")
            cp.settle()
            rollout = 'increase(rate_limit_mode_changes_total{automatic="false"}[1m]) > 0'
            eventually(lambda: where(prom.query(rollout), route="search", to="canary"), 30, what=rollout)

            queries = dashboard_queries()
            first = {}
            for title, expr in queries:
                first.setdefault(title, expr)
                prom.query(grafana(expr))  # every query runs (an empty answer is an answer)
            assert set(KEY_PANELS) <= set(first)
            for title, check in KEY_PANELS.items():
                eventually(lambda t=title, ok=check: ok(prom.query(grafana(first[t]))), 30, what=title)

            def evaluated() -> list[dict[str, Any]]:
                rules = prom.rules()
                return rules if all(r.get("lastEvaluation", "").startswith("2") for r in rules) else []

            rules = eventually(evaluated, 30, what="every rule evaluated")
            assert {r["name"]: r["health"] for r in rules} == dict.fromkeys(alert_rules(), "ok")
            # export's tight global limit newly rejects most of its requests: above the gate (for
            # 10m, so pending, once an evaluation has seen the scrape that shows it); nothing else is wrong
            expected = {**dict.fromkeys(alert_rules(), "inactive"), "ShadowlimitDivergenceAboveGate": "pending"}

            def states() -> bool:
                now = {r["name"]: r["state"] for r in evaluated()}
                assert now == expected, now  # reported by eventually() if it never holds
                return True

            eventually(states, 30, what="the alert states")
            rules = prom.rules()
            gate = next(r for r in rules if r["name"] == "ShadowlimitDivergenceAboveGate")
            assert [a["labels"]["route"] for a in gate["alerts"]] == ["export"]

            # the only replica goes away: no live instance (pending for its 1m `for`)
            cp.stop()

            def no_live() -> str:
                return next(r["state"] for r in prom.rules() if r["name"] == "ShadowlimitNoLiveInstances")

            eventually(lambda: no_live() == "pending", 30, what="ShadowlimitNoLiveInstances pending")
    finally:
        cp.stop()
