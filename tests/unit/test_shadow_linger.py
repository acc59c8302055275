"""The shadow worker's linger: a trickle of shadow evaluations, one per event-loop turn,
goes to Redis as one batch instead of one round trip each (SHADOWLIMIT_SHADOW_LINGER_MS)."""

from __future__ import annotations

import asyncio

import pytest

from control_plane.decision import Comparisons
from control_plane.decision.shadow import ShadowItem, ShadowPipeline, ShadowQueue
from control_plane.observe.hitters import WouldBeBlocked
from control_plane.observe.metrics import Metrics
from control_plane.settings import SettingsError, load_settings
from control_plane.store import DivergenceStore


class _Verdicts:
    """Redis's stand-in: records the batches sent and answers with given verdicts."""

    def __init__(self, verdicts=None):
        self.sizes: list[int] = []
        self.requests: list = []
        self.verdicts = verdicts

    async def compare_many(self, requests):
        self.sizes.append(len(requests))
        self.requests += requests
        return self.verdicts if self.verdicts is not None else [True] * len(requests)


def _pipeline(redis, *, linger_ms: float = 0, batch_size: int = 256, queue_size: int = 100):
    m = Metrics()
    comparisons = Comparisons(DivergenceStore(None, "ns"), WouldBeBlocked("ns"), m)
    return ShadowPipeline(redis, comparisons, queue_size=queue_size, batch_size=batch_size, linger_s=linger_ms / 1000)


def _item(i: int):
    from limiter import Policy

    return ShadowItem(
        request=(f"r:k{i}", Policy(average=10), 1, i), route="r", key=f"k{i}", local_allowed=True, request_id=f"id{i}"
    )


async def _batches(linger_ms: float, items: int, batch_size: int = 256, *, waiting: int = 0) -> list[int]:
    """Run the real worker on its queue: ``waiting`` items queued before it starts, then
    ``items`` more, one per event-loop turn; the sizes of the batches it sends."""
    redis = _Verdicts()
    pipe = _pipeline(redis, linger_ms=linger_ms, batch_size=batch_size)
    for i in range(waiting):
        assert pipe.offer(_item(i))
    worker = asyncio.create_task(pipe.run())
    try:
        for i in range(items):
            assert pipe.offer(_item(waiting + i))
            await asyncio.sleep(0)  # one request per loop turn
        for _ in range(200):
            if sum(redis.sizes) == waiting + items:
                break
            await asyncio.sleep(0.01)
    finally:
        worker.cancel()
    return redis.sizes


async def test_linger_gathers_a_trickle_into_one_batch():
    assert await _batches(linger_ms=200, items=5) == [5]


async def test_no_linger_sends_each_at_once():
    assert await _batches(linger_ms=0, items=5) == [1, 1, 1, 1, 1]


async def test_a_full_batch_does_not_wait():
    # 3 waiting with a batch size of 3: sent at once, not after the 10 s linger
    # (the poll above gives up after about 2 s)
    assert await _batches(linger_ms=10_000, items=0, batch_size=3, waiting=3) == [3]


def test_linger_setting_is_validated():
    assert load_settings(shadow_linger_ms=0).shadow_linger_ms == 0
    with pytest.raises(SettingsError, match="SHADOWLIMIT_SHADOW_LINGER_MS"):
        load_settings(shadow_linger_ms=-1)


async def test_shadow_queue_refuses_when_full_and_wakes_the_worker():
    q = ShadowQueue(2)
    waiter = asyncio.create_task(q.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    assert q.offer("a")
    await asyncio.wait_for(waiter, 1)
    assert q.offer("b")
    assert not q.offer("c")
    assert len(q) == 2
    assert q.take(1) == ["a"] and q.take(5) == ["b"] and len(q) == 0
    assert q.take(5) == []
    # a cancelled wait leaves no waiter behind: the next offer does not trip over it
    w2 = asyncio.create_task(q.wait())
    await asyncio.sleep(0)
    w2.cancel()
    with pytest.raises(asyncio.CancelledError):
        await w2
    assert q.offer("d")
    assert q.take(1) == ["d"]


async def test_drain_evaluates_everything_queued():
    redis = _Verdicts()
    pipe = _pipeline(redis)
    for i in range(7):
        pipe.offer(_item(i))
    assert await pipe.drain() == 7
    assert redis.sizes == [7] and len(pipe) == 0 and pipe.comparisons.evaluated == 7
    assert await pipe.drain() == 0


async def test_evaluate_shadow_counts_each_route_and_backend_errors():
    """One batch over two routes with every outcome: the per-route totals, metrics,
    'would be blocked' records and the evaluated count are what per-item recording gave."""
    from limiter import Policy

    p = Policy(average=10, period=1.0, burst=10)

    def item(lkey: str, now_us: int, key: str, local_allowed: bool, request_id: str) -> ShadowItem:
        route = lkey.split(":")[0]
        return ShadowItem(
            request=(lkey, p, 1, now_us), route=route, key=key, local_allowed=local_allowed, request_id=request_id
        )

    # the queued request -> its distributed verdict
    cases = [
        (item("a:k1", 1, "k1", True, "r1"), True),  # agree
        (item("a:k2", 2, "k2", True, "r2"), False),  # local allow, distributed deny
        (item("a:k2", 3, "k2", True, "r3"), False),
        (item("a:k3", 4, "k3", False, "r4"), True),  # local deny, distributed allow
        (item("b:k1", 5, "k1", False, "r5"), False),  # agree (both deny)
        (item("b:k4", 6, "k4", True, "r6"), None),  # no verdict: backend error
        (item("b:k5", 7, "k5", True, "r7"), None),
    ]

    redis = _Verdicts([verdict for _, verdict in cases])
    pipe = _pipeline(redis)
    await pipe.evaluate([it for it, _ in cases])
    assert redis.requests == [it.request for it, _ in cases]
    comparisons = pipe.comparisons
    m = comparisons.metrics

    assert comparisons.evaluated == 5
    pending = {route: counts for (route, _), counts in comparisons.divergence.pending().items()}
    assert pending["a"] == {
        "agree": 1,
        "local_allow_distributed_deny": 2,
        "local_deny_distributed_allow": 1,
        "compared": 4,
        "backend_errors": 0,
        "distributed_attempts": 4,
        "shadow_dropped": 0,
    }
    assert pending["b"] == {
        "agree": 1,
        "local_allow_distributed_deny": 0,
        "local_deny_distributed_allow": 0,
        "compared": 1,
        "backend_errors": 2,
        "distributed_attempts": 3,
        "shadow_dropped": 0,
    }

    def value(route, direction):
        return (
            m.registry.get_sample_value("rate_limit_shadow_divergence_total", {"route": route, "direction": direction})
            or 0
        )

    assert (
        value("a", "agree"),
        value("a", "local_allow_distributed_deny"),
        value("a", "local_deny_distributed_allow"),
    ) == (1, 2, 1)
    assert (value("b", "agree"), value("b", "local_allow_distributed_deny")) == (1, 0)
    assert m.registry.get_sample_value("rate_limit_backend_errors_total") == 2
    top = comparisons.blocked.top("a")
    assert [(e["key"], e["count"], e["last_request_id"]) for e in top] == [("k2", 2, "r3")]
    assert comparisons.blocked.top("b") == []
