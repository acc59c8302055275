"""A raw HTTP/2 client for the conformance and hostile-client tests: frames built with
``hyperframe`` (raw bytes where a frame must be malformed), header blocks with ``hpack``,
over a blocking socket on loopback with a bounded wait for every frame.

It reads the server's frames one at a time as h2spec's (the Go tool summerwind/h2spec) ``Conn``
does: :meth:`RawConn.wait_event` gives the next frame, or that the connection closed (EOF or
a reset), or that nothing came within the timeout; any of the last two marks the connection
``closed``, as h2spec's ``Conn.Closed``. Received DATA is given back to the server's windows as
h2spec gives it (a WINDOW_UPDATE once 65,535 bytes were received), unless
``window_update=False``.

For the hostile-client tests, :meth:`RawConn.until` reads until a condition holds (a timeout
there closes nothing), keeping each stream's :class:`Answer` (its header blocks, DATA, the
first RST_STREAM), the server's GOAWAY code, the PINGs it sent (answered with
``ack_pings=True``) and the connection window it granted.

Also here: the gRPC request every test sends (a ``ShouldRateLimit`` POST with a valid
length-prefixed ``RateLimitRequest``), and gRPC's length prefix.
"""

from __future__ import annotations

import gzip
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from h2.errors import ErrorCodes
from hpack import Decoder, Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
)

__all__ = [
    "DOMAIN", "PREFACE", "RLS_PATH", "Answer", "ErrorCodes", "Event", "RawConn", "frame_name", "grpc_frame",
    "raw_frame", "rls_message", "settings_payload",
]  # fmt: skip

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
RLS_PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
#: the domain of envoyproxy/ratelimit's example configuration (tests/fixtures/envoyproxy-ratelimit)
DOMAIN = "rl"
DEFAULT_WINDOW = 65_535
HANDSHAKE_S = 10.0
# frame types (RFC 9113 section 6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
NAMES = ["DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING", "GOAWAY", "WINDOW_UPDATE",
         "CONTINUATION"]  # fmt: skip
# settings identifiers (RFC 9113 section 6.5.2)
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 3, 4, 5
MAX_HEADER_LIST_SIZE = 6


def raw_frame(ftype: int, flags: int, sid: int, payload: bytes = b"", *, length: int | None = None) -> bytes:
    """A frame as bytes, whatever it says (``length``: the length field, if not the payload's)."""
    n = len(payload) if length is None else length
    return n.to_bytes(3, "big") + bytes((ftype, flags)) + sid.to_bytes(4, "big") + payload


def settings_payload(*pairs: tuple[int, int]) -> bytes:
    """A SETTINGS payload with the values in order (one identifier may repeat)."""
    return b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in pairs)


def grpc_frame(message: bytes, *, compressed: bool = False, length: int | None = None) -> bytes:
    """gRPC's length-prefixed message (``length``: the prefix's, if not the message's)."""
    n = len(message) if length is None else length
    return bytes((1 if compressed else 0,)) + n.to_bytes(4, "big") + message


def rls_message(
    *entries: tuple[str, str], domain: str = DOMAIN, size: int | None = None, gzipped: bool = False
) -> bytes:
    """A length-prefixed ``RateLimitRequest`` with one descriptor of ``entries`` (by default
    ``qux=h2spec``: unlimited in the example configuration, answered OK without Redis);
    ``size``: the framed message padded to exactly that many bytes (the last entry's value)."""
    entries = entries or (("qux", "h2spec"),)

    def build(pad: int) -> bytes:
        items = list(entries[:-1]) + [(entries[-1][0], entries[-1][1] + "x" * pad)]
        descriptor = ratelimit_pb2.RateLimitDescriptor(
            entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in items]
        )
        return rls_pb2.RateLimitRequest(domain=domain, descriptors=[descriptor]).SerializeToString()  # type: ignore[no-any-return]

    body = build(0)
    if size is not None:
        pad = size - 5 - len(body)
        while len(build(pad)) + 5 > size:  # the value's length prefix grows by a byte at 128, 16384
            pad -= 1
        body = build(pad)
        assert len(body) + 5 == size, (len(body) + 5, size)
    if gzipped:
        return grpc_frame(gzip.compress(body), compressed=True)
    return grpc_frame(body)


def frame_name(ftype: int) -> str:
    return NAMES[ftype] if ftype < len(NAMES) else f"type 0x{ftype:02x}"


