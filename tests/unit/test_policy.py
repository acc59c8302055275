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


# -- limits written as text (Policy.parse, limiter.rates) -------------------------------------


@pytest.mark.parametrize(
    ("text", "average", "period"),
    [
        ("100/minute", 100, 60),
        ("10/second", 10, 1),
        ("1000 per hour", 1000, 3600),
        ("1000 PER HOUR", 1000, 3600),
        ("100/5 minutes", 100, 300),
        ("10/2 minutes", 10, 120),
        ("3 per 2 days", 3, 172_800),
        ("5/1s", 5, 1),
        ("5/s", 5, 1),
        ("50/500ms", 50, 0.5),
        ("1000/1m", 1000, 60),
        ("7/3h", 7, 10_800),
        ("1/d", 1, 86_400),
        ("2 per 1.5 sec", 2, 1.5),
        ("0.5/second", 0.5, 1),
        ("  20 /  10 mins ", 20, 600),
        ("10per minute", 10, 60),
    ],
)
def test_parse_limit_text(text, average, period):
    p = Policy.parse(text)
    assert (p.average, p.period) == (average, period)
    assert p.algorithm is Algorithm.TOKEN_BUCKET
    assert p.burst == math.ceil(average)  # a full window's worth, as Policy(average, period) gives
    assert p == Policy(average=average, period=period)


def test_parse_limit_with_burst_and_algorithm():
    p = Policy.parse("100/minute", burst=20, algorithm="gcra")
    assert p == Policy(average=100, period=60, burst=20, algorithm=Algorithm.GCRA)
    assert Policy.parse("5/minute", algorithm="sliding_window").limit == 5
    assert Policy.parse("0/second").unlimited  # as average=0


@pytest.mark.parametrize(
    "text",
    ["100/fortnight", "100", "/minute", "100/", "minute", "1,000/minute", "1e3/minute", "-5/minute", "5/1m30s", "5 / "],
)
def test_parse_limit_rejects_and_names_the_text(text):
    with pytest.raises(ValueError) as info:
        Policy.parse(text)
    msg = str(info.value)
    assert msg.startswith("limit: expected N/period") and repr(text) in msg
    assert '"100/minute"' in msg  # shows the grammar


@pytest.mark.parametrize("text", ["10/month", "10 per 2 years", "1/Year"])
def test_parse_limit_refuses_months_and_years(text):
    with pytest.raises(ValueError, match=r"^limit: months and years have no fixed length.*days"):
        Policy.parse(text)


@pytest.mark.parametrize(
    ("text", "kwargs", "start"),
    [
        ("10/0 seconds", {}, "limit: the period must be longer than 0"),
        ("1/0.0001s", {}, "limit: must be between"),  # the policy's own bound, named as the limit
        ("0.5/second", {"algorithm": "fixed_window"}, "limit: fixed_window counts whole requests"),
        ("2000000/second", {"algorithm": "gcra"}, "limit: gcra needs at least"),
        ("2000000000000/second", {}, "limit: must be at most"),
        ("1/minute", {"burst": 0}, "burst: must be between 1 and"),
        ("1/minute", {"algorithm": "leaky"}, "algorithm: must be one of"),
    ],
)
def test_parse_limit_errors_name_the_field(text, kwargs, start):
    with pytest.raises(ValueError) as info:
        Policy.parse(text, **kwargs)
    assert str(info.value).startswith(start)
    if start.startswith("limit: ") and "longer than 0" not in start:
        assert str(info.value).endswith(f"(from {text!r})")


def test_parse_limit_rejects_non_text():
    for value in (100, None, b"100/minute", 1.5):
        with pytest.raises(ValueError, match="^limit: must be a text like"):
            Policy.parse(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "10/minute",
        "10 per minute",
        "10/2 minutes",
        "100/5 minutes",
        "1000 per hour",
        "10/second",
        "3 per 2 days",
        "7 PER 4 HOURS",
        "1/day",
        "25/seconds",
    ],
)
def test_parse_limit_agrees_with_the_limits_library(text):
    """The `limits` package's grammar (its own parser, installed for the benchmarks): same
    quantity, same window."""
    import limits

    item = limits.parse(text)
    p = Policy.parse(text)
    assert (p.average, p.period) == (item.amount, item.get_expiry())


