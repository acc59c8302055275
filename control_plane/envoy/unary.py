"""The unary calls Envoy sends, recognised in a read before h2 sees it: what lets the gRPC
transport (:mod:`.transport`) take nearly every call behind Envoy without h2's per-frame
work, which cost about as much CPU as the rest of the call.

Behind Envoy a read is a run of calls, each a HEADERS frame (END_HEADERS and no other flag,
a new stream) and one DATA frame (END_STREAM and no other flag) with its message, the header
block the same for every call once HPACK's dynamic table holds Envoy's constant fields.
grpcio's clients send the same with WINDOW_UPDATE frames around it (on the stream between its
HEADERS and its DATA, on the connection after the DATA), taken too.
:func:`read_unary` walks a read from its start and returns the calls of that exact shape,
stopping at the first frame that is anything else. The transport hands h2 the frames from
there to the next frame that may begin such a call (:func:`h2_run_end`), unchanged, and
tries again after them: every other sequence (any other frame, flag, padding, priority, a
CONTINUATION, a header block HPACK has not decoded before, a frame cut by the end of a read)
goes through h2 as before.

A call is taken here only where h2 would take it without an error and without a frame of its
own: the connection open, the stream id odd and above every id seen, each frame within the
frame size h2 allows, the DATA within both flow-control windows, and a header block that the
kept decoder (:class:`.codec.KeptDecoder`) already holds, so reading it again leaves HPACK's
table as it is. The transport then moves h2's state as h2 would have moved it
(:meth:`.streams.Output.took_unary`), and the equivalence tests hold the two ways to the same
bytes and state (tests/unit/test_grpc_unary_reads.py).

Pure: bytes and the connection's numbers in, the calls out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["UnaryCall", "h2_run_end", "read_unary"]

_DATA, _HEADERS, _WINDOW_UPDATE = 0x0, 0x1, 0x8
_END_STREAM, _END_HEADERS = 0x1, 0x4
_LARGEST_WINDOW = 2**31 - 1


class UnaryCall:
    """One call read beside h2: its stream, its decoded header list and its DATA payload; the
    WINDOW_UPDATE frames on its stream between its HEADERS and its DATA (how many, what they
    add to its window) and those on the connection right after its DATA."""

    __slots__ = ("sid", "headers", "data", "windows", "credit", "connection_windows", "connection_credit")

    def __init__(
        self, *, sid: int, headers: list[Any], data: bytes, windows: int = 0, credit: int = 0,
        connection_windows: int = 0, connection_credit: int = 0,
    ) -> None:  # fmt: skip
        self.sid = sid
        self.headers = headers
        self.data = data
        self.windows = windows
        self.credit = credit
        self.connection_windows = connection_windows
        self.connection_credit = connection_credit


def _window_updates(data: bytes, pos: int, sid: int, room: int) -> tuple[int, int, int]:
    """The WINDOW_UPDATE frames on ``sid`` at ``pos`` that h2 takes without an error (no flag,
    4 bytes, an increment of 1 to 2^31-1, all of them adding at most ``room`` to the window):
    how many, what they add, and where they end."""
    count = total = 0
    head = b"\x00\x00\x04" + bytes((_WINDOW_UPDATE, 0)) + sid.to_bytes(4, "big")
    while data[pos : pos + 9] == head and pos + 13 <= len(data):
        increment = int.from_bytes(data[pos + 9 : pos + 13], "big")
        if not 1 <= increment <= _LARGEST_WINDOW or total + increment > room:
            break
        count, total, pos = count + 1, total + increment, pos + 13
    return count, total, pos


def read_unary(
    data: bytes,
    start: int,
    *,
    highest: int,
    max_frame: int,
    connection_window: int,
    stream_window: int,
    outbound: tuple[int, int],
    headers_of: Callable[[bytes], list[Any] | None],
) -> tuple[list[UnaryCall], int]:
    """The unary calls at ``start`` in ``data`` (a frame's start) and where they end: a HEADERS
    and a DATA each, the window updates a gRPC client sends around them taken too (grpcio
    credits the stream between the two, and the connection after the DATA). ``highest``: the
    highest stream id the peer has opened; ``max_frame``: the largest frame payload allowed;
    ``connection_window`` and ``stream_window``: the inbound windows (the connection's left, a
    new stream's); ``outbound``: the outbound windows (the connection's, a new stream's);
    ``headers_of``: a header block's decoded list where decoding it again changes nothing and
    the request is well formed, else None."""
    calls: list[UnaryCall] = []
    pos, n = start, len(data)
    out_connection, out_stream = outbound
    while pos + 18 <= n:
        if data[pos + 3] != _HEADERS or data[pos + 4] != _END_HEADERS:
            break
        sid = int.from_bytes(data[pos + 5 : pos + 9], "big")  # the reserved bit set: above 2^31, refused below
        size = int.from_bytes(data[pos : pos + 3], "big")
        if not sid & 1 or sid <= highest or sid >= 1 << 31 or size > max_frame:
            break
        windows, credit, at = _window_updates(data, pos + 9 + size, sid, _LARGEST_WINDOW - out_stream)
        length = int.from_bytes(data[at : at + 3], "big")
        end = at + 9 + length
        if (
            at + 9 > n
            or data[at + 3] != _DATA
            or data[at + 4] != _END_STREAM
            or int.from_bytes(data[at + 5 : at + 9], "big") != sid
            or length > max_frame
            or length > connection_window
            or length > stream_window
            or end > n
        ):
            break
        headers = headers_of(data[pos + 9 : pos + 9 + size])
        if headers is None:
            break
        more, added, after = _window_updates(data, end, 0, _LARGEST_WINDOW - out_connection)
        calls.append(
            UnaryCall(
                sid=sid, headers=headers, data=data[at + 9 : end], windows=windows, credit=credit,
                connection_windows=more, connection_credit=added,
            )
        )  # fmt: skip
        connection_window -= length
        out_connection += added
        highest = sid
        pos = after
    return calls, pos


def h2_run_end(data: bytes, start: int, held: bytes) -> int:
    """Where the bytes h2 must read from ``start`` end: past the frame in progress there
    (``held``: its first bytes, which h2 holds already), then at the next frame that may
    begin a unary call (HEADERS with END_HEADERS and no other flag), else at the end of
    ``data``. Always past ``start`` when ``data`` goes on past it."""
    n = len(data)
    header = (held[:9] + data[start : start + 9])[:9]
    if len(header) < 9:
        return n
    end = start + 9 + int.from_bytes(header[:3], "big") - len(held)
    while end + 9 <= n:
        if data[end + 3] == _HEADERS and data[end + 4] == _END_HEADERS:
            return end
        end += 9 + int.from_bytes(data[end : end + 3], "big")
    return n
