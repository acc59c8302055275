"""Rollout plans, pure: the plan read from the rules file (errors naming the line), the order of
its steps, the analysis (pass, fail, inconclusive, refused; a Prometheus answer read), and
what the plan does next at a given ``now`` -- no IO, no clock."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from typing import Any

import pytest

from control_plane.model.plan import OnFailure, Plan, PlanAnalysis, PlanStep, PrometheusCheck, StepKind
from control_plane.model.plan_analysis import (
    Analysis,
    CheckResult,
    PromReading,
    Verdict,
    analyse,
    read_prometheus_answer,
    since_baseline,
)
from control_plane.model.plan_progress import (
    ActionKind,
    Baseline,
    OperatorRefused,
    PlanRecord,
    PlanStatus,
    next_action,
    operator_action,
    start_action,
)
from control_plane.model.recovery import StateMemory, StoreView
from control_plane.model.rollout import GateStats, Mode, RouteState
from control_plane.rules import RulesError, parse_rules
from control_plane.rules.plan import read_plan
from control_plane.settings import Settings


@pytest.fixture
def settings() -> Settings:
    return Settings(rules_path=None)


def _file(rollout: str) -> str:
    body = textwrap.indent(textwrap.dedent(rollout).strip(), " " * 6)
    return f"routes:\n  - name: search\n    match: {{path: /s}}\n    local: 5/s\n    rollout:\n{body}\n"


def test_a_plan_in_the_rules_file(settings):
    rules = parse_rules(
        _file("""
            steps: [{shadow: 10m}, {canary: 10, for: 90s}, approve, enforce]
            analysis:
              min_compared: 300
              max_new_rejection_rate: 2%
              prometheus: [{name: 5xx, query: 'x{r="{route}"}', max: 0.01}]
            on_failure: pause
        """),
        settings,
        source="r.yaml",
    )
    plan = rules.get("search").rollout
    assert plan.describe() == "shadow 10m -> canary 10% for 1m30s -> approve -> enforce"
    assert [s.kind for s in plan.steps] == [StepKind.SHADOW, StepKind.CANARY, StepKind.APPROVE, StepKind.ENFORCE]
    assert plan.analysis.min_compared == 300 and plan.analysis.max_new_rejection_rate == 0.02
    assert plan.analysis.max_backend_error_rate == settings.gate_max_backend_error_rate  # left out: the gate's
    assert plan.analysis.prometheus[0].query_for("search") == 'x{r="search"}'
    assert plan.on_failure is OnFailure.PAUSE
    assert Plan.from_dict(plan.to_dict()) == plan and Plan.from_dict(plan.to_dict()).id == plan.id
    assert rules.get("default").rollout is None


@pytest.mark.parametrize(
    ("rollout", "where", "fragment"),
    [
        ("steps: [{canary: 50}, {canary: 10}]", "r.yaml:6: routes[0].rollout.steps[1]", "goes backwards"),
        ("steps: [shadow, shadow]", "routes[0].rollout.steps[1]", "shadow after shadow goes backwards"),
        ("steps: [enforce, {canary: 10}]", "routes[0].rollout.steps[1]", "after enforce goes backwards"),
        ("steps: [shadow, {canary: 0}]", "routes[0].rollout.steps[1].canary", "must be from 1 to 99, got 0"),
        ("steps: [shadow, {canary: 100}]", "routes[0].rollout.steps[1].canary", "must be from 1 to 99, got 100"),
        ("steps: [shadow, canary]", "routes[0].rollout.steps[1]", "needs its percent"),
        ("steps: [shadow, fly]", "routes[0].rollout.steps[1]", "unknown step 'fly'"),
        ("steps: [{ramp: 5}]", "routes[0].rollout.steps[0].ramp", "unknown step 'ramp'"),
        ("steps: [shadow, approve]", "routes[0].rollout.steps[1]", "approve cannot be the last step"),
        ("steps: [approve, enforce]", "routes[0].rollout.steps[0]", "approve cannot be the first step"),
        ("steps: [{shadow: soon}]", "routes[0].rollout.steps[0].shadow", "invalid duration"),
        ("steps: [{canary: 5, for: -1}]", "routes[0].rollout.steps[0].for", "must be from 0s"),
        ("steps: [shadow]\nanalysis: {max_backend_error_rate: 150%}", "analysis.max_backend_error_rate", "0 to 1"),
        ("steps: [shadow]\nanalysis: {min_compared: 0}", "analysis.min_compared", "must be from 1"),
        ("steps: [shadow]\nanalysis: {gate_counts: some}", "analysis.gate_counts", "must be all or tighter"),
        ("steps: [shadow]\nanalysis: {prometheus: [{name: a, query: up, max: x}]}", "prometheus[0].max", "number"),
        ("steps: [shadow]\nanalysis: {prometheus: [{name: a, query: up, min: 2, max: 1}]}", "[0].min", "above max"),
        (
            "steps: [shadow]\nanalysis: {prometheus: [{name: a, query: up, max: 1}, {name: a, query: up, max: 1}]}",
            "prometheus[1].name",
            "earlier check",
        ),
        ("steps: [shadow]\nanalysis: {prometheus: [{name: a, query: up, max: 1, url: ftp://x}]}", ".url", "http"),
    ],
)
def test_bad_plans_name_the_file_line_and_field(settings, rollout, where, fragment):
    with pytest.raises(RulesError) as info:
        parse_rules(_file(rollout), settings, source="r.yaml")
    assert where in str(info.value) and fragment in str(info.value), str(info.value)
    assert str(info.value).startswith("r.yaml:")


def test_a_plans_prometheus_url_is_its_checks_unless_a_check_names_its_own(settings):
    plan = read_plan(
        {
            "steps": ["shadow", "enforce"],
            "analysis": {
                "url": "http://prom-a:9090",
                "prometheus": [
                    {"name": "a", "query": "up", "max": 1},
                    {"name": "b", "query": "up", "max": 1, "url": "http://prom-b:9090"},
                ],
            },
        },
        settings,
    )
    assert [c.url for c in plan.analysis.prometheus] == ["http://prom-a:9090", "http://prom-b:9090"]
    alone = read_plan(
        {"steps": ["shadow"], "analysis": {"prometheus": [{"name": "a", "query": "up", "max": 1}]}}, settings
    )
    assert alone.analysis.prometheus[0].url is None  # SHADOWLIMIT_PROMETHEUS_URL's
    with pytest.raises(RulesError) as info:
        read_plan({"steps": ["shadow"], "analysis": {"url": "ftp://prom"}}, settings)
    assert info.value.field == "analysis.url"


def test_the_api_reads_a_plan_with_the_same_rows(settings):
    plan = read_plan({"steps": [{"shadow": "2s"}, "enforce"], "analysis": {"min_compared": 5}}, settings)
    assert plan.describe() == "shadow 2s -> enforce" and plan.analysis.min_compared == 5
    with pytest.raises(RulesError) as info:
        read_plan({"steps": [{"canary": 50}, {"canary": 10}]}, settings)
    assert info.value.field == "steps[1]" and info.value.path is None and info.value.line is None


def test_a_plans_gate_counts_is_the_settings_unless_its_analysis_says(settings):
    plain = read_plan({"steps": ["shadow", "enforce"]}, settings)
    assert plain.analysis.gate_counts == "all" and "gate_counts" not in plain.to_dict()["analysis"]
    tighter = read_plan({"steps": ["shadow", "enforce"], "analysis": {"gate_counts": "tighter"}}, settings)
    assert tighter.analysis.gate_counts == "tighter" and Plan.from_dict(tighter.to_dict()) == tighter
    assert tighter.id != plain.id
    fleet = Settings(rules_path=None, gate_counts="tighter")
    assert read_plan({"steps": ["shadow", "enforce"]}, fleet).analysis.gate_counts == "tighter"


# -- the analysis --------------------------------------------------------------------------

_CHECK = PrometheusCheck(name="5xx", query="q", max=0.01)
PLAN = Plan(
    steps=(
        PlanStep(kind=StepKind.SHADOW, for_s=10),
        PlanStep(kind=StepKind.CANARY, percent=10, for_s=10),
        PlanStep(kind=StepKind.APPROVE),
        PlanStep(kind=StepKind.CANARY, percent=50, for_s=10),
        PlanStep(kind=StepKind.ENFORCE),
    ),
    analysis=PlanAnalysis(
        min_compared=100, max_new_rejection_rate=0.01, max_backend_error_rate=0.001, prometheus=(_CHECK,)
    ),
)


def _stats(compared: int, new: int = 0, errors: int = 0) -> GateStats:
    return GateStats(compared=compared, new_rejections=new, backend_errors=errors, distributed_attempts=compared)


def test_every_check_passes():
    a = analyse(PLAN, _stats(500, 2), {"5xx": PromReading(value=0.001)}, step=0, now=5.0)
    assert a.verdict is Verdict.PASS and a.reason == ""
    assert [(c.name, c.outcome) for c in a.checks] == [
        ("compared decisions", Verdict.PASS),
        ("new rejection rate", Verdict.PASS),
        ("backend error rate", Verdict.PASS),
        ("5xx", Verdict.PASS),
    ]
    assert a.checks[1].value == 0.004 and a.checks[1].threshold == "<= 1%"
    assert Analysis.from_dict(a.to_dict()) == a


def test_too_few_decisions_is_inconclusive_never_a_pass_and_never_a_failure():
    a = analyse(PLAN, _stats(12, 12), {"5xx": PromReading(value=0.0)}, step=0, now=5.0)
    assert a.verdict is Verdict.INCONCLUSIVE  # 100% new rejections of 12 decisions prove nothing either way
    assert a.reason == "compared decisions: only 12 since the step began (need 100)"
    assert analyse(PLAN, _stats(0), {}, step=0, now=5.0).verdict is Verdict.INCONCLUSIVE


def test_a_failure_wins_over_a_refusal_and_a_refusal_over_missing_evidence():
    refused = PromReading(outcome=Verdict.REFUSED, reason="Prometheus refused the query (bad_data): parse error")
    assert analyse(PLAN, _stats(500, 400), {"5xx": refused}, step=0, now=1).verdict is Verdict.FAIL
    assert analyse(PLAN, _stats(500), {"5xx": refused}, step=0, now=1).verdict is Verdict.REFUSED
    assert analyse(PLAN, _stats(5), {"5xx": refused}, step=0, now=1).verdict is Verdict.REFUSED
    high = analyse(PLAN, _stats(500), {"5xx": PromReading(value=0.2)}, step=0, now=1)
    assert high.verdict is Verdict.FAIL and high.reason == "5xx: 0.2 is above 0.01"
    assert analyse(PLAN, _stats(500), {}, step=0, now=1).reason == "5xx: not asked yet"


def test_with_gate_counts_tighter_the_leak_across_replicas_does_not_fail_a_step():
    """A step whose new rejections are all explained by the leak across replicas (or fresh
    buckets, a clock off: ``excused``) passes when the plan counts only those that are a
    change of policy; what is left counts against the same threshold."""
    leak = GateStats(compared=500, new_rejections=150, backend_errors=0, distributed_attempts=500, excused=148)
    plan = replace(PLAN, analysis=replace(PLAN.analysis, gate_counts="tighter"))
    readings = {"5xx": PromReading(value=0.0)}
    assert analyse(PLAN, leak, readings, step=0, now=1).verdict is Verdict.FAIL
    a = analyse(plan, leak, readings, step=0, now=1)
    assert a.verdict is Verdict.PASS
    assert (a.checks[1].name, a.checks[1].value) == ("tighter new rejection rate", 0.004)
    policy = replace(leak, excused=100)
    b = analyse(plan, policy, readings, step=0, now=1)
    assert (
        b.verdict is Verdict.FAIL and b.reason == "tighter new rejection rate: tighter new rejections 10.00% exceed 1%"
    )


def _vector(*values: str) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, v]} for v in values]}}


@pytest.mark.parametrize(
    ("status", "body", "outcome", "value"),
    [
        (200, _vector("0.5"), "pass", 0.5),
        (200, {"status": "success", "data": {"resultType": "scalar", "result": [1, "3"]}}, "pass", 3.0),
        (200, _vector(), "inconclusive", None),
        (200, _vector("NaN"), "inconclusive", None),
        (200, _vector("1", "1"), "inconclusive", None),
        (200, {"status": "success", "data": {"resultType": "string", "result": [1, "x"]}}, "inconclusive", None),
        (200, {"status": "success", "data": {"resultType": "matrix", "result": []}}, "inconclusive", None),
        (400, {"status": "error", "errorType": "bad_data", "error": "1:5: parse error"}, "refused", None),
        (422, {"status": "error", "errorType": "execution", "error": "many-to-many"}, "refused", None),
        (503, {"status": "error", "errorType": "timeout", "error": "query timed out"}, "inconclusive", None),
        (502, "<html>bad gateway</html>", "inconclusive", None),
        (None, None, "inconclusive", None),
    ],
)  # fmt: skip
def test_prometheus_answers(status, body, outcome, value):
    reading = read_prometheus_answer(status, body, error="connection refused")
    assert reading.outcome.value == outcome and reading.value == value, reading
    if outcome != "pass":
        assert reading.reason
    if outcome == "refused":
        assert body["error"] in reading.reason


def test_figures_since_the_baseline():
    first = GateStats(compared=50, new_rejections=5, backend_errors=1, distributed_attempts=51, shadow_dropped=2)
    later = GateStats(compared=100, new_rejections=1, backend_errors=0, distributed_attempts=100)
    base = GateStats(compared=30, new_rejections=5, backend_errors=0, distributed_attempts=30)
    assert since_baseline(first=first, later=later, baseline=base) == GateStats(
        compared=120, new_rejections=1, backend_errors=1, distributed_attempts=121, shadow_dropped=2
    )
    # the explained ones (the gate_counts: tighter figure) the same way
    explained = since_baseline(
        first=replace(first, excused=4), later=replace(later, excused=1), baseline=replace(base, excused=3)
    )
    assert explained.excused == 2
    assert since_baseline(first=first, later=later, baseline=None) == GateStats(
        compared=150, new_rejections=6, backend_errors=1, distributed_attempts=151, shadow_dropped=2
    )
    # the first minute's counters lost with Redis' data (below the baseline): nothing of that
    # minute counts, never a negative figure taken from the later minutes
    lost = GateStats(compared=4, new_rejections=0, backend_errors=3, distributed_attempts=4)
    assert since_baseline(first=lost, later=later, baseline=base) == GateStats(
        compared=100, new_rejections=1, backend_errors=3, distributed_attempts=100
    )


# -- what the plan does next ---------------------------------------------------------------

PASS = Verdict.PASS


def _record(step: int, since: float = 0.0, status: PlanStatus = PlanStatus.RUNNING) -> PlanRecord:
    return PlanRecord(plan_id=PLAN.id, source="rules", status=status, step=step, step_since=since, version=3)


def _state(mode: Mode, percent: int = 0, by: str = "plan") -> RouteState:
    return RouteState(mode=mode, canary_percent=percent, updated_by=by, version=7)


def _analysis(verdict: Verdict, step: int, at: float, reason: str = "") -> Analysis:
    checks = (CheckResult(name="c", value=None, threshold="", outcome=verdict, reason=reason),)
    return Analysis(at=at, step=step, verdict=verdict, checks=checks)


def test_a_step_waits_for_its_time_then_the_next_is_applied():
    record = _record(0, since=100.0)
    shadow = _state(Mode.SHADOW)
    early = next_action(PLAN, record, _analysis(PASS, 0, 105.0), route=shadow, now=105.0)
    assert early.kind is ActionKind.WAIT and not early.changes
    go = next_action(PLAN, record, _analysis(PASS, 0, 110.0), route=shadow, now=110.0)
    assert (go.kind, go.step, go.mode, go.percent, go.status) == (
        ActionKind.ADVANCE, 1, Mode.CANARY, 10, PlanStatus.RUNNING,
    )  # fmt: skip
    assert go.reason == "shadow passed"


def test_no_analysis_of_this_step_yet_means_wait():
    record = _record(1, since=100.0)
    old = _analysis(PASS, 0, 99.0)  # the previous step's
    assert next_action(PLAN, record, old, route=_state(Mode.CANARY, 10), now=200).kind is ActionKind.WAIT
    assert next_action(PLAN, record, None, route=_state(Mode.CANARY, 10), now=200).kind is ActionKind.WAIT


def test_inconclusive_never_advances_however_long_it_lasts():
    record = _record(0, since=0.0)
    action = next_action(PLAN, record, _analysis(Verdict.INCONCLUSIVE, 0, 1e6), route=_state(Mode.SHADOW), now=1e6)
    assert action.kind is ActionKind.WAIT


def test_an_approval_step_waits_for_an_operator_while_the_analysis_runs():
    at_canary = _record(1, since=0.0)
    wait = next_action(PLAN, at_canary, _analysis(PASS, 1, 50), route=_state(Mode.CANARY, 10), now=50)
    assert (wait.kind, wait.step, wait.status, wait.mode) == (
        ActionKind.AWAIT_APPROVAL, 2, PlanStatus.WAITING_FOR_APPROVAL, None,
    )  # fmt: skip
    waiting = _record(2, since=50.0, status=PlanStatus.WAITING_FOR_APPROVAL)
    assert next_action(PLAN, waiting, _analysis(PASS, 2, 9e9), route=_state(Mode.CANARY, 10), now=9e9).kind is (
        ActionKind.WAIT
    )
    # the analysis keeps running: a failure while waiting rolls back past the held step
    failed = next_action(PLAN, waiting, _analysis(Verdict.FAIL, 2, 60, "x"), route=_state(Mode.CANARY, 10), now=60)
    assert (failed.kind, failed.step, failed.mode, failed.status) == (
        ActionKind.ROLLBACK, 0, Mode.SHADOW, PlanStatus.PAUSED,
    )  # fmt: skip
    approve = operator_action(PLAN, waiting, ActionKind.APPROVE, route=_state(Mode.CANARY, 10))
    assert (approve.step, approve.mode, approve.percent, approve.status) == (3, Mode.CANARY, 50, PlanStatus.RUNNING)
    with pytest.raises(OperatorRefused):
        operator_action(PLAN, at_canary, ActionKind.APPROVE, route=_state(Mode.CANARY, 10))


def test_a_failure_rolls_back_to_the_last_step_that_passed_or_pauses():
    record = _record(3, since=0.0)  # canary 50%, after the approval
    failed = next_action(PLAN, record, _analysis(Verdict.FAIL, 3, 5, "x"), route=_state(Mode.CANARY, 50), now=5)
    assert (failed.kind, failed.step, failed.mode, failed.percent) == (ActionKind.ROLLBACK, 1, Mode.CANARY, 10)
    assert failed.status is PlanStatus.PAUSED and "rolled back to canary 10%" in failed.reason
    pausing = Plan(steps=PLAN.steps, analysis=PLAN.analysis, on_failure=OnFailure.PAUSE)
    paused = next_action(pausing, record, _analysis(Verdict.FAIL, 3, 5, "x"), route=_state(Mode.CANARY, 50), now=5)
    assert (paused.kind, paused.step, paused.mode, paused.status) == (
        ActionKind.PAUSE, 3, None, PlanStatus.PAUSED,
    )  # fmt: skip
    # failing in the first step: nothing passed before it; shadow at worst (already there: paused)
    first = next_action(PLAN, _record(0), _analysis(Verdict.FAIL, 0, 5, "x"), route=_state(Mode.SHADOW), now=5)
    assert (first.kind, first.mode, first.status) == (ActionKind.PAUSE, None, PlanStatus.PAUSED)
    canary_first = Plan(steps=PLAN.steps[1:2] + PLAN.steps[4:], analysis=PLAN.analysis)
    worst = next_action(
        canary_first, _record(0), _analysis(Verdict.FAIL, 0, 5, "x"), route=_state(Mode.CANARY, 10), now=5
    )
    assert (worst.kind, worst.mode) == (ActionKind.ROLLBACK, Mode.SHADOW)


def test_a_refused_query_pauses_with_its_error():
    refused = _analysis(Verdict.REFUSED, 0, 5, "Prometheus refused the query (bad_data): parse error")
    action = next_action(PLAN, _record(0), refused, route=_state(Mode.SHADOW), now=5)
    assert action.kind is ActionKind.PAUSE and action.mode is None and "parse error" in action.reason


def test_a_route_moved_outside_the_plan_pauses_it():
    action = next_action(PLAN, _record(1), _analysis(PASS, 1, 5), route=_state(Mode.SHADOW, by="alice"), now=5)
    assert (
        action.kind is ActionKind.PAUSE and action.reason == "the route was moved to shadow by alice, outside the plan"
    )


def test_the_last_step_completes_the_plan():
    enforce = _record(3, since=0.0)
    done = next_action(PLAN, enforce, _analysis(PASS, 3, 20), route=_state(Mode.CANARY, 50), now=20)
    assert (done.kind, done.step, done.mode, done.status) == (ActionKind.ADVANCE, 4, Mode.ENFORCE, PlanStatus.COMPLETED)
    held = Plan(steps=(PLAN.steps[0], PlanStep(kind=StepKind.ENFORCE, for_s=30)), analysis=PLAN.analysis)
    held_go = next_action(held, _record(0), _analysis(PASS, 0, 10), route=_state(Mode.SHADOW), now=10)
    assert held_go.status is PlanStatus.RUNNING  # enforce: 30s is judged before the plan completes
    complete = next_action(held, _record(1, since=10), _analysis(PASS, 1, 40), route=_state(Mode.ENFORCE), now=40)
    assert (complete.kind, complete.status, complete.mode) == (ActionKind.COMPLETE, PlanStatus.COMPLETED, None)


def test_a_started_plan_holds_its_first_step_for_its_time():
    fresh = PlanRecord(plan_id=PLAN.id, source="rules", status=PlanStatus.RUNNING)
    shadow = _state(Mode.SHADOW)
    started = fresh.moved(start_action(PLAN, shadow), now=1000.0, by="plan")
    assert (started.step, started.step_since, started.history[-1].event) == (0, 1000.0, "started")
    early = next_action(PLAN, started, _analysis(PASS, 0, 1005.0), route=shadow, now=1005.0)
    assert early.kind is ActionKind.WAIT  # 5 s of its 10
    assert next_action(PLAN, started, _analysis(PASS, 0, 1010.0), route=shadow, now=1010.0).kind is ActionKind.ADVANCE


def test_where_a_plan_starts():
    assert start_action(PLAN, _state(Mode.OFF)).mode is Mode.SHADOW  # its first step, applied
    at_canary = start_action(PLAN, _state(Mode.CANARY, 10))
    assert (at_canary.step, at_canary.mode) == (1, None)  # already in a step of it: no change
    enforced = start_action(PLAN, _state(Mode.ENFORCE))
    assert (enforced.step, enforced.status, enforced.mode) == (4, PlanStatus.COMPLETED, None)


def test_operators_pause_resume_and_abort():
    running = _record(1, since=0.0)
    pause = operator_action(PLAN, running, ActionKind.PAUSE, route=_state(Mode.CANARY, 10))
    assert (pause.status, pause.mode) == (PlanStatus.PAUSED, None)
    paused = running.moved(pause, now=10.0, by="alice")
    assert paused.step_since == 10.0 and paused.history[-1].event == "paused"
    with pytest.raises(OperatorRefused):
        operator_action(PLAN, paused, ActionKind.PAUSE, route=_state(Mode.CANARY, 10))
    resume = operator_action(PLAN, paused, ActionKind.RESUME, route=_state(Mode.SHADOW, by="bob"))
    assert (resume.status, resume.step, resume.mode, resume.percent) == (PlanStatus.RUNNING, 1, Mode.CANARY, 10)
    assert operator_action(PLAN, paused, ActionKind.RESUME, route=_state(Mode.CANARY, 10)).mode is None
    abort = operator_action(PLAN, running, ActionKind.ABORT, route=_state(Mode.CANARY, 10))
    assert (abort.status, abort.step, abort.mode) == (PlanStatus.ABORTED, 0, Mode.SHADOW)
    aborted = running.moved(abort, now=11.0, by="alice")
    assert operator_action(PLAN, aborted, ActionKind.RESUME, route=_state(Mode.SHADOW)).status is PlanStatus.RUNNING
    with pytest.raises(OperatorRefused):
        operator_action(PLAN, aborted, ActionKind.ABORT, route=_state(Mode.SHADOW))


def test_records_keep_their_fields_and_a_bounded_history():
    record = _record(1, since=5.0)
    for i in range(100):
        record = record.moved(
            operator_action(PLAN, record, ActionKind.PAUSE, route=_state(Mode.CANARY, 10)), now=i, by="a"
        )
        record = record.moved(
            operator_action(PLAN, record, ActionKind.RESUME, route=_state(Mode.CANARY, 10)), now=i, by="a"
        )
    assert len(record.history) == 40
    assert PlanRecord.from_dict(record.to_dict()) == record
    with pytest.raises(ValueError):
        PlanRecord.from_dict({"plan_id": "x"})


def test_a_record_the_store_lost_forgets_its_steps_baseline():
    """Redis lost the plan's record and the fleet's counters with it: the step counts from
    nothing, so the counts taken when it began are dropped before the record is written back."""
    memory = StateMemory()
    base = Baseline(minute=100, counts=_stats(400))
    memory.note_plan("search", replace(_record(1, since=5.0), baseline=base, version=7))
    memory.note_plan("other", replace(_record(1, since=5.0), baseline=base, version=3))
    kept = StoreView(states={}, epoch=None, plans={"other": memory.plans["other"]})
    loss = memory.check(kept, audit_maxlen=1000)
    assert loss.plans == ("search",)
    memory.forget_baselines(loss.plans)
    assert memory.plans["search"].baseline is None and memory.plans["search"].version == 7
    assert memory.plans["other"].baseline == base


def test_with_gate_weight_cost_a_step_is_judged_by_what_its_new_rejections_cost():
    """Five new rejections in 500 (1%, at the threshold) that cost 30% of the tokens fail a step
    weighing cost; the same step passes weighing requests."""
    heavy = GateStats(
        compared=500, new_rejections=5, backend_errors=0, distributed_attempts=500,
        units_compared=100_000, units_new_rejections=30_000,
    )  # fmt: skip
    readings = {"5xx": PromReading(value=0.0)}
    assert analyse(PLAN, heavy, readings, step=0, now=1).verdict is Verdict.PASS
    plan = replace(PLAN, analysis=replace(PLAN.analysis, gate_weight="cost"))
    a = analyse(plan, heavy, readings, step=0, now=1)
    assert a.verdict is Verdict.FAIL and (a.checks[1].name, a.checks[1].value) == ("new rejection cost share", 0.3)
    assert a.reason == "new rejection cost share: new rejections worth 30.00% exceed 1%"
    assert plan.analysis.to_dict()["gate_weight"] == "cost" and "gate_weight" not in PLAN.analysis.to_dict()
    assert type(plan.analysis).from_dict(plan.analysis.to_dict()) == plan.analysis


def test_a_baseline_keeps_the_costs_and_the_excused_of_its_minute():
    base = Baseline(
        minute=60,
        counts=GateStats(
            compared=30, new_rejections=5, backend_errors=0, distributed_attempts=30, excused=2,
            units_compared=3_000, units_new_rejections=700,
        ),
    )  # fmt: skip
    assert Baseline.from_dict(base.to_dict()) == base
    first = replace(
        base.counts, compared=50, new_rejections=6, excused=3, units_compared=5_000, units_new_rejections=800
    )
    got = since_baseline(first=first, later=replace(first, excused=0), baseline=base.counts)
    assert (got.excused, got.units_compared, got.units_new_rejections) == (1, 7_000, 900)
