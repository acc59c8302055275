"""h2spec's verdicts (summerwind/h2spec, ``spec/verifier.go``), one for one, over a
:class:`~h2_raw.RawConn`: what passes is exactly what passes there.

* :func:`connection_error` -- a GOAWAY with one of the codes, or the connection closed (a
  GOAWAY with another code is passed over, as h2spec does, and the connection's close then
  passes);
* :func:`stream_error` -- a RST_STREAM or a GOAWAY with one of the codes, or the connection closed;
* :func:`stream_close` -- the stream ended: DATA or HEADERS with END_STREAM, or RST_STREAM NO_ERROR;
* :func:`headers_frame` -- the first HEADERS frame is on that stream (an answer);
* :func:`settings_ack`, :func:`ping_ack` -- the first SETTINGS (PING) frame is an ACK (of that data);
* :func:`ping_ack_or_close` -- a PING ACK of that data, or the connection closed;
* :func:`event_type` -- a frame of that type came (anything else is passed over).

Any of them fails when nothing comes within the connection's timeout (2 s, h2spec's default).

A stricter verdict for RFC 9113 section 8's message checks, beyond h2spec's:
:func:`stream_error_and_connection_lives` -- a RST_STREAM on that stream (not the connection
closed), then the next call on the same connection answered.
"""

from __future__ import annotations

from h2_raw import DATA, GOAWAY, HEADERS, PING, RST_STREAM, SETTINGS, Event, RawConn, frame_name

__all__ = [
    "Failed", "connection_close", "connection_error", "event_type", "goaway_frame", "headers_frame", "ping_ack",
    "ping_ack_or_close", "settings_ack", "stream_close", "stream_error", "stream_error_and_connection_lives",
    "wait_type",
]  # fmt: skip


class Failed(AssertionError):
    """A case failed: what h2spec would have expected, and what came."""

    def __init__(self, conn: RawConn, expected: list[str], actual: Event | None) -> None:
        self.expected, self.actual = expected, actual
        seen = "; ".join(conn.trace[-8:])
        super().__init__(f"expected {' or '.join(expected)}; got {actual} (received: {seen or 'nothing'})")


def _codes(codes: tuple[int, ...], frame: str) -> list[str]:
    return [f"{frame} Frame (Error Code: {c.name if hasattr(c, 'name') else c})" for c in codes]


def connection_close(conn: RawConn) -> None:
    """VerifyConnectionClose."""
    actual = None
    while not conn.closed:
        ev = conn.wait_event()
        if ev.kind == "closed":
            return
        if ev.kind != "timeout" or actual is None:
            actual = ev
    raise Failed(conn, ["Connection closed"], actual)


def connection_error(conn: RawConn, *codes: int) -> None:
    """VerifyConnectionError."""
    actual = None
    while not conn.closed:
        ev = conn.wait_event()
        if ev.kind == "closed":
            return
        if ev.is_(GOAWAY):
            if ev.code in codes:
                return
        elif ev.kind != "timeout" or actual is None:
            actual = ev
    raise Failed(conn, [*_codes(codes, "GOAWAY"), "Connection closed"], actual)


def stream_error(conn: RawConn, *codes: int) -> None:
    """VerifyStreamError."""
    actual = None
    while not conn.closed:
        ev = conn.wait_event()
        if ev.kind == "closed":
            return
        if ev.is_(GOAWAY) or ev.is_(RST_STREAM):
            if ev.code in codes:
                return
        elif ev.kind != "timeout" or actual is None:
            actual = ev
    raise Failed(conn, [*_codes(codes, "GOAWAY"), *_codes(codes, "RST_STREAM"), "Connection closed"], actual)


def stream_close(conn: RawConn) -> None:
    """VerifyStreamClose."""
    actual = None
    while not conn.closed:
        ev = conn.wait_event()
        if (ev.is_(DATA) or ev.is_(HEADERS)) and ev.end_stream:
            return
        if ev.is_(RST_STREAM) and ev.code == 0:
            return
        if ev.kind != "timeout" or actual is None:
            actual = ev
    raise Failed(conn, ["Stream closed"], actual)


