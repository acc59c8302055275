"""A lean RESP2 client for the decision hot path: auto-pipelining, hiredis parsing.

Why not redis-py here: a rate-limit check is one EVALSHA whose arguments are mostly
the same bytes every time. redis-py encodes every argument on every call and, in
async mode, pays one write and one awaited read per command. This module keeps pipelined
connections (two to a standalone server, one per cluster master), appends each command's pre-encoded bytes to a buffer,
flushes the buffer once per event-loop iteration (so 100 concurrent checks become
one write and one read), and matches replies to futures in order with hiredis, the
same C parser redis-py uses. redis-py still does everything that is not the hot path
(see :attr:`limiter.redis_limiter.RedisLimiter.client`).

Addresses: ``redis://[user:pass@]host:port/db``, ``rediss://`` (TLS),
``unix:///path/to.sock?db=N``; a cluster with ``redis+cluster://host:port`` or
``?cluster=true`` on a redis URL.
"""

from __future__ import annotations

import asyncio
import contextvars
import ssl as ssl_module
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import hiredis
from redis.crc import key_slot

from .errors import BackendError, BackendTimeout, BackendUnavailable

__all__ = [
    "ClusterBackend",
    "Endpoint",
    "NodeConnection",
    "RedisTarget",
    "StandaloneBackend",
    "bulk",
    "encode_command",
    "parse_redis_url",
]

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


@dataclass(frozen=True)
class Endpoint:
    """Where one Redis node listens and how to log in."""

    host: str | None = "127.0.0.1"
    port: int | None = 6379
    unix_path: str | None = None
    use_ssl: bool = False
    username: str | None = None
    password: str | None = None
    db: int = 0

    @property
    def label(self) -> str:
        return f"unix:{self.unix_path}" if self.unix_path else f"{self.host}:{self.port}"

    def with_address(self, host: str, port: int) -> Endpoint:
        return Endpoint(
            host=host, port=port, use_ssl=self.use_ssl, username=self.username, password=self.password, db=0
        )


@dataclass(frozen=True)
class RedisTarget:
    """A parsed Redis URL: the first node, whether it is a cluster, the extra seeds."""

    endpoint: Endpoint
    cluster: bool = False
    seeds: tuple[Endpoint, ...] = field(default=())

    def redacted(self) -> str:
        e = self.endpoint
        scheme = "redis+cluster" if self.cluster else ("rediss" if e.use_ssl else "redis")
        if e.unix_path:
            return f"unix://{e.unix_path}?db={e.db}"
        auth = "***@" if e.password else ""
        return f"{scheme}://{auth}{e.host}:{e.port}/{e.db}"


def parse_redis_url(url: str) -> RedisTarget:
    """Parse a Redis URL; raises ``ValueError`` naming what is wrong."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("redis url: must not be empty")
    u = urlparse(url.strip())
    query = parse_qs(u.query)
    cluster_flag = query.get("cluster", ["false"])[0].lower() in ("1", "true", "yes")
    username = unquote(u.username) if u.username else None
    password = unquote(u.password) if u.password else None
    if u.scheme == "unix":
        if not u.path:
            raise ValueError(f"redis url: unix socket URL needs a path, got {url!r}")
        try:
            db = int(query.get("db", ["0"])[0])
        except ValueError:
            raise ValueError(f"redis url: database must be a number, got {query.get('db')!r}") from None
        return RedisTarget(
            Endpoint(host=None, port=None, unix_path=u.path, username=username, password=password, db=db)
        )
    if u.scheme not in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        raise ValueError(f"redis url: scheme must be redis, rediss, unix or redis+cluster, got {u.scheme!r}")
    cluster = cluster_flag or u.scheme.endswith("+cluster")
    use_ssl = u.scheme.startswith("rediss")
    # several seeds: redis+cluster://h1:p1,h2:p2
    netloc_hosts = u.netloc.rsplit("@", 1)[-1]
    seeds: list[Endpoint] = []
    for part in netloc_hosts.split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith("["):  # [::1]:6379
            host, _, rest = part[1:].partition("]")
            port_s = rest.lstrip(":")
        elif part.count(":") == 1:
            host, _, port_s = part.partition(":")
        else:
            host, port_s = part, ""
        try:
            port = int(port_s) if port_s else 6379
        except ValueError:
            raise ValueError(f"redis url: bad port in {part!r}") from None
        if not 1 <= port <= 65535:
            raise ValueError(f"redis url: port must be 1-65535, got {port} in {part!r}")
        seeds.append(Endpoint(host=host, port=port, use_ssl=use_ssl, username=username, password=password))
    if not seeds:
        raise ValueError(f"redis url: no host in {url!r}")
    path = u.path.lstrip("/")
    db = 0
    if path:
        try:
            db = int(path)
        except ValueError:
            raise ValueError(f"redis url: database must be a number, got {path!r}") from None
    if cluster and db != 0:
        raise ValueError("redis url: Redis Cluster only has database 0")
    first = Endpoint(
        host=seeds[0].host, port=seeds[0].port, use_ssl=use_ssl, username=username, password=password, db=db
    )
    return RedisTarget(first, cluster=cluster, seeds=tuple(seeds))


class _Protocol(asyncio.Protocol):
    __slots__ = ("conn",)

    def __init__(self, conn: NodeConnection) -> None:
        self.conn = conn

    def data_received(self, data: bytes) -> None:
        self.conn._on_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._on_lost(exc)


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
                ctx = ssl_module.create_default_context() if e.use_ssl else None
                coro = loop.create_connection(lambda: _Protocol(self), e.host, e.port, ssl=ctx)
            transport, _ = await asyncio.wait_for(coro, self.connect_timeout)
        except (TimeoutError, OSError, OverflowError) as exc:
            kind = "timed out" if isinstance(exc, asyncio.TimeoutError) else str(exc) or type(exc).__name__
            raise BackendUnavailable(f"cannot connect to Redis at {e.label}: {kind}") from exc
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and not e.unix_path:
            import socket

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
                raise BackendUnavailable(f"Redis at {e.label} refused the login: {r}")

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


class _NodeClient:
    """A node's connection, reopened on demand after it was lost."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float, command_timeout: float | None) -> None:
        self.endpoint = endpoint
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._conn: NodeConnection | None = None
        self._connecting: asyncio.Future[NodeConnection] | None = None

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


