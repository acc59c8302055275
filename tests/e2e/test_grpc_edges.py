"""The gRPC port's edges, against ``shadowlimit serve --grpc-port`` in its own process
(envoyproxy/ratelimit's example configuration, real Redis):

* a grpcio channel with gzip compression is answered, and every answer says
  ``grpc-accept-encoding`` (gzip among them); a gzip-compressed message over a raw socket too;
* an unparseable ``grpc-timeout`` (``garbage``, ``-1S``, ``1.5S``, empty) is INTERNAL, as grpcio
  answers; the connection goes on;
* a length prefix over the message limit (64 KiB) is RESOURCE_EXHAUSTED at once, the body never sent;
* reflection is off by default (UNIMPLEMENTED); with ``SHADOWLIMIT_CLIENT_TOKEN`` set, every
  method but health needs the token (UNAUTHENTICATED without it);
* the metrics of the HTTP port's ``/metrics``: ``rate_limit_grpc_connections`` (open connections)
  and ``rate_limit_grpc_protocol_errors_total{kind}``, every kind at 0 from the start, each
  counting what it names; protocol refusals never count as ``overloaded`` rate limit answers.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cp_server import wait_until
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from h2_raw import (
    DATA,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    PING,
    SETTINGS,
    WINDOW_UPDATE,
    ErrorCodes,
    RawConn,
    grpc_frame,
    raw_frame,
    rls_message,
)  # fmt: skip
from hostile import KINDS, protocol_errors, served_with
from rls_client import descriptor
from rls_served import RlsServed

pytestmark = pytest.mark.timeout(120)

E = ErrorCodes
TOKEN = "client-token-0123456789abcdef"
RLS_REQUEST = rls_pb2.RateLimitRequest(domain="rl", descriptors=[descriptor(("qux", "edges"))])


@pytest.fixture(scope="module")
def served(redis_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RlsServed]:
    """The defaults (reflection off, no client token), and the metrics as they were at the start."""
    with served_with(redis_server.url, Path(tmp_path_factory.mktemp("edges"))) as server:
        server.initial_metrics = server.metrics()  # type: ignore[attr-defined]
        yield server


def test_a_grpcio_channel_with_gzip_is_answered(served: RlsServed) -> None:
    addr = f"127.0.0.1:{served.grpc_port}"
    with grpc.insecure_channel(addr, compression=grpc.Compression.Gzip) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        codes = [stub.ShouldRateLimit(RLS_REQUEST, timeout=5).overall_code for _ in range(5)]
    assert codes == [rls_pb2.RateLimitResponse.OK] * 5
    conn = RawConn(served.grpc_port)
    conn.handshake()
    conn.request(1)
    plain = conn.answer(1)
    conn.request(3, rls_message(gzipped=True), block=conn.encode(conn.grpc_headers(extra=(("grpc-encoding", "gzip"),))))
    zipped = conn.answer(3)
    conn.close()
    assert plain.grpc_status == 0 and zipped.grpc_status == 0, conn.seen()
    accepted = [e.strip() for e in (plain.header("grpc-accept-encoding") or "").split(",")]
    assert "gzip" in accepted, f"grpc-accept-encoding: {plain.headers}"
    assert zipped.data[:1] == b"\x00", "an answer compressed for a client that accepts no encoding"
    assert rls_pb2.RateLimitResponse.FromString(zipped.messages()[0]).overall_code == rls_pb2.RateLimitResponse.OK


@pytest.mark.parametrize("value", ["garbage", "-1S", "1.5S", ""])
def test_an_unparseable_grpc_timeout_is_internal(served: RlsServed, value: str) -> None:
    conn = RawConn(served.grpc_port)
    conn.handshake()
    conn.request(1, block=conn.encode(conn.grpc_headers(extra=(("grpc-timeout", value),))))
    bad = conn.answer(1)
    conn.request(3, block=conn.encode(conn.grpc_headers(extra=(("grpc-timeout", "5S"),))))
    good = conn.answer(3)
    conn.close()
    assert bad.grpc_status == 13, f"grpc-timeout {value!r}: {conn.seen()}"
    assert good.grpc_status == 0 and good.messages(), f"a valid grpc-timeout after it: {conn.seen()}"


def test_a_length_prefix_over_the_limit_is_resource_exhausted_before_the_body(served: RlsServed) -> None:
    conn = RawConn(served.grpc_port)
    conn.handshake()
    conn.headers(1, conn.encode(conn.grpc_headers()))
    conn.data(1, grpc_frame(b"", length=64 * 1024 + 1))  # the prefix alone, no END_STREAM: the body never comes
    answer = conn.answer(1, timeout=2)
    conn.close()
    assert answer.grpc_status == 8, f"not RESOURCE_EXHAUSTED within 2 s: {conn.seen()}"


def test_reflection_is_off_by_default(served: RlsServed) -> None:
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.ServerReflectionInfo(iter([request]), timeout=5))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_with_a_client_token_every_method_but_health_needs_it(redis_server, tmp_path: Path) -> None:
    env = {"SHADOWLIMIT_CLIENT_TOKEN": TOKEN, "SHADOWLIMIT_GRPC_REFLECTION": "true"}
    with served_with(redis_server.url, tmp_path, **env) as server:
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            rls = rls_pb2_grpc.RateLimitServiceStub(channel)
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            listing = reflection_pb2.ServerReflectionRequest(list_services="")
            token = [("authorization", f"Bearer {TOKEN}")]
            for call in (
                lambda md: rls.ShouldRateLimit(RLS_REQUEST, timeout=5, metadata=md),
                lambda md: list(reflection.ServerReflectionInfo(iter([listing]), timeout=5, metadata=md)),
            ):
                with pytest.raises(grpc.RpcError) as err:
                    call(None)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(grpc.RpcError) as err:
                    call([("authorization", "Bearer not-the-token")])
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert call(token)
            listed = list(reflection.ServerReflectionInfo(iter([listing]), timeout=5, metadata=token))
            names = {s.name for s in listed[0].list_services_response.service}
            assert "envoy.service.ratelimit.v3.RateLimitService" in names
            serving = health_pb2.HealthCheckResponse.SERVING
            assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == serving
            watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert next(watch).status == serving
            watch.cancel()


# -- metrics --------------------------------------------------------------------------------------


def test_the_protocol_metrics_exist_at_zero_from_the_start(served: RlsServed) -> None:
    text = served.initial_metrics  # type: ignore[attr-defined]
    for kind in KINDS:
        sample = rf'^rate_limit_grpc_protocol_errors_total\{{kind="{kind}"\}} 0(\.0)?$'
        assert re.search(sample, text, re.M), f"rate_limit_grpc_protocol_errors_total{{kind={kind!r}}} not at 0"
    assert re.search(r"^# TYPE rate_limit_grpc_connections gauge$", text, re.M), "no gauge rate_limit_grpc_connections"
    assert re.search(r"^rate_limit_grpc_connections \d", text, re.M)


def test_the_connections_gauge_counts_open_connections(served: RlsServed) -> None:
    def gauge() -> float:
        return served.metric("rate_limit_grpc_connections")

    def steady() -> bool:  # the connections of earlier tests may still be closing
        first = gauge()
        time.sleep(0.5)
        return gauge() == first

    wait_until(steady, 10, what="a steady gauge")
    start = gauge()
    conns = [RawConn(served.grpc_port) for _ in range(10)]
    for conn in conns:
        conn.handshake()
    wait_until(lambda: gauge() == start + 10, 10, what=f"rate_limit_grpc_connections {start + 10:.0f}")
    for conn in conns:
        conn.close()
    wait_until(lambda: gauge() == start, 10, what=f"rate_limit_grpc_connections back to {start:.0f}")


def _goaway(conn: RawConn) -> None:
    conn.until(lambda: conn.goaway is not None, 3)


def _protocol(conn: RawConn) -> None:
    conn.send(raw_frame(PING, 0, 1, b"\x00" * 8))  # PING on a stream
    _goaway(conn)


def _frame_size(conn: RawConn) -> None:
    conn.send(raw_frame(PING, 0, 0, b"\x00" * 6))  # a PING of 6 octets
    _goaway(conn)


def _compression(conn: RawConn) -> None:
    conn.send(raw_frame(HEADERS, 0x5, 1, b"\x40"))  # a header block HPACK cannot decode
    _goaway(conn)


def _flow_control(conn: RawConn) -> None:
    conn.send(raw_frame(WINDOW_UPDATE, 0, 0, (2**31 - 1).to_bytes(4, "big")) * 2)  # the window past 2^31-1
    _goaway(conn)


def _stream_closed(conn: RawConn) -> None:
    conn.request(1)
    conn.answer(1)
    conn.headers(1, conn.encode(conn.grpc_headers()), end_stream=True)  # HEADERS on a closed stream
    _goaway(conn)


def _reset_received(conn: RawConn) -> None:
    conn.headers(1, conn.encode(conn.grpc_headers()))
    conn.rst(1, E.CANCEL)
    conn.request(3)
    conn.answer(3)


def _reset_sent(conn: RawConn) -> None:
    conn.request(1)
    assert conn.answer(1).grpc_status == 0, conn.seen()
    conn.data(1, b"after the answer", end_stream=True)  # DATA on a closed stream: STREAM_CLOSED
    conn.until(lambda: conn.answers[1].reset is not None, 3)
    assert conn.answers[1].reset == E.STREAM_CLOSED, f"no RST_STREAM STREAM_CLOSED: {conn.seen()}"


def _refused(conn: RawConn) -> None:
    most = conn.settings.get(MAX_CONCURRENT_STREAMS, 4096)
    conn.send(raw_frame(SETTINGS, 0, 0, (INITIAL_WINDOW_SIZE).to_bytes(2, "big") + (0).to_bytes(4, "big")))
    first, again = conn.encode(conn.grpc_headers()), conn.encode(conn.grpc_headers())
    message = rls_message()
    conn.send(
        b"".join(
            raw_frame(HEADERS, 0x4, sid, first if sid == 1 else again) + raw_frame(DATA, 0x1, sid, message)
            for sid in range(1, 2 * most + 4, 2)
        )
    )
    conn.until(lambda: any(a.reset == E.REFUSED_STREAM for a in conn.answers.values()), 10)


def _bad_header(conn: RawConn) -> None:
    conn.request(1, block=conn.encode([*conn.grpc_headers(), ("X-Upper", "case")]))
    conn.until(lambda: conn.answers.get(1) is not None and conn.answers[1].ended, 3)


KIND_SCENARIOS = {
    "goaway_protocol_error": _protocol,
    "goaway_frame_size_error": _frame_size,
    "goaway_compression_error": _compression,
    "goaway_flow_control_error": _flow_control,
    "goaway_stream_closed": _stream_closed,
    "reset_received": _reset_received,
    "reset_sent": _reset_sent,
    "refused_stream": _refused,
    "bad_header": _bad_header,
}


@pytest.mark.parametrize("kind", list(KIND_SCENARIOS))
def test_each_protocol_error_is_counted_by_its_kind_never_as_overloaded(served: RlsServed, kind: str) -> None:
    """What the kind names, done once on a connection of its own (the RFC 9113 errors of the
    conformance cases): its counter grows; ``overloaded`` does not."""
    before = protocol_errors(served)
    overloaded = served.metric("rate_limit_envoy_requests_total", code="overloaded")
    conn = RawConn(served.grpc_port, timeout=5)
    conn.handshake()
    KIND_SCENARIOS[kind](conn)
    conn.close()
    wait_until(lambda: protocol_errors(served)[kind] > before[kind], 5, what=f"{kind} counted")
    assert served.metric("rate_limit_envoy_requests_total", code="overloaded") == overloaded
