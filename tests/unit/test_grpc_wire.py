"""The gRPC transport's pure parts: the frame walk before h2 (control_plane/envoy/frames.py),
HPACK for h2 (codec.py), a request's head and its messages (wire.py)."""

from __future__ import annotations

import gzip
import zlib

import pytest
from h2.errors import ErrorCodes
from hpack import Decoder, Encoder

from control_plane.envoy.codec import HeaderBlockError, KeptDecoder, StaticEncoder, encode_static
from control_plane.envoy.frames import CONTROL_BURST, CONTROL_RATE, MAX_EMPTY_RUN, FrameWalk
from control_plane.envoy.wire import MessageReader, RpcError, StatusCode, read_head, status_trailers

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + sid.to_bytes(4, "big") + payload


HEADERS, RST, SETTINGS, PING, WINDOW, CONT, DATA, PRIORITY = 1, 3, 4, 6, 8, 9, 0, 2


def walked(data: bytes, walk: FrameWalk | None = None, now: float = 0.0) -> tuple[int, str | None]:
    walk = walk or FrameWalk(0.0)
    upto, refusal = walk.walk(data, now)
    return upto, None if refusal is None else f"{refusal.code.name}: {refusal.reason}"


# -- the frame walk --------------------------------------------------------------------------


def test_frames_on_idle_streams_are_refused_where_they_start() -> None:
    opened = PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, 0x4, 3, b"\x82")
    assert walked(opened + frame(RST, 0, 3, b"\0\0\0\x08")) == (len(opened) + 13, None)  # stream 3 was opened
    upto, why = walked(opened + frame(RST, 0, 5, b"\0\0\0\x08"))
    assert upto == len(opened) and why == "PROTOCOL_ERROR: RST_STREAM on idle stream 5"
    upto, why = walked(opened + frame(WINDOW, 0, 7, b"\0\0\0\x01"))
    assert upto == len(opened) and why == "PROTOCOL_ERROR: WINDOW_UPDATE on idle stream 7"
    upto, why = walked(opened + frame(WINDOW, 0, 2, b"\0\0\0\x01"))  # an even stream: ours, never opened
    assert why == "PROTOCOL_ERROR: WINDOW_UPDATE on idle stream 2"
    assert walked(opened + frame(WINDOW, 0, 0, b"\0\0\0\x01"))[1] is None  # the connection's


def test_frames_split_across_reads_are_walked_the_same() -> None:
    data = PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, 0x4, 1, b"\x82" * 40) + frame(RST, 0, 9, b"\0\0\0\x08")
    bad_at = len(data) - 13
    for size in (1, 2, 5, 9, 10, 17, 64):
        walk, fed, refused = FrameWalk(0.0), 0, None
        for i in range(0, len(data), size):
            chunk = data[i : i + size]
            upto, refusal = walk.walk(chunk, 0.0)
            fed += upto
            if refusal is not None:
                refused = refusal
                break
        assert refused is not None and refused.code == ErrorCodes.PROTOCOL_ERROR, size
        # what h2 reads stops where the refused frame starts (with its header's first bytes when
        # they came in earlier reads, already read: the connection ends anyway)
        assert bad_at <= fed < bad_at + 9, size


def test_empty_frame_runs_and_big_header_blocks_are_refused() -> None:
    opened = PREFACE + frame(HEADERS, 0x4, 1, b"\x82")
    ok = opened + frame(DATA, 0, 1) * MAX_EMPTY_RUN + frame(DATA, 0, 1, b"x")
    assert walked(ok + frame(DATA, 0, 1) * MAX_EMPTY_RUN)[1] is None  # the run restarts after a payload
    upto, why = walked(opened + frame(DATA, 0, 1) * (MAX_EMPTY_RUN + 1))
    assert why == f"ENHANCE_YOUR_CALM: more than {MAX_EMPTY_RUN} empty frames in a row"
    assert upto == len(opened) + 9 * MAX_EMPTY_RUN
    assert walked(opened + frame(DATA, 0x1, 1) * 40)[1] is None  # END_STREAM frames are not empty work
    block = frame(HEADERS, 0, 3, b"\x82" * 1000) + frame(CONT, 0, 3, b"\x00" * 16000) * 5
    assert walked(PREFACE + block)[1] == "ENHANCE_YOUR_CALM: a header block over 65536 bytes"
    fine = frame(HEADERS, 0, 3, b"\x82" * 1000) + frame(CONT, 0x4, 3, b"\x00" * 16000) + frame(CONT, 0, 5, b"")
    assert "header block" not in (walked(PREFACE + fine)[1] or "")  # ended: a CONTINUATION after it is h2's


