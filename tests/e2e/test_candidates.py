"""A candidate limit in shadow beside the enforced one, on real Redis with two
replicas: its divergence equals an independent replay of the same requests under both
limits; promote and drop are audited and gated; a Redis restarted empty keeps it; bad input
is a 422 naming the field; it survives a rules reload that keeps its route and is dropped,
audited, when the route leaves."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_sync
from cp_server import (
    ControlPlaneServer,
    admin_headers,
    hour_aligned_clocks,
    metric_value,
    unique_namespace,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)

# an hour-long fixed window: within one window the answers depend on each key's request
# count only, so the replay needs no clock (the fleet's clock starts a second into an hour)
WINDOW_S = 3600
CURRENT, CANDIDATE = 8, 5
RULES = f"""\
version: 1
routes:
  - name: orders
    match: {{path: /api/orders/**}}
    key: {{strategy: header, header: X-Client-Id}}
    local: {{algorithm: fixed_window, average: 1000, period: {WINDOW_S}s}}
    distributed: {{algorithm: fixed_window, average: {CURRENT}, period: {WINDOW_S}s}}
  - name: quiet
    match: {{path: /api/quiet/**}}
    local: {{average: 10}}
"""
RULES_WITHOUT_ORDERS = """\
version: 1
routes:
  - name: quiet
    match: {path: /api/quiet/**}
    local: {average: 10}
"""


@pytest.fixture
def fleet(redis_url: str, tmp_path: Path) -> Iterator[tuple[ControlPlaneServer, ControlPlaneServer, Path]]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    ns = unique_namespace("cand")
    # the fleet's clock starts a second into an hour: the candidate's fixed windows (an hour)
    # hold every request of a test, with no wait for the next window
    common: dict[str, Any] = dict(
        redis_url=redis_url, rules_path=rules, namespace=ns, rules_poll_interval_s=0.2, gate_min_samples=20,
        clocks=hour_aligned_clocks(),
    )  # fmt: skip
    a = ControlPlaneServer(instance_id="replica-a", **common).start()
    try:
        b = ControlPlaneServer(instance_id="replica-b", **common).start()
    except BaseException:
        a.stop()
        raise
    try:
        yield a, b, rules
    finally:
        b.stop()
        a.stop()


def _mode(cp: ControlPlaneServer, route: str, mode: str) -> None:
    r = httpx.put(
        f"{cp.url}/v1/routes/{route}/mode",
        json={"mode": mode, "reason": "test", "force": True},
        headers=admin_headers(),
        timeout=10,
    )
    assert r.status_code == 200, r.text


def _route(cp: ControlPlaneServer, name: str) -> dict[str, Any]:
    routes = httpx.get(f"{cp.url}/v1/routes", timeout=10).json()["routes"]
    return next(r for r in routes if r["name"] == name)


def _set(cp: ControlPlaneServer, route: str, **body: Any) -> httpx.Response:
    return httpx.put(f"{cp.url}/v1/routes/{route}/candidate", json=body, headers=admin_headers(), timeout=10)


def _traffic(fleet: tuple[Any, ...], plan: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """Each (key, n): n decisions of ``orders`` for that key, alternating over both replicas,
    each replica's shadow work drained after every request (the candidate is evaluated in
    request order)."""
    a, b, _ = fleet
    out = []
    i = 0
    for key, n in plan:
        for _ in range(n):
            cp = (a, b)[i % 2]
            r = httpx.post(f"{cp.url}/v1/decide", json={"route": "orders", "key": key}, timeout=10)
            assert r.status_code in (200, 429), r.text
            cp.call(cp.engine.shadow.drain)
            out.append(r.json())
            i += 1
    for cp in (a, b):
        cp.settle()
    return out


def _replay(plan: list[tuple[str, int]], current: int, candidate: int) -> Counter[str]:
    """The same requests under both limits, computed here: a fixed window admits a key's
    first ``limit`` requests of the window."""
    out: Counter[str] = Counter()
    for _key, n in plan:
        for i in range(n):
            cur, cand = i < current, i < candidate
            out["agree" if cur == cand else "newly_rejected" if cur else "newly_admitted"] += 1
    return out


def _candidate_figures(cp: ControlPlaneServer) -> dict[str, Any]:
    cp.call(cp.engine.views.refresh)
    d = httpx.get(f"{cp.url}/v1/divergence", params={"minutes": 5}, timeout=10).json()
    return d["routes"]["orders"]["candidate"]  # type: ignore[no-any-return]


PLAN = [("alice", 3), ("bob", 7), ("carol", 12), ("dave", 5), ("erin", 9)]


def test_the_candidates_divergence_equals_a_replay_of_the_same_requests_under_both_limits(fleet) -> None:
    a, b, _ = fleet
    _mode(a, "orders", "enforce")
    r = _set(a, "orders", limit=f"{CANDIDATE}/hour", reason="tighten orders")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["candidate"]["policy"] == {
        "algorithm": "fixed_window", "average": float(CANDIDATE), "period": 3600.0, "burst": CANDIDATE,
    }  # fmt: skip
    assert body["audit"]["kind"] == "candidate" and body["audit"]["to"].startswith("candidate 5/3600s")
    wait_until(lambda: _route(b, "orders")["candidate"] is not None, 5, 0.05, "replica b reads the candidate")
    answers = _traffic(fleet, PLAN)
    # the route kept deciding with its current limit
    assert sum(d["allowed"] for d in answers) == sum(min(n, CURRENT) for _, n in PLAN)
    expected = _replay(PLAN, CURRENT, CANDIDATE)
    for cp in (a, b):  # fleet-wide: the same figures from either replica
        figures = _candidate_figures(cp)
        totals = figures["totals"]
        assert {k: totals[k] for k in ("agree", "newly_rejected", "newly_admitted")} == {
            k: expected[k] for k in ("agree", "newly_rejected", "newly_admitted")
        }, (cp.settings.instance_id, totals)
        assert totals["errors"] == 0 and totals["dropped"] == 0 and totals["sampled_share"] == 1.0
        assert sum(row["newly_rejected"] for row in figures["series"]) == expected["newly_rejected"]
        who = {row["key"]: row["count"] for row in figures["would_be_blocked"]}
        assert who == {k: min(n, CURRENT) - CANDIDATE for k, n in PLAN if min(n, CURRENT) > CANDIDATE}
    # Prometheus: per replica, summing to the fleet's
    total = sum(
        metric_value(
            httpx.get(f"{cp.url}/metrics", timeout=10).text,
            "rate_limit_candidate_divergence_total",
            route="orders",
            direction="newly_rejected",
        )
        for cp in (a, b)
    )
    assert total == expected["newly_rejected"]
    # the current limit's own counters were untouched by the candidate's evaluations
    assert _route(a, "orders")["limit"] == {
        "in_force": {"algorithm": "fixed_window", "average": float(CURRENT), "period": 3600.0, "burst": CURRENT},
        "rules": {"algorithm": "fixed_window", "average": float(CURRENT), "period": 3600.0, "burst": CURRENT},
        "adjusted": False,
        "describe": f"{CURRENT}/3600s burst {CURRENT} (fixed_window)",
    }


def test_in_shadow_the_candidate_is_compared_with_the_current_global_answer(fleet) -> None:
    a, b, _ = fleet
    _mode(a, "orders", "shadow")
    assert _set(a, "orders", limit="11/hour", reason="loosen").status_code == 200
    wait_until(lambda: _route(b, "orders")["candidate"] is not None, 5, 0.05, "replica b reads the candidate")
    _traffic(fleet, PLAN)
    figures = _candidate_figures(b)
    expected = _replay(PLAN, CURRENT, 11)
    assert figures["totals"]["newly_admitted"] == expected["newly_admitted"] > 0
    assert figures["totals"]["newly_rejected"] == 0 and figures["totals"]["agree"] == expected["agree"]


def test_promote_is_gated_and_audited_and_drop_is_audited(fleet, redis_url: str) -> None:
    a, b, rules = fleet
    _mode(a, "orders", "enforce")
    assert _set(a, "orders", limit="5/hour", reason="tighten").status_code == 200
    wait_until(lambda: _route(b, "orders")["candidate"] is not None, 5, 0.05, "replica b reads the candidate")
    _traffic(fleet, [("k1", 6), ("k2", 4)])  # 10 compared (gate_min_samples is 20), 1 newly rejected
    promote = f"{b.url}/v1/routes/orders/candidate/promote"
    r = httpx.post(promote, json={"reason": "ship it"}, headers=admin_headers(), timeout=10)
    assert r.status_code == 409 and r.json()["error"] == "gate_failed", r.text
    reasons = " ".join(r.json()["gate"]["reasons"])
    assert "only 10 compared decisions since the candidate was set" in reasons and "need 20" in reasons
    assert "new rejections 10.00% exceed 1.00%" in reasons
    assert _route(a, "orders")["candidate"] is not None  # refused: nothing changed
    r = httpx.post(promote, json={"reason": "ship it anyway", "force": True}, headers=admin_headers(), timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["limit"] == {"algorithm": "fixed_window", "average": 5.0, "period": 3600.0, "burst": 5}
    assert body["audit"]["kind"] == "candidate" and body["audit"]["forced"] is True
    assert body["audit"]["to"] == "promoted candidate 5/3600s burst 5 (fixed_window)" and not body["gate"]["passed"]
    assert (
        body["adjustment"]["kind"] == "config_change"
        and "promoted candidate: ship it anyway" in body["adjustment"]["reason"]
    )
    for cp in (a, b):  # the route's limit now, on both replicas; the rules file as it was
        wait_until(lambda cp=cp: _route(cp, "orders")["limit"]["adjusted"], 5, 0.05, "the promoted limit")
        view = _route(cp, "orders")
        assert view["candidate"] is None and view["limit"]["in_force"]["average"] == 5.0
        assert view["limit"]["rules"]["average"] == float(CURRENT)
    assert f"average: {CURRENT}," in rules.read_text()
    # the new limit decides: k3's sixth request in the window is refused
    codes = [httpx.post(f"{a.url}/v1/decide", json={"route": "orders", "key": "k3"}, timeout=10).status_code
             for _ in range(6)]  # fmt: skip
    assert codes == [200] * 5 + [429]
    # a new candidate, then dropped
    assert _set(a, "orders", limit="3/hour", reason="even tighter").status_code == 200
    r = httpx.request(
        "DELETE", f"{a.url}/v1/routes/orders/candidate", json={"reason": "not now"}, headers=admin_headers(), timeout=10
    )
    assert r.status_code == 200 and r.json()["candidate"] is None, r.text
    assert r.json()["audit"]["to"] == "dropped candidate 3/3600s burst 3 (fixed_window)"
    r = httpx.request(
        "DELETE", f"{a.url}/v1/routes/orders/candidate", json={"reason": "again"}, headers=admin_headers(), timeout=10
    )
    assert r.status_code == 404 and r.json()["error"] == "no_candidate"
    audit = httpx.get(f"{a.url}/v1/rollout/audit", params={"route": "orders"}, timeout=10).json()["entries"]
    kinds = [(e["kind"], e["to"].split(" ")[0]) for e in audit[:5]]
    assert kinds == [
        ("candidate", "dropped"), ("candidate", "candidate"), ("candidate", "promoted"), ("config_change", "5/3600s"),
        ("candidate", "candidate"),
    ]  # fmt: skip
    # without a token: refused before anything is read
    assert httpx.put(f"{a.url}/v1/routes/orders/candidate", json={}, timeout=10).status_code == 401


def test_redis_restarted_empty_keeps_the_candidate(fleet, redis_url: str) -> None:
    a, b, _ = fleet
    _mode(a, "orders", "enforce")
    assert _set(a, "orders", limit="5/hour", reason="survive").status_code == 200
    wait_until(lambda: _route(b, "orders")["candidate"] is not None, 5, 0.05, "replica b reads the candidate")
    cid = _route(a, "orders")["candidate"]["id"]
    client = redis_sync.Redis.from_url(redis_url)
    try:
        client.flushall()  # as a Redis restarted without its data
        key = f"rl:{{{a.namespace}}}:adjust"
        wait_until(lambda: client.hexists(key, "\x01candidate\x00orders"), 10, 0.1, "the candidate written back")
    finally:
        client.close()
    for cp in (a, b):
        view = _route(cp, "orders")
        assert view["candidate"]["id"] == cid and view["mode"] == "enforce"
    restored = httpx.get(f"{a.url}/v1/rollout/audit", timeout=10).json()["entries"]
    assert any(e["kind"] == "restore" for e in restored)


def test_bad_candidates_are_refused_naming_the_field(fleet) -> None:
    a, _, _ = fleet
    _mode(a, "orders", "enforce")
    r = _set(a, "orders", limit=f"{CURRENT}/hour", reason="same")
    assert r.status_code == 422 and r.json()["field"] == "limit" and "equal to the route's current limit" in r.text
    _mode(a, "quiet", "off")
    r = _set(a, "quiet", limit="5/second", reason="off route")
    assert r.status_code == 422 and r.json()["field"] == "route" and "quiet is off" in r.text
    r = _set(a, "orders", limit="0.5/hour", reason="fractional window")  # fixed_window counts whole requests
    assert r.status_code == 422 and r.json()["field"] == "limit", r.text
    r = _set(a, "orders", limit="5 per fortnight", reason="no such unit")
    assert r.status_code == 422 and r.json()["field"] == "limit", r.text
    r = _set(a, "orders", limit="5/hour", burst=0, reason="burst")
    assert r.status_code == 422 and r.json()["field"] == "burst", r.text
    r = _set(a, "orders", limit="5/hour", reason="")
    assert r.status_code == 422 and r.json()["field"] == "reason", r.text
    r = _set(a, "nope", limit="5/hour", reason="unknown")
    assert r.status_code == 404 and r.json()["error"] == "unknown_route"
    assert _route(a, "orders")["candidate"] is None


def test_a_candidate_survives_a_reload_that_keeps_its_route_and_is_dropped_when_the_route_leaves(fleet) -> None:
    a, b, rules = fleet
    _mode(a, "orders", "enforce")
    assert _set(a, "orders", limit="5/hour", reason="reload me").status_code == 200
    wait_until(lambda: _route(b, "orders")["candidate"] is not None, 5, 0.05, "replica b reads the candidate")
    rules.write_text(RULES + "  - name: more\n    match: {path: /api/more/**}\n    local: {average: 3}\n")
    for cp in (a, b):
        wait_until(lambda cp=cp: any(r["name"] == "more" for r in httpx.get(f"{cp.url}/v1/routes").json()["routes"]),
                   10, 0.1, "the reload")  # fmt: skip
        assert _route(cp, "orders")["candidate"] is not None
    rules.write_text(RULES_WITHOUT_ORDERS)
    for cp in (a, b):
        wait_until(
            lambda cp=cp: all(r["name"] != "orders" for r in httpx.get(f"{cp.url}/v1/routes").json()["routes"]),
            10, 0.1, "orders gone",
        )  # fmt: skip
    # both replicas saw the route go: one of them dropped the candidate, and audited it
    wait_until(
        lambda: not a.engine.adjustments.candidates and not b.engine.adjustments.candidates,
        10, 0.1, "the candidate dropped on both replicas",
    )  # fmt: skip

    def dropped_entries() -> list[dict[str, Any]]:
        audit = httpx.get(f"{a.url}/v1/rollout/audit", params={"route": "orders"}, timeout=10).json()["entries"]
        return [e for e in audit if e["kind"] == "candidate" and e["to"].startswith("dropped")]

    dropped = wait_until(dropped_entries, 10, 0.1, "the drop audited")
    assert len(dropped) == 1 and dropped[0]["reason"] == "its route is no longer in the rules"
    assert dropped[0]["automatic"] is True
