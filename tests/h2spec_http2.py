"""h2spec's ``http2/`` cases of RFC 7540's sections 3 to 5 (RFC 9113's section in each
docstring): the preface, frame format and size, header compression, stream states and
identifiers, concurrency, dependencies, error handling, extensions. See tests/h2spec.py."""

from __future__ import annotations

from h2_raw import (
    DATA,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    PING,
    PREFACE,
    SETTINGS,
    ErrorCodes,
    raw_frame,
    rls_message,
    settings_payload,
)  # fmt: skip
from h2_verdicts import (
    Failed,
    connection_close,
    connection_error,
    event_type,
    goaway_frame,
    headers_frame,
    ping_ack,
    stream_close,
    stream_error,
)  # fmt: skip
from h2spec import Ctx, case, dummy_headers

E = ErrorCodes
UNKNOWN_FRAME = raw_frame(0x16, 0, 0, b"\x00" * 8)  # h2spec's: type 0x16, 8 bytes, stream 0


@case("http2/3.5/1")
def _(c: Ctx) -> None:
    """RFC 9113 3.4: after the client's preface and SETTINGS, the server's first frame is a
    SETTINGS frame without ACK."""
    c.conn.send(PREFACE + raw_frame(SETTINGS, 0, 0, settings_payload((INITIAL_WINDOW_SIZE, 65_535))))
    ev = c.conn.wait_event()
    if not (ev.is_(SETTINGS) and "ACK" not in ev.frame.flags):
        raise Failed(c.conn, ["SETTINGS Frame (flags:0x00)"], ev)


@case("http2/3.5/2")
def _(c: Ctx) -> None:
    """RFC 9113 3.4: an invalid connection preface: connection error PROTOCOL_ERROR."""
    c.conn.send(b"INVALID CONNECTION PREFACE\r\n\r\n")
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/4.1/1")
def _(c: Ctx) -> None:
    """RFC 9113 4.1: a frame of an unknown type is ignored (a PING after it is answered)."""
    c.conn.handshake()
    c.conn.send(UNKNOWN_FRAME)
    c.conn.ping(b"\x00" * 8)
    ping_ack(c.conn, b"\x00" * 8)


@case("http2/4.1/2")
def _(c: Ctx) -> None:
    """RFC 9113 4.1: undefined flags are ignored (a PING with flags 0x16 is answered)."""
    c.conn.handshake()
    c.conn.send(raw_frame(PING, 0x16, 0, b"\x00" * 8))
    event_type(c.conn, PING)


@case("http2/4.1/3")
def _(c: Ctx) -> None:
    """RFC 9113 4.1: the reserved bit of the stream identifier is ignored (a PING with it is answered)."""
    c.conn.handshake()
    c.conn.send(raw_frame(PING, 0x16, 0x8000_0000, b"\x00" * 8))
    event_type(c.conn, PING)


@case("http2/4.2/1")
def _(c: Ctx) -> None:
    """RFC 9113 4.2: a DATA frame of 2^14 octets (SETTINGS_MAX_FRAME_SIZE's least value) is
    taken: the call, a message of exactly 16,384 bytes, is answered."""
    c.conn.handshake()
    size = c.conn.settings.get(MAX_FRAME_SIZE, 16_384)
    c.conn.request(1, rls_message(size=size), block=c.conn.encode(c.headers))
    headers_frame(c.conn, 1)


@case("http2/4.2/2")
def _(c: Ctx) -> None:
    """RFC 9113 4.2: a DATA frame over SETTINGS_MAX_FRAME_SIZE: FRAME_SIZE_ERROR (stream error allowed)."""
    c.conn.handshake()
    size = c.conn.settings.get(MAX_FRAME_SIZE, 16_384)
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.data(1, b"x" * (size + 1), end_stream=True)
    stream_error(c.conn, E.FRAME_SIZE_ERROR)


@case("http2/4.2/3")
def _(c: Ctx) -> None:
    """RFC 9113 4.2: a HEADERS frame over SETTINGS_MAX_FRAME_SIZE: connection error FRAME_SIZE_ERROR."""
    c.conn.handshake()
    block = c.conn.encode(c.headers + dummy_headers(5))
    most = c.conn.settings.get(MAX_FRAME_SIZE, 16_384)
    assert len(block) > most, f"SETTINGS_MAX_FRAME_SIZE {most}: h2spec's block of {len(block)} bytes fits in a frame"
    c.conn.headers(1, block, end_stream=True)
    connection_error(c.conn, E.FRAME_SIZE_ERROR)


