"""gRPC's part of the transport ("gRPC over HTTP2"): what a method sees (:class:`Call`,
:class:`Method`, :class:`RpcError`, :class:`StatusCode`), a connection's bounds
(:class:`Limits`), a request's head read once (:func:`read_head`), length-prefixed messages
with their compression (:class:`MessageReader`, :func:`frame_message`), and the answers'
header lists (:data:`RESPONSE_HEADERS`, :func:`status_trailers`).

HTTP/2 itself (frames, streams, flow control, HPACK's state) is python-hyper's ``h2``
state machine, driven by :mod:`.transport`."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from h2.exceptions import ProtocolError
from h2.utilities import HeaderValidationFlags, validate_headers

from .codec import CONTENT_LENGTH

__all__ = [
    "ACCEPT_ENCODING", "RESPONSE_HEADERS", "Call", "Head", "Limits", "MessageReader", "Method", "RpcError",
    "StatusCode", "frame_message", "parse_timeout", "read_head", "status_trailers",
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
    """Raised by a method (or the transport) to end a call with ``code`` and ``message``."""

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
    ``gathered`` a unary method called once for the calls whose requests one turn of the event
    loop completed, ``async (list[bytes], list[Call]) -> list[bytes | RpcError]`` (an answer
    or an error for each, in their order); ``stream`` ``(bytes, Call) -> AsyncIterator[bytes]``;
    ``each`` ``(bytes, Call) -> bytes`` called for every request message of the stream.
    ``public``: callable without the client token (health checking)."""

    kind: Literal["unary", "gathered", "stream", "each"]
    fn: Callable[..., Any]
    public: bool = False


@dataclass(frozen=True, kw_only=True)
class Limits:
    """A connection's bounds and timers (see docs/configuration.md, ``SHADOWLIMIT_GRPC_*``)."""

    max_message_bytes: int = 64 * 1024
    max_streams: int = 1024  # SETTINGS_MAX_CONCURRENT_STREAMS; past it: REFUSED_STREAM
    max_header_list_bytes: int = 16 * 1024
    preface_timeout_s: float = 5.0
    idle_timeout_s: float = 300.0  # no open stream for this long: GOAWAY, closed
    keepalive_s: float = 60.0  # a PING after this long without a frame from the peer
    keepalive_timeout_s: float = 20.0  # its ACK not back in this time (or output not drained): closed
    connection_window: int = 1 << 20  # request bytes the peer may send before they are consumed
    max_pending_output: int = 1 << 20  # answers held by the peer's windows; past it no new call starts
    read_slice: int = 16 * 1024  # bytes handed to the state machine per turn of the event loop


# -- a request's head ----------------------------------------------------------------------

#: the answers' headers (RFC 9113 8.3.2; gRPC: content-type, the encodings accepted)
ACCEPT_ENCODING = b"identity,deflate,gzip"
RESPONSE_HEADERS = (
    (b":status", b"200"),
    (b"content-type", b"application/grpc"),
    (b"grpc-accept-encoding", ACCEPT_ENCODING),
)
TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_REQUEST = HeaderValidationFlags(is_client=False, is_trailer=False, is_response_header=False, is_push_promise=False)
_TRAILER = HeaderValidationFlags(is_client=False, is_trailer=True, is_response_header=False, is_push_promise=False)
_ENCODINGS = frozenset({"identity", "gzip", "deflate"})
_READ = frozenset({"content-type", "grpc-timeout", "grpc-encoding"})  # the head's fields, not metadata


def parse_timeout(value: str) -> float:
    """A ``grpc-timeout`` value in seconds: 1 to 8 digits and a unit (ValueError otherwise)."""
    unit = TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not 0 < len(digits) <= 8 or not digits.isdigit() or not digits.isascii():
        raise ValueError(f"grpc-timeout {value!r}: 1 to 8 digits and a unit (H, M, S, m, u, n)")
    return int(digits) * unit


@dataclass(frozen=True, slots=True, kw_only=True)
class Head:
    """A request's headers, checked and read once (see :func:`read_head`). ``problem``: why
    the request is malformed (RFC 9113 8.1.1: a stream error), else None; ``status``: an
    HTTP status for a request that is well formed but not gRPC (405, 415); ``error``: a
    gRPC status and message that ends the call before its method runs."""

    path: str = ""
    metadata: tuple[tuple[str, str], ...] = ()
    timeout_s: float | None = None
    encoding: str = "identity"
    problem: str | None = None
    status: int | None = None
    error: tuple[int, str] | None = None
    content_length: int | None = None  # what the DATA must add up to (RFC 9113 8.1.1)


