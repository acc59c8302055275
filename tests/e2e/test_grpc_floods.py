"""Hostile HTTP/2 clients against the gRPC port, windows and floods: what an attacker sends over
raw sockets to ``shadowlimit serve --grpc-port`` (its own process, envoyproxy/ratelimit's
example configuration, reflection on), each while an honest grpcio client calls every 20 ms
(tests/hostile.py: no failed call, p99 under 100 ms, no ``overloaded`` answer counted) and
with the server's RSS growth bounded (256 MB for the window attacks, 64 MB for the floods):

* reflection requests (about 50 bytes each, answers of up to 40 KB) from a client whose
  receive window is 0 and stays 0 (SETTINGS_INITIAL_WINDOW_SIZE 0, never a WINDOW_UPDATE), for
  12 s on two connections of 50 streams: no DATA past the window, memory bounded;
* 3 connections x 4,000 streams of 64 KiB of a message that never ends, sent within the
  windows the server grants (RFC 9113 6.9): the sender stalls, no error, memory bounded;
* the same sent past the connection's window (3 connections, one after the other): GOAWAY
  FLOW_CONTROL_ERROR on each (RFC 9113 6.9.1);
* floods of empty DATA frames, of CONTINUATION frames (16 KiB and empty) of a header block
  that never ends: GOAWAY ENHANCE_YOUR_CALM or PROTOCOL_ERROR;
* floods of PING and of SETTINGS frames from a client that never reads the acknowledgements:
  memory bounded (the server stops reading, or says GOAWAY).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_reflection.v1alpha import reflection_pb2
from h2_flood import Drain, FlowSender, Stream, blast
from h2_raw import (
    CONTINUATION,
    DATA,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_FRAME_SIZE,
    PING,
    RLS_PATH,
    SETTINGS,
    ErrorCodes,
    RawConn,
    grpc_frame,
    raw_frame,
    settings_payload,
)  # fmt: skip
from hostile import Attack, protocol_errors, served_with
from rls_served import RlsServed

pytestmark = pytest.mark.timeout(300)

E = ErrorCodes
END_STREAM, END_HEADERS = 0x1, 0x4
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
WINDOW_RSS_MB = 256
REFLECTION_S = 12


@pytest.fixture
def served(redis_server, tmp_path: Path) -> Iterator[RlsServed]:
    """A server of its own for each attack: what one leaves behind never meets the next."""
    with served_with(redis_server.url, tmp_path, SHADOWLIMIT_GRPC_REFLECTION="true") as server:
        yield server


def _headers(conn: RawConn, path: str, sids: range) -> dict[int, bytes]:
    """Each stream's HEADERS frame, without END_STREAM (the first block adds to HPACK's table,
    the others index it)."""
    first, again = conn.encode(conn.grpc_headers(path)), conn.encode(conn.grpc_headers(path))
    return {sid: raw_frame(HEADERS, END_HEADERS, sid, first if sid == sids[0] else again) for sid in sids}


def test_reflection_answers_a_window_of_zero_cannot_take_stay_bounded(served: RlsServed) -> None:
    listing = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
    symbol = "envoy.service.ratelimit.v3.RateLimitService"
    describe = reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol).SerializeToString()
    requests = grpc_frame(describe) * 9 + grpc_frame(listing)
    sender = FlowSender()
    with Attack(served) as attack:
        for _ in range(2):
            conn = RawConn(served.grpc_port, timeout=5, window_update=False)
            conn.handshake((INITIAL_WINDOW_SIZE, 0))
            sids = range(1, 101, 2)
            sender.add(conn, _headers(conn, REFLECTION, sids), {sid: Stream(requests, None) for sid in sids})
        sender.run(seconds=REFLECTION_S)
        for fc in sender.conns:
            fc.conn.close()
    attack.check(rss_mb=WINDOW_RSS_MB)
    assert sum(fc.data_received for fc in sender.conns) == 0, "DATA sent past a window of 0"
    print(f"{sender.sent() // len(requests) * 10} reflection requests taken; {attack.summary()}")


def _never_ending(per_stream: int) -> bytes:
    """A stream's bytes: a message of 64 KiB announced, ``per_stream`` bytes of it sent."""
    return grpc_frame(b"", length=64 * 1024) + b"\x00" * (per_stream - 5)


def test_streams_of_64kib_within_the_windows_stall_without_error(served: RlsServed) -> None:
    sender = FlowSender()
    with Attack(served) as attack:
        for _ in range(3):
            conn = RawConn(served.grpc_port, timeout=5, window_update=False)
            conn.handshake()
            sids = range(1, 8001, 2)  # 4,000 streams
            body = _never_ending(min(65_535, conn.settings.get(INITIAL_WINDOW_SIZE, 65_535)))
            sender.add(conn, _headers(conn, RLS_PATH, sids), {sid: Stream(body, len(body)) for sid in sids})
        sender.run(seconds=10)
        for fc in sender.conns:
            fc.conn.close()
    attack.check(rss_mb=WINDOW_RSS_MB)
    goaways = [fc.goaway for fc in sender.conns if fc.goaway is not None]
    assert not goaways, f"a peer within its windows got GOAWAY {goaways}"
    print(f"{sender.sent() / 2**20:.0f} MiB taken of {3 * 4000 * 64 // 1024} MiB offered; {attack.summary()}")


