"""The bytes of gRPC over HTTP/2 that :mod:`.h2` reads and writes (RFC 9113's frames,
flags, settings and error codes; RFC 7541's few encodings the answers need; gRPC's
``grpc-timeout`` and status trailers) and the types a gRPC method sees (:class:`Call`,
:class:`Method`, :class:`RpcError`, :class:`StatusCode`) and the bounds (:class:`Limits`)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from hpack import Decoder, HPACKError

__all__ = [
    "Call", "ConnectionFailure", "HeaderDecoder", "Limits", "Method", "RpcError", "StatusCode", "Stream", "frame",
    "grpc_timeout_s", "status_block", "unpad",
]  # fmt: skip


class StatusCode:
    """The gRPC status codes used here."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """Raised by a method to end its call with ``code`` (a :class:`StatusCode`) and ``message``."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Call:
    """One call as its method sees it: the method's path, the metadata (lowercase names,
    no pseudo-headers), and the deadline (the event loop's clock, None: none sent)."""

    __slots__ = ("path", "metadata", "deadline", "_loop")

    def __init__(self, path: str, metadata: list[tuple[str, str]], deadline: float | None, loop: Any) -> None:
        self.path = path
        self.metadata = metadata
        self.deadline = deadline
        self._loop = loop

    def time_remaining(self) -> float | None:
        """Seconds left before the caller's deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline - self._loop.time()

    def header(self, name: str) -> str | None:
        for k, v in self.metadata:
            if k == name:
                return v
        return None


@dataclass(frozen=True)
class Method:
    """A method's kind and its function: ``unary`` ``async (bytes, Call) -> bytes``;
    ``stream`` ``(bytes, Call) -> AsyncIterator[bytes]``; ``each`` ``(bytes, Call) -> bytes``
    called for every request message of the stream."""

    kind: Literal["unary", "stream", "each"]
    fn: Callable[..., Any]


@dataclass(frozen=True)
class Limits:
    """A connection's bounds."""

    max_message_bytes: int = 64 * 1024
    max_streams: int = 4096
    max_header_list_bytes: int = 16 * 1024
    preface_timeout_s: float = 5.0


# -- wire constants ------------------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# error codes (RFC 9113 section 7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED = 0x0, 0x1, 0x2, 0x3, 0x5
FRAME_SIZE, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x6, 0x7, 0x8, 0x9, 0xB
SET_TABLE, SET_PUSH, SET_STREAMS, SET_WINDOW, SET_FRAME, SET_LIST = 1, 2, 3, 4, 5, 6
DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1
FRAME_HEADER = struct.Struct(">BHBBL")  # length (24 bits: high byte, low 16), type, flags, stream id
MAX_FRAME = 16_384  # the largest frame accepted (SETTINGS_MAX_FRAME_SIZE, left at its default)
CONN_WINDOW = 1 << 22  # the connection's receive window (4 MiB): request bytes held at most (a
# stream's are given back when it ends, an ``each`` stream's as they are consumed)
MAX_BLOCK = 64 * 1024  # a header block's encoded bytes, CONTINUATIONs included
KEPT_BLOCKS = 64  # decoded header blocks kept per connection (see H2Connection._decode)

# the answers' header blocks: never indexed, never in the dynamic table
TABLE_OFF = b"\x20"  # dynamic table size update to 0, at the start of the first block sent
STATUS_200 = b"\x88"  # :status 200 (static index 8)
GRPC_TYPE = b"\x0f\x10\x10application/grpc"  # content-type (static 31), literal without indexing


