"""The stream's snapshot cache on its own: concurrent subscribers await one build, a
subscriber that leaves does not cancel it, a failure is not cached; time is a clock the
test moves."""

from __future__ import annotations

import asyncio

from control_plane.observe.snapshots import SnapshotCache, StreamSlots


async def settle() -> None:
    """Let every task that is ready run (a get, then the build task it started)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_concurrent_gets_await_one_build_and_a_cancelled_waiter_does_not_cancel_it():
    now = [100.0]
    release = asyncio.Event()
    calls: list[object] = []

    async def build(view: object) -> bytes:
        calls.append(view)
        await release.wait()
        return f"snap {len(calls)}".encode()

    cache = SnapshotCache(build, clock=lambda: now[0])
    waiters = [asyncio.ensure_future(cache.get("v", max_age=1.0)) for _ in range(20)]
    await asyncio.sleep(0)
    waiters[0].cancel()  # its subscriber went away: the others still get the build
    release.set()
    results = await asyncio.gather(*waiters[1:])
    assert set(results) == {b"snap 1"} and calls == ["v"] and cache.builds == 1
    now[0] += 0.9  # still fresh
    assert await cache.get("v", max_age=1.0) == b"snap 1" and cache.builds == 1
    assert await cache.get("w", max_age=1.0) == b"snap 2"  # another view, its own build
    now[0] += 0.1  # one interval after the build started: rebuilt
    assert await cache.get("v", max_age=1.0) == b"snap 3" and cache.builds == 3


async def test_a_failed_build_reaches_every_waiter_and_is_not_cached():
    fail = [True]
    gate = asyncio.Event()

    async def build(view: object) -> bytes:
        await gate.wait()
        if fail[0]:
            raise RuntimeError("redis went away")
        return b"ok"

    cache = SnapshotCache(build, clock=lambda: 0.0)
    waiters = [asyncio.ensure_future(cache.get("v", max_age=10.0)) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert [str(r) for r in results] == ["redis went away"] * 3 and cache.builds == 1
    fail[0] = False
    assert await cache.get("v", max_age=10.0) == b"ok" and cache.builds == 2


def test_stream_slots_refuse_beyond_the_limit_and_free_on_release():
    slots = StreamSlots(2)
    assert slots.acquire() and slots.acquire() and not slots.acquire()
    assert (slots.active, slots.refused) == (2, 1)
    slots.release()
    assert slots.acquire() and slots.active == 2


async def test_a_snapshot_older_than_what_the_caller_has_seen_is_rebuilt_even_when_fresh():
    version = [1]
    gates: list[asyncio.Event] = []

    async def build(view: object) -> bytes:
        gate = asyncio.Event()
        gates.append(gate)
        v = version[0]
        await gate.wait()
        return f"v{v}".encode()

    cache = SnapshotCache(build, version=lambda: version[0], clock=lambda: 0.0)
    first = asyncio.ensure_future(cache.get("v", max_age=10.0, min_version=1))
    await settle()
    version[0] = 2  # an event while the build runs: a caller that saw it does not join that build
    second = asyncio.ensure_future(cache.get("v", max_age=10.0, min_version=2))
    third = asyncio.ensure_future(cache.get("v", max_age=10.0, min_version=1))  # joins the newest build
    await settle()
    assert len(gates) == 2
    for g in gates:
        g.set()
    assert await first == b"v1" and await second == b"v2" and await third == b"v2"
    assert await cache.get("v", max_age=10.0, min_version=2) == b"v2" and cache.builds == 2
    version[0] = 3
    assert await cache.get("v", max_age=10.0, min_version=2) == b"v2"  # nothing newer was seen
    gates.clear()
    later = asyncio.ensure_future(cache.get("v", max_age=10.0, min_version=3))
    await settle()
    gates[0].set()
    assert await later == b"v3" and cache.builds == 3
