"""The shadow worker's linger: a trickle of shadow evaluations, one per event-loop turn,
goes to Redis as one batch instead of one round trip each (SHADOWLIMIT_SHADOW_LINGER_MS)."""

from __future__ import annotations

import asyncio
import types

import pytest

from control_plane.engine import Engine
from control_plane.settings import SettingsError, load_settings


async def _batches(linger_ms: float, items: int, batch_size: int = 256) -> list[int]:
    sizes: list[int] = []

    async def evaluate(batch):
        sizes.append(len(batch))

    fake = types.SimpleNamespace(
        _queue=asyncio.Queue(100),
        settings=types.SimpleNamespace(shadow_batch_size=batch_size, shadow_linger_ms=linger_ms),
        metrics=types.SimpleNamespace(shadow_queue=types.SimpleNamespace(set=lambda v: None)),
        _evaluate_shadow=evaluate,
    )
    worker = asyncio.create_task(Engine._shadow_worker(fake))
    try:
        for i in range(items):
            fake._queue.put_nowait(i)
            await asyncio.sleep(0)  # one request per loop turn
        for _ in range(200):
            if sum(sizes) == items:
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
    sizes: list[int] = []

    async def evaluate(batch):
        sizes.append(len(batch))

    q: asyncio.Queue = asyncio.Queue(100)
    for i in range(3):
        q.put_nowait(i)
    fake = types.SimpleNamespace(
        _queue=q,
        settings=types.SimpleNamespace(shadow_batch_size=3, shadow_linger_ms=10_000),
        metrics=types.SimpleNamespace(shadow_queue=types.SimpleNamespace(set=lambda v: None)),
        _evaluate_shadow=evaluate,
    )
    worker = asyncio.create_task(Engine._shadow_worker(fake))
    try:
        for _ in range(200):
            if sizes:
                break
            await asyncio.sleep(0.01)
    finally:
        worker.cancel()
    assert sizes == [3]


def test_linger_setting_is_validated():
    assert load_settings(shadow_linger_ms=0).shadow_linger_ms == 0
    with pytest.raises(SettingsError, match="SHADOWLIMIT_SHADOW_LINGER_MS"):
        load_settings(shadow_linger_ms=-1)
