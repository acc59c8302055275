"""The gRPC transport's defences, in-process against raw frames and python-hyper's h2 client:
one call per stream whatever follows its END_STREAM, methods cancelled by resets and lost
connections, Rapid Reset, streaming answers held by a closed window, malformed requests as
stream errors, timers (idle, keepalive, held answers) on a moved clock, gzip messages."""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import AsyncIterator

import h2.errors
import h2.events
import pytest
from h2_client import H2Client, grpc_message
from hpack import Encoder
from test_h2_transport import LIMITS, PREFACE, Loopback, frame, frames, goaways, raw

from control_plane.envoy.transport import GrpcConnection
from control_plane.envoy.wire import Call, Limits, Method

pytestmark = pytest.mark.timeout(60)


class Counting(Loopback):
    """A server whose methods count their runs and cancellations."""

    def __init__(self, limits: Limits = LIMITS) -> None:
        super().__init__(limits)
        self.runs = 0
        self.cancelled = 0
        self.methods = {
            "/t.S/Hit": Method("unary", self.hit),
            "/t.S/Hold": Method("unary", self.hold),
            "/t.S/Watch": Method("stream", self.watch),
            "/t.S/Big": Method("each", lambda data, call: b"y" * int(data)),
        }

    async def hit(self, data: bytes, call: Call) -> bytes:
        self.runs += 1
        return b"ok"

    async def hold(self, data: bytes, call: Call) -> bytes:
        self.runs += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return b"done"

    async def watch(self, data: bytes, call: Call) -> AsyncIterator[bytes]:
        self.runs += 1
        try:
            yield b"first"
            await self.release.wait()
            yield b"second"
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            raise

    def connections(self) -> list[GrpcConnection]:
        return list(self.owner.connections)


def request_block(enc: Encoder, path: str, extra: list[tuple[str, str]] | None = None) -> bytes:
    headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "t"),
               ("content-type", "application/grpc"), *(extra or [])]  # fmt: skip
    return enc.encode(headers)


def resets(data: bytes) -> dict[int, int]:
    return {sid: int.from_bytes(p, "big") for t, _, sid, p in frames(data) if t == 3}


async def test_headers_after_end_stream_are_a_stream_error_never_a_second_call() -> None:
    async with Counting() as s:
        enc = Encoder()
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        hold = frame(1, 0x4, 1, request_block(enc, "/t.S/Hold")) + frame(0, 0x1, 1, grpc_message(b""))
        writer.write(PREFACE + frame(4, 0, 0) + hold)
        for _ in range(50):
            await asyncio.sleep(0.02)
            if s.runs:
                break
        assert s.runs == 1  # the call runs (half-closed by the client, not answered yet)
        writer.write(frame(1, 0x5, 1, request_block(enc, "/t.S/Hold")) * 5)  # five more HEADERS, END_STREAM
        writer.write(frame(1, 0x4, 3, request_block(enc, "/t.S/Hit")) + frame(0, 0x1, 3, grpc_message(b"")))
        got = b""
        while b"ok" not in got:
            chunk = await asyncio.wait_for(reader.read(65536), 5)
            assert chunk, frames(got)
            got += chunk
        assert s.runs == 2 and s.cancelled == 1  # stream 1's call once, reset under it; stream 3's
        assert resets(got).get(1) == h2.errors.ErrorCodes.STREAM_CLOSED and not goaways(got)
        # once a call is answered and both sides ended, more HEADERS on it end the connection
        writer.write(frame(1, 0x5, 3, request_block(enc, "/t.S/Hit")))
        while chunk := await asyncio.wait_for(reader.read(65536), 5):
            got += chunk
        assert goaways(got) == [h2.errors.ErrorCodes.STREAM_CLOSED] and s.runs == 2
        writer.close()


