"""Envoy's rate limit service over real gRPC: a grpcio client with Envoy's generated messages
against a real control plane on real Redis, configured by an envoyproxy/ratelimit config
file. OK then OVER_LIMIT at the limit, several descriptors, hits_addend, shadow vs
enforce, hot reload, a bad config kept out, Redis down, health and reflection."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from cp_server import ControlPlaneServer, admin_headers, clean_env, free_port, metric_value, wait_until
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from rls_client import MINUTE, OK, OVER, Response, Rls, clear_of_minute_edge, descriptor, serve, set_mode

from limiter.embedded import EmbeddedRedis

pytestmark = pytest.mark.timeout(120)

CONFIG = """\
domain: edge
descriptors:
  - key: remote_address            # a bucket per address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /login
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2, name: login}
  - key: tenant
    value: "acme*"
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: plan
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 1000, name: gold, replaces: [{name: general}]}
  - key: generic
    rate_limit: {unit: minute, requests_per_unit: 2, name: general}
  - key: budget
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: free
    rate_limit: {unlimited: true}
"""


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


# --------------------------------------------------------------------------- #
# answers


def test_ok_then_over_limit_at_the_limit_with_envoys_fields(served) -> None:
    cp, rls = served
    clear_of_minute_edge()
    remaining = []
    for _ in range(3):
        r = rls.ask(descriptor(("remote_address", "10.0.0.1")))
        assert r.overall_code == OK
        s = r.statuses[0]
        assert (s.current_limit.requests_per_unit, s.current_limit.unit) == (3, MINUTE)
        assert 0 < s.duration_until_reset.seconds <= 60
        remaining.append(s.limit_remaining)
        # no headers of its own by default, as envoyproxy/ratelimit: Envoy adds its own
        assert not r.response_headers_to_add and not r.request_headers_to_add
    assert remaining == [2, 1, 0]
    r = rls.ask(descriptor(("remote_address", "10.0.0.1")))
    assert r.overall_code == OVER and r.statuses[0].code == OVER and r.statuses[0].limit_remaining == 0
    assert not r.response_headers_to_add
    # the descriptor has no value in the config: each address has its own bucket
    assert rls.codes(descriptor(("remote_address", "10.0.0.2")))[0] == OK
    # routes of the rollout, by their Envoy names, with what Envoy sees
    routes = {r["name"]: r for r in httpx.get(cp.url + "/v1/routes", timeout=10).json()["routes"]}
    assert routes["edge/remote_address"]["state"]["mode"] == "enforce"
    assert routes["edge/path=%2Flogin"]["state"]["mode"] == "shadow"
    assert routes["edge/remote_address"]["rule"]["origin"]["line"] == 3
    metrics = httpx.get(cp.url + "/metrics", timeout=10).text
    assert metric_value(metrics, "rate_limit_envoy_requests_total", code="over_limit") == 1
    assert metric_value(metrics, "rate_limit_envoy_requests_total", code="ok") == 4


def test_every_descriptor_is_checked_and_one_over_limit_is_enough(served) -> None:
    _, rls = served
    clear_of_minute_edge()
    many = [
        descriptor(("budget", "b1")),
        descriptor(("generic", "g")),
        descriptor(("free", "x")),
        descriptor(("nope", "x")),
    ]
    assert rls.codes(*many) == (OK, [OK, OK, OK, OK])
    r = rls.ask(*many)
    assert r.overall_code == OK
    assert [s.limit_remaining for s in r.statuses] == [3, 0, 2**32 - 1, 0]
    assert not r.statuses[3].HasField("current_limit")  # no limit for that descriptor
    assert r.statuses[1].current_limit.name == "general"
    assert rls.codes(*many) == (OVER, [OK, OVER, OK, OK])  # generic's 2 per minute are used up
    # a limit named in another matched limit's replaces is not checked
    assert rls.codes(descriptor(("plan", "gold")), descriptor(("generic", "g"))) == (OK, [OK, OK])
    # wildcard value: matching values each have a bucket, others do not match
    for _ in range(4):
        assert rls.codes(descriptor(("tenant", "acme-1")))[0] == OK
    assert rls.codes(descriptor(("tenant", "acme-1")))[0] == OVER
    assert rls.codes(descriptor(("tenant", "acme-2")))[0] == OK
    assert rls.codes(descriptor(("tenant", "other")))[1] == [OK]


def test_hits_addend_is_the_cost(served) -> None:
    cp, rls = served
    clear_of_minute_edge()
    r = rls.ask(descriptor(("budget", "h")), hits=2)
    assert (r.overall_code, r.statuses[0].limit_remaining) == (OK, 3)
    # the descriptor's own hits_addend wins over the request's
    r = rls.ask(descriptor(("budget", "h"), hits=3), hits=2)
    assert (r.overall_code, r.statuses[0].limit_remaining) == (OK, 0)
    assert rls.codes(descriptor(("budget", "h")))[0] == OVER
    # more than the limit can ever allow: over the limit, not an error
    assert rls.codes(descriptor(("budget", "other")), hits=6)[0] == OVER
    # the request's own hits_addend of 0 means 1 (as the proto says)
    r = rls.ask(descriptor(("budget", "r")), hits=0)
    assert (r.overall_code, r.statuses[0].limit_remaining) == (OK, 4)
    # past the exact bound (10^9 a call): over, nothing charged, counted as a bad cost
    for _ in range(2):
        assert rls.codes(descriptor(("budget", "big"), hits=10**9 + 1))[0] == OVER
    r = rls.ask(descriptor(("budget", "big"), hits=1))
    assert (r.overall_code, r.statuses[0].limit_remaining) == (OK, 4)
    text = httpx.get(cp.url + "/metrics", timeout=10).text
    assert metric_value(text, "rate_limit_envoy_bad_costs_total", reason="too_large") == 2


def test_shadow_answers_ok_and_is_compared_then_enforce_rejects(served) -> None:
    cp, rls = served
    clear_of_minute_edge(15)
    login = descriptor(("path", "/login"))
    assert [rls.codes(login)[0] for _ in range(5)] == [OK] * 5  # 2 per minute, but in shadow

    def compared() -> int:
        routes = httpx.get(cp.url + "/v1/routes", timeout=10).json()["routes"]
        div = next(r for r in routes if r["name"] == "edge/path=%2Flogin")["divergence_5m"]
        return int(div["compared"])

    wait_until(lambda: compared() == 5, timeout=15, what="the 5 shadow decisions were compared")
    set_mode(cp, "edge/path=%2Flogin", "enforce")
    assert rls.codes(login)[0] == OVER  # the distributed bucket saw the 5 requests


def test_invalid_requests_are_refused_with_invalid_argument(served) -> None:
    _, rls = served
    cases = [
        rls_pb2.RateLimitRequest(domain="", descriptors=[descriptor(("a", "b"))]),
        rls_pb2.RateLimitRequest(domain="edge"),
        rls_pb2.RateLimitRequest(domain="edge", descriptors=[descriptor(("a", "b"))] * 65),
    ]
    for req in cases:
        with pytest.raises(grpc.RpcError) as err:
            rls.stub.ShouldRateLimit(req, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:  # bounded: the message size
        rls.ask(descriptor(("remote_address", "x" * 70_000)))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # an unknown domain has no limits (as envoyproxy/ratelimit)
    assert rls.codes(descriptor(("remote_address", "1")), domain="other") == (OK, [OK])


RLS_PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


def list_services(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] = ()) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    requests = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    reply = next(iter(stub.ServerReflectionInfo(requests, timeout=10, metadata=metadata)))
    return {s.name for s in reply.list_services_response.service}


def test_health_and_no_reflection_by_default(served) -> None:
    _, rls = served
    health = health_pb2_grpc.HealthStub(rls.channel)
    for service in ("", "envoy.service.ratelimit.v3.RateLimitService"):
        got = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert got.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as err:
        list_services(rls.channel)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_reflection_when_switched_on_needs_the_client_token_as_every_method_but_health(redis_url, envoy_file) -> None:
    cp = serve(redis_url, envoy_file, grpc_reflection=True, client_token="grpc-client-token-0123")
    rls = Rls(cp.settings.grpc_port)
    try:
        health = health_pb2_grpc.HealthStub(rls.channel)  # health: no token needed
        assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == 1
        with pytest.raises(grpc.RpcError) as err:
            list_services(rls.channel)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        names = list_services(rls.channel, (("authorization", "Bearer grpc-client-token-0123"),))
        assert "envoy.service.ratelimit.v3.RateLimitService" in names and "grpc.health.v1.Health" in names
    finally:
        rls.close()
        cp.stop()


# --------------------------------------------------------------------------- #
# configuration


def route_names(cp: ControlPlaneServer) -> list[str]:
    return [r["name"] for r in httpx.get(cp.url + "/v1/routes", timeout=10).json()["routes"]]


def test_config_reload_and_a_bad_config_kept_out(served, envoy_file) -> None:
    cp, rls = served
    clear_of_minute_edge(15)
    envoy_file.write_text(CONFIG + "  - key: fresh\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
    wait_until(lambda: "edge/fresh" in route_names(cp), timeout=15, what="the new descriptor became a route")
    assert rls.codes(descriptor(("fresh", "x"))) == (OK, [OK])
    assert rls.codes(descriptor(("fresh", "x"))) == (OVER, [OVER])
    # a bad version: the last good configuration stays, the error names the file and line
    envoy_file.write_text(CONFIG + "  - key: fresh\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")

    def error() -> str | None:
        return httpx.get(cp.url + "/v1/routes", timeout=10).json()["rules_error"]

    wait_until(lambda: error() is not None, timeout=15, what="the bad config was reported")
    assert f"{envoy_file}:22: descriptors[7].rate_limit.unit" in (error() or "")
    assert "edge/fresh" in route_names(cp)
    assert rls.codes(descriptor(("fresh", "x"))) == (OVER, [OVER])
    metrics = httpx.get(cp.url + "/metrics", timeout=10).text
    assert metric_value(metrics, "rate_limit_rules_valid") == 0
    envoy_file.write_text(CONFIG)  # back to a good one: the route goes, the error too
    wait_until(lambda: "edge/fresh" not in route_names(cp) and error() is None, timeout=15, what="reloaded")
    assert rls.codes(descriptor(("fresh", "x"))) == (OK, [OK])  # no limit any more


def test_a_directory_of_files_one_domain_each(redis_url, tmp_path) -> None:
    d = tmp_path / "config"
    d.mkdir()
    (d / "a.yaml").write_text(
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
    )
    (d / "b.yml").write_text(
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
    )
    (d / "notes.txt").write_text("not a config")
    cp = serve(redis_url, d)
    rls = Rls(cp.settings.grpc_port)
    try:
        assert {"a/k", "b/k"} <= set(route_names(cp))
        assert rls.codes(descriptor(("k", "1")), domain="b") == (OK, [OK])
        assert rls.codes(descriptor(("k", "1")), domain="b") == (OVER, [OVER])
        r = rls.ask(descriptor(("k", "1")), domain="a")
        assert r.statuses[0].current_limit.unit == Response.RateLimit.SECOND
    finally:
        rls.close()
        cp.stop()


# --------------------------------------------------------------------------- #
# Redis down: the failure policy answers, never a gRPC error


@pytest.mark.parametrize(("policy", "expected"), [("failClosed", OVER), ("passThrough", OK)])
def test_redis_down_the_failure_policy_answers(envoy_file, policy, expected) -> None:
    """...and keeps answering: the automatic rollback to shadow (which would lift an Envoy
    limit altogether) leaves Envoy routes alone."""
    redis = EmbeddedRedis().start()
    cp = serve(redis.url, envoy_file, failure_policy=policy, redis_command_timeout_s=0.2, auto_rollback_after_s=1)
    rls = Rls(cp.settings.grpc_port)
    try:
        assert rls.codes(descriptor(("budget", "d")))[0] == OK
        redis.stop()
        answers = [rls.codes(descriptor(("budget", "d")))[0] for _ in range(3)]
        assert answers == [expected] * 3
        time.sleep(2.5)  # past auto_rollback_after_s with the breaker open
        answers = [rls.codes(descriptor(("budget", "d")))[0] for _ in range(3)]
        assert answers == [expected] * 3
        routes = httpx.get(cp.url + "/v1/routes", timeout=10).json()["routes"]
        budget = next(r for r in routes if r["name"] == "edge/budget")
        assert budget["state"]["mode"] == "enforce"
    finally:
        rls.close()
        cp.stop()
        redis.stop()


# --------------------------------------------------------------------------- #
# `shadowlimit serve` as a user runs it


def _serve_env(redis_url: str, **extra: str) -> dict[str, str]:

    env = clean_env()
    env.update({"RATE_LIMIT_REDIS_URL": redis_url, "SHADOWLIMIT_PORT": str(free_port())}, **extra)
    return env


def _shadowlimit() -> str:
    import sys

    return str(Path(sys.executable).parent / "shadowlimit")


def test_serve_refuses_a_bad_config_a_missing_one_and_a_busy_port(redis_url, tmp_path) -> None:
    import socket
    import subprocess

    def serve(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [_shadowlimit(), "serve", "--log-level", "warning", *args],
            env=_serve_env(redis_url, **env),
            capture_output=True,
            text=True,
            timeout=60,
        )

    on = {"ENABLE_DISTRIBUTED_RATE_LIMITING": "true"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.replace("requests_per_unit: 3", "requests_per_unit: -3"))
    proc = serve("--grpc-port", str(free_port()), SHADOWLIMIT_ENVOY_CONFIG=str(bad), **on)
    assert proc.returncode == 2, proc.stderr
    assert f"{bad}:4: descriptors[0].rate_limit.requests_per_unit: must be a whole number, got '-3'" in proc.stderr
    proc = serve("--grpc-port", str(free_port()), **on)
    assert proc.returncode == 2 and "SHADOWLIMIT_ENVOY_CONFIG" in proc.stderr, proc.stderr
    good = tmp_path / "good.yaml"
    good.write_text(CONFIG)
    # the kill switch off would make every Envoy route count per replica: refused
    proc = serve("--grpc-port", str(free_port()), SHADOWLIMIT_ENVOY_CONFIG=str(good))
    assert proc.returncode == 2 and "ENABLE_DISTRIBUTED_RATE_LIMITING=true" in proc.stderr, proc.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = serve("--grpc-port", str(port), SHADOWLIMIT_ENVOY_CONFIG=str(good), **on)
        assert proc.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr, proc.stderr
        proc = serve("--grpc-port", str(port), "--port", str(port), SHADOWLIMIT_ENVOY_CONFIG=str(good), **on)
        assert proc.returncode == 2 and "is SHADOWLIMIT_PORT too" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_with_grpc_port_answers_envoy_and_stops_cleanly(redis_url, envoy_file) -> None:
    import signal
    import subprocess

    grpc_port = free_port()
    env = _serve_env(redis_url, SHADOWLIMIT_ENVOY_CONFIG=str(envoy_file), ENABLE_DISTRIBUTED_RATE_LIMITING="true")
    proc = subprocess.Popen(
        [_shadowlimit(), "serve", "--grpc-port", str(grpc_port), "--log-level", "info"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    rls = Rls(grpc_port)
    try:
        health = health_pb2_grpc.HealthStub(rls.channel)
        wait_until(
            lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1, 30, 0.1, "gRPC serving"
        )
        clear_of_minute_edge()
        codes = [rls.codes(descriptor(("remote_address", "serve")))[0] for _ in range(4)]
        assert codes == [OK, OK, OK, OVER]
    finally:
        rls.close()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert f"Envoy rate limit service (gRPC) on 127.0.0.1:{grpc_port}" in err
    assert "Traceback" not in err


def test_envoy_route_names_work_in_the_cli_the_dashboard_client_and_the_access_check(
    redis_url, envoy_file, tmp_path, capsys
) -> None:
    """Route names hold '/', '=' and '%': the CLI and the dashboard encode them, the server
    decodes them once, and the mode change still needs the operator role."""
    import asyncio
    import hashlib

    from control_plane.cli import main
    from dashboard.client import ControlPlaneClient, Unauthorized

    tokens = tmp_path / "tokens"
    sha = {n: hashlib.sha256(f"{n}-token-0123456789".encode()).hexdigest() for n in ("vera", "olga")}
    tokens.write_text(f"vera viewer {sha['vera']}\nolga operator {sha['olga']}\n")
    cp = serve(redis_url, envoy_file, tokens_file=str(tokens))
    try:
        route = "edge/path=%2Flogin"
        code = main(
            [
                "mode",
                route,
                "enforce",
                "--force",
                "--reason",
                "cli",
                "--url",
                cp.url,
                "--token",
                "olga-token-0123456789",
            ]
        )
        out, err = capsys.readouterr()
        assert code == 0, err

        async def flip(token: str) -> str:
            client = ControlPlaneClient(cp.url, token)
            try:
                result = await client.set_mode(route, "shadow", reason="dashboard", force=True)
                return str(result.state.mode)
            finally:
                await client.aclose()

        assert asyncio.run(flip("olga-token-0123456789")) == "shadow"
        with pytest.raises(Unauthorized):
            asyncio.run(flip("vera-token-0123456789"))  # a viewer cannot, whatever the name holds
        r = httpx.put(f"{cp.url}/v1/routes/edge/path=%252Flogin/mode", json={"mode": "off", "reason": "x"}, timeout=10)
        assert r.status_code == 401  # unencoded slashes reach the same route, and the same check
        r = httpx.put(
            f"{cp.url}/v1/routes/edge%2Fnope/mode",
            json={"mode": "off", "reason": "x"},
            headers={"Authorization": "Bearer olga-token-0123456789"},
            timeout=10,
        )
        assert r.status_code == 404 and r.json()["field"] == "route"
        audit = httpx.get(
            cp.url + "/v1/rollout/audit",
            params={"route": route},
            headers={"Authorization": "Bearer vera-token-0123456789"},
            timeout=10,
        )
        assert [e["to"] for e in audit.json()["entries"]][:2] == ["shadow", "enforce"]
    finally:
        cp.stop()


def test_quota_mode_and_headers_on_an_ok_answer(redis_url, tmp_path) -> None:
    """Quota descriptors make the answer OVER_LIMIT only when all of them are over; an OK
    answer never carries Retry-After."""
    config = tmp_path / "quota.yaml"
    config.write_text(
        "domain: q\ndescriptors:\n"
        "  - key: a\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
        "  - key: b\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
    )
    cp = serve(redis_url, config, envoy_response_headers="draft")
    rls = Rls(cp.settings.grpc_port)
    try:
        clear_of_minute_edge()
        both = (descriptor(("a", "1")), descriptor(("b", "1")))
        assert rls.codes(*both, domain="q") == (OK, [OK, OK])
        r = rls.ask(*both, domain="q")  # a is over, b is not: still OK
        assert (r.overall_code, [s.code for s in r.statuses]) == (OK, [OVER, OK])
        assert "Retry-After" not in {h.key for h in r.response_headers_to_add}
        r = rls.ask(*both, domain="q")
        assert (r.overall_code, [s.code for s in r.statuses]) == (OVER, [OVER, OVER])
        assert "Retry-After" in {h.key for h in r.response_headers_to_add}
    finally:
        rls.close()
        cp.stop()


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_a_compressing_grpcio_client_is_answered(served, compression) -> None:
    cp, _ = served
    channel = grpc.insecure_channel(f"127.0.0.1:{cp.settings.grpc_port}", compression=compression)
    try:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        req = rls_pb2.RateLimitRequest(domain="edge", descriptors=[descriptor(("budget", f"z{compression}"))])
        call = stub.ShouldRateLimit.with_call(req, timeout=10)
        assert call[0].overall_code == OK and call[1].code() == grpc.StatusCode.OK
        # a big request compresses: an uncompressed server would refuse what it cannot read
        many = [descriptor(("tenant", "acme-" + "x" * 200)) for _ in range(60)]
        r = stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="edge", descriptors=many), timeout=10)
        assert len(r.statuses) == 60
    finally:
        channel.close()


def test_an_unreadable_grpc_timeout_is_internal_as_grpcio_answers(served) -> None:
    from h2_client import H2Client

    cp, _ = served
    req = rls_pb2.RateLimitRequest(domain="edge", descriptors=[descriptor(("budget", "t"))]).SerializeToString()

    async def calls() -> list[int | None]:
        c = await H2Client().connect(cp.settings.grpc_port)
        out = []
        for bad in ("garbage", "-1S", "1.5S", ""):
            a = await c.call(RLS_PATH, req, extra=[("grpc-timeout", bad)])
            out.append(a.status)
        ok = await c.call(RLS_PATH, req, extra=[("grpc-timeout", "5S")])
        out.append(ok.status)
        await c.close()
        return out

    assert asyncio.run(calls()) == [13, 13, 13, 13, 0]


def test_client_token_guards_the_grpc_port_too(redis_url, envoy_file) -> None:
    cp = serve(redis_url, envoy_file, client_token="grpc-client-token-0123")
    rls = Rls(cp.settings.grpc_port)
    try:
        req = rls_pb2.RateLimitRequest(domain="edge", descriptors=[descriptor(("budget", "t"))])
        with pytest.raises(grpc.RpcError) as err:
            rls.stub.ShouldRateLimit(req, timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            rls.stub.ShouldRateLimit(req, timeout=10, metadata=(("authorization", "Bearer wrong"),))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        r = rls.stub.ShouldRateLimit(req, timeout=10, metadata=(("authorization", "Bearer grpc-client-token-0123"),))
        assert r.overall_code == OK
    finally:
        rls.close()
        cp.stop()


def test_envoy_routes_refuse_runtime_adjustments_and_reset_keys_with_slashes(served) -> None:
    from urllib.parse import quote

    cp, rls = served
    r = httpx.put(
        cp.url + "/ratelimit/config",
        json={"route": "edge/budget", "average": 50, "period": 60, "reason": "no"},
        headers=admin_headers(),
        timeout=10,
    )
    assert r.status_code == 422 and r.json()["field"] == "route" and "SHADOWLIMIT_ENVOY_CONFIG" in r.json()["message"]
    clear_of_minute_edge()
    for _ in range(5):
        rls.ask(descriptor(("budget", "/a/b")))
    assert rls.codes(descriptor(("budget", "/a/b")))[0] == OVER
    r = httpx.post(
        f"{cp.url}/ratelimit/reset/{quote('/a/b', safe='')}",
        params={"route": "edge/budget"},
        headers=admin_headers(),
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert rls.codes(descriptor(("budget", "/a/b")))[0] == OK