def literal(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, new name (RFC 7541 6.2.2)."""
    return b"\x00" + int7(len(name)) + name + int7(len(value)) + value


def int7(n: int) -> bytes:
    """An HPACK integer with a 7-bit prefix, Huffman bit clear."""
    if n < 127:
        return bytes((n,))
    out, n = bytearray((127,)), n - 127
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


RESPONSE_HEADERS = STATUS_200 + GRPC_TYPE
TRAILERS_OK = literal(b"grpc-status", b"0")
TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def grpc_timeout_s(value: str) -> float | None:
    """A ``grpc-timeout`` header in seconds (None: not one: 1 to 8 digits and a unit)."""
    unit = TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not 0 < len(digits) <= 8 or not digits.isdigit():
        return None
    return int(digits) * unit


def status_block(code: int, message: str, trailers_only: bool) -> bytes:
    """The header block ending a call: ``grpc-status`` and ``grpc-message`` (percent-encoded
    as gRPC says, at most 8 KiB), with ``:status`` and content-type when it is the only one."""
    block = RESPONSE_HEADERS if trailers_only else b""
    block += TRAILERS_OK if code == 0 else literal(b"grpc-status", str(code).encode())
    if message:
        encoded = quote(message[:4096], safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode("ascii")
        block += literal(b"grpc-message", encoded[:8192])
    return block


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME_HEADER.pack(n >> 16, n & 0xFFFF, ftype, flags, sid) + payload


class ConnectionFailure(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def unpad(flags: int, payload: bytes) -> bytes:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ConnectionFailure(PROTOCOL_ERROR, "padding longer than its frame")
    return payload[1 : len(payload) - payload[0]]


class Stream:
    """A stream's state: the request so far, and what waits for the send window."""

    __slots__ = (
        "sid", "path", "method", "call", "data", "ended", "closed", "started", "window", "queued", "each_seen", "task",
        "held", "window_in",
    )  # fmt: skip

    def __init__(self, sid: int, window: int, window_in: int) -> None:
        self.sid = sid
        self.path = ""
        self.method: Method | None = None
        self.call: Call | None = None
        self.data = bytearray()
        self.ended = False  # the client half-closed (END_STREAM)
        self.closed = False  # answered (END_STREAM sent) or reset
        self.started = False  # the response headers sent
        self.window = window  # the peer's receive window for this stream (what we may send)
        self.queued: list[tuple[int, int, bytes]] = []  # (type, flags, payload) waiting for the window
        self.each_seen = 0  # request bytes consumed by an ``each`` method (its window to give back)
        self.task: Any = None
        self.held = 0  # request bytes received: given back to the connection's window when it ends
        self.window_in = window_in  # what the client may still send on it (our window)


class HeaderDecoder:
    """HPACK decoding of a connection's request header blocks (the ``hpack`` package). A
    block that leaves the dynamic table as it was (indexed fields and literals not indexed:
    what Envoy sends for every call once its table holds the constant ones) decodes the same
    while the table does not change: it is kept, and the next identical block is answered
    from it."""

    def __init__(self, max_header_list_bytes: int) -> None:
        self.hpack = Decoder(max_header_list_size=max_header_list_bytes)
        self.hpack.max_allowed_table_size = 4096
        self.blocks: dict[bytes, tuple[int, list[tuple[str, str]]]] = {}
        self.table_version = 0

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        """The block's fields (raises :class:`ConnectionFailure` COMPRESSION_ERROR)."""
        cached = self.blocks.get(block)
        if cached is not None and cached[0] == self.table_version:
            return cached[1]
        table = self.hpack.header_table
        entries = table.dynamic_entries
        before = (len(entries), entries[0] if entries else None, table.maxsize)
        try:
            headers: list[tuple[str, str]] = [(str(n), str(v)) for n, v in self.hpack.decode(block)]
        except HPACKError as exc:
            raise ConnectionFailure(COMPRESSION_ERROR, f"a header block HPACK cannot read: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the decoder's own errors (bad UTF-8, sizes)
            raise ConnectionFailure(COMPRESSION_ERROR, f"a header block that cannot be read: {exc}") from None
        entries = table.dynamic_entries
        if (
            len(entries) != before[0]
            or (entries[0] if entries else None) is not before[1]
            or table.maxsize != before[2]
        ):
            self.table_version += 1  # the table changed: what was kept no longer holds
        elif len(block) <= 1024:
            if len(self.blocks) >= KEPT_BLOCKS:
                self.blocks.clear()
            self.blocks[block] = (self.table_version, headers)
        return headers
