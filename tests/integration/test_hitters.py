"""Space-Saving heavy hitters and the fleet-wide "who would be blocked" view."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import pytest_asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from control_plane.model.causes import Cause
from control_plane.observe.hitters import FLEET_TOP_KEEP, HitterEntry, SpaceSaving, WouldBeBlocked
from control_plane.store import StoreUnavailable
from limiter.embedded import EmbeddedRedis
from limiter.redis_limiter import make_redis_py_client

NS = "hh-test"
W = 300
T = 1_700_000_100.0  # inside window T // W


# --------------------------------------------------------------------------- #
# Space-Saving
# --------------------------------------------------------------------------- #


def test_exact_below_capacity():
    ss = SpaceSaving(capacity=10)
    truth = Counter()
    rng = random.Random(1)
    for i in range(1000):
        k = f"k{rng.randrange(8)}"
        ss.add(k, request_id=f"req-{i}")
        truth[k] += 1
    assert len(ss) == 8 and ss.total == 1000
    top = ss.top(10)
    assert {e.key: e.count for e in top} == dict(truth)
    assert all(e.error == 0 for e in top)
    assert [e.count for e in top] == sorted(truth.values(), reverse=True)
    # the last request id seen for each key
    last = {}
    rng = random.Random(1)
    for i in range(1000):
        last[f"k{rng.randrange(8)}"] = f"req-{i}"
    assert {e.key: e.last_request_id for e in top} == last
    assert ss.top(3) == top[:3]
    assert ss.top(0) == []


def test_weighted_adds_and_request_id_kept_when_none():
    ss = SpaceSaving(capacity=2)
    ss.add("a", 5, "r1")
    ss.add("a", 2)
    assert ss.get("a") == HitterEntry("a", 7, 0, "r1")
    ss.add("b", 1, "r2")
    ss.add("c", 3, "r3")  # evicts b (count 1): c = 1 + 3, error 1
    assert "b" not in ss
    assert ss.get("c") == HitterEntry("c", 4, 1, "r3")
    assert ss.get("c").guaranteed == 3
    ss.add("x", 0)  # ignored
    assert ss.total == 11 and "x" not in ss


def _zipf_stream(n: int, keys: int, s: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** s for i in range(keys)]
    return [f"client-{i}" for i in rng.choices(range(keys), weights=weights, k=n)]


@pytest.mark.parametrize("capacity", [10, 50, 200])
def test_guarantees_on_skewed_stream(capacity):
    stream = _zipf_stream(50_000, 5_000, 1.1, seed=capacity)
    truth = Counter(stream)
    ss = SpaceSaving(capacity)
    for i, k in enumerate(stream):
        ss.add(k, request_id=str(i))
        assert len(ss) <= capacity
    assert len(ss) == capacity  # 5000 distinct keys: full
    assert ss.heap_size == capacity  # one heap entry per monitored key
    n = len(stream)
    assert ss.total == n
    for e in ss.entries():
        assert e.count - e.error <= truth[e.key] <= e.count, e
        assert e.error <= n // capacity
    # every key with true count > N / capacity is monitored
    for k, c in truth.items():
        if c > n / capacity:
            assert k in ss, (k, c)
    # the heaviest keys come out on top (in order once the summary is not tiny; with
    # 10 counters a freshly inserted key can carry an error as large as the 3rd count)
    top3_true = [k for k, _ in truth.most_common(3)]
    assert ss.top(1)[0].key == top3_true[0]
    if capacity >= 50:
        assert [e.key for e in ss.top(3)] == top3_true
    assert sum(e.count for e in ss.entries()) == n  # Space-Saving invariant: counters sum to N


def test_memory_bound_under_all_distinct_keys():
    ss = SpaceSaving(capacity=16)
    for i in range(100_000):
        ss.add(f"unique-{i}")
    assert len(ss) == 16 and ss.heap_size == 16
    assert ss.total == 100_000
    ss.clear()
    assert len(ss) == 0 and ss.top(5) == []


def test_capacity_validated():
    with pytest.raises(ValueError):
        SpaceSaving(0)


# --------------------------------------------------------------------------- #
# WouldBeBlocked
# --------------------------------------------------------------------------- #


def test_local_view_per_route_and_window():
    wb = WouldBeBlocked(NS, window_s=W, capacity=10)
    for i in range(5):
        wb.record("/a", "alice", f"a{i}", now=T)
    wb.record("/a", "bob", "b0", now=T)
    wb.record("/b", "carol", "c0", now=T)
    assert wb.top("/a", now=T) == [
        {"key": "alice", "count": 5, "error": 0, "last_request_id": "a4", "cause": None, "units": None},
        {"key": "bob", "count": 1, "error": 0, "last_request_id": "b0", "cause": None, "units": None},
    ]
    assert [e["key"] for e in wb.top("/b", now=T)] == ["carol"]
    assert wb.top("/none", now=T) == []
    assert wb.routes() == ["/a", "/b"]
    # the next window starts empty
    assert wb.top("/a", now=T + W) == []
    wb.record("/a", "dave", "d0", now=T + W)
    assert [e["key"] for e in wb.top("/a", now=T + W)] == ["dave"]
    # a late record for the old window does not reset the new local view
    wb.record("/a", "alice", "late", now=T)
    assert [e["key"] for e in wb.top("/a", now=T + W)] == ["dave"]


def test_calls_without_now_read_the_injected_clock():
    t = [T + 1.0]
    wb = WouldBeBlocked(NS, window_s=W, capacity=10, clock=lambda: t[0])
    wb.record("/a", "alice", "a0")
    assert wb.window_index() == T // W and [e["key"] for e in wb.top("/a")] == ["alice"]
    t[0] = T + W
    assert wb.top("/a") == []


@pytest_asyncio.fixture(loop_scope="function")
async def client(any_redis_url):
    c = make_redis_py_client(any_redis_url)
    yield c
    await c.aclose()


async def test_fleet_top_merges_two_replicas(client):
    r1 = WouldBeBlocked(NS, window_s=W, capacity=50)
    r2 = WouldBeBlocked(NS, window_s=W, capacity=50)
    for i in range(30):
        r1.record("/api", "alice", f"r1-a{i}", now=T)
    for i in range(25):
        r2.record("/api", "bob", f"r2-b{i}", now=T)
    for i in range(20):
        r2.record("/api", "alice", f"r2-a{i}", now=T)
    r1.record("/api", "carol", "r1-c0", now=T)
    r2.record("/other", "zed", "z0", now=T)

    assert await r1.flush(client) == 1
    assert await r2.flush(client) == 2
    assert await r1.flush(client) == 0  # nothing new

    fleet = await r1.fleet_top(client, "/api", n=10, now=T)
    assert fleet == [
        {"key": "alice", "count": 50, "last_request_id": "r2-a19", "cause": None, "units": None},
        {"key": "bob", "count": 25, "last_request_id": "r2-b24", "cause": None, "units": None},
        {"key": "carol", "count": 1, "last_request_id": "r1-c0", "cause": None, "units": None},
    ]
    # both replicas see the same fleet view; local views stay local
    assert await r2.fleet_top(client, "/api", n=2, now=T) == fleet[:2]
    assert [e["key"] for e in r1.top("/api", now=T)] == ["alice", "carol"]
    assert await r1.fleet_top(client, "/other", now=T) == [
        {"key": "zed", "count": 1, "last_request_id": "z0", "cause": None, "units": None}
    ]

    # more records after a flush are added, not re-added
    r1.record("/api", "bob", "r1-b0", now=T)
    await r1.flush(client)
    fleet = await r2.fleet_top(client, "/api", n=10, now=T)
    assert fleet[1] == {"key": "bob", "count": 26, "last_request_id": "r1-b0", "cause": None, "units": None}

    # another window is empty; keys expire after two windows
    assert await r1.fleet_top(client, "/api", now=T + W) == []
    w = int(T // W)
    assert 0 < await client.ttl(r1.zset_key("/api", w)) <= 2 * W
    assert 0 < await client.ttl(r1.ids_key("/api", w)) <= 2 * W
    assert r1.zset_key("/api", w) == f"rl:{NS}:hh:/api:{w}" and r1.ids_key("/api", w) == f"rl:{NS}:hhid:/api:{w}"


async def test_each_key_of_the_fleet_top_says_its_main_cause(client):
    """Two replicas record the causes of their keys' new rejections; the fleet's top gives each
    key the cause the most of them had (the earlier in the causes' order on a tie)."""
    r1, r2 = WouldBeBlocked(NS, window_s=W), WouldBeBlocked(NS, window_s=W)
    for wb, key, causes in (
        (r1, "alice", [Cause.REPLICAS] * 3 + [Cause.TIGHTER]),
        (r2, "alice", [Cause.TIGHTER] * 2),
        (r2, "bob", [Cause.CLOCK, Cause.REPLICAS]),
        (r1, "carol", []),
    ):
        for cause in causes or [None]:
            wb.record("/why", key, None, now=T)
            if cause is not None:
                wb.record_cause("/why", key, cause, now=T)
    await r1.flush(client)
    await r2.flush(client)
    top = await r1.fleet_top(client, "/why", now=T)
    assert {e["key"]: e["cause"] for e in top} == {"alice": "replicas", "bob": "clock", "carol": None}
    assert await client.hget(r1.causes_key("/why", int(T // W)), "tighter:alice") == b"3"
    # a cause past the bound between two flushes is not counted (the top keys come back)
    small = WouldBeBlocked(NS, window_s=W, capacity=1)
    for i in range(10):
        small.record_cause("/why", f"k{i}", Cause.TIGHTER, now=T)
    await small.flush(client)
    assert await client.hlen(small.causes_key("/why", int(T // W))) == 4 + 4  # 4 pairs above, the first 4 here


async def test_fleet_set_is_trimmed(client):
    wb = WouldBeBlocked(NS, window_s=W, capacity=FLEET_TOP_KEEP + 200)
    for i in range(FLEET_TOP_KEEP + 200):
        for _ in range(1 + (i % 3)):
            wb.record("/t", f"k{i}", None, now=T)
    await wb.flush(client)
    key = wb.zset_key("/t", int(T // W))
    assert await client.zcard(key) == FLEET_TOP_KEEP
    top = await wb.fleet_top(client, "/t", n=5, now=T)
    assert [e["count"] for e in top] == [3] * 5 and all(e["last_request_id"] is None for e in top)
    # the lowest scores were dropped, not the highest
    assert await client.zscore(key, "k2") == 3.0


async def test_failed_flush_keeps_deltas():
    server = EmbeddedRedis().start()
    client = make_redis_py_client(server.url, socket_timeout=0.5, connect_timeout=0.5)
    client.set_retry(Retry(NoBackoff(), 1))  # fail fast on the dead server
    wb = WouldBeBlocked(NS, window_s=W, capacity=10)
    try:
        wb.record("/a", "alice", "x1", now=T)
        await wb.flush(client)
        wb.record("/a", "alice", "x2", now=T)
        wb.record("/a", "bob", "y1", now=T, units=700)  # a budget's: kept through the failed flushes too
        server.kill()
        with pytest.raises(StoreUnavailable):
            await wb.flush(client)
        wb.record("/a", "alice", "x3", now=T)
        wb.record_cause("/a", "alice", Cause.TIGHTER, now=T)  # kept through the failed flushes too
        with pytest.raises(StoreUnavailable):
            await wb.flush(client)
        with pytest.raises(StoreUnavailable):
            await wb.fleet_top(client, "/a", now=T)
        server.start()  # no persistence: the fleet view restarts empty
        await wb.flush(client)
        assert await wb.fleet_top(client, "/a", now=T) == [
            {"key": "alice", "count": 2, "last_request_id": "x3", "cause": "tighter", "units": None},
            {"key": "bob", "count": 1, "last_request_id": "y1", "cause": None, "units": 700},
        ]
    finally:
        await client.aclose()
        server.stop()
