"""Rollout plans that drive themselves, on real Redis with two replicas and a real Prometheus
(Debian's) scraping a small upstream app whose error ratio the test flips:

- a plan walks shadow -> canary -> enforce on its own, each step audited once (actor ``plan``,
  automatic, every check's value and threshold), notified, counted;
- a limit too tight for the traffic fails and rolls back (or pauses, as configured);
- a flipped upstream error ratio rolls a canary back;
- a route without traffic never advances; a query Prometheus refuses pauses the plan with
  Prometheus' own error; Prometheus unreachable: the plan waits;
- an approval step waits for an operator (a viewer gets 403).

Durations are seconds, set in the plans; the replicas judge every 0.25 s.
"""

from __future__ import annotations

import hashlib
import textwrap
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from cp_server import ControlPlaneServer, free_port, metric_value, unique_namespace, write_rules
from plan_fleet import Receiver, Traffic, Upstream, upstream_ratio
from prom_server import Prometheus, prometheus
from support import eventually

pytestmark = pytest.mark.timeout(180)

FAST = {"plan_interval_s": 0.25, "plan_lease_s": 1.5, "rollout_resync_s": 0.2}
CLEAN = [f"c{i}" for i in range(60)]  # each well under every limit


def rules(plan: str, *, route: str = "search", distributed: str = "{average: 100, period: 1s, burst: 100}") -> str:
    body = textwrap.indent(textwrap.dedent(plan).strip(), " " * 6)
    return (
        "routes:\n"
        f"  - name: {route}\n"
        f"    match: {{path: /{route}/**}}\n"
        "    key: {strategy: header, header: X-Client-Id}\n"
        "    local: {average: 100, period: 1s, burst: 100}\n"
        f"    distributed: {distributed}\n"
        f"    rollout:\n{body}\n"
    )


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with Upstream(routes=("search", "export")) as up:
        yield up


@pytest.fixture
def prom(tmp_path: Path, upstream: Upstream) -> Iterator[Prometheus]:
    with prometheus(tmp_path / "prometheus", {"upstream": [f"127.0.0.1:{upstream.port}"]}) as p:
        ratio = upstream_ratio().replace("{route}", "search")
        eventually(lambda: p.query(ratio), 30, 0.2, "Prometheus to have the upstream's ratio")
        yield p


@contextmanager
def replicas(redis_url: str, tmp_path: Path, text: str, **settings: Any) -> Iterator[list[ControlPlaneServer]]:
    path = write_rules(tmp_path, text)
    ns = unique_namespace("plan")
    cps = [
        ControlPlaneServer(redis_url=redis_url, rules_path=path, namespace=ns, instance_id=f"r{i}", **FAST, **settings)
        for i in (1, 2)
    ]
    with ExitStack() as stack:
        for cp in cps:
            stack.enter_context(cp)
        yield cps


def plan_of(cp: ControlPlaneServer, route: str = "search") -> dict[str, Any]:
    r = httpx.get(cp.url + f"/v1/routes/{route}/plan", timeout=5)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def plan_steps(cp: ControlPlaneServer, route: str = "search") -> list[tuple[str, str, int, int]]:
    """The plan's mode changes in the audit trail, oldest first: (from, to, from %, to %)."""
    entries = httpx.get(cp.url + f"/v1/rollout/audit?route={route}&limit=200", timeout=5).json()["entries"]
    return [
        (e["from"], e["to"], e["from_percent"], e["to_percent"])
        for e in reversed(entries)
        if e["kind"] == "mode_change" and e["actor"] == "plan"
    ]


def mode_of(cp: ControlPlaneServer, route: str = "search") -> tuple[str, int]:
    routes = httpx.get(cp.url + "/v1/routes", timeout=5).json()["routes"]
    r = next(r for r in routes if r["name"] == route)
    return r["mode"], r["canary_percent"] if r["mode"] == "canary" else 0


