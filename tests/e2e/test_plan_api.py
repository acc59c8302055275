"""Rollout plans through the API, on real Redis with two replicas: a plan set at run time wins
over the rules file's until deleted (audited, kept in Redis, seen by both replicas); bad plans
are 422s naming the field the rules file would; a viewer reads and gets 403 for a change; a
manual mode change pauses a running plan in the same write; an Envoy route takes a plan; abort
moves the route back to the plan's first step; notifications are retried, counted and never
hold the plan up."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from cp_server import ControlPlaneServer, admin_headers, free_port, metric_value, unique_namespace, write_rules
from plan_fleet import Receiver, Traffic
from support import eventually

pytestmark = pytest.mark.timeout(120)

FAST = {"plan_interval_s": 0.25, "plan_lease_s": 1.5, "rollout_resync_s": 0.2}
CLEAN = [f"c{i}" for i in range(60)]
RULES = """\
routes:
  - name: search
    match: {path: /search/**}
    key: {strategy: header, header: X-Client-Id}
    local: 100/second
    rollout:
      steps: [{shadow: 10m}, enforce]
      analysis: {min_compared: 10}
  - name: checkout
    match: {path: /checkout/**}
    key: {strategy: header, header: X-Client-Id}
    local: 100/second
"""
PLAN = {"steps": [{"shadow": "0.3s"}, {"canary": 20, "for": "60s"}, "enforce"], "analysis": {"min_compared": 10}}
VIEWER = "vera-token-0123456789"


@contextmanager
def replicas(
    redis_url: str, tmp_path: Path, *, rules: str = RULES, each: tuple[dict[str, Any], ...] = ({}, {}), **settings: Any
) -> Iterator[list[ControlPlaneServer]]:
    """Two replicas of one fleet (``each``: what differs between them, a gRPC port say)."""
    tmp_path.mkdir(exist_ok=True)
    path = write_rules(tmp_path, rules)
    ns = unique_namespace("planapi")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"vera viewer {hashlib.sha256(VIEWER.encode()).hexdigest()}\n")
    cps = [
        ControlPlaneServer(
            redis_url=redis_url, rules_path=path, namespace=ns, instance_id=f"a{i}", tokens_file=str(tokens),
            **FAST, **settings, **own,
        )
        for i, own in enumerate(each, 1)
    ]  # fmt: skip
    with ExitStack() as stack:
        for cp in cps:
            stack.enter_context(cp)
        yield cps


def _get(cp: ControlPlaneServer, path: str) -> Any:
    return httpx.get(cp.url + path, headers=admin_headers(), timeout=5).json()


def test_a_plan_set_at_run_time_wins_over_the_files_until_deleted(redis_url, tmp_path):
    with replicas(redis_url, tmp_path) as (a, b):
        assert _get(b, "/v1/routes/search/plan")["source"] == "rules"
        r = httpx.put(a.url + "/v1/routes/search/plan", json={**PLAN, "reason": "faster"}, headers=admin_headers())
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["plan"]["source"] == "api" and body["plan"]["current"] == "shadow"
        assert body["audit"]["kind"] == "plan" and body["audit"]["reason"].startswith("plan set: shadow 0.3s -> ")
        eventually(lambda: _get(b, "/v1/routes/search/plan")["source"] == "api", 5, 0.05, "b to see it")
        with Traffic([a.url, b.url], "search", CLEAN):
            eventually(lambda: _get(b, "/v1/routes/search/plan")["current"] == "canary 20%", 30, 0.05, "canary")
        r = httpx.request("DELETE", a.url + "/v1/routes/search/plan", json={"reason": "back to the file"},
                          headers=admin_headers())  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["audit"]["to"] == "plan removed"
        # the file's plan again, started over: its first step (shadow) in force
        back = eventually(
            lambda: (p := _get(b, "/v1/routes/search/plan"))["source"] == "rules" and p["current"] == "shadow" and p,
            10, 0.05, "the file's plan again",
        )  # fmt: skip
        assert back["describe"] == "shadow 10m -> enforce"
        eventually(lambda: _get(a, "/v1/routes")["routes"][0]["mode"] == "shadow", 5, 0.05, "shadow")
        # only an API plan can be deleted
        r = httpx.request("DELETE", a.url + "/v1/routes/search/plan", json={"reason": "x"}, headers=admin_headers())
        assert r.status_code == 404 and r.json()["error"] == "no_plan"


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ({"steps": [{"canary": 50}, {"canary": 10}]}, "steps[1]", "goes backwards"),
        ({"steps": ["shadow", {"canary": 100}]}, "steps[1].canary", "from 1 to 99"),
        ({"steps": ["shadow", "soon"]}, "steps[1]", "unknown step 'soon'"),
        ({"steps": [{"shadow": "ten minutes"}]}, "steps[0].shadow", "invalid duration"),
        ({"steps": ["shadow", "approve"]}, "steps[1]", "approve cannot be the last step"),
        ({"steps": ["shadow"], "analysis": {"max_new_rejection_rate": "lots"}}, "analysis.max_new_rejection_rate", ""),
        (
            {"steps": ["shadow"], "analysis": {"prometheus": [{"name": "x", "query": "up"}]}},
            "analysis.prometheus[0]",
            "",
        ),
        ({"steps": ["shadow"], "analysis": {"speed": 1}}, "analysis.speed", "unknown key"),
        ({"steps": ["shadow"], "analysis": {"gate_weight": "tokens"}}, "analysis.gate_weight", "requests or cost"),
        (  # checkout has no budget: its requests cost nothing to weigh
            {"steps": ["shadow"], "analysis": {"gate_weight": "cost"}},
            "analysis.gate_weight",
            "no cost to weigh",
        ),
    ],
)
def test_a_bad_plan_is_a_422_naming_the_field(redis_url, tmp_path, body, field, fragment):
    with replicas(redis_url, tmp_path) as (a, _):
        r = httpx.put(a.url + "/v1/routes/checkout/plan", json={**body, "reason": "x"}, headers=admin_headers())
        assert r.status_code == 422, r.text
        assert r.json()["field"] == field and fragment in r.json()["message"], r.json()
        assert httpx.get(a.url + "/v1/routes/checkout/plan", headers=admin_headers()).status_code == 404


def test_who_may_read_and_who_may_change_a_plan(redis_url, tmp_path):
    viewer = {"Authorization": f"Bearer {VIEWER}"}
    with replicas(redis_url, tmp_path) as (a, _):
        assert httpx.get(a.url + "/v1/routes/search/plan", headers=viewer).status_code == 200
        assert httpx.get(a.url + "/v1/routes/search/plan").status_code == 401
        for method, path in [
            ("PUT", ""),
            ("DELETE", ""),
            *(("POST", f"/{x}") for x in ("pause", "resume", "approve", "abort")),
        ]:
            r = httpx.request(
                method, a.url + f"/v1/routes/search/plan{path}", json={**PLAN, "reason": "x"}, headers=viewer
            )
            assert r.status_code == 403, (method, path, r.text)
        assert (
            httpx.put(a.url + "/v1/routes/nope/plan", json={**PLAN, "reason": "x"}, headers=admin_headers()).status_code
            == 404
        )
        assert httpx.get(a.url + "/v1/routes/checkout/plan", headers=viewer).json()["error"] == "no_plan"
        unknown = httpx.get(a.url + "/v1/routes/nope/plan", headers=viewer)
        assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_route", unknown.text


def test_a_manual_mode_change_pauses_a_running_plan_in_the_same_write(redis_url, tmp_path):
    with replicas(redis_url, tmp_path) as (a, b):
        eventually(lambda: _get(a, "/v1/routes/search/plan")["version"] >= 1, 10, 0.05, "the file's plan started")
        r = httpx.put(
            b.url + "/v1/routes/search/mode",
            json={"mode": "canary", "canary_percent": 5, "reason": "by hand", "force": True},
            headers=admin_headers(),
        )
        assert r.status_code == 200, r.text
        plan = eventually(
            lambda: (p := _get(a, "/v1/routes/search/plan"))["state"] == "paused" and p, 5, 0.05, "paused"
        )
        assert (
            plan["reason"].startswith("paused: admin@127.0.0.1")
            and "moved the route to canary 5% (by hand)" in plan["reason"]
        )
        assert _get(a, "/v1/routes")["routes"][0]["mode"] == "canary"  # the person's mode stands
        # resume: the plan's step (shadow) is applied again, audited
        r = httpx.post(
            a.url + "/v1/routes/search/plan/resume", json={"reason": "let it drive"}, headers=admin_headers()
        )
        assert r.status_code == 200, r.text
        assert r.json()["audit"]["to"] == "shadow" and r.json()["plan"]["state"] in ("running", "waiting")
        # abort: the route goes back to the plan's first step, the plan stops
        r = httpx.post(a.url + "/v1/routes/search/plan/abort", json={"reason": "not today"}, headers=admin_headers())
        assert r.status_code == 200 and r.json()["plan"]["state"] == "aborted", r.text
        r = httpx.post(a.url + "/v1/routes/search/plan/pause", json={"reason": "x"}, headers=admin_headers())
        assert r.status_code == 409 and "only a running plan can be paused" in r.json()["message"]


def test_an_envoy_route_takes_a_plan(redis_url, tmp_path):
    envoy = tmp_path / "envoy.yaml"
    # shadow_mode: the descriptor starts in shadow (an enforced one would find the plan done at once)
    envoy.write_text(
        "domain: edge\ndescriptors:\n  - key: k\n    shadow_mode: true\n"
        "    rate_limit: {unit: second, requests_per_unit: 50}\n"
    )
    ports = ({"grpc_port": free_port()}, {"grpc_port": free_port()})
    with replicas(redis_url, tmp_path, envoy_config=str(envoy), each=ports) as (a, b):
        r = httpx.put(a.url + "/v1/routes/edge/k/plan", json={**PLAN, "reason": "envoy too"}, headers=admin_headers())
        assert r.status_code == 200, r.text
        assert r.json()["plan"]["current"] == "shadow"
        listed = {x["name"]: x for x in _get(b, "/v1/routes")["routes"]}
        eventually(lambda: {x["name"]: x for x in _get(b, "/v1/routes")["routes"]}["edge/k"]["plan"], 5, 0.05, "b")
        assert "edge/k" in listed


def test_notifications_are_retried_counted_and_never_hold_the_plan(redis_url, tmp_path):
    no_file_plan = RULES.split("    rollout:")[0] + RULES.split("analysis: {min_compared: 10}\n")[1]
    with Receiver(refuse=2) as hook, replicas(redis_url, tmp_path, rules=no_file_plan, notify_url=hook.url) as (a, b):
        r = httpx.put(a.url + "/v1/routes/checkout/plan", json={**PLAN, "reason": "notify"}, headers=admin_headers())
        assert r.status_code == 200, r.text  # answered before any delivery: nothing waits for the webhook
        eventually(lambda: hook.posts, 15, 0.05, "the delivery after two refusals")
        assert hook.refused == 2 and hook.posts[0]["text"].startswith("shadowlimit: route checkout: plan started at ")
        assert hook.posts[0]["shadowlimit"]["event"] == "start"
        text = httpx.get(a.url + "/metrics").text
        assert metric_value(text, "rate_limit_notifications_total", result="retried") == 2
        assert metric_value(text, "rate_limit_notifications_total", result="sent") == 1
        assert metric_value(text, "rate_limit_notifications_total", result="failed") == 0
    # a webhook that never answers: the plan is set and moves all the same, the delivery fails, counted
    down = f"http://127.0.0.1:{free_port()}"
    with replicas(redis_url, tmp_path / "down", rules=no_file_plan, notify_url=down) as (a, b):
        r = httpx.put(a.url + "/v1/routes/checkout/plan", json={**PLAN, "reason": "x"}, headers=admin_headers())
        assert r.status_code == 200
        with Traffic([a.url, b.url], "checkout", CLEAN):
            eventually(lambda: _get(b, "/v1/routes/checkout/plan")["current"] == "canary 20%", 30, 0.05, "canary")

        def given_up() -> float:
            return sum(
                metric_value(httpx.get(cp.url + "/metrics").text, "rate_limit_notifications_total", result=result)
                for cp in (a, b)
                for result in ("failed",)
            )

        eventually(lambda: given_up() >= 1, 20, 0.1, "a delivery given up after its three attempts")
