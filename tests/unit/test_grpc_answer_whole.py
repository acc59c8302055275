"""The transport's whole-answer path (control_plane/envoy/streams.py, ``Output.answer_whole``):
a unary answer written beside h2 must be what h2 itself writes, byte for byte, and must leave
h2's state as h2's own ``send_headers``/``send_data`` would leave it, so that whatever the
peer sends next is answered the same. Each case runs one client's bytes through two
connections, one as served and one where h2 writes every answer (tests/grpc_twins.py), and
compares what each wrote and kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc_twins as twins
import h2.config
import h2.connection
import h2.settings
import pytest
from h2_client import grpc_message
from hyperframe.frame import DataFrame, HeadersFrame, RstStreamFrame, WindowUpdateFrame

from control_plane.envoy.wire import Call, Limits, Method, RpcError, StatusCode

pytestmark = pytest.mark.timeout(60)

PATH = "/t.S/Echo"
HEADERS = [
    (b":method", b"POST"), (b":scheme", b"http"), (b":path", PATH.encode()), (b":authority", b"t"),
    (b"content-type", b"application/grpc"), (b"te", b"trailers"),
]  # fmt: skip


async def echo(data: bytes, call: Call) -> bytes:
    if data == b"fail":
        raise RpcError(StatusCode.INVALID_ARGUMENT, "no")
    return data[::-1] * (1 if data != b"big" else 7_000)


def client() -> h2.connection.H2Connection:
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    c.initiate_connection()
    return c


def frame(f: Any, **fields: Any) -> bytes:
    for name, value in fields.items():
        setattr(f, name, value)
    return bytes(f.serialize())


class Pair(twins.Pair):
    """The served connection (whole answers and Envoy's calls read beside h2) and an h2-only one."""

    def __init__(self, limits: Limits) -> None:
        super().__init__({PATH: Method("unary", echo)}, limits)


def calls(c: h2.connection.H2Connection, bodies: list[bytes], end: bool = True) -> tuple[list[int], bytes]:
    sids = []
    for body in bodies:
        sid = c.get_next_available_stream_id()
        c.send_headers(sid, HEADERS)
        c.send_data(sid, grpc_message(body), end_stream=end)
        sids.append(sid)
    return sids, c.data_to_send()


LIMITS = Limits(max_message_bytes=4096)
AFTER: dict[str, Callable[[int], bytes]] = {
    "nothing": lambda sid: b"",
    "a WINDOW_UPDATE on the closed stream": lambda sid: frame(WindowUpdateFrame(sid), window_increment=10),
    "an RST_STREAM on the closed stream": lambda sid: frame(RstStreamFrame(sid), error_code=8),
    "DATA on the closed stream": lambda sid: frame(DataFrame(sid), data=b"x"),
    "HEADERS on the closed stream": lambda sid: frame(HeadersFrame(sid), data=b"\x82", flags={"END_HEADERS"}),
}


@pytest.mark.parametrize("after", list(AFTER))
async def test_unary_answers_are_what_h2_writes_and_leave_h2_as_h2_would(
    after: str,
) -> None:
    pair = Pair(LIMITS)
    c = client()
    await pair.feed(c.data_to_send())
    sids, data = calls(c, [b"abc", b"de", b"fail", b"", b"xyz" * 100])
    await pair.feed(data)
    pair.same()
    assert pair.whole == 4  # every answer with a message, the error (trailers only) by h2
    extra = AFTER[after](sids[0])
    if extra:
        await pair.feed(extra)
        pair.same()
    # the connection goes on (when h2 let it): the next calls answered the same way
    if not pair.served.closing:
        _, data = calls(c, [b"more", b"again"])
        await pair.feed(data)
        pair.same()
        assert pair.whole == 6


async def test_answers_the_window_cannot_take_and_open_requests_go_through_h2() -> None:
    pair = Pair(LIMITS)
    c = client()
    c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 64})
    await pair.feed(c.data_to_send())
    # larger than the stream's window of 64 bytes: sent in part and held, by h2
    _, data = calls(c, [b"x" * 100])
    await pair.feed(data)
    pair.same()
    # a request still open (no END_STREAM): answered, then reset NO_ERROR, by h2
    _, data = calls(c, [b"ab"], end=False)
    await pair.feed(data)
    pair.same()
    assert pair.whole == 0


async def test_the_connection_window_spent_by_whole_answers_is_what_h2_spends() -> None:
    pair = Pair(Limits(max_message_bytes=65_536))
    c = client()
    await pair.feed(c.data_to_send())
    # an answer whole, then answers of 21,000 bytes (over a frame of 16,384: by h2, in
    # frames) until the connection's window of 65,535 is spent; the answers it cannot take
    # wait (held, by h2) for a WINDOW_UPDATE on stream 0; then answers are whole again
    _, data = calls(c, [b"abc", b"big", b"big", b"big", b"big", b"abc"])
    await pair.feed(data)
    pair.same()
    assert pair.whole == 1 and pair.served.blocked
    await pair.feed(frame(WindowUpdateFrame(0), window_increment=1_000_000))
    pair.same()
    assert not pair.served.blocked
    _, data = calls(c, [b"abc"])
    await pair.feed(data)
    pair.same()
    assert pair.whole == 2