async def test_a_reset_or_a_lost_connection_cancels_the_method_and_frees_the_stream() -> None:
    async with Counting() as s:
        c = await H2Client().connect(s.port)
        held = [c.start("/t.S/Hold", grpc_message(b"")) for _ in range(5)]
        watch = c.start("/t.S/Watch", grpc_message(b""))
        await asyncio.wait_for(asyncio.to_thread(lambda: None), 5)
        for _ in range(50):
            if s.runs == 6 and c.answers[watch].data:
                break
            await asyncio.sleep(0.02)
        assert s.runs == 6 and c.answers[watch].data  # the watch's first answer arrived
        for sid in (*held[:2], watch):
            c.conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        c.flush()
        conn = s.connections()[0]
        for _ in range(50):
            if s.cancelled == 3:
                break
            await asyncio.sleep(0.02)
        assert s.cancelled == 3 and set(conn.streams) == set(held[2:])
        assert s.owner.counts["reset_received"] == 3
        await c.close()  # the connection lost: the three left are cancelled too
        for _ in range(50):
            if s.cancelled == 6:
                break
            await asyncio.sleep(0.02)
        assert s.cancelled == 6 and not conn.streams


async def test_rapid_reset_gets_goaway_enhance_your_calm_and_its_calls_never_run() -> None:
    async with Counting() as s:
        enc = Encoder()
        first = request_block(enc, "/t.S/Hit")
        again = request_block(enc, "/t.S/Hit")  # indexed from now on
        data = bytearray(PREFACE + frame(4, 0, 0))
        for i in range(600):
            sid = 1 + 2 * i
            data += frame(1, 0x4, sid, again if i else first) + frame(0, 0x1, sid, grpc_message(b""))
            data += frame(3, 0, sid, b"\0\0\0\x08")  # RST_STREAM CANCEL
        got = await raw(s.port, bytes(data))
        assert goaways(got) == [h2.errors.ErrorCodes.ENHANCE_YOUR_CALM]
        assert s.runs == 0  # each call was reset in the read that opened it
        assert s.owner.counts["goaway_enhance_your_calm"] == 1


async def test_honest_resets_below_the_completed_calls_are_fine() -> None:
    async with Counting() as s:
        c = await H2Client().connect(s.port)
        for _ in range(300):  # a call answered, then one reset: half, not more
            await c.call("/t.S/Hit", b"")
            sid = c.start("/t.S/Hold", grpc_message(b""))
            c.conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
            c.flush()
        a = await c.call("/t.S/Hit", b"")
        assert a.status == 0 and c.terminated is None
        await c.close()


async def test_a_closed_window_holds_one_streamed_answer_and_takes_no_new_calls_past_the_bound() -> None:
    limits = Limits(max_message_bytes=1024, max_streams=64, max_pending_output=64 * 1024)
    async with Counting(limits) as s:
        c = await H2Client(window=0, auto_ack=False).connect(s.port)  # reads nothing, ever
        sid = c.start("/t.S/Big", b"".join(grpc_message(b"40000") for _ in range(20)), end=False)
        others = [c.start("/t.S/Big", grpc_message(b"40000"), end=False) for _ in range(3)]
        await asyncio.sleep(0.3)
        conn = s.connections()[0]
        # one answer each is made and held (40 KB); the next waits for it to leave
        assert 0 < conn.pending <= 4 * 40_005 and len(conn.streams[sid].pending) <= 40_005
        refused = c.start("/t.S/Hit", grpc_message(b""))  # past max_pending_output: refused
        await asyncio.wait_for(c.answers[refused].ended.wait(), 5)
        assert c.answers[refused].reset == h2.errors.ErrorCodes.REFUSED_STREAM
        assert s.owner.counts["refused_stream"] == 1 and all(o in conn.streams for o in others)
        await c.close()


async def test_a_malformed_request_is_a_stream_error_logged_on_one_line(caplog: pytest.LogCaptureFixture) -> None:
    async with Counting() as s:
        enc = Encoder()
        bad = enc.encode([(":method", "POST"), (":scheme", "http"), (":path", "/t.S/Hit"), ("", "empty name")])
        good = request_block(enc, "/t.S/Hit")  # encoded in the order sent (HPACK's table)
        data = PREFACE + frame(4, 0, 0) + frame(1, 0x5, 1, bad)
        data += frame(1, 0x4, 3, good) + frame(0, 0x1, 3, grpc_message(b""))
        with caplog.at_level(logging.INFO, logger="shadowlimit.grpc"):
            got = await raw(s.port, data, until=b"ok")
        assert resets(got) == {1: h2.errors.ErrorCodes.PROTOCOL_ERROR} and not goaways(got) and s.runs == 1
        lines = [r for r in caplog.records if r.name == "shadowlimit.grpc"]
        assert len(lines) == 1 and "\n" not in lines[0].getMessage() and lines[0].exc_info is None
        assert s.owner.counts["bad_header"] == 1


