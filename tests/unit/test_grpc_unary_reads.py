"""Envoy's unary calls read beside h2 (control_plane/envoy/unary.py): a connection that reads
them so, and writes whole answers beside h2, must write what a connection where h2 reads and
writes every frame writes, end the same way, count the same protocol events and keep the same
HTTP/2 state (tests/grpc_twins.py compares them). Envoy's own reads (captured from Envoy 1.40
behind wrk), every sequence hypothesis draws from the frames a client may send (calls held open
by a slow method while resets, window updates, settings, pings, priorities, trailers, padding,
CONTINUATIONs, bad stream ids and a changing HPACK table arrive around them, each read split at
random), and the hostile clients' streams (rapid resets, floods, windows) are fed to both.
tests/e2e/test_h2_conformance.py runs every h2spec case through both ways at once."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from grpc_twins import Pair
from hpack import Encoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.envoy.frames import WALK_NEW_STREAMS
from control_plane.envoy.transport import RESET_GRACE
from control_plane.envoy.unary import read_unary
from control_plane.envoy.wire import Call, Limits, Method, RpcError, StatusCode

pytestmark = pytest.mark.timeout(120)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 2, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x4, 0x8, 0x20
LIMITS = Limits(max_message_bytes=4096, max_streams=16)


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + sid.to_bytes(4, "big") + payload


def message(payload: bytes) -> bytes:
    return len(payload).to_bytes(5, "big") + payload


class Held:
    """The test's methods; ``/t.S/Wait`` holds its answer until :meth:`release`."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    def release(self) -> None:
        self.gate.set()
        self.gate = asyncio.Event()

    async def echo(self, data: bytes, call: Call) -> bytes:
        return data[::-1]

    async def wait(self, data: bytes, call: Call) -> bytes:
        await self.gate.wait()
        return b"done"

    async def fail(self, data: bytes, call: Call) -> bytes:
        raise RpcError(StatusCode.INVALID_ARGUMENT, "no")

    async def big(self, data: bytes, call: Call) -> bytes:
        return b"x" * 20_000

    def methods(self) -> dict[str, Method]:
        return {
            "/t.S/Echo": Method("unary", self.echo),
            "/t.S/Wait": Method("unary", self.wait),
            "/t.S/Fail": Method("unary", self.fail),
            "/t.S/Big": Method("unary", self.big),
        }


class Client:
    """The client's side: an HPACK encoder and the next stream id."""

    def __init__(self) -> None:
        self.encoder = Encoder()
        self.sid = 1
        self.opened: list[int] = []

    def head(self, path: str = "/t.S/Echo", extra: tuple[tuple[str, str], ...] = ()) -> bytes:
        return bytes(
            self.encoder.encode(
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", path),
                    (":authority", "t"),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                    *extra,
                ]  # fmt: skip
            )
        )

    def new(self) -> int:
        sid, self.sid = self.sid, self.sid + 2
        self.opened.append(sid)
        return sid

    def call(self, path: str = "/t.S/Echo", body: bytes = b"abc", **kw: Any) -> bytes:
        sid = kw.pop("sid", None) or self.new()
        block = kw.pop("block", None) or self.head(path, kw.pop("extra", ()))
        end = END_STREAM if kw.pop("end", True) else 0
        return frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, end, sid, message(body))

    def start(self) -> bytes:
        return PREFACE + frame(SETTINGS, 0, 0)

    def warm(self, n: int = 3) -> bytes:
        """Calls until the header block is one the server's decoder keeps (the third on)."""
        return b"".join(self.call() for _ in range(n))


async def started(held: Held, limits: Limits = LIMITS) -> tuple[Pair, Client]:
    pair, c = Pair(held.methods(), limits), Client()
    await pair.feed(c.start() + frame(SETTINGS, 0x1, 0), c.warm())
    pair.same()
    return pair, c


