"""Divergence explained by cause, on real Redis with three replicas: each cause produced by
traffic built for it and recognised. A key spread over three replicas under equal limits is
``replicas``; a key on one replica under a stricter global limit is ``tighter``; a mix splits
as a what-if replay of both limits predicts; a replica restarted mid-window makes
``fresh_local`` for a key the global state remembers (and not for a new key); a replica run
under a clock 20 s behind (libfaketime) makes ``clock`` and says so in its skew gauge. The
figures are the same through ``/v1/divergence``, Prometheus, the CLI and the gate."""

from __future__ import annotations

import glob
import itertools
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_sync
from cp_server import (
    ADMIN_TOKEN,
    ControlPlaneServer,
    admin_headers,
    clean_env,
    free_port,
    metric_value,
    unique_namespace,
    wait_until,
    write_rules,
)
from support import installed_binary

from control_plane.observe.hitters import WouldBeBlocked
from limiter import Policy
from limiter.algorithms import decide

pytestmark = pytest.mark.timeout(240)

SHADOWLIMIT = Path(sys.executable).parent / "shadowlimit"
_KEY = "key: {strategy: header, header: X-Client-Id}"
RULES = f"""\
version: 1
routes:
  - name: spread          # equal limits: a client spread over the replicas is the leak
    match: {{path: /spread/**}}
    {_KEY}
    local: {{average: 10, period: 1s, burst: 10}}
  - name: tight           # a stricter global limit
    match: {{path: /tight/**}}
    {_KEY}
    local: {{average: 10, period: 1s, burst: 10}}
    distributed: {{average: 3, period: 1s, burst: 3}}
  - name: mix             # stricter, and spread: some of each
    match: {{path: /mix/**}}
    {_KEY}
    local: {{average: 10, period: 1s, burst: 10}}
    distributed: {{average: 6, period: 1s, burst: 6}}
  - name: slow            # refills in 100 s: a restarted replica's bucket stays fresh that long
    match: {{path: /slow/**}}
    {_KEY}
    local: {{average: 0.2, period: 1s, burst: 20}}
  - name: clocked         # a window of a minute: the global state outlives the clock's lag
    match: {{path: /clocked/**}}
    {_KEY}
    local: {{algorithm: fixed_window, average: 40, period: 60s}}
  - name: unexplained     # a stricter global limit, left unexplained
    match: {{path: /unexplained/**}}
    {_KEY}
    local: {{average: 10, period: 1s, burst: 10}}
    distributed: {{average: 3, period: 1s, burst: 3}}
    explain: false
"""


