"""A connection's streams and what goes out on them: the answers of the gRPC transport
(:mod:`.transport`, which reads; this writes), kept apart from the reading side.

* an answer is HEADERS, DATA and trailers (``grpc-status``, ``grpc-message``), an error
  trailers only, a request that is not gRPC an HTTP status only;
* DATA goes out as far as the peer's windows allow, in frames of the peer's size; the rest
  is held per stream (and counted for the connection: :attr:`Output.pending`) and sent by
  :meth:`Output.drain` when a WINDOW_UPDATE or SETTINGS opens the windows; trailers follow
  the held bytes;
* a stream is forgotten once its answer has left (its request bytes given back to the
  connection's window; a client still sending is reset NO_ERROR, RFC 9113 8.1) or once it
  was reset (its method cancelled);
* what one turn of the event loop produced leaves in one write (:meth:`Output.flush`);
* a unary answer that the windows take whole (nearly every answer behind Envoy) is written
  beside h2, its state moved as h2 would move it (:meth:`Output.answer_whole`, held to h2's
  own bytes and state by tests/unit/test_grpc_answer_whole.py): h2's three sends cost
  about as much CPU as the rest of the call;
* a unary call read beside h2 (:mod:`.unary`) is *unread* by h2 until something needs h2's
  stream: :meth:`Output.took_unary` moves the connection's state as h2's reading would
  (the highest stream id, the connection's window), and :meth:`Output.tell_h2` makes the
  stream h2 would have made, in the state h2 would have left it, before any h2 call on that
  stream and before h2 reads anything more of the connection. A call answered whole never
  needs it: its stream goes from unread to closed.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import h2.config
import h2.connection
import h2.exceptions
from h2.connection import ConnectionState
from h2.errors import ErrorCodes
from h2.settings import SettingCodes, Settings
from h2.stream import H2Stream, StreamClosedBy, StreamState

from .codec import KeptDecoder, StaticEncoder, encode_static
from .unary import UnaryCall
from .wire import RESPONSE_HEADERS, Call, Limits, MessageReader, Method, frame_message, status_trailers

__all__ = ["Output", "Stream"]

_CONFIG = h2.config.H2Configuration(
    client_side=False, header_encoding=None,
    validate_inbound_headers=False, normalize_inbound_headers=False,  # read_head checks, once per head
    validate_outbound_headers=False, normalize_outbound_headers=False,  # the answers are constant
)  # fmt: skip


#: the response headers' block (static-table references and literals, as StaticEncoder encodes them)
_HEAD = encode_static(list(RESPONSE_HEADERS))
#: a frame's header (RFC 9113 4.1): length (24 bits) and type packed in one integer, flags, stream
_FRAME = struct.Struct(">IBI")
_DATA, _HEADERS = 0x0, 0x1
_END_STREAM, _END_HEADERS = 0x1, 0x4


class _H2(h2.connection.H2Connection):
    MAX_CLOSED_STREAMS = 4096  # h2 remembers how closed streams closed: 65,536 by default


class Stream:
    """A call's state on its stream."""

    __slots__ = (
        "sid", "method", "call", "reader", "task", "ended", "done", "started", "pending", "trailers", "held", "wake",
        "expected",
    )  # fmt: skip

    def __init__(self, sid: int, reader: MessageReader) -> None:
        self.sid = sid
        self.method: Method | None = None
        self.call: Call | None = None
        self.reader = reader
        self.task: asyncio.Task[None] | None = None
        self.ended = False  # the client half-closed (END_STREAM)
        self.done = False  # answered (trailers queued), refused or reset: nothing more is sent
        self.started = False  # the response headers sent
        self.pending = bytearray()  # answer bytes held by the peer's windows
        self.trailers: tuple[tuple[bytes, bytes], ...] | None = None  # to send once ``pending`` has left
        self.held = 0  # request bytes received and not yet given back to the windows
        self.wake: asyncio.Event | None = None  # a streaming method waiting (more input, or room)
        self.expected: int | None = None  # request bytes still due by its content-length (None: none sent)