def test_a_plan_walks_shadow_canary_enforce_on_its_own(redis_url, tmp_path, prom, upstream):
    text = rules(f"""
        steps: [{{shadow: 1s}}, {{canary: 50, for: 1s}}, enforce]
        analysis:
          min_compared: 30
          prometheus: [{{name: upstream 5xx, query: '{upstream_ratio()}', max: 0.05}}]
    """)
    with Receiver() as hook, replicas(redis_url, tmp_path, text, prometheus_url=prom.url, notify_url=hook.url) as cps:
        a, b = cps
        with Traffic([a.url, b.url], "search", CLEAN):
            done = eventually(lambda: plan_of(b)["state"] == "completed", 60, 0.1, "the plan to complete")
        assert done
        assert plan_steps(a) == [("shadow", "canary", 0, 50), ("canary", "enforce", 50, 0)]  # each step once
        assert mode_of(a) == mode_of(b) == ("enforce", 0)
        entries = httpx.get(a.url + "/v1/rollout/audit?route=search", timeout=5).json()["entries"]
        step = next(e for e in entries if e["kind"] == "mode_change" and e["to"] == "enforce")
        assert step["automatic"] is True and step["actor"] == "plan" and step["reason"] == "plan: canary 50% passed"
        checks = {c["name"]: c for c in step["gate"]["checks"]}
        assert set(checks) == {"compared decisions", "new rejection rate", "backend error rate", "upstream 5xx"}
        assert checks["upstream 5xx"]["threshold"] == "<= 0.05" and checks["upstream 5xx"]["value"] == 0.0
        assert checks["compared decisions"]["value"] >= 30 and checks["compared decisions"]["outcome"] == "pass"
        detail = plan_of(a)
        assert [s["status"] for s in detail["step_list"]] == ["passed", "passed", "passed"]
        assert detail["driver"].startswith(("r1#", "r2#")) and detail["source"] == "rules"
        listed = next(r for r in httpx.get(b.url + "/v1/routes", timeout=5).json()["routes"] if r["name"] == "search")
        assert listed["plan"]["state"] == "completed" and listed["plan"]["step"] == 3
        # counted: the steps once in the fleet, by the driver; the step gauge on both replicas
        texts = [httpx.get(cp.url + "/metrics", timeout=5).text for cp in cps]
        assert (
            sum(metric_value(t, "rate_limit_mode_changes_total", route="search", automatic="plan") for t in texts) == 2
        )
        assert all(metric_value(t, "rate_limit_plan_step", route="search") == 3 for t in texts)
        assert (
            sum(metric_value(t, "rate_limit_plan_analysis_total", route="search", outcome="pass") for t in texts) >= 2
        )
        # notified: started, each step, completed
        eventually(lambda: any("completed" in t for t in hook.texts()), 10, 0.05, "the notification of the end")
        said = hook.texts()
        assert any("moved to step 2 of 3 (canary 50%)" in t for t in said), said
        assert all(p["shadowlimit"]["route"] == "search" for p in hook.posts)


@pytest.mark.parametrize("on_failure", ["rollback", "pause"])
def test_a_limit_too_tight_fails_and_rolls_back_or_pauses(redis_url, tmp_path, on_failure):
    text = rules(
        f"""
        steps: [{{shadow: 1s}}, {{canary: 50, for: 30s}}, enforce]
        analysis: {{min_compared: 30, max_new_rejection_rate: 2%}}
        on_failure: {on_failure}
        """,
        route="export",
        distributed="{average: 2, period: 1s, burst: 2}",
    )
    with replicas(redis_url, tmp_path, text) as cps:
        a, b = cps
        with Traffic([a.url, b.url], "export", CLEAN) as traffic:
            eventually(lambda: plan_of(a, "export")["current"] == "canary 50%", 60, 0.1, "the plan to reach canary")
            traffic.set(["hot"])  # one client, far over the global limit the canary enforces
            paused = eventually(
                lambda: (p := plan_of(b, "export"))["state"] == "paused" and p, 60, 0.1, "the plan to stop"
            )
        assert "analysis failed: new rejection rate: new rejections" in paused["reason"]
        if on_failure == "rollback":
            assert "rolled back to shadow" in paused["reason"] and paused["current"] == "shadow"
            assert plan_steps(a, "export") == [("shadow", "canary", 0, 50), ("canary", "shadow", 50, 0)]
            eventually(lambda: mode_of(a, "export") == mode_of(b, "export") == ("shadow", 0), 5, 0.1, "shadow")
        else:
            assert paused["current"] == "canary 50%"
            assert plan_steps(a, "export") == [("shadow", "canary", 0, 50)]
            assert mode_of(a, "export") == ("canary", 50)
        # the analysis that stopped it, as every replica shows it (the driver shares it within a turn)
        failed = eventually(
            lambda: (c := plan_of(b, "export")["checks"][1])["outcome"] == "fail" and c, 5, 0.05, "the failed check"
        )
        assert failed["name"] == "new rejection rate" and failed["value"] > 0.02
        assert paused["waits_for"] == "an operator: shadowlimit plan export --resume"