@case("http2/4.3/1")
def _(c: Ctx) -> None:
    """RFC 9113 4.3: a header block that cannot be decoded: connection error COMPRESSION_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(HEADERS, 0x05, 1, b"\x40"))  # a literal with indexing, no name length
    connection_error(c.conn, E.COMPRESSION_ERROR)


@case("http2/4.3/2")
def _(c: Ctx) -> None:
    """RFC 9113 4.3: a PRIORITY frame inside a header block: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers), end_headers=False)
    c.conn.priority(1)
    c.conn.continuation(1, c.conn.encode(dummy_headers(1)), end_headers=True)
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/4.3/3")
def _(c: Ctx) -> None:
    """RFC 9113 4.3: a HEADERS frame of another stream inside a header block: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers), end_headers=False)
    c.call(3)
    c.conn.continuation(1, c.conn.encode(dummy_headers(1)), end_headers=True)
    connection_error(c.conn, E.PROTOCOL_ERROR)


# -- 5.1 stream states ----------------------------------------------------------------------


@case("http2/5.1/1")
def _(c: Ctx) -> None:
    """RFC 9113 5.1 (idle): DATA on an idle stream: PROTOCOL_ERROR (or STREAM_CLOSED), as a stream error at least."""
    c.conn.handshake()
    c.conn.data(1, b"test", end_stream=True)
    stream_error(c.conn, E.PROTOCOL_ERROR, E.STREAM_CLOSED)


@case("http2/5.1/2")
def _(c: Ctx) -> None:
    """RFC 9113 5.1 (idle): RST_STREAM on an idle stream: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.rst(1, E.CANCEL)
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/5.1/3")
def _(c: Ctx) -> None:
    """RFC 9113 5.1 (idle): WINDOW_UPDATE on an idle stream: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.window(1, 100)
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/5.1/4")
def _(c: Ctx) -> None:
    """RFC 9113 5.1 (idle): CONTINUATION on an idle stream: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.continuation(1, c.conn.encode(c.headers), end_headers=True)
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/5.1/5")
def _(c: Ctx) -> None:
    """RFC 9113 5.1 (half-closed remote): DATA after END_STREAM: stream error STREAM_CLOSED."""
    c.conn.handshake()
    c.call(1)
    c.conn.data(1, b"test", end_stream=True)
    stream_error(c.conn, E.STREAM_CLOSED)


@case("http2/5.1/6")
def _(c: Ctx) -> None:
    """RFC 9113 5.1 (half-closed remote): HEADERS after END_STREAM: stream error STREAM_CLOSED
    (never a second call)."""
    c.conn.handshake()
    c.call(1)
    c.conn.headers(1, c.conn.encode(c.headers), end_stream=True)
    stream_error(c.conn, E.STREAM_CLOSED)


@case("http2/5.1/7")
def _(c: Ctx) -> None:
    """RFC 9113 5.1 (half-closed remote): CONTINUATION after END_STREAM: STREAM_CLOSED or PROTOCOL_ERROR."""
    c.conn.handshake()
    c.call(1)
    c.conn.continuation(1, c.conn.encode(c.headers), end_headers=True)
    stream_error(c.conn, E.STREAM_CLOSED, E.PROTOCOL_ERROR)


@case("http2/5.1/8")
def _(c: Ctx) -> None:
    """RFC 9113 5.1 (closed): DATA after the client's RST_STREAM: stream error STREAM_CLOSED."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.rst(1, E.CANCEL)
    c.conn.data(1, b"test", end_stream=True)
    stream_error(c.conn, E.STREAM_CLOSED)


@case("http2/5.1/9")
def _(c: Ctx) -> None:
    """RFC 9113 5.1 (closed): HEADERS after the client's RST_STREAM: stream error STREAM_CLOSED."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.rst(1, E.CANCEL)
    c.conn.headers(1, c.conn.encode(c.headers), end_stream=True)
    stream_error(c.conn, E.STREAM_CLOSED)


