"""``GET /v1/stream`` under many subscribers and across reconnects, over real HTTP against a
real control plane (uvicorn on loopback, the session's Redis): shared snapshot builds, the
subscriber cap, the minimum interval, ``Last-Event-ID`` replay and the gap notice, and the
dashboard's client resuming where it left off."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from cp_server import ADMIN_TOKEN, ControlPlaneServer, admin_headers, metric_value, wait_until, write_rules

from dashboard.client import ControlPlaneClient, EventView, Snapshot

BUILDS = "rate_limit_stream_snapshot_builds_total"


@pytest.fixture
def make_cp(redis_url, tmp_path):
    """Start control planes (stopped at teardown); overrides are settings field names."""
    servers: list[ControlPlaneServer] = []
    rules = write_rules(tmp_path)

    def make(**overrides: Any) -> ControlPlaneServer:
        cp = ControlPlaneServer(redis_url=redis_url, rules_path=rules, **overrides)
        servers.append(cp)
        return cp.start()

    yield make
    for s in reversed(servers):
        s.stop()


def metric(cp: ControlPlaneServer, name: str) -> float:
    return metric_value(httpx.get(cp.url + "/metrics", timeout=5).text, name)


def set_mode(cp: ControlPlaneServer, mode: str, reason: str) -> None:
    r = httpx.put(
        f"{cp.url}/v1/routes/search/mode",
        json={"mode": mode, "reason": reason, "force": True},
        headers=admin_headers(),
        timeout=5,
    )
    assert r.status_code == 200, r.text


def change_modes(cp: ControlPlaneServer, reasons: list[str]) -> None:
    """One mode change of route search per reason (shadow, off, shadow, ...), then wait
    until they have reached the replica's event hub (they come back through Redis pub/sub)."""
    for i, reason in enumerate(reasons):
        set_mode(cp, ("shadow", "off")[i % 2], reason)
    last = reasons[-1]  # events arrive in order: the last one there means all of them were
    wait_until(
        lambda: any(e.get("audit", {}).get("reason") == last for e in cp.engine.events.recent(1000)),
        5.0,
        what=f"event {last}",
    )


async def sse(resp: httpx.Response) -> AsyncIterator[tuple[str, str | None, Any]]:
    """(event, id, data) for each SSE message with data."""
    event, eid, data = "message", None, []
    async for line in resp.aiter_lines():
        if line == "":
            if data:
                yield event, eid, json.loads("\n".join(data))
            event, eid, data = "message", None, []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("id:"):
            eid = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


