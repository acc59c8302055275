"""The gRPC transport (control_plane/envoy/transport.py) at the protocol level, against an HTTP/2
client of its own (python-hyper's h2) on loopback: answers and trailers, errors as
trailers only, flow control with a tiny window, resets, pings, bounds, HPACK's dynamic table,
a late or wrong preface, GOAWAY when the server stops. The rate limit service on top of it is
tested through grpcio and a real Envoy (tests/e2e/test_envoy_*.py)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from typing import Any, Self

import h2.errors
import h2.events
import pytest
from grpc_twins import Owner
from h2_client import H2Client, grpc_message
from hpack import Encoder

from control_plane.envoy.codec import KeptDecoder
from control_plane.envoy.transport import GrpcConnection
from control_plane.envoy.wire import Call, Limits, Method, RpcError, StatusCode, parse_timeout

pytestmark = pytest.mark.timeout(60)


class Loopback:
    """A GrpcConnection server on a loopback port for one test: ``async with``; its methods are the subclass's."""

    methods: dict[str, Method]

    def __init__(self, limits: Limits) -> None:
        self.owner = Owner()
        self.limits = limits
        self.release = asyncio.Event()

    async def __aenter__(self) -> Self:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: GrpcConnection(self.methods, self.limits, self.owner), "127.0.0.1", 0
        )
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        self.server.close()
        for c in list(self.owner.connections):
            c.transport.close()


class Server(Loopback):
    def __init__(self, limits: Limits) -> None:
        super().__init__(limits)
        self.seen: list[Call] = []
        self.methods = {
            "/t.S/Echo": Method("unary", self.echo),
            "/t.S/Big": Method("unary", self.big),
            "/t.S/Wait": Method("unary", self.wait),
            "/t.S/Fail": Method("unary", self.fail),
            "/t.S/Bug": Method("unary", self.bug),
            "/t.S/Each": Method("each", lambda data, call: data.upper()),
            "/t.S/Count": Method("stream", self.count),
        }

    async def echo(self, data: bytes, call: Call) -> bytes:
        self.seen.append(call)
        return data[::-1]

    async def big(self, data: bytes, call: Call) -> bytes:
        return b"x" * int(data)

    async def wait(self, data: bytes, call: Call) -> bytes:
        await self.release.wait()
        return b"done"

    async def fail(self, data: bytes, call: Call) -> bytes:
        raise RpcError(StatusCode.INVALID_ARGUMENT, "bad 100% ünïcode\nline")

    async def bug(self, data: bytes, call: Call) -> bytes:
        raise ValueError("a bug")

    async def count(self, data: bytes, call: Call) -> AsyncIterator[bytes]:
        for i in range(int(data)):
            yield str(i).encode()


# the tests' bounds (a server per test, in the test's own event loop)
LIMITS = Limits(max_message_bytes=1024, max_streams=64, preface_timeout_s=0.5)


async def client(s: Server, **kw: Any) -> H2Client:
    return await H2Client(**kw).connect(s.port)


async def test_a_unary_call_is_headers_data_trailers_with_metadata_and_deadline() -> None:
    async with Server(LIMITS) as served:
        c = await client(served)
        a = await c.call("/t.S/Echo", b"abc", extra=[("grpc-timeout", "250m"), ("authorization", "Bearer t")])
        assert a.headers[":status"] == "200" and a.headers["content-type"] == "application/grpc"
        assert a.messages() == [b"cba"] and a.status == StatusCode.OK and "grpc-message" not in a.trailers
        call = served.seen[-1]
        assert call.header("authorization") == "Bearer t" and call.path == "/t.S/Echo"
        assert not any(k.startswith(":") or k == "grpc-timeout" for k, _ in call.metadata)
        assert call.deadline is not None
        # many calls on one connection, answered in any order, each on its stream
        answers = await asyncio.gather(*[c.call("/t.S/Echo", f"m{i}".encode()) for i in range(50)])
        assert [a.messages() for a in answers] == [[f"m{i}".encode()[::-1]] for i in range(50)]
        await c.close()