def wait_type(conn: RawConn, ftype: int) -> tuple[Event | None, bool]:
    """WaitEventByType: the first frame of that type; else the last thing seen."""
    last = None
    while not conn.closed:
        ev = conn.wait_event()
        if ev.is_(ftype):
            return ev, True
        if ev.kind == "timeout" and last is not None:
            break
        last = ev
    return last, False


def headers_frame(conn: RawConn, sid: int) -> Event:
    """VerifyHeadersFrame: the first HEADERS frame is on stream ``sid``."""
    ev, _ = wait_type(conn, HEADERS)
    if ev is None or not ev.is_(HEADERS) or ev.frame.stream_id != sid:
        raise Failed(conn, [f"HEADERS Frame (stream_id:{sid})"], ev)
    return ev


def settings_ack(conn: RawConn) -> None:
    """VerifySettingsFrameWithAck."""
    ev, _ = wait_type(conn, SETTINGS)
    if ev is None or not ev.is_(SETTINGS) or "ACK" not in ev.frame.flags:
        raise Failed(conn, ["SETTINGS Frame (length:0, flags:0x01, stream_id:0)"], ev)


def ping_ack(conn: RawConn, data: bytes) -> None:
    """VerifyPingFrameWithAck."""
    ev, _ = wait_type(conn, PING)
    if ev is None or not ev.is_(PING) or "ACK" not in ev.frame.flags or ev.frame.opaque_data != data:
        raise Failed(conn, [f"PING Frame (length:8, flags:0x01, stream_id:0, opaque_data:{data!r})"], ev)


def ping_ack_or_close(conn: RawConn, data: bytes) -> None:
    """VerifyPingFrameOrConnectionClose."""
    actual = None
    while not conn.closed:
        ev = conn.wait_event()
        if ev.kind == "closed":
            return
        if ev.is_(PING) and "ACK" in ev.frame.flags and ev.frame.opaque_data == data:
            return
        if ev.kind != "timeout" or actual is None:
            actual = ev
    raise Failed(conn, ["Connection closed", f"PING Frame (flags:0x01, opaque_data:{data!r})"], actual)


def event_type(conn: RawConn, ftype: int) -> Event:
    """VerifyEventType."""
    ev, passed = wait_type(conn, ftype)
    if not passed or ev is None:
        raise Failed(conn, [f"{frame_name(ftype)} Frame"], ev)
    return ev


def goaway_frame(conn: RawConn, *codes: int) -> None:
    """A GOAWAY frame (with one of ``codes``, if given) among the frames that come: the
    checks of h2spec's that wait for a GOAWAY itself, not for the connection to close."""
    ev, passed = wait_type(conn, GOAWAY)
    if not passed or ev is None or (codes and ev.code not in codes):
        raise Failed(conn, _codes(codes, "GOAWAY") if codes else ["GOAWAY Frame"], ev)


def stream_error_and_connection_lives(conn: RawConn, sid: int, code: int, next_sid: int) -> None:
    """RST_STREAM ``code`` on stream ``sid`` (the connection still open: no GOAWAY, no close),
    then a whole call on ``next_sid`` answered with HEADERS on that stream."""
    while True:
        ev = conn.wait_event()
        if ev.is_(RST_STREAM) and ev.frame.stream_id == sid and ev.code == code:
            break
        if ev.kind != "frame" or ev.is_(GOAWAY) or (ev.is_(RST_STREAM) and ev.frame.stream_id == sid):
            raise Failed(conn, [f"RST_STREAM Frame (stream_id:{sid}, Error Code: {code}), the connection open"], ev)
    conn.request(next_sid)
    while True:
        ev = conn.wait_event()
        if ev.is_(HEADERS) and ev.frame.stream_id == next_sid:
            return
        if ev.kind != "frame" or ev.is_(GOAWAY) or (ev.is_(RST_STREAM) and ev.frame.stream_id == next_sid):
            raise Failed(conn, [f"the next call answered: HEADERS Frame (stream_id:{next_sid})"], ev)
