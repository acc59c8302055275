"""The rate-limit headers tell clients the truth (draft-ietf-httpapi-ratelimit-headers-11):
a client pacing itself at the advertised ``q`` per ``w`` is admitted, window after window, by
every algorithm; faster is not; ``t`` never exceeds the window; the settings pick the sets.
"""

from __future__ import annotations

import re

import pytest

from control_plane.decision.headers import HeaderStyle, PolicyHeaders, policy_item, quota, rate_limit_headers
from control_plane.settings import SettingsError, load_settings
from limiter import LocalLimiter, Policy
from limiter.policy import Algorithm

US = 1_000_000
ITEM = re.compile(r'^"(?P<name>[^"]+)";q=(?P<q>\d+);w=(?P<w>\d+)(?:;sl-burst=(?P<burst>\d+))?(?P<shadow>;sl-shadow)?$')

POLICIES = [
    Policy(1000, 1, 10),  # the issue's example: sent as q=10;w=1 before, a hundred times too low
    Policy(100, 60, 100, "sliding_window"),  # sent t=120 with w=60 before
    Policy(5, 1, 5),
    Policy(50, 10, 5, "gcra"),
    Policy(20, 2.5, 40),  # a period that is not a whole number of seconds
    Policy(30, 3, algorithm="fixed_window"),
    Policy(12, 4, algorithm="sliding_log"),
    Policy(7, 2, algorithm="sliding_window"),
    Policy(1, 5, algorithm="sliding_window"),
    Policy(2, 1, algorithm="sliding_window"),
]


def advertised(policy: Policy) -> tuple[int, int, int | None]:
    m = ITEM.match(policy_item("r", policy))
    assert m, policy_item("r", policy)
    return int(m["q"]), int(m["w"]), None if m["burst"] is None else int(m["burst"])


def test_the_issue_examples() -> None:
    assert policy_item("api", Policy(1000, 1, 10)) == '"api";q=1000;w=1;sl-burst=10'
    # a sliding window counter admits a steady client one less than its limit per window
    assert policy_item("login", Policy(100, 60, 100, "sliding_window")) == '"login";q=99;w=60'
    assert quota(Policy(1, 5, algorithm="sliding_window")) == (1, 10)
    assert quota(Policy(20, 2.5, 40)) == (24, 3)  # widened to 3 s, the rate never above 8/s


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.describe())
def test_pacing_at_the_advertised_rate_is_admitted_over_several_windows(policy: Policy) -> None:
    q, w, burst = advertised(policy)
    assert q / w <= policy.average / policy.period + 1e-9  # never a higher rate than the real one
    if not Algorithm(policy.algorithm).windowed:
        assert burst == (None if policy.burst == q else policy.burst)
    limiter = LocalLimiter()
    windows = 6
    start = 1_700_000_000 * US + 123_457  # not on a window edge
    step = w * US / q
    headers = PolicyHeaders("r", policy.limit, policy, None, HeaderStyle())
    admitted = 0
    for i in range(q * windows):
        # each request in the middle of its slot: a client pacing at q per w
        d = limiter.check("k", policy, now_us=start + round((i + 0.5) * step))
        admitted += d.allowed
        t = int(re.search(r";t=(\d+)$", headers.render(d, start / US)["RateLimit"])[1])  # type: ignore[index]
        assert 0 <= t <= w
    assert admitted == q * windows, f"{admitted} of {q * windows} admitted at the advertised rate"


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.describe())
def test_twice_the_advertised_rate_is_not_admitted(policy: Policy) -> None:
    q, w, _ = advertised(policy)
    limiter = LocalLimiter()
    windows = 6
    start = 1_700_000_000 * US + 123_457
    step = w * US / (2 * q)
    admitted = sum(
        limiter.check("k", policy, now_us=start + round((i + 0.5) * step)).allowed for i in range(2 * q * windows)
    )
    # the rate admitted over the run: the advertised one (plus the burst, plus a window's worth for
    # the windowed algorithms' edges), far below twice it
    assert admitted <= q * windows * (policy.average / policy.period) / (q / w) + policy.burst + q
    assert admitted < 2 * q * windows * 0.75