class StandaloneBackend:
    """One Redis server (or a proxy / sentinel-managed primary address).

    Commands go over ``connections`` pipelined connections (2 by default), each asyncio
    task sticking to one of them (so one task's commands stay in order). With a single
    connection client and server take turns: Redis idles while the client works through
    a batch of replies, the client idles while Redis runs the next batch. Two groups of
    tasks on two connections fall out of step and keep both busy.
    """

    cluster = False

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        connect_timeout: float = 1.0,
        command_timeout: float | None = 0.5,
        connections: int = 2,
    ) -> None:
        if connections < 1:
            raise ValueError(f"connections: must be >= 1, got {connections!r}")
        self.endpoint = endpoint
        self._nodes = [_NodeClient(endpoint, connect_timeout, command_timeout) for _ in range(connections)]
        self._node = self._nodes[0]
        self._slot: contextvars.ContextVar[_NodeClient] = contextvars.ContextVar(f"shadowlimit-conn-{id(self)}")
        self._next = 0

    def _pick(self) -> _NodeClient:
        node = self._slot.get(None)
        if node is None:
            nodes = self._nodes
            node = nodes[self._next % len(nodes)]
            self._next += 1
            self._slot.set(node)
        return node

    def send_now(self, key: bytes, payload: bytes) -> asyncio.Future[Any] | None:
        return self._pick().send_now(payload)

    def send_many(
        self, keys: list[bytes], payloads: list[bytes]
    ) -> list[tuple[asyncio.Future[list[Any]] | None, list[int]]]:
        """Queue a batch without awaiting: ``(future of the replies, positions)`` per
        connection used; a ``None`` future means those positions must go through
        :meth:`call` one by one (the connection must be reopened first)."""
        return [(self._pick().send_many_now(payloads), list(range(len(payloads))))]

    async def call(self, key: bytes | None, payload: bytes) -> Any:
        return await self._pick().call(payload)

    async def call_all(self, payload: bytes) -> list[Any]:
        return [await self._node.call(payload)]

    def describe(self) -> str:
        return self.endpoint.label

    async def aclose(self) -> None:
        for n in self._nodes:
            n.close()


_ASKING = encode_command("ASKING")


