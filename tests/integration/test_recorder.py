"""The what-if recorder on real Redis, standalone and a 3-master cluster (its keys live in
different slots): what is written is read back whole, and sampling starts when the fleet's
count passes the budget."""

from __future__ import annotations

import pytest

from control_plane.whatif import Recorder
from limiter.redis_limiter import make_redis_py_client
from limiter.redis_url import parse_redis_url

pytestmark = pytest.mark.asyncio

NOW = 1_795_000_000.0  # a fixed clock: inside one minute, 30 s in


def _client(url: str):
    return make_redis_py_client(parse_redis_url(url))


async def test_recorded_requests_are_read_back_whole(any_redis_url) -> None:
    client = _client(any_redis_url)
    rec = Recorder(client, "rec-t", budget=1000, minutes=5, clock=lambda: NOW)
    base = int((NOW - 20) * 1_000_000)
    for i in range(300):
        rec.offer("a" if i % 2 else "b", f"k{i % 7}", 1 + i % 3, base + i * 1000, "shadow", i % 5 != 0)
    assert await rec.flush() == 300
    by_key, share, minutes = await rec.read("a", 5, NOW)
    assert minutes == 1 and share == 1.0
    assert sum(len(v) for v in by_key.values()) == 150
    got = sorted((k, ts, cost) for k, evs in by_key.items() for ts, cost, _ in evs)
    want = sorted((f"k{i % 7}", base + i * 1000, 1 + i % 3) for i in range(300) if i % 2)
    assert got == want
    await client.aclose()


async def test_sampling_starts_when_the_fleet_passes_the_budget(any_redis_url) -> None:
    client = _client(any_redis_url)
    rec = Recorder(client, "rec-s", budget=100, minutes=5, clock=lambda: NOW)
    base = int((NOW - 25) * 1_000_000)
    for route in ("x", "y"):  # two routes: their counters sit in different cluster slots
        for i in range(200):
            rec.offer(route, f"key{i}", 1, base + i, "shadow", True)
    await rec.flush()
    # 200 in the first 30 s of the minute projects to 400 a minute: 4x the budget, rate 1/4
    assert rec._rates == {"x": 1 / 4, "y": 1 / 4}
    for i in range(400):
        rec.offer("x", f"key{i}", 1, base + 10_000 + i, "shadow", True)
    await rec.flush()
    by_key, share, _ = await rec.read("x", 5, NOW)
    events = [e for evs in by_key.values() for e in evs]
    sampled = [e for e in events if e[2] == 4.0]
    assert 200 + 60 < len(events) < 200 + 140  # about one key in four the second time
    assert 0.7 * 400 < sum(e[2] for e in sampled) < 1.3 * 400  # and scaled back to about the 400 sent
    await client.aclose()


async def test_each_minute_of_a_route_has_its_own_cap_and_count(any_redis_url) -> None:
    client = _client(any_redis_url)
    rec = Recorder(client, "rec-c", budget=100, minutes=5, clock=lambda: NOW)
    minute = int(NOW // 60) * 60
    before, now = (minute - 60) * 1_000_000, minute * 1_000_000
    for i in range(450):  # the minute before: 400 recorded (4x the budget, this replica's cap), 50 cut
        rec.offer("r", f"k{i}", 1, before + i, "shadow", True)
    for i in range(30):  # this minute: its own cap
        rec.offer("r", f"k{i}", 1, now + i, "shadow", True)
    for i in range(10):  # the minute before again (a caller's clock behind): still past its cap
        rec.offer("r", "late", 1, before + 1_000 + i, "shadow", True)
    assert rec.dropped == 60
    assert await rec.flush() == 430
    _, decided = await rec.read_raw("r", 2, NOW)
    assert decided == 490  # every decided request is counted, recorded or not
    by_key, share, minutes = await rec.read("r", 2, NOW)
    assert minutes == 2 and sum(len(v) for v in by_key.values()) == 430 and share == 430 / 490
    # the next flush counts only what came since (decided, whether sampling records it or not)
    rec.offer("r", "k0", 1, now + 100, "shadow", True)
    await rec.flush()
    assert (await rec.read_raw("r", 1, NOW))[1] == 31
    await client.aclose()