def walk_all(walk: FrameWalk, data: bytes, now: float) -> tuple[int, str | None]:
    """``data`` walked as the transport hands it over: again from where each walk was cut."""
    done = 0
    while True:
        upto, refusal = walk.walk(data[done:], now)
        done += upto
        if refusal is not None or not walk.cut:
            return done, None if refusal is None else refusal.code.name


def test_control_frames_draw_from_a_bucket_that_refills_with_time() -> None:
    walk = FrameWalk(0.0)
    ping = frame(PING, 0, 0, b"12345678")
    assert walk_all(walk, PREFACE + ping * CONTROL_BURST, 0.0) == (len(PREFACE) + 17 * CONTROL_BURST, None)
    assert walk_all(walk, ping, 0.0) == (0, "ENHANCE_YOUR_CALM")
    walk = FrameWalk(0.0)
    walk_all(walk, PREFACE + frame(SETTINGS, 0, 0) * CONTROL_BURST, 0.0)
    priority = frame(PRIORITY, 0, 1, b"\0\0\0\0\x10") * int(CONTROL_RATE)
    assert walk_all(walk, priority, 1.0)[1] is None  # a second refills
    assert walk_all(walk, frame(SETTINGS, 0x1, 0) * 50 + frame(PING, 0x1, 0, b"12345678") * 50, 1.0)[1] is None
    assert walk_all(walk, frame(0x42, 0, 0, b"x"), 1.0)[1] == "ENHANCE_YOUR_CALM"  # unknown frame types count too


# -- HPACK ------------------------------------------------------------------------------------


def test_the_static_encoder_never_touches_the_peers_table() -> None:
    headers = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"13"),
               (b"grpc-message", b"x" * 300)]  # fmt: skip
    block = StaticEncoder().encode(headers)
    peer = Decoder()
    assert peer.decode(block, raw=True) == headers and not peer.header_table.dynamic_entries
    assert encode_static([(b":status", b"200")]) == b"\x88"  # static index 8
    assert encode_static([(b":status", b"404")]) == b"\x8d"  # static index 13
    assert encode_static([(b":status", b"418")]) == b"\x18\x03418"  # never indexed, static name 8


def test_a_block_hpack_cannot_read_or_too_big_ends_the_connection_with_its_code() -> None:
    with pytest.raises(HeaderBlockError) as err:
        KeptDecoder(16 * 1024).decode(b"\xff\xff\xff\xff\x7f")
    assert err.value.code == ErrorCodes.COMPRESSION_ERROR
    big = Encoder().encode([("x-big", "v" * 20_000)])
    with pytest.raises(HeaderBlockError) as err:
        KeptDecoder(16 * 1024).decode(big)
    assert err.value.code == ErrorCodes.ENHANCE_YOUR_CALM


# -- a request's head ---------------------------------------------------------------------------

