"""Two control-plane replicas sharing one Redis and one namespace: the local limit is
multiplied by the fleet size, the distributed one is not; divergence is counted
fleet-wide exactly once; a mode change on one replica is obeyed by the other within 1 s."""

from __future__ import annotations

import time

import pytest
from cp_server import (
    ControlPlaneServer,
    admin_headers,
    hour_aligned_clocks,
    unique_namespace,
    wait_until,
    write_rules,
)

BURST = 10
RATE = 10.0  # tokens per second (search: average 10 per 1 s, burst 10, both limiters)


@pytest.fixture
def replicas(redis_url, tmp_path):
    rules = write_rules(tmp_path)
    ns = unique_namespace("fleet")
    # one clock for the fleet, a second into an hour: the "would be blocked" view covers the
    # current 5-minute window, which a test then never leaves
    clocks = hour_aligned_clocks()
    a = ControlPlaneServer(
        redis_url=redis_url, rules_path=rules, namespace=ns, gate_min_samples=0, instance_id="replica-a", clocks=clocks
    )
    b = ControlPlaneServer(
        redis_url=redis_url, rules_path=rules, namespace=ns, gate_min_samples=0, instance_id="replica-b", clocks=clocks
    )
    a.start()
    try:
        b.start()
    except BaseException:
        a.stop()
        raise
    ca, cb = a.client(), b.client()
    yield a, b, ca, cb
    ca.close()
    cb.close()
    b.stop()
    a.stop()


def _spread(clients, n: int, key: str, route: str = "search"):
    """n decisions for one client, alternating over the replicas; (responses, elapsed s)."""
    out = []
    t0 = time.monotonic()
    for i in range(n):
        r = clients[i % len(clients)].post("/v1/decide", json={"route": route, "key": key, "request_id": f"{key}-{i}"})
        assert r.status_code in (200, 429), r.text
        out.append(r.json())
    return out, time.monotonic() - t0


def test_local_limit_over_admits_while_distributed_holds(replicas):
    a, b, ca, cb = replicas
    r = ca.put(
        "/v1/routes/search/mode",
        json={"mode": "enforce", "reason": "measure both", "force": True},
        headers=admin_headers(),
    )
    assert r.status_code == 200, r.text
    wait_until(lambda: cb.get("/v1/routes").json()["routes"][0]["mode"] == "enforce", 2.0, 0.02, "replica b in enforce")
    decisions, elapsed = _spread([ca, cb], 60, "bob")
    assert all(d["mode"] == "enforce" and d["enforced_by"] == "distributed" for d in decisions)
    bound = BURST + RATE * elapsed
    local_allowed = sum(d["local"]["allowed"] for d in decisions)
    dist_allowed = sum(d["distributed"]["allowed"] for d in decisions)
    # each replica's local bucket sees half the traffic and admits up to its own burst
    assert local_allowed > bound, (local_allowed, bound, elapsed)
    assert local_allowed >= 2 * BURST
    # the one global bucket admits within burst + rate * t (one token of rounding slack)
    assert dist_allowed <= bound + 1, (dist_allowed, bound, elapsed)
    assert dist_allowed >= BURST
    assert sum(d["allowed"] for d in decisions) == dist_allowed
    assert any(d["divergence"] == "local_allow_distributed_deny" for d in decisions)


def test_divergence_is_counted_fleet_wide_once(replicas):
    a, b, ca, cb = replicas
    n = 40
    decisions, _ = _spread([ca, cb], n, "bob")
    assert all(d["mode"] == "shadow" and d["enforced_by"] == "local" and d["distributed"] is None for d in decisions)
    local_allowed = sum(d["allowed"] for d in decisions)

    def totals(c):
        return c.get("/v1/divergence").json()["routes"]["search"]

    def settled():
        # counters and the "would be blocked" sets are flushed every second and each
        # replica's view of them is refreshed every second: wait until both have it all
        x, y = totals(ca), totals(cb)
        blocked = x["totals"]["local_allow_distributed_deny"]
        return (
            x["totals"]["compared"] >= n
            and x == y
            and (blocked == 0 or (x["would_be_blocked"] and x["would_be_blocked"][0]["count"] == blocked))
        )

    wait_until(settled, 10.0, 0.1, "fleet-wide comparisons on both replicas")
    a.settle()  # flush both replicas once more: nothing may be added twice
    b.settle()
    wait_until(lambda: totals(ca) == totals(cb), 5.0, 0.1, "both replicas' views refreshed")
    ta, tb = totals(ca), totals(cb)
    assert ta["totals"] == tb["totals"]
    t = ta["totals"]
    assert t["compared"] == n
    assert t["distributed_attempts"] == n
    assert t["agree"] + t["local_allow_distributed_deny"] + t["local_deny_distributed_allow"] == n
    # the shared bucket denies part of what the two local buckets allowed
    assert t["local_allow_distributed_deny"] > 0
    assert t["local_allow_distributed_deny"] <= local_allowed
    assert ta["would_be_blocked"] and ta["would_be_blocked"][0]["key"] == "bob"
    assert ta["would_be_blocked"][0]["count"] == t["local_allow_distributed_deny"]
    assert ta["would_be_blocked"] == tb["would_be_blocked"]
    # the per-minute series adds up to the same fleet total
    assert sum(m["compared"] for m in ta["series"]) == n
    # each replica's own evaluations add up to the fleet total
    evaluated = (
        ca.get("/ratelimit/stats").json()["shadow"]["evaluated"]
        + cb.get("/ratelimit/stats").json()["shadow"]["evaluated"]
    )
    assert evaluated == n


@pytest.mark.parametrize("target", ["enforce", "off"])
def test_mode_change_on_one_replica_is_obeyed_by_the_other_within_1s(replicas, target):
    a, b, ca, cb = replicas
    assert cb.post("/v1/decide", json={"route": "search", "key": "warm"}).json()["mode"] == "shadow"
    expected_by = "distributed" if target == "enforce" else "local"
    t0 = time.monotonic()
    r = ca.put(
        "/v1/routes/search/mode",
        json={"mode": target, "reason": f"fleet {target}", "force": True},
        headers=admin_headers(),
    )
    assert r.status_code == 200, r.text
    i = 0
    while True:
        i += 1
        d = cb.post("/v1/decide", json={"route": "search", "key": f"probe-{i}"}).json()
        if d["mode"] == target and d["enforced_by"] == expected_by:
            break
        assert time.monotonic() - t0 < 1.0, f"replica b still in {d['mode']} after 1 s"
        time.sleep(0.01)
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0, elapsed
    view = next(v for v in cb.get("/v1/routes").json()["routes"] if v["name"] == "search")
    assert view["mode"] == target
    assert view["state"]["reason"] == f"fleet {target}"


def test_canary_assignment_is_the_same_on_both_replicas(replicas):
    a, b, ca, cb = replicas
    r = ca.put(
        "/v1/routes/search/mode",
        json={"mode": "canary", "canary_percent": 50, "reason": "half"},
        headers=admin_headers(),
    )
    assert r.status_code == 200, r.text
    wait_until(lambda: cb.get("/v1/routes").json()["routes"][0]["mode"] == "canary", 2.0, 0.02, "replica b in canary")
    by_a = {
        f"c{i}": ca.post("/v1/decide", json={"route": "search", "key": f"c{i}"}).json()["enforced_by"]
        for i in range(60)
    }
    by_b = {
        f"c{i}": cb.post("/v1/decide", json={"route": "search", "key": f"c{i}"}).json()["enforced_by"]
        for i in range(60)
    }
    assert by_a == by_b
    assert set(by_a.values()) == {"local", "distributed"}