async def test_errors_are_trailers_only_with_a_percent_encoded_message() -> None:
    async with Server(LIMITS) as served:
        c = await client(served)
        a = await c.call("/t.S/Fail", b"")
        assert a.status == StatusCode.INVALID_ARGUMENT and not a.data and not a.trailers  # trailers only
        assert a.headers[":status"] == "200" and a.headers["grpc-message"] == "bad 100%25 %C3%BCn%C3%AFcode%0Aline"
        a = await c.call("/t.S/Bug", b"")
        assert a.status == StatusCode.INTERNAL and "a bug" not in a.headers.get("grpc-message", "")
        a = await c.call("/t.S/Nope", b"")
        assert a.status == StatusCode.UNIMPLEMENTED and "/t.S/Nope" in a.headers["grpc-message"]
        a = await c.call("/t.S/Echo", b"x" * 2000)  # over max_message_bytes
        assert a.status == StatusCode.RESOURCE_EXHAUSTED
        sid = c.start("/t.S/Echo", grpc_message(b"zip", compressed=True))  # compressed, no grpc-encoding
        await c.answers[sid].ended.wait()
        assert c.answers[sid].status == StatusCode.INTERNAL
        sid = c.start("/t.S/Echo", grpc_message(b"a") + grpc_message(b"b"))  # two messages to a unary method
        await c.answers[sid].ended.wait()
        assert c.answers[sid].status == StatusCode.INTERNAL
        sid = c.start("/t.S/Echo", None, method="GET")
        await c.answers[sid].ended.wait()
        assert c.answers[sid].headers[":status"] == "405"
        sid = c.start("/t.S/Echo", grpc_message(b"a"), content_type="text/plain")
        await c.answers[sid].ended.wait()
        assert c.answers[sid].headers[":status"] == "415"
        a = await c.call("/t.S/Echo", b"still fine")
        assert a.messages() == [b"enif llits"] and c.terminated is None
        await c.close()


async def test_an_answer_larger_than_a_tiny_window_waits_for_window_updates() -> None:
    async with Server(LIMITS) as served:
        c = await client(served, window=10)
        a = await c.call("/t.S/Big", b"700")
        assert a.messages() == [b"x" * 700] and a.status == StatusCode.OK
        a = await c.call("/t.S/Big", b"20000")  # over the default frame size too: split into frames
        assert a.messages() == [b"x" * 20000]
        await c.close()


async def test_an_answer_held_by_the_window_is_sent_when_the_window_opens() -> None:
    async with Server(LIMITS) as served:
        c = await client(served, window=16, auto_ack=False)
        sid = c.start("/t.S/Big", grpc_message(b"100"))
        await asyncio.sleep(0.2)
        a = c.answers[sid]
        assert len(a.data) == 16 and not a.ended.is_set()  # the window's worth, then it waits
        c.conn.increment_flow_control_window(1000, sid)
        c.conn.increment_flow_control_window(1000)
        c.flush()
        await asyncio.wait_for(a.ended.wait(), 5)
        assert a.messages() == [b"x" * 100] and a.status == StatusCode.OK
        await c.close()


async def test_a_reset_stream_is_dropped_and_the_connection_goes_on() -> None:
    async with Server(LIMITS) as served:
        c = await client(served)
        sid = c.start("/t.S/Wait", grpc_message(b""))
        await asyncio.sleep(0.05)
        c.conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        c.flush()
        served.release.set()
        a = await c.call("/t.S/Echo", b"ok")
        assert a.messages() == [b"ko"] and not c.answers[sid].data and c.terminated is None
        await c.close()


