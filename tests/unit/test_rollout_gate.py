"""The pure rollout gate: the runbook's next step from each mode, and the minimum time in a
step (min_dwell) before a promotion, with time passed in."""

from __future__ import annotations

from dataclasses import replace

import pytest

from control_plane.model.rollout import GateConfig, GateStats, Mode, RouteState, evaluate_gate, next_step
from control_plane.rules import RulesError, parse_rules
from control_plane.settings import load_settings

#: figures that pass every other check, so only the dwell decides
CLEAN = GateStats(compared=1000, new_rejections=0, backend_errors=0, distributed_attempts=1000)
CONFIG = GateConfig(min_samples=500, min_dwell_s=600)


def st(mode: str, percent: int = 0, at: float = 0.0) -> RouteState:
    return RouteState(mode=Mode(mode), canary_percent=percent, updated_at=at)


def test_next_step_follows_the_runbook():
    steps = []
    state = st("off")
    while (step := next_step(state)) is not None:
        steps.append((step[0].value, step[1]))
        state = st(step[0].value, step[1])
    assert steps == [("shadow", 0), ("canary", 10), ("canary", 25), ("canary", 50), ("enforce", 0)]


@pytest.mark.parametrize(
    ("percent", "expected"),
    [(1, ("canary", 10)), (10, ("canary", 25)), (30, ("canary", 50)), (50, ("enforce", 0)), (75, ("enforce", 0))],
)
def test_a_canary_between_steps_goes_to_the_next_larger_one(percent, expected):
    step = next_step(st("canary", percent))
    assert step is not None and (step[0].value, step[1]) == expected


def test_dwell_not_met_refuses_and_says_how_long_is_left():
    gate = evaluate_gate(st("canary", 10, at=1000.0), Mode.ENFORCE, 0, CLEAN, CONFIG, now=1001.0)
    assert (gate.passed, gate.required) == (False, True)
    assert gate.reasons == ("in canary 10% for 1s, the minimum before the next step is 600s (min_dwell; 599s to go)",)
    d = gate.to_dict()
    assert (d["in_step_s"], d["min_dwell_s"]) == (1.0, 600)


def test_dwell_met_passes():
    gate = evaluate_gate(st("canary", 10, at=1000.0), Mode.CANARY, 25, CLEAN, CONFIG, now=1600.0)
    assert gate.passed and gate.required and gate.reasons == ()
    assert gate.to_dict()["in_step_s"] == 600.0
    # one second short is still refused
    assert not evaluate_gate(st("canary", 10, at=1000.0), Mode.CANARY, 25, CLEAN, CONFIG, now=1599.0).passed


def test_dwell_adds_to_the_other_reasons():
    few = GateStats(compared=3, new_rejections=0, backend_errors=0, distributed_attempts=3)
    gate = evaluate_gate(st("shadow", at=1000.0), Mode.CANARY, 10, few, CONFIG, now=1010.0)
    assert len(gate.reasons) == 2
    assert gate.reasons[0].startswith("only 3 compared decisions")
    assert gate.reasons[1].startswith("in shadow for 10s")


def test_a_state_never_changed_has_no_start_and_has_waited():
    gate = evaluate_gate(st("shadow"), Mode.CANARY, 10, CLEAN, CONFIG, now=5.0)
    assert gate.passed and gate.to_dict()["in_step_s"] is None


def test_zero_dwell_turns_the_check_off():
    config = GateConfig(min_samples=500, min_dwell_s=0)
    assert evaluate_gate(st("canary", 10, at=1000.0), Mode.ENFORCE, 0, CLEAN, config, now=1000.0).passed


def test_rollbacks_and_same_step_are_not_gated_by_the_dwell():
    for target, pct in ((Mode.SHADOW, 0), (Mode.OFF, 0), (Mode.CANARY, 10), (Mode.CANARY, 5)):
        gate = evaluate_gate(st("canary", 10, at=1000.0), target, pct, CLEAN, CONFIG, now=1000.0)
        assert gate.passed and not gate.required, (target, pct)


def test_a_clock_behind_the_state_counts_zero_not_negative():
    gate = evaluate_gate(st("canary", 10, at=1000.0), Mode.ENFORCE, 0, CLEAN, CONFIG, now=990.0)
    assert not gate.passed and gate.to_dict()["in_step_s"] == 0.0


def test_settings_default_and_env(monkeypatch):
    monkeypatch.delenv("SHADOWLIMIT_GATE_MIN_DWELL_S", raising=False)
    assert load_settings().gate_min_dwell_s == 600.0
    monkeypatch.setenv("SHADOWLIMIT_GATE_MIN_DWELL_S", "45")
    assert load_settings().gate_min_dwell_s == 45.0


ROUTE = """\
version: 1
routes:
  - name: search
    match: {path: /search}
    local: {average: 10, period: 1s}
    min_dwell: {dwell}
"""