GRPC = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a.B/C"), (b":authority", b"x"),
        (b"content-type", b"application/grpc"), (b"te", b"trailers")]  # fmt: skip


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        (GRPC + [(b"X-Upper", b"1")], "uppercase"),
        (GRPC + [(b"", b"v")], "zero length"),
        (GRPC + [(b"connection", b"close")], "connection"),
        (GRPC[:-1] + [(b"te", b"gzip")], "te"),
        ([GRPC[4]] + GRPC[:4], "pseudo"),  # a pseudo-header after a regular one
        (GRPC + [(b":path", b"/again")], "pseudo"),  # twice
        (GRPC + [(b":foo", b"x")], "pseudo"),  # unknown
        ([h for h in GRPC if h[0] != b":path"], ":path"),  # missing
        ([(b":path", b"") if h[0] == b":path" else h for h in GRPC], ":path"),  # empty
        (GRPC + [(b"x-a", b"bad\nvalue")], "illegal"),
    ],
)
def test_malformed_requests_name_their_problem(headers: list[tuple[bytes, bytes]], problem: str) -> None:
    head = read_head(headers)
    assert head.problem is not None and problem.lower() in head.problem.lower(), head.problem


def test_a_well_formed_head_its_deadline_encoding_and_errors() -> None:
    head = read_head(GRPC + [(b"grpc-timeout", b"20m"), (b"grpc-encoding", b"gzip"), (b"x-a", b"1")])
    assert head.problem is None and head.error is None and head.path == "/a.B/C"
    assert head.timeout_s == pytest.approx(0.02) and head.encoding == "gzip"
    assert ("x-a", "1") in head.metadata and all(not k.startswith(":") for k, _ in head.metadata)
    for bad in (b"garbage", b"-1S", b"1.5S", b""):  # as grpcio answers it
        head = read_head(GRPC + [(b"grpc-timeout", bad)])
        assert head.error is not None and head.error[0] == StatusCode.INTERNAL, bad
    assert read_head(GRPC + [(b"grpc-encoding", b"br")]).error == (
        StatusCode.UNIMPLEMENTED, "grpc-encoding 'br': not one of identity, deflate, gzip",
    )  # fmt: skip
    assert read_head([(b":method", b"GET")] + GRPC[1:]).status == 405
    assert read_head(GRPC[:4] + [(b"content-type", b"text/plain")]).status == 415


# -- messages -----------------------------------------------------------------------------------


def message(payload: bytes, flag: int = 0) -> bytes:
    return bytes((flag,)) + len(payload).to_bytes(4, "big") + payload


def test_a_length_over_the_bound_is_refused_on_its_prefix() -> None:
    reader = MessageReader(1024, "identity")
    with pytest.raises(RpcError) as err:
        reader.feed(b"\x00\x00\x01\x00\x00")  # 65,536 bytes announced, none sent
    assert err.value.code == StatusCode.RESOURCE_EXHAUSTED
    reader = MessageReader(1024, "identity")
    reader.feed(message(b"a"))
    with pytest.raises(RpcError):
        reader.feed(b"\x00\x00\x01\x00\x00")  # the second message's prefix
        reader.next()


def test_messages_in_pieces_compressed_or_not() -> None:
    reader = MessageReader(1 << 16, "gzip")
    data = message(b"plain") + message(gzip.compress(b"squeezed"), 1)
    for i in range(len(data)):
        reader.feed(data[i : i + 1])
    assert reader.next() == b"plain" and reader.next() == b"squeezed" and reader.next() is None
    deflate = MessageReader(1 << 16, "deflate")
    deflate.feed(message(zlib.compress(b"zlib"), 1))
    assert deflate.only() == b"zlib"


def test_compression_errors_and_zip_bombs() -> None:
    reader = MessageReader(1024, "identity")
    reader.feed(message(b"x", 1))
    with pytest.raises(RpcError) as err:
        reader.next()
    assert err.value.code == StatusCode.INTERNAL and "without grpc-encoding" in err.value.message
    bomb = MessageReader(1 << 16, "gzip")
    bomb.feed(message(gzip.compress(b"\0" * (10 << 20)), 1))  # 10 MiB of zeros in ~10 KB
    with pytest.raises(RpcError) as err:
        bomb.next()
    assert err.value.code == StatusCode.RESOURCE_EXHAUSTED
    broken = MessageReader(1024, "gzip")
    broken.feed(message(b"not gzip", 1))
    with pytest.raises(RpcError) as err:
        broken.next()
    assert err.value.code == StatusCode.INTERNAL
    two = MessageReader(1024, "identity")
    two.feed(message(b"a") + message(b"b"))
    with pytest.raises(RpcError, match="exactly one"):
        two.only()