@case("http2/5.1/10")
def _(c: Ctx) -> None:
    """RFC 9113 5.1 (closed): CONTINUATION after the client's RST_STREAM: STREAM_CLOSED or PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.rst(1, E.CANCEL)
    c.conn.continuation(1, c.conn.encode(dummy_headers(1)), end_headers=True)
    stream_error(c.conn, E.STREAM_CLOSED, E.PROTOCOL_ERROR)


@case("http2/5.1/11")
def _(c: Ctx) -> None:
    """RFC 9113 5.1 (closed): DATA on a stream the answer closed: STREAM_CLOSED."""
    c.conn.handshake()
    c.call(1)
    stream_close(c.conn)
    c.conn.data(1, b"test", end_stream=True)
    stream_error(c.conn, E.STREAM_CLOSED)


@case("http2/5.1/12")
def _(c: Ctx) -> None:
    """RFC 9113 5.1 (closed): HEADERS on a stream the answer closed: connection error STREAM_CLOSED."""
    c.conn.handshake()
    c.call(1)
    stream_close(c.conn)
    c.conn.headers(1, c.conn.encode(c.headers), end_stream=True)
    connection_error(c.conn, E.STREAM_CLOSED)


@case("http2/5.1/13")
def _(c: Ctx) -> None:
    """RFC 9113 5.1 (closed): CONTINUATION on a stream the answer closed: connection error
    STREAM_CLOSED or PROTOCOL_ERROR."""
    c.conn.handshake()
    c.call(1)
    stream_close(c.conn)
    c.conn.continuation(1, c.conn.encode(dummy_headers(1)), end_headers=True)
    connection_error(c.conn, E.STREAM_CLOSED, E.PROTOCOL_ERROR)


@case("http2/5.1.1/1")
def _(c: Ctx) -> None:
    """RFC 9113 5.1.1: an even-numbered stream from a client: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.call(2)
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/5.1.1/2")
def _(c: Ctx) -> None:
    """RFC 9113 5.1.1: a stream identifier smaller than a previous one: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.call(5)
    c.call(3)
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/5.1.2/1", timeout=5.0)
def _(c: Ctx) -> None:
    """RFC 9113 5.1.2: streams past the advertised SETTINGS_MAX_CONCURRENT_STREAMS: stream error
    PROTOCOL_ERROR or REFUSED_STREAM. (h2spec skips the case when the server advertises no
    limit; here the limit must be advertised: a server with a bound says it. Thousands of
    calls: 5 s without a frame fails it, not 2.)"""
    c.conn.handshake()
    most = c.conn.settings.get(MAX_CONCURRENT_STREAMS)
    assert most is not None and most <= 100_000, f"SETTINGS_MAX_CONCURRENT_STREAMS advertised: {most}"
    c.conn.settings_frame((INITIAL_WINDOW_SIZE, 0))  # the answers wait: the streams stay open
    first = c.conn.encode(c.headers)  # adds to HPACK's dynamic table
    again = c.conn.encode(c.headers)  # only indexes into it: the same bytes for every other stream
    c.conn.send(b"".join(call_bytes(sid, first if sid == 1 else again) for sid in range(1, 2 * most + 2, 2)))
    stream_error(c.conn, E.PROTOCOL_ERROR, E.REFUSED_STREAM)


@case("http2/5.3.1/1")
def _(c: Ctx) -> None:
    """RFC 9113 5.3.1: a HEADERS frame whose stream depends on itself: stream error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.call(1, priority=(1, 255, False))
    stream_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/5.3.1/2")
def _(c: Ctx) -> None:
    """RFC 9113 5.3.1: a PRIORITY frame whose stream depends on itself: stream error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.priority(1, depends_on=1)
    stream_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/5.4.1/1")
def _(c: Ctx) -> None:
    """RFC 9113 5.4.1: after a connection error (a PING on stream 3), the server closes the TCP connection."""
    c.conn.handshake()
    c.conn.send(raw_frame(PING, 0, 3, b"\x00" * 8))
    connection_close(c.conn)


@case("http2/5.4.1/2")
def _(c: Ctx) -> None:
    """RFC 9113 5.4.1: a connection error is first said with GOAWAY (h2spec's only --strict case)."""
    c.conn.handshake()
    c.conn.send(raw_frame(PING, 0, 3, b"\x00" * 8))
    goaway_frame(c.conn)


@case("http2/5.5/1")
def _(c: Ctx) -> None:
    """RFC 9113 5.5: an unknown extension frame is ignored (a PING after it is answered)."""
    c.conn.handshake()
    c.conn.send(UNKNOWN_FRAME)
    c.conn.ping(b"\x00" * 8)
    ping_ack(c.conn, b"\x00" * 8)


@case("http2/5.5/2")
def _(c: Ctx) -> None:
    """RFC 9113 5.5: an unknown extension frame inside a header block: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers), end_headers=False)
    c.conn.send(UNKNOWN_FRAME)
    connection_error(c.conn, E.PROTOCOL_ERROR)


def call_bytes(sid: int, block: bytes) -> bytes:
    """A whole call as bytes: HEADERS then the message with END_STREAM."""
    return raw_frame(HEADERS, 0x4, sid, block) + raw_frame(DATA, 0x1, sid, rls_message())