def envoy_reads() -> list[bytes]:
    """Reads as Envoy 1.40 sent them to the rate limit service behind wrk (32 connections):
    its first call's block with incremental indexing, then one 54-byte block for every call
    (``:path`` a literal not indexed), runs of HEADERS and DATA with END_STREAM cut anywhere."""
    first = bytes.fromhex(
        "8304ab60b5773fa5d05b3b98855ec1a4b41a93257eecafb4692e735264ee2d9dcc42b1ba73db449b4692e735264f4186b0692d06"
        "a4c98640027465864d833505b11f40899acac8b24d494f6a7f8210295f8b1d75d0620d263d4c4d6564408cf2b16aee7f4b1aa496"
        "ca8747834d9697408bf2b4a7b3c0ec90b22d29ec870be25c0b89717f4096f2b16aee7f4b17cd65224b22d6765926a4a7b52b528f"
        "023230"
    )
    again = bytes.fromhex(
        "8304ab60b5773fa5d05b3b98855ec1a4b41a93257eecafb4692e735264ee2d9dcc42b1ba73db449b4692e735264fc486c3c2c1c0bfbe"
    )
    payload = bytes.fromhex("0a0562656e636812160a140a0e72656d6f74655f6164647265737312026b")  # ...remote_address k
    rng = random.Random(7)
    stream = bytearray(
        PREFACE + frame(SETTINGS, 0, 0, bytes.fromhex("000200000000000100001000000800000000000300000400000401000000"))
    )
    stream += frame(WINDOW_UPDATE, 0, 0, (0x7F0001).to_bytes(4, "big")) + frame(SETTINGS, 0x1, 0)
    for i in range(400):
        body = payload + str(i % 10).encode()
        stream += frame(HEADERS, END_HEADERS, 2 * i + 1, first if i == 0 else again) + frame(
            DATA, END_STREAM, 2 * i + 1, message(body)
        )
    reads, pos = [], 0
    while pos < len(stream):
        n = rng.choice((54 + 45, 500, 1700, 3500, rng.randrange(1, 4000)))
        reads.append(bytes(stream[pos : pos + n]))
        pos += n
    return reads


async def test_envoys_own_reads_are_taken_beside_h2_and_answered_as_h2_answers() -> None:
    held = Held()
    methods = {"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit": Method("unary", held.echo)}
    pair = Pair(methods, Limits())
    reads = envoy_reads()
    for read in reads:
        await pair.feed(read)
        pair.same()
    pair.same(settle=True)
    # every call but the first two (blocks HPACK had not decoded before) and those a read's end cuts
    assert pair.taken >= 400 - 2 - len(reads)
    assert not pair.served.streams and pair.served.finished_calls == 400
    await pair.close()


async def test_grpcio_clients_reads_with_their_window_updates_are_taken_and_answered_as_h2_answers() -> None:
    """grpcio's client (1.85) sends each call as HEADERS, a WINDOW_UPDATE of its stream, the
    DATA, then a WINDOW_UPDATE of the connection, and a PING now and then (its BDP probe)."""
    held = Held()
    pair, c = await started(held, Limits(max_message_bytes=4096))
    stream = bytearray()
    for i in range(300):
        sid = c.new()
        stream += frame(HEADERS, END_HEADERS, sid, c.head()) + frame(WINDOW_UPDATE, 0, sid, (5).to_bytes(4, "big"))
        stream += frame(DATA, END_STREAM, sid, message(b"m%d" % i)) + frame(WINDOW_UPDATE, 0, 0, (7).to_bytes(4, "big"))
        if i % 50 == 7:
            stream += frame(PING, 0, 0, i.to_bytes(8, "big"))
    rng = random.Random(11)
    pos = 0
    while pos < len(stream):
        n = rng.choice((60, 300, 1200, rng.randrange(1, 2000)))
        await pair.feed(bytes(stream[pos : pos + n]))
        pair.same()
        pos += n
    pair.same(settle=True)
    assert pair.taken >= 150 and pair.served.finished_calls == 303
    await pair.close()