def _past_the_window(conn: RawConn, streams: int) -> Iterator[bytes]:
    """Each stream's HEADERS and its 64 KiB in DATA frames (within the stream's window), sent
    whatever the connection's window says."""
    frame_max = conn.settings.get(MAX_FRAME_SIZE, 16_384)
    body = _never_ending(min(65_535, conn.settings.get(INITIAL_WINDOW_SIZE, 65_535)))
    data = b"".join(raw_frame(DATA, 0, 0, body[i : i + frame_max]) for i in range(0, len(body), frame_max))
    first, again = conn.encode(conn.grpc_headers()), conn.encode(conn.grpc_headers())
    for n in range(streams):
        sid = 2 * n + 1
        frames = bytearray(raw_frame(HEADERS, END_HEADERS, sid, first if sid == 1 else again) + data)
        pos = len(frames) - len(data)
        while pos < len(frames):  # each DATA frame's stream id
            frames[pos + 5 : pos + 9] = sid.to_bytes(4, "big")
            pos += 9 + int.from_bytes(frames[pos : pos + 3], "big")
        yield bytes(frames)


def test_a_peer_sending_past_the_connection_window_gets_goaway_flow_control_error(served: RlsServed) -> None:
    """3 connections, one after the other, each sending 4,000 streams of 64 KiB whatever the
    connection's window says: each gets GOAWAY FLOW_CONTROL_ERROR (15 s for the three at most)."""
    before = protocol_errors(served)
    outcomes: list[tuple[int | None, int]] = []
    with Attack(served) as attack:
        deadline = time.monotonic() + 15
        for _ in range(3):
            conn = RawConn(served.grpc_port, timeout=5, window_update=False)
            conn.handshake()
            drain = Drain(conn)
            drain.start()
            sent = blast(conn, _past_the_window(conn, 4000), drain, seconds=max(1.0, deadline - time.monotonic()))
            drain.wait_goaway_or_close(5)
            drain.stop()
            conn.close()
            outcomes.append((drain.goaway, sent))
    attack.check(rss_mb=WINDOW_RSS_MB)
    said = [f"GOAWAY {code} after {sent / 2**20:.1f} MiB" for code, sent in outcomes]
    assert [code for code, _ in outcomes] == [E.FLOW_CONTROL_ERROR] * 3, said
    after = protocol_errors(served)
    assert after["goaway_flow_control_error"] - before["goaway_flow_control_error"] >= 3
    print(f"{said}; {attack.summary()}")


def _repeat(frame: bytes, count: int, per_chunk: int = 10_000) -> Iterator[bytes]:
    chunk = frame * per_chunk
    for _ in range(count // per_chunk):
        yield chunk


FLOODS = {
    "empty DATA": (False, raw_frame(DATA, 0, 1, b""), 1_000_000),
    "16 KiB CONTINUATION": (True, raw_frame(CONTINUATION, 0, 1, b"\x00\x01a\x01b" * 3276 + b"\x00\x01a\x00"), 20_000),
    "empty CONTINUATION": (True, raw_frame(CONTINUATION, 0, 1, b""), 1_000_000),
}


@pytest.mark.parametrize("what", list(FLOODS))
def test_a_flood_of_frames_that_do_nothing_gets_goaway(served: RlsServed, what: str) -> None:
    unended_block, flood_frame, count = FLOODS[what]
    before = protocol_errors(served)
    with Attack(served) as attack:
        conn = RawConn(served.grpc_port, timeout=5)
        conn.handshake()
        conn.headers(1, conn.encode(conn.grpc_headers()), end_headers=not unended_block)
        drain = Drain(conn)
        drain.start()
        sent = blast(conn, _repeat(flood_frame, count), drain, seconds=15)
        drain.wait_goaway_or_close(5)
        drain.stop()
        conn.close()
    attack.check(rss_mb=64)
    frames = sent // len(flood_frame)
    assert drain.goaway in (E.ENHANCE_YOUR_CALM, E.PROTOCOL_ERROR), f"GOAWAY {drain.goaway} after {frames} frames"
    after = protocol_errors(served)
    grown = [k for k in ("goaway_enhance_your_calm", "goaway_protocol_error") if after[k] > before[k]]
    assert grown, "the GOAWAY was not counted"
    print(f"{what}: GOAWAY {drain.goaway} after {frames} frames; {attack.summary()}")


UNREAD_FLOODS = {
    "PING": raw_frame(PING, 0, 0, b"flooding"),
    "SETTINGS": raw_frame(SETTINGS, 0, 0, settings_payload((INITIAL_WINDOW_SIZE, 65_535))),
}


@pytest.mark.parametrize("what", list(UNREAD_FLOODS))
def test_a_flood_of_frames_to_acknowledge_never_read_stays_bounded(served: RlsServed, what: str) -> None:
    """Up to 5 million frames in 8 s, each asking for an acknowledgement the client never reads
    (its receive buffer small): the server may stop reading (its acknowledgements waiting in a
    bounded buffer) or say GOAWAY; its memory stays bounded either way."""
    with Attack(served) as attack:
        conn = RawConn(served.grpc_port, timeout=5, rcvbuf=4096)
        conn.handshake()
        never = Drain(conn)  # not started: nothing is read
        sent = blast(conn, _repeat(UNREAD_FLOODS[what], 5_000_000), never, seconds=8)
        conn.close()
    attack.check(rss_mb=64)
    print(f"{what}: {sent // len(UNREAD_FLOODS[what])} frames taken; {attack.summary()}")
