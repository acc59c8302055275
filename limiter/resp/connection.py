"""The RESP2 wire: command encoding and one pipelined connection per Redis node.

:class:`NodeConnection` queues pre-encoded commands, flushes them once per event-loop
iteration (so 100 concurrent checks become one write and one read) and matches the
replies to futures in order with hiredis, the same C parser redis-py uses.
:class:`NodeClient` reopens a node's connection on demand after it was lost.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import Any, final

import hiredis

from ..errors import BackendAuthError, BackendError, BackendTimeout, BackendUnavailable
from ..redis_url import Endpoint
from .tls import tls_context

__all__ = ["NodeClient", "NodeConnection", "ReplyError", "bulk", "encode_command"]

ReplyError = hiredis.ReplyError


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def encode_command(*args: bytes | str | int | float) -> bytes:
    """Encode a command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, bytes):
            b = a
        elif isinstance(a, str):
            b = a.encode()
        else:
            b = repr(a).encode() if isinstance(a, float) else str(a).encode()
        out.append(bulk(b))
    return b"".join(out)


class _Protocol(asyncio.Protocol):
    __slots__ = ("conn",)

    def __init__(self, conn: NodeConnection) -> None:
        self.conn = conn

    def data_received(self, data: bytes) -> None:
        self.conn._on_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._on_lost(exc)


@final
class _Collector:
    """The replies of one :meth:`NodeConnection.send_many` batch, gathered for its one
    future. It stands once in the connection's pending queue and takes the next ``n``
    replies (see ``_on_data``); a failure reaches it like any waiting future."""

    __slots__ = ("fut", "n", "replies")

    def __init__(self, fut: asyncio.Future[list[Any]], n: int) -> None:
        self.fut = fut
        self.n = n
        self.replies: list[Any] = []

    def done(self) -> bool:
        return self.fut.done()

    def set_exception(self, exc: BaseException) -> None:
        """The connection failed: commands already answered keep their replies (Redis
        ran them), the rest get ``exc`` in place; with no reply yet the future fails."""
        if self.fut.done():
            return
        replies = self.replies
        if replies:
            self.fut.set_result(replies + [exc] * (self.n - len(replies)))
        else:
            self.fut.set_exception(exc)