@dataclass
class Event:
    """What :meth:`RawConn.wait_event` saw: a frame, or the connection ``closed``, or a
    ``timeout``, or an ``error`` (a frame it could not read)."""

    kind: str
    frame: Any = None
    headers: list[tuple[str, str]] | None = None  # a HEADERS frame's decoded block
    detail: str = ""

    @property
    def type(self) -> int | None:
        return self.frame.type if self.kind == "frame" else None

    def is_(self, ftype: int) -> bool:
        return self.kind == "frame" and self.frame.type == ftype

    @property
    def end_stream(self) -> bool:
        return self.kind == "frame" and "END_STREAM" in self.frame.flags

    @property
    def code(self) -> int | None:
        """The error code of a GOAWAY or RST_STREAM."""
        return getattr(self.frame, "error_code", None) if self.kind == "frame" else None

    def __str__(self) -> str:
        if self.kind != "frame":
            return {"closed": "Connection closed", "timeout": "Timeout"}.get(self.kind, f"Error: {self.detail}")
        f = self.frame
        text = f"{frame_name(f.type)} Frame (length:{f.body_len}, flags:{sorted(f.flags)}, stream_id:{f.stream_id}"
        if self.code is not None:
            text += f", error_code:{_code_name(self.code)}"
        if self.headers is not None:
            text += f", headers:{self.headers}"
        return text + ")"


def _code_name(code: int) -> str:
    try:
        return ErrorCodes(code).name
    except ValueError:
        return f"0x{code:x}"


@dataclass
class Answer:
    """What came on one stream: the headers, the DATA, the trailers, a reset."""

    blocks: list[list[tuple[str, str]]] = field(default_factory=list)  # each header block, in order
    data: bytearray = field(default_factory=bytearray)
    reset: int | None = None
    ended: bool = False

    @property
    def headers(self) -> list[tuple[str, str]] | None:
        return self.blocks[0] if self.blocks else None

    @property
    def trailers(self) -> list[tuple[str, str]] | None:
        return self.blocks[-1] if len(self.blocks) > 1 else None

    def header(self, name: str) -> str | None:
        for k, v in (self.trailers or []) + (self.headers or []):
            if k == name:
                return v
        return None

    @property
    def grpc_status(self) -> int | None:
        value = self.header("grpc-status")
        return None if value is None else int(value)

    def messages(self) -> list[bytes]:
        out, data = [], bytes(self.data)
        while len(data) >= 5:
            n = int.from_bytes(data[1:5], "big")
            out.append(data[5 : 5 + n])
            data = data[5 + n :]
        return out