def read_head(headers: list[Any]) -> Head:
    """The head of a request from its decoded header list (name, value bytes): h2's own
    checks of RFC 9113 section 8 (pseudo-headers, connection-specific fields, names and
    values), then gRPC's (POST, content-type, ``grpc-timeout``, ``grpc-encoding``)."""
    lengths = [v for n, v in headers if n == CONTENT_LENGTH]
    content_length = None
    if lengths:
        if len(lengths) > 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
            return Head(problem=f"content-length {b', '.join(lengths)!r}: one number")
        content_length = int(lengths[0])
        headers = [h for h in headers if h[0] != CONTENT_LENGTH]
    problem = _problem(headers, _REQUEST)
    if problem is not None:
        return Head(problem=problem)
    fields: dict[str, str] = {}
    metadata: list[tuple[str, str]] = []
    for raw_name, raw_value in headers:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        if name[:1] == ":" or name in _READ:
            fields[name] = value
        else:
            metadata.append((name, value))
    path = fields.get(":path", "")
    if fields.get(":method") != "POST":
        return Head(path=path, status=405)
    if not fields.get("content-type", "").startswith("application/grpc"):
        return Head(path=path, status=415)
    timeout_s, error = None, None
    encoding = fields.get("grpc-encoding", "identity")
    if "grpc-timeout" in fields:
        try:
            timeout_s = parse_timeout(fields["grpc-timeout"])
        except ValueError as exc:  # as grpcio answers it
            error = (StatusCode.INTERNAL, str(exc))
    if error is None and encoding not in _ENCODINGS:
        error = (StatusCode.UNIMPLEMENTED, f"grpc-encoding {encoding!r}: not one of identity, deflate, gzip")
    return Head(
        path=path, metadata=tuple(metadata), timeout_s=timeout_s, encoding=encoding, error=error,
        content_length=content_length,
    )  # fmt: skip


def trailers_problem(headers: list[Any]) -> str | None:
    """Why request trailers are malformed (RFC 9113 8.1: no pseudo-header), else None."""
    return _problem([h for h in headers if h[0] != CONTENT_LENGTH], _TRAILER)


def _problem(headers: list[Any], flags: HeaderValidationFlags) -> str | None:
    """What h2's checks of RFC 9113 section 8 find wrong with ``headers`` (None: nothing)."""
    try:
        for _ in validate_headers(headers, flags):
            pass
    except ProtocolError as exc:
        return str(exc)
    return None


# -- messages ------------------------------------------------------------------------------


def frame_message(payload: bytes) -> bytes:
    """A gRPC message: uncompressed flag, 4-byte length, payload."""
    return len(payload).to_bytes(5, "big") + payload


class MessageReader:
    """The length-prefixed messages of one request stream, read as its bytes arrive: a
    length over ``max_bytes`` is refused as soon as its prefix is in (RESOURCE_EXHAUSTED),
    a compressed message is inflated (``grpc-encoding`` gzip or deflate) to at most
    ``max_bytes`` (a zip bomb is refused the same way), a compressed flag without an
    encoding is INTERNAL (as gRPC says)."""

    __slots__ = ("buf", "max_bytes", "encoding", "consumed")

    def __init__(self, max_bytes: int, encoding: str) -> None:
        self.buf = bytearray()
        self.max_bytes = max_bytes
        self.encoding = encoding
        self.consumed = 0  # bytes of whole messages taken out (given back to the windows)

    def feed(self, data: bytes) -> None:
        """More bytes of the stream (raises :class:`RpcError` at a length over the bound)."""
        self.buf += data
        if len(self.buf) >= 5:
            n = int.from_bytes(self.buf[1:5], "big")
            if n > self.max_bytes:
                raise RpcError(StatusCode.RESOURCE_EXHAUSTED, f"a request message larger than {self.max_bytes} bytes")

    def next(self) -> bytes | None:
        """The next whole message (None: not all in yet)."""
        buf = self.buf
        if len(buf) < 5:
            return None
        n = int.from_bytes(buf[1:5], "big")
        if len(buf) < 5 + n:
            return None
        flag, payload = buf[0], bytes(buf[5 : 5 + n])
        del buf[: 5 + n]
        self.consumed += 5 + n
        if len(buf) >= 5 and int.from_bytes(buf[1:5], "big") > self.max_bytes:
            raise RpcError(StatusCode.RESOURCE_EXHAUSTED, f"a request message larger than {self.max_bytes} bytes")
        if flag == 0:
            return payload
        if flag != 1:
            raise RpcError(StatusCode.INTERNAL, f"a message flag of {flag} (0 or 1)")
        return self._inflate(payload)

    def only(self) -> bytes:
        """The one message of a unary or server-streaming request, once it has ended."""
        message = self.next()
        if message is None or self.buf:
            raise RpcError(StatusCode.INTERNAL, "expected exactly one request message")
        return message

    def _inflate(self, payload: bytes) -> bytes:
        if self.encoding == "identity":
            raise RpcError(StatusCode.INTERNAL, "a compressed message without grpc-encoding")
        inflater = zlib.decompressobj(31 if self.encoding == "gzip" else 15)
        try:
            out = inflater.decompress(payload, self.max_bytes + 1)
        except zlib.error as exc:
            raise RpcError(StatusCode.INTERNAL, f"a {self.encoding} message that does not inflate: {exc}") from None
        if len(out) > self.max_bytes or inflater.unconsumed_tail:
            raise RpcError(StatusCode.RESOURCE_EXHAUSTED, f"a request message larger than {self.max_bytes} bytes")
        return out


# -- the answer's end ----------------------------------------------------------------------

_MESSAGE_SAFE = " !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"


def status_trailers(code: int, message: str) -> tuple[tuple[bytes, bytes], ...]:
    """The fields ending a call: ``grpc-status`` and ``grpc-message`` (percent-encoded as
    gRPC says, at most 8 KiB)."""
    if not message:
        return ((b"grpc-status", str(code).encode()),)
    encoded = quote(message[:4096], safe=_MESSAGE_SAFE).encode("ascii")[:8192]
    return (b"grpc-status", str(code).encode()), (b"grpc-message", encoded)
