"""gRPC over HTTP/2 on an asyncio protocol: the transport of shadowlimit's gRPC server.

Why not grpcio's server: behind Envoy every request waits for a ``ShouldRateLimit`` call due
within Envoy's deadline (20 ms by default), and grpcio's aio server spends over 100 us of CPU
per call before any work is done (its completion queue and threads handing calls to the
event loop; docs/benchmarks.md). This protocol speaks the part of HTTP/2 (RFC 9113, HPACK RFC
7541) and of "gRPC over HTTP2" a server needs, in the event loop itself: the calls that
arrive in one read are decoded together, the answers ready in one turn of the loop leave in
one write.

* cleartext HTTP/2 with prior knowledge (``h2c``, what Envoy and gRPC clients send); no
  preface within :attr:`Limits.preface_timeout_s`: closed, counted (``owner.slow()``);
* flow control both ways, frames split to the peer's ``SETTINGS_MAX_FRAME_SIZE``, ``PING``
  answered, ``GOAWAY`` both ways (a server stopping names the last stream it takes and
  finishes those), ``RST_STREAM`` (a cancelled call's answer is dropped);
* HPACK decoding by the ``hpack`` package; a block that leaves the dynamic table as it was
  (Envoy's, once its table holds the constant headers) is decoded once and kept while the
  table does not change; the answers' headers are constant bytes outside the dynamic table
  (the first block sets its size to 0);
* gRPC: ``:path`` names the method, ``grpc-timeout`` sets the deadline, messages are
  length-prefixed (compressed ones refused: none is negotiated), an answer is HEADERS, DATA
  and trailers (``grpc-status``, ``grpc-message``), an error trailers only;
* bounds (:class:`Limits`): a header list, a message (RESOURCE_EXHAUSTED past it), streams
  per connection (``SETTINGS_MAX_CONCURRENT_STREAMS``), the request bytes held (the
  connection's window); a peer that does not read its answers is not read either.

A :class:`Method` is ``unary`` (one request, one answer), ``stream`` (one request, answers
from an async iterator: health's Watch) or ``each`` (an answer per request message:
reflection).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from . import wire
from .wire import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    FRAME_HEADER,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    PRIORITY,
    PUSH_PROMISE,
    RESPONSE_HEADERS,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Call,
    HeaderDecoder,
    Limits,
    Method,
    RpcError,
    StatusCode,
    Stream,
    frame,
)

__all__ = ["Call", "H2Connection", "Limits", "Method", "RpcError", "StatusCode"]

log = logging.getLogger("shadowlimit.grpc")


class H2Connection(asyncio.Protocol):
    """One client connection (see the module docstring). ``methods`` maps ``/pkg.Service/Method``
    to a :class:`Method`; ``server`` keeps the set of open connections and is told when
    one is slow (:meth:`ConnectionOwner.slow`)."""

    def __init__(self, methods: dict[str, Method], limits: Limits, owner: Any) -> None:
        self.methods = methods
        self.limits = limits
        self.owner = owner
        self.loop = asyncio.get_running_loop()
        self.transport: Any = None
        self.buf = b""
        self.preface = False
        self.decoder = HeaderDecoder(limits.max_header_list_bytes)
        self.streams: dict[int, Stream] = {}
        self.last_sid = 0
        self.peer_window = wire.DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self.peer_frame = 16_384  # the peer's SETTINGS_MAX_FRAME_SIZE
        self.window = wire.DEFAULT_WINDOW  # the connection's send window
        self.unacked = 0  # bytes received and not yet given back to the connection's window
        self.block: tuple[int, int, bytearray] | None = None  # a header block awaiting CONTINUATION
        self.out: list[bytes] = []
        self.flushing = False
        self.table_off = False  # the dynamic table size update sent
        self.goaway = False  # no new streams (ours sent, or the peer's received)
        self.closing = False
        self.paused = False
        self.blocked: dict[int, Stream] = {}  # streams with output waiting for a window
        self.preface_timer: Any = None
        self._frames: dict[int, Callable[[int, int, bytes], None]] = {
            DATA: self._on_data, HEADERS: self._on_headers, PRIORITY: self._on_priority, RST_STREAM: self._on_rst,
            SETTINGS: self._on_settings, PUSH_PROMISE: self._on_push, PING: self._on_ping, GOAWAY: self._on_goaway,
            WINDOW_UPDATE: self._on_window, CONTINUATION: self._on_continuation,
        }  # fmt: skip

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.owner.connections.add(self)
        self.preface_timer = self.loop.call_later(self.limits.preface_timeout_s, self._preface_late)
        settings = struct.pack(
            ">HLHLHLHL",
            wire.SET_STREAMS, self.limits.max_streams,
            wire.SET_WINDOW, self.limits.max_message_bytes + 4096,  # a message of the largest size fits
            wire.SET_LIST, self.limits.max_header_list_bytes,
            wire.SET_PUSH, 0,
        )  # fmt: skip
        self._write(frame(SETTINGS, 0, 0, settings))
        self._write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", wire.CONN_WINDOW - wire.DEFAULT_WINDOW)))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.owner.connections.discard(self)
        if self.preface_timer is not None:
            self.preface_timer.cancel()
        for s in self.streams.values():
            s.closed = True
        self.streams.clear()
        self.blocked.clear()
        self.owner.closed(self)

    def pause_writing(self) -> None:  # the peer does not read its answers: stop reading its calls
        self.paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if not self.closing:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos = 0
        if not self.preface:
            if len(buf) < len(PREFACE):
                if not PREFACE.startswith(buf):
                    self._refuse_not_h2()
                    return
                self.buf = buf
                return
            if not buf.startswith(PREFACE):
                self._refuse_not_h2()
                return
            self.preface = True
            self.preface_timer.cancel()
            self.preface_timer = None
            pos = len(PREFACE)
        end = len(buf)
        unpack = FRAME_HEADER.unpack_from
        handlers = self._frames
        try:
            while end - pos >= 9 and not self.closing:
                hi, lo, ftype, flags, sid = unpack(buf, pos)
                length = hi << 16 | lo
                if length > wire.MAX_FRAME:
                    raise wire.ConnectionFailure(
                        wire.FRAME_SIZE, f"a frame of {length} bytes (at most {wire.MAX_FRAME})"
                    )
                if end - pos - 9 < length:
                    break
                payload = buf[pos + 9 : pos + 9 + length]
                pos += 9 + length
                if self.block is not None and ftype != CONTINUATION:
                    raise wire.ConnectionFailure(wire.PROTOCOL_ERROR, "a header block was not continued")
                handler = handlers.get(ftype)
                if handler is not None:
                    handler(flags, sid & 0x7FFFFFFF, payload)
        except wire.ConnectionFailure as exc:
            self._fail(exc.code, exc.reason)
            return
        self.buf = buf[pos:]
        self._credit()

    def _release(self, stream: Stream) -> None:
        """A stream's request bytes, no longer held, back to the connection's window."""
        self.unacked += stream.held
        stream.held = 0
        self._credit()

    def _credit(self) -> None:
        if self.unacked >= wire.CONN_WINDOW // 4 and not self.closing:
            self._write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", self.unacked)))
            self.unacked = 0

    # -- frames --------------------------------------------------------------------------

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise wire.ConnectionFailure(wire.PROTOCOL_ERROR, "HEADERS on stream 0")
        payload = wire.unpad(flags, payload)
        if flags & wire.PRIORITY_FLAG:
            payload = payload[5:]
        if flags & END_HEADERS:
            self._headers_done(sid, flags, payload)
        else:
            self.block = (sid, flags, bytearray(payload))

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        if self.block is None or self.block[0] != sid:
            raise wire.ConnectionFailure(wire.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block = self.block[2]
        block += payload
        if len(block) > wire.MAX_BLOCK:
            raise wire.ConnectionFailure(wire.ENHANCE_YOUR_CALM, f"a header block over {wire.MAX_BLOCK} bytes")
        if flags & END_HEADERS:
            first_flags = self.block[1]
            self.block = None
            self._headers_done(sid, first_flags, bytes(block))

    def _headers_done(self, sid: int, flags: int, block: bytes) -> None:
        headers = self.decoder.decode(block)  # always: the decoder's table must see every block
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client: the request ends
            if not flags & END_STREAM:
                raise wire.ConnectionFailure(wire.PROTOCOL_ERROR, "trailers without END_STREAM")
            self._end_of_request(stream)
            return
        if sid % 2 == 0 or sid <= self.last_sid:
            raise wire.ConnectionFailure(wire.PROTOCOL_ERROR, f"stream {sid} is not a new client stream")
        self.last_sid = sid
        if self.goaway:
            self._write(frame(RST_STREAM, 0, sid, struct.pack(">L", wire.REFUSED_STREAM)))
            return
        if len(self.streams) >= self.limits.max_streams:
            self._write(frame(RST_STREAM, 0, sid, struct.pack(">L", wire.REFUSED_STREAM)))
            self.owner.refused()
            return
        stream = Stream(sid, self.peer_window, self.limits.max_message_bytes + 4096)
        self.streams[sid] = stream
        self._start(stream, headers)
        if flags & END_STREAM and not stream.closed:
            self._end_of_request(stream)

    def _start(self, stream: Stream, headers: list[tuple[str, str]]) -> None:
        """The request's headers: find the method, the deadline, the metadata."""
        path = method_name = content_type = ""
        timeout: float | None = None
        metadata: list[tuple[str, str]] = []
        for name, value in headers:
            if name[0] == ":":
                if name == ":path":
                    path = value
                elif name == ":method":
                    method_name = value
            elif name == "content-type":
                content_type = value
            elif name == "grpc-timeout":
                timeout = wire.grpc_timeout_s(value)
            else:
                metadata.append((name, value))
        stream.path = path
        if method_name != "POST" or not content_type.startswith("application/grpc"):
            self._http_error(stream, 405 if method_name != "POST" else 415)
            return
        method = self.methods.get(path)
        if method is None:
            self._finish(stream, None, StatusCode.UNIMPLEMENTED, f"Method not found: {path}")
            return
        stream.method = method
        deadline = None if timeout is None else self.loop.time() + timeout
        stream.call = Call(path, metadata, deadline, self.loop)

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise wire.ConnectionFailure(wire.PROTOCOL_ERROR, "DATA on stream 0")
        stream = self.streams.get(sid)
        if stream is None or stream.ended or stream.closed:
            if sid > self.last_sid:
                raise wire.ConnectionFailure(wire.PROTOCOL_ERROR, f"DATA on idle stream {sid}")
            self.unacked += len(payload)  # a stream answered or reset already: its bytes are dropped
            return
        stream.held += len(payload)
        stream.window_in -= len(payload)
        if stream.window_in < 0:
            raise wire.ConnectionFailure(wire.FLOW_CONTROL_ERROR, f"stream {sid} sent past its window")
        if not stream.closed:
            stream.data += wire.unpad(flags, payload)
            if stream.method is not None and stream.method.kind == "each":
                self._each(stream)
            elif len(stream.data) > self.limits.max_message_bytes + 5:
                self._too_big(stream)
        if flags & END_STREAM:
            self._end_of_request(stream)

    def _on_rst(self, flags: int, sid: int, payload: bytes) -> None:
        if len(payload) != 4 or sid == 0:
            raise wire.ConnectionFailure(wire.PROTOCOL_ERROR if sid == 0 else wire.FRAME_SIZE, "a malformed RST_STREAM")
        stream = self.streams.pop(sid, None)
        if stream is not None:
            stream.closed = stream.ended = True
            self._release(stream)
            self.blocked.pop(sid, None)
            self._maybe_close()

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0 or len(payload) % 6:
            raise wire.ConnectionFailure(wire.PROTOCOL_ERROR if sid else wire.FRAME_SIZE, "a malformed SETTINGS frame")
        if flags & ACK:
            return
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, i)
            if key == wire.SET_WINDOW:
                if value > wire.MAX_WINDOW:
                    raise wire.ConnectionFailure(wire.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1")
                delta, self.peer_window = value - self.peer_window, value
                for s in self.streams.values():
                    s.window += delta
            elif key == wire.SET_FRAME:
                if not 16_384 <= value <= 16_777_215:
                    raise wire.ConnectionFailure(wire.PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_frame = value
        self._write(frame(SETTINGS, ACK, 0))
        self._send_blocked()

    def _on_ping(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0 or len(payload) != 8:
            raise wire.ConnectionFailure(wire.PROTOCOL_ERROR if sid else wire.FRAME_SIZE, "a malformed PING")
        if not flags & ACK:
            self._write(frame(PING, ACK, 0, payload))

    def _on_goaway(self, flags: int, sid: int, payload: bytes) -> None:
        self.goaway = True  # the peer opens no more streams: close once the open ones are answered
        self._maybe_close()

    def _on_window(self, flags: int, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise wire.ConnectionFailure(wire.FRAME_SIZE, "a malformed WINDOW_UPDATE")
        inc = struct.unpack(">L", payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if inc == 0 or self.window + inc > wire.MAX_WINDOW:
                raise wire.ConnectionFailure(
                    wire.PROTOCOL_ERROR if inc == 0 else wire.FLOW_CONTROL_ERROR, "a bad connection WINDOW_UPDATE"
                )
            self.window += inc
        else:
            stream = self.streams.get(sid)
            if stream is None:
                return
            stream.window += inc
        self._send_blocked()

    def _on_priority(self, flags: int, sid: int, payload: bytes) -> None:
        if len(payload) != 5:
            raise wire.ConnectionFailure(wire.FRAME_SIZE, "a malformed PRIORITY")

    def _on_push(self, flags: int, sid: int, payload: bytes) -> None:
        raise wire.ConnectionFailure(wire.PROTOCOL_ERROR, "PUSH_PROMISE from a client")

    # -- calls ---------------------------------------------------------------------------

    def _end_of_request(self, stream: Stream) -> None:
        stream.ended = True
        if stream.closed:
            return
        method = stream.method
        if method is None:
            return
        if method.kind == "each":
            self._finish(stream, None, StatusCode.OK, "")
            return
        message = self._message(stream)
        if message is None:
            return
        if method.kind == "unary":
            stream.task = self.loop.create_task(self._unary(stream, method.fn, message))
        else:
            stream.task = self.loop.create_task(self._server_stream(stream, method.fn, message))

    def _message(self, stream: Stream) -> bytes | None:
        """The one request message of a unary or server-streaming call (None: answered)."""
        data = stream.data
        if len(data) < 5 or len(data) != 5 + int.from_bytes(data[1:5], "big"):
            self._finish(stream, None, StatusCode.INTERNAL, "expected exactly one request message")
            return None
        if data[0]:
            self._finish(stream, None, StatusCode.UNIMPLEMENTED, "compressed messages are not accepted")
            return None
        return bytes(data[5:])

    def _each(self, stream: Stream) -> None:
        """Every complete request message of an ``each`` stream answered in turn."""
        data, call, fn = stream.data, stream.call, stream.method.fn  # type: ignore[union-attr]
        while len(data) >= 5 and not stream.closed:
            n = int.from_bytes(data[1:5], "big")
            if n > self.limits.max_message_bytes:
                self._too_big(stream)
                return
            if len(data) < 5 + n:
                break
            message = bytes(data[5 : 5 + n])
            del data[: 5 + n]
            stream.each_seen += 5 + n
            try:
                answer = fn(message, call)
            except RpcError as exc:
                self._finish(stream, None, exc.code, exc.message)
                return
            self._send_message(stream, answer)
        if stream.each_seen >= 16 * 1024 and not stream.ended:  # consumed: both windows get it back
            n, stream.each_seen = stream.each_seen, 0
            stream.window_in += n
            stream.held -= n
            self.unacked += n
            self._write(frame(WINDOW_UPDATE, 0, stream.sid, struct.pack(">L", n)))
            self._credit()

    async def _unary(self, stream: Stream, fn: Callable[[bytes, Call], Awaitable[bytes]], message: bytes) -> None:
        try:
            answer = await fn(message, stream.call)  # type: ignore[arg-type]
        except RpcError as exc:
            self._finish(stream, None, exc.code, exc.message)
        except Exception:  # the method's bug: logged, the call ends INTERNAL
            log.exception("gRPC method %s failed", stream.path)
            self._finish(stream, None, StatusCode.INTERNAL, "internal error")
        else:
            self._finish(stream, answer, StatusCode.OK, "")

    async def _server_stream(
        self, stream: Stream, fn: Callable[[bytes, Call], AsyncIterator[bytes]], message: bytes
    ) -> None:
        try:
            async for answer in fn(message, stream.call):  # type: ignore[arg-type]
                if stream.closed:
                    return
                self._send_message(stream, answer)
        except RpcError as exc:
            self._finish(stream, None, exc.code, exc.message)
        except Exception:
            log.exception("gRPC method %s failed", stream.path)
            self._finish(stream, None, StatusCode.INTERNAL, "internal error")
        else:
            self._finish(stream, None, StatusCode.OK, "")

    def _too_big(self, stream: Stream) -> None:
        n = self.limits.max_message_bytes
        self._finish(stream, None, StatusCode.RESOURCE_EXHAUSTED, f"a request message larger than {n} bytes")

    # -- answers -------------------------------------------------------------------------

    def _send_message(self, stream: Stream, message: bytes) -> None:
        """One response message (the response headers first, when it is the first)."""
        if stream.closed or self.closing:
            return
        if not stream.started:
            stream.started = True
            self._queue(stream, HEADERS, END_HEADERS, RESPONSE_HEADERS)
        self._queue(stream, DATA, 0, len(message).to_bytes(5, "big") + message)

    def _finish(self, stream: Stream, message: bytes | None, code: int, text: str) -> None:
        """End the call: its message (if any), then its status; trailers only when nothing
        was sent before. The stream is closed here; a client still sending is reset."""
        if stream.closed or self.closing:
            return
        if message is not None:
            self._send_message(stream, message)
        self._queue(stream, HEADERS, END_HEADERS | END_STREAM, wire.status_block(code, text, not stream.started))
        self._closed(stream)

    def _http_error(self, stream: Stream, status: int) -> None:
        """Not a gRPC request: an HTTP status and nothing else."""
        self._queue(stream, HEADERS, END_HEADERS | END_STREAM, b"\x08\x03" + str(status).encode())
        self._closed(stream)

    def _closed(self, stream: Stream) -> None:
        stream.closed = True
        self._release(stream)
        if not stream.ended:  # the client may still be sending: it need not (RFC 9113 8.1)
            self._queue(stream, RST_STREAM, 0, struct.pack(">L", wire.NO_ERROR))
        if not stream.queued:
            self.streams.pop(stream.sid, None)
        self._maybe_close()

    def _queue(self, stream: Stream, ftype: int, flags: int, payload: bytes) -> None:
        """A frame of ``stream``: sent at once, DATA as far as the connection's and the
        stream's windows go; what does not fit (and whatever follows it) waits for them."""
        if not stream.queued:
            if ftype != DATA:
                self._emit(stream, ftype, flags, payload)
                return
            payload = self._send_data(stream, payload)
            if not payload:
                return
        stream.queued.append((ftype, flags, payload))
        self.blocked[stream.sid] = stream

    def _send_data(self, stream: Stream, payload: bytes) -> bytes:
        """DATA frames of as much of ``payload`` as the windows allow; the rest."""
        room = min(self.window, stream.window)
        if room <= 0:
            return payload
        part = payload[:room]
        self.window -= len(part)
        stream.window -= len(part)
        step = self.peer_frame
        for i in range(0, len(part), step):
            self._write(frame(DATA, 0, stream.sid, part[i : i + step]))
        return payload[room:]

    def _emit(self, stream: Stream, ftype: int, flags: int, payload: bytes) -> None:
        if ftype == HEADERS and not self.table_off:  # the first block on the wire turns the table off
            self.table_off = True
            payload = wire.TABLE_OFF + payload
        self._write(frame(ftype, flags, stream.sid, payload))

    def _send_blocked(self) -> None:
        """Frames that waited for a window, as far as the windows now go."""
        for sid, stream in list(self.blocked.items()):
            q = stream.queued
            while q:
                ftype, flags, payload = q[0]
                if ftype == DATA:
                    rest = self._send_data(stream, payload)
                    if rest:
                        q[0] = (ftype, flags, rest)
                        break
                else:
                    self._emit(stream, ftype, flags, payload)
                q.pop(0)
            if not q:
                del self.blocked[sid]
                if stream.closed:
                    self.streams.pop(sid, None)
        self._maybe_close()

    # -- the connection ------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        self.out.append(data)
        if not self.flushing:
            self.flushing = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Everything written this turn of the loop, in one write."""
        self.flushing = False
        out, self.out = self.out, []
        if out and not self.transport.is_closing():
            self.transport.write(b"".join(out))

    def shutdown(self) -> None:
        """No new streams (GOAWAY naming the last one taken); closed once those are answered."""
        if not self.goaway and not self.closing:
            self.goaway = True
            self._write(frame(GOAWAY, 0, 0, struct.pack(">LL", self.last_sid, wire.NO_ERROR)))
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self.goaway and not self.streams and not self.closing:
            self.closing = True
            self._flush()
            self.transport.close()

    def _fail(self, code: int, reason: str) -> None:
        """A connection error: GOAWAY with its code, then close."""
        log.info("gRPC connection closed: %s", reason)
        self.out.append(frame(GOAWAY, 0, 0, struct.pack(">LL", self.last_sid, code) + reason.encode()[:256]))
        self.goaway = self.closing = True
        self._flush()
        self.transport.close()

    def _preface_late(self) -> None:
        self.preface_timer = None
        if not self.preface and not self.closing:
            self.owner.slow()
            self.closing = True
            self.transport.close()

    def _refuse_not_h2(self) -> None:
        """Not HTTP/2 with prior knowledge (an HTTP/1 request, say): closed."""
        self.closing = True
        self.transport.close()
