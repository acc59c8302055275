"""HTTP/2 conformance of the gRPC port: h2spec's cases (the Go tool summerwind/h2spec, whose
verdicts many servers are held to) ported to Python, one test per case under h2spec's id,
against ``shadowlimit serve --grpc-port`` in its own process (envoyproxy/ratelimit's example
configuration, real Redis), over raw sockets on loopback.

* ``http2/3.5`` .. ``http2/8.2`` (95 cases, RFC 7540's numbering as h2spec keeps it; each
  case's docstring names RFC 9113's section): the preface, frame sizes, HPACK errors, stream
  states and identifiers, concurrency, priorities, connection errors, settings values and their
  order, PING, GOAWAY, flow control, CONTINUATION, error codes, server push, and the message
  checks of RFC 9113 section 8 (tests/h2spec_http2.py, h2spec_frames.py, h2_message_checks.py);
* ``hpack/...`` (8 cases): RFC 7541's decoding errors are connection errors COMPRESSION_ERROR;
* ``generic/...`` (44 cases): each frame and HPACK representation used as meant is taken and
  the call answered (tests/h2spec_generic.py);
* ``rfc9113/...``: the field checks h2spec lacks (forbidden characters in names and values,
  connection-specific fields, a pseudo-header in trailers).

Verdicts are h2spec's (tests/h2_verdicts.py): "connection error X" passes on GOAWAY X or the
connection closed; "stream error X" on RST_STREAM X, or a connection error; a call must get a
HEADERS answer; nothing within 2 s fails. A gRPC call stands for h2spec's GET (HEADERS, then a
``RateLimitRequest`` in a DATA frame with END_STREAM).

Each message check (a malformed request: RFC 9113 8.1.1) runs once more with a stricter
verdict: a RST_STREAM PROTOCOL_ERROR on that stream, the connection kept and the next call on
it answered (:func:`test_a_malformed_request_is_a_stream_error_and_the_connection_goes_on`).

Every case runs once more against a loopback port whose each connection is a pair
(tests/grpc_twins.py): the transport as served (Envoy's unary calls read beside h2, whole
answers written beside it) answering the socket, and one where h2 reads and writes every frame,
fed the same reads; the two must write the same bytes, end alike and keep the same state
(:func:`test_h2spec_served_and_by_h2_alone_alike`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import h2_message_checks  # noqa: F401 - registers its cases
import h2spec_frames  # noqa: F401
import h2spec_generic  # noqa: F401
import h2spec_http2  # noqa: F401
import pytest
from grpc_twins import TwinServer
from h2_raw import RLS_PATH
from h2spec import CASES, Ctx
from rls_served import RlsServed

from control_plane.envoy.server import MAX_MESSAGE_BYTES
from control_plane.envoy.wire import Call, Limits, Method

pytestmark = pytest.mark.timeout(60)

MESSAGE_CHECKS = [cid for cid, c in CASES.items() if c.message_check]


@pytest.fixture(scope="module")
def served(redis_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RlsServed]:
    server = RlsServed(redis_server.url, Path(tmp_path_factory.mktemp("h2conformance"))).start()
    try:
        yield server
    finally:
        server.stop()


def _run(served: RlsServed, cid: str, *, strict: bool = False) -> None:
    """The case; then the server is alive and logged no traceback meanwhile (a worker of
    pytest-xdist runs one test at a time against its own server: what was logged is this case's)."""
    logged = len(served.stderr())
    ctx = Ctx(served.grpc_port, strict=strict, timeout=CASES[cid].timeout)
    try:
        CASES[cid].run(ctx)
    finally:
        ctx.close()
        assert served.alive(), "the server died"
        assert "Traceback" not in served.stderr()[logged:], served.stderr()[logged:][-3000:]


@pytest.fixture(scope="module")
def twins() -> Iterator[TwinServer]:
    async def ok(data: bytes, call: Call) -> bytes:
        return b"\x08\x01"  # RateLimitResponse{overall_code: OK}

    with TwinServer({RLS_PATH: Method("unary", ok)}, Limits(max_message_bytes=MAX_MESSAGE_BYTES)) as server:
        yield server


@pytest.mark.parametrize("cid", list(CASES))
def test_h2spec(served: RlsServed, cid: str) -> None:
    """One case of h2spec's (or RFC 9113's), as its docstring says (``CASES[cid].doc``)."""
    _run(served, cid)


@pytest.mark.parametrize("cid", MESSAGE_CHECKS)
def test_a_malformed_request_is_a_stream_error_and_the_connection_goes_on(served: RlsServed, cid: str) -> None:
    """RFC 9113 8.1.1: a malformed request is a stream error: RST_STREAM PROTOCOL_ERROR on its
    stream, never the connection's end; the next call on the same connection is answered."""
    _run(served, cid, strict=True)


def test_the_cases_are_h2specs_all_of_them() -> None:
    """Every case of h2spec's http2 (95), hpack (8) and generic (44) suites is here once."""
    by_spec = {spec: sum(cid.startswith(spec + "/") for cid in CASES) for spec in ("http2", "hpack", "generic")}
    assert by_spec == {"http2": 95, "hpack": 8, "generic": 44}, by_spec
    assert len(MESSAGE_CHECKS) >= 17 + 15


@pytest.mark.parametrize("strict", [False, True], ids=["h2spec", "strict"])
def test_h2spec_served_and_by_h2_alone_alike(twins: TwinServer, strict: bool) -> None:
    """Each case (and each message check with the strict verdict) against the pairs: its
    verdict holds, and every connection it opened was written and kept alike both ways."""
    for cid, case in CASES.items():
        if strict and not case.message_check:
            continue
        compared = twins.connections
        ctx = Ctx(twins.port, strict=strict, timeout=case.timeout)
        try:
            case.run(ctx)
        finally:
            ctx.close()
        assert twins.settled(), f"{cid}: a connection still open"
        assert twins.connections > compared, cid
        assert not twins.unequal, f"{cid}: " + "\n".join(twins.unequal[0])
