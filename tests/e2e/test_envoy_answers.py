"""What Envoy's rate limit service answers besides OK and OVER_LIMIT, over real gRPC against a
real control plane on real Redis: a malformed message, the rate-limit headers (off by default,
the peer's or the draft's on request), the would-limit header for the upstream (exact: Redis's
own verdict for that very request), the peer's per-descriptor stats, a look without spending
(``hits_addend`` 0) and a banned value (``requests_per_unit: 0``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import redis as redis_sync
from cp_server import ControlPlaneServer, metric_value, wait_until
from rls_client import OK, OVER, Rls, clear_of_minute_edge, descriptor, serve, set_mode

from control_plane.model.rollout import canary_bucket

pytestmark = pytest.mark.timeout(120)

CONFIG = """\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /login
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2, name: login}
  - key: budget
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: foo
    descriptors:
      - key: bar
        value: banned
        rate_limit: {unit: minute, requests_per_unit: 0, name: banned_limit}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
"""
LOGIN = "edge/path=%2Flogin"
BANNED = "edge/foo/bar=banned"
WOULD = "x-shadowlimit-would-limit"


@pytest.fixture
def envoy_file(tmp_path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def served(redis_url, envoy_file) -> Iterator[tuple[ControlPlaneServer, Rls]]:
    cp = serve(redis_url, envoy_file)
    rls = Rls(cp.settings.grpc_port)
    try:
        yield cp, rls
    finally:
        rls.close()
        cp.stop()


def metrics_of(cp: ControlPlaneServer) -> str:
    return httpx.get(cp.url + "/metrics", timeout=10).text


def would(r: Any) -> dict[str, str]:
    return {h.key: h.value for h in r.request_headers_to_add}


def compared(cp: ControlPlaneServer, route: str) -> int:
    routes = httpx.get(cp.url + "/v1/routes", timeout=10).json()["routes"]
    return int(next(r for r in routes if r["name"] == route)["divergence_5m"]["compared"])


# --------------------------------------------------------------------------- #
# a malformed message


def test_a_message_that_is_not_protobuf_or_not_utf8_is_invalid_argument_and_counted(served) -> None:
    cp, rls = served
    cases = [
        b"\xff" * 64,  # not protobuf at all
        b"\x0a\x02\xff\xfe",  # domain (field 1, a string) holding bytes that are not UTF-8
        b"\x0a\x04edge\x12\x08\x0a\x06\x0a\x01k\x12\x01\xff",  # an entry's value that is not UTF-8
    ]
    for data in cases:
        with pytest.raises(grpc.RpcError) as err:
            rls.raw(data, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        details = err.value.details() or ""
        assert "RateLimitRequest" in details and "DecodeError" not in details and "class" not in details
    text = metrics_of(cp)
    assert metric_value(text, "rate_limit_envoy_requests_total", code="invalid") == len(cases)
    assert metric_value(text, "rate_limit_envoy_requests_total", code="error") == 0
    assert rls.codes(descriptor(("budget", "after")))[0] == OK  # still serving


# --------------------------------------------------------------------------- #
# rate-limit headers


def test_peer_headers_on_request_one_of_each_name(redis_url, envoy_file) -> None:
    cp = serve(redis_url, envoy_file, envoy_response_headers="peer", envoy_limit_header="X-Quota-Limit")
    rls = Rls(cp.settings.grpc_port)
    try:
        clear_of_minute_edge()
        # the closest to its limit is named: budget (5) after 4 hits has 1 left, remote_address (3) has 2
        for _ in range(4):
            rls.ask(descriptor(("budget", "hdr")))
        r = rls.ask(descriptor(("remote_address", "10.1.1.1")), descriptor(("budget", "hdr")))
        keys = [h.key for h in r.response_headers_to_add]
        assert keys == ["X-Quota-Limit", "RateLimit-Remaining", "RateLimit-Reset"]
        headers = {h.key: h.value for h in r.response_headers_to_add}
        assert headers["X-Quota-Limit"] == "5" and headers["RateLimit-Remaining"] == "0"
        assert 0 < int(headers["RateLimit-Reset"]) <= 60
        r = rls.ask(descriptor(("remote_address", "10.1.1.1")), descriptor(("budget", "hdr")))
        assert r.overall_code == OVER
        headers = {h.key: h.value for h in r.response_headers_to_add}
        assert headers["X-Quota-Limit"] == "5" and headers["RateLimit-Remaining"] == "0"
    finally:
        rls.close()
        cp.stop()


def test_draft_headers_on_request_never_twice_one_name(redis_url, envoy_file) -> None:
    cp = serve(redis_url, envoy_file, envoy_response_headers="draft")
    rls = Rls(cp.settings.grpc_port)
    try:
        clear_of_minute_edge()
        for _ in range(4):
            r = rls.ask(descriptor(("remote_address", "10.2.2.2")), descriptor(("budget", "d")))
            keys = [h.key.lower() for h in r.response_headers_to_add]
            assert len(keys) == len(set(keys)), keys
            assert "ratelimit-policy" in keys and "ratelimit" in keys
            assert not [k for k in keys if k.startswith("x-ratelimit")]  # Envoy's own, with DRAFT_VERSION_03
        assert r.overall_code == OVER and "retry-after" in keys
    finally:
        rls.close()
        cp.stop()


# --------------------------------------------------------------------------- #
# the would-limit header


def test_shadow_names_the_route_to_the_upstream_exactly_when_its_global_limit_is_over(served) -> None:
    cp, rls = served
    clear_of_minute_edge()
    login = descriptor(("path", "/login"))
    answers = [rls.ask(login, descriptor(("budget", "w"))) for _ in range(4)]
    assert [r.overall_code for r in answers] == [OK] * 4  # shadow never rejects
    assert [would(r) for r in answers] == [{}, {}, {WOULD: LOGIN}, {WOULD: LOGIN}]  # 2 per minute
    assert all(not r.response_headers_to_add for r in answers)  # never for the client
    # compared with the local decisions as any shadow decision (the header proves it was made inline)
    wait_until(lambda: compared(cp, LOGIN) == 4, timeout=15, what="the 4 shadow decisions were compared")
    # a key outside a canary's share is shadowed too
    set_mode(cp, "edge/remote_address", "canary", 50)
    outside = next(f"10.9.0.{i}" for i in range(256) if canary_bucket("edge/remote_address", f"10.9.0.{i}") >= 50)
    answers = [rls.ask(descriptor(("remote_address", outside))) for _ in range(4)]
    assert [r.overall_code for r in answers] == [OK] * 4
    assert [would(r) for r in answers] == [{}, {}, {}, {WOULD: "edge/remote_address"}]
    # enforced: the client is rejected, nothing is said to the upstream
    set_mode(cp, LOGIN, "enforce")
    r = rls.ask(login)
    assert r.overall_code == OVER and not would(r)


def test_would_limit_header_name_is_settable_and_can_be_off(redis_url, envoy_file) -> None:
    cp = serve(redis_url, envoy_file, envoy_would_limit_header="X-App-Would-Limit")
    rls = Rls(cp.settings.grpc_port)
    try:
        clear_of_minute_edge()
        answers = [rls.ask(descriptor(("path", "/login"))) for _ in range(3)]
        assert would(answers[2]) == {"x-app-would-limit": LOGIN}
    finally:
        rls.close()
        cp.stop()
    cp = serve(redis_url, envoy_file, envoy_would_limit_header="off")
    rls = Rls(cp.settings.grpc_port)
    try:
        answers = [rls.ask(descriptor(("path", "/login"))) for _ in range(3)]
        assert all(not r.request_headers_to_add for r in answers)
        # the shadow pipeline compares them, off the request path
        wait_until(lambda: compared(cp, LOGIN) >= 3, timeout=15, what="the shadow decisions were compared")
    finally:
        rls.close()
        cp.stop()


# --------------------------------------------------------------------------- #
# the peer's per-descriptor stats


def test_hit_stats_per_route_exist_at_zero_and_count_as_the_peer(served) -> None:
    cp, rls = served
    text = metrics_of(cp)
    for route in ("edge/remote_address", LOGIN, "edge/budget", BANNED, "edge/service=service_2"):
        for stat in ("total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"):
            assert f'rate_limit_envoy_hits_total{{route="{route}",stat="{stat}"}} 0.0' in text, (route, stat)
    clear_of_minute_edge()
    for _ in range(7):  # 5 per minute: 5 within (the 5th above 0.8 * 5 = 4: near), 2 over
        rls.ask(descriptor(("budget", "s")))
    for _ in range(3):  # login, shadowed, 2 per minute: the 3rd is over and shadowed
        rls.ask(descriptor(("path", "/login")))
    text = metrics_of(cp)

    def stat(route: str, name: str) -> float:
        return metric_value(text, "rate_limit_envoy_hits_total", route=route, stat=name)

    assert [stat("edge/budget", s) for s in ("total_hits", "within_limit", "near_limit", "over_limit")] == [7, 5, 1, 2]
    assert stat("edge/budget", "shadow_mode") == 0
    assert [stat(LOGIN, s) for s in ("total_hits", "within_limit", "over_limit", "shadow_mode")] == [3, 2, 1, 1]


# --------------------------------------------------------------------------- #
# hits_addend 0: a look without spending


def test_hits_addend_zero_looks_without_spending(served) -> None:
    cp, rls = served
    clear_of_minute_edge()
    look = descriptor(("budget", "q"), hits=0)
    r = rls.ask(look)
    assert (r.overall_code, r.statuses[0].code, r.statuses[0].limit_remaining) == (OK, OK, 5)
    for _ in range(3):
        rls.ask(descriptor(("budget", "q")))
    for _ in range(3):  # looking again and again spends nothing
        r = rls.ask(look)
        assert (r.overall_code, r.statuses[0].limit_remaining) == (OK, 2)
    assert rls.ask(descriptor(("budget", "q")), hits=2).statuses[0].limit_remaining == 0
    r = rls.ask(look)  # nothing left: a request of one hit would be refused
    assert (r.overall_code, r.statuses[0].code, r.statuses[0].limit_remaining) == (OVER, OVER, 0)
    # the peer's /tokenquota: look at a quota_mode descriptor first, spend at the stream's end
    quota_look = descriptor(("service", "service_2"), hits=0)
    seen = []
    for _ in range(3):
        seen.append(rls.ask(quota_look).overall_code)
        if seen[-1] == OK:
            rls.ask(descriptor(("service", "service_2"), hits=1))
    assert seen == [OK, OK, OVER]
    text = metrics_of(cp)
    assert metric_value(text, "rate_limit_envoy_requests_total", code="error") == 0


# --------------------------------------------------------------------------- #
# requests_per_unit: 0


def test_a_banned_value_is_always_over_without_redis_and_counted_in_shadow(served, redis_url) -> None:
    cp, rls = served
    banned = descriptor(("foo", "x"), ("bar", "banned"))
    for _ in range(3):
        r = rls.ask(banned)
        assert (r.overall_code, r.statuses[0].code) == (OVER, OVER)
        assert (r.statuses[0].current_limit.requests_per_unit, r.statuses[0].current_limit.name) == (0, "banned_limit")
        assert r.statuses[0].limit_remaining == 0
    keys = redis_sync.Redis.from_url(redis_url).keys(f"rl:{cp.namespace}:*")
    assert not [k for k in keys if b"banned" in k]  # no Redis call: nothing written
    set_mode(cp, BANNED, "shadow")
    r = rls.ask(banned)
    assert r.overall_code == OK and would(r) == {WOULD: BANNED}  # "would block every request"
    text = metrics_of(cp)
    assert metric_value(text, "rate_limit_envoy_hits_total", route=BANNED, stat="over_limit") == 4
    assert metric_value(text, "rate_limit_envoy_hits_total", route=BANNED, stat="shadow_mode") == 1
    wait_until(lambda: compared(cp, BANNED) == 4, timeout=15, what="the 3 enforced and 1 shadow decisions compared")


def test_every_hit_is_counted_refused_or_not_as_envoyproxy_ratelimit_counts_it(served) -> None:
    """A fixed window of 5 a minute: a hit of 3 (OK), one of 4 (OVER, and counted: 7), then a
    hit of 1 is OVER where a window that counted only what it admitted (3) would take it; a
    charge past the limit (a stream-done call's ``hits_addend``) lands whatever is left, and the
    look that follows (``hits_addend`` 0) is OVER_LIMIT."""
    _, rls = served
    clear_of_minute_edge()
    budget = ("budget", "every-hit")
    assert rls.codes(descriptor(budget), hits=3)[0] == OK
    assert rls.codes(descriptor(budget), hits=4)[0] == OVER
    assert rls.codes(descriptor(budget))[0] == OVER  # 7 + 1 > 5: the refused hit was counted
    other = ("budget", "streamed")
    assert rls.codes(descriptor(other, hits=0))[0] == OK  # the request-time look: nothing spent yet
    r = rls.ask(descriptor(other, hits=900))  # the stream-done charge: 900 of 5, counted
    assert r.overall_code == OVER and r.statuses[0].limit_remaining == 0
    assert rls.codes(descriptor(other, hits=0))[0] == OVER  # the next look sees the charge
