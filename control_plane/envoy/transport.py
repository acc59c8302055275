"""gRPC over HTTP/2 on an asyncio protocol, python-hyper's ``h2`` state machine inside: the
transport of shadowlimit's gRPC server, in the app's event loop.

Why not grpcio's server: behind Envoy every request waits for a ``ShouldRateLimit`` call due
within Envoy's deadline (20 ms by default), and grpcio's aio server spends over 100 us of CPU
per call before any work is done (docs/benchmarks.md). Here the calls that arrive in one
read are decoded together, the answers ready in one turn of the loop leave in one write.

What h2 does (RFC 9113): frames, stream states (a HEADERS after END_STREAM is a stream
error STREAM_CLOSED, never a second call), flow control both ways (a client sending past
its window is FLOW_CONTROL_ERROR), settings, PING, GOAWAY. What this module adds:

* HPACK through :mod:`.codec` (Envoy's repeated blocks decoded once; answers never touch the
  dynamic table) and each request's head checked and read once (:func:`.wire.read_head`): a
  malformed request (RFC 9113 8.1) is a stream error, logged on one line;
* :mod:`.frames`' walk before h2 reads anything (idle-stream frames, floods);
* Envoy's unary calls (HEADERS of a new stream with a header block HPACK has decoded before,
  one DATA with END_STREAM) taken beside h2 (:mod:`.unary`): h2's state moved as its reading
  would move it, the stream made in h2 only once something needs it there
  (:meth:`.streams.Output.tell_h2`); every other frame read by h2, unchanged. A read is acted
  on in its frames' order once h2 has read all of it, as before;
* bounds: a read is handed to h2 in slices of :attr:`Limits.read_slice` bytes, one slice a
  turn of the loop; streams per connection (REFUSED_STREAM past ``max_streams``); request
  bytes held (the connection's window, given back as calls end); answers held by the
  peer's windows (past ``max_pending_output`` no new call starts; a streaming method waits
  for its previous answer to leave before it makes the next); a peer that does not read
  its socket is not read either;
* calls (:mod:`.calls`): a method runs as a task, started once the reads of a turn are in (a
  call reset in the same read never runs); a reset stream or a lost connection cancels it; a peer that
  resets more calls than it lets finish (the Rapid Reset attack, CVE-2023-44487, counted as
  Envoy counts premature resets) gets GOAWAY ENHANCE_YOUR_CALM;
* timers, kept by the server's sweep (:meth:`GrpcConnection.tick`): the preface, idle
  connections, keepalive PINGs, answers the peer's window has held too long;
* a graceful stop: GOAWAY naming the last stream taken, the calls taken answered.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from h2.connection import ConnectionState
from h2.errors import ErrorCodes
from hyperframe.frame import GoAwayFrame

from .calls import Calls, cancel_in_turns
from .codec import HeaderBlockError
from .frames import END_STREAM, RST_STREAM, FrameWalk, Refusal
from .streams import Stream
from .unary import UnaryCall, h2_run_end, read_unary
from .wire import (
    Call,
    Head,
    Limits,
    MessageReader,
    Method,
    RpcError,
    StatusCode,
    read_head,
    trailers_problem,
)

__all__ = ["Call", "GrpcConnection", "Limits", "Method", "RpcError", "StatusCode"]

log = logging.getLogger("shadowlimit.grpc")

#: resets a client may make before the Rapid Reset check applies, and the streams after which
#: the counts are halved (so a long honest history does not hide an attack for long)
RESET_GRACE = 200
RESET_WINDOW = 10_000
_HEADS_KEPT = 256


class GrpcConnection(Calls, asyncio.Protocol):
    """One client connection (see the module docstring). ``methods`` maps
    ``/pkg.Service/Method`` to a :class:`Method`; ``owner`` (the server) admits connections,
    counts protocol events (``owner.count(kind)``), authorizes calls and sweeps timers."""

    #: Envoy's unary calls read beside h2 (:mod:`.unary`); False: h2 reads every frame
    unary_reads = True

    def __init__(self, methods: dict[str, Method], limits: Limits, owner: Any) -> None:
        super().__init__(limits, owner)
        self.methods = methods
        now = self.loop.time()
        self.walk = FrameWalk(now)
        self.heads: dict[tuple[Any, ...], Head] = {}
        self.backlog = b""  # read and not yet handed to h2 (a slice a turn)
        self.preface = False
        self.reading_paused = 0  # bits: 1 the peer does not read, 2 a backlog is being fed
        self.opened_at = self.last_frame = self.last_call = now
        self.ping_sent: float | None = None
        self.started_calls = self.resets = 0
        self.preface_timer: Any = None
        self.peer_names: tuple[str, ...] = ()  # the client certificate's, with mutual TLS

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        tls = self.owner.tls
        if tls is not None:  # after the handshake: the client certificate's names, if any
            names = tls.admit(transport.get_extra_info("ssl_object"))
            if names is None:  # mutual TLS names the clients it accepts; this is none of them
                self.closing = True
                transport.abort()
                return
            self.peer_names = names
        if not self.owner.admit(self):
            self.closing = True
            transport.close()
            return
        self.start_h2()
        self.preface_timer = self.loop.call_later(self.limits.preface_timeout_s, self._preface_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.preface_timer is not None:
            self.preface_timer.cancel()
        tasks = list(self.gatherings)
        for stream in self.streams.values():
            stream.done = True
            if stream.task is not None:
                tasks.append(stream.task)
        cancel_in_turns(self.loop, tasks)
        self.streams.clear()
        self.blocked.clear()
        self.ready.clear()
        self.owner.closed(self)
        self.release()

    def pause_writing(self) -> None:  # the peer does not read its answers: stop reading its calls
        self._pause(1)

    def resume_writing(self) -> None:
        self._resume(1)

    def _pause(self, bit: int) -> None:
        if not self.reading_paused and not self.closing:
            self.transport.pause_reading()
        self.reading_paused |= bit

    def _resume(self, bit: int) -> None:
        self.reading_paused &= ~bit
        if not self.reading_paused and not self.closing:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self.backlog:
            self.backlog += data
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        """Hand h2 a slice (at most ``read_slice`` bytes, and no more frames and new streams
        than the frame walk allows a turn); the rest waits for the next turn of the loop."""
        now = self.loop.time()
        self.last_frame = now
        head = data[: self.limits.read_slice]
        upto, refusal = self.walk.walk(head, now)
        if refusal is None and upto < len(data):
            self.backlog = data[upto:] + self.backlog
            if not self.reading_paused & 2:
                self._pause(2)
                self.loop.call_soon(self._feed_backlog)
        if self.walk.patches:  # trailers that do not end their stream: h2 reads them as if they did
            patched = bytearray(head)
            for at in self.walk.patches:
                patched[at] |= END_STREAM
            head = bytes(patched)
        chunk = head if upto == len(head) else head[:upto]
        plan = self._read(chunk)
        if plan is None or not self._act(plan):  # the connection failed or ends
            return
        if refusal is not None:
            self._fail(refusal)
            return
        self.start_ready()
        self.flush_soon()

    def _act(self, plan: list[tuple[list[UnaryCall], list[Any]]]) -> bool:
        """What a read brought, acted on in the order of its frames (False: the connection ends)."""
        for calls, events in plan:
            if events and not self.preface:
                self.preface = True
            for call in calls:  # as h2's events of its HEADERS, WINDOW_UPDATEs and DATA with END_STREAM
                self._request(call.sid, call.headers)
                for _ in range(call.windows):
                    self._on_window(None)
                if not self.closing:
                    self._data(call.sid, call.data, len(call.data))
                if not self.closing:
                    self._end(call.sid)
                for _ in range(call.connection_windows):
                    self._on_window(None)
                if self.closing:
                    return False
            for event in events:
                handler = _HANDLERS.get(type(event))
                if handler is not None:
                    handler(self, event)
                if self.closing:
                    return False
        return True

    def _read(self, chunk: bytes) -> list[tuple[list[UnaryCall], list[Any]]] | None:
        """``chunk`` read: runs of unary calls read beside h2 (:mod:`.unary`) and the events
        of the frames h2 read between them, in the order of their frames (each part is calls or
        events); h2's state moved as if it had read every frame, before any is acted on (as
        h2 reads a whole read before its events are). None: the connection failed."""
        plan: list[tuple[list[UnaryCall], list[Any]]] = []
        conn = self.h2
        pos, n = 0, len(chunk)
        beside = self.unary_reads and self.preface
        while pos < n:
            frames = conn.incoming_buffer
            if beside and not frames._data and not frames._headers_buffer:
                calls, end = self._read_unary(chunk, pos)
                if calls:
                    plan.append((calls, []))
                    pos = end
                    continue
            end = h2_run_end(chunk, pos, bytes(frames._data)) if beside else n
            self.tell_h2_all()  # h2 reads on: the streams read beside it first
            try:
                events = conn.receive_data(chunk if pos == 0 and end == n else chunk[pos:end])
            except h2.exceptions.ProtocolError as exc:
                self._count_resets(conn.data_to_send())  # (its GOAWAY among them)
                self._fail(Refusal(ErrorCodes(exc.error_code or ErrorCodes.PROTOCOL_ERROR), str(exc)), sent=True)
                return None
            except HeaderBlockError as exc:
                self._count_resets(conn.data_to_send())
                self._fail(Refusal(exc.code, exc.reason))
                return None
            self._count_resets(conn.data_to_send())
            plan.append(([], events))
            pos = end
        return plan

    def _read_unary(self, chunk: bytes, start: int) -> tuple[list[UnaryCall], int]:
        """The unary calls at ``start`` read beside h2 (:mod:`.unary`), where h2 holds no part
        of a frame and its connection is open; h2's state moved as its reading would move it."""
        conn = self.h2
        if conn.state_machine.state is not ConnectionState.SERVER_OPEN:
            return [], start
        calls, end = read_unary(
            chunk,
            start,
            highest=conn.highest_inbound_stream_id,
            max_frame=conn.max_inbound_frame_size,
            connection_window=conn._inbound_flow_control_window_manager.current_window_size,
            stream_window=conn.local_settings.initial_window_size,
            outbound=(conn.outbound_flow_control_window, conn.remote_settings.initial_window_size),
            headers_of=self._well_formed,
        )
        if calls:
            self.took_unary(calls)
        return calls, end

    def _well_formed(self, block: bytes) -> list[Any] | None:
        """A header block's fields where decoding it changes nothing and the request's head,
        read before, is well formed (so h2 would take it as it takes any request)."""
        headers = self.h2.decoder.kept(block)  # type: ignore[attr-defined]
        if headers is None:
            return None
        head = self.heads.get(tuple(headers))
        return headers if head is not None and head.problem is None else None

    def _count_resets(self, auto: bytes) -> None:
        """What h2 answered by itself while reading (ACKs, WINDOW_UPDATEs, and the RST_STREAMs
        of its stream errors, counted here: h2 raises no event for some), kept for the write;
        also when the read then failed (those answers are written before the GOAWAY)."""
        if not auto:
            return
        self.out.append(auto)
        pos, n = 0, len(auto)
        while pos + 9 <= n:
            if auto[pos + 3] == RST_STREAM:
                self.owner.count("reset_sent")
            pos += 9 + int.from_bytes(auto[pos : pos + 3], "big")

    def _feed_backlog(self) -> None:
        if self.closing:
            return
        data, self.backlog = self.backlog, b""
        self._feed(data)
        if not self.backlog:
            self._resume(2)
        elif not self.closing:
            self.loop.call_soon(self._feed_backlog)

    # -- events --------------------------------------------------------------------------

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        self._request(event.stream_id, event.headers or [])

    def _on_data(self, event: h2.events.DataReceived) -> None:
        self._data(event.stream_id, event.data or b"", event.flow_controlled_length or 0)

    def _on_end(self, event: h2.events.StreamEnded) -> None:
        self._end(event.stream_id)

    def _request(self, sid: int, headers: list[Any]) -> None:
        key = tuple(headers)
        head = self.heads.get(key)
        if head is None:
            head = read_head(headers)
            if len(self.heads) >= _HEADS_KEPT:
                self.heads.clear()
            self.heads[key] = head
        if head.problem is not None:
            self._malformed(sid, None, head.problem)
            return
        if (
            self.stopping
            or len(self.streams) >= self.limits.max_streams
            or self.pending >= self.limits.max_pending_output
        ):
            self.owner.count("refused_stream")
            self.reset(sid, ErrorCodes.REFUSED_STREAM)
            return
        stream = Stream(sid, MessageReader(self.limits.max_message_bytes, head.encoding))
        stream.expected = head.content_length
        self.streams[sid] = stream
        self.started_calls += 1
        if self.started_calls >= RESET_WINDOW:
            self.started_calls //= 2
            self.resets //= 2
        self.last_call = self.loop.time()
        if head.status is not None:  # not gRPC: an HTTP status and nothing else
            self.http_error(stream, head.status)
            return
        if head.error is not None:
            self.finish(stream, None, *head.error)
            return
        method = self.methods.get(head.path)
        if method is None:
            self.finish(stream, None, StatusCode.UNIMPLEMENTED, f"Method not found: {head.path}")
            return
        deadline = None if head.timeout_s is None else self.loop.time() + head.timeout_s
        call = Call(head.path, list(head.metadata), deadline, self.loop)
        try:
            if not method.public:
                self.owner.authorize(call, self.peer_names)
        except RpcError as exc:
            self.finish(stream, None, exc.code, exc.message)
            return
        stream.method, stream.call = method, call
        if method.kind == "each":  # reads its messages as they come
            self.ready.append(stream)

    def _data(self, sid: int, data: bytes, size: int) -> None:
        stream = self.streams.get(sid)
        if stream is None or stream.done:  # answered or refused already: the bytes are given back
            self.give_back(sid, size)
            return
        stream.held += size
        if stream.expected is not None:
            stream.expected -= len(data)
            if stream.expected < 0:
                self._malformed(sid, stream, "DATA past the request's content-length")
                return
        try:
            stream.reader.feed(data)
        except RpcError as exc:  # a length over the bound: refused before the rest arrives
            self.finish(stream, None, exc.code, exc.message)
            return
        if stream.wake is not None:
            stream.wake.set()

    def _end(self, sid: int) -> None:
        stream = self.streams.get(sid)
        if stream is None:
            return
        stream.ended = True
        if stream.expected:
            self._malformed(sid, stream, "DATA short of the request's content-length")
            return
        if stream.method is None:  # answered already
            return
        if stream.method.kind == "each":
            if stream.wake is not None:
                stream.wake.set()
        else:
            self.ready.append(stream)

    def _on_trailers(self, event: h2.events.TrailersReceived) -> None:
        sid = event.stream_id
        problem = trailers_problem(event.headers or [])
        if sid in self.walk.bad_trailers:
            self.walk.bad_trailers.discard(sid)
            problem = "trailers without END_STREAM"
        if problem is not None:
            self._malformed(sid, self.streams.get(sid), f"malformed trailers ({problem})")

    def _malformed(self, sid: int, stream: Stream | None, problem: str) -> None:
        """A malformed request (RFC 9113 8.1.1): a stream error, one log line."""
        _LOG_LINES.info(self.loop.time(), "gRPC stream %d reset: a malformed request: %s", sid, problem)
        self.owner.count("bad_header")
        if stream is not None:
            self.drop(stream)
        self.reset(sid, ErrorCodes.PROTOCOL_ERROR)

    def _on_reset(self, event: h2.events.StreamReset) -> None:
        if event.remote_reset:  # one that h2 sent is counted in _count_resets
            self.owner.count("reset_received")
        stream = self.streams.get(event.stream_id)
        if stream is None:
            return
        if event.remote_reset and not stream.started:  # reset before its answer began: premature
            self.resets += 1
            if self.resets > RESET_GRACE and self.resets * 2 > self.started_calls:
                self._fail(Refusal(ErrorCodes.ENHANCE_YOUR_CALM, "more calls reset than answered (Rapid Reset)"))
                return
        self.drop(stream)

    def _on_window(self, event: Any) -> None:
        if self.blocked:
            self.drain()

    def _on_goaway(self, event: h2.events.ConnectionTerminated) -> None:
        self.stopping = True  # the peer opens no more streams: closed once the open ones are answered
        self.maybe_close()

    def _on_ping_ack(self, event: h2.events.PingAckReceived) -> None:
        self.ping_sent = None

    # -- the connection ------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """The server's sweep (about once a second): idle connections closed, keepalive
        PINGs sent and their answers awaited, answers held by the peer's windows too long."""
        if self.closing or not self.preface:
            return
        limits = self.limits
        if self.streams:
            self.last_call = now
        elif now - self.last_call >= limits.idle_timeout_s:
            self.owner.count("idle_close")
            self.shutdown(close_now=True)
            return
        if self.blocked and now - self.last_drain >= limits.keepalive_timeout_s:
            self.owner.count("flow_control")
            self._fail(Refusal(ErrorCodes.ENHANCE_YOUR_CALM, "answers held by the window for too long"), count=False)
            return
        if self.ping_sent is not None and self.last_frame > self.ping_sent:
            self.ping_sent = None  # the peer spoke since: it is there
        if self.ping_sent is None:
            if now - self.last_frame >= limits.keepalive_s:
                self.ping_sent = now
                self.h2.ping(os.urandom(8))
                self.flush_soon()
        elif now - self.ping_sent >= limits.keepalive_timeout_s:
            self.owner.count("keepalive_timeout")
            _LOG_LINES.info(
                now, "gRPC connection closed: no answer to a keepalive PING in %.0f s", limits.keepalive_timeout_s
            )
            self.closing = True
            self.transport.close()

    def squatting_for(self, now: float) -> float:
        """Seconds this connection has been open without ever making a call (0: it has made
        one): what the server may close for a newcomer."""
        return 0.0 if self.started_calls or self.streams else now - self.opened_at

    def shutdown(self, close_now: bool = False) -> None:
        """No new streams: GOAWAY naming the last stream taken (written beside h2, whose
        state would refuse the answers still due); closed once those are answered."""
        if self.closing:
            return
        if not self.stopping:
            self.stopping = True
            goaway = GoAwayFrame(0)
            goaway.last_stream_id = self.h2.highest_inbound_stream_id
            goaway.error_code = ErrorCodes.NO_ERROR
            self.flush(goaway.serialize())
        if close_now or not self.streams:
            self.maybe_close(force=True)

    def _fail(self, refusal: Refusal, sent: bool = False, count: bool = True) -> None:
        """A connection error: GOAWAY with its code (h2's own when ``sent``), then close."""
        if self.closing:
            return
        _LOG_LINES.info(self.loop.time(), "gRPC connection closed: %s", refusal.reason)
        if count:
            self.owner.count(_GOAWAY_KINDS.get(refusal.code, "goaway_protocol_error"))
        if not sent:
            try:
                self.h2.close_connection(refusal.code, refusal.reason.encode()[:256])
            except h2.exceptions.ProtocolError:
                pass
        self.flush()
        self.closing = True
        self.transport.close()

    def _preface_late(self) -> None:
        self.preface_timer = None
        if not self.preface and not self.closing:
            self.owner.slow()
            self.closing = True
            self.transport.close()


