"""Connections to the gRPC port are bounded, against ``shadowlimit serve --grpc-port`` in its own
process (a server per test, with its settings), while an honest grpcio client calls every 20 ms
(tests/hostile.py: no failed call, p99 under 100 ms, RSS growth under 64 MB):

* 20,000 connections that send the preface and then nothing (fewer if this process's hard
  RLIMIT_NOFILE is lower: what it allows, said in the output): with
  ``SHADOWLIMIT_GRPC_IDLE_TIMEOUT_S=2`` the server closes them (not before the timeout), and
  meanwhile a fresh grpcio client is answered and HTTP ``/readyz`` on the same process answers 200;
* the same with ``SHADOWLIMIT_GRPC_MAX_CONNECTIONS=100``: no more than 100 are held at once, the
  excess refused or closed, counted as ``connection_refused``;
* with ``SHADOWLIMIT_GRPC_KEEPALIVE_S=1`` the server PINGs its peers; one that never answers is
  closed (``keepalive_timeout``), one that answers keeps its connection and its calls.

The server is started before this process raises its own open-files limit: it gets the limit a
deployment gives it and must make do (raising its soft limit to the hard one itself).
"""

from __future__ import annotations

import resource
import socket
import time
from pathlib import Path

import grpc
import httpx
import pytest
from cp_server import wait_until
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health_pb2
from h2_flood import count_open, open_idle
from h2_raw import RawConn, grpc_frame
from hostile import Attack, protocol_errors, served_with
from rls_client import descriptor
from rls_served import RlsServed

pytestmark = pytest.mark.timeout(300)

WANTED = 20_000
OWN_FDS = 300  # what this process keeps open besides the idle connections
WATCH = "/grpc.health.v1.Health/Watch"
KEEPALIVE_WATCH_S = 8.0


def raise_nofile(wanted: int) -> int:
    """This process's soft open-files limit raised (to the hard limit at most); how many idle
    connections it can hold."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard == resource.RLIM_INFINITY else min(hard, wanted + OWN_FDS)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    n = min(wanted, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - OWN_FDS)
    if n < wanted:
        print(f"RLIMIT_NOFILE hard limit {hard}: {n} idle connections, not {wanted}")
    return n


def fresh_call(served: RlsServed, timeout: float) -> int:
    """A new grpcio channel's ShouldRateLimit (waiting for a connection up to ``timeout``)."""
    request = rls_pb2.RateLimitRequest(domain="rl", descriptors=[descriptor(("qux", "fresh"))])
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        return int(stub.ShouldRateLimit(request, timeout=timeout, wait_for_ready=True).overall_code)


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def readyz(served: RlsServed) -> int:
    return httpx.get(served.url + "/readyz", timeout=5).status_code


def closed_after(conn: RawConn, timeout: float) -> float | None:
    """Seconds until the server closed ``conn`` (None: still open after ``timeout``)."""
    t0 = time.monotonic()
    conn.until(lambda: False, timeout)
    return time.monotonic() - t0 if conn.closed else None


def test_idle_connections_are_closed_after_the_idle_timeout(redis_server, tmp_path: Path) -> None:
    with served_with(redis_server.url, tmp_path, SHADOWLIMIT_GRPC_IDLE_TIMEOUT_S="2") as served:
        n = raise_nofile(WANTED)
        probe = RawConn(served.grpc_port, timeout=5)
        probe.handshake()
        probe_closed = closed_after(probe, 10)
        before = protocol_errors(served)
        socks: list[socket.socket] = []
        try:
            with Attack(served) as attack:
                socks, failed = open_idle(served.grpc_port, n)
                held = count_open(socks)
                ready, fresh = readyz(served), fresh_call(served, 10)
                wait_until(lambda: count_open(socks) == 0, 30, interval=0.5, what="every idle connection closed")
        finally:
            close_all(socks)
        attack.check(rss_mb=64)
        after = protocol_errors(served)
    assert probe_closed is not None and 1.5 <= probe_closed <= 6, f"an idle connection closed after {probe_closed} s"
    assert ready == 200 and fresh == rls_pb2.RateLimitResponse.OK
    assert held > 0, "every connection closed at once, not after the idle timeout"
    assert after["idle_close"] - before["idle_close"] >= 1
    print(f"{len(socks)} idle connections ({failed} not established), {held} held at once; {attack.summary()}")


def test_connections_past_the_cap_are_refused_and_fresh_clients_still_answered(redis_server, tmp_path: Path) -> None:
    env = {"SHADOWLIMIT_GRPC_MAX_CONNECTIONS": "100", "SHADOWLIMIT_GRPC_IDLE_TIMEOUT_S": "5"}
    with served_with(redis_server.url, tmp_path, **env) as served:
        n = raise_nofile(WANTED)
        before = protocol_errors(served)
        socks: list[socket.socket] = []
        try:
            with Attack(served) as attack:  # the honest client holds one of the 100
                socks, failed = open_idle(served.grpc_port, n)
                time.sleep(0.5)
                held = count_open(socks)
                ready, fresh = readyz(served), fresh_call(served, 20)
                wait_until(lambda: count_open(socks) == 0, 30, interval=0.5, what="every idle connection closed")
        finally:
            close_all(socks)
        attack.check(rss_mb=64)
        after = protocol_errors(served)
    assert held <= 100, f"{held} idle connections held past a cap of 100"
    assert ready == 200 and fresh == rls_pb2.RateLimitResponse.OK
    assert after["connection_refused"] - before["connection_refused"] >= 1
    print(f"{len(socks)} idle connections ({failed} not established), {held} held; {attack.summary()}")


def _watching(served: RlsServed, *, ack_pings: bool) -> RawConn:
    """A connection with a health Watch call open on it (busy, not idle)."""
    conn = RawConn(served.grpc_port, timeout=5, ack_pings=ack_pings)
    conn.handshake()
    conn.headers(1, conn.encode(conn.grpc_headers(WATCH)))
    conn.data(1, grpc_frame(health_pb2.HealthCheckRequest(service="").SerializeToString()), end_stream=True)
    assert conn.until(lambda: 1 in conn.data_streams, 5), conn.seen()
    return conn


def test_keepalive_pings_close_a_peer_that_never_answers(redis_server, tmp_path: Path) -> None:
    """8 s of two peers with a call open, keepalive 1 s: the one that never answers is closed,
    the one that answers is PINGed again and again and keeps its connection and its call."""
    with served_with(redis_server.url, tmp_path, SHADOWLIMIT_GRPC_KEEPALIVE_S="1") as served:
        before = protocol_errors(served)
        silent, polite = _watching(served, ack_pings=False), _watching(served, ack_pings=True)
        first_ping = silent_closed = None
        t0 = time.monotonic()
        while time.monotonic() - t0 < KEEPALIVE_WATCH_S:
            silent.until(lambda: False, 0.1)
            polite.until(lambda: False, 0.1)
            if first_ping is None and silent.pings:
                first_ping = time.monotonic() - t0
            if silent_closed is None and silent.closed:
                silent_closed = time.monotonic() - t0
        after = protocol_errors(served)
        silent.close()
        polite.close()
    assert first_ping is not None and first_ping <= 3, f"no PING within 3 s (first after {first_ping})"
    assert silent_closed is not None, f"a peer that never answers PING still open after 8 s: {silent.seen()}"
    assert not polite.closed and polite.goaway is None and polite.pings >= 2, f"the answering peer: {polite.seen()}"
    assert polite.answers[1].reset is None and not polite.answers[1].ended
    assert after["keepalive_timeout"] - before["keepalive_timeout"] >= 1