def test_read_unary_stops_at_the_first_frame_of_another_shape() -> None:
    c = Client()
    block = c.head()
    calls_bytes = c.call(block=block) + c.call(block=block)
    kept = {block: [(b":path", b"/t.S/Echo")]}
    common = {
        "max_frame": 16_384, "connection_window": 1 << 20, "stream_window": 65_535, "outbound": (65_535, 65_535),
        "headers_of": kept.get,
    }  # fmt: skip
    calls, taken = read_unary(calls_bytes, 0, highest=0, **common)
    assert [x.sid for x in calls] == [1, 3] and taken == len(calls_bytes)
    assert calls[0].data == message(b"abc")
    # each of these ends the run where it starts: the calls before it are taken
    for tail in (
        frame(HEADERS, END_HEADERS | END_STREAM, 5, block),  # END_STREAM on the HEADERS
        frame(HEADERS, END_HEADERS | PADDED, 5, b"\x00" + block),
        frame(HEADERS, END_HEADERS | PRIORITY_FLAG, 5, bytes(5) + block),
        frame(HEADERS, 0, 5, block) + frame(CONTINUATION, END_HEADERS, 5),
        frame(HEADERS, END_HEADERS, 4, block) + frame(DATA, END_STREAM, 4, message(b"x")),  # an even id
        frame(HEADERS, END_HEADERS, 3, block) + frame(DATA, END_STREAM, 3, message(b"x")),  # not above the last
        frame(HEADERS, END_HEADERS, 5 | 1 << 31, block) + frame(DATA, END_STREAM, 5 | 1 << 31, message(b"x")),
        frame(HEADERS, END_HEADERS, 5, block) + frame(DATA, 0, 5, message(b"x")),  # the request stays open
        frame(HEADERS, END_HEADERS, 5, block) + frame(DATA, END_STREAM | PADDED, 5, b"\x00" + message(b"x")),
        frame(HEADERS, END_HEADERS, 5, block) + frame(DATA, END_STREAM, 7, message(b"x")),  # another stream
        frame(HEADERS, END_HEADERS, 5, block) + frame(RST_STREAM, 0, 5, bytes(4)),
        frame(HEADERS, END_HEADERS, 5, block + b"\x82") + frame(DATA, END_STREAM, 5, message(b"x")),  # not kept
        frame(HEADERS, END_HEADERS, 5, block) + frame(DATA, END_STREAM, 5, bytes(16_385)),  # past the frame size
        frame(HEADERS, END_HEADERS, 5, block) + frame(DATA, END_STREAM, 5, message(b"x"))[:-1],  # not all in
        frame(PING, 0, 0, bytes(8)),
    ):
        calls, taken = read_unary(calls_bytes + tail, 0, highest=0, **common)
        assert [x.sid for x in calls] == [1, 3] and taken == len(calls_bytes), tail
    # grpcio's window updates: on the stream between its HEADERS and DATA, on the connection after it
    wu = lambda sid, n, flags=0: frame(WINDOW_UPDATE, flags, sid, n.to_bytes(4, "big"))  # noqa: E731
    grpcio = (
        frame(HEADERS, END_HEADERS, 1, block) + wu(1, 5) + wu(1, 7) + frame(DATA, END_STREAM, 1, message(b"a"))
        + wu(0, 5) + frame(HEADERS, END_HEADERS, 3, block) + frame(DATA, END_STREAM, 3, message(b"b")) + wu(0, 9)
    )  # fmt: skip
    calls, taken = read_unary(grpcio, 0, highest=0, **common)
    assert taken == len(grpcio) and [(x.sid, x.windows, x.credit) for x in calls] == [(1, 2, 12), (3, 0, 0)]
    assert [(x.connection_windows, x.connection_credit) for x in calls] == [(1, 5), (1, 9)]
    for bad in (wu(1, 0), wu(1, 5, flags=1), wu(3, 5), wu(1, 2**31 - 1), frame(WINDOW_UPDATE, 0, 1, bytes(5))):
        odd = frame(HEADERS, END_HEADERS, 1, block) + bad + frame(DATA, END_STREAM, 1, message(b"a"))
        assert read_unary(odd, 0, highest=0, **common) == ([], 0), bad  # h2's to read (an error, or not this shape)
    after = frame(HEADERS, END_HEADERS, 1, block) + frame(DATA, END_STREAM, 1, message(b"a"))
    calls, taken = read_unary(after + wu(0, 2**31 - 65_535) + wu(0, 1), 0, highest=0, **common)
    assert taken == len(after) and calls[0].connection_windows == 0  # past 2^31-1: h2's to refuse
    # the windows: a DATA past either is h2's to refuse
    assert read_unary(calls_bytes, 0, highest=0, **{**common, "stream_window": 7})[1] == 0
    calls, taken = read_unary(calls_bytes, 0, highest=0, **{**common, "connection_window": 12})
    assert [x.sid for x in calls] == [1]