def test_a_budget_plan_is_judged_by_what_its_new_rejections_cost(redis_url, tmp_path):
    """A budget route whose plan weighs cost: sixty tenants spending 10 tokens a request pass
    shadow into canary; then one tenant spending 900 a request, a sixty-first of the requests but
    most of the tokens, is newly refused by the global budget, and the plan rolls back on the
    cost share (weighing requests, its 1.6% would pass the 5% threshold)."""
    text = (
        rules(
            """
            steps: [{shadow: 1s}, {canary: 50, for: 30s}, enforce]
            analysis: {min_compared: 30, max_new_rejection_rate: 5%, gate_weight: cost}
            on_failure: rollback
            """,
            route="chat",
            distributed="{average: 100, period: 1s, burst: 1000}",
        ).replace("{average: 100, period: 1s, burst: 100}\n", "{average: 100000, period: 1s, burst: 100000}\n", 1)
        + "    budget: {}\n    cost_unit: tokens\n"
    )
    costs = {**dict.fromkeys(CLEAN, 10), "whale": 900}
    with replicas(redis_url, tmp_path, text) as cps:
        a, b = cps
        with Traffic([a.url, b.url], "chat", CLEAN, costs=costs) as traffic:
            eventually(lambda: plan_of(a, "chat")["current"] == "canary 50%", 60, 0.1, "the plan to reach canary")
            entries = httpx.get(a.url + "/v1/rollout/audit?route=chat", timeout=5).json()["entries"]
            step = next(e for e in entries if e["kind"] == "mode_change" and e["to"] == "canary")
            checks = {c["name"]: c for c in step["gate"]["checks"]}
            assert checks["new rejection cost share"]["outcome"] == "pass", checks
            traffic.set([*CLEAN, "whale"])
            paused = eventually(lambda: (p := plan_of(b, "chat"))["state"] == "paused" and p, 60, 0.1, "a rollback")
        assert "analysis failed: new rejection cost share: new rejections worth" in paused["reason"], paused
        assert "rolled back to shadow" in paused["reason"] and paused["current"] == "shadow"
        failed = eventually(
            lambda: (c := plan_of(b, "chat")["checks"][1])["outcome"] == "fail" and c, 5, 0.05, "the failed check"
        )
        assert failed["name"] == "new rejection cost share" and failed["value"] > 0.05, failed
        totals = httpx.get(a.url + "/v1/divergence?minutes=2", timeout=5).json()["routes"]["chat"]["totals"]
        requests_share = totals["local_allow_distributed_deny"] / totals["compared"]
        assert requests_share < 0.05 < failed["value"], (requests_share, failed)


def test_a_flipped_upstream_error_ratio_rolls_a_canary_back(redis_url, tmp_path, prom, upstream):
    text = rules(f"""
        steps: [{{shadow: 1s}}, {{canary: 10, for: 1s}}, {{canary: 50, for: 60s}}, enforce]
        analysis:
          min_compared: 20
          prometheus: [{{name: upstream 5xx, query: '{upstream_ratio("3s")}', max: 0.05}}]
    """)
    with replicas(redis_url, tmp_path, text, prometheus_url=prom.url) as cps:
        a, b = cps
        with Traffic([a.url, b.url], "search", CLEAN):
            eventually(lambda: plan_of(a)["current"] == "canary 50%", 60, 0.1, "the plan to reach canary 50%")
            upstream.error_ratio = 0.3  # the protected service gets sicker
            paused = eventually(lambda: (p := plan_of(b))["state"] == "paused" and p, 60, 0.1, "the plan to stop")
        assert paused["reason"].startswith("analysis failed: upstream 5xx: ") and "is above 0.05" in paused["reason"]
        assert paused["reason"].endswith("rolled back to canary 10%")
        assert plan_steps(a)[-1] == ("canary", "canary", 50, 10)
        eventually(lambda: mode_of(a) == mode_of(b) == ("canary", 10), 5, 0.1, "both replicas at canary 10%")
        entries = httpx.get(a.url + "/v1/rollout/audit?route=search", timeout=5).json()["entries"]
        back = next(
            e for e in entries if e["kind"] == "mode_change" and e["to_percent"] == 10 and e["from_percent"] == 50
        )
        upstream_check = next(c for c in back["gate"]["checks"] if c["name"] == "upstream 5xx")
        assert upstream_check["outcome"] == "fail" and upstream_check["value"] > 0.05


