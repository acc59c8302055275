"""The over-limit cache's bounds and answers, the peer's split of a request's hits into
over / near / within, and where deadline answers are shown (CLI row, dashboard panel)."""

from __future__ import annotations

import pytest

from control_plane.cli.routes import late_cell
from control_plane.decision.overlimit import OverLimitCache
from control_plane.envoy.stats import split_hits
from dashboard.backend_views import BackendView
from dashboard.widgets import BackendPanel
from limiter import Policy
from limiter.policy import make_decision

P = Policy(average=2, period=60, burst=2, algorithm="fixed_window")


def refusal(retry_us: int, reset_us: int | None = None) -> object:
    return make_decision(False, 0, 2, retry_us, retry_us if reset_us is None else reset_us)


def test_a_refusal_is_answered_until_its_retry_then_forgotten() -> None:
    c = OverLimitCache(10)
    c.put("r:k", P, refusal(5_000_000), now_us=1_000_000)
    d = c.get("r:k", P, 3_000_000)
    assert d is not None and not d.allowed and d.retry_after_us == 3_000_000 and d.remaining == 0
    assert c.get("r:k", P, 6_000_000) is None and len(c) == 0  # expired: dropped when met
    assert c.hits == 1 and c.stored == 1


def test_another_policy_or_an_allowed_answer_is_not_cached() -> None:
    c = OverLimitCache(10)
    c.put("r:k", P, refusal(5_000_000), now_us=0)
    assert c.get("r:k", Policy(average=3, period=60, burst=3, algorithm="fixed_window"), 1) is None  # adjusted
    c.put("r:a", P, make_decision(True, 1, 2, 0, 10), now_us=0)
    c.put("r:z", P, refusal(0), now_us=0)  # nothing to wait for
    assert len(c) == 0


def test_bounded_least_recently_used_first_and_forgotten_on_reset() -> None:
    c = OverLimitCache(3)
    for k in "abcd":
        c.put(k, P, refusal(60_000_000), now_us=0)
    assert len(c) == 3 and c.get("a", P, 1) is None  # the oldest went first
    assert c.get("b", P, 1) is not None  # b is now the most recent
    c.put("e", P, refusal(60_000_000), now_us=0)
    assert c.get("c", P, 1) is None and c.get("b", P, 1) is not None
    c.forget("b")
    assert c.get("b", P, 1) is None
    assert c.forget_prefix("") == 2 and len(c) == 0
    with pytest.raises(ValueError, match="max_keys"):
        OverLimitCache(0)


@pytest.mark.parametrize(
    ("over", "limit", "before", "cost", "expected"),
    [
        (False, 10, 0, 1, (0, 0, 1)),  # far from the limit
        (False, 10, 8, 1, (0, 1, 1)),  # 9 > 8 (0.8 x 10): near
        (False, 10, 6, 4, (0, 2, 4)),  # 7..10: two above 8
        (True, 10, 10, 3, (3, 0, 0)),  # already at the limit: all over
        (True, 10, 7, 5, (2, 2, 0)),  # crosses it: 2 over, 9..10 near
        (True, 0, 0, 1, (1, 0, 0)),  # requests_per_unit 0
        (False, 5, 0, 0, (0, 0, 0)),  # a look spends nothing
    ],
)
def test_the_peers_split_of_a_requests_hits(over, limit, before, cost, expected) -> None:
    assert split_hits(over, limit, before, cost, 0.8) == expected


def test_deadline_answers_are_shown_in_the_cli_and_the_dashboard() -> None:
    assert late_cell({"deadline_answers": {"redis_timeout": 3, "no_time": 1}}) == "3/1"
    assert late_cell({"deadline_answers": {"redis_timeout": 0, "no_time": 0}}) == "-"
    view = BackendView.parse(
        {"deadline_answers": {"redis_timeout": 7, "no_time": 2}, "over_limit_cache": {"hits": 40, "keys": 3}}
    )
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(BackendPanel.render_backend(view, ()))
    out = console.export_text()
    assert "7 Redis too slow · 2 too little time" in out and "40 answered without Redis · 3 keys cached" in out