class NodeConnection:
    """One pipelined connection to one Redis node.

    :meth:`send` queues a pre-encoded command and returns a future for its reply;
    all commands queued in one event-loop iteration go out in one write. A reply that
    is a Redis error comes back as a ``hiredis.ReplyError`` *value* for the caller to
    interpret (``NOSCRIPT``, ``MOVED``, ...). A stalled server (no reply for
    ``command_timeout`` while commands are waiting) fails every waiting command with
    :class:`BackendTimeout` and drops the connection, since later replies could no
    longer be matched.
    """

    def __init__(
        self, endpoint: Endpoint, *, connect_timeout: float = 1.0, command_timeout: float | None = 0.5
    ) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self._transport: asyncio.Transport | None = None
        self._reader = hiredis.Reader()
        self._pending: deque[asyncio.Future[Any] | _Collector] = deque()
        self._wbuf: list[bytes] = []
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = True
        self._progress = 0
        self._mark = 0
        self._watch: asyncio.TimerHandle | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        e = self.endpoint
        try:
            if e.unix_path:
                coro = loop.create_unix_connection(lambda: _Protocol(self), e.unix_path)
            else:
                if e.host is None or e.port is None:
                    raise ValueError(f"endpoint {e.label}: needs a host and a port, or a unix socket path")
                ctx = tls_context(e.tls) if e.tls is not None else None
                coro = loop.create_connection(lambda: _Protocol(self), e.host, e.port, ssl=ctx)
            transport, _ = await asyncio.wait_for(coro, self.connect_timeout)
        except (TimeoutError, OSError, OverflowError) as exc:
            kind = "timed out" if isinstance(exc, asyncio.TimeoutError) else str(exc) or type(exc).__name__
            raise BackendUnavailable(f"cannot connect to Redis at {e.label}: {kind}") from exc
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and not e.unix_path:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover - platform dependent
                pass
        self._reader = hiredis.Reader()
        self._closed = False
        hello: list[bytes] = []
        if e.password:
            hello.append(
                encode_command("AUTH", e.username, e.password) if e.username else encode_command("AUTH", e.password)
            )
        if e.db:
            hello.append(encode_command("SELECT", e.db))
        hello.append(encode_command("CLIENT", "SETNAME", "shadowlimit"))
        futs = [self.send(h) for h in hello]
        try:
            replies = await asyncio.wait_for(asyncio.gather(*futs), self.connect_timeout)
        except (TimeoutError, BackendError) as exc:
            self.close()
            raise BackendUnavailable(
                f"Redis at {e.label} did not complete the handshake: {exc or 'timed out'}"
            ) from exc
        for r in replies[:-1]:
            if isinstance(r, ReplyError):
                self.close()
                login = str(r).startswith(("WRONGPASS", "NOAUTH", "ERR AUTH", "ERR invalid password", "NOPERM"))
                cls = BackendAuthError if login else BackendUnavailable
                raise cls(f"Redis at {e.label} refused the login: {r}")
        setname = replies[-1]
        if isinstance(setname, ReplyError) and str(setname).startswith("NOAUTH"):
            self.close()
            raise BackendAuthError(
                f"Redis at {e.label} needs a login ({setname}): give user:password in the URL"
                " (or the password in RATE_LIMIT_REDIS_PASSWORD_FILE)"
            )

    def send(self, payload: bytes) -> asyncio.Future[Any]:
        """Queue one encoded command; the future resolves to its reply."""
        loop = self._loop
        assert loop is not None
        fut = loop.create_future()
        if self._closed:
            fut.set_exception(BackendUnavailable(f"connection to Redis at {self.endpoint.label} is closed"))
            return fut
        self._pending.append(fut)
        self._wbuf.append(payload)
        self._queued(loop)
        return fut

    def send_many(self, payloads: list[bytes]) -> asyncio.Future[list[Any]]:
        """Queue many encoded commands at once; one future resolves to the list of
        their replies, in order (one future and one pending entry per batch instead of
        per command). If the connection fails before any reply, the future fails; after
        some, the replies that arrived are kept and the rest are the error, in place."""
        loop = self._loop
        assert loop is not None
        fut: asyncio.Future[list[Any]] = loop.create_future()
        if self._closed:
            fut.set_exception(BackendUnavailable(f"connection to Redis at {self.endpoint.label} is closed"))
            return fut
        n = len(payloads)
        if n == 0:
            fut.set_result([])
            return fut
        self._pending.append(_Collector(fut, n))
        self._wbuf.extend(payloads)
        self._queued(loop)
        return fut

    def _queued(self, loop: asyncio.AbstractEventLoop) -> None:
        """Commands were queued: flush at the end of this loop iteration, and watch for
        a stalled server."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        if self._watch is None and self.command_timeout:
            self._mark = self._progress
            self._watch = loop.call_later(self.command_timeout, self._check_stall)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._wbuf and self._transport is not None and not self._closed:
            data = b"".join(self._wbuf)
            self._wbuf.clear()
            self._transport.write(data)

    def _on_data(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        pending = self._pending
        self._progress += 1
        while True:
            if not pending:
                if reader.gets() is not False:  # pragma: no cover - protocol desync, cannot happen with RESP2
                    self._fail(BackendUnavailable("unexpected reply from Redis"))
                return
            head = pending[0]
            if type(head) is _Collector:
                # a batch: its replies are the next n, taken without a call per reply
                replies = head.replies
                n = head.n
                gets = reader.gets
                while len(replies) < n:
                    reply = gets()
                    if reply is False:
                        return
                    replies.append(reply)
                pending.popleft()
                if not head.fut.done():
                    head.fut.set_result(replies)
                continue
            reply = reader.gets()
            if reply is False:
                return
            pending.popleft()
            if not head.done():
                head.set_result(reply)

    def _check_stall(self) -> None:
        self._watch = None
        if not self._pending or self._closed:
            return
        if self._progress == self._mark:
            self._fail(
                BackendTimeout(f"Redis at {self.endpoint.label} did not answer within {self.command_timeout:g}s")
            )
            return
        self._mark = self._progress
        assert self._loop is not None
        self._watch = self._loop.call_later(self.command_timeout or 1.0, self._check_stall)

    def _on_lost(self, exc: Exception | None) -> None:
        self._fail(
            BackendUnavailable(f"connection to Redis at {self.endpoint.label} lost: {exc or 'closed by server'}")
        )

    def _fail(self, error: BackendError) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        t = self._transport
        self._transport = None
        if t is not None:
            t.abort()
        self._wbuf.clear()
        pending = self._pending
        while pending:
            fut = pending.popleft()
            if not fut.done():
                fut.set_exception(error)

    def close(self) -> None:
        if not self._closed or self._transport is not None:
            self._fail(BackendUnavailable("connection closed"))


class NodeClient:
    """A node's connection, reopened on demand after it was lost (what the backends hold per node)."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float, command_timeout: float | None) -> None:
        self.endpoint = endpoint
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._conn: NodeConnection | None = None
        self._connecting: asyncio.Future[NodeConnection] | None = None

    @property
    def closed(self) -> bool:
        """No live connection (the next command opens one)."""
        return self._conn is None or self._conn._closed

    async def connection(self) -> NodeConnection:
        conn = self._conn
        if conn is not None and not conn._closed:
            return conn
        if self._connecting is not None:
            return await asyncio.shield(self._connecting)
        loop = asyncio.get_running_loop()
        self._connecting = loop.create_future()
        try:
            conn = NodeConnection(
                self.endpoint, connect_timeout=self._connect_timeout, command_timeout=self._command_timeout
            )
            await conn.connect()
        except BaseException as exc:
            self._connecting.set_exception(exc if isinstance(exc, Exception) else BackendUnavailable(str(exc)))
            self._connecting.exception()  # mark retrieved
            self._connecting = None
            raise
        self._conn = conn
        self._connecting.set_result(conn)
        self._connecting = None
        return conn

    def send_now(self, payload: bytes) -> asyncio.Future[Any] | None:
        """Queue on the live connection without awaiting; None when it must reconnect."""
        conn = self._conn
        if conn is None or conn._closed:
            return None
        return conn.send(payload)

    def send_many_now(self, payloads: list[bytes]) -> asyncio.Future[list[Any]] | None:
        """:meth:`send_now` for a batch: one future for all the replies."""
        conn = self._conn
        if conn is None or conn._closed:
            return None
        return conn.send_many(payloads)

    async def call(self, payload: bytes) -> Any:
        fut = self.send_now(payload)
        if fut is None:
            fut = (await self.connection()).send(payload)
        return await fut

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