class ClusterBackend:
    """Redis Cluster: a slot table, one pipelined connection per master.

    Keys are routed by CRC16 slot; ``MOVED`` refreshes the slot table and retries,
    ``ASK`` retries once on the importing node, ``TRYAGAIN`` and ``CLUSTERDOWN`` are
    retried a few times before they surface as :class:`BackendUnavailable`.
    """

    cluster = True
    _MAX_REDIRECTS = 5

    def __init__(
        self, seeds: tuple[Endpoint, ...], *, connect_timeout: float = 1.0, command_timeout: float | None = 0.5
    ) -> None:
        if not seeds:
            raise ValueError("cluster: at least one seed node is required")
        self.seeds = seeds
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._nodes: dict[tuple[str, int], _NodeClient] = {}
        self._slots: list[_NodeClient | None] = [None] * 16384
        self._refreshing: asyncio.Task[None] | None = None
        self._template = seeds[0]

    def _node(self, host: str, port: int) -> _NodeClient:
        key = (host, port)
        node = self._nodes.get(key)
        if node is None:
            node = _NodeClient(self._template.with_address(host, port), self._connect_timeout, self._command_timeout)
            self._nodes[key] = node
        return node

    async def refresh(self) -> None:
        """Reload the slot table from the first seed or known node that answers."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        candidates = [self._node(s.host or "127.0.0.1", s.port or 6379) for s in self.seeds]
        candidates += [n for n in self._nodes.values() if n not in candidates]
        errors: list[str] = []
        for node in candidates:
            try:
                reply = await node.call(encode_command("CLUSTER", "SLOTS"))
            except BackendError as exc:
                errors.append(str(exc))
                continue
            if isinstance(reply, ReplyError):
                errors.append(f"{node.endpoint.label}: {reply}")
                continue
            table: list[_NodeClient | None] = [None] * 16384
            for entry in reply:
                start, end, master = entry[0], entry[1], entry[2]
                host = master[0].decode() if master[0] else node.endpoint.host or "127.0.0.1"
                owner = self._node(host, int(master[1]))
                for slot in range(start, end + 1):
                    table[slot] = owner
            self._slots = table
            return
        raise BackendUnavailable("no Redis Cluster node answered CLUSTER SLOTS: " + "; ".join(errors[-3:]))

    def send_now(self, key: bytes, payload: bytes) -> asyncio.Future[Any] | None:
        node = self._slots[key_slot(key)]
        if node is None:
            return None
        return node.send_now(payload)

    def send_many(
        self, keys: list[bytes], payloads: list[bytes]
    ) -> list[tuple[asyncio.Future[list[Any]] | None, list[int]]]:
        """Queue a batch without awaiting, one pipelined write per master: ``(future of
        the replies, positions)`` per master; positions whose slot has no known owner or
        whose connection is down come last with a ``None`` future (use :meth:`call`)."""
        slots = self._slots
        groups: dict[int, tuple[_NodeClient, list[int]]] = {}
        loose: list[int] = []
        for i, key in enumerate(keys):
            node = slots[key_slot(key)]
            if node is None:
                loose.append(i)
                continue
            g = groups.get(id(node))
            if g is None:
                groups[id(node)] = (node, [i])
            else:
                g[1].append(i)
        out: list[tuple[asyncio.Future[list[Any]] | None, list[int]]] = []
        for node, idx in groups.values():
            fut = node.send_many_now([payloads[i] for i in idx])
            if fut is None:
                loose.extend(idx)
            else:
                out.append((fut, idx))
        if loose:
            out.append((None, sorted(loose)))
        return out

    async def call(self, key: bytes | None, payload: bytes) -> Any:
        slot = key_slot(key) if key is not None else 0
        asking: _NodeClient | None = None
        for attempt in range(self._MAX_REDIRECTS + 1):
            node = self._slots[slot]
            if node is None:
                await self.refresh()
                node = self._slots[slot]
                if node is None:
                    raise BackendUnavailable(f"Redis Cluster has no node for slot {slot}")
            if asking is not None:
                conn = await asking.connection()
                conn.send(_ASKING)
                reply = await conn.send(payload)
                asking = None
            else:
                try:
                    reply = await node.call(payload)
                except BackendUnavailable:
                    # the node may have failed over: refresh once, then give up
                    if attempt == 0:
                        try:
                            await self.refresh()
                        except BackendError:
                            pass
                        continue
                    raise
            if not isinstance(reply, ReplyError):
                return reply
            msg = str(reply)
            if msg.startswith("MOVED "):
                _, _, addr = msg.split(" ", 2)
                host, _, port = addr.rpartition(":")
                self._slots[slot] = self._node(host, int(port))
                asyncio.ensure_future(self._safe_refresh())
                continue
            if msg.startswith("ASK "):
                _, _, addr = msg.split(" ", 2)
                host, _, port = addr.rpartition(":")
                asking = self._node(host, int(port))
                continue
            if msg.startswith(("TRYAGAIN", "CLUSTERDOWN")):
                await asyncio.sleep(0.05 * (attempt + 1))
                continue
            return reply
        raise BackendUnavailable(f"Redis Cluster kept redirecting slot {slot}")

    async def _safe_refresh(self) -> None:
        try:
            await self.refresh()
        except BackendError:
            pass

    async def call_all(self, payload: bytes) -> list[Any]:
        """Send to every master (SCRIPT LOAD, FLUSH, PING)."""
        if not any(self._slots):
            await self.refresh()
        masters = {id(n): n for n in self._slots if n is not None}
        return [await n.call(payload) for n in masters.values()]

    def describe(self) -> str:
        return "cluster " + ",".join(s.label for s in self.seeds)

    async def aclose(self) -> None:
        if self._refreshing is not None and not self._refreshing.done():
            self._refreshing.cancel()
        for n in self._nodes.values():
            n.close()