def test_limit_pattern_is_the_parser():
    """LIMIT_PATTERN (what the rules file's JSON Schema checks texts with) accepts exactly
    what parse_rate accepts."""
    import re

    from limiter.rates import LIMIT_PATTERN, parse_rate

    texts = ["100/minute", "5/1s", "1000 per hour", "100/5 minutes", "10/month", "abc", "5/1m30s", "1 per 0 s"]
    for text in texts:
        try:
            parse_rate(text)
            parsed = True
        except ValueError as exc:
            parsed = "longer than 0" in str(exc)  # the one check after the pattern
        assert (re.search(LIMIT_PATTERN, text) is not None) == parsed, text


# -- a blocking policy (envoyproxy/ratelimit's requests_per_unit: 0) ---------------------------


def test_blocking_policy_fields():
    p = Policy.blocking(60)
    assert p.blocked is True and p.unlimited is False
    assert p.limit == 0 and p.algorithm is Algorithm.FIXED_WINDOW
    assert p.period == 60.0 and p.period_us == 60_000_000
    assert p.rate_per_us == 0.0 and p.emission_us == 0.0
    assert p.ttl_s > 0 and p.ttl_us == p.ttl_s * 1_000_000
    assert Policy.blocking().period == 1.0
    for other in (Policy(average=10), Policy.unlimited_policy(), Policy(average=5, algorithm="fixed_window")):
        assert other.blocked is False


def test_blocking_policy_equality_and_hash():
    p = Policy.blocking(60)
    assert p == Policy.blocking(60.0) and hash(p) == hash(Policy.blocking(60.0))
    assert p != Policy.blocking(1)
    # never the unlimited policy it shares average 0 with, nor a limit of 1
    same_fields = Policy(average=0, period=60, burst=1, algorithm="fixed_window")
    assert same_fields.unlimited and p != same_fields and same_fields != p
    assert p != Policy(average=1, period=60, burst=1, algorithm="fixed_window")
    assert p != Policy.unlimited_policy()
    assert len({p, Policy.blocking(60), same_fields, Policy(average=1, period=60, algorithm="fixed_window")}) == 3
    assert {p: "x"}[Policy.blocking(60)] == "x"
    assert repr(p).endswith("blocked=True)") and "blocked" not in repr(same_fields)


def test_blocking_policy_describe_and_to_dict():
    p = Policy.blocking(60)
    assert p.describe() == "blocks every request (60s windows, fixed_window)"
    assert p.to_dict() == {"algorithm": "fixed_window", "average": 0.0, "period": 60.0, "burst": 1, "blocked": True}
    # every other policy's dict is as it always was
    assert Policy(average=100, burst=20).to_dict() == {
        "algorithm": "token_bucket",
        "average": 100.0,
        "period": 1.0,
        "burst": 20,
    }
    assert Policy(average=0, period=60, burst=1, algorithm="fixed_window").to_dict() == {
        "algorithm": "fixed_window",
        "average": 0.0,
        "period": 60.0,
        "burst": 1,
    }
    assert Policy.unlimited_policy().describe() == "unlimited (token_bucket)"


@pytest.mark.parametrize("period", [0, -1, 0.0001, float("nan"), "x", 10**9])
def test_blocking_policy_validates_its_period(period):
    with pytest.raises(ValueError, match="^period:"):
        Policy.blocking(period)


def test_validate_cost_for_a_blocking_policy():
    p = Policy.blocking(1)
    assert validate_cost(p, 1) == 1
    assert validate_cost(p, 10**6) == 10**6
    assert validate_cost(p, 2.0) == 2
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="^cost:"):
            validate_cost(p, bad)
    # the messages callers rely on are unchanged
    with pytest.raises(ValueError, match=r"^cost: must be >= 1, got 0$"):
        validate_cost(Policy(average=100, burst=20), 0)
    with pytest.raises(ValueError, match=r"^cost: 21 exceeds the policy's limit of 20, so it could never be allowed$"):
        validate_cost(Policy(average=100, burst=20), 21)
