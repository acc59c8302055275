"""A private Redis Cluster on loopback (3 masters, optionally with replicas): :class:`EmbeddedCluster`.

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
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

from .access import Access
from .probes import command, parse_info, role
from .process import AddressInUseError, EmbeddedRedisError, register, stop_each, unregister
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
from .tls import TlsServerConfig

__all__ = ["CLUSTER_SLOTS", "DEFAULT_CLUSTER_TIMEOUT", "EmbeddedCluster", "slot_ranges"]

#: the fields of a CLUSTER NODES line, in order (the slots follow)
_CLUSTER_NODES_FIELDS = ("id", "address", "flags", "master", "ping_sent", "pong_received", "config_epoch", "link_state")

CLUSTER_SLOTS = 16384
"""Number of hash slots in a Redis Cluster."""

DEFAULT_CLUSTER_TIMEOUT = 20.0
#: ``cluster-node-timeout`` without replicas (failures are only ever detected, never
#: failed over) and with them (short, so a replica takes over in a few seconds)
NODE_TIMEOUT_MS = 5000
FAILOVER_NODE_TIMEOUT_MS = 1000
Address = tuple[str, int]


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """Split the 16384 slots into ``masters`` contiguous inclusive ranges (node ``i`` serves range ``i``).

    >>> slot_ranges(3)
    [(0, 5460), (5461, 10921), (10922, 16383)]
    """
    bounds = [CLUSTER_SLOTS * i // masters for i in range(masters + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(masters)]


def _owners(raw: Any, host: str) -> list[tuple[int, int, Address]]:
    """A ``CLUSTER SLOTS`` reply as ``(first, last, master address)`` per slot range; ``host``
    stands for the empty one a node that never met another gives for itself."""
    return [(int(e[0]), int(e[1]), (normalize_host(_text(e[2][0]) or host), int(e[2][1]))) for e in raw]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class EmbeddedCluster:
    """A private Redis Cluster of ``masters`` masters, each with ``replicas`` replicas, on loopback.

    Each node is an :class:`EmbeddedRedis` with ``cluster-enabled yes`` and an
    explicit ``cluster-port`` (bus port), living in ``<data_dir>/node-<i>``: nodes
    ``0 .. masters-1`` start as masters, node ``masters + m * replicas + j`` as
    replica ``j`` of master ``m``. The cluster is formed with redis-py alone:
    ``CLUSTER SET-CONFIG-EPOCH``, ``CLUSTER ADDSLOTSRANGE`` (16384 slots split
    evenly), ``CLUSTER MEET``, ``CLUSTER REPLICATE``; then :meth:`wait_until_ok`
    waits for every node to report ``cluster_state:ok``, to know all masters and
    replicas, and for every replica's link to its master to be up.

    Args:
        masters: number of master nodes (default 3).
        host: loopback address for all nodes.
        extra_config: extra directives for every node (see :class:`EmbeddedRedis`).
        node_timeout_ms: ``cluster-node-timeout``; default 5000 ms without replicas,
            1000 ms with them (a failover then takes a few seconds).
        start_timeout: bound for the whole cluster to become healthy.
        clock: monotonic seconds, read for the deadlines (also given to every node).
        replicas: replicas per master (``cluster-replica-validity-factor 0``: any of
            them may take over, however stale).
        tls: TLS for clients, replication and the cluster bus (``tls-cluster yes``).
        password / acl_users: authentication of every node (see :class:`EmbeddedRedis`).

    Outages: :meth:`kill_node` / :meth:`start_node`, and with replicas
    :meth:`kill_master` then :meth:`wait_for_failover`.
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        host: str = "127.0.0.1",
        extra_config: Mapping[str, str] | None = None,
        node_timeout_ms: int | None = None,
        start_timeout: float = DEFAULT_CLUSTER_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        replicas: int = 0,
        tls: TlsServerConfig | None = None,
        password: str | None = None,
        acl_users: Sequence[tuple[str, str]] = (),
    ) -> None:
        if masters < 1:
            raise EmbeddedRedisError("a cluster needs at least one master")
        if replicas < 0:
            raise EmbeddedRedisError("replicas must be zero or more")
        self._masters = masters
        self._replicas = replicas
        self._access = Access.of(tls, password, acl_users)
        self._host = normalize_host(host)
        self._extra = dict(extra_config or {})
        if node_timeout_ms is None:
            node_timeout_ms = FAILOVER_NODE_TIMEOUT_MS if replicas else NODE_TIMEOUT_MS
        self._node_timeout_ms = node_timeout_ms
        self._start_timeout = start_timeout
        self._clock = clock
        self._lock = threading.RLock()
        self._root: str | None = None
        self._nodes: list[EmbeddedRedis] = []
        self._bus_ports: list[int] = []
        self._killed: list[tuple[Address, list[tuple[int, int]]]] = []  # awaiting wait_for_failover
        self._added = 0  # masters added to the running cluster (add_master)

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
        """``redis+cluster://[user:pass@]HOST:PORT0`` (the project's cluster URL scheme;
        ``rediss+cluster://`` with TLS)."""
        host, port = self._first()
        return f"{self._access.scheme}+cluster://{self._access.userinfo()}{host_for_url(host)}:{port}"

    @property
    def redis_url(self) -> str:
        """``redis://[user:pass@]HOST:PORT0/0`` (``rediss://`` with TLS) -- suitable for
        ``RedisCluster.from_url``."""
        host, port = self._first()
        return f"{self._access.scheme}://{self._access.userinfo()}{host_for_url(host)}:{port}/0"

    @property
    def access(self) -> Access:
        """TLS and authentication of every node."""
        return self._access

    @property
    def replicas(self) -> int:
        """Replicas per master."""
        return self._replicas

    def connection_kwargs(self) -> dict[str, Any]:
        """redis-py keyword arguments (credentials, TLS) for any node, without an address."""
        return self._access.client_kwargs()

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
        return RedisCluster(startup_nodes=self.startup_nodes, **{**self.connection_kwargs(), **kwargs})

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

    def _node_config(self, node_dir: str, port: int, bus: int) -> dict[str, str]:
        config = {
            "cluster-enabled": "yes",
            "cluster-config-file": quote_value(os.path.join(node_dir, f"nodes-{port}.conf")),
            "cluster-node-timeout": str(self._node_timeout_ms),
            "cluster-port": str(bus),
            # a master emptied of its slots (move_slots) stays a master, as before redis-cli's
            # del-node, instead of turning into a replica of the node that took its last slot
            "cluster-allow-replica-migration": "no",
        }
        if self._access.tls is not None:
            config["tls-cluster"] = "yes"
        if self._replicas:
            config["cluster-replica-validity-factor"] = "0"
            # Redis 7 leaves a replica out of CLUSTER SLOTS until its replication offset is
            # non-zero, which on an idle master only the periodic PING to replicas makes it
            config["repl-ping-replica-period"] = "1"
        return {**config, **self._extra}

    def _spawn_nodes(self) -> None:
        assert self._root is not None
        count = self._masters * (1 + self._replicas)
        ports = free_ports(self._host, 2 * count)
        client_ports, bus_ports = ports[:count], ports[count:]
        self._bus_ports = bus_ports
        for port, bus in zip(client_ports, bus_ports):
            self._new_node(port, bus)

    def _new_node(self, port: int, bus: int) -> EmbeddedRedis:
        """The next node (``node-<i>`` in the data directory), started."""
        assert self._root is not None
        node_dir = os.path.join(self._root, f"node-{len(self._nodes)}")
        node = EmbeddedRedis(
            port=port,
            host=self._host,
            extra_config=self._node_config(node_dir, port, bus),
            data_dir=node_dir,
            clock=self._clock,
            tls=self._access.tls,
            password=self._access.password,
            acl_users=self._access.acl_users,
        )
        self._nodes.append(node)
        node.start()
        return node

    def add_master(self) -> Address:
        """A new master, without slots, joins the running cluster (``CLUSTER MEET``), as
        ``redis-cli --cluster add-node`` adds one; :func:`~limiter.embedded.reshard.move_slots`
        then gives it some. Returns its address once every node knows it (the cluster
        counts it among its masters from then on; it has no replicas)."""
        with self._lock:
            if not self._nodes:
                raise EmbeddedRedisError("cluster has not been started")
            port, bus = free_ports(self._host, 2)
            self._new_node(port, bus)
            self._bus_ports.append(bus)
            client = self._node_client(self._nodes[0])
            try:
                command(client, "CLUSTER", "MEET", self._host, port, bus)
            except redis.RedisError as exc:
                raise EmbeddedRedisError(f"the new master {port} could not join: {exc}") from exc
            finally:
                client.close()
            self._added += 1
        self.wait_until_ok()
        return (self._host, port)

    def _node_client(self, node: EmbeddedRedis) -> redis.Redis:
        return node.client(decode_responses=True, socket_connect_timeout=1, socket_timeout=2, retry=no_retry())

    def _node_clients(self) -> list[redis.Redis]:
        return [self._node_client(node) for node in self._nodes]

    def _form_cluster(self) -> None:
        clients = self._node_clients()
        try:
            for i, (client, (first, last)) in enumerate(zip(clients, slot_ranges(self._masters))):
                command(client, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)
                command(client, "CLUSTER", "ADDSLOTSRANGE", first, last)
            for (_, port), bus in zip(self.nodes[1:], self._bus_ports[1:]):
                command(clients[0], "CLUSTER", "MEET", self._host, port, bus)
            if self._replicas:
                self._attach_replicas(clients)
        except redis.RedisError as exc:
            raise EmbeddedRedisError(f"could not form the cluster: {exc}") from exc
        finally:
            for client in clients:
                client.close()

    def _attach_replicas(self, clients: list[redis.Redis]) -> None:
        """``CLUSTER REPLICATE`` each replica to its master, once the MEETs reached it."""
        master_ids = [str(command(client, "CLUSTER", "MYID")) for client in clients[: self._masters]]
        deadline = self._clock() + self._start_timeout
        for index in range(self._masters, len(clients)):
            master_id = master_ids[(index - self._masters) // self._replicas]
            while True:
                try:
                    command(clients[index], "CLUSTER", "REPLICATE", master_id)
                    break
                except redis.ResponseError as exc:  # "Unknown node": gossip has not got there yet
                    if self._clock() >= deadline:
                        raise EmbeddedRedisError(f"node {index} could not replicate {master_id}: {exc}") from exc
                time.sleep(0.05)

    def _health_problem(self, clients: list[redis.Redis]) -> str | None:
        """Return why the cluster is not healthy yet, or ``None`` if it is."""
        for client, (_, port) in zip(clients, self.nodes):
            try:
                info = parse_info(command(client, "CLUSTER", "INFO"))
                raw_nodes = command(client, "CLUSTER", "NODES")
                replication = parse_info(command(client, "INFO", "replication")) if self._replicas else {}
            except (redis.RedisError, OSError) as exc:
                return f"node {port}: {exc}"
            if info.get("cluster_state") != "ok":
                return f"node {port}: cluster_state={info.get('cluster_state')}"
            if info.get("cluster_slots_ok") != str(CLUSTER_SLOTS):
                return f"node {port}: cluster_slots_ok={info.get('cluster_slots_ok')}"
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                return f"node {port}: replication link {replication.get('master_link_status')}"
            if isinstance(raw_nodes, bytes):
                raw_nodes = raw_nodes.decode()
            masters = replicas = 0
            for line in str(raw_nodes).splitlines():
                node = dict(zip(_CLUSTER_NODES_FIELDS, line.split()))
                if len(node) < len(_CLUSTER_NODES_FIELDS):
                    continue
                flags = node["flags"].split(",")
                link = node["link_state"]
                if any(f in flags for f in ("handshake", "noaddr", "fail", "fail?")) or link != "connected":
                    return f"node {port}: peer {node['address']} is {node['flags']}/{link}"
                masters += "master" in flags
                replicas += "slave" in flags
            if masters != self._masters + self._added or replicas != self._masters * self._replicas:
                return f"node {port}: knows {masters}/{self._masters + self._added} masters, {replicas} replicas"
            problem = self._slots_problem(client) if self._replicas else None
            if problem is not None:
                return f"node {port}: {problem}"
        return None

    def _slots_problem(self, client: redis.Redis) -> str | None:
        """Why ``CLUSTER SLOTS`` (what clients see) does not list every replica yet, or ``None``."""
        try:
            raw = command(client, "CLUSTER", "SLOTS")
        except (redis.RedisError, OSError) as exc:
            return repr(exc)
        for first, last, _master, *replicas in raw:
            if len(replicas) != self._replicas:
                return f"CLUSTER SLOTS lists {len(replicas)}/{self._replicas} replicas for slots {first}-{last}"
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

    def _slot_table(self) -> list[tuple[int, int, Address]]:
        """``(first, last, master address)`` per slot range, from the first node that answers."""
        problems = []
        for node in self._nodes:
            if not node.running:
                continue
            client = self._node_client(node)
            try:
                return _owners(command(client, "CLUSTER", "SLOTS"), self._host)
            except (redis.RedisError, OSError) as exc:
                problems.append(f"{node!r}: {exc!r}")
            finally:
                client.close()
        raise EmbeddedRedisError(f"no cluster node answers CLUSTER SLOTS: {problems}")

    def _node_at(self, address: Address) -> EmbeddedRedis | None:
        for node in self._nodes:
            if (node.host, node.port) == address:
                return node
        return None

    def kill_master(self, index: int, sig: int = signal.SIGKILL) -> Address:
        """Kill the node that currently serves slot range ``index`` (of :func:`slot_ranges`;
        initially node ``index``) and return its address. With replicas, one of them takes
        over: see :meth:`wait_for_failover`. :meth:`start_node` brings the node back (it
        rejoins as a replica of its successor)."""
        if not 0 <= index < self._masters:
            raise EmbeddedRedisError(f"master index must be in 0..{self._masters - 1}, got {index}")
        first = slot_ranges(self._masters)[index][0]
        table = self._slot_table()
        address = next((owner for lo, hi, owner in table if lo <= first <= hi), None)
        node = None if address is None else self._node_at(address)
        if address is None or node is None:
            raise EmbeddedRedisError(f"slot {first} is served by {address}, not by a node of this cluster")
        node.kill(sig)
        self._killed.append((address, [(lo, hi) for lo, hi, owner in table if owner == address]))
        return address

    def _failover_problem(self) -> str | Address:
        """The successor of the last killed master once every running node reports
        ``cluster_state:ok`` and the killed masters' slots are served by running masters."""
        successor: Address | None = None
        for node in self._nodes:
            if not node.running:
                continue
            client = self._node_client(node)
            try:
                info = parse_info(command(client, "CLUSTER", "INFO"))
                raw = command(client, "CLUSTER", "SLOTS")
            except (redis.RedisError, OSError) as exc:
                return f"{node!r}: {exc!r}"
            finally:
                client.close()
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != str(CLUSTER_SLOTS):
                return f"{node!r}: cluster_state={info.get('cluster_state')} slots_ok={info.get('cluster_slots_ok')}"
            owners = _owners(raw, self._host)
            for dead, ranges in self._killed:
                for first, _ in ranges:
                    owner = next((o for lo, hi, o in owners if lo <= first <= hi), None)
                    server = None if owner is None else self._node_at(owner)
                    if owner == dead or server is None or not server.running:
                        return f"{node!r}: slot {first} served by {owner}"
                    successor = owner
        if successor is None:
            return "no running node answered"
        return self._check_role(successor)

    def _check_role(self, address: Address) -> str | Address:
        node = self._node_at(address)
        assert node is not None
        client = self._node_client(node)
        try:
            node_role = role(client)
        except (redis.RedisError, OSError) as exc:
            return f"{node!r}: {exc!r}"
        finally:
            client.close()
        return address if node_role == "master" else f"{node!r} answers ROLE {node_role}"

    def wait_for_failover(self, timeout: float | None = None) -> Address:
        """After :meth:`kill_master`: wait until the cluster is ``ok`` again on every running
        node and the killed masters' slots are served by running nodes that answer ``ROLE``
        as masters; return the address of the last killed master's successor.

        Raises:
            EmbeddedRedisError: no replicas, nothing killed, or no failover within
                ``timeout`` (default ``start_timeout``).
        """
        if not self._replicas:
            raise EmbeddedRedisError("a cluster without replicas cannot fail over")
        if not self._killed:
            raise EmbeddedRedisError("wait_for_failover: no master was killed with kill_master()")
        deadline = self._clock() + (self._start_timeout if timeout is None else timeout)
        while True:
            outcome = self._failover_problem()
            if not isinstance(outcome, str):
                self._killed = []
                return outcome
            if self._clock() >= deadline:
                raise EmbeddedRedisError(f"cluster did not fail over: {outcome}")
            time.sleep(0.05)

    def _stop_nodes(self) -> None:
        nodes, self._nodes = self._nodes, []
        stop_each(nodes)

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
                self._killed = []
                self._added = 0
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