async def test_ping_is_answered_while_calls_wait() -> None:
    async with Server(LIMITS) as served:
        c = await client(served)
        await c.call("/t.S/Echo", b"settings exchanged")
        c.conn.ping(b"12345678")
        c.flush()
        waiting = [c.start("/t.S/Wait", grpc_message(b"")) for _ in range(8)]
        await asyncio.sleep(0.2)
        assert any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"12345678" for e in c.events)
        served.release.set()
        done = await asyncio.gather(*[asyncio.wait_for(c.answers[s].ended.wait(), 5) for s in waiting])
        assert len(done) == 8 and all(c.answers[s].messages() == [b"done"] for s in waiting)
        await c.close()


async def test_a_stream_over_the_bound_is_refused_and_counted() -> None:
    async with Server(Limits(max_streams=2)) as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        enc = Encoder()
        out = bytearray(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0))
        for sid in (1, 3, 5):  # three streams at once, the third past the bound of 2
            block = enc.encode(
                [(":method", "POST"), (":scheme", "http"), (":path", "/t.S/Wait"), (":authority", "t"),
                 ("content-type", "application/grpc")]
            )  # fmt: skip
            out += frame(1, 0x4, sid, block)
        writer.write(bytes(out))
        seen = b""
        while b"\x00\x00\x04\x03\x00\x00\x00\x00\x05" not in seen:  # RST_STREAM on stream 5
            chunk = await asyncio.wait_for(reader.read(4096), 5)
            assert chunk, f"the connection closed instead: {seen!r}"
            seen += chunk
        assert struct.unpack(">L", seen[seen.index(b"\x00\x00\x04\x03\x00\x00\x00\x00\x05") + 9 :][:4])[0] == 7
        assert s.owner.counts["refused_stream"] == 1
        writer.close()


async def test_each_and_stream_methods() -> None:
    async with Server(LIMITS) as served:
        c = await client(served)
        sid = c.start("/t.S/Each", grpc_message(b"a") + grpc_message(b"bc"), end=False)
        await asyncio.sleep(0.1)
        assert c.answers[sid].messages() == [b"A", b"BC"]
        c.conn.send_data(sid, grpc_message(b"d"), end_stream=True)
        c.flush()
        await asyncio.wait_for(c.answers[sid].ended.wait(), 5)
        assert c.answers[sid].messages() == [b"A", b"BC", b"D"] and c.answers[sid].status == 0
        a = await c.call("/t.S/Count", b"3")
        assert a.messages() == [b"0", b"1", b"2"] and a.status == 0
        await c.close()


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + sid.to_bytes(4, "big") + payload


async def raw(port: int, data: bytes, until: bytes | None = None, read_s: float = 2.0) -> bytes:
    """Send ``data`` raw, read until the connection closes, ``until`` is seen or ``read_s`` of quiet."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    got = b""
    try:
        while until is None or until not in got:
            chunk = await asyncio.wait_for(reader.read(65536), read_s)
            if not chunk:
                break
            got += chunk
    except TimeoutError:
        pass
    writer.close()
    return got


def goaway_code(data: bytes) -> int | None:
    """The error code of the first GOAWAY among ``data``'s frames (after the server's preface)."""
    codes = goaways(data)
    return codes[0] if codes else None


def goaways(data: bytes) -> list[int]:
    """The error codes of the GOAWAY frames among ``data``'s frames."""
    return [int.from_bytes(p[4:8], "big") for t, _, _, p in frames(data) if t == 7]


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


async def test_bad_frames_end_the_connection_with_goaway_naming_the_error() -> None:
    async with Server(LIMITS) as served:
        cases = {
            "frame too big": (frame(0, 0, 1, b"x" * 20000), 0x6),
            "DATA on an idle stream": (frame(0, 0, 9, b"x"), 0x1),
            "PUSH_PROMISE from a client": (frame(5, 0x4, 1, b"\x00\x00\x00\x02"), 0x1),
            "a header block HPACK cannot read": (frame(1, 0x5, 1, b"\xff\xff\xff\xff\x7f"), 0x9),
            "CONTINUATION flood": (frame(1, 0, 1, b"\x82") + frame(9, 0, 1, b"\x00" * 16000) * 6, 0xB),
            "an even stream id": (frame(1, 0x5, 2, b"\x83"), 0x1),
            "a bad SETTINGS": (frame(4, 0, 0, b"\x00\x04\xff\xff\xff\xff"), 0x3),
        }
        for what, (data, code) in cases.items():
            got = await raw(served.port, PREFACE + frame(4, 0, 0) + data)
            assert goaway_code(got) == code, what


