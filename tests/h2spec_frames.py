"""h2spec's ``http2/`` cases of RFC 7540's sections 6 to 8 (RFC 9113's section in each
docstring): each frame type's rules, settings, flow control, error codes, and the HTTP
message checks (RFC 9113 section 8: a malformed request is a stream error). See tests/h2spec.py."""

from __future__ import annotations

from h2_raw import (
    DATA,
    ENABLE_PUSH,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_FRAME_SIZE,
    PING,
    PRIORITY,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    ErrorCodes,
    raw_frame,
    settings_payload,
)  # fmt: skip
from h2_verdicts import (
    Failed,
    connection_error,
    event_type,
    headers_frame,
    ping_ack,
    ping_ack_or_close,
    settings_ack,
    stream_error,
    wait_type,
)  # fmt: skip
from h2spec import Ctx, case, dummy_headers

E = ErrorCodes
H2SPEC = b"h2spec\x00\x00"


@case("http2/6.1/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.1: DATA on stream 0: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(DATA, 0x1, 0, b"test"))
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.1/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.1: DATA on a stream not open nor half-closed (local): stream error STREAM_CLOSED."""
    c.conn.handshake()
    c.call(1)
    c.conn.data(1, b"test", end_stream=True)
    stream_error(c.conn, E.STREAM_CLOSED)


@case("http2/6.1/3")
def _(c: Ctx) -> None:
    """RFC 9113 6.1: DATA whose padding is longer than the frame: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode([*c.headers, ("content-length", "4")]))
    c.conn.send(raw_frame(DATA, 0x9, 1, b"\x06Test"))  # pad length 6 of a 5-byte frame
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.2/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.2: a PRIORITY frame after HEADERS without END_HEADERS: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers), end_headers=False)
    c.conn.priority(1)
    c.conn.continuation(1, c.conn.encode(dummy_headers(1)), end_headers=True)
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.2/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.2: HEADERS of another stream after HEADERS without END_HEADERS: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers), end_headers=False)
    c.call(3)
    c.conn.continuation(1, c.conn.encode(dummy_headers(1)), end_headers=True)
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.2/3")
def _(c: Ctx) -> None:
    """RFC 9113 6.2: HEADERS on stream 0: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(HEADERS, 0x5, 0, c.conn.encode(c.headers)))
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.2/4")
def _(c: Ctx) -> None:
    """RFC 9113 6.2: HEADERS whose padding is longer than the frame: PROTOCOL_ERROR (stream error at least)."""
    c.conn.handshake()
    block = c.conn.encode(c.headers)
    c.conn.send(raw_frame(HEADERS, 0x0D, 1, bytes((len(block) + 2,)) + block))
    stream_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.3/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.3: PRIORITY on stream 0: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(PRIORITY, 0, 0, b"\x00\x00\x00\x00\xff"))
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.3/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.3: a PRIORITY frame of 4 octets: stream error FRAME_SIZE_ERROR."""
    c.conn.handshake()
    c.call(1)
    c.conn.send(raw_frame(PRIORITY, 0, 1, b"\x80\x00\x00\x01"))
    stream_error(c.conn, E.FRAME_SIZE_ERROR)