@pytest.mark.parametrize("split", [1, 7, 54, 1000])
async def test_calls_held_open_meet_resets_window_updates_settings_and_trailers_as_h2_would(split: int) -> None:
    held = Held()
    pair, c = await started(held)
    await pair.feed(c.call("/t.S/Wait"), c.call("/t.S/Wait"))  # their heads read (by h2: HPACK decodes them)
    held.release()
    await pair.feed()
    waiting = [c.call("/t.S/Wait") for _ in range(6)]
    sids = c.opened[-6:]
    more = [
        frame(RST_STREAM, 0, sids[0], (8).to_bytes(4, "big")),  # CANCEL, as Envoy resets a late call
        frame(WINDOW_UPDATE, 0, sids[1], (100).to_bytes(4, "big")),
        frame(SETTINGS, 0, 0, (4).to_bytes(2, "big") + (30).to_bytes(4, "big")),  # INITIAL_WINDOW_SIZE 30
        frame(PING, 0, 0, bytes(8)),
        frame(DATA, 0, sids[2], message(b"late")),  # DATA on a half-closed stream: STREAM_CLOSED
        frame(HEADERS, END_HEADERS | END_STREAM, sids[3], c.head()),  # a second HEADERS: STREAM_CLOSED
        frame(PRIORITY, 0, sids[4], bytes(5)),
    ]
    data = b"".join(waiting + more + [c.call(), c.call("/t.S/Big"), c.call("/t.S/Fail")])
    await pair.feed(*[data[i : i + split] for i in range(0, len(data), split)])
    pair.same()
    held.release()
    await pair.feed(frame(WINDOW_UPDATE, 0, 0, (100_000).to_bytes(4, "big")))
    pair.same()
    for sid in sids:  # the answers held by the window of 30 go as it opens
        await pair.feed(frame(WINDOW_UPDATE, 0, sid, (100_000).to_bytes(4, "big")))
    await pair.feed(c.warm(5))
    pair.same(settle=True)
    # read beside h2: the last four calls, and in reads long enough for a call, the held ones
    assert pair.taken >= (4 if split < 100 else 4 + 6)
    await pair.close()


async def test_streams_past_the_bound_while_a_shutdown_and_goaway_come_as_h2_would() -> None:
    held = Held()
    pair, c = await started(held)
    # 20 calls held: 16 taken (the bound), 4 refused (REFUSED_STREAM, on streams h2 must know)
    await pair.feed(b"".join(c.call("/t.S/Wait") for _ in range(20)))
    pair.same()
    assert pair.served.owner.counts.get("refused_stream") == 4
    for conn in pair.conns.values():
        conn.shutdown()  # GOAWAY naming the last stream taken; the held calls still answered
    await pair.feed(c.call(), frame(GOAWAY, 0, 0, bytes(8)))
    pair.same()
    held.release()
    await pair.feed()
    pair.same(settle=True)
    await pair.close()


async def test_heads_h2_would_refuse_or_the_transport_answers_go_through_the_same_ways() -> None:
    held = Held()
    pair, c = await started(held)
    steps = [
        c.call("/t.S/Missing"),
        c.call("/t.S/Missing"),
        c.call("/t.S/Missing"),  # UNIMPLEMENTED (trailers only)
        c.call(extra=(("content-length", "8"),)),
        c.call(extra=(("content-length", "8"),)),  # the message is 8 bytes
        c.call(extra=(("content-length", "3"),)),
        c.call(extra=(("content-length", "3"),)),  # short: malformed
        c.call(extra=(("grpc-timeout", "1x"),)),
        c.call(extra=(("grpc-timeout", "1x"),)),
        c.call(extra=(("grpc-encoding", "br"),)),
        c.call(extra=(("grpc-encoding", "br"),)),
        c.call(extra=(("connection", "close"),)),
        c.call(extra=(("connection", "close"),)),  # malformed
        c.call(block=c.head() + bytes(Encoder().encode([(":status", "100")]))),  # a response field in a request
        c.call(body=b"x" * 5000),
        c.call(body=b"x" * 5000),  # past max_message_bytes: RESOURCE_EXHAUSTED
        c.call("/t.S/Big"),
        c.call("/t.S/Big"),
        c.call("/t.S/Big"),  # answers past the stream's window
    ]
    for step in steps:
        await pair.feed(step)
        pair.same()
    pair.same(settle=True)
    await pair.close()


