"""A Redis Cluster grown under load, through the control plane, on real servers: a route in
enforce, 4 tasks deciding over HTTP on keys spread over the cluster; meanwhile a 4th master
joins (``add_master``) and a share of every master's slots moves onto it, keys and all (the
limiter meets ``ASK`` while a slot is half moved and ``MOVED`` after), then the same slots
move back.

What must hold: not one 5xx, not one failure-policy answer (the redirections are followed,
never taken for an outage), no key admitted more than its bucket allows over the run (the
state moves with the key: a bucket never restarts full on its new master), the keys really
on the new master meanwhile, and no connection of the control plane's own cluster client
(redis-py's, for the rollout store) left open on a node object it dropped ("Unclosed
ClusterNode object").
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
import warnings
from collections import Counter

import httpx
import pytest
import redis
from cp_server import ControlPlaneServer, admin_headers, write_rules
from redis.crc import key_slot

from limiter.embedded import EmbeddedCluster, move_slots, slot_owners

pytestmark = pytest.mark.timeout(240)

RATE, BURST = 5, 5  # per key: 5 a second, 5 at once (the load asks about twice that)
TASKS = 4
KEYS = 40
RULES = f"""\
version: 1
routes:
  - name: api
    match: {{path: /api/**}}
    key: {{strategy: header, header: X-Client-Id}}
    local: {{average: 100000, period: 1s, burst: 100000}}
    distributed: {{average: {RATE}, period: 1s, burst: {BURST}, algorithm: token_bucket}}
"""


def set_mode(cp: ControlPlaneServer, reason: str) -> None:
    """A mode written (and audited) through the rollout store: its keys' slot moves too."""
    r = httpx.put(
        f"{cp.url}/v1/routes/api/mode",
        json={"mode": "enforce", "reason": reason, "force": True},
        headers=admin_headers(),
        timeout=10,
    )
    r.raise_for_status()


class Load:
    """``TASKS`` tasks deciding on ``keys`` until stopped; every answer counted."""

    def __init__(self, cp: ControlPlaneServer, keys: list[str]) -> None:
        self.cp, self.keys = cp, keys
        self.statuses: Counter[int] = Counter()
        self.enforced_by: Counter[str] = Counter()
        self.allowed: Counter[str] = Counter()
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.started = self.ended = 0.0

    async def _task(self, n: int, client: httpx.AsyncClient) -> None:
        i = 0
        while not self.stop.is_set():
            key = self.keys[(n * 7 + i) % len(self.keys)]
            i += 1
            try:
                r = await client.post("/v1/decide", json={"route": "api", "key": key})
            except httpx.HTTPError as exc:
                self.errors.append(repr(exc))
                continue
            self.statuses[r.status_code] += 1
            if r.status_code >= 500:
                continue
            body = r.json()
            self.enforced_by[body["enforced_by"]] += 1
            if body["allowed"]:
                self.allowed[key] += 1

    async def run(self) -> None:
        self.started = time.monotonic()
        async with httpx.AsyncClient(base_url=self.cp.url, timeout=10) as client:
            await asyncio.gather(*(self._task(n, client) for n in range(TASKS)))
        self.ended = time.monotonic()


def _keys_on(cp: ControlPlaneServer, count: int) -> tuple[list[str], set[int]]:
    keys = [f"client-{i}" for i in range(count)]
    return keys, {key_slot(f"rl:{cp.namespace}:api:{k}".encode()) for k in keys}


def _keys_held(address: tuple[str, int], namespace: str) -> int:
    """The route's buckets on the node at ``address``, asked of the node itself."""
    node = redis.Redis(host=address[0], port=address[1])
    try:
        return sum(1 for _ in node.scan_iter(match=f"rl:{namespace}:api:*", count=1000))
    finally:
        node.close()


def test_a_cluster_grows_and_shrinks_under_load(tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="asyncio")
    with EmbeddedCluster() as cluster, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        rules = write_rules(tmp_path, RULES)
        with ControlPlaneServer(redis_url=cluster.url, rules_path=rules) as cp:
            set_mode(cp, "growth test")
            keys, key_slots = _keys_on(cp, KEYS)
            store_slot = key_slot(f"rl:{{{cp.namespace}}}:rollout".encode())
            # a share of every master's slots (every 32nd: 512), those of the keys, the store's
            moving = set(range(0, 16384, 32)) | key_slots | {store_slot}
            before = slot_owners(cluster)

            load = Load(cp, keys)
            thread = threading.Thread(target=asyncio.run, args=(load.run(),), daemon=True)
            thread.start()
            try:
                time.sleep(1.0)
                new = cluster.add_master()
                moved_out = move_slots(cluster, moving, new)
                time.sleep(0.5)
                set_mode(cp, "grown")  # the store on its slot's new master
                owners = slot_owners(cluster)
                assert all(owners[s] == new for s in moving), "the slots are the new master's"
                on_new = _keys_held(new, cp.namespace)  # the buckets themselves, not only the slot table
                time.sleep(1.0)
                moved_back = 0
                for address in set(before.values()):
                    moved_back += move_slots(cluster, [s for s in moving if before[s] == address], address)
                time.sleep(0.5)
                set_mode(cp, "shrunk")
                time.sleep(1.0)
            finally:
                load.stop.set()
                thread.join(timeout=30)
            assert not thread.is_alive(), "the load stops"
            gc.collect()  # a dropped node object with open connections says so when collected
        assert slot_owners(cluster) == before, "every slot back where it was"

    elapsed = load.ended - load.started
    print(
        f"\ncluster growth: {sum(load.statuses.values())} decisions in {elapsed:.1f} s, "
        f"{dict(load.statuses)} {dict(load.enforced_by)}; keys moved out {moved_out}, back {moved_back}"
    )
    assert not load.errors, load.errors[:5]
    assert load.statuses[200] + load.statuses[429] == sum(load.statuses.values()), load.statuses
    assert load.statuses[429] > 0, "the buckets were kept busy enough to refuse"
    assert set(load.enforced_by) == {"distributed"}, load.enforced_by  # not one failure-policy answer
    bound = BURST + RATE * elapsed + 1
    over = {k: n for k, n in load.allowed.items() if n > bound}
    assert not over, f"admitted past burst + rate x {elapsed:.1f} s = {bound:.0f}: {over}"
    assert on_new == KEYS and moved_out >= KEYS and moved_back >= KEYS, (on_new, moved_out, moved_back)
    unclosed = [r.getMessage() for r in caplog.records if "Unclosed" in r.getMessage()]
    unclosed += [str(w.message) for w in caught if "Unclosed" in str(w.message)]
    assert not unclosed, unclosed[:3]