@case("http2/6.4/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.4: RST_STREAM on stream 0: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(RST_STREAM, 0, 0, int(E.CANCEL).to_bytes(4, "big")))
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.4/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.4: RST_STREAM on an idle stream: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.rst(1, E.CANCEL)
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.4/3")
def _(c: Ctx) -> None:
    """RFC 9113 6.4: a RST_STREAM frame of 3 octets: FRAME_SIZE_ERROR."""
    c.conn.handshake()
    c.call(1)
    c.conn.send(raw_frame(RST_STREAM, 0, 1, b"\x00\x00\x00"))
    stream_error(c.conn, E.FRAME_SIZE_ERROR)


@case("http2/6.5/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.5: a SETTINGS ACK with a payload: connection error FRAME_SIZE_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(SETTINGS, 0x1, 0, b"\x00"))
    connection_error(c.conn, E.FRAME_SIZE_ERROR)


@case("http2/6.5/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.5: SETTINGS on stream 1: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(SETTINGS, 0, 1, settings_payload((3, 100))))
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.5/3")
def _(c: Ctx) -> None:
    """RFC 9113 6.5: a SETTINGS frame whose length is not a multiple of 6: FRAME_SIZE_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(SETTINGS, 0, 0, b"\x00\x03\x00"))
    stream_error(c.conn, E.PROTOCOL_ERROR, E.FRAME_SIZE_ERROR)


@case("http2/6.5.2/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.5.2: SETTINGS_ENABLE_PUSH 2: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.settings_frame((ENABLE_PUSH, 2))
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.5.2/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.5.2: SETTINGS_INITIAL_WINDOW_SIZE 2^31: connection error FLOW_CONTROL_ERROR."""
    c.conn.handshake()
    c.conn.settings_frame((INITIAL_WINDOW_SIZE, 2**31))
    connection_error(c.conn, E.FLOW_CONTROL_ERROR)


@case("http2/6.5.2/3")
def _(c: Ctx) -> None:
    """RFC 9113 6.5.2: SETTINGS_MAX_FRAME_SIZE 16,383: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.settings_frame((MAX_FRAME_SIZE, 16_383))
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.5.2/4")
def _(c: Ctx) -> None:
    """RFC 9113 6.5.2: SETTINGS_MAX_FRAME_SIZE 2^24: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.settings_frame((MAX_FRAME_SIZE, 2**24))
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.5.2/5")
def _(c: Ctx) -> None:
    """RFC 9113 6.5.2: an unknown setting is ignored (a PING after it is answered)."""
    c.conn.handshake()
    c.conn.settings_frame((0xFF, 1))
    c.conn.ping(b"\x00" * 8)
    ping_ack(c.conn, b"\x00" * 8)


def _first_data_is_one_byte(c: Ctx) -> None:
    ev, passed = wait_type(c.conn, DATA)
    if not passed or ev is None or ev.frame.body_len != 1:
        raise Failed(c.conn, ["DATA Frame (length:1, flags:0x00, stream_id:1)"], ev)


@case("http2/6.5.3/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.5.3: the values of a SETTINGS frame are applied in order (INITIAL_WINDOW_SIZE
    100 then 1: the answer's first DATA frame is 1 byte)."""
    assert c.server_data_length() >= 1
    c.conn.handshake()
    c.conn.settings_frame((INITIAL_WINDOW_SIZE, 100), (INITIAL_WINDOW_SIZE, 1))
    settings_ack(c.conn)
    c.call(1)
    _first_data_is_one_byte(c)


@case("http2/6.5.3/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.5.3: a SETTINGS frame is acknowledged with SETTINGS ACK."""
    c.conn.handshake()
    c.conn.settings_frame((ENABLE_PUSH, 0))
    settings_ack(c.conn)


@case("http2/6.7/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.7: a PING is answered with a PING ACK of the same payload."""
    c.conn.handshake()
    c.conn.ping(H2SPEC)
    ping_ack(c.conn, H2SPEC)


@case("http2/6.7/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.7: a PING ACK is not answered (the PING after it is)."""
    c.conn.handshake()
    c.conn.ping(b"invalid\x00", ack=True)
    c.conn.ping(H2SPEC)
    ping_ack(c.conn, H2SPEC)


@case("http2/6.7/3")
def _(c: Ctx) -> None:
    """RFC 9113 6.7: PING on stream 1: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(PING, 0, 1, b"\x00" * 8))
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.7/4")
def _(c: Ctx) -> None:
    """RFC 9113 6.7: a PING of 6 octets: connection error FRAME_SIZE_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(PING, 0, 0, b"\x00" * 6))
    connection_error(c.conn, E.FRAME_SIZE_ERROR)


@case("http2/6.8/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.8: GOAWAY on stream 1: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(GOAWAY, 0, 1, b"\x00" * 8))
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.9/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.9: WINDOW_UPDATE of 0 on the connection: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.window(0, 0)
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.9/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.9: WINDOW_UPDATE of 0 on a stream: stream error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.window(1, 0)
    stream_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.9/3")
def _(c: Ctx) -> None:
    """RFC 9113 6.9: a WINDOW_UPDATE of 3 octets: connection error FRAME_SIZE_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"))
    connection_error(c.conn, E.FRAME_SIZE_ERROR)


@case("http2/6.9.1/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.9.1: with SETTINGS_INITIAL_WINDOW_SIZE 1 the server sends no more than 1 byte of DATA."""
    assert c.server_data_length() >= 1
    c.conn.handshake()
    c.conn.settings_frame((INITIAL_WINDOW_SIZE, 1))
    settings_ack(c.conn)
    c.call(1)
    _first_data_is_one_byte(c)


@case("http2/6.9.1/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.9.1: the connection window raised above 2^31-1: GOAWAY FLOW_CONTROL_ERROR."""
    c.conn.handshake()
    c.conn.window(0, 2**31 - 1)
    c.conn.window(0, 2**31 - 1)
    ev, passed = wait_type(c.conn, GOAWAY)
    if not passed or ev is None or ev.code != E.FLOW_CONTROL_ERROR:
        raise Failed(c.conn, ["GOAWAY Frame (Error Code: FLOW_CONTROL_ERROR)"], ev)


@case("http2/6.9.1/3")
def _(c: Ctx) -> None:
    """RFC 9113 6.9.1: a stream's window raised above 2^31-1: RST_STREAM FLOW_CONTROL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.window(1, 2**31 - 1)
    c.conn.window(1, 2**31 - 1)
    ev, passed = wait_type(c.conn, RST_STREAM)
    if not passed or ev is None or (ev.frame.stream_id == 1 and ev.code != E.FLOW_CONTROL_ERROR):
        raise Failed(c.conn, ["RST_STREAM Frame (Error Code: FLOW_CONTROL_ERROR)"], ev)


@case("http2/6.9.2/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.9.2: a new SETTINGS_INITIAL_WINDOW_SIZE (0, then 1 after the call) applies to open streams."""
    assert c.server_data_length() >= 1
    c.conn.handshake()
    c.conn.settings_frame((INITIAL_WINDOW_SIZE, 0))
    settings_ack(c.conn)
    c.call(1)
    c.conn.settings_frame((INITIAL_WINDOW_SIZE, 1))
    _first_data_is_one_byte(c)


@case("http2/6.9.2/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.9.2: a window made negative by SETTINGS is tracked (3, 3 bytes sent, then 2:
    -1; a WINDOW_UPDATE of 2: the next DATA is 1 byte)."""
    assert c.server_data_length() >= 5
    c.conn.handshake()
    c.conn.settings_frame((INITIAL_WINDOW_SIZE, 3))
    settings_ack(c.conn)
    c.call(1)
    event_type(c.conn, DATA)
    c.conn.settings_frame((INITIAL_WINDOW_SIZE, 2))
    settings_ack(c.conn)
    c.conn.window(1, 2)
    _first_data_is_one_byte(c)


@case("http2/6.9.2/3")
def _(c: Ctx) -> None:
    """RFC 9113 6.9.2: SETTINGS_INITIAL_WINDOW_SIZE 2^31: connection error FLOW_CONTROL_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(SETTINGS, 0, 0, b"\x00\x04\x80\x00\x00\x00"))
    connection_error(c.conn, E.FLOW_CONTROL_ERROR)


@case("http2/6.10/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.10: a header block in HEADERS and two CONTINUATION frames is taken (the call answered)."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers), end_headers=False)
    c.conn.continuation(1, c.conn.encode(dummy_headers(1)), end_headers=False)
    c.conn.continuation(1, c.conn.encode(dummy_headers(1)), end_headers=True)
    c.finish(1)
    headers_frame(c.conn, 1)


@case("http2/6.10/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.10: a DATA frame after a CONTINUATION without END_HEADERS: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers), end_headers=False)
    c.conn.continuation(1, c.conn.encode(dummy_headers(1)), end_headers=False)
    c.conn.data(1, b"test", end_stream=True)
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.10/3")
def _(c: Ctx) -> None:
    """RFC 9113 6.10: CONTINUATION on stream 0: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers), end_headers=False)
    c.conn.send(raw_frame(9, 0x4, 0, c.conn.encode(dummy_headers(1))))
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.10/4")
def _(c: Ctx) -> None:
    """RFC 9113 6.10: CONTINUATION after a HEADERS frame with END_HEADERS: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.continuation(1, c.conn.encode(dummy_headers(1)), end_headers=True)
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.10/5")
def _(c: Ctx) -> None:
    """RFC 9113 6.10: CONTINUATION after a CONTINUATION with END_HEADERS: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers), end_headers=False)
    c.conn.continuation(1, c.conn.encode(dummy_headers(1)), end_headers=True)
    c.conn.continuation(1, c.conn.encode(dummy_headers(1)), end_headers=True)
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/6.10/6")
def _(c: Ctx) -> None:
    """RFC 9113 6.10: CONTINUATION after a DATA frame: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers), end_headers=False)
    c.conn.data(1, b"test", end_stream=True)
    c.conn.continuation(1, c.conn.encode(dummy_headers(1)), end_headers=False)
    c.conn.send(raw_frame(9, 0x4, 0, c.conn.encode(dummy_headers(1))))
    connection_error(c.conn, E.PROTOCOL_ERROR)


@case("http2/7/1")
def _(c: Ctx) -> None:
    """RFC 9113 7: a GOAWAY with an unknown error code triggers nothing special (PING answered, or closed)."""
    c.conn.handshake()
    c.conn.send_goaway(0, 0xFF)
    c.conn.ping(H2SPEC)
    ping_ack_or_close(c.conn, H2SPEC)


@case("http2/7/2")
def _(c: Ctx) -> None:
    """RFC 9113 7: a RST_STREAM with an unknown error code triggers nothing special (PING answered, or closed)."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.rst(1, 0xFF)
    c.conn.ping(b"\x00" * 8)
    ping_ack_or_close(c.conn, b"\x00" * 8)


@case("http2/8.2/1")
def _(c: Ctx) -> None:
    """RFC 9113 8.4: a PUSH_PROMISE from a client: connection error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.send(raw_frame(PUSH_PROMISE, 0x4, 1, (3).to_bytes(4, "big") + c.conn.encode(c.headers)))
    connection_error(c.conn, E.PROTOCOL_ERROR)
