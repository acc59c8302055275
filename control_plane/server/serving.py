"""uvicorn's HTTP protocols with bounds on the request head while it arrives: its size and
the time it takes.

uvicorn enforces no header limits of its own that answer cleanly:

* httptools (the default when installed) has none: a 10 MB header is buffered whole (in
  pieces joined with ``bytes +=``) and handed to the app; only the URL is refused (400).
* h11 refuses an *incomplete* head larger than ``h11_max_incomplete_event_size`` (16 KiB
  by default; a larger head arriving in one read passes), but with a plain-text 400.

:func:`http_protocol` gives the class to pass as uvicorn's ``http=``: the chosen
implementation, refusing a head that grows past :attr:`RequestLimits.head_bytes` with the
same JSON 431 as :class:`~control_plane.server.limits.RequestLimitsMiddleware` and closing the
connection. A head is thus never buffered beyond that plus one read from the socket; the
middleware then applies the exact count and size limits to the parsed header list.

Nor do they bound the request target: httptools takes any length (up to 64 KiB, where its
URL parser fails with a plain-text 400), h11 any length that arrives in one read. Here a
target longer than :data:`~control_plane.server.limits.MAX_TARGET_BYTES` (16 KiB) is refused
with a JSON 414 ``uri_too_long`` however it arrives; and a request the parser cannot read at
all gets a JSON 400 ``bad_request`` (uvicorn's own is plain text), so every refusal before
the app has the API's error shape.

Neither implementation bounds how long a head takes: one byte a second holds a connection
for ever (uvicorn's ``timeout_keep_alive`` only covers the silence *between* requests and is
cancelled by the first byte of the next one). So a head must be complete within
:attr:`RequestLimits.header_timeout_s` (``SHADOWLIMIT_HEADER_TIMEOUT_S``) of

* the connection opening, for its first request (a client that connects and says nothing
  is closed too), and
* the first byte of each later request on a keep-alive connection; the idle time before
  that byte stays ``timeout_keep_alive``'s.

Past it the connection is closed, with a JSON 408 ``request_timeout`` when part of a head
was received and no response is under way, and counted in
``rate_limit_slow_clients_total`` (the app's metrics). The clock is one ``call_at`` timer
per connection, armed when a head begins while none is pending; a head that completes only
clears a deadline, and a pending timer that finds a later deadline (a newer head) re-arms
itself for it, so a busy keep-alive connection sets about one timer per bound, not one per
request.

>>> uvicorn.run(app, http=http_protocol(settings.request_limits))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..settings.limits import connection_shares
from .limits import MAX_TARGET_BYTES, REQUEST_LINE_ALLOWANCE, RequestLimits, refusal_body

__all__ = ["http_protocol"]


def _head_refusal(limits: RequestLimits) -> bytes:
    return refusal_body(
        431,
        f"the request head (request line and header fields) passed {limits.head_bytes:,} bytes;"
        f" header fields may take {limits.max_header_bytes:,}",
        limits.max_header_bytes,
    )


def _timeout_refusal(limits: RequestLimits) -> bytes:
    return refusal_body(
        408,
        f"the request head (request line and header fields) did not arrive within {limits.header_timeout_s:g} s",
        limits.header_timeout_s,
    )


_TARGET_REFUSAL = refusal_body(
    414, f"the request target (path and query) is longer than {MAX_TARGET_BYTES:,} bytes", MAX_TARGET_BYTES
)
_STATUS_LINES = {
    400: b"400 Bad Request",
    414: b"414 URI Too Long",
    431: b"431 Request Header Fields Too Large",
    503: b"503 Service Unavailable",
}


def _bad_request(detail: str) -> bytes:
    """A 400's body, with what the parser said (which may quote the request: 200 characters at most)."""
    detail = detail if len(detail) <= 200 else detail[:199] + "\u2026"
    return refusal_body(400, "the request is not valid HTTP/1.1" + (f": {detail}" if detail else ""))


