"""The control plane's own state survives Redis losing its data.

Routes forced to enforce / off / canary, then Redis restarted empty or flushed: every
replica keeps answering with the operator's modes, the newest state and the audit
entries they saw are written back (compare-and-set, audited as a restoration), and a
replica started after the loss, with no memory, does not win over it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import redis as redis_sync
from cp_server import ADMIN_TOKEN, ControlPlaneServer, admin_headers, unique_namespace, wait_until, write_rules

from control_plane.engine import Engine
from control_plane.model.recovery import RememberedAudit, StateMemory, StoreView
from control_plane.model.rollout import Mode, RouteState
from control_plane.observe.auditlog import AUDIT_LOGGER
from control_plane.observe.metrics import Metrics
from control_plane.settings import SettingsError, load_settings
from control_plane.store import AUDIT_MAXLEN
from control_plane.wiring import build_engine
from limiter import RedisLimiter
from limiter.embedded import EmbeddedRedis
from limiter.redis_limiter import make_redis_py_client

OPERATOR_MODES = {"search": ("enforce", 0), "login": ("off", 0), "export": ("canary", 50)}


# --------------------------------------------------------------------------- #
# the pure memory
# --------------------------------------------------------------------------- #


def _st(mode: str, version: int, percent: int = 0) -> RouteState:
    return RouteState(mode=Mode(mode), canary_percent=percent, version=version, updated_by="op")


def test_memory_never_takes_an_older_state():
    mem = StateMemory()
    assert mem.note_state("a", _st("enforce", 5))
    assert not mem.note_state("a", _st("shadow", 4))
    assert mem.states["a"].mode is Mode.ENFORCE
    assert mem.note_state("a", _st("off", 6))
    assert mem.states["a"].mode is Mode.OFF


def test_memory_detects_each_kind_of_loss():
    mem = StateMemory()
    mem.absorb(StoreView(states={"a": _st("enforce", 3)}, epoch="e1"))
    mem.note_audit(RememberedAudit("100-0", "mode_change", "a", "{}"))
    same = StoreView(states={"a": _st("enforce", 3)}, epoch="e1", head_present=True, audit_len=1, audit_first="100-0")
    assert not mem.check(same, audit_maxlen=AUDIT_MAXLEN).lost
    empty = StoreView(states={}, epoch=None, head_present=False, audit_len=0)
    loss = mem.check(empty, audit_maxlen=AUDIT_MAXLEN)
    assert loss.epoch_changed and loss.routes == ("a",) and loss.audit_missing
    older = StoreView(states={"a": _st("shadow", 2)}, epoch="e1", head_present=True, audit_len=1, audit_first="100-0")
    assert mem.check(older, audit_maxlen=AUDIT_MAXLEN).routes == ("a",)
    # the head missing from a full stream that starts after it was trimmed, not lost
    trimmed = StoreView(
        states={"a": _st("enforce", 3)}, epoch="e1", head_present=False, audit_len=AUDIT_MAXLEN, audit_first="200-0"
    )
    assert not mem.check(trimmed, audit_maxlen=AUDIT_MAXLEN).lost
    # absorbing the empty store changes no mode
    assert mem.absorb(empty) == []
    assert mem.states["a"].mode is Mode.ENFORCE


def test_memory_keeps_the_newest_audit_entries():
    mem = StateMemory(audit_capacity=10)
    for i in range(30):
        mem.note_audit(RememberedAudit(f"{1000 + i}-0", "reset", "*", "{}"))
    ids = [e.id for e in mem.audit_entries()]
    assert ids[-1] == "1029-0" and len(ids) <= 12 and ids == sorted(ids)
    assert mem.head == "1029-0"


# --------------------------------------------------------------------------- #
# engines in-process against a real Redis, synced by hand (deterministic order)
# --------------------------------------------------------------------------- #


@pytest.fixture
def flush(request, any_redis_url):
    """Flush every node of the store under test (standalone or the cluster)."""
    if request.node.callspec.params["any_redis_url"] == "standalone":
        nodes = [redis_sync.Redis.from_url(any_redis_url)]
    else:
        nodes = [redis_sync.Redis(host=h, port=p) for h, p in request.getfixturevalue("redis_cluster").nodes]
    return lambda: [n.flushall() for n in nodes]


@pytest_asyncio.fixture(loop_scope="function")
async def engines(any_redis_url, tmp_path):
    """A factory of started-but-idle engines (no background loops) sharing one namespace,
    on standalone Redis and on the cluster."""
    redis_url = any_redis_url
    ns = unique_namespace()
    rules = write_rules(tmp_path)
    made: list[tuple[Engine, RedisLimiter, object]] = []

    async def make(**overrides) -> Engine:
        settings = load_settings(
            redis_url=redis_url, rules_path=rules, namespace=ns, enable_distributed_rate_limiting=True, **overrides
        )
        rl = RedisLimiter.from_url(redis_url, namespace=ns)
        client = make_redis_py_client(redis_url)
        engine = build_engine(settings, redis=rl, client=client, metrics=Metrics())
        made.append((engine, rl, client))
        await engine.rollout.sync()
        return engine

    yield make
    for _engine, rl, client in made:
        await rl.aclose()
        await client.aclose()


async def _force(engine: Engine) -> None:
    for route, (mode, pct) in OPERATOR_MODES.items():
        await engine.rollout.set_mode(
            route, Mode(mode), canary_percent=pct, reason=f"operator sets {mode}", actor="alice", force=True
        )


def _modes(engine: Engine) -> dict[str, tuple[str, int]]:
    return {
        r: (engine.rollout.state_for(r).mode.value, engine.rollout.state_for(r).canary_percent) for r in OPERATOR_MODES
    }


async def test_restore_after_flushall_is_audited_and_agreed(engines, flush):
    a = await engines()
    b = await engines()
    await _force(a)
    await b.rollout.sync()
    before = [e.id for e in await a.store.audit(limit=100)]
    assert len(before) == 3
    flush()
    # a replica started after the loss, with no memory, syncs first: defaults, no writes
    fresh = await engines()
    assert _modes(fresh) == {r: ("shadow", 0) for r in OPERATOR_MODES}
    assert await fresh.store.get_all() == {}
    # the replicas that remember are never moved by the empty store ...
    assert _modes(a) == OPERATOR_MODES and _modes(b) == OPERATOR_MODES
    # ... and both write back at once: one restoration, the other finds nothing to do
    await a.rollout.sync()
    await b.rollout.sync()
    await fresh.rollout.sync()
    for e in (a, b, fresh):
        assert _modes(e) == OPERATOR_MODES
    entries = await a.store.audit(limit=100)
    restores = [e for e in entries if e.kind == "restore"]
    assert sorted(e.route for e in restores) == sorted(OPERATOR_MODES)
    assert all(e.actor == f"instance/{a.instance_id}" and "after the store lost its data" in e.reason for e in restores)
    assert {(e.route, e.from_mode, e.to_mode) for e in restores} == {(r, "", m) for r, (m, _) in OPERATOR_MODES.items()}
    # the old entries are back at their own ids, in order, before the restorations
    ids = [e.id for e in reversed(entries)]
    assert ids[:3] == list(reversed(before))
    assert a.rollout.restorations == 1 and b.rollout.restorations == 0
    stored = await a.store.get_all()
    assert {r: (s.mode.value, s.canary_percent) for r, s in stored.items()} == OPERATOR_MODES


async def test_the_newest_remembered_state_wins(engines, flush):
    a = await engines()
    b = await engines()
    await a.rollout.set_mode("search", Mode.ENFORCE, reason="v1", actor="alice", force=True)
    await b.rollout.sync()
    await b.rollout.set_mode("search", Mode.OFF, reason="v2", actor="bob")  # a has not synced: it remembers v1
    flush()
    await a.rollout.sync()  # restores v1 (all it knows)
    await b.rollout.sync()  # remembers v2: compare-and-set wins over v1
    await a.rollout.sync()
    for e in (a, b):
        assert (e.rollout.state_for("search").mode, e.rollout.state_for("search").version) == (Mode.OFF, 2)
    audit = await a.store.audit(limit=20)
    assert [(e.kind, e.to_mode) for e in audit if e.route == "search"][:2] == [
        ("restore", "off"),
        ("restore", "enforce"),
    ]


async def test_adjustments_survive_the_loss(engines, flush):
    from limiter import Policy

    a = await engines()
    await a.adjustments.adjust(
        "search", None, "both", Policy(average=3, period=1, burst=3), reason="tighten", actor="alice"
    )
    flush()
    await a.rollout.sync()
    assert [x["route"] for x in a.adjustments.listing()] == ["search"]
    fresh = await engines()
    assert [x["route"] for x in fresh.adjustments.listing()] == ["search"]
    assert fresh.adjustments.policies(fresh.rules.get("search"), "k")[1].burst == 3


async def test_a_lagging_copy_is_brought_forward(engines):
    """A failover to a replica that missed the last change looks like an older store."""
    a = await engines()
    await a.rollout.set_mode("search", Mode.CANARY, canary_percent=10, reason="v1", actor="alice", force=True)
    snapshot = await a.client.hget(a.store.rollout_key, "search")
    await a.rollout.set_mode("search", Mode.ENFORCE, reason="v2", actor="alice", force=True)
    await a.client.hset(a.store.rollout_key, "search", snapshot)  # the copy that lost v2
    await a.rollout.sync()
    assert a.rollout.state_for("search").mode is Mode.ENFORCE
    stored = await a.store.get("search")
    assert stored is not None and (stored.mode, stored.version) == (Mode.ENFORCE, 2)
    restore = (await a.store.audit(limit=1))[0]
    assert (restore.kind, restore.from_mode, restore.to_mode) == ("restore", "canary", "enforce")
    assert "stored version 1, restored version 2" in restore.reason


async def test_mode_change_on_a_store_that_lost_the_route_restores_first(engines, flush):
    a = await engines()
    await a.rollout.set_mode("search", Mode.ENFORCE, reason="v1", actor="alice", force=True)
    flush()
    state, entry, _ = await a.rollout.set_mode("search", Mode.SHADOW, reason="back to shadow", actor="alice")
    assert (state.version, entry.from_mode) == (2, "enforce")
    assert [e.kind for e in await a.store.audit(limit=10, route="search")][:2] == ["mode_change", "restore"]


async def test_every_audit_entry_is_a_json_log_line_and_a_file_line(engines, tmp_path, caplog):
    path = tmp_path / "audit.jsonl"
    a = await engines(audit_log=path)
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    await a.rollout.set_mode("search", Mode.ENFORCE, reason="go", actor="alice", force=True)
    await a.adjustments.adjust("search", None, "both", None, reason="clear", actor="alice")
    stored = await a.store.audit(limit=10)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["id"] for x in lines] == [e.id for e in reversed(stored)]
    assert lines[0]["kind"] == "mode_change" and lines[0]["to"] == "enforce" and lines[0]["instance"] == a.instance_id
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == AUDIT_LOGGER]
    assert [x["id"] for x in logged] == [x["id"] for x in lines]


def test_an_audit_log_that_cannot_be_written_is_a_startup_error(tmp_path):
    with pytest.raises(SettingsError, match="SHADOWLIMIT_AUDIT_LOG"):
        load_settings(audit_log=tmp_path / "missing-dir" / "audit.jsonl")
    with pytest.raises(SettingsError, match="SHADOWLIMIT_AUDIT_LOG"):
        load_settings(audit_log=tmp_path)


async def test_auto_rollback_records_the_true_from_mode_after_the_store_lost_it(engines, flush):
    a = await engines(auto_rollback_after_s=0.01)
    await a.rollout.set_mode("search", Mode.ENFORCE, reason="go", actor="alice", force=True)
    await a.rollout.set_mode("export", Mode.CANARY, canary_percent=30, reason="go", actor="alice", force=True)
    for _ in range(a.breaker.failure_threshold):
        a.breaker.record_failure(RuntimeError("down"))
    for _ in range(200):  # until the breaker has been open for auto_rollback_after_s
        if a.breaker.open_for_s() >= 0.01:
            break
        await asyncio.sleep(0.005)
    await a.rollout.check_auto_rollback()
    assert a.rollout.state_for("search").mode is Mode.SHADOW
    flush()
    await a.rollout.sync()
    await a.rollout.persist_rollbacks()
    search = await a.store.audit(limit=10, route="search")
    assert [(e.kind, e.from_mode, e.to_mode, e.automatic) for e in search[:2]] == [
        ("mode_change", "enforce", "shadow", True),
        ("restore", "", "enforce", True),
    ]
    export = (await a.store.audit(limit=10, route="export"))[0]
    assert (export.from_mode, export.from_percent, export.to_mode) == ("canary", 30, "shadow")


# --------------------------------------------------------------------------- #
# three replicas over HTTP, Redis restarted empty / flushed
# --------------------------------------------------------------------------- #


@pytest.fixture
def own_redis():
    """A Redis of this test's own (it is restarted), without persistence."""
    server = EmbeddedRedis().start()
    yield server
    server.stop()