async def test_a_late_or_wrong_preface_closes_the_connection_and_a_late_one_is_counted() -> None:
    async with Server(LIMITS) as served:
        got = await raw(served.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", read_s=2.0)
        assert b"HTTP/1.1" not in got  # closed, nothing answered in HTTP/1
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(PREFACE[:5])  # then nothing: closed after preface_timeout_s (0.5 s)
        while await asyncio.wait_for(reader.read(4096), 5):
            pass
        writer.close()
        assert served.owner.slow_count == 1


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each whole frame in ``data``."""
    out, pos = [], 0
    while pos + 9 <= len(data):
        n = int.from_bytes(data[pos : pos + 3], "big")
        sid = int.from_bytes(data[pos + 5 : pos + 9], "big")
        out.append((data[pos + 3], data[pos + 4], sid, data[pos + 9 : pos + 9 + n]))
        pos += 9 + n
    return out


async def test_a_stopping_server_says_goaway_and_finishes_the_calls_it_took() -> None:
    # python-hyper's h2 drops a stream's frames after GOAWAY, so the frames are read raw here
    # (grpcio and Envoy finish them: tests/e2e/test_envoy_grpc.py stops a serving server)
    async with Server(LIMITS) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        block = Encoder().encode(
            [(":method", "POST"), (":scheme", "http"), (":path", "/t.S/Wait"), (":authority", "t"),
             ("content-type", "application/grpc")]
        )  # fmt: skip
        writer.write(PREFACE + frame(4, 0, 0) + frame(1, 0x4, 1, block) + frame(0, 0x1, 1, grpc_message(b"")))
        await asyncio.sleep(0.1)
        for conn in list(served.owner.connections):
            conn.shutdown()
        await asyncio.sleep(0.1)
        served.release.set()
        got = b""
        while chunk := await asyncio.wait_for(reader.read(65536), 5):  # closed once the call was answered
            got += chunk
        writer.close()
    kinds = [(t, sid) for t, _, sid, _ in frames(got) if t in (0, 1, 7)]
    goaway = [p for t, _, _, p in frames(got) if t == 7][0]
    assert struct.unpack(">LL", goaway[:8]) == (1, 0)  # the last stream it takes: 1; NO_ERROR
    assert kinds == [(7, 0), (1, 1), (0, 1), (1, 1)]  # GOAWAY, then the answer: headers, data, trailers
    assert [p for t, _, sid, p in frames(got) if t == 0][0] == grpc_message(b"done")


def test_a_kept_header_block_is_not_used_once_the_dynamic_table_changed() -> None:
    enc, dec = Encoder(), KeptDecoder(16 * 1024)
    first = enc.encode([("x-a", "1")])  # a literal added to the table
    assert dec.decode(first) == [(b"x-a", b"1")]
    again = enc.encode([("x-a", "1")])  # now indexed: the same bytes mean "entry 62"
    assert dec.decode(again) == [(b"x-a", b"1")] and dec.decode(again) == [(b"x-a", b"1")]
    dec.decode(enc.encode([("x-b", "2")]))  # a new entry: 62 is x-b now
    assert again == enc.encode([("x-b", "2")]) and dec.decode(again) == [(b"x-b", b"2")]


def test_grpc_timeout_units() -> None:
    assert parse_timeout("20m") == pytest.approx(0.02) and parse_timeout("3S") == 3.0
    assert parse_timeout("1H") == 3600 and parse_timeout("500u") == pytest.approx(0.0005)
    for bad in ("", "m", "123456789m", "20x", "-1m", "2.5S", "１S"):
        with pytest.raises(ValueError, match="grpc-timeout"):
            parse_timeout(bad)
