"""Failovers under load, through the control plane, on real servers: a route in enforce,
4 tasks deciding over HTTP, then the Redis master is SIGKILLed (Sentinel: a replica is
promoted by the sentinels; Cluster: the master's replica takes over its slots).

What must hold: not one 5xx; while Redis has no master the failure policy answers
(``enforced_by: failure_policy``); after the failover decisions are Redis's again, on the
new master. The gap (the longest stretch without an answer from Redis) and the
number of failure-policy answers are printed (``pytest -s``) for the closing notes.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from cp_server import ADMIN_TOKEN, ControlPlaneServer, admin_headers, write_rules
from redis.crc import key_slot

from limiter.embedded import EmbeddedCluster, EmbeddedSentinelSet, slot_ranges

pytestmark = [pytest.mark.timeout(150), pytest.mark.sentinel]

PASSWORD = "fail0ver-secret"
TASKS = 4
RULES = """\
version: 1
routes:
  - name: api
    match: {path: /api/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 100000, period: 1s, burst: 100000}
    distributed: {average: 100000, period: 1s, burst: 100000}
"""


async def drive(
    cp: ControlPlaneServer, kill: Any, keys: list[str], recovered_for_s: float = 2.0, bound_s: float = 90.0
) -> dict:
    """4 tasks decide on ``keys`` until Redis has answered again for ``recovered_for_s``
    after the kill."""
    statuses: Counter[int] = Counter()
    by: Counter[str] = Counter()
    times: dict[str, list[float]] = {"before": [], "after": []}
    state = {"killed_at": None, "stop": False}

    async def task(n: int, client: httpx.AsyncClient) -> None:
        i = 0
        while not state["stop"]:
            i += 1
            r = await client.post("/v1/decide", json={"route": "api", "key": keys[(n * 7 + i) % len(keys)]})
            statuses[r.status_code] += 1
            if r.status_code >= 500:
                continue
            body = r.json()
            by[body["enforced_by"]] += 1
            if body["enforced_by"] == "distributed":
                times["before" if state["killed_at"] is None else "after"].append(time.monotonic())

    async with httpx.AsyncClient(base_url=cp.url, timeout=10) as client:
        tasks = [asyncio.ensure_future(task(n, client)) for n in range(TASKS)]
        try:
            await asyncio.sleep(1.0)
            state["killed_at"] = time.monotonic()
            await asyncio.to_thread(kill)
            deadline = time.monotonic() + bound_s
            while time.monotonic() < deadline:
                after = times["after"]
                if after and after[-1] - after[0] >= recovered_for_s:
                    break
                await asyncio.sleep(0.1)
        finally:
            state["stop"] = True
            await asyncio.gather(*tasks, return_exceptions=True)
    every = sorted(times["before"] + times["after"])
    gaps = [b - a for a, b in zip(every, every[1:])]
    return {
        "statuses": dict(statuses),
        "enforced_by": dict(by),
        # the longest stretch without an answer from Redis: the outage as the clients saw it
        "gap_s": round(max(gaps), 2) if gaps else None,
        "answered_by_redis_again": bool(times["after"]),
    }


def enforce(cp: ControlPlaneServer) -> None:
    r = httpx.put(
        f"{cp.url}/v1/routes/api/mode",
        json={"mode": "enforce", "reason": "failover test", "force": True},
        headers=admin_headers(),
        timeout=10,
    )
    r.raise_for_status()


def backend(cp: ControlPlaneServer) -> dict:
    r = httpx.get(f"{cp.url}/v1/backend", headers=admin_headers(), timeout=10)
    r.raise_for_status()
    assert PASSWORD not in r.text
    return r.json()


def check(figures: dict, what: str) -> None:
    print(f"\n{what}: {figures}")
    assert figures["statuses"].get(200, 0) > 0
    assert not [s for s in figures["statuses"] if s >= 500], figures  # not one 5xx
    assert figures["enforced_by"].get("failure_policy", 0) > 0, figures  # the policy answered meanwhile
    assert figures["answered_by_redis_again"], figures


def test_sentinel_failover_under_load(tmp_path):
    with EmbeddedSentinelSet(replicas=1, password=PASSWORD) as sentinels:
        rules = write_rules(tmp_path, RULES)
        # the data nodes need the password, the sentinels none
        url = sentinels.url + "?sentinel_password="
        with ControlPlaneServer(redis_url=url, rules_path=rules, admin_token=ADMIN_TOKEN) as cp:
            enforce(cp)
            old = sentinels.master_address()
            topo = backend(cp)["redis_topology"]
            assert topo["kind"] == "sentinel" and topo["master"] in (f"{old[0]}:{old[1]}", None)
            figures = asyncio.run(drive(cp, lambda: sentinels.kill_master(), [f"k{i}" for i in range(50)]))
            check(figures, "sentinel failover")
            new = sentinels.master_address()
            assert new != old
            topo = backend(cp)["redis_topology"]
            assert topo["master"] == f"{new[0]}:{new[1]}" and topo["master_changes"] >= 1


def test_cluster_failover_under_load(tmp_path):
    with EmbeddedCluster(replicas=1) as cluster:
        rules = write_rules(tmp_path, RULES)
        with ControlPlaneServer(redis_url=cluster.url, rules_path=rules, admin_token=ADMIN_TOKEN) as cp:
            enforce(cp)
            assert backend(cp)["redis_topology"]["kind"] == "cluster"

            def kill() -> None:
                cluster.kill_master(0)

            # keys whose buckets live on the master that is killed (the others never stop)
            first, last = slot_ranges(3)[0]
            keys = [
                k
                for k in (f"k{i}" for i in range(5000))
                if first <= key_slot(f"rl:{cp.namespace}:api:{k}".encode()) <= last
            ]
            figures = asyncio.run(drive(cp, kill, keys[:50]))
            check(figures, "cluster failover")
            cluster.wait_for_failover()
            masters = backend(cp)["redis_topology"]["masters"]
            assert sum(m["slots"] for m in masters) == 16384 and len(masters) == 3
