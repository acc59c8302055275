"""The fleet drives each plan once:

- two ``shadowlimit serve`` processes; the one driving the plans is killed (SIGKILL: no
  shutdown, its lease not given up) mid-plan; the survivor takes the lease over once it
  expires (``SHADOWLIMIT_PLAN_LEASE_S``; the time it took is printed, not asserted) and
  finishes the plan, no step applied twice nor skipped;
- a driver that lost its lease writes nothing (fencing), and two writers of one record: one wins;
- Redis restarted empty: the plan (set through the API, so kept nowhere else) and its step
  are written back with the rollout state, and the plan goes on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_sync
from cp_server import ControlPlaneServer, admin_headers, run_in_loop, unique_namespace, write_rules
from plan_fleet import ServeProcess, Traffic
from support import eventually

from control_plane.model.plan_progress import ActionKind, PlanStatus, operator_action
from control_plane.store import LeaseLost, PlanConflict
from limiter.embedded import EmbeddedRedis

pytestmark = pytest.mark.timeout(180)

CLEAN = [f"c{i}" for i in range(60)]
RULES = """\
routes:
  - name: search
    match: {path: /search/**}
    key: {strategy: header, header: X-Client-Id}
    local: 100/second
    distributed: 100/second
    rollout:
      steps: [{shadow: 1s}, {canary: 20, for: 3s}, {canary: 60, for: 3s}, enforce]
      analysis: {min_compared: 20}
"""


def _plan(url: str) -> dict[str, Any]:
    return httpx.get(url + "/v1/routes/search/plan", timeout=5).json()  # type: ignore[no-any-return]


def _plan_steps(url: str) -> list[tuple[str, str, int, int]]:
    entries = httpx.get(url + "/v1/rollout/audit?route=search&limit=200", timeout=5).json()["entries"]
    return [
        (e["from"], e["to"], e["from_percent"], e["to_percent"])
        for e in reversed(entries)
        if e["kind"] == "mode_change" and e["actor"] == "plan"
    ]


def test_the_driver_killed_mid_plan_the_survivor_finishes_it(redis_url, tmp_path):
    rules = write_rules(tmp_path, RULES)
    ns = unique_namespace("kill")
    env = {
        "SHADOWLIMIT_PLAN_INTERVAL_S": "0.25",
        "SHADOWLIMIT_PLAN_LEASE_S": "2",
        "SHADOWLIMIT_ROLLOUT_RESYNC_S": "0.2",
    }
    procs = {
        name: ServeProcess(redis_url=redis_url, rules=rules, namespace=ns, instance_id=name, **env)
        for name in ("p1", "p2")
    }
    try:
        for p in procs.values():
            p.start()
        urls = [p.url for p in procs.values()]
        with Traffic(urls, "search", CLEAN):
            at_canary = eventually(
                lambda: (p := _plan(urls[0]))["current"] == "canary 20%" and p, 60, 0.05, "the plan at canary 20%"
            )
            driver = at_canary["driver"].split("#")[0]
            victim, survivor = procs[driver], next(p for n, p in procs.items() if n != driver)
            victim.kill()
            killed = time.monotonic()
            took = eventually(
                lambda: (d := _plan(survivor.url)["driver"]) and d.startswith(survivor.instance_id + "#") and d,
                10, 0.05, "the survivor to take the lease over",
            )  # fmt: skip
            takeover_s = time.monotonic() - killed
            done = eventually(lambda: _plan(survivor.url)["state"] == "completed", 60, 0.1, "the survivor to finish")
        assert done and took
        # every step once, in order: none applied twice, none skipped
        assert _plan_steps(survivor.url) == [
            ("shadow", "canary", 0, 20), ("canary", "canary", 20, 60), ("canary", "enforce", 60, 0),
        ]  # fmt: skip
        print(f"takeover after the driver was killed: {takeover_s:.2f}s")  # noqa: T201 - a measured figure
    finally:
        for p in procs.values():
            p.stop()


def test_a_driver_that_lost_its_lease_writes_nothing_and_one_writer_of_a_record_wins(redis_url, tmp_path):
    rules = write_rules(tmp_path, RULES.replace("{shadow: 1s}", "{shadow: 600s}"))
    ns = unique_namespace("fence")
    fast = {"plan_interval_s": 0.25, "plan_lease_s": 1.0, "rollout_resync_s": 0.2}
    with (
        ControlPlaneServer(redis_url=redis_url, rules_path=rules, namespace=ns, instance_id="f1", **fast) as a,
        ControlPlaneServer(redis_url=redis_url, rules_path=rules, namespace=ns, instance_id="f2", **fast) as b,
    ):
        eventually(lambda: _plan(a.url)["version"] >= 1, 10, 0.05, "the plan started")
        holder = _plan(a.url)["driver"]
        driver, other = (a, b) if holder.startswith("f1#") else (b, a)
        plans = driver.engine.plans
        eff = plans.effective("search")
        assert eff is not None
        plan = eff[0]
        record = plans.record("search")
        action = operator_action(plan, record, ActionKind.PAUSE, route=plans.route_state("search"))
        stale = "f9#1"  # a lease this fleet handed out long ago: fenced off

        async def write_with(lease: str | None) -> Any:
            return await plans.apply(
                "search", plan, record, action, prior=record, actor="plan", reason="fenced?", lease=lease
            )

        with pytest.raises(LeaseLost):
            run_in_loop(driver.loop, lambda: write_with(stale))
        assert plans.record("search").status is PlanStatus.RUNNING
        # two writers from the same version: the first wins, the second finds the record moved
        run_in_loop(driver.loop, lambda: write_with(None))
        with pytest.raises(PlanConflict):
            run_in_loop(driver.loop, lambda: write_with(None))
        eventually(lambda: _plan(other.url)["state"] == "paused", 5, 0.05, "the other replica to see it")


def test_redis_restarted_empty_keeps_the_plan_and_its_step(tmp_path):
    server = EmbeddedRedis().start()
    try:
        _restarted_empty(server, tmp_path)
    finally:
        server.stop()


def _restarted_empty(server: EmbeddedRedis, tmp_path: Path) -> None:
    rules = write_rules(tmp_path, RULES.split("    rollout:")[0])  # no plan in the file: the API's only
    ns = unique_namespace("lost")
    fast = {"plan_interval_s": 0.25, "plan_lease_s": 1.5, "rollout_resync_s": 0.2}
    cps = [
        ControlPlaneServer(redis_url=server.url, rules_path=rules, namespace=ns, instance_id=f"l{i}", **fast)
        for i in (1, 2)
    ]
    for cp in cps:
        cp.start()
    try:
        a, b = cps
        body = {
            "steps": [{"shadow": "0.5s"}, {"canary": 30, "for": "3s"}, "enforce"],
            # the decisions in flight while Redis restarts fail: backend errors, counted once Redis
            # is back, which any threshold of a few decisions might judge a failure (and roll
            # back); this plan is about surviving the loss, so it never fails on them
            "analysis": {"min_compared": 20, "max_backend_error_rate": "100%"},
            "reason": "walk it",
        }
        r = httpx.put(a.url + "/v1/routes/search/plan", json=body, headers=admin_headers(), timeout=5)
        assert r.status_code == 200, r.text
        with Traffic([a.url, b.url], "search", CLEAN):
            before = eventually(lambda: (p := _plan(b.url))["current"] == "canary 30%" and p, 60, 0.05, "canary 30%")
            server.restart()  # no persistence: Redis comes back empty
            key = f"rl:{{{ns}}}:plans"

            def restored() -> dict[str, Any] | None:
                raw = redis_sync.Redis.from_url(server.url).hget(key, "search")
                return json.loads(raw) if raw else None

            back = eventually(restored, 10, 0.05, "the plan's record written back")
            assert back["source"] == "api" and back["plan"]["steps"][1] == {
                "step": "canary",
                "percent": 30,
                "for_s": 3.0,
            }
            assert back["step"] >= 1 and back["version"] >= before["version"]
            for cp in cps:
                assert _plan(cp.url)["current"] in ("canary 30%", "enforce")
            seen: dict[str, Any] = {}

            def finished() -> bool:
                seen.update(_plan(a.url))
                return seen["state"] == "completed"

            try:
                eventually(finished, 60, 0.1, "the plan to go on and finish")
            except AssertionError as exc:  # say where the plan stopped and why
                keep = ("state", "current", "reason", "waits_for", "checks", "recent", "driver")
                raise AssertionError(f"{exc}; the plan: { ({k: seen.get(k) for k in keep}) }") from None
        steps = _plan_steps(a.url)
        assert steps[-1] == ("canary", "enforce", 30, 0) and steps.count(("canary", "enforce", 30, 0)) == 1
        restores = httpx.get(a.url + "/v1/rollout/audit?limit=200", timeout=5).json()["entries"]
        assert any(e["kind"] == "restore" for e in restores)
    finally:
        for cp in cps:
            cp.stop()