def test_a_route_without_traffic_never_advances(redis_url, tmp_path, prom):
    # the plan names its Prometheus itself (analysis.url): no SHADOWLIMIT_PROMETHEUS_URL here
    text = rules(f"""
        steps: [{{shadow: 0.2s}}, {{canary: 50, for: 0.2s}}, enforce]
        analysis:
          min_compared: 10
          url: {prom.url}
          prometheus: [{{name: upstream 5xx, query: '{upstream_ratio()}', max: 0.05}}]
    """)
    with replicas(redis_url, tmp_path, text) as cps:
        a, b = cps

        def judged_often() -> float:
            return sum(
                metric_value(httpx.get(cp.url + "/metrics", timeout=5).text, "rate_limit_plan_analysis_total",
                             route="search", outcome="inconclusive")
                for cp in cps
            )  # fmt: skip

        eventually(lambda: judged_often() >= 20, 30, 0.1, "twenty analyses")
        plan = plan_of(b)
        assert (plan["state"], plan["step"], plan["current"]) == ("waiting", 1, "shadow")
        assert plan["waits_for"] == "compared decisions: only 0 since the step began (need 10)"
        assert plan["first_problem"]["name"] == "compared decisions"
        upstream_check = next(c for c in plan["checks"] if c["name"] == "upstream 5xx")
        assert upstream_check["outcome"] == "pass"  # the service is healthy: traffic is what is missing
        assert plan_steps(a) == [] and mode_of(a) == ("shadow", 0)
        assert all(r["verdict"] == "inconclusive" for r in plan["recent"]) and len(plan["recent"]) == 10


def test_a_query_prometheus_refuses_pauses_the_plan_with_its_error(redis_url, tmp_path, prom):
    text = rules("""
        steps: [{shadow: 0.2s}, enforce]
        analysis:
          min_compared: 10
          prometheus: [{name: broken, query: 'sum(rate(upstream_requests_total[1m]', max: 1}]
    """)
    with replicas(redis_url, tmp_path, text, prometheus_url=prom.url) as cps:
        paused = eventually(lambda: (p := plan_of(cps[1]))["state"] == "paused" and p, 30, 0.1, "the plan to pause")
        assert paused["reason"].startswith("broken: Prometheus refused the query (bad_data): ")
        assert "parse error" in paused["reason"]  # Prometheus' own words
        assert paused["current"] == "shadow" and plan_steps(cps[0]) == [] and mode_of(cps[0]) == ("shadow", 0)


def test_prometheus_unreachable_is_inconclusive_never_a_pass(redis_url, tmp_path):
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    text = rules("""
        steps: [{shadow: 0.2s}, enforce]
        analysis:
          min_compared: 5
          prometheus: [{name: upstream 5xx, query: 'vector(0)', max: 1}]
    """)
    with replicas(redis_url, tmp_path, text, prometheus_url=down) as cps:
        a, b = cps
        with Traffic([a.url, b.url], "search", CLEAN):
            plan = eventually(
                lambda: (p := plan_of(b))["waits_for"] and "Prometheus unreachable" in p["waits_for"] and p,
                30,
                0.1,
                "the plan to wait for Prometheus",
            )
            eventually(lambda: plan_of(a)["checks"][0]["value"] >= 5, 30, 0.1, "enough decisions")
            plan = plan_of(a)
        assert plan["state"] == "waiting" and plan["current"] == "shadow"
        assert plan["first_problem"]["name"] == "upstream 5xx" and plan["first_problem"]["outcome"] == "inconclusive"
        assert plan_steps(a) == [] and mode_of(a) == ("shadow", 0)


