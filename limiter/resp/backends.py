"""Where a command goes: one standalone server, or a Redis Cluster's slot table.

Both backends offer the same calls to :class:`~limiter.redis_limiter.RedisLimiter`:
``send_now`` / ``send_many`` queue without awaiting on a live connection (the hot
path), ``call`` awaits one reply (reconnecting, and following cluster redirects),
``call_all`` reaches every master.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from redis.crc import key_slot

from ..errors import BackendError, BackendUnavailable
from ..redis_url import Endpoint
from .connection import NodeClient, ReplyError, encode_command

__all__ = ["ClusterBackend", "StandaloneBackend"]


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
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._nodes = [NodeClient(endpoint, connect_timeout, command_timeout) for _ in range(connections)]
        self._node = self._nodes[0]
        # each task sticks to one connection (its index, so that the set can be replaced)
        self._slot: contextvars.ContextVar[int] = contextvars.ContextVar(f"shadowlimit-conn-{id(self)}")
        self._next = 0

    @property
    def nodes(self) -> list[NodeClient]:
        """The node clients, one per pipelined connection (all to the same server)."""
        return list(self._nodes)

    def _pick(self) -> NodeClient:
        i = self._slot.get(-1)
        if i < 0:
            i = self._next % len(self._nodes)
            self._next += 1
            self._slot.set(i)
        return self._nodes[i]

    def _point_at(self, endpoint: Endpoint) -> None:
        """Send everything to ``endpoint`` from now on (the old connections are closed:
        what waits on them fails and is answered by the caller's failure handling)."""
        old = self._nodes
        self.endpoint = endpoint
        self._nodes = [NodeClient(endpoint, self._connect_timeout, self._command_timeout) for _ in old]
        self._node = self._nodes[0]
        for n in old:
            n.close()

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

    def lost_master(self) -> None:
        """A node answered READONLY or MASTERDOWN: nothing to re-discover on one server."""

    def topology(self) -> dict[str, Any]:
        """Where commands go (``/v1/backend``)."""
        return {"kind": "standalone", "master": self.endpoint.label}

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
        self._nodes: dict[tuple[str, int], NodeClient] = {}
        self._slots: list[NodeClient | None] = [None] * 16384
        self._refreshing: asyncio.Task[None] | None = None
        self._template = seeds[0]

    @property
    def nodes(self) -> list[NodeClient]:
        """Every node client known so far: the seeds and the masters of the slot table."""
        return list(self._nodes.values())

    def node_for_slot(self, slot: int) -> NodeClient | None:
        """The master the slot table names for ``slot`` (``None`` before it is loaded)."""
        return self._slots[slot]

    def assign_slot(self, slot: int, node: NodeClient) -> None:
        """Point ``slot`` at ``node`` in the slot table, as a ``MOVED`` reply does."""
        self._slots[slot] = node

    def _node(self, host: str, port: int) -> NodeClient:
        key = (host, port)
        node = self._nodes.get(key)
        if node is None:
            node = NodeClient(self._template.with_address(host, port), self._connect_timeout, self._command_timeout)
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
            table: list[NodeClient | None] = [None] * 16384
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
        groups: dict[int, tuple[NodeClient, list[int]]] = {}
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
        asking: NodeClient | None = None
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
                self.assign_slot(slot, self._node(host, int(port)))
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
        try:
            return await self._to_masters(payload)
        except BackendUnavailable:
            await self.refresh()  # a master may have failed over: once more on the new table
            return await self._to_masters(payload)

    async def _to_masters(self, payload: bytes) -> list[Any]:
        masters = {id(n): n for n in self._slots if n is not None}
        return [await n.call(payload) for n in masters.values()]

    def describe(self) -> str:
        return "cluster " + ",".join(s.label for s in self.seeds)

    def lost_master(self) -> None:
        """A node answered READONLY (a replica now): reload the slot table soon."""
        asyncio.ensure_future(self._safe_refresh())

    def topology(self) -> dict[str, Any]:
        """The masters of the slot table, with their slot counts (``/v1/backend``)."""
        counts: dict[str, int] = {}
        for n in self._slots:
            if n is not None:
                counts[n.endpoint.label] = counts.get(n.endpoint.label, 0) + 1
        return {"kind": "cluster", "masters": [{"address": a, "slots": c} for a, c in sorted(counts.items())]}

    async def aclose(self) -> None:
        if self._refreshing is not None and not self._refreshing.done():
            self._refreshing.cancel()
        for n in self._nodes.values():
            n.close()