async def test_gzip_messages_are_read_and_encodings_announced() -> None:
    async with Counting() as s:
        c = await H2Client().connect(s.port)
        sid = c.start("/t.S/Hit", grpc_message(gzip.compress(b"x"), compressed=True), extra=[("grpc-encoding", "gzip")])
        await asyncio.wait_for(c.answers[sid].ended.wait(), 5)
        a = c.answers[sid]
        assert a.status == 0 and a.messages() == [b"ok"] and "gzip" in a.headers["grpc-accept-encoding"]
        await c.close()


async def test_timers_on_a_moved_clock() -> None:
    limits = Limits(idle_timeout_s=30, keepalive_s=10, keepalive_timeout_s=5)
    async with Counting(limits) as s:
        c = await H2Client().connect(s.port)
        await c.call("/t.S/Hit", b"")
        conn = s.connections()[0]
        t0 = conn.last_frame
        conn.tick(t0 + 9)
        assert conn.ping_sent is None  # heard from 9 s ago: no PING yet
        conn.tick(t0 + 10)
        assert conn.ping_sent == t0 + 10
        for _ in range(50):  # h2's client answers the PING: its ACK clears it
            await asyncio.sleep(0.02)
            if conn.ping_sent is None:
                break
        assert conn.ping_sent is None
        conn.tick(t0 + 31)  # no stream for 30 s: GOAWAY, closed
        await asyncio.wait_for(c.closed.wait(), 5)
        assert s.owner.counts["idle_close"] == 1 and c.terminated is not None
    async with Counting(limits) as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        writer.write(PREFACE + frame(4, 0, 0))  # a peer that never answers a PING
        await asyncio.sleep(0.1)
        conn = s.connections()[0]
        now = conn.last_frame
        conn.tick(now + 10)
        conn.tick(now + 14)
        assert not conn.closing
        conn.tick(now + 15.5)
        assert conn.closing and s.owner.counts["keepalive_timeout"] == 1
        writer.close()


async def test_answers_held_by_the_window_too_long_close_the_connection() -> None:
    limits = Limits(keepalive_s=100, keepalive_timeout_s=5)
    async with Counting(limits) as s:
        c = await H2Client(window=0, auto_ack=False).connect(s.port)
        c.start("/t.S/Hit", grpc_message(b""))
        await asyncio.sleep(0.2)
        conn = s.connections()[0]
        assert conn.blocked
        conn.tick(conn.last_drain + 4)
        assert not conn.closing
        conn.tick(conn.last_drain + 5)
        assert conn.closing and s.owner.counts["flow_control"] == 1
        await c.close()


async def test_a_big_read_is_handed_to_h2_in_slices_and_every_call_answered() -> None:
    limits = Limits(read_slice=4096, max_streams=4096)
    async with Counting(limits) as s:
        enc = Encoder()
        block = request_block(enc, "/t.S/Hit")
        data = bytearray(PREFACE + frame(4, 0, 0))
        for i in range(1000):
            sid = 1 + 2 * i
            data += frame(1, 0x4, sid, block) + frame(0, 0x1, sid, grpc_message(b""))
            block = request_block(enc, "/t.S/Hit")
        got = await raw(s.port, bytes(data), read_s=1.0)
        ended = {sid for t, f, sid, _ in frames(got) if t == 1 and f & 0x1}
        assert len(ended) == 1000 and s.runs == 1000


def test_the_kinds_counted_are_the_metrics_kinds() -> None:
    from control_plane.envoy.transport import PROTOCOL_KINDS
    from control_plane.observe.metrics import GRPC_PROTOCOL_KINDS

    assert set(PROTOCOL_KINDS) == set(GRPC_PROTOCOL_KINDS)


async def test_owner_sees_every_connection_admitted_and_closed() -> None:
    async with Counting() as s:
        clients = [await H2Client().connect(s.port) for _ in range(3)]
        for c in clients:
            await c.call("/t.S/Hit", b"")
        assert len(s.owner.connections) == 3
        for c in clients:
            await c.close()
        for _ in range(50):
            if not s.owner.connections:
                break
            await asyncio.sleep(0.02)
        assert not s.owner.connections