class Fleet:
    """Three replicas on one Redis and one namespace, and an HTTP client to drive them."""

    def __init__(self, redis_url: str, rules: Path) -> None:
        self.redis_url, self.rules = redis_url, rules
        self.namespace = unique_namespace("causes")
        self.common: dict[str, Any] = dict(
            redis_url=redis_url, rules_path=rules, namespace=self.namespace, gate_min_samples=50, gate_window_s=60
        )
        self.replicas: list[ControlPlaneServer] = []
        self.http = httpx.Client(timeout=10)

    def start(self) -> Fleet:
        for name in ("a", "b", "c"):
            self.replicas.append(ControlPlaneServer(instance_id=f"replica-{name}", **self.common).start())
        return self

    def stop(self) -> None:
        self.http.close()
        for cp in self.replicas:
            cp.stop()

    def decide(self, cp: ControlPlaneServer | str, route: str, key: str) -> dict[str, Any]:
        url = cp if isinstance(cp, str) else cp.url
        r = self.http.post(f"{url}/v1/decide", json={"route": route, "key": key})
        assert r.status_code in (200, 429), r.text
        return r.json()  # type: ignore[no-any-return]

    def paced(
        self, targets: Iterator[ControlPlaneServer | str], route: str, key: str, rate: float, n: int
    ) -> list[tuple[ControlPlaneServer | str, int, int]]:
        """``n`` requests at ``rate`` per second, each to the next of ``targets``, on a schedule
        (a slow answer does not lower the rate); returns where each went, when it was sent and
        when its answer came (wall clock, microseconds): the server decided in between."""
        start = time.monotonic()
        sent = []
        for i, cp in zip(range(n), targets):
            due = start + i / rate
            ahead = due - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)  # pacing the client, not waiting for the server
            at = time.time_ns() // 1000
            self.decide(cp, route, key)
            sent.append((cp, at, time.time_ns() // 1000))
        return sent

    def settle(self) -> None:
        for cp in self.replicas:
            cp.settle()
        for cp in self.replicas:  # every replica's counters flushed: now each view sees all of them
            cp.call(cp.engine.views.refresh)

    def divergence(self, route: str, cp: ControlPlaneServer | None = None) -> dict[str, Any]:
        url = (cp or self.replicas[0]).url
        return self.http.get(f"{url}/v1/divergence", params={"minutes": 10}).json()["routes"][route]  # type: ignore[no-any-return]

    def redis_keys(self, route: str, key: str) -> dict[str, bool]:
        """Whether the key's global bucket and its reference's are in Redis."""
        client = redis_sync.Redis.from_url(self.redis_url)
        try:
            return {
                "global": bool(client.exists(f"rl:{self.namespace}:{route}:{key}")),
                "reference": bool(client.exists(f"rl:{self.namespace}:#ref:{route}:{key}")),
            }
        finally:
            client.close()

    def cause_metric(self, route: str, cause: str) -> float:
        return sum(
            metric_value(self.http.get(f"{cp.url}/metrics").text, "rate_limit_divergence_cause_total", route=route,
                         cause=cause)
            for cp in self.replicas
        )  # fmt: skip


@pytest.fixture
def fleet(redis_url: str, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(redis_url, write_rules(tmp_path, RULES))
    try:
        yield f.start()
    finally:
        f.stop()


def _ahead_of_the_blocked_window_edge(margin_s: float = 40.0) -> None:
    """The "would be blocked" view covers the current 5-minute window (aligned on the epoch):
    a test about to read it back starts with ``margin_s`` of it ahead. The clocks stay the real
    ones (a shifted clock is what the clock check is there to catch)."""
    left = WouldBeBlocked().window_s - time.time() % WouldBeBlocked().window_s
    if left < margin_s:
        wait_until(lambda: time.time() % WouldBeBlocked().window_s < 1, margin_s + 1, 0.1, "the next window")


def _forward(d: dict[str, Any]) -> dict[str, Any]:
    return d["causes"]["new_rejections"]  # type: ignore[no-any-return]


def test_a_key_spread_over_three_replicas_under_equal_limits_is_the_leak(fleet: Fleet, capsys) -> None:
    _ahead_of_the_blocked_window_edge()
    a, b, c = fleet.replicas
    fleet.paced(itertools.cycle((a, b, c)), "spread", "bob", rate=24, n=120)  # 8/s on each replica
    fleet.settle()
    d = fleet.divergence("spread")
    causes = _forward(d)
    assert d["totals"]["local_allow_distributed_deny"] == causes["total"] >= 40, d["totals"]
    assert causes["by_cause"]["replicas"] >= 0.9 * causes["total"], causes
    assert causes["summary"].split(" ", 1)[1].startswith("the fleet multiplied the old limit"), causes
    assert [(w["key"], w["cause"]) for w in d["would_be_blocked"]] == [("bob", "replicas")]
    # under limits this equal the reference's answer changes no cause: it is not evaluated
    assert fleet.redis_keys("spread", "bob") == {"global": True, "reference": False}
    # the same from any replica, and in Prometheus (each replica counts what it evaluated)
    assert _forward(fleet.divergence("spread", c)) == causes
    assert fleet.cause_metric("spread", "replicas") == causes["by_cause"]["replicas"]
    # the CLI: the shares, and bob's cause in the WHY column
    from control_plane.cli import main

    assert main(["divergence", "spread", "--minutes", "10", "--url", a.url]) == 0
    out = capsys.readouterr().out
    assert "the fleet multiplied the old limit" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("bob "))
    assert row[2] == "replicas", out
    # the gate: counting every new rejection refuses; counting the tighter ones only, it passes
    body = {"mode": "canary", "canary_percent": 10, "reason": "all leak"}
    r = fleet.http.put(f"{a.url}/v1/routes/spread/mode", json=body, headers=admin_headers())
    assert r.status_code == 409 and "new rejections" in " ".join(r.json()["gate"]["reasons"]), r.text
    tighter = ControlPlaneServer(instance_id="replica-t", gate_counts="tighter", **fleet.common).start()
    try:
        tighter.call(tighter.engine.views.refresh)
        r = fleet.http.put(f"{tighter.url}/v1/routes/spread/mode", json=body, headers=admin_headers())
        assert r.status_code == 200, r.text
        gate = r.json()["audit"]["gate"]
        assert gate["gate_counts"] == "tighter" and gate["passed"] and gate["counted_rejection_rate"] < 0.01, gate
        assert gate["new_rejections"] == causes["total"]
    finally:
        tighter.stop()


def test_a_key_on_one_replica_under_a_stricter_global_limit_is_tighter(fleet: Fleet) -> None:
    _ahead_of_the_blocked_window_edge()
    a = fleet.replicas[0]
    fleet.paced(itertools.repeat(a), "tight", "carol", rate=9, n=54)
    # the reference has keys of its own, beside the global limit's (both live a refill time, 1 s)
    assert wait_until(lambda: fleet.redis_keys("tight", "carol")["global"], 1, 0.01, "the global bucket")
    assert fleet.redis_keys("tight", "carol") == {"global": True, "reference": True}
    fleet.paced(itertools.repeat(a), "unexplained", "carol", rate=9, n=27)  # the same, explain: false
    fleet.settle()
    d = fleet.divergence("tight")
    causes = _forward(d)
    assert causes["total"] >= 25, d["totals"]
    assert causes["by_cause"]["tighter"] >= 0.9 * causes["total"], causes
    assert [(w["key"], w["cause"]) for w in d["would_be_blocked"]] == [("carol", "tighter")]
    # a route that does not explain: its divergence is there, without causes
    off = fleet.divergence("unexplained")
    assert off["causes"]["explain"] is False and _forward(off)["total"] >= 10
    assert _forward(off)["unexplained"] == _forward(off)["total"] and not any(_forward(off)["by_cause"].values())
    assert off["causes"]["new_rejections"]["summary"].endswith("not explained (no reference evaluated)")


def _replay(sent: list[tuple[Any, int]], local: Policy, dist: Policy) -> Counter[str]:
    """The requests replayed at the times given through the limiters' own functions:
    each replica's local bucket, the global bucket, and the local policy as one bucket for the
    whole fleet (the reference); each new rejection counted by what the reference says."""
    locals_: dict[Any, Any] = {}
    glob = ref = None
    out: Counter[str] = Counter()
    for where, t in sent:
        ld, locals_[where] = decide(locals_.get(where), t, local, 1)
        gd, glob = decide(glob, t, dist, 1)
        rd, ref = decide(ref, t, local, 1)
        if ld.allowed and not gd.allowed:
            out["replicas" if not rd.allowed else "tighter"] += 1
        elif not ld.allowed:
            out["local_rejected"] += 1
    return out


def test_a_mix_splits_as_a_replay_of_both_limits_predicts(fleet: Fleet) -> None:
    a, b, c = fleet.replicas
    sent = fleet.paced(itertools.cycle((a, b, c)), "mix", "dave", rate=15, n=105)  # 5/s on each
    fleet.settle()
    causes = _forward(fleet.divergence("mix"))
    explained = causes["by_cause"]["replicas"] + causes["by_cause"]["tighter"]
    assert explained == causes["total"] >= 30, causes
    # Which new rejection the reference also refuses turns on the phase of two buckets draining
    # at 6/s and 10/s under 15/s: a few milliseconds move it. The servers decided somewhere
    # between each request's sending and its answer, so the replay is run at both ends and the
    # measured split must lie within 0.10 of the range they span.
    shares = []
    for end in (1, 2):
        predicted = _replay([(s[0], s[end]) for s in sent], Policy(average=10, burst=10), Policy(average=6, burst=6))
        assert predicted["local_rejected"] == 0 and 0.2 < predicted["replicas"] / predicted.total() < 0.8, predicted
        shares.append(predicted["replicas"] / (predicted["replicas"] + predicted["tighter"]))
    measured_share = causes["by_cause"]["replicas"] / explained
    assert min(shares) - 0.10 <= measured_share <= max(shares) + 0.10, (causes, shares)


def test_a_replica_restarted_mid_window_makes_fresh_local_for_keys_the_global_state_remembers(
    fleet: Fleet,
) -> None:
    a = fleet.replicas[0]
    for _ in range(20):  # erin drains her bucket on replica a: local and global alike, no divergence
        assert fleet.decide(a, "slow", "erin")["allowed"]
    fleet.settle()
    assert _forward(fleet.divergence("slow"))["total"] == 0
    # into the next minute: the fleet was deciding the route before the replica restarts
    started = time.time()
    wait_until(lambda: int(time.time() // 60) > int(started // 60), 65, 0.2, "the next minute")
    a.restart()
    fleet.settle()
    answers = [fleet.decide(a, "slow", "erin") for _ in range(20)]
    assert all(x["allowed"] for x in answers)  # a new local bucket admits 20
    fleet.paced(itertools.repeat(a), "tight", "nina", rate=9, n=27)  # a new key there: tighter, not fresh
    fleet.settle()
    d = fleet.divergence("slow")
    causes = _forward(d)
    assert causes["total"] >= 5 and causes["by_cause"]["fresh_local"] == causes["total"], causes
    assert [(w["key"], w["cause"]) for w in d["would_be_blocked"]] == [("erin", "fresh_local")]
    nina = [w for w in fleet.divergence("tight")["would_be_blocked"] if w["key"] == "nina"]
    assert [w["cause"] for w in nina] == ["tighter"]
    assert _forward(fleet.divergence("tight"))["by_cause"]["fresh_local"] == 0


def _skewed_replica(fleet: Fleet, tmp_path: Path, offset: str) -> tuple[subprocess.Popen[bytes], str]:
    """``shadowlimit serve`` under libfaketime (Debian's faketime), its clock ``offset`` from the
    real one: the library preloaded into the server itself, as the faketime command does (which
    would stay between the test and the server, and leave the server behind when stopped)."""
    installed_binary("faketime")
    assert glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"), "libfaketime: apt-get install faketime"
    port = free_port()
    env = clean_env(
        RATE_LIMIT_REDIS_URL=fleet.redis_url,
        RATE_LIMIT_RULES_PATH=str(fleet.rules),
        SHADOWLIMIT_NAMESPACE=fleet.namespace,
        SHADOWLIMIT_PORT=str(port),
        SHADOWLIMIT_ADMIN_TOKEN=ADMIN_TOKEN,
        SHADOWLIMIT_INSTANCE_ID="replica-skewed",
        ENABLE_DISTRIBUTED_RATE_LIMITING="true",
        LD_PRELOAD="/usr/$LIB/faketime/libfaketimeMT.so.1",  # $LIB: the dynamic linker's own
        FAKETIME=offset,
    )
    log = open(tmp_path / "skewed.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [str(SHADOWLIMIT), "serve", "--log-level", "warning"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: proc.poll() is None and httpx.get(url + "/readyz", timeout=1).status_code == 200,
            40,
            0.2,
            "the replica under faketime to be ready",
        )
    except AssertionError:
        proc.kill()
        proc.wait()
        raise AssertionError((tmp_path / "skewed.log").read_text(errors="replace")[-2000:]) from None
    return proc, url


def test_a_replica_whose_clock_is_20s_behind_makes_clock_and_says_so(fleet: Fleet, tmp_path: Path) -> None:
    b = fleet.replicas[1]
    proc, skewed = _skewed_replica(fleet, tmp_path, "-20s")
    try:
        backend = fleet.http.get(f"{skewed}/v1/backend", headers=admin_headers()).json()
        assert backend["clock"]["offset_ms"] < -19_000 and backend["clock"]["past_tolerance"], backend["clock"]
        skew = metric_value(fleet.http.get(f"{skewed}/metrics").text, "rate_limit_clock_skew_seconds")
        assert -21 < skew < -19
        assert b.engine.clock_skew.offset_us is not None and abs(b.engine.clock_skew.offset_us) < 250_000
        # frank uses up the minute's 40 on b, then goes to the skewed replica: its stamps are 20 s
        # older than the global state's, so Redis counts them in the full minute (an older request
        # is evaluated at the stored time), while its own fresh window admits them
        for _ in range(40):
            assert fleet.decide(b, "clocked", "frank")["allowed"]
        b.settle()
        answers = [fleet.decide(skewed, "clocked", "frank") for _ in range(32)]
        assert all(x["allowed"] for x in answers)

        def explained() -> dict[str, Any] | None:
            fleet.settle()
            causes = _forward(fleet.divergence("clocked"))
            return causes if causes["total"] == 32 and not causes["unexplained"] else None

        causes = wait_until(explained, 20, 0.5, "the skewed replica's divergence, flushed")
        assert causes["by_cause"]["clock"] == 32, causes
        # who would be blocked, from the skewed replica itself: its 5-minute window is its clock's
        # (its fleet view is refreshed on its own schedule: a loaded machine's first read may be older)

        def blocked_on_the_skewed_replica() -> list[tuple[str, str]]:
            mine = fleet.http.get(f"{skewed}/v1/divergence", params={"minutes": 10}).json()["routes"]["clocked"]
            return [(w["key"], w["cause"]) for w in mine["would_be_blocked"]]

        wait_until(lambda: blocked_on_the_skewed_replica() != [], 20, 0.5, "the skewed replica's blocked keys")
        assert blocked_on_the_skewed_replica() == [("frank", "clock")]
        text = fleet.http.get(f"{skewed}/metrics").text
        assert (
            metric_value(text, "rate_limit_divergence_cause_total", route="clocked", cause="clock") == causes["total"]
        )
    finally:
        proc.terminate()
        proc.wait(15)