def test_status_trailers_percent_encode_the_message() -> None:
    assert status_trailers(0, "") == ((b"grpc-status", b"0"),)
    assert status_trailers(3, "bad 100% ü\n") == ((b"grpc-status", b"3"), (b"grpc-message", b"bad 100%25 %C3%BC%0A"))


def test_trailers_that_do_not_end_their_stream_are_marked_for_a_stream_error() -> None:
    walk = FrameWalk(0.0)
    opened = PREFACE + frame(HEADERS, 0x4, 1, b"\x82")
    trailers = frame(HEADERS, 0x4, 1, b"\x40\x01a\x01b")  # on stream 1 again, no END_STREAM
    assert walk.walk(opened + trailers, 0.0) == (len(opened) + len(trailers), None)
    assert walk.patches == [len(opened) + 4] and walk.bad_trailers == {1}
    walk.walk(frame(HEADERS, 0x5, 1, b"\x82"), 0.0)  # with END_STREAM: fine
    assert walk.patches == []
    walk.walk(frame(HEADERS, 0x4, 3, b"\x82"), 0.0)  # a new stream: fine
    assert walk.patches == [] and walk.bad_trailers == {1}


def test_content_length_is_the_transports_to_check_and_cannot_be_forged() -> None:
    from control_plane.envoy.codec import CONTENT_LENGTH

    block = Encoder().encode([(":method", "POST"), ("content-length", "12"), ("\x00content-length", "1")])
    headers = KeptDecoder(16 * 1024).decode(block)
    assert (CONTENT_LENGTH, b"12") in headers and (b"\x00" + CONTENT_LENGTH, b"1") in headers
    head = read_head(GRPC + [(CONTENT_LENGTH, b"12")])
    assert head.problem is None and head.content_length == 12
    assert read_head(GRPC + [(CONTENT_LENGTH, b"12"), (CONTENT_LENGTH, b"13")]).problem is not None
    assert read_head(GRPC + [(CONTENT_LENGTH, b"x")]).problem is not None
    assert read_head(GRPC + [(b"\x00" + CONTENT_LENGTH, b"1")]).problem is not None  # a client's NUL name


def test_a_walk_ends_at_a_frame_after_its_share_of_frames_or_new_streams() -> None:
    from control_plane.envoy.frames import WALK_FRAMES, WALK_NEW_STREAMS

    walk = FrameWalk(0.0)
    opened = PREFACE + frame(SETTINGS, 0, 0)
    streams = b"".join(frame(HEADERS, 0x5, 1 + 2 * i, b"\x82") for i in range(WALK_NEW_STREAMS + 10))
    upto, refusal = walk.walk(opened + streams, 0.0)
    assert refusal is None and walk.cut and upto == len(opened) + WALK_NEW_STREAMS * 10
    upto, refusal = walk.walk((opened + streams)[upto:], 0.0)  # the rest, next turn: from where it stopped
    assert refusal is None and not walk.cut and upto == 10 * 10
    pings = frame(PING, 0x1, 0, b"12345678") * (WALK_FRAMES + 5)  # ACKs: free, but frames all the same
    upto, _ = walk.walk(pings, 0.0)
    assert walk.cut and upto == 17 * WALK_FRAMES


def test_log_lines_about_clients_are_bounded_and_say_how_many_were_left_out(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from control_plane.envoy.transport import LogLines

    lines = LogLines(burst=3, rate=1.0)
    with caplog.at_level(logging.INFO, logger="shadowlimit.grpc"):
        for i in range(10):
            lines.info(100.0, "bad %d", i)  # a flood within one instant: 3 lines
        lines.info(101.0, "bad %d", 10)  # a second later: one more, saying what was left out
    got = [r.getMessage() for r in caplog.records if r.name == "shadowlimit.grpc"]
    assert got == ["bad 0", "bad 1", "bad 2", "bad 10 (7 such lines left out)"]
