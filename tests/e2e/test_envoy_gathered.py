"""Envoy's calls that arrive in one read are decided together (``ShouldRateLimit`` is a
``gathered`` method: control_plane/envoy/service.py), against ``shadowlimit serve --grpc-port``
on real Redis, over a raw socket that writes the calls at once:

* every limited descriptor of them is one burst to Redis (calls under one limit: one EVALSHA,
  ``INFO commandstats``, of the script for many keys), and each call's answer is the one it
  gets alone, in the order the calls were written (a key over its limit part way through the
  read is OK, then OVER);
* a call's own mistake (bytes that are not a RateLimitRequest, a per-request limit override) is
  its own INVALID_ARGUMENT; the other calls of the read are answered;
* the read's calls share the earliest deadline: with Redis stalled, a call of 2 s and one of
  60 ms in one read are both answered by the failure policy within the 60 ms one's."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis as redis_sync
from envoy.service.ratelimit.v3 import rls_pb2
from h2_raw import DATA, HEADERS, RawConn, grpc_frame, raw_frame
from rls_client import OK, OVER, descriptor, serve, set_mode
from test_envoy_deadlines import Stall, debug_redis  # noqa: F401 - a fixture: a redis-server of its own

pytestmark = pytest.mark.timeout(120)

END_STREAM, END_HEADERS = 0x1, 0x4
CONFIG = """\
domain: gather
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: wide
    rate_limit: {unit: second, requests_per_unit: 1000000}
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return path


def request(*descriptors: tuple[str, str], domain: str = "gather", override: bool = False) -> bytes:
    req = rls_pb2.RateLimitRequest(domain=domain, descriptors=[descriptor(d) for d in descriptors])
    if override:
        req.descriptors[0].limit.requests_per_unit = 5
    return grpc_frame(req.SerializeToString())


def one_write(conn: RawConn, messages: list[bytes], timeouts: list[str | None] | None = None) -> list[int]:
    """The calls' HEADERS and DATA in one write; their stream ids."""
    sids, out = [], bytearray()
    for i, message in enumerate(messages):
        sid = 2 * i + 1
        extra = (("grpc-timeout", timeouts[i]),) if timeouts and timeouts[i] else ()
        out += raw_frame(HEADERS, END_HEADERS, sid, conn.encode(conn.grpc_headers(extra=extra)))
        out += raw_frame(DATA, END_STREAM, sid, message)
        sids.append(sid)
    conn.send(bytes(out))
    return sids


def codes(conn: RawConn, sids: list[int]) -> list[int | str]:
    """Each call's overall code, or its gRPC status where it failed."""
    out: list[int | str] = []
    for sid in sids:
        answer = conn.answer(sid, timeout=10)
        if answer.grpc_status:
            out.append(f"status {answer.grpc_status}")
        else:
            out.append(rls_pb2.RateLimitResponse.FromString(answer.messages()[0]).overall_code)
    return out


def evalsha(url: str) -> int:
    stats = redis_sync.Redis.from_url(url).info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def test_the_calls_of_one_read_are_one_burst_to_redis_each_answered_as_alone(debug_redis, config) -> None:  # noqa: F811
    cp = serve(debug_redis.url, config)
    try:
        for route in ("gather/tenant", "gather/wide"):
            set_mode(cp, route, "enforce")
        conn = RawConn(cp.settings.grpc_port, timeout=10)
        conn.handshake()
        # HPACK's table settles, the scripts are loaded
        assert codes(conn, one_write(conn, [request(("wide", "warm"))])) == [OK]
        before = evalsha(debug_redis.url)
        messages = [request(("tenant", "acme")) for _ in range(5)]
        messages.insert(2, b"\x00\x00\x00\x00\x03abc")  # not a RateLimitRequest
        messages.insert(4, request(("tenant", "acme"), override=True))  # a per-request limit override
        conn2 = RawConn(cp.settings.grpc_port, timeout=10)
        conn2.handshake()
        got = codes(conn2, one_write(conn2, messages))
        # acme's 3 a minute spent by the first three valid calls of the read, in their order
        assert got == [OK, OK, "status 3", OK, "status 3", OVER, OVER], got
        assert evalsha(debug_redis.url) - before == 1  # five calls, one call of the script for many
        conn.close()
        conn2.close()
    finally:
        cp.stop()


def test_a_reads_calls_share_the_earliest_deadline(debug_redis, config) -> None:  # noqa: F811
    cp = serve(debug_redis.url, config)
    try:
        set_mode(cp, "gather/wide", "enforce")
        conn = RawConn(cp.settings.grpc_port, timeout=10)
        conn.handshake()
        assert codes(conn, one_write(conn, [request(("wide", "warm"))])) == [OK]
        with Stall(debug_redis.url, 1.0):
            t0 = time.perf_counter()
            sids = [2 * i + 3 for i in range(2)]
            out = bytearray()
            for sid, timeout in zip(sids, ("2S", "60m"), strict=True):
                block = conn.encode(conn.grpc_headers(extra=(("grpc-timeout", timeout),)))
                out += raw_frame(HEADERS, END_HEADERS, sid, block)
                out += raw_frame(DATA, END_STREAM, sid, request(("wide", f"late{sid}")))
            conn.send(bytes(out))
            got = codes(conn, sids)
            took = time.perf_counter() - t0
        assert got == [OK, OK], got  # the failure policy (passThrough) answered both
        assert took < 0.06 + 0.1, f"answered after {took * 1000:.0f} ms"  # the 60 ms call's deadline, and slack
        conn.close()
    finally:
        cp.stop()
