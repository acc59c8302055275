"""The shadow worker's linger: a trickle of shadow evaluations, one per event-loop turn,
goes to Redis as one batch instead of one round trip each (SHADOWLIMIT_SHADOW_LINGER_MS)."""

from __future__ import annotations

import asyncio
import types

import pytest

from control_plane.engine import Engine, _ShadowQueue
from control_plane.settings import SettingsError, load_settings


async def _batches(linger_ms: float, items: int, batch_size: int = 256, *, waiting: int = 0) -> list[int]:
    """Run the real worker loop on a queue: ``waiting`` items queued before it starts,
    then ``items`` more, one per event-loop turn; the sizes of the batches it sends."""
    sizes: list[int] = []

    async def evaluate(batch):
        sizes.append(len(batch))

    fake = types.SimpleNamespace(
        _queue=_ShadowQueue(100),
        settings=types.SimpleNamespace(shadow_batch_size=batch_size, shadow_linger_ms=linger_ms),
        metrics=types.SimpleNamespace(shadow_queue=types.SimpleNamespace(set=lambda v: None)),
        _evaluate_shadow=evaluate,
    )
    for i in range(waiting):
        fake._queue.put_nowait(i)
    worker = asyncio.create_task(Engine._shadow_worker(fake))
    try:
        for i in range(items):
            fake._queue.put_nowait(i)
            await asyncio.sleep(0)  # one request per loop turn
        for _ in range(200):
            if sum(sizes) == waiting + items:
                break
            await asyncio.sleep(0.01)
    finally:
        worker.cancel()
    return sizes


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
    q = _ShadowQueue(2)
    waiter = asyncio.create_task(q.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    q.put_nowait("a")
    await asyncio.wait_for(waiter, 1)
    q.put_nowait("b")
    with pytest.raises(asyncio.QueueFull):
        q.put_nowait("c")
    assert q.qsize() == len(q) == 2 and not q.empty()
    assert q.take(1) == ["a"] and q.take(5) == ["b"] and q.empty()
    with pytest.raises(asyncio.QueueEmpty):
        q.get_nowait()
    # a cancelled wait leaves no waiter behind: the next put does not trip over it
    w2 = asyncio.create_task(q.wait())
    await asyncio.sleep(0)
    w2.cancel()
    with pytest.raises(asyncio.CancelledError):
        await w2
    q.put_nowait("d")
    assert q.get_nowait() == "d"