def _http_modes(cp: ControlPlaneServer) -> dict[str, tuple[str, int]]:
    routes = httpx.get(cp.url + "/v1/routes", timeout=5).json()["routes"]
    return {
        r["name"]: (r["mode"], r["canary_percent"] if r["mode"] == "canary" else 0)
        for r in routes
        if r["name"] in OPERATOR_MODES
    }


def _audit_ids(cp: ControlPlaneServer) -> list[dict]:
    r = httpx.get(cp.url + "/v1/rollout/audit?limit=200", timeout=5)
    return r.json()["entries"] if r.status_code == 200 else []


@pytest.mark.parametrize("loss", ["restart_empty", "flushall"])
def test_three_replicas_keep_the_operators_modes_when_redis_loses_its_data(own_redis, tmp_path, loss):
    rules = write_rules(tmp_path)
    ns = unique_namespace()
    cps = [
        ControlPlaneServer(redis_url=own_redis.url, rules_path=rules, namespace=ns, rollout_resync_s=0.2)
        for _ in range(3)
    ]
    for cp in cps:
        cp.start()
    try:
        for route, (mode, pct) in OPERATOR_MODES.items():
            r = httpx.put(
                cps[0].url + f"/v1/routes/{route}/mode",
                json={"mode": mode, "canary_percent": pct, "reason": "operator", "force": True},
                headers=admin_headers(),
                timeout=5,
            )
            assert r.status_code == 200, r.text
        for cp in cps:
            wait_until(
                lambda cp=cp: _http_modes(cp) == OPERATOR_MODES, 2.0, what=f"{cp.url} to see the operator's modes"
            )
        old = [e["id"] for e in _audit_ids(cps[0])]
        assert len(old) >= 3

        if loss == "restart_empty":
            own_redis.restart()
        else:
            redis_sync.Redis.from_url(own_redis.url).flushall()
        back = time.monotonic()

        def restored() -> bool:
            for cp in cps:  # every replica, at every poll, answers with the operator's modes
                assert _http_modes(cp) == OPERATOR_MODES, cp.url
            entries = _audit_ids(cps[1])
            ids = [e["id"] for e in entries]
            restores = {e["route"] for e in entries if e["kind"] == "restore"}
            return set(old) <= set(ids) and restores == set(OPERATOR_MODES)

        wait_until(restored, 2.0, interval=0.05, what="the store to be restored")
        assert time.monotonic() - back < 2.5
        # written back: what Redis itself holds again
        stored = redis_sync.Redis.from_url(own_redis.url).hgetall(f"rl:{{{ns}}}:rollout")
        assert {k.decode(): (json.loads(v)["mode"]) for k, v in stored.items()} == {
            r: m for r, (m, _) in OPERATOR_MODES.items()
        }

        # a replica started after the loss, with no memory, does not win over it
        with ControlPlaneServer(redis_url=own_redis.url, rules_path=rules, namespace=ns) as late:
            assert _http_modes(late) == OPERATOR_MODES
        for cp in cps:
            assert _http_modes(cp) == OPERATOR_MODES
        restores = [e for e in _audit_ids(cps[0]) if e["kind"] == "restore"]
        assert len(restores) == len(OPERATOR_MODES)  # one restoration, agreed by all three
    finally:
        for cp in cps:
            cp.stop()


def test_audit_log_file_outlives_redis(own_redis, tmp_path):
    path = tmp_path / "audit.jsonl"
    with ControlPlaneServer(redis_url=own_redis.url, rules_path=write_rules(tmp_path), audit_log=str(path)) as cp:
        r = httpx.put(
            cp.url + "/v1/routes/search/mode",
            json={"mode": "enforce", "reason": "go", "force": True},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=5,
        )
        assert r.status_code == 200
        own_redis.kill()
        line = json.loads(Path(path).read_text().splitlines()[0])
        assert (line["route"], line["to"], line["id"]) == ("search", "enforce", r.json()["audit"]["id"])
