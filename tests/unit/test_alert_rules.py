"""deploy/prometheus/alerts.yaml passes the real ``promtool check rules`` and its unit tests
(``promtool test rules``, deploy/prometheus/alerts_test.yaml); the docs quote its expressions
exactly; the dashboard's and the rules' PromQL is read as Prometheus would read it."""

from __future__ import annotations

import json
import re
import shutil

import yaml
from promql import (
    ALERTS,
    ALERTS_TEST,
    DASHBOARD,
    DOCS,
    ENVOY_METRICS,
    ENVOY_PREFIX,
    alert_rules,
    dashboard_queries,
    metric_names,
    normalise,
    promtool,
)


def test_promtool_check_rules():
    r = promtool("check", "rules", str(ALERTS))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in r.stdout


def test_promtool_unit_tests_pass():
    r = promtool("test", "rules", str(ALERTS_TEST))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_alert_has_a_firing_case():
    tests = yaml.safe_load(ALERTS_TEST.read_text())
    fired = {
        case["alertname"]
        for group in tests["tests"]
        for case in group.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert fired == set(alert_rules())
    for name, rule in alert_rules().items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_the_unit_tests_catch_a_counter_that_appears_at_1(tmp_path):
    """The same expectations fail when the rollback counter appears already at 1 (as it did
    before the counters were created at 0): the unit tests can tell."""
    shutil.copy(ALERTS, tmp_path / "alerts.yaml")
    text = ALERTS_TEST.read_text()
    first = "values: '0 0 0 1x15'"
    assert text.count(first) == 2  # the rolled-back replica's series, and a manual change's
    (tmp_path / "alerts_test.yaml").write_text(text.replace(first, "values: '_ _ _ 1x15'", 1))
    r = promtool("test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert r.returncode != 0, r.stdout
    assert "ShadowlimitAutomaticRollback" in r.stdout + r.stderr


def test_envoy_metrics_are_the_documented_ones():
    """A rule may read Envoy's metrics (scraped from Envoy, not exported by shadowlimit) only
    from the documented list, which test_observability checks against a real Envoy; the list
    holds nothing no rule reads; Envoy's alert keeps Envoy's cluster label."""
    named = {name: metric_names(rule["expr"]) for name, rule in alert_rules().items()}
    envoy = {n for names in named.values() for n in names if n.startswith(ENVOY_PREFIX)}
    assert envoy <= ENVOY_METRICS, envoy - ENVOY_METRICS
    assert envoy == ENVOY_METRICS
    assert all(n.startswith(ENVOY_PREFIX) for n in ENVOY_METRICS)
    readers = {name for name, names in named.items() if names & ENVOY_METRICS}
    assert readers == {"ShadowlimitEnvoyFailingOpen"}
    # shadowlimit's own alerts do not mix in Envoy's series (their check stays the exported one)
    assert named["ShadowlimitEnvoyFailingOpen"] <= ENVOY_METRICS
    assert "by (envoy_cluster_name)" in alert_rules()["ShadowlimitEnvoyFailingOpen"]["expr"]


def _doc(name: str) -> str:
    return (DOCS / name).read_text()


def test_docs_quote_the_rules_expressions():
    """Each alert in docs/observability.md's table shows alerts.yaml's expression and `for`;
    every "alert on `...`" in the docs is one of alerts.yaml's expressions; every PromQL
    block the docs introduce with an alert's name is that alert's expression."""
    rules = alert_rules()
    exprs = {normalise(r["expr"]) for r in rules.values()}
    rows = re.findall(r"^\| `(Shadowlimit\w+)` \| `([^`]+)` \| ([^|]+) \|", _doc("observability.md"), re.M)
    assert {name for name, _, _ in rows} == set(rules)
    for name, expr, hold in rows:
        assert normalise(expr.replace("\\|", "|")) == normalise(rules[name]["expr"]), name  # \| in a table
        assert hold.strip() == rules[name].get("for", "-"), name
    quoted = 0
    for doc in ("observability.md", "metrics.md", "rollout-runbook.md", "operations.md"):
        text = _doc(doc)
        for expr in re.findall(r"[Aa]lert on\s+`([^`]+)`", text):
            assert normalise(expr) in exprs, (doc, expr)
            quoted += 1
        for name, block in re.findall(r"`(Shadowlimit\w+)`[^\n`]*:\n\n```promql\n(.*?)```", text, re.S):
            assert normalise(block) == normalise(rules[name]["expr"]), (doc, name)
            quoted += 1
    assert quoted >= 5


def test_promql_reader():
    assert metric_names(
        'sum by (route) (rate(a_total{direction="x",route=~"$route"}[$__rate_interval])) / sum(b) > 0.01'
    ) == {"a_total", "b"}
    assert metric_names("histogram_quantile(0.99, sum by (le, mode) (rate(h_bucket[5m]))) > 1e-3") == {"h_bucket"}
    assert metric_names("(x == 1) and on (route) (max by (route) (y) == 1) or vector(0)") == {"x", "y"}
    assert metric_names("absent(shadowlimit_build_info)") == {"shadowlimit_build_info"}
    assert len(dashboard_queries()) >= 15


def test_dashboard_is_an_importable_grafana_dashboard():
    """Unique panel ids, a grid position each, every query on the dashboard's data source
    variable with its own refId, only the variables the dashboard defines."""
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "shadowlimit" and dash["schemaVersion"] >= 36
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "route"}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        targets = panel.get("targets", [])
        assert panel["type"] == "row" or targets, panel["title"]
        assert len({t["refId"] for t in targets}) == len(targets), panel["title"]
        for t in targets:
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            used = set(re.findall(r"\$(\w+)", t["expr"])) - {"__rate_interval"}
            assert used <= variables, (panel["title"], used)
