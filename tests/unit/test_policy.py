"""Policy validation and derived values."""

import math

import pytest

from limiter import Algorithm, Policy
from limiter.policy import validate_cost


def test_defaults_token_bucket():
    p = Policy(average=100, period=1.0, burst=20)
    assert p.algorithm is Algorithm.TOKEN_BUCKET
    assert p.limit == 20
    assert p.rate_per_us == 100 / 1_000_000
    assert p.period_us == 1_000_000


def test_seed_000_ttl_formula():
    # TTL = max(ceil(burst / average_per_second), period_seconds) + period_seconds
    assert Policy(average=100, period=1, burst=20).ttl_s == max(math.ceil(20 / 100), 1) + 1
    assert Policy(average=1, period=1, burst=60).ttl_s == 61
    assert Policy(average=10, period=60, burst=5).ttl_s == max(math.ceil(5 / (10 / 60)), 60) + 60


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"average": "x"}, "average"),
        ({"average": float("nan")}, "average"),
        ({"average": 10, "period": 0}, "period"),
        ({"average": 10, "period": -1}, "period"),
        ({"average": 10, "burst": 0}, "burst"),
        ({"average": 10, "burst": 2.5}, "burst"),
        ({"average": 10, "algorithm": "leaky"}, "algorithm"),
        ({"average": 0.5, "algorithm": "fixed_window"}, "average"),
        ({"average": True}, "average"),
    ],
)
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        Policy(**kwargs)


def test_unlimited():
    p = Policy(average=0)
    assert p.unlimited
    assert Policy(average=-5, burst=3).limit == 3


def test_windowed_limit_is_whole_requests():
    p = Policy(average=10.7, period=60, algorithm="sliding_log")
    assert p.limit == 10
    assert p.algorithm is Algorithm.SLIDING_LOG


def test_policy_is_hashable_and_equal_by_value():
    assert Policy(average=1, burst=2) == Policy(average=1.0, burst=2)
    assert len({Policy(average=1, burst=2), Policy(average=1.0, burst=2)}) == 1


@pytest.mark.parametrize("cost", [0, -1, 1.5, "2", True, 21])
def test_cost_validation(cost):
    with pytest.raises(ValueError, match="^cost:"):
        validate_cost(Policy(average=100, burst=20), cost)


def test_cost_ok():
    assert validate_cost(Policy(average=100, burst=20), 20) == 20
    assert validate_cost(Policy(average=100, burst=20), 3.0) == 3
