"""A private 3-master (no replica) Redis Cluster on loopback: :class:`EmbeddedCluster`.

Every node is an :class:`~limiter.embedded.server.EmbeddedRedis` with
``cluster-enabled yes``; the cluster is formed with redis-py alone (no ``redis-cli``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

from .process import AddressInUseError, EmbeddedRedisError, register, unregister
from .server import (
    DIR_PREFIX,
    PORT_ATTEMPTS,
    EmbeddedRedis,
    free_ports,
    host_for_url,
    no_retry,
    normalize_host,
    quote_value,
)

__all__ = ["CLUSTER_SLOTS", "DEFAULT_CLUSTER_TIMEOUT", "EmbeddedCluster", "slot_ranges"]

CLUSTER_SLOTS = 16384
"""Number of hash slots in a Redis Cluster."""

DEFAULT_CLUSTER_TIMEOUT = 20.0


def _command(client: redis.Redis, *args: str | int) -> Any:
    """``client.execute_command(*args)`` (redis-py leaves it untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def _parse_info(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    if isinstance(raw, bytes):
        raw = raw.decode()
    out: dict[str, str] = {}
    for line in str(raw).splitlines():
        key, sep, value = line.strip().partition(":")
        if sep:
            out[key] = value
    return out


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """Split the 16384 slots into ``masters`` contiguous inclusive ranges (node ``i`` serves range ``i``).

    >>> slot_ranges(3)
    [(0, 5460), (5461, 10921), (10922, 16383)]
    """
    bounds = [CLUSTER_SLOTS * i // masters for i in range(masters + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(masters)]


class EmbeddedCluster:
    """A private Redis Cluster of ``masters`` masters (no replicas) on loopback.

    Each node is an :class:`EmbeddedRedis` with ``cluster-enabled yes`` and an
    explicit ``cluster-port`` (bus port), living in ``<data_dir>/node-<i>``.
    The cluster is formed with redis-py alone: ``CLUSTER SET-CONFIG-EPOCH``,
    ``CLUSTER ADDSLOTSRANGE`` (16384 slots split evenly), ``CLUSTER MEET``; then
    :meth:`wait_until_ok` waits for every node to report ``cluster_state:ok``
    and to know all masters.

    Args:
        masters: number of master nodes (default 3).
        host: loopback address for all nodes.
        extra_config: extra directives for every node (see :class:`EmbeddedRedis`).
        node_timeout_ms: ``cluster-node-timeout``.
        start_timeout: bound for the whole cluster to become healthy.
        clock: monotonic seconds, read for the deadlines (also given to every node).
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        host: str = "127.0.0.1",
        extra_config: Mapping[str, str] | None = None,
        node_timeout_ms: int = 5000,
        start_timeout: float = DEFAULT_CLUSTER_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if masters < 1:
            raise EmbeddedRedisError("a cluster needs at least one master")
        self._masters = masters
        self._host = normalize_host(host)
        self._extra = dict(extra_config or {})
        self._node_timeout_ms = node_timeout_ms
        self._start_timeout = start_timeout
        self._clock = clock
        self._lock = threading.RLock()
        self._root: str | None = None
        self._nodes: list[EmbeddedRedis] = []
        self._bus_ports: list[int] = []

    # ---- properties --------------------------------------------------------

    @property
    def host(self) -> str:
        """Loopback address of every node."""
        return self._host

    @property
    def nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node, in creation order."""
        return [(self._host, n.port) for n in self._nodes if n.port is not None]

    @property
    def servers(self) -> list[EmbeddedRedis]:
        """The underlying :class:`EmbeddedRedis` node objects."""
        return list(self._nodes)

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        """``ClusterNode`` list for ``RedisCluster(startup_nodes=...)``."""
        return [ClusterNode(host, port) for host, port in self.nodes]  # type: ignore[no-untyped-call]

    @property
    def url(self) -> str:
        """``redis+cluster://HOST:PORT0`` (the project's cluster URL scheme)."""
        host, port = self._first()
        return f"redis+cluster://{host_for_url(host)}:{port}"

    @property
    def redis_url(self) -> str:
        """``redis://HOST:PORT0/0`` -- suitable for ``RedisCluster.from_url``."""
        host, port = self._first()
        return f"redis://{host_for_url(host)}:{port}/0"

    @property
    def pids(self) -> list[int | None]:
        """PID of every node process (``None`` for a killed node)."""
        return [n.pid for n in self._nodes]

    @property
    def data_dir(self) -> str | None:
        """Root directory holding each node's directory."""
        return self._root

    def _first(self) -> tuple[str, int]:
        nodes = self.nodes
        if not nodes:
            raise EmbeddedRedisError("cluster has not been started")
        return nodes[0]

    def client(self, **kwargs: Any) -> RedisCluster:
        """A new ``RedisCluster`` client for this cluster (caller closes it)."""
        return RedisCluster(startup_nodes=self.startup_nodes, **kwargs)

    def __repr__(self) -> str:
        return f"<EmbeddedCluster nodes={self.nodes} pids={self.pids}>"

    # ---- lifecycle ---------------------------------------------------------

    def start(self) -> EmbeddedCluster:
        """Start all nodes, form the cluster, wait until it is healthy."""
        with self._lock:
            if self._nodes and all(n.running for n in self._nodes):
                return self
            if self._nodes:  # partially running: bring missing nodes back
                for i in range(len(self._nodes)):
                    self.start_node(i, wait=False)
                self.wait_until_ok()
                return self
            self._root = tempfile.mkdtemp(prefix=DIR_PREFIX + "cluster-")
            register(self, order=0)
            try:
                for attempt in range(PORT_ATTEMPTS):
                    try:
                        self._spawn_nodes()
                        break
                    except AddressInUseError:
                        self._stop_nodes()
                        if attempt + 1 >= PORT_ATTEMPTS:
                            raise
                self._form_cluster()
                self.wait_until_ok()
            except BaseException:
                self.stop()
                raise
            return self

    def _spawn_nodes(self) -> None:
        assert self._root is not None
        ports = free_ports(self._host, 2 * self._masters)
        client_ports, bus_ports = ports[: self._masters], ports[self._masters :]
        self._bus_ports = bus_ports
        for i, (port, bus) in enumerate(zip(client_ports, bus_ports)):
            node_dir = os.path.join(self._root, f"node-{i}")
            config = {
                "cluster-enabled": "yes",
                "cluster-config-file": quote_value(os.path.join(node_dir, f"nodes-{port}.conf")),
                "cluster-node-timeout": str(self._node_timeout_ms),
                "cluster-port": str(bus),
                **self._extra,
            }
            node = EmbeddedRedis(port=port, host=self._host, extra_config=config, data_dir=node_dir, clock=self._clock)
            self._nodes.append(node)
            node.start()

    def _node_clients(self) -> list[redis.Redis]:
        return [
            redis.Redis(
                host=self._host,
                port=port,
                decode_responses=True,
                socket_connect_timeout=1,
                socket_timeout=2,
                retry=no_retry(),
            )
            for _, port in self.nodes
        ]

    def _form_cluster(self) -> None:
        clients = self._node_clients()
        try:
            for i, (client, (first, last)) in enumerate(zip(clients, slot_ranges(self._masters))):
                _command(client, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)
                _command(client, "CLUSTER", "ADDSLOTSRANGE", first, last)
            for (_, port), bus in zip(self.nodes[1:], self._bus_ports[1:]):
                _command(clients[0], "CLUSTER", "MEET", self._host, port, bus)
        except redis.RedisError as exc:
            raise EmbeddedRedisError(f"could not form the cluster: {exc}") from exc
        finally:
            for client in clients:
                client.close()

    def _health_problem(self, clients: list[redis.Redis]) -> str | None:
        """Return why the cluster is not healthy yet, or ``None`` if it is."""
        for client, (_, port) in zip(clients, self.nodes):
            try:
                info = _parse_info(_command(client, "CLUSTER", "INFO"))
                raw_nodes = _command(client, "CLUSTER", "NODES")
            except (redis.RedisError, OSError) as exc:
                return f"node {port}: {exc}"
            if info.get("cluster_state") != "ok":
                return f"node {port}: cluster_state={info.get('cluster_state')}"
            if info.get("cluster_slots_ok") != str(CLUSTER_SLOTS):
                return f"node {port}: cluster_slots_ok={info.get('cluster_slots_ok')}"
            if isinstance(raw_nodes, bytes):
                raw_nodes = raw_nodes.decode()
            masters = 0
            for line in str(raw_nodes).splitlines():
                fields = line.split()
                if len(fields) < 8:
                    continue
                flags = fields[2].split(",")
                if any(f in flags for f in ("handshake", "noaddr", "fail", "fail?")) or fields[7] != "connected":
                    return f"node {port}: peer {fields[1]} is {fields[2]}/{fields[7]}"
                if "master" in flags:
                    masters += 1
            if masters != self._masters:
                return f"node {port}: knows {masters}/{self._masters} masters"
        return None

    def wait_until_ok(self, timeout: float | None = None) -> None:
        """Wait until every node reports ``cluster_state:ok``, all 16384 slots
        served and all masters known and connected.

        Raises:
            EmbeddedRedisError: not healthy within ``timeout`` (default:
                the constructor's ``start_timeout``).
        """
        deadline = self._clock() + (self._start_timeout if timeout is None else timeout)
        clients = self._node_clients()
        try:
            while True:
                problem = self._health_problem(clients)
                if problem is None:
                    return
                if self._clock() >= deadline:
                    raise EmbeddedRedisError(f"cluster did not become healthy: {problem}")
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()

    def kill_node(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill node ``index``'s process (an outage); it keeps its address,
        data dir and ``nodes.conf``, so :meth:`start_node` rejoins it."""
        self._nodes[index].kill(sig)

    def start_node(self, index: int, *, wait: bool = True) -> None:
        """(Re)start node ``index`` on its old address; with ``wait`` block
        until the whole cluster is healthy again."""
        self._nodes[index].start()
        if wait:
            self.wait_until_ok()

    def _stop_nodes(self) -> None:
        nodes, self._nodes = self._nodes, []
        errors: list[BaseException] = []
        for node in nodes:
            try:
                node.stop()
            except Exception as exc:  # noqa: BLE001 - stop the others anyway
                errors.append(exc)
        if errors:
            raise errors[0]

    def stop(self) -> None:
        """Stop every node and remove all data directories. Idempotent."""
        with self._lock:
            try:
                self._stop_nodes()
            finally:
                if self._root is not None:
                    shutil.rmtree(self._root, ignore_errors=True)
                self._root = None
                self._bus_ports = []
                unregister(self)

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedCluster:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)