def http_protocol(limits: RequestLimits, impl: str = "auto", tls: Any = None) -> type[asyncio.Protocol]:
    """uvicorn's ``impl`` protocol (``auto``: httptools if installed, else h11) bounded by
    ``limits``; with ``tls`` (the port's :class:`~control_plane.tls.ServerTls`), each
    connection's client certificate checked for an accepted name and its names handed to the
    auth gate."""
    if impl == "auto":
        try:
            import httptools  # noqa: F401
        except ImportError:  # pragma: no cover - uvicorn[standard] installs it
            impl = "h11"
        else:
            impl = "httptools"
    if impl == "h11":
        base: type[Any] = _BoundedH11Protocol
    elif impl == "httptools":
        base = _bounded_httptools()
    else:
        raise ValueError(f"unknown HTTP implementation {impl!r} (auto, httptools, h11)")
    attrs = {
        "limits": limits, "refusal": _head_refusal(limits), "timeout_refusal": _timeout_refusal(limits),
        "max_connections": connection_shares()[0], "tls": tls,
    }  # fmt: skip
    return type(base.__name__, (base,), attrs)


def _raw_refusal(status: bytes, server_state: Any, body: bytes) -> bytes:
    """A JSON refusal closing the connection, written straight to the transport (with
    uvicorn's default headers: ``date``, ``server``)."""
    head = [b"HTTP/1.1 %s\r\n" % status]
    head += [b"%s: %s\r\n" % (name, value) for name, value in server_state.default_headers]
    head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
    return b"".join(head) + body


def _slow_clients_counter(app: Any) -> Any:
    """The app's ``rate_limit_slow_clients_total`` (``app.state.engine.metrics``; through
    uvicorn's wrappers, ``.app``), or None: another app, or one not started yet."""
    for _ in range(4):
        metrics = getattr(getattr(getattr(app, "state", None), "engine", None), "metrics", None)
        if metrics is not None:
            return getattr(metrics, "slow_clients", None)
        app = getattr(app, "app", None)
    return None