@dataclass
class RawConn:
    """One connection to ``127.0.0.1:port`` (see the module docstring)."""

    port: int
    timeout: float = 2.0
    window_update: bool = True
    rcvbuf: int | None = None  # the socket's receive buffer (SO_RCVBUF), if not the system's
    ack_pings: bool = False  # answer the server's PINGs (h2spec's client does not)
    closed: bool = False
    settings: dict[int, int] = field(default_factory=dict)  # the server's, once :meth:`handshake` read them
    trace: deque[Event] = field(default_factory=lambda: deque(maxlen=64))  # the last frames received

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if self.rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
        self.sock.settimeout(self.timeout)
        self.sock.connect(("127.0.0.1", self.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.buf = bytearray()
        self.windows: dict[int, int] = {0: DEFAULT_WINDOW}
        self.block = bytearray()  # a header block being received (HEADERS without END_HEADERS)
        self.answers: dict[int, Answer] = {}  # what came on each stream
        self.goaway: int | None = None  # the code of the server's GOAWAY
        self.data_streams: set[int] = set()  # the streams that received DATA
        self.granted = DEFAULT_WINDOW  # what the server lets this client send on the connection
        self.pings = 0  # the server's PINGs (not acknowledgements) received

    @property
    def authority(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- sending ---------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Send bytes; a connection the server already closed is not an error here (h2spec
        ignores write errors too: the verdict reads what the server did)."""
        try:
            self.sock.sendall(data)
        except OSError:
            pass

    def write(self, *frames: Frame | bytes) -> None:
        self.send(b"".join(f if isinstance(f, bytes) else f.serialize() for f in frames))

    def encode(self, headers: list[tuple[str, str]]) -> bytes:
        return self.encoder.encode(headers)  # type: ignore[no-any-return]

    def grpc_headers(self, path: str = RLS_PATH, extra: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
        """A gRPC call's request headers (h2spec's common headers, for a gRPC server)."""
        return [
            (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", self.authority),
            ("content-type", "application/grpc"), ("te", "trailers"), *extra,
        ]  # fmt: skip

    def headers(
        self, sid: int, block: bytes, *, end_stream: bool = False, end_headers: bool = True, pad: int = 0,
        priority: tuple[int, int, bool] | None = None,
    ) -> None:  # fmt: skip
        """A HEADERS frame (``priority``: depends on, weight, exclusive)."""
        flags = ["END_STREAM"] * end_stream + ["END_HEADERS"] * end_headers + ["PADDED"] * bool(pad)
        f = HeadersFrame(sid, block, flags=flags, pad_length=pad)
        if priority is not None:
            f.flags.add("PRIORITY")
            f.depends_on, f.stream_weight, f.exclusive = priority
        self.write(f)

    def data(self, sid: int, payload: bytes, *, end_stream: bool = False, pad: int = 0) -> None:
        flags = ["END_STREAM"] * end_stream + ["PADDED"] * bool(pad)
        self.write(DataFrame(sid, payload, flags=flags, pad_length=pad))

    def continuation(self, sid: int, block: bytes, *, end_headers: bool) -> None:
        self.write(ContinuationFrame(sid, block, flags=["END_HEADERS"] * end_headers))

    def priority(self, sid: int, depends_on: int = 0, weight: int = 255, exclusive: bool = False) -> None:
        self.write(PriorityFrame(sid, depends_on=depends_on, stream_weight=weight, exclusive=exclusive))

    def rst(self, sid: int, code: int) -> None:
        self.write(RstStreamFrame(sid, error_code=code))

    def settings_frame(self, *pairs: tuple[int, int]) -> None:
        self.send(raw_frame(SETTINGS, 0, 0, settings_payload(*pairs)))

    def ping(self, data: bytes, *, ack: bool = False) -> None:
        self.write(PingFrame(0, opaque_data=data, flags=["ACK"] * ack))

    def send_goaway(self, last: int, code: int, debug: bytes = b"") -> None:
        self.write(GoAwayFrame(0, last_stream_id=last, error_code=code, additional_data=debug))

    def window(self, sid: int, increment: int) -> None:
        self.send(raw_frame(WINDOW_UPDATE, 0, sid, increment.to_bytes(4, "big")))

    def request(self, sid: int, message: bytes | None = None, **headers: Any) -> None:
        """A whole gRPC call: HEADERS (``headers``: :meth:`headers`' options, ``block``
        defaulting to :meth:`grpc_headers`) then the message in a DATA frame with END_STREAM."""
        block = headers.pop("block", None) or self.encode(self.grpc_headers())
        self.headers(sid, block, **headers)
        self.data(sid, rls_message() if message is None else message, end_stream=True)

    # -- receiving -------------------------------------------------------------------------

    def handshake(self, *pairs: tuple[int, int]) -> None:
        """h2spec's handshake: the preface and a SETTINGS frame (INITIAL_WINDOW_SIZE 65,535, or
        ``pairs``); read until the server's SETTINGS (acknowledged) and the ACK of ours, 10 s at
        most (no verdict rests on it: a loaded machine must not fail a case here)."""
        self.send(PREFACE + raw_frame(SETTINGS, 0, 0, settings_payload(*(pairs or ((INITIAL_WINDOW_SIZE, 65_535),)))))
        local = remote = False
        deadline = time.monotonic() + max(self.timeout, HANDSHAKE_S)
        while not (local and remote):
            ev = self._read_frame(deadline)
            assert ev.kind == "frame", f"handshake: {ev} after {self.seen()}"
            if ev.is_(SETTINGS) and "ACK" in ev.frame.flags:
                local = True
            elif ev.is_(WINDOW_UPDATE) and not ev.frame.stream_id:
                self.granted += ev.frame.window_increment
            elif ev.is_(SETTINGS):
                remote = True
                self.settings.update(ev.frame.settings)
                self.send(raw_frame(SETTINGS, 0x1, 0))

    def wait_event(self, timeout: float | None = None) -> Event:
        """The next thing the server did, within ``timeout`` (the connection's by default);
        a timeout marks the connection closed, as h2spec's does."""
        if self.closed:
            return Event("closed")
        ev = self._next(time.monotonic() + (self.timeout if timeout is None else timeout))
        if ev.kind != "frame":
            self.closed = True
        return ev

    def until(self, done: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Read until ``done()`` (True), or the connection closes or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        while not done():
            if self.closed or time.monotonic() >= deadline:
                return False
            ev = self._next(deadline)
            if ev.kind in ("closed", "error"):
                self.closed = True
        return True

    def answer(self, sid: int, timeout: float = 5.0) -> Answer:
        """Stream ``sid``'s answer once it ended (or what came of it within ``timeout``)."""
        self.until(lambda: self.answers.get(sid, Answer()).ended, timeout)
        return self.answers.get(sid, Answer())

    def _next(self, deadline: float) -> Event:
        ev = self._read_frame(deadline)
        if ev.kind == "frame":
            self._note(ev)
            if ev.is_(DATA) and self.window_update:
                self._give_back(ev.frame.stream_id, ev.frame.body_len)
        self.trace.append(ev)
        return ev

    def _note(self, ev: Event) -> None:
        """Keep each stream's answer, and the GOAWAY."""
        f = ev.frame
        if ev.is_(GOAWAY):
            self.goaway = ev.code
            return
        if ev.is_(WINDOW_UPDATE) and not f.stream_id:
            self.granted += f.window_increment
        if ev.is_(PING) and "ACK" not in f.flags:
            self.pings += 1
            if self.ack_pings:
                self.ping(f.opaque_data, ack=True)
        if not f.stream_id or f.type not in (DATA, HEADERS, RST_STREAM, CONTINUATION):
            return
        a = self.answers.setdefault(f.stream_id, Answer())
        if ev.headers is not None:
            a.blocks.append(ev.headers)
        elif ev.is_(DATA):
            a.data += f.data
            self.data_streams.add(f.stream_id)
        elif ev.is_(RST_STREAM):
            a.reset = ev.code if a.reset is None else a.reset  # the first: what ended the stream
            a.ended = True
        if ev.end_stream:
            a.ended = True

    def _give_back(self, sid: int, n: int) -> None:
        for key in (sid, 0):  # as h2spec's Conn.updateWindowSize
            self.windows.setdefault(key, DEFAULT_WINDOW)
            self.windows[key] -= n
            if self.windows[key] <= 0:
                incr = DEFAULT_WINDOW - self.windows[key]
                self.window(key, incr)
                self.windows[key] += incr

    def _fill(self, n: int, deadline: float) -> str | None:
        """Read until ``n`` bytes are buffered; None, or why not (closed, timeout)."""
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return "timeout"
            except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
                return "closed"
            if not chunk:
                return "closed"
            self.buf += chunk
        return None

    def _read_frame(self, deadline: float) -> Event:
        why = self._fill(9, deadline)
        if why is None:
            length = int.from_bytes(self.buf[:3], "big")
            why = self._fill(9 + length, deadline)
        if why is not None:
            return Event(why)
        header, body = bytes(self.buf[:9]), bytes(self.buf[9 : 9 + length])
        del self.buf[: 9 + length]
        try:
            f, _ = Frame.parse_frame_header(memoryview(header))
            f.parse_body(memoryview(body))
        except Exception as exc:  # noqa: BLE001 - hyperframe's errors: a frame it cannot read
            return Event("error", detail=f"{type(exc).__name__}: {exc} in {header.hex()}")
        return Event("frame", f, headers=self._decode(f))

    def _decode(self, f: Frame) -> list[tuple[str, str]] | None:
        """The header list once a header block is whole (kept in step with the server's table)."""
        if not isinstance(f, HeadersFrame | ContinuationFrame):
            return None
        self.block += f.data
        if "END_HEADERS" not in f.flags:
            return None
        block, self.block = bytes(self.block), bytearray()
        try:
            return [(str(k), str(v)) for k, v in self.decoder.decode(block, raw=False)]
        except Exception as exc:  # noqa: BLE001 - hpack's errors: shown, never hidden
            return [("<undecodable>", repr(exc))]

    def seen(self, last: int = 8) -> str:
        """The last frames received, for a failure message."""
        return "; ".join(str(ev) for ev in list(self.trace)[-last:]) or "nothing"

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
