"""One private ``redis-server`` on loopback TCP or a unix socket: :class:`EmbeddedRedis`.

Each server gets its own temporary data directory and a generated ``redis.conf``
that binds a loopback address only (``protected-mode yes``, persistence off); the
process plumbing (parent-death signal, exit registry) is :mod:`.process`'s.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .access import Access, quote_value
from .process import (
    AddressInUseError,
    EmbeddedRedisError,
    find_redis_server,
    make_preexec,
    register,
    spawn,
    tail,
    terminate,
    unregister,
)
from .tls import TlsServerConfig

__all__ = [
    "DEFAULT_START_TIMEOUT",
    "DEFAULT_STOP_TIMEOUT",
    "DIR_PREFIX",
    "EmbeddedRedis",
    "PORT_ATTEMPTS",
    "conf_line",
    "free_ports",
    "host_for_url",
    "no_retry",
    "normalize_host",
    "quote_value",
]

DIR_PREFIX = "shadowlimit-redis-"
DEFAULT_START_TIMEOUT = 10.0
DEFAULT_STOP_TIMEOUT = 3.0
#: how many free ports are tried when redis-server loses a bind race
PORT_ATTEMPTS = 5
_POLL_INTERVAL = 0.02
_UNIX_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin

# Config keys the launcher owns; overriding them could expose the server
# beyond loopback or break start/stop, so extra_config may not set them.
_MANAGED_KEYS = frozenset(
    {
        "bind",
        "port",
        "unixsocket",
        "unixsocketperm",
        "protected-mode",
        "daemonize",
        "dir",
        "logfile",
        "pidfile",
        "supervised",
        "include",
        "tls-port",
        "requirepass",
        "user",
        "aclfile",
        "replicaof",
        "slaveof",
        "masteruser",
        "masterauth",
    }
)


def normalize_host(host: str) -> str:
    """``host`` as the loopback address to bind (``localhost`` is ``127.0.0.1``); anything else is refused."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise EmbeddedRedisError(f"host must be a loopback IP address, got {host!r}") from None
    if not addr.is_loopback:
        raise EmbeddedRedisError(f"refusing to bind {host!r}: embedded Redis only listens on loopback")
    return str(addr)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_ports(host: str, count: int) -> list[int]:
    """Return ``count`` distinct currently-free TCP ports on ``host``."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(_family(host), socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def host_for_url(host: str) -> str:
    """``host`` as written in a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def no_retry() -> Retry:
    """Probes poll on their own schedule; redis-py's default backoff would
    only slow them down."""
    return Retry(NoBackoff(), 0)


def conf_line(key: str, value: str) -> str:
    """One ``redis.conf`` line, ``""`` for an empty value; refuses line breaks and empty keys."""
    if "\n" in key or "\r" in key or "\n" in value or "\r" in value or not key.strip():
        raise EmbeddedRedisError(f"invalid config entry {key!r}: {value!r}")
    return f"{key} {value if value != '' else chr(34) * 2}"