class _OneWrite:
    """The transport as a response cycle of uvicorn's httptools protocol sees it: a response
    head framed by its ``Content-Length`` is held and written with the body's first bytes, so
    a whole answer leaves in one write (one syscall, one TCP segment) where uvicorn makes two.
    Every other write goes at once. uvicorn writes such a body whenever the response ends
    (``b""`` for an empty one; a ``HEAD`` answer, which has none, is not held), so a held
    head waits at most for the app's next ``send``; when the cycle closes the connection
    instead (the app failed after its head) the head goes first. The bytes are uvicorn's own,
    in its order."""

    __slots__ = ("_cycle", "_held", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle: Any = cycle  # until the response's head is written (or held)
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
            return
        cycle = self._cycle
        # uvicorn sets response_started just before it writes the head (an earlier write is a
        # "100 Continue"), and chunked_encoding False for a body framed by Content-Length
        if cycle is not None and cycle.response_started:
            # the cycle is not needed past its head: let go of it (it holds this transport,
            # and a reference cycle would leave every request's objects to the garbage collector)
            self._cycle = None
            if cycle.chunked_encoding is False and cycle.scope["method"] != "HEAD":
                self._held = data
                return
        self._transport.write(data)

    def close(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _HeadClock(asyncio.Protocol):
    """The time bound on request heads, before uvicorn's protocol in the MRO.

    The protocol calls :meth:`_head_begins` when a head starts (the connection opened, the
    first byte of a later request) and :meth:`_head_ends` when it is complete."""

    limits: ClassVar[RequestLimits]
    timeout_refusal: ClassVar[bytes]
    # set by uvicorn's protocol
    app: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    server_state: Any
    cycle: Any
    _head_deadline: float | None = None  # loop time by which the head under way must be complete
    _head_timer: asyncio.TimerHandle | None = None  # at most one pending, due at or before the deadline
    _head_seen = False  # bytes of the head under way arrived (a connection that said nothing gets no 408)
    _after_responses: bytes | None = None  # a refusal to send once the responses under way are complete
    flow: Any

    refusal: ClassVar[bytes]
    max_connections: ClassVar[int]  # open at once (connection_shares: the rest is gRPC's and the reserve)

    tls: ClassVar[Any] = None  # the port's ServerTls (control_plane.tls), when it serves TLS
    app_state: dict[str, Any]

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if self.tls is not None:  # after the handshake: the client certificate's names, if any
            names = self.tls.admit(transport.get_extra_info("ssl_object"))
            if names is None:  # mutual TLS names the clients it accepts; this is none of them
                transport.abort()
                return
            if names:  # each request's scope["state"] is a copy of this (the auth gate reads it)
                self.app_state = {**self.app_state, "tls_client": names}
        if len(self.server_state.connections) > self.max_connections:  # the file descriptors' share
            body = refusal_body(503, "too many connections open; try again", self.max_connections)
            transport.write(_raw_refusal(_STATUS_LINES[503], self.server_state, body))
            transport.close()
            return
        self._head_begins(seen=False)

    def _refuse(self, status: int) -> None:
        """Answer what the parser refused (400, or 414 and 431: the bounds above) with the
        JSON refusal and close. A head pipelined after whole requests whose responses are
        under way is answered after them (the first refusal only); a request whose own body
        is refused (bad chunked framing) is answered at once, unless its response has begun
        (no room for an answer then), and its app sees the client gone. Called from uvicorn's
        ``send_400_response``, in the handler of the parser's error, which says what was
        wrong with a 400."""
        self._head_deadline = None
        if self._after_responses is not None or self.transport.is_closing():
            return
        if status == 431:
            body = self.refusal
        elif status == 414:
            body = _TARGET_REFUSAL
        else:
            status, body = 400, _bad_request(str(sys.exc_info()[1] or ""))
        refusal = _raw_refusal(_STATUS_LINES[status], self.server_state, body)
        cycle = self.cycle  # the request parsed last
        if cycle is not None and not cycle.response_complete:
            if not cycle.more_body:  # whole: the refused bytes are a later request's
                self._after_responses = refusal
                self.flow.pause_reading()  # nothing more is parsed on this connection
                return
            if cycle.response_started:
                self.transport.close()
                return
        self.transport.write(refusal)
        self.transport.close()

    def _responding(self) -> bool:
        """A response is under way, or a pipelined request waits for its turn."""
        cycle = self.cycle
        return (cycle is not None and not cycle.response_complete) or bool(getattr(self, "pipeline", None))

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]  # uvicorn's (after this class in the MRO)
        refusal = self._after_responses
        if refusal is not None and not self._responding() and not self.transport.is_closing():
            self.transport.write(refusal)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_deadline = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _head_begins(self, *, seen: bool = True) -> None:
        loop = self.loop
        self._head_deadline = deadline = loop.time() + self.limits.header_timeout_s
        self._head_seen = seen
        if self._head_timer is None:
            self._head_timer = loop.call_at(deadline, self._head_due)

    def _head_ends(self) -> None:
        self._head_deadline = None  # a pending timer finds nothing to do
        self._head_seen = False

    def _head_due(self) -> None:
        self._head_timer = None
        deadline = self._head_deadline
        transport = self.transport
        if deadline is None or transport.is_closing():
            return
        loop = self.loop
        if deadline - loop.time() > 0.001:  # a later head began after this timer was set
            self._head_timer = loop.call_at(deadline, self._head_due)
            return
        self._head_deadline = None
        counter = _slow_clients_counter(self.app)
        if counter is not None:
            counter.inc()
        cycle = self.cycle
        if self._head_seen and (cycle is None or cycle.response_complete):  # nothing of a response was sent
            transport.write(_raw_refusal(b"408 Request Timeout", self.server_state, self.timeout_refusal))
        if transport.get_write_buffer_size():  # the client does not read either: no waiting for it
            transport.abort()
        else:
            transport.close()


class _RefusalMemo(h11.Connection):
    """h11's connection, remembering the status of the protocol error it raised: h11's hint,
    or 414 for a request target over :data:`MAX_TARGET_BYTES` (a whole request line in one
    read, or one still without its end when h11 refuses the incomplete head)."""

    refused_status: int | None = None

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            if status == 431:  # the head is too large: is its request line alone?
                line_end = self.trailing_data[0].find(b"\n")
                if line_end < 0 or line_end > REQUEST_LINE_ALLOWANCE:
                    status = 414
            self.refused_status = status
            raise
        if type(event) is h11.Request and len(event.target) > MAX_TARGET_BYTES:
            self.refused_status = 414
            raise h11.RemoteProtocolError("the request target is too long", 414)
        return event


class _BoundedH11Protocol(_HeadClock, H11Protocol):
    """h11 with its incomplete-event bound set to the head limit and its 431 answered in JSON,
    and the head clock: a head is under way while h11 waits for a request (``their_state``
    IDLE) and bytes have come (or the connection just opened)."""

    limits: ClassVar[RequestLimits]
    refusal: ClassVar[bytes]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _RefusalMemo(h11.SERVER, max_incomplete_event_size=self.limits.head_bytes)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:  # these bytes start or continue a head
            if self._head_deadline is None:
                self._head_begins()
            self._head_seen = True
        super().data_received(data)
        if self._head_deadline is not None and self.conn.their_state is not h11.IDLE:
            self._head_ends()  # h11 produced the Request (or refused the head)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may parse a pipelined head h11 held back meanwhile
        conn = self.conn
        if self._head_deadline is None and conn.their_state is h11.IDLE and conn.trailing_data[0]:
            if not self.transport.is_closing():
                self._head_begins()  # part of the next head is already here

    def send_400_response(self, msg: str) -> None:
        conn = self.conn
        self._refuse((conn.refused_status if isinstance(conn, _RefusalMemo) else None) or 400)


def _bounded_httptools() -> type[Any]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class _BoundedHttpToolsProtocol(_HeadClock, HttpToolsProtocol):
        """httptools counting the bytes received while no body is arriving (a head is), and
        the head clock: from the parser's message begin (or the connection opening) to its
        headers complete."""

        limits: ClassVar[RequestLimits]
        refusal: ClassVar[bytes]
        _head_bytes = 0
        _target_bytes = 0  # of the request line under way
        _refused_status = 400  # what the next send_400_response answers

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            in_head = cycle is None or not cycle.more_body  # before parsing: these bytes start or continue a head
            super().data_received(data)
            if self.cycle is not cycle:  # a head completed (the rest of this read is not counted)
                self._head_bytes = 0
            elif in_head:
                self._head_bytes += len(data)
                if self._head_bytes > self.limits.head_bytes and not self.transport.is_closing():
                    self._refuse_head()

        def on_message_begin(self) -> None:
            if self._head_deadline is None:  # else: the connection's first head, timed from its opening
                self._head_begins()
            self._head_seen = True
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            # called once or more per request line (as its bytes arrive), after on_message_begin
            self._target_bytes = size = (self._target_bytes if self.url else 0) + len(url)
            if size > MAX_TARGET_BYTES:
                self._refused_status = 414
                raise ValueError("the request target is too long")  # the parser's error: send_400_response
            super().on_url(url)

        def on_headers_complete(self) -> None:
            self._head_ends()
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle.transport is self.transport:
                cycle.transport = _OneWrite(self.transport, cycle)

        def send_400_response(self, msg: str) -> None:
            status, self._refused_status = self._refused_status, 400
            self._refuse(status)

        def _refuse_head(self) -> None:
            self._refuse(431)

    return _BoundedHttpToolsProtocol