def test_t_is_the_retry_after_when_rejected_and_the_next_unit_otherwise() -> None:
    policy = Policy(1, 10, 3)  # a token every 10 s, burst 3
    limiter = LocalLimiter()
    h = PolicyHeaders("slow", policy.limit, policy, None, HeaderStyle())
    now = 1_700_000_000 * US
    d = limiter.check("k", policy, now_us=now)
    assert h.render(d, now / US)["RateLimit"] == '"slow";r=2;t=10'  # the next token in 10 s, not 30
    limiter.check("k", policy, now_us=now)
    limiter.check("k", policy, now_us=now)
    denied = limiter.check("k", policy, now_us=now + 4 * US)
    out = h.render(denied, now / US + 4)
    assert denied.retry_after_us == 6_000_001  # the limiter's exact wait, rounded up to whole seconds
    assert out["RateLimit"] == '"slow";r=0;t=7' and out["Retry-After"] == "7"
    full = Policy(5, 1, 5)
    fresh = PolicyHeaders("f", full.limit, full, None, HeaderStyle())
    assert fresh.next_unit_s(LocalLimiter().check("k", full, cost=1, now_us=now)) == 1


def test_legacy_reset_is_unix_time_or_seconds() -> None:
    policy = Policy(5, 10, algorithm="fixed_window")
    now_s = 1_700_000_003.0  # 3 s into a 10 s window
    d = LocalLimiter().check("k", policy, now_us=int(now_s * US))
    unix = rate_limit_headers("w", d, policy, shadow_policy=None, now_s=now_s)
    secs = rate_limit_headers("w", d, policy, shadow_policy=None, now_s=now_s, style=HeaderStyle(reset_seconds=True))
    assert unix["X-RateLimit-Reset"] == str(1_700_000_010) and secs["X-RateLimit-Reset"] == "7"
    assert unix["RateLimit"] == '"w";r=4;t=7'


def test_styles_pick_the_sets_and_the_shadow_item() -> None:
    local, dist = Policy(20, 1, 20), Policy(30, 1, 60)
    d = LocalLimiter().check("k", local, now_us=1_700_000_000 * US)
    plain = rate_limit_headers("s", d, local, shadow_policy=dist, now_s=1_700_000_000)
    assert plain["RateLimit-Policy"] == '"s";q=20;w=1'  # no announcement by default
    announced = PolicyHeaders("s", d.limit, local, dist, HeaderStyle(announce_shadow=True)).render(d, 1.0)
    assert announced["RateLimit-Policy"] == '"s";q=20;w=1, "s-global";q=30;w=1;sl-burst=60;sl-shadow'
    assert set(PolicyHeaders("s", d.limit, local, None, HeaderStyle(legacy=False)).render(d, 1.0)) == {
        "RateLimit-Policy",
        "RateLimit",
    }
    assert PolicyHeaders("s", d.limit, local, None, HeaderStyle(False, False)).render(d, 1.0) == {}
    unlimited = Policy.unlimited_policy()
    u = LocalLimiter().check("k", unlimited, now_us=1)
    assert "RateLimit-Policy" not in rate_limit_headers("u", u, unlimited, shadow_policy=None, now_s=1.0)


def test_header_style_parse() -> None:
    assert HeaderStyle.parse("draft,legacy") == HeaderStyle()
    assert HeaderStyle.parse(" legacy , draft ") == HeaderStyle()
    assert HeaderStyle.parse("none") == HeaderStyle(False, False)
    assert HeaderStyle.parse("draft", announce_shadow=True, reset="seconds") == HeaderStyle(True, False, True, True)
    for bad in ("", "ietf", "draft,none", "legacy,x"):
        with pytest.raises(ValueError, match="draft"):
            HeaderStyle.parse(bad)


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [({"headers": "draft,ietf"}, "SHADOWLIMIT_HEADERS"), ({"reset_header": "epoch"}, "SHADOWLIMIT_RESET_HEADER")],
)
def test_bad_header_settings_name_the_setting(overrides: dict[str, str], setting: str) -> None:
    with pytest.raises(SettingsError, match=setting):
        load_settings(redis_url="redis://127.0.0.1:6379/0", **overrides)