class LogLines:
    """The transport's log lines about its clients, at most ``burst`` at once and ``rate`` a
    second (a flood of bad frames is not a flood of log lines: the metrics count them all);
    the next line that passes says how many were left out."""

    def __init__(self, burst: float = 20.0, rate: float = 2.0) -> None:
        self.burst, self.rate = burst, rate
        self.tokens, self.at, self.dropped = burst, 0.0, 0

    def info(self, now: float, message: str, *args: Any) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            self.dropped += 1
            return
        self.tokens -= 1
        if self.dropped:
            message += f" ({self.dropped} such lines left out)"
            self.dropped = 0
        log.info(message, *args)


_LOG_LINES = LogLines()
_GOAWAY_KINDS = {
    ErrorCodes.PROTOCOL_ERROR: "goaway_protocol_error",
    ErrorCodes.FLOW_CONTROL_ERROR: "goaway_flow_control_error",
    ErrorCodes.FRAME_SIZE_ERROR: "goaway_frame_size_error",
    ErrorCodes.COMPRESSION_ERROR: "goaway_compression_error",
    ErrorCodes.STREAM_CLOSED: "goaway_stream_closed",
    ErrorCodes.ENHANCE_YOUR_CALM: "goaway_enhance_your_calm",
}
#: the protocol event kinds a server counts (rate_limit_grpc_protocol_errors_total{kind})
PROTOCOL_KINDS = (
    *_GOAWAY_KINDS.values(), "reset_received", "reset_sent", "refused_stream", "flow_control", "idle_close",
    "keepalive_timeout", "connection_refused", "bad_header",
)  # fmt: skip
_HANDLERS: dict[type, Callable[[GrpcConnection, Any], None]] = {
    h2.events.RequestReceived: GrpcConnection._on_request,
    h2.events.DataReceived: GrpcConnection._on_data,
    h2.events.StreamEnded: GrpcConnection._on_end,
    h2.events.TrailersReceived: GrpcConnection._on_trailers,
    h2.events.StreamReset: GrpcConnection._on_reset,
    h2.events.WindowUpdated: GrpcConnection._on_window,
    h2.events.RemoteSettingsChanged: GrpcConnection._on_window,
    h2.events.ConnectionTerminated: GrpcConnection._on_goaway,
    h2.events.PingAckReceived: GrpcConnection._on_ping_ack,
}