VIEWER, OPERATOR = "vera-token-0123456789", "otto-token-0123456789"


def _tokens(tmp_path: Path) -> str:
    path = tmp_path / "tokens"
    sha = {t: hashlib.sha256(t.encode()).hexdigest() for t in (VIEWER, OPERATOR)}
    path.write_text(f"vera viewer {sha[VIEWER]}\notto operator {sha[OPERATOR]}\n")
    return str(path)


def test_an_approval_step_waits_for_an_operator(redis_url, tmp_path):
    text = rules("""
        steps: [{shadow: 0.5s}, approve, enforce]
        analysis: {min_compared: 20}
    """)
    with (
        Receiver() as hook,
        replicas(redis_url, tmp_path, text, tokens_file=_tokens(tmp_path), notify_url=hook.url) as cps,
    ):
        a, b = cps
        viewer, operator = ({"Authorization": f"Bearer {t}"} for t in (VIEWER, OPERATOR))
        with Traffic([a.url, b.url], "search", CLEAN):
            waiting = eventually(
                lambda: (p := httpx.get(b.url + "/v1/routes/search/plan", headers=viewer, timeout=5).json())["state"]
                == "waiting_for_approval" and p,
                60, 0.1, "the plan to wait for an approval",
            )  # fmt: skip
            assert waiting["waits_for"] == "an operator's approval: shadowlimit plan search --approve"
            assert mode_of_with(a, viewer) == ("shadow", 0)
            eventually(lambda: any("waiting for an approval" in t for t in hook.texts()), 10, 0.05, "the notification")
            refused = httpx.post(b.url + "/v1/routes/search/plan/approve", json={"reason": "go"}, headers=viewer)
            assert refused.status_code == 403
            # the analysis keeps running while it waits; nothing moves without the operator
            seen = eventually(lambda: plan_of_with(a, viewer)["analysed_at"], 10, 0.05, "an analysis while it waits")
            eventually(lambda: plan_of_with(a, viewer)["analysed_at"] > seen, 10, 0.05, "another analysis")
            assert plan_of_with(a, viewer)["state"] == "waiting_for_approval" and plan_steps_with(a, viewer) == []
            approved = httpx.post(
                b.url + "/v1/routes/search/plan/approve", json={"reason": "dashboards look fine"}, headers=operator
            )
        assert approved.status_code == 200, approved.text
        body = approved.json()
        assert body["plan"]["state"] == "completed" and body["audit"]["to"] == "enforce"
        assert body["audit"]["actor"].startswith("otto@") and body["audit"]["reason"] == "approve: dashboards look fine"
        eventually(lambda: mode_of_with(a, viewer) == ("enforce", 0), 5, 0.05, "the other replica to enforce")
        again = httpx.post(b.url + "/v1/routes/search/plan/approve", json={"reason": "twice"}, headers=operator)
        assert again.status_code == 409 and "not waiting for an approval" in again.json()["message"]


def plan_of_with(cp: ControlPlaneServer, headers: dict[str, str]) -> dict[str, Any]:
    return httpx.get(cp.url + "/v1/routes/search/plan", headers=headers, timeout=5).json()  # type: ignore[no-any-return]


def plan_steps_with(cp: ControlPlaneServer, headers: dict[str, str]) -> list[tuple[str, str, int, int]]:
    entries = httpx.get(cp.url + "/v1/rollout/audit?route=search", headers=headers, timeout=5).json()["entries"]
    return [
        (e["from"], e["to"], e["from_percent"], e["to_percent"])
        for e in reversed(entries)
        if e["kind"] == "mode_change" and e["actor"] == "plan"
    ]


def mode_of_with(cp: ControlPlaneServer, headers: dict[str, str]) -> tuple[str, int]:
    routes = httpx.get(cp.url + "/v1/routes", headers=headers, timeout=5).json()["routes"]
    r = next(r for r in routes if r["name"] == "search")
    return r["mode"], r["canary_percent"] if r["mode"] == "canary" else 0