class EmbeddedRedis:
    """A private ``redis-server`` child process on loopback TCP or a unix socket.

    Args:
        unix_socket: listen on ``<data_dir>/redis.sock`` only (``port 0``).
        port: fixed TCP port; by default a free loopback port is picked (and a
            new one tried if the server loses a bind race).
        host: loopback address to bind (``127.0.0.1``, ``::1``; ``localhost``
            means ``127.0.0.1``). Anything else is refused.
        extra_config: additional ``redis.conf`` directives, written verbatim
            after the defaults (so e.g. ``{"save": "900 1"}`` or
            ``{"maxmemory": "10mb"}`` work; ``""`` becomes ``""``). Directives
            that control the listening address, daemonizing or file locations
            are refused.
        data_dir: use this existing/creatable directory instead of a fresh
            ``tempfile.mkdtemp(prefix="shadowlimit-redis-")``. A caller-provided
            directory is *not* deleted by :meth:`stop`.
        start_timeout: seconds to wait for the first PING reply.
        stop_timeout: seconds between SIGTERM and SIGKILL.
        clock: monotonic seconds, read for the ``start_timeout`` deadline.
        tls: serve TLS only (``port 0``, ``tls-port N``; see
            :class:`~limiter.embedded.tls.TlsServerConfig`); :attr:`url` becomes
            ``rediss://`` and :meth:`connection_kwargs` carries the TLS options.
            Not with ``unix_socket``.
        password: the default user's password (``requirepass``).
        acl_users: ``(name, password)`` pairs, each ``user NAME on >PASSWORD ~* &* +@all``;
            without ``password`` the default user is switched off. The launcher (its
            probes, :attr:`url`, :meth:`client`) logs in as the first of them, else as the
            default user with ``password``. With any authentication, ``masteruser`` /
            ``masterauth`` are set to the same credentials (and ``tls-replication yes``
            with TLS), so the server can replicate from a master configured alike.
        replica_of: ``(host, port)`` of a master to replicate (``replicaof``).

    Lifecycle:
        * :meth:`start` launches the server (no-op while it runs). Called again
          after :meth:`kill` / on a crashed server, it relaunches on the *same*
          address with the same data directory.
        * :meth:`kill` stops only the process (SIGKILL by default) -- an outage.
        * :meth:`restart` = graceful stop of the process + :meth:`start`.
        * :meth:`stop` stops the process and removes the data directory;
          idempotent. A later :meth:`start` begins afresh (new dir, new port
          unless ``port`` was given).
    """

    def __init__(
        self,
        *,
        unix_socket: bool = False,
        port: int | None = None,
        host: str = "127.0.0.1",
        extra_config: Mapping[str, str] | None = None,
        data_dir: str | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        tls: TlsServerConfig | None = None,
        password: str | None = None,
        acl_users: Sequence[tuple[str, str]] = (),
        replica_of: tuple[str, int] | None = None,
    ) -> None:
        if port is not None and not (0 < port < 65536):
            raise EmbeddedRedisError(f"port must be in 1..65535, got {port}")
        if unix_socket and port is not None:
            raise EmbeddedRedisError("port cannot be combined with unix_socket=True")
        if unix_socket and tls is not None:
            raise EmbeddedRedisError("tls cannot be combined with unix_socket=True")
        self._access = Access.of(tls, password, acl_users)
        self._replica_of: tuple[str, int] | None = None
        self.replica_of = replica_of
        extra = {str(k): str(v) for k, v in (extra_config or {}).items()}
        refused = sorted(k for k in extra if k.strip().lower() in _MANAGED_KEYS)
        if refused:
            raise EmbeddedRedisError(f"extra_config may not set managed directives: {', '.join(refused)}")
        for key, value in extra.items():
            conf_line(key, value)  # validate early
        self._unix = unix_socket
        self._host = normalize_host(host)
        self._requested_port = port
        self._extra = extra
        self._user_dir = os.path.abspath(data_dir) if data_dir is not None else None
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._clock = clock
        self._lock = threading.RLock()
        self._binary: str | None = None
        self._dir: str | None = None
        self._port: int | None = None  # chosen TCP port, kept across kill()/restart()
        self._proc: subprocess.Popen[bytes] | None = None

    # ---- properties --------------------------------------------------------

    @property
    def host(self) -> str:
        """Loopback address the server binds."""
        return self._host

    @property
    def port(self) -> int | None:
        """TCP port (``None`` for a unix-socket server or before the first start)."""
        return None if self._unix else self._port

    @property
    def unix_path(self) -> str | None:
        """Path of the unix socket (``None`` for a TCP server or before start)."""
        if not self._unix or self._dir is None:
            return None
        return os.path.join(self._dir, "redis.sock")

    @property
    def data_dir(self) -> str | None:
        """The server's working directory (``None`` when not set up)."""
        return self._dir

    @property
    def log_path(self) -> str | None:
        """Path of ``redis.log`` (``None`` when not set up)."""
        return None if self._dir is None else os.path.join(self._dir, "redis.log")

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The ``Popen`` of the current server process, if any."""
        return self._proc

    @property
    def pid(self) -> int | None:
        """PID of the current server process, if any."""
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def url(self) -> str:
        """``redis://HOST:PORT/0`` (``rediss://`` with TLS) or ``unix:///path/redis.sock?db=0``,
        with ``user:password@`` / ``:password@`` when the server requires a login."""
        if self._unix:
            path = self.unix_path
            if path is None:
                raise EmbeddedRedisError("server has not been started")
            return f"unix://{self._access.userinfo()}{path}?db=0"
        if self._port is None:
            raise EmbeddedRedisError("server has not been started")
        return f"{self._access.scheme}://{self._access.userinfo()}{host_for_url(self._host)}:{self._port}/0"

    @property
    def access(self) -> Access:
        """The server's TLS and authentication settings."""
        return self._access

    @property
    def replica_of(self) -> tuple[str, int] | None:
        """``(host, port)`` of the master this server replicates at its next (re)start
        (``replicaof``); settable, e.g. to bring a failed-over master back as a replica."""
        return self._replica_of

    @replica_of.setter
    def replica_of(self, master: tuple[str, int] | None) -> None:
        if master is not None:
            if not (0 < master[1] < 65536):
                raise EmbeddedRedisError(f"replica_of port must be in 1..65535, got {master[1]}")
            master = (normalize_host(master[0]), int(master[1]))
        self._replica_of = master

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``redis.Redis(...)`` reaching this server (address,
        credentials and, with TLS, the verified-TLS options)."""
        where: dict[str, Any]
        if self._unix:
            where = {"unix_socket_path": self.unix_path}
        else:
            where = {"host": self._host, "port": self._port}
        return {**where, **self._access.client_kwargs()}

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new synchronous redis-py client for this server (caller closes it)."""
        return redis.Redis(**{**self.connection_kwargs(), **kwargs})

    def __repr__(self) -> str:
        where = self.unix_path if self._unix else f"{self._host}:{self._port}"
        state = "running" if self.running else "stopped"
        return f"<EmbeddedRedis {where} pid={self.pid} {state}>"

    # ---- lifecycle ---------------------------------------------------------

    def start(self) -> EmbeddedRedis:
        """Launch the server and wait until it answers PING.

        If it was started before and only the process is gone (:meth:`kill`,
        crash), it comes back on the same address with the same data dir.

        Raises:
            EmbeddedRedisError: no binary, the process exited, or no PING reply
                within ``start_timeout`` (the message includes the log tail).
        """
        with self._lock:
            if self.running:
                return self
            self._proc = None
            fresh = self._dir is None
            if self._binary is None:
                self._binary = find_redis_server()
            if fresh:
                self._dir = self._make_dir()
                register(self)
            # A port may only be re-picked while nobody has seen the address yet.
            may_repick = fresh and not self._unix and self._requested_port is None
            attempts = PORT_ATTEMPTS if may_repick else 1
            try:
                for attempt in range(attempts):
                    if not self._unix and (self._port is None or (may_repick and attempt > 0)):
                        self._port = self._requested_port or free_ports(self._host, 1)[0]
                    try:
                        self._launch()
                        return self
                    except AddressInUseError:
                        if attempt + 1 >= attempts:
                            raise
            except BaseException:
                if fresh:
                    self.stop()
                raise
            raise AssertionError("unreachable")  # pragma: no cover

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop only the server process (default SIGKILL, i.e. a crash).

        Port / socket path and data directory are kept, so :meth:`start` brings
        the server back on the same address. No-op if it is not running.
        """
        with self._lock:
            proc = self._proc
            if proc is not None:
                terminate(proc, sig, self._stop_timeout)
                self._proc = None

    def restart(self) -> EmbeddedRedis:
        """Gracefully stop the process (SIGTERM) and start it again on the same
        address and data directory. Starts it if it was never started."""
        with self._lock:
            self.kill(signal.SIGTERM)
            return self.start()

    def stop(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after ``stop_timeout``) and remove
        its temporary data directory. Idempotent."""
        with self._lock:
            proc, self._proc = self._proc, None
            try:
                if proc is not None:
                    terminate(proc, signal.SIGTERM, self._stop_timeout)
            finally:
                if self._dir is not None and self._user_dir is None:
                    shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
                self._port = None
                unregister(self)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedRedis:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)

    # ---- internals ---------------------------------------------------------

    def _make_dir(self) -> str:
        if self._user_dir is not None:
            os.makedirs(self._user_dir, exist_ok=True)
            path = self._user_dir
        else:
            path = tempfile.mkdtemp(prefix=DIR_PREFIX)
            if self._unix and len(os.path.join(path, "redis.sock")) > _UNIX_PATH_MAX:
                shutil.rmtree(path, ignore_errors=True)
                path = tempfile.mkdtemp(prefix=DIR_PREFIX, dir="/tmp")
        if self._unix and len(os.path.join(path, "redis.sock")) > _UNIX_PATH_MAX:
            raise EmbeddedRedisError(f"unix socket path under {path!r} is too long (max {_UNIX_PATH_MAX} chars)")
        return path

    def _base_lines(self) -> list[str]:
        """Directives every embedded process shares: loopback bind, files, listener, logins."""
        assert self._dir is not None
        lines = [
            "# generated by limiter.embedded -- private, loopback-only server",
            f"bind {self._host}",
            "protected-mode yes",
            "daemonize no",
            f"dir {quote_value(self._dir)}",
            f"logfile {quote_value(os.path.join(self._dir, 'redis.log'))}",
        ]
        if self._unix:
            socket_path = quote_value(os.path.join(self._dir, "redis.sock"))
            lines += ["port 0", f"unixsocket {socket_path}", "unixsocketperm 700"]
        else:
            assert self._port is not None
            lines += [conf_line(k, v) for k, v in self._access.listen_lines(self._port)]
        lines += [conf_line(k, v) for k, v in self._access.auth_lines()]
        return lines

    def _config_text(self) -> str:
        # a replica's first sync starts at once instead of waiting 5 s for more replicas
        lines = [*self._base_lines(), 'save ""', "appendonly no", "repl-diskless-sync-delay 0"]
        lines += [conf_line(k, v) for k, v in self._access.replication_lines()]
        if self._replica_of is not None:
            lines.append(f"replicaof {self._replica_of[0]} {self._replica_of[1]}")
        lines += [conf_line(k, v) for k, v in self._extra.items()]
        return "\n".join(lines) + "\n"

    def _conf_path(self) -> str:
        assert self._dir is not None
        return os.path.join(self._dir, "redis.conf")

    def _write_config(self, conf_path: str) -> None:
        """Write the generated configuration (on every launch)."""
        with open(conf_path, "w", encoding="utf-8") as fh:
            fh.write(self._config_text())

    def _argv(self, conf_path: str) -> list[str]:
        assert self._binary is not None
        return [self._binary, conf_path]

    def _launch(self) -> None:
        assert self._dir is not None and self._binary is not None
        os.makedirs(self._dir, exist_ok=True)
        conf_path = self._conf_path()
        self._write_config(conf_path)
        if self._unix:
            try:
                os.unlink(os.path.join(self._dir, "redis.sock"))
            except FileNotFoundError:
                pass
        out_path = os.path.join(self._dir, "redis.stdout.log")
        argv = self._argv(conf_path)
        cwd = self._dir
        parent_pid = os.getpid()

        def popen() -> subprocess.Popen[bytes]:
            with open(out_path, "ab") as out:
                return subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    close_fds=True,
                    start_new_session=True,
                    preexec_fn=make_preexec(parent_pid),
                )

        try:
            self._proc = spawn(popen)
        except OSError as exc:
            raise EmbeddedRedisError(f"could not execute {self._binary!r}: {exc}") from exc
        self._wait_ready(out_path)

    def _log_tails(self, out_path: str) -> str:
        parts = []
        for path in (self.log_path, out_path):
            text = tail(path) if path else ""
            if text:
                parts.append(f"--- {os.path.basename(path or '')} ---\n{text}")
        return "\n".join(parts) or "(no log output)"

    def _wait_ready(self, out_path: str) -> None:
        proc = self._proc
        assert proc is not None
        where = self.unix_path if self._unix else f"{self._host}:{self._port}"
        deadline = self._clock() + self._start_timeout
        client = redis.Redis(
            **self.connection_kwargs(), socket_connect_timeout=0.5, socket_timeout=0.5, retry=no_retry()
        )
        last: BaseException | None = None
        try:
            while True:
                rc = proc.poll()
                if rc is not None:
                    self._proc = None
                    tails = self._log_tails(out_path)
                    cls = AddressInUseError if "Address already in use" in tails else EmbeddedRedisError
                    raise cls(f"redis-server for {where} exited with status {rc} during startup\n{tails}")
                try:
                    if client.ping():
                        return
                except (redis.RedisError, OSError) as exc:
                    last = exc
                # the config is loaded before the port opens: a refused login will not change
                if isinstance(last, redis.AuthenticationError) or self._clock() >= deadline:
                    terminate(proc, signal.SIGKILL, self._stop_timeout)
                    self._proc = None
                    what = (
                        f"refused the launcher's login ({last})"
                        if isinstance(last, redis.AuthenticationError)
                        else f"did not answer PING within {self._start_timeout:g}s (last error: {last!r})"
                    )
                    raise EmbeddedRedisError(f"redis-server for {where} {what}\n{self._log_tails(out_path)}") from last
                time.sleep(_POLL_INTERVAL)
        finally:
            client.close()
