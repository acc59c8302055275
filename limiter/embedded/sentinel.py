"""A private Redis Sentinel deployment on loopback: :class:`EmbeddedSentinelSet`.

One master and its replicas (each an :class:`~limiter.embedded.server.EmbeddedRedis`)
watched by several sentinels (:class:`EmbeddedSentinel`, i.e. ``redis-server
--sentinel``, so no separate ``redis-sentinel`` binary is needed), all on loopback,
with timings short enough that a failover completes in a few seconds.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import redis
from redis.sentinel import Sentinel

from .access import Access, quote_value
from .probes import command, pairs, parse_info, role, table
from .process import AddressInUseError, EmbeddedRedisError, register, stop_each, unregister
from .server import DIR_PREFIX, PORT_ATTEMPTS, EmbeddedRedis, free_ports, host_for_url, no_retry, normalize_host
from .tls import TlsServerConfig

__all__ = ["DEFAULT_SENTINEL_TIMEOUT", "EmbeddedSentinel", "EmbeddedSentinelSet"]

DEFAULT_SENTINEL_TIMEOUT = 30.0
_POLL = 0.05
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
Address = tuple[str, int]


class EmbeddedSentinel(EmbeddedRedis):
    """One ``redis-server --sentinel`` process on loopback.

    ``sentinel_lines`` are the ``sentinel ...`` directives (``monitor`` first). The
    configuration file is written once per port: Sentinel rewrites it with what it
    learns (current master, replicas, other sentinels, epochs), and a sentinel brought
    back with :meth:`start` after :meth:`kill` resumes from that state. ``password`` is
    the sentinel's own ``requirepass`` (the sentinels of a set share it, and use it to
    log in to each other); with ``tls`` it listens on TLS only and talks TLS to the data
    nodes and the other sentinels (``tls-replication yes``).
    """

    def __init__(
        self,
        *,
        port: int,
        data_dir: str,
        sentinel_lines: Sequence[str],
        host: str = "127.0.0.1",
        tls: TlsServerConfig | None = None,
        password: str | None = None,
        start_timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            port=port,
            host=host,
            data_dir=data_dir,
            tls=tls,
            password=password,
            start_timeout=start_timeout,
            clock=clock,
        )
        self._sentinel_lines = list(sentinel_lines)

    def _config_text(self) -> str:
        lines = self._base_lines()
        if self.access.tls is not None:
            lines.append("tls-replication yes")
        lines += self._sentinel_lines
        return "\n".join(lines) + "\n"

    def _conf_path(self) -> str:
        assert self.data_dir is not None
        return os.path.join(self.data_dir, f"sentinel-{self.port}.conf")

    def _write_config(self, conf_path: str) -> None:
        if not os.path.exists(conf_path):  # else: Sentinel's own rewrite of it
            super()._write_config(conf_path)

    def _argv(self, conf_path: str) -> list[str]:
        return [*super()._argv(conf_path), "--sentinel"]

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<EmbeddedSentinel {self.host}:{self.port} pid={self.pid} {state}>"


class EmbeddedSentinelSet:
    """A master, ``replicas`` replicas and ``sentinels`` sentinels, all private and on loopback.

    Args:
        master_name: the name the sentinels monitor the master under.
        sentinels: number of sentinels (quorum: a majority of them unless ``quorum``).
        replicas: number of replicas of the master.
        tls: TLS for every data node and sentinel (replication and sentinel links too).
        password / acl_users: authentication of the data nodes (see :class:`EmbeddedRedis`);
            the replicas and the sentinels log in with the same credentials
            (``masteruser``/``masterauth``, ``sentinel auth-user``/``auth-pass``).
        sentinel_password: the sentinels' own ``requirepass`` (none by default).
        down_after_ms: ``sentinel down-after-milliseconds``.
        failover_timeout_ms: ``sentinel failover-timeout`` (a sentinel that lost an
            election waits twice this long before it tries again).
        quorum: sentinels that must agree the master is down (default: a majority).
        host: loopback address for everything.
        extra_config: extra directives for the data nodes.
        start_timeout: bound for the whole set to become ready.
        clock: monotonic seconds, read for the deadlines.

    Addresses: :attr:`url` (``redis+sentinel://[user:pass@]H:S1,H:S2,H:S3/NAME``,
    ``rediss+sentinel://`` with TLS), :attr:`sentinel_addresses`, :meth:`master_address`;
    :meth:`sentinel_client` builds a redis-py :class:`~redis.sentinel.Sentinel`.
    Outages: :meth:`kill_master` then :meth:`wait_for_failover`.
    """

    def __init__(
        self,
        *,
        master_name: str = "mymaster",
        sentinels: int = 3,
        replicas: int = 1,
        tls: TlsServerConfig | None = None,
        password: str | None = None,
        acl_users: Sequence[tuple[str, str]] = (),
        sentinel_password: str | None = None,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        quorum: int | None = None,
        host: str = "127.0.0.1",
        extra_config: Mapping[str, str] | None = None,
        start_timeout: float = DEFAULT_SENTINEL_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not _NAME.match(master_name):
            raise EmbeddedRedisError(f"master_name must match {_NAME.pattern}, got {master_name!r}")
        if sentinels < 1 or replicas < 0:
            raise EmbeddedRedisError("a sentinel set needs at least one sentinel and zero or more replicas")
        self._quorum = quorum if quorum is not None else sentinels // 2 + 1
        if not 1 <= self._quorum <= sentinels:
            raise EmbeddedRedisError(f"quorum must be in 1..{sentinels}, got {self._quorum}")
        self._name = master_name
        self._sentinel_count = sentinels
        self._replica_count = replicas
        self._access = Access.of(tls, password, acl_users)
        self._sentinel_access = Access.of(tls, sentinel_password, ())
        self._down_after_ms = down_after_ms
        self._failover_timeout_ms = failover_timeout_ms
        self._host = normalize_host(host)
        self._extra = dict(extra_config or {})
        self._start_timeout = start_timeout
        self._clock = clock
        self._lock = threading.RLock()
        self._root: str | None = None
        self._servers: list[EmbeddedRedis] = []
        self._sentinels: list[EmbeddedSentinel] = []

    # ---- properties --------------------------------------------------------

    @property
    def master_name(self) -> str:
        """The name the sentinels monitor the master under."""
        return self._name

    @property
    def quorum(self) -> int:
        """Sentinels that must agree the master is down."""
        return self._quorum

    @property
    def servers(self) -> list[EmbeddedRedis]:
        """The data nodes: the initial master first, then its replicas (creation order;
        roles change with failovers)."""
        return list(self._servers)

    @property
    def sentinels(self) -> list[EmbeddedSentinel]:
        """The sentinel processes."""
        return list(self._sentinels)

    @property
    def sentinel_addresses(self) -> list[Address]:
        """``(host, port)`` of every sentinel."""
        return [(self._host, s.port) for s in self._sentinels if s.port is not None]

    @property
    def access(self) -> Access:
        """TLS and authentication of the data nodes."""
        return self._access

    @property
    def url(self) -> str:
        """``redis+sentinel://[user:pass@]H:S1,H:S2,.../NAME`` (``rediss+sentinel://`` with TLS).

        The credentials are the data nodes'; the sentinels' own password, if any, is
        not part of it (see :meth:`sentinel_kwargs`)."""
        addresses = self.sentinel_addresses
        if not addresses:
            raise EmbeddedRedisError("sentinel set has not been started")
        hosts = ",".join(f"{host_for_url(h)}:{p}" for h, p in addresses)
        return f"{self._access.scheme}+sentinel://{self._access.userinfo()}{hosts}/{self._name}"

    @property
    def data_dir(self) -> str | None:
        """Root directory holding every node's and sentinel's directory."""
        return self._root

    def connection_kwargs(self) -> dict[str, Any]:
        """redis-py keyword arguments (credentials, TLS) for the data nodes, without an address."""
        return self._access.client_kwargs()

    def sentinel_kwargs(self) -> dict[str, Any]:
        """redis-py keyword arguments (password, TLS) for the sentinels, without an address."""
        return self._sentinel_access.client_kwargs()

    def sentinel_client(self, **kwargs: Any) -> Sentinel:
        """A redis-py ``Sentinel`` for this set (``master_for(set.master_name)``);
        ``kwargs`` go to the data-node connections."""
        return Sentinel(  # type: ignore[no-untyped-call]
            self.sentinel_addresses,
            sentinel_kwargs={**self.sentinel_kwargs(), "socket_timeout": 2.0},
            **{**self.connection_kwargs(), **kwargs},
        )

    def server_at(self, address: Address) -> EmbeddedRedis | None:
        """The data node listening on ``address``, if it is one of ours."""
        host, port = address
        for server in self._servers:
            if server.port == int(port) and normalize_host(host) == server.host:
                return server
        return None

    def __repr__(self) -> str:
        return f"<EmbeddedSentinelSet {self._name} servers={self._servers} sentinels={self.sentinel_addresses}>"

    # ---- lifecycle ---------------------------------------------------------

    def start(self) -> EmbeddedSentinelSet:
        """Start the master, the replicas and the sentinels; wait until the set is ready."""
        with self._lock:
            if self._servers:
                if all(p.running for p in [*self._servers, *self._sentinels]):
                    return self
                self._restart_missing()
                return self
            self._root = tempfile.mkdtemp(prefix=DIR_PREFIX + "sentinel-")
            register(self, order=0)
            try:
                for attempt in range(PORT_ATTEMPTS):
                    try:
                        self._spawn()
                        break
                    except AddressInUseError:
                        self._stop_processes()
                        if attempt + 1 >= PORT_ATTEMPTS:
                            raise
                self.wait_until_ready()
            except BaseException:
                self.stop()
                raise
            return self

    def _restart_missing(self) -> None:
        """Bring back every stopped process: a data node as a replica of the current master
        (unless it is that master), so no sentinel has to demote it first."""
        for sentinel in self._sentinels:
            sentinel.start()
        # Never guess: a node started as a master beside the sitting one splits the set until a
        # sentinel demotes one of them. A sentinel that does not answer yet (a busy machine) is
        # waited for, within the start timeout.
        self._wait(self._no_master_reported, self._start_timeout, "a sentinel to report the master")
        master = self.master_address()
        for server in self._servers:
            if not server.running:
                server.replica_of = None if self.server_at(master) is server else master
                server.start()
        self.wait_until_ready()

    def _no_master_reported(self) -> str | None:
        reported = {a for a in self._reported_masters().values() if a is not None}
        if len(reported) != 1:
            return f"sentinels report masters {reported or 'none'}"
        return None

    def _spawn(self) -> None:
        assert self._root is not None
        ports = free_ports(self._host, 1 + self._replica_count + self._sentinel_count)
        master_port, sentinel_ports = ports[0], ports[1 + self._replica_count :]
        for i, port in enumerate(ports[: 1 + self._replica_count]):
            self._servers.append(
                EmbeddedRedis(
                    port=port,
                    host=self._host,
                    extra_config=self._extra,
                    data_dir=os.path.join(self._root, "master" if i == 0 else f"replica-{i}"),
                    clock=self._clock,
                    tls=self._access.tls,
                    password=self._access.password,
                    acl_users=self._access.acl_users,
                    replica_of=None if i == 0 else (self._host, master_port),
                )
            )
            self._servers[-1].start()
        # Sentinels read the replicas from the master's first INFO: let them attach first.
        self._wait(self._replication_problem, self._start_timeout, "replicas to sync")
        lines = self._sentinel_lines(master_port)
        for i, port in enumerate(sentinel_ports):
            sentinel = EmbeddedSentinel(
                port=port,
                host=self._host,
                data_dir=os.path.join(self._root, f"sentinel-{i}"),
                sentinel_lines=lines,
                tls=self._sentinel_access.tls,
                password=self._sentinel_access.password,
                clock=self._clock,
            )
            self._sentinels.append(sentinel)
            sentinel.start()

    def _sentinel_lines(self, master_port: int) -> list[str]:
        name = self._name
        lines = [
            "sentinel resolve-hostnames no",
            "sentinel announce-hostnames no",
            f"sentinel monitor {name} {self._host} {master_port} {self._quorum}",
            f"sentinel down-after-milliseconds {name} {self._down_after_ms}",
            f"sentinel failover-timeout {name} {self._failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]
        user, password = self._access.login
        for key, value in (("auth-user", user), ("auth-pass", password)):
            if value is not None:
                lines.append(f"sentinel {key} {name} {quote_value(value)}")
        return lines

    def _stop_processes(self) -> None:
        processes: list[EmbeddedRedis] = [*self._sentinels, *reversed(self._servers)]
        self._sentinels, self._servers = [], []
        stop_each(processes)

    def stop(self) -> None:
        """Stop every sentinel and data node and remove all directories. Idempotent."""
        with self._lock:
            try:
                self._stop_processes()
            finally:
                if self._root is not None:
                    shutil.rmtree(self._root, ignore_errors=True)
                self._root = None
                unregister(self)

    def __enter__(self) -> EmbeddedSentinelSet:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedSentinelSet:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)

    # ---- state and outages -------------------------------------------------

    def _client(self, process: EmbeddedRedis) -> redis.Redis:
        return process.client(decode_responses=True, socket_connect_timeout=1, socket_timeout=2, retry=no_retry())

    def _reported_masters(self) -> dict[int, Address | None]:
        """What each running sentinel (by index) reports as the master (``None``: no answer)."""
        out: dict[int, Address | None] = {}
        for i, sentinel in enumerate(self._sentinels):
            if not sentinel.running:
                continue
            client = self._client(sentinel)
            try:
                reply = command(client, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self._name)
                out[i] = None if not reply else (str(reply[0]), int(reply[1]))
            except (redis.RedisError, OSError):
                out[i] = None
            finally:
                client.close()
        return out

    def master_address(self) -> Address:
        """The master's ``(host, port)`` according to the first sentinel that answers.

        Raises:
            EmbeddedRedisError: no running sentinel knows the master.
        """
        for address in self._reported_masters().values():
            if address is not None:
                return address
        raise EmbeddedRedisError(f"no sentinel of {self._name!r} reports a master")

    def kill_master(self, sig: int = signal.SIGKILL) -> Address:
        """Kill the current master's process (default SIGKILL, a crash) and return its address.

        The node keeps its address and directory. :meth:`start` brings it back as a
        replica of the current master; on its own, :meth:`EmbeddedRedis.start` brings it
        back as a master, which the sentinels demote to a replica after some 10-20 s."""
        address = self.master_address()
        server = self.server_at(address)
        if server is None:
            raise EmbeddedRedisError(f"the sentinels report master {address}, which is not one of this set's nodes")
        server.kill(sig)
        return address

    def _failover_problem(self, old: Address) -> str | Address:
        reported = self._reported_masters()
        answers = set(reported.values())
        if not reported or len(answers) != 1 or None in answers:
            return f"sentinels disagree or do not answer: {reported}"
        address = answers.pop()
        assert address is not None
        if address == old:
            return f"sentinels still report the old master {old}"
        server = self.server_at(address)
        if server is None or not server.running:
            return f"sentinels report {address}, which is not a running node of this set"
        client = self._client(server)
        try:
            node_role = role(client)
        except (redis.RedisError, OSError) as exc:
            return f"new master {address}: {exc!r}"
        finally:
            client.close()
        return address if node_role == "master" else f"new master {address} answers ROLE {node_role}"

    def wait_for_failover(self, old_address: Address, timeout: float | None = None) -> Address:
        """Wait until every running sentinel reports one master other than ``old_address``
        and that node answers ``ROLE`` as a master; return its address.

        Raises:
            EmbeddedRedisError: no failover within ``timeout`` (default ``start_timeout``).
        """
        old = (normalize_host(old_address[0]), int(old_address[1]))
        deadline = self._clock() + (self._start_timeout if timeout is None else timeout)
        while True:
            outcome = self._failover_problem(old)
            if not isinstance(outcome, str):
                return outcome
            if self._clock() >= deadline:
                raise EmbeddedRedisError(f"no failover away from {old} within the timeout: {outcome}")
            time.sleep(_POLL)

    def _replication_problem(self) -> str | None:
        """Why the master's running replicas are not all attached and in sync, or ``None``."""
        running = [s for s in self._servers if s.running]
        masters = []
        for server in running:
            client = self._client(server)
            try:
                info = parse_info(command(client, "INFO", "replication"))
            except (redis.RedisError, OSError) as exc:
                return f"{server!r}: {exc!r}"
            finally:
                client.close()
            if info.get("role") == "master":
                masters.append((server, info))
        if len(masters) != 1:
            return f"{len(masters)} running masters"
        server, info = masters[0]
        online = [k for k, v in info.items() if k.startswith("slave") and k[5:].isdigit() and "state=online" in v]
        if len(online) != len(running) - 1:
            return f"master {server!r}: {len(online)}/{len(running) - 1} replicas online"
        return None

    def _sentinel_problem(self, master: Address) -> str | None:
        """Why a running sentinel does not yet see ``master`` healthy with every running
        replica and every other running sentinel, or ``None``."""
        replicas = sum(1 for s in self._servers if s.running) - 1
        peers = sum(1 for s in self._sentinels if s.running) - 1
        for sentinel in self._sentinels:
            if not sentinel.running:
                continue
            client = self._client(sentinel)
            try:
                state = pairs(command(client, "SENTINEL", "MASTER", self._name))
                known_replicas = table(command(client, "SENTINEL", "REPLICAS", self._name))
                known_sentinels = table(command(client, "SENTINEL", "SENTINELS", self._name))
            except (redis.RedisError, OSError) as exc:
                return f"{sentinel!r}: {exc!r}"
            finally:
                client.close()
            where = (state.get("ip"), int(state.get("port", "0")))
            if where != master or state.get("flags") != "master":
                return f"{sentinel!r}: master {where} flags={state.get('flags')}"
            up = [r for r in known_replicas if r.get("flags") == "slave" and r.get("master-link-status") == "ok"]
            if len(up) != replicas:
                return f"{sentinel!r}: sees {len(up)}/{replicas} replicas up"
            seen = [s for s in known_sentinels if s.get("flags") == "sentinel"]
            if len(seen) != peers:
                return f"{sentinel!r}: sees {len(seen)}/{peers} other sentinels"
        return None

    def _ready_problem(self) -> str | None:
        problem = self._replication_problem()
        if problem is not None:
            return problem
        reported = set(self._reported_masters().values())
        if len(reported) != 1 or None in reported:
            return f"sentinels report masters {reported}"
        master = reported.pop()
        assert master is not None
        return self._sentinel_problem(master)

    def wait_until_ready(self, timeout: float | None = None) -> None:
        """Wait until the running replicas are in sync with the one master, and every running
        sentinel agrees on it and sees all running replicas and all other running sentinels.

        Raises:
            EmbeddedRedisError: not ready within ``timeout`` (default ``start_timeout``).
        """
        self._wait(self._ready_problem, self._start_timeout if timeout is None else timeout, "the sentinel set")

    def _wait(self, problem: Callable[[], str | None], timeout: float, what: str) -> None:
        deadline = self._clock() + timeout
        while True:
            found = problem()
            if found is None:
                return
            if self._clock() >= deadline:
                raise EmbeddedRedisError(f"timed out after {timeout:g}s waiting for {what}: {found}")
            time.sleep(_POLL)
