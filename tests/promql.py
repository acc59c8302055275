"""deploy/'s Grafana dashboard and Prometheus alert rules, read for tests: their PromQL
expressions, the metric names those expressions read, and the real ``promtool``.

``metric_names(expr)`` is a small PromQL reader, enough for the expressions deploy/ holds:
it drops string literals, label matchers (``{...}``), ranges (``[...]``), grouping clauses
(``by (...)``, ``on (...)``, ...), function calls' names, keywords and numbers; what remains
are the metric names.

The rules read shadowlimit's metrics, and Envoy's counters of its rate limit filter (one alert:
Envoy letting requests through unlimited). Those are not on shadowlimit's ``/metrics``: they
are the documented list :data:`ENVOY_METRICS`, every name of the rules with Envoy's ``envoy_``
prefix must be on it, and tests/e2e/test_observability.py reads them from a real Envoy's admin
``/stats/prometheus`` (as it reads shadowlimit's own from a running control plane).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from support import installed_binary

__all__ = [
    "ALERTS",
    "ALERTS_TEST",
    "DASHBOARD",
    "DOCS",
    "ENVOY_METRICS",
    "ENVOY_PREFIX",
    "alert_rules",
    "dashboard_queries",
    "exported_names",
    "metric_names",
    "normalise",
    "promtool",
]

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
ALERTS_TEST = ROOT / "deploy" / "prometheus" / "alerts_test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "shadowlimit.json"
DOCS = ROOT / "docs"

#: the prefix of every metric Prometheus scrapes from Envoy's admin ``/stats/prometheus``
ENVOY_PREFIX = "envoy_"
#: Envoy's metrics the rules may read: the http ratelimit filter's counters
#: ``cluster.<route's cluster>.ratelimit.{ok,over_limit,error,failure_mode_allowed}`` as
#: ``/stats/prometheus`` names them (label ``envoy_cluster_name``; verified on Envoy 1.40). Each
#: appears at its first increment, not at 0.
ENVOY_METRICS = frozenset(
    {
        "envoy_cluster_ratelimit_ok",
        "envoy_cluster_ratelimit_over_limit",
        "envoy_cluster_ratelimit_error",
        "envoy_cluster_ratelimit_failure_mode_allowed",
    }
)

_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "inf", "nan", "atan2",
}  # fmt: skip
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.$:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?!\w)(\s*\()?")


def normalise(expr: str) -> str:
    """``expr`` with its whitespace runs made single spaces (how docs and files are compared)."""
    return " ".join(expr.split())


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values, regexes)
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges and subqueries
    s = _GROUPING.sub(" ", s)
    s = re.sub(r"\$\w+", " ", s)  # Grafana variables outside matchers
    names = set()
    for m in _IDENT.finditer(s):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def exported_names(metrics_text: str) -> set[str]:
    """The sample names in a Prometheus text exposition (``_bucket``, ``_sum``, ... included)."""
    out = set()
    for line in metrics_text.splitlines():
        if line and not line.startswith("#"):
            out.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return out


def alert_rules() -> dict[str, dict[str, Any]]:
    """alerts.yaml's alerting rules by name."""
    doc = yaml.safe_load(ALERTS.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    by_name = {r["alert"]: r for r in rules}
    assert len(by_name) == len(rules), "an alert name is used twice"
    return by_name


def dashboard_queries() -> list[tuple[str, str]]:
    """Every PromQL expression of the dashboard as (panel title, expression), the template
    variables' ``label_values(metric, label)`` queries as (``$name``, metric)."""
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", var["query"]["query"])
            assert m, f"${var['name']}: not a label_values(metric, label) query"
            out.append((f"${var['name']}", m.group(1)))
    return out


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real promtool (Debian's prometheus package), bounded."""
    argv = [installed_binary("promtool", "prometheus"), *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