class Output:
    """The writing half of a connection (see the module docstring); ``owner`` counts
    protocol events (``owner.count(kind)``)."""

    h2: _H2  # made by start_h2, once the connection is admitted

    def __init__(self, limits: Limits, owner: Any) -> None:
        self.limits = limits
        self.owner = owner
        self.loop = asyncio.get_running_loop()
        self.transport: Any = None
        self.streams: dict[int, Stream] = {}
        self.blocked: dict[int, Stream] = {}  # streams with answer bytes held by a window
        self.pending = 0  # answer bytes held, all streams
        self.flushing = False
        self.out: list[bytes] = []  # written at the next flush, before what h2 holds then
        self.stopping = False  # no new streams (our GOAWAY sent, or the peer's received)
        self.closing = False
        self.finished_calls = 0
        self.last_drain = self.loop.time()
        self.unread: dict[int, UnaryCall] = {}  # calls read beside h2 whose stream h2 has not made

    def start_h2(self) -> None:
        """The HTTP/2 state of an admitted connection, our SETTINGS and the connection's
        window sent (a connection refused never costs one)."""
        limits = self.limits
        self.h2 = _H2(_CONFIG)
        self.h2.decoder = KeptDecoder(limits.max_header_list_bytes)  # type: ignore[assignment]
        self.h2.encoder = StaticEncoder()  # type: ignore[assignment]
        settings = {
            SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_streams,
            SettingCodes.INITIAL_WINDOW_SIZE: limits.max_message_bytes + 4096,  # the largest message fits
            SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list_bytes,
        }
        self.h2.local_settings = Settings(client=False, initial_values=settings)
        self.h2.initiate_connection()  # our SETTINGS, in force at once (no ACK awaited)
        # a stream past max_streams is refused by the transport (REFUSED_STREAM, RFC 9113
        # 5.1.2), not by h2, which would end the whole connection
        settings[SettingCodes.MAX_CONCURRENT_STREAMS] = 2**31 - 1
        self.h2.local_settings = Settings(client=False, initial_values=settings)
        self.h2.increment_flow_control_window(limits.connection_window - 65_535)
        self.flush_soon()

    # -- answers -------------------------------------------------------------------------

    def send_message(self, stream: Stream, message: bytes) -> None:
        """One response message (the response headers first, when it is the first)."""
        if stream.done or self.closing:
            return
        self.tell_h2(stream.sid)
        try:
            if not stream.started:
                stream.started = True
                self.h2.send_headers(stream.sid, RESPONSE_HEADERS)
            self.send_data(stream, frame_message(message))
        except h2.exceptions.ProtocolError:  # the stream ended under it (reset by h2 in this turn)
            self.drop(stream)
        self.flush_soon()

    def finish(self, stream: Stream, message: bytes | None, code: int, text: str) -> None:
        """End the call: its message (if any), then its status (trailers only when nothing
        was sent before; after the held answer bytes when a window holds some)."""
        if stream.done or self.closing:
            return
        trailers = status_trailers(code, text)
        if message is not None and not stream.started and stream.ended and self.answer_whole(stream, message, trailers):
            return
        if message is not None:
            self.send_message(stream, message)
            if stream.done:
                return
        stream.done = True
        if not stream.started:
            stream.started = True
            self.end_stream(stream, RESPONSE_HEADERS + trailers)
        elif stream.pending:
            stream.trailers = trailers  # sent by _drain once the answer has left
        else:
            self.end_stream(stream, trailers)

    def answer_whole(self, stream: Stream, message: bytes, trailers: tuple[tuple[bytes, bytes], ...]) -> bool:
        """A unary call's whole answer (HEADERS, one DATA, trailers with END_STREAM) written
        in one piece, h2's state moved as its ``send_headers``, ``send_data`` and
        ``send_headers(end_stream=True)`` would move it (the stream closed and forgotten as
        h2 forgets closed streams, the connection's window spent): the answer to nearly every call
        behind Envoy, at a fraction of h2's cost. False, and nothing done, when the general
        way must run: the peer has not half-closed the stream, something was sent on it,
        the connection is ending, or the windows or the frame size do not take the message."""
        conn = self.h2
        sid = stream.sid
        if conn.state_machine.state is not ConnectionState.SERVER_OPEN:
            return False
        unread = sid in self.unread
        if unread:  # half-closed by the peer, nothing sent: the initial window and what the peer added
            window = conn.remote_settings.initial_window_size + self.unread[sid].credit
        else:
            h2s = conn.streams.get(sid)
            if h2s is None:
                return False
            machine = h2s.state_machine
            if machine.state is not StreamState.HALF_CLOSED_REMOTE or machine.headers_sent:
                return False
            window = h2s.outbound_flow_control_window
        data = frame_message(message)
        size = len(data)
        tail = conn.encoder.encode(trailers)
        if (
            size > window
            or size > conn.outbound_flow_control_window
            or max(size, len(tail)) > conn.max_outbound_frame_size  # (the head's block is far smaller)
        ):
            return False
        before = conn.data_to_send()  # what h2 holds goes first: the frames keep their order
        if before:
            self.out.append(before)
        self.out.append(
            b"".join((
                _FRAME.pack(len(_HEAD) << 8 | _HEADERS, _END_HEADERS, sid), _HEAD,
                _FRAME.pack(size << 8 | _DATA, 0, sid), data,
                _FRAME.pack(len(tail) << 8 | _HEADERS, _END_HEADERS | _END_STREAM, sid), tail,
            ))
        )  # fmt: skip
        # h2's state: the connection's window spent, the stream closed by END_STREAM and
        # forgotten as h2's _open_streams forgets a closed one (its own object is dropped)
        conn.outbound_flow_control_window -= size
        if unread:
            del self.unread[sid]
        else:
            del conn.streams[sid]
        conn._closed_streams[sid] = StreamClosedBy.SEND_END_STREAM
        stream.started = stream.done = True
        self.finished_calls += 1
        self.forget(stream)
        self.flush_soon()
        return True

    def http_error(self, stream: Stream, status: int) -> None:
        """Not a gRPC request: an HTTP status and nothing else."""
        stream.done = stream.started = True
        self.end_stream(stream, ((b":status", str(status).encode()),))

    def end_stream(self, stream: Stream, headers: tuple[tuple[bytes, bytes], ...]) -> None:
        """The stream's last header block (END_STREAM); the stream is forgotten: its request
        bytes given back, a client still sending reset (it need not send more, RFC 9113 8.1)."""
        self.tell_h2(stream.sid)
        try:
            self.h2.send_headers(stream.sid, list(headers), end_stream=True)
            if not stream.ended:
                self.h2.reset_stream(stream.sid, ErrorCodes.NO_ERROR)
        except h2.exceptions.ProtocolError:
            pass
        self.closed_in_h2(stream.sid)
        self.finished_calls += 1
        self.forget(stream)
        self.flush_soon()

    def send_data(self, stream: Stream, data: bytes) -> None:
        """As much of ``data`` as the windows take, in frames of the peer's size; the rest
        held (:meth:`_drain` sends it when the windows open)."""
        if stream.pending:
            stream.pending += data
            self.pending += len(data)
            return
        sent = self.data_frames(stream.sid, data)
        if sent < len(data):
            stream.pending += data[sent:]
            self.pending += len(data) - sent
            if not self.blocked:
                self.last_drain = self.loop.time()
            self.blocked[stream.sid] = stream

    def data_frames(self, sid: int, data: bytes | bytearray) -> int:
        self.tell_h2(sid)
        room = min(self.h2.local_flow_control_window(sid), len(data))
        step = self.h2.max_outbound_frame_size
        for i in range(0, room, step):
            self.h2.send_data(sid, bytes(data[i : min(i + step, room)]))
        return room

    def drain(self) -> None:
        """Held answer bytes, as far as the windows now go; trailers once their answer left."""
        for sid, stream in list(self.blocked.items()):
            try:
                sent = self.data_frames(sid, stream.pending)
            except h2.exceptions.ProtocolError:
                self.drop(stream)
                continue
            if not sent:
                continue
            self.last_drain = self.loop.time()
            del stream.pending[:sent]
            self.pending -= sent
            if stream.pending:
                continue
            del self.blocked[sid]
            if stream.trailers is not None:
                trailers, stream.trailers = stream.trailers, None
                self.end_stream(stream, trailers)
            elif stream.wake is not None:
                stream.wake.set()
        if self.pending < self.limits.max_pending_output:
            for stream in self.streams.values():  # streams waiting for the connection's room
                if stream.wake is not None and not stream.pending:
                    stream.wake.set()
        self.flush_soon()

    # -- streams -------------------------------------------------------------------------

    def reset(self, sid: int, code: ErrorCodes, count: bool = True) -> None:
        self.tell_h2(sid)
        try:
            self.h2.reset_stream(sid, code)
        except h2.exceptions.ProtocolError:
            return
        self.closed_in_h2(sid)
        if count:
            self.owner.count("reset_sent")
        self.flush_soon()

    def closed_in_h2(self, sid: int) -> None:
        """A stream h2 has closed, forgotten by h2 at once (kept only as how it closed), as
        h2 forgets closed streams when the next one opens and as a whole answer forgets its
        stream: whatever the peer sends on it next is answered the same however it closed."""
        conn = self.h2
        stream = conn.streams.get(sid)
        if stream is not None and stream.closed:
            del conn.streams[sid]
            conn._closed_streams[sid] = stream.closed_by

    def drop(self, stream: Stream) -> None:
        """A stream that ends without its answer (reset): its method cancelled."""
        stream.done = True
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
        if stream.wake is not None:
            stream.wake.set()
        self.forget(stream)

    def forget(self, stream: Stream) -> None:
        if stream.held:
            self.give_back(stream.sid, stream.held)
            stream.held = 0
        if stream.pending:
            self.pending -= len(stream.pending)
            stream.pending.clear()
        self.blocked.pop(stream.sid, None)
        self.streams.pop(stream.sid, None)
        if self.stopping:
            self.maybe_close()

    def give_back(self, sid: int, size: int) -> None:
        """Request bytes consumed: back to the connection's window (and the stream's)."""
        if size > 0 and not self.closing:
            self.tell_h2(sid)
            try:
                self.h2.acknowledge_received_data(size, sid)
            except h2.exceptions.ProtocolError:
                pass

    # -- calls read beside h2 ------------------------------------------------------------

    def took_unary(self, calls: list[UnaryCall]) -> None:
        """Calls read beside h2 (:mod:`.unary`): the connection's state moved as h2's reading of
        their frames moves it (the connection's inbound window spent, its outbound window
        credited, the highest stream id); their streams unread until :meth:`tell_h2`."""
        conn = self.h2
        if conn.streams:  # h2 forgets the closed ones at every new stream's HEADERS
            _ = conn.open_inbound_streams
        window = conn._inbound_flow_control_window_manager
        for call in calls:
            window.window_consumed(len(call.data))
            conn.outbound_flow_control_window += call.connection_credit
            self.unread[call.sid] = call
        conn.highest_inbound_stream_id = calls[-1].sid

    def tell_h2(self, sid: int) -> None:
        """``sid``'s stream made in h2 as its reading would have made it, if it was read beside h2."""
        call = self.unread.pop(sid, None)
        if call is not None:
            self._make_stream(call)

    def tell_h2_all(self) -> None:
        """Every unread stream made in h2, before h2 reads more of the connection."""
        if self.unread:
            calls = list(self.unread.values())
            self.unread.clear()
            for call in calls:
                self._make_stream(call)

    def _make_stream(self, call: UnaryCall) -> None:
        """What h2's ``_receive_headers_frame``, ``_receive_window_update_frame`` and
        ``_receive_data_frame`` do to a new stream: made with the connection's windows and frame
        size, then its HEADERS, its WINDOW_UPDATEs and its DATA with END_STREAM received
        (half-closed by the peer)."""
        conn = self.h2
        stream = H2Stream(
            call.sid,
            config=conn.config,
            inbound_window_size=conn.local_settings.initial_window_size,
            outbound_window_size=conn.remote_settings.initial_window_size,
        )
        stream.max_outbound_frame_size = conn.max_outbound_frame_size
        stream.receive_headers(call.headers, False, conn.config.header_encoding)
        if call.credit:
            stream.receive_window_update(call.credit)
        stream.receive_data(call.data, True, len(call.data))
        conn.streams[call.sid] = stream

    def flush_soon(self) -> None:
        if not self.flushing:
            self.flushing = True
            self.loop.call_soon(self.flush)

    def flush(self, extra: bytes = b"") -> None:
        """Everything this turn of the loop made, in one write."""
        self.flushing = False
        if self.transport is None or self.transport.is_closing():
            self.out.clear()
            return
        data = self.h2.data_to_send() + extra
        if self.out:
            data = b"".join(self.out) + data
            self.out.clear()
        if data:
            self.transport.write(data)

    def release(self) -> None:
        """A lost connection's state let go at once. h2's connection refers to itself (its
        frame handlers are its own bound methods), as the transport and this protocol refer
        to each other: without this, a closed connection waits for a full garbage collection,
        rare once the collector is tuned (control_plane/gctune.py), and 20,000 connections
        opened and closed grew the process by 90 MB instead of 40."""
        self.unread.clear()
        h2 = getattr(self, "h2", None)
        if h2 is not None:
            h2.__dict__.clear()
        self.transport = None

    def maybe_close(self, force: bool = False) -> None:
        if (force or (self.stopping and not self.streams)) and not self.closing:
            self.flush()
            self.closing = True
            self.transport.close()
