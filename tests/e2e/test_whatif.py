"""What-if replays over real recordings: real control planes on real Redis decide
deterministic traffic on a test clock; ``POST /v1/whatif`` must give exactly what the
algorithm functions give over the same requests, for every algorithm; sampling above the
budget scales within bounds; two replicas' recordings are both replayed."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cp_server import ControlPlaneServer, unique_namespace, write_rules

from limiter.algorithms import ALGORITHMS
from limiter.policy import Policy

pytestmark = pytest.mark.timeout(120)

RULES = """\
version: 1
routes:
  - name: api
    match: {path: /api/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 1000, period: 1s, burst: 1000}
    distributed: {average: 5, period: 1s, burst: 5}
    mode: shadow
  - name: quiet
    match: {path: /quiet/**}
    local: {average: 10, period: 1s}
"""


class Clock:
    """The decisions' clock: starts ``back_s`` seconds ago, moved by the test."""

    def __init__(self, back_s: float) -> None:
        self.us = int((time.time() - back_s) * 1_000_000)

    def __call__(self) -> int:
        return self.us


def _start(redis_url: str, rules: Any, clock: Clock, **kw: Any) -> ControlPlaneServer:
    cp = ControlPlaneServer(redis_url=redis_url, rules_path=rules, **kw).start()
    cp.engine.decider.clock_us = clock
    cp.engine.decider._wall_clock = False
    cp.engine.recorder.clock = lambda: clock() / 1_000_000
    return cp


@pytest.fixture
def traffic(redis_url, tmp_path) -> Iterator[tuple[ControlPlaneServer, list[tuple[str, int, int]]]]:
    """One control plane and the (key, ts_us, cost) of 600 requests it decided over about 2 minutes."""
    clock = Clock(back_s=300)
    cp = _start(redis_url, write_rules(tmp_path, RULES), clock)
    rng = random.Random(7)
    sent: list[tuple[str, int, int]] = []
    try:
        with httpx.Client(base_url=cp.url, timeout=10) as http:
            for _ in range(100):  # 100 batches of 6 over about 2 minutes, one timestamp per batch
                clock.us += rng.randrange(300_000, 2_400_000)
                items = [{"route": "api", "key": f"c{rng.randrange(12)}", "cost": rng.choice((1, 1, 1, 2, 3))}]
                items += [{"route": "api", "key": f"c{rng.randrange(12)}"} for _ in range(5)]
                r = http.post("/v1/decide/batch", json={"requests": items})
                assert r.status_code == 200, r.text
                sent += [(it["key"], clock.us, it.get("cost", 1)) for it in items]
        yield cp, sent
    finally:
        cp.stop()


def top_keys(sent: list[tuple[str, int, int]], rejected: dict[str, int], n: int = 10) -> list[tuple[str, int, int]]:
    """(key, requests, rejections) of the keys with most rejections (then requests, then name)."""
    requests: dict[str, int] = {}
    for key, _, _ in sent:
        requests[key] = requests.get(key, 0) + 1
    rows = [(k, requests[k], r) for k, r in rejected.items()]
    return sorted(rows, key=lambda t: (-t[2], -t[1], t[0]))[:n]


def expected(sent: list[tuple[str, int, int]], policy: Policy) -> tuple[int, int, dict[str, int]]:
    """The same requests through the algorithm function, key by key in time order: an
    independent computation of (requests, rejections, rejections per key)."""
    fn = ALGORITHMS[policy.algorithm]
    states: dict[str, Any] = {}
    rejected: dict[str, int] = {}
    for key, ts, cost in sorted(sent, key=lambda e: (e[0], e[1])):
        if cost > policy.limit:
            ok = False
        else:
            d, states[key] = fn(states.get(key), ts, policy, cost)
            ok = d.allowed
        if not ok:
            rejected[key] = rejected.get(key, 0) + 1
    return len(sent), sum(rejected.values()), rejected


def whatif(cp: ControlPlaneServer, **body: Any) -> httpx.Response:
    return httpx.post(cp.url + "/v1/whatif", json=body, timeout=30)


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log"])
def test_replay_equals_the_algorithm_over_the_same_requests(traffic, algorithm) -> None:
    cp, sent = traffic
    policy = {"algorithm": algorithm, "average": 3, "period": 2, "burst": 4}
    r = whatif(cp, route="api", policy=policy, minutes=10)
    assert r.status_code == 200, r.text
    body = r.json()
    n, rej, per_key = expected(sent, Policy(average=3, period=2, burst=4, algorithm=algorithm))
    cand = body["candidate"]
    assert (cand["events"], cand["requests"], cand["rejections"]) == (n, n, rej)
    assert cand["reject_share"] == pytest.approx(rej / n)
    assert rej > 0 and per_key  # the candidate does reject: the list below is not empty
    assert [(k["key"], k["requests"], k["rejections"]) for k in cand["top_keys"]] == top_keys(sent, per_key)
    assert sum(m["requests"] for m in cand["per_minute"]) == n
    assert sum(m["rejections"] for m in cand["per_minute"]) == rej
    # the route's current global policy (distributed: 5/s burst 5) replayed the same way
    n2, rej2, _ = expected(sent, Policy(average=5, period=1, burst=5))
    assert (body["current"]["requests"], body["current"]["rejections"]) == (n2, rej2)
    assert body["recorded_share"] == 1.0


def test_suggest_finds_the_smallest_average_within_the_share(traffic) -> None:
    cp, sent = traffic
    r = httpx.post(
        cp.url + "/v1/whatif/suggest", json={"route": "api", "max_reject_share": 0.01, "minutes": 10}, timeout=60
    )
    assert r.status_code == 200, r.text
    got = r.json()
    pol = got["policy"]
    assert got["replay"]["reject_share"] <= 0.01
    # one step below the suggestion rejects more than the share
    lower = max(1.0, pol["average"] - max(1.0, pol["average"] * 0.02))
    if lower < pol["average"]:
        burst = max(1, math.ceil(lower * pol["burst"] / pol["average"]))
        _, rej, _ = expected(sent, Policy(average=lower, period=pol["period"], burst=burst))
        assert rej / len(sent) > 0.01


def test_bad_requests_are_refused_naming_the_field(traffic) -> None:
    cp, _ = traffic
    cases = [
        ({"route": "nope", "policy": {"average": 1}}, 404, "route"),
        ({"route": "api", "policy": {"average": 0}}, 422, "policy.average"),
        ({"route": "api", "policy": {"average": 1, "algorithm": "leaky"}}, 422, "policy.algorithm"),
        ({"route": "api", "policy": {"average": 1}, "minutes": 31}, 422, "minutes"),
        ({"route": "quiet", "policy": {"average": 1}}, 404, "route"),  # nothing recorded
        ({"route": "api", "policy": {"average": 1}, "bogus": 1}, 422, "bogus"),
    ]
    for body, status, field in cases:
        r = whatif(cp, **body)
        assert r.status_code == status, (body, r.text)
        assert r.json()["field"] == field, (body, r.json())


def test_sampling_above_the_budget_scales_within_bounds(redis_url, tmp_path) -> None:
    """Budget 300 per route-minute; 1,500 requests a minute over 400 keys: after the first
    full minute whole keys are sampled, and the replay's scaled count stays near the truth."""
    clock = Clock(back_s=240)
    ns = unique_namespace()
    cp = _start(redis_url, write_rules(tmp_path, RULES), clock, namespace=ns, record_budget=300)
    rng = random.Random(11)
    try:
        sent = 0
        for _minute in range(3):
            for _ in range(15):  # 15 batches of 100 per minute
                items = [{"route": "api", "key": f"k{rng.randrange(400)}"} for _ in range(100)]
                clock.us += 60_000_000 // 15
                assert httpx.post(cp.url + "/v1/decide/batch", json={"requests": items}, timeout=10).status_code == 200
                sent += 100
                cp.call(cp.engine.recorder.flush)
        r = whatif(cp, route="api", policy={"average": 1000}, minutes=5)
        assert r.status_code == 200, r.text
        body = r.json()
        cand = body["candidate"]
        assert cand["events"] < sent * 0.7  # sampled: far fewer recorded than decided
        assert cand["requests"] == pytest.approx(sent, rel=0.25)  # scaled back to about the truth
        assert 0.1 < body["recorded_share"] < 0.9
    finally:
        cp.stop()


def test_two_replicas_recordings_are_both_replayed(redis_url, tmp_path) -> None:
    clock = Clock(back_s=120)
    ns = unique_namespace()
    rules = write_rules(tmp_path, RULES)
    a = _start(redis_url, rules, clock, namespace=ns)
    b = _start(redis_url, rules, clock, namespace=ns)
    try:
        for i in range(40):
            clock.us += 100_000
            cp = a if i % 2 else b
            httpx.post(cp.url + "/v1/decide", json={"route": "api", "key": "shared"}, timeout=10)
        cp_other = b
        a.call(a.engine.recorder.flush)
        r = whatif(cp_other, route="api", policy={"average": 1, "period": 1, "burst": 1}, minutes=5)
        assert r.status_code == 200, r.text
        assert r.json()["candidate"]["events"] == 40
    finally:
        a.stop()
        b.stop()


def test_cli_whatif_and_suggest_print_tables_and_json(traffic, capsys) -> None:
    import json

    from control_plane.cli import main

    cp, sent = traffic
    code = main(["whatif", "api", "--rate", "3/2s", "--burst", "4", "--minutes", "10", "--url", cp.url])
    out, err = capsys.readouterr()
    assert code == 0, err
    n, rej, _ = expected(sent, Policy(average=3, period=2, burst=4))
    assert out.splitlines()[0].split() == ["REPLAY", "POLICY", "REQUESTS", "REJECTED", "SHARE"]
    cand = next(line for line in out.splitlines() if line.startswith("candidate"))
    assert f"{n:,}" in cand and f"{rej:,}" in cand
    assert "TOP KEY" in out and "recorded share 100.0%" in out
    code = main(["suggest", "api", "--max-reject", "1%", "--minutes", "10", "--url", cp.url, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["replay"]["reject_share"] <= 0.01
    code = main(["whatif", "api", "--rate", "fast", "--url", cp.url])
    _, err = capsys.readouterr()
    assert code == 2 and "--rate: expected N/period" in err
    code = main(["whatif", "quiet", "--rate", "5/1s", "--url", cp.url])
    _, err = capsys.readouterr()
    assert code != 0 and "no recorded requests" in err


def test_recording_off_records_nothing_and_says_so(redis_url, tmp_path) -> None:
    cp = ControlPlaneServer(redis_url=redis_url, rules_path=write_rules(tmp_path, RULES), record=False).start()
    try:
        for i in range(5):
            httpx.post(cp.url + "/v1/decide", json={"route": "api", "key": f"k{i}"}, timeout=10)
        cp.call(cp.engine.recorder.flush)
        r = whatif(cp, route="api", policy={"average": 1})
        assert r.status_code == 409 and r.json()["error"] == "recording_off", r.text
        import redis as redis_sync

        assert not redis_sync.Redis.from_url(redis_url).keys(f"rl:{cp.namespace}:rec*")
    finally:
        cp.stop()


def test_one_replay_at_a_time_and_too_many_requests_are_refused(traffic, monkeypatch) -> None:
    from control_plane.api import whatif as api

    cp, _ = traffic

    async def hold() -> None:
        await api._BUSY.acquire()

    cp.call(hold)
    try:
        r = whatif(cp, route="api", policy={"average": 1}, minutes=10)
        assert r.status_code == 503 and r.json()["error"] == "busy", r.text
    finally:

        async def release() -> None:
            api._BUSY.release()

        cp.call(release)
    monkeypatch.setattr(api, "MAX_EVENTS", 100)
    r = whatif(cp, route="api", policy={"average": 1}, minutes=10)
    assert r.status_code == 422 and r.json()["field"] == "minutes" and "more than 100" in r.json()["message"]