def test_rules_min_dwell_per_route():
    rules = parse_rules(ROUTE.replace("{dwell}", "5m"), load_settings(), source="rules.yaml")
    rule = rules.get("search")
    assert rule is not None and rule.min_dwell_s == 300.0 and rule.to_dict()["min_dwell_s"] == 300.0
    assert parse_rules(ROUTE.replace("{dwell}", "0"), load_settings()).get("search").min_dwell_s == 0.0
    plain = ROUTE.replace("    min_dwell: {dwell}\n", "")
    assert parse_rules(plain, load_settings()).get("search").min_dwell_s is None


def test_rules_bad_min_dwell_names_file_line_and_field():
    with pytest.raises(RulesError) as exc:
        parse_rules(ROUTE.replace("{dwell}", "soon"), load_settings(), source="rules.yaml")
    assert str(exc.value).startswith("rules.yaml:6: routes[0].min_dwell:"), str(exc.value)
    with pytest.raises(RulesError, match="min_dwell"):
        parse_rules(ROUTE.replace("{dwell}", "30d"), load_settings(), source="rules.yaml")


def test_gate_counts_tighter_leaves_out_the_excused_new_rejections():
    """A route whose new rejections are nearly all the leak across replicas: refused counting
    all of them, promoted counting only the tighter ones (and the unexplained: never excused)."""
    leak = GateStats(compared=1000, new_rejections=300, backend_errors=0, distributed_attempts=1000, excused=295)
    counting_all = evaluate_gate(st("shadow"), Mode.CANARY, 10, leak, CONFIG, now=1.0)
    assert counting_all.reasons == ("new rejections 30.00% exceed 1.00%",)
    tighter = GateConfig(min_samples=500, min_dwell_s=600, counts="tighter")
    assert evaluate_gate(st("shadow"), Mode.CANARY, 10, leak, tighter, now=1.0).passed
    d = evaluate_gate(st("shadow"), Mode.CANARY, 10, leak, tighter, now=1.0).to_dict()
    assert (d["gate_counts"], d["new_rejections"], d["counted_rejections"], d["counted_rejection_rate"]) == (
        "tighter",
        300,
        5,
        0.005,
    )
    worse = GateStats(compared=1000, new_rejections=300, backend_errors=0, distributed_attempts=1000, excused=250)
    refused = evaluate_gate(st("shadow"), Mode.CANARY, 10, worse, tighter, now=1.0)
    assert refused.reasons == (
        "tighter new rejections 5.00% exceed 1.00% (gate_counts: tighter; 25.00% more left out: replicas,"
        " fresh_local, clock)",
    )
    # excused can never count below zero
    assert (
        GateStats(
            compared=10, new_rejections=1, backend_errors=0, distributed_attempts=10, excused=5
        ).counted_rejections("tighter")
        == 0
    )


def test_gate_counts_comes_from_the_settings():
    from control_plane.model.rollout import GATE_COUNTS

    assert GATE_COUNTS == ("all", "tighter")
    assert GateConfig().counts == "all"


def test_gate_weight_cost_weighs_the_new_rejections_by_what_they_cost():
    """Few new rejections that cost a lot (14 requests worth most of the tokens) refuse a gate
    weighing cost and pass one counting requests; many cheap ones do the reverse."""
    heavy = GateStats(
        compared=1000, new_rejections=5, backend_errors=0, distributed_attempts=1000,
        units_compared=1_000_000, units_new_rejections=300_000,
    )  # fmt: skip
    by_cost = GateConfig(min_samples=500, min_dwell_s=600, weight="cost")
    assert evaluate_gate(st("shadow"), Mode.CANARY, 10, heavy, CONFIG, now=1.0).passed
    refused = evaluate_gate(st("shadow"), Mode.CANARY, 10, heavy, by_cost, now=1.0)
    assert refused.reasons == (
        "new rejections worth 30.00% of the compared requests' cost exceed 1.00% (gate_weight: cost)",
    )
    d = refused.to_dict()
    assert (d["gate_weight"], d["counted_rejection_rate"], d["units_compared"], d["units_new_rejections"]) == (
        "cost", 0.3, 1_000_000, 300_000
    )  # fmt: skip
    cheap = GateStats(
        compared=1000, new_rejections=200, backend_errors=0, distributed_attempts=1000,
        units_compared=1_000_000, units_new_rejections=2_000,
    )  # fmt: skip
    assert not evaluate_gate(st("shadow"), Mode.CANARY, 10, cheap, CONFIG, now=1.0).passed
    assert evaluate_gate(st("shadow"), Mode.CANARY, 10, cheap, by_cost, now=1.0).passed
    # with gate_counts: tighter the excused share (counted in requests) comes off the cost in proportion
    both = GateConfig(min_samples=500, min_dwell_s=600, weight="cost", counts="tighter")
    leak = replace(heavy, excused=4)
    assert leak.counted_rate("tighter", "cost") == pytest.approx(0.06)
    assert evaluate_gate(st("shadow"), Mode.CANARY, 10, leak, both, now=1.0).reasons == (
        "tighter new rejections worth 6.00% of the compared requests' cost exceed 1.00% (gate_weight: cost)",
    )
    # no costs at all: nothing to weigh, no rate
    assert GateStats(compared=10, new_rejections=3, backend_errors=0, distributed_attempts=10).counted_rate(
        "all", "cost"
    ) == 0.0  # fmt: skip
