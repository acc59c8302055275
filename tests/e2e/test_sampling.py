"""When the shadow queue drops evaluations, the divergence figures are a sample: the
sampled share is shown next to them (API, CLI, dashboard) and the gate can require a
minimum share."""

from __future__ import annotations

import httpx
import pytest
from cp_server import ControlPlaneServer, admin_headers, wait_until, write_rules

from control_plane.cli import main
from control_plane.model.rollout import GateConfig, GateStats, Mode, RouteState, evaluate_gate
from control_plane.store import totals_of


def test_sampled_share_of_the_gate_figures():
    assert (
        GateStats(
            compared=90, new_rejections=0, backend_errors=0, distributed_attempts=90, shadow_dropped=10
        ).sampled_share
        == 0.9
    )
    assert GateStats(compared=0, new_rejections=0, backend_errors=0, distributed_attempts=0).sampled_share is None
    assert GateStats(compared=5, new_rejections=0, backend_errors=5, distributed_attempts=10).sampled_share == 1.0


def test_gate_requires_a_minimum_sampled_share():
    shadow = RouteState(mode=Mode.SHADOW)
    stats = GateStats(compared=1000, new_rejections=0, backend_errors=0, distributed_attempts=1000, shadow_dropped=1000)
    gate = evaluate_gate(shadow, Mode.ENFORCE, 0, stats, GateConfig(min_samples=10), now=1000.0)
    assert not gate.passed
    assert gate.reasons == (
        "only 50.0% of decisions were compared (1,000 shadow evaluations dropped, queue full); need 90%",
    )
    assert gate.to_dict()["sampled_share"] == 0.5 and gate.to_dict()["min_sampled_share"] == 0.9
    no_share = GateConfig(min_samples=10, min_sampled_share=0.0)
    assert evaluate_gate(shadow, Mode.ENFORCE, 0, stats, no_share, now=1000.0).passed


def test_totals_carry_the_sampled_share():
    rows = [
        {
            "agree": 8,
            "local_allow_distributed_deny": 0,
            "local_deny_distributed_allow": 0,
            "compared": 8,
            "backend_errors": 0,
            "distributed_attempts": 8,
            "shadow_dropped": 2,
        }
    ]
    t = totals_of(rows, 1)
    assert (t["sampled_share"], t["shadow_dropped"]) == (0.8, 2)
    assert totals_of([], 1)["sampled_share"] is None


@pytest.fixture
def dropping_cp(redis_server, tmp_path):
    """A replica whose shadow queue holds one item: a batch of shadowed decisions drops
    all but a few evaluations."""
    with ControlPlaneServer(
        redis_url=redis_server.url, rules_path=write_rules(tmp_path), shadow_queue_size=1, gate_min_samples=1
    ) as cp:
        yield cp


def _flood(cp: ControlPlaneServer, n: int = 400) -> None:
    body = {"requests": [{"route": "search", "key": f"k{i % 50}"} for i in range(n)]}
    r = httpx.post(cp.url + "/v1/decide/batch", json=body, timeout=10)
    assert r.status_code == 200


def test_dropped_shadow_evaluations_make_the_figures_a_sample_everywhere(dropping_cp, capsys):
    cp = dropping_cp
    _flood(cp)

    def search_totals() -> dict:
        routes = {r["name"]: r for r in httpx.get(cp.url + "/v1/routes", timeout=5).json()["routes"]}
        return routes["search"]["divergence_5m"] or {}

    totals = wait_until(
        lambda: (t := search_totals()).get("shadow_dropped", 0) >= 300 and t.get("compared", 0) >= 1 and t,
        5.0,
        what="the drops to be counted fleet-wide",
    )
    share = totals["sampled_share"]
    assert 0 < share < 0.25
    assert share == pytest.approx(
        totals["distributed_attempts"] / (totals["distributed_attempts"] + totals["shadow_dropped"])
    )
    div = httpx.get(cp.url + "/v1/divergence?minutes=5", timeout=5).json()["routes"]["search"]["totals"]
    assert div["sampled_share"] < 0.25 and div["shadow_dropped"] >= 300
    # the gate refuses a promotion on a sample that small ...
    r = httpx.put(
        cp.url + "/v1/routes/search/mode",
        json={"mode": "enforce", "reason": "looks clean"},
        headers=admin_headers(),
        timeout=5,
    )
    assert r.status_code == 409
    assert "of decisions were compared" in r.json()["message"] and r.json()["gate"]["sampled_share"] < 0.25
    # ... and the CLI shows the share next to the figures
    assert main(["routes", "--url", cp.url]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("search"))
    assert "dropped)" in line and "%" in line


def test_the_gate_check_can_be_turned_off(redis_server, tmp_path):
    with ControlPlaneServer(
        redis_url=redis_server.url,
        rules_path=write_rules(tmp_path),
        shadow_queue_size=1,
        gate_min_samples=1,
        gate_min_sampled_share=0.0,
    ) as cp:
        _flood(cp)
        wait_until(
            lambda: (
                (httpx.get(cp.url + "/v1/routes", timeout=5).json()["routes"][0]["divergence_5m"] or {}).get(
                    "compared", 0
                )
                >= 1
            ),
            5.0,
            what="a comparison",
        )
        r = httpx.put(
            cp.url + "/v1/routes/search/mode",
            json={"mode": "enforce", "reason": "sample is fine"},
            headers=admin_headers(),
            timeout=5,
        )
        assert r.status_code == 200, r.text