async def until_snapshot(
    c: httpx.AsyncClient, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> list[tuple[str, str | None, Any]]:
    """Open a stream and return every message up to and including its first snapshot."""
    out = []
    async with c.stream("GET", "/v1/stream", params=params or {}, headers=headers or {}) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for msg in sse(resp):
            out.append(msg)
            if msg[0] == "snapshot":
                return out
    raise AssertionError(f"the stream ended before a snapshot: {out}")


def events_of(msgs: list[tuple[str, str | None, Any]]) -> list[tuple[str | None, str]]:
    return [(eid, data["audit"]["reason"]) for kind, eid, data in msgs if kind == "event"]


# --------------------------------------------------------------------------- shared snapshots


async def test_subscribers_of_one_view_share_one_snapshot_build_per_interval(make_cp):
    cp = make_cp()
    assert metric(cp, BUILDS) == 0

    async def snapshot_times(c: httpx.AsyncClient, n: int, **params: Any) -> list[float]:
        ats: list[float] = []
        async with c.stream("GET", "/v1/stream", params={"interval": 0.5, "route": "search", **params}) as resp:
            assert resp.status_code == 200
            async for kind, _, data in sse(resp):
                if kind == "snapshot":
                    ats.append(data["at"])
                    if len(ats) == n:
                        return ats
        raise AssertionError("stream ended")

    async with httpx.AsyncClient(base_url=cp.url, timeout=10) as c:
        a, b, other = await asyncio.gather(snapshot_times(c, 6), snapshot_times(c, 6), snapshot_times(c, 3, minutes=5))
    wait_until(lambda: metric(cp, "rate_limit_stream_subscribers") == 0, 5.0, what="the streams to close")
    shared = set(a) | set(b)
    # the same bytes went to both subscribers of the view: at most one snapshot apart at the end
    assert len(a) == len(b) == 6 and len(shared) <= 7, (a, b)
    # another view (minutes=5) is built on its own
    assert not set(other) & shared
    # one build per snapshot sent (and at most the one in flight when each stream closed)
    builds = metric(cp, BUILDS)
    assert len(shared) + len(other) <= builds <= len(shared) + len(other) + 3


async def test_a_shared_snapshot_never_predates_an_event_the_subscriber_could_not_see(make_cp):
    """B joins A's view after a mode change: A's cached snapshot is fresh by age but from
    before the change, which B will never be sent as an event; B gets a new build."""
    cp = make_cp()
    async with httpx.AsyncClient(base_url=cp.url, timeout=10) as c:
        async with c.stream("GET", "/v1/stream", params={"interval": 60}) as a:
            messages = sse(a)
            kind, _, first = await anext(messages)
            assert kind == "snapshot" and route_mode(first, "search") == "shadow"
            await asyncio.to_thread(set_mode, cp, "off", "to off")
            kind, _, ev = await anext(messages)
            assert kind == "event" and ev["state"]["mode"] == "off"
            msgs = await until_snapshot(c, {"interval": 60})
    assert route_mode(msgs[-1][2], "search") == "off"


def route_mode(snapshot: dict[str, Any], route: str) -> str:
    return next(r["mode"] for r in snapshot["routes"] if r["name"] == route)


# --------------------------------------------------------------------------- limits


async def test_beyond_max_streams_the_stream_answers_503_too_many_streams_before_any_build(make_cp):
    cp = make_cp(max_streams=2)
    async with httpx.AsyncClient(base_url=cp.url, timeout=10) as c:
        async with (
            c.stream("GET", "/v1/stream", params={"interval": 60}) as s1,
            c.stream("GET", "/v1/stream", params={"interval": 60}) as s2,
        ):
            # one iterator per stream, kept: an abandoned iterator closes its connection
            open_streams = [sse(s) for s in (s1, s2)]
            for s, messages in zip((s1, s2), open_streams):
                assert s.status_code == 200
                while (await anext(messages))[0] != "snapshot":
                    pass
            builds = metric(cp, BUILDS)
            async with c.stream(
                "GET", "/v1/stream", params={"route": "login", "minutes": 7}
            ) as r:  # a view nobody has built
                assert r.status_code == 503
                assert r.headers["content-type"] == "application/json"
                assert int(r.headers["retry-after"]) > 0
                body = json.loads(await r.aread())
            assert body["error"] == "too_many_streams" and body["limit"] == 2
            assert "SHADOWLIMIT_MAX_STREAMS" in body["message"]
            assert metric(cp, BUILDS) == builds
            text = httpx.get(cp.url + "/metrics").text
            assert metric_value(text, "rate_limit_stream_refused_total") == 1
            assert metric_value(text, "rate_limit_stream_subscribers") == 2
        # a slot is free again once a subscriber has gone
        wait_until(lambda: metric(cp, "rate_limit_stream_subscribers") == 0, 5.0, what="the slots to be released")
        msgs = await until_snapshot(c)
        assert msgs[-1][0] == "snapshot"


def test_an_interval_below_the_minimum_is_422_naming_interval(make_cp):
    cp = make_cp(stream_min_interval_s=0.5)
    with cp.client() as c:
        with c.stream("GET", "/v1/stream", params={"interval": 0.2}) as r:
            assert r.status_code == 422
            body = json.loads(r.read())
        assert body["error"] == "invalid_request" and body["field"] == "interval"
        assert "0.5" in body["message"] and "SHADOWLIMIT_STREAM_MIN_INTERVAL_S" in body["message"]
        for bad in ("0", "-1", "61", "soon"):
            with c.stream("GET", "/v1/stream", params={"interval": bad}) as r:
                assert r.status_code == 422 and json.loads(r.read())["field"] == "interval", bad
        with c.stream("GET", "/v1/stream", params={"interval": 0.5}) as resp:
            assert resp.status_code == 200
    assert (
        wait_until(lambda: metric(cp, "rate_limit_stream_subscribers") == 0, 5.0, what="the stream to close")
        is not None
    )


# --------------------------------------------------------------------------- Last-Event-ID


async def test_reconnecting_with_last_event_id_gets_exactly_the_missed_events_in_order(make_cp):
    cp = make_cp()
    async with httpx.AsyncClient(base_url=cp.url, timeout=10) as c:
        async with c.stream("GET", "/v1/stream", params={"interval": 60}) as resp:
            seen: list[tuple[str | None, str]] = []
            async for kind, eid, data in sse(resp):
                if kind == "snapshot" and not seen:
                    await asyncio.to_thread(change_modes, cp, ["r1", "r2"])
                elif kind == "event":
                    seen.append((eid, data["audit"]["reason"]))
                    if len(seen) == 2:
                        break
        assert [r for _, r in seen] == ["r1", "r2"]
        boot, _, seq = str(seen[-1][0]).rpartition("-")
        assert boot and seq.isdigit()
        await asyncio.to_thread(change_modes, cp, ["r3", "r4", "r5"])
        async with c.stream(
            "GET", "/v1/stream", params={"interval": 60}, headers={"Last-Event-ID": str(seen[-1][0])}
        ) as resp:
            msgs = []
            async for msg in sse(resp):
                msgs.append(msg)
                if msg[0] == "snapshot":
                    await asyncio.to_thread(change_modes, cp, ["r6"])  # a live one follows the replay
                if msg[0] == "event" and msg[2]["audit"]["reason"] == "r6":
                    break
    assert [m[0] for m in msgs] == ["event", "event", "event", "snapshot", "event"]
    assert events_of(msgs) == [(f"{boot}-{int(seq) + i}", r) for i, r in enumerate(["r3", "r4", "r5", "r6"], start=1)]


async def test_an_id_from_another_boot_replays_the_whole_history_after_a_gap_notice(make_cp):
    cp = make_cp()
    await asyncio.to_thread(change_modes, cp, ["a1", "a2"])
    async with httpx.AsyncClient(base_url=cp.url, timeout=10) as c:
        msgs = await until_snapshot(c, {"interval": 60})
        assert [m[0] for m in msgs] == ["snapshot"]  # no Last-Event-ID: no replay
        old_id = msgs[-1][2]["events"][-1]["id"]  # ids are in the snapshot's recent events too
        await asyncio.to_thread(cp.restart)  # a new boot of the replica
        await asyncio.to_thread(change_modes, cp, ["b1"])
        msgs = await until_snapshot(c, {"interval": 60}, {"Last-Event-ID": old_id})
    kind, eid, gap = msgs[0]
    assert kind == "gap" and eid is None
    history = cp.engine.events.recent(1000)
    assert gap == {
        "reason": "other_boot",
        "last_event_id": old_id,
        "boot": cp.engine.events.boot,
        "oldest_id": history[0]["id"],
        "replayed": len(history),
    }
    assert gap["boot"] != old_id.rpartition("-")[0]
    assert [m[1] for m in msgs[1:-1]] == [e["id"] for e in history]
    assert events_of(msgs)[-1][1] == "b1"


@pytest.mark.parametrize(
    ("last", "reason"),
    [("seq1", "too_old"), ("seq2", None), ("x", "malformed"), ("future", "malformed"), ("empty", "no replay")],
)
async def test_an_id_older_than_the_history_or_not_an_id_replays_it_all_after_a_gap_notice(make_cp, last, reason):
    cp = make_cp(stream_history=3)
    await asyncio.to_thread(change_modes, cp, ["e1", "e2", "e3", "e4", "e5"])
    held = cp.engine.events.recent(1000)
    boot = cp.engine.events.boot
    assert [e["id"] for e in held] == [f"{boot}-{n}" for n in (3, 4, 5)]
    header = {"seq1": f"{boot}-1", "seq2": f"{boot}-2", "x": "x", "future": f"{boot}-99", "empty": ""}[last]
    async with httpx.AsyncClient(base_url=cp.url, timeout=10) as c:
        msgs = await until_snapshot(c, {"interval": 60}, {"Last-Event-ID": header})
    if reason == "no replay":  # an empty id is no id (EventSource does not send one)
        assert [m[0] for m in msgs] == ["snapshot"]
        return
    if reason is None:  # the event right after it is still held: no gap
        assert msgs[0][0] == "event"
    else:
        assert msgs[0][0] == "gap" and msgs[0][2]["reason"] == reason and msgs[0][2]["replayed"] == 3
    assert events_of(msgs) == [(f"{boot}-{n}", f"e{n}") for n in (3, 4, 5)]


# --------------------------------------------------------------------------- the dashboard's client


async def test_the_dashboard_client_resumes_after_its_last_event_id(make_cp):
    cp = make_cp()
    client = ControlPlaneClient(cp.url, ADMIN_TOKEN)
    try:
        first = client.stream()
        async for item in first:
            if isinstance(item, Snapshot):
                await client.set_mode("search", "off", reason="d1", force=True)
            elif isinstance(item, EventView) and item.audit and item.audit.reason == "d1":
                break
        await first.aclose()  # the stream is lost
        assert client.last_event_id is not None
        await asyncio.to_thread(change_modes, cp, ["d2", "d3"])
        got: list[str] = []
        async for item in client.stream():
            if isinstance(item, Snapshot):
                break
            assert isinstance(item, EventView) and item.audit is not None
            got.append(item.audit.reason)
        assert got == ["d2", "d3"]
        assert client.last_event_id == cp.engine.events.last_id
    finally:
        await client.aclose()