async def test_a_rapid_reset_gets_goaway_at_the_same_call_either_way() -> None:
    held = Held()
    pair, c = await started(held)
    chunk = bytearray()
    for _ in range(RESET_GRACE * 3):
        sid = c.sid
        chunk += c.call("/t.S/Wait") + frame(RST_STREAM, 0, sid, (8).to_bytes(4, "big"))
        if len(chunk) > 4000:
            await pair.feed(bytes(chunk))
            pair.same()
            chunk.clear()
    await pair.feed(bytes(chunk))
    pair.same()
    assert pair.served.closing and pair.served.owner.counts.get("goaway_enhance_your_calm") == 1
    assert pair.taken > RESET_GRACE // 2  # (each call read beside h2, its RST_STREAM by h2)
    await pair.close()


@pytest.mark.parametrize(
    "flood",
    ["headers", "empty_data", "settings", "pings", "window_past_the_connection", "many_new_streams_in_a_read"],
)
async def test_the_hostile_clients_streams_are_answered_the_same(flood: str) -> None:
    held = Held()
    pair, c = await started(held, Limits(max_message_bytes=4096))
    if flood == "headers":  # HEADERS alone, never a message, on new streams
        data = b"".join(frame(HEADERS, END_HEADERS, c.new(), c.head()) for _ in range(2000))
    elif flood == "empty_data":
        sid = c.new()
        data = frame(HEADERS, END_HEADERS, sid, c.head()) + frame(DATA, 0, sid) * 40
    elif flood == "settings":
        data = frame(SETTINGS, 0, 0) * 12_000
    elif flood == "pings":
        data = (c.call() + frame(PING, 0, 0, bytes(8))) * 3000
    elif flood == "window_past_the_connection":
        data = b"".join(c.call("/t.S/Wait", body=b"y" * 4000) for _ in range(400))
    else:
        data = b"".join(c.call() for _ in range(WALK_NEW_STREAMS * 40))
    for i in range(0, len(data), 16_384):
        await pair.feed(data[i : i + 16_384])
        pair.same()
    held.release()
    await pair.feed()
    pair.same(settle=True)
    await pair.close()


# -- drawn sequences ------------------------------------------------------------------------

STEP = st.one_of(
    st.tuples(
        st.just("calls"), st.integers(1, 4), st.sampled_from(["/t.S/Echo", "/t.S/Wait", "/t.S/Fail", "/t.S/Big"])
    ),
    st.tuples(st.just("open"), st.just(0), st.just("")),
    st.tuples(st.just("end_open"), st.integers(0, 3), st.just("")),
    st.tuples(st.just("rst"), st.integers(0, 5), st.sampled_from(["0", "8"])),
    st.tuples(st.just("window"), st.integers(0, 5), st.sampled_from(["1", "1000", "2147483647"])),
    st.tuples(st.just("settings"), st.integers(0, 3), st.just("")),
    st.tuples(st.just("ping"), st.just(0), st.sampled_from(["", "ack"])),
    st.tuples(st.just("priority"), st.integers(0, 5), st.just("")),
    st.tuples(st.just("again"), st.integers(0, 5), st.sampled_from(["headers", "trailers", "data"])),
    st.tuples(st.just("shaped"), st.integers(0, 6), st.just("")),
    st.tuples(st.just("release"), st.just(0), st.just("")),
    st.tuples(st.just("unsent"), st.just(0), st.just("")),
    st.tuples(st.just("grpcio"), st.integers(1, 4), st.sampled_from(["5", "2147418112", "2147483647"])),
)


def _step(c: Client, step: tuple[str, int, str], opened: list[int]) -> bytes | None:
    """A step's bytes (None: release the held calls)."""
    kind, n, arg = step
    recent = c.opened[-1 - n] if len(c.opened) > n else 1
    if kind == "calls":
        return b"".join(c.call(arg) for _ in range(n))
    if kind == "open":
        data = c.call("/t.S/Echo", end=False)
        opened.append(c.opened[-1])
        return data
    if kind == "end_open":
        return frame(DATA, END_STREAM, opened.pop(n % len(opened)), b"") if opened else b""
    if kind == "rst":
        return frame(RST_STREAM, 0, recent, int(arg).to_bytes(4, "big"))
    if kind == "window":
        return frame(WINDOW_UPDATE, 0, 0 if n == 5 else recent, int(arg).to_bytes(4, "big"))
    if kind == "settings":
        setting = [(4, 30), (4, 65_535), (5, 16_384 * 2), (1, 0)][n]  # INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, TABLE
        return frame(SETTINGS, 0, 0, setting[0].to_bytes(2, "big") + setting[1].to_bytes(4, "big"))
    if kind == "ping":
        return frame(PING, 0x1 if arg == "ack" else 0, 0, bytes(8))
    if kind == "priority":
        return frame(PRIORITY, 0, recent, bytes(5))
    if kind == "again":
        if arg == "data":
            return frame(DATA, 0, recent, message(b"more"))
        flags = END_HEADERS | (END_STREAM if arg == "headers" else 0)
        return frame(HEADERS, flags, recent, c.head())
    if kind == "grpcio":  # calls as grpcio sends them: window updates of the stream and the connection around
        out = bytearray()
        for _ in range(n):
            sid = c.new()
            inc = int(arg).to_bytes(4, "big")
            out += frame(HEADERS, END_HEADERS, sid, c.head()) + frame(WINDOW_UPDATE, 0, sid, inc)
            out += frame(DATA, END_STREAM, sid, message(b"g")) + frame(WINDOW_UPDATE, 0, 0, inc)
        return bytes(out)
    if kind == "unsent":  # a block the client encodes and never sends: its HPACK table and the server's part
        c.head(extra=(("x-lost", "1"),))
        return b""
    if kind == "shaped":  # a call of another shape than Envoy's
        sid = c.new()
        target = {5: sid + 1, 6: max(1, sid - 4)}.get(n, sid)  # an even id; one not above the last
        block = c.head(extra=(("x-new", str(sid)),)) if n == 4 else c.head()  # (a new field: HPACK's table changes)
        head = {
            0: lambda: frame(HEADERS, END_HEADERS | PADDED, sid, b"\x02" + block + b"\x00\x00"),
            1: lambda: frame(HEADERS, END_HEADERS | PRIORITY_FLAG, sid, bytes(5) + block),
            2: lambda: frame(HEADERS, 0, sid, block[:3]) + frame(CONTINUATION, END_HEADERS, sid, block[3:]),
        }.get(n, lambda: frame(HEADERS, END_HEADERS, target, block))()
        body = b"\x01" + message(b"s") + b"\x00" if n == 3 else message(b"p")
        return head + frame(DATA, END_STREAM | (PADDED if n == 3 else 0), target, body)
    return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(STEP, min_size=1, max_size=14), cuts=st.lists(st.integers(0, 10_000), max_size=3))
def test_drawn_sequences_are_answered_as_h2_answers_them(steps: list[tuple[str, int, str]], cuts: list[int]) -> None:
    """The steps' bytes run together into reads cut at the drawn places (a release of the held
    calls ends a run: it happens between reads)."""

    async def feed(pair: Pair, data: bytes) -> None:
        bounds = sorted({0, len(data), *(x % (len(data) + 1) for x in cuts)})
        await pair.feed(*[data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])
        pair.same()

    async def run() -> None:
        held = Held()
        pair, c = await started(held)
        opened: list[int] = []
        run_bytes = bytearray()
        for step in steps:
            data = _step(c, step, opened)
            if data is None:
                await feed(pair, bytes(run_bytes))
                run_bytes.clear()
                held.release()
            else:
                run_bytes += data
        await feed(pair, bytes(run_bytes) + c.warm(2))
        held.release()
        await pair.feed()
        pair.same(settle=True)
        await pair.close()

    asyncio.run(run())
