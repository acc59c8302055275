"""Reading configuration files away from the event loop, for the hot reloads.

The event loop answers Envoy's calls (20 ms deadlines) and the API; reading a big file
must not hold it. A thread is not enough: parsing is Python code that holds the GIL, and
the loop would wait up to 5 ms (the interpreter's switch interval) each time it wakes. So:

- files of at most :data:`SMALL_BYTES` in all are read in a thread (a few ms of work);
- bigger ones in a child process (:func:`main`, a fresh interpreter at a lower CPU
  priority, :data:`NICE`), which reads the files itself (:class:`Changed` if they are no
  longer what the parent read: the caller reads them again) within :data:`TIMEOUT_S`
  seconds of CPU and :data:`MEMORY_BYTES` of memory (past them it stops and the file is
  refused, named), and sends back what it read as plain data, in frames;
- the parent builds the routes of that data in steps of at most :data:`SLICE_S` seconds,
  yielding to the loop between them (:func:`run_steps`).

A refused file is a :class:`~control_plane.rules.errors.RulesError` naming the file and
the line, as when it is read in-process. The result is the same object the in-process
function returns (:func:`~control_plane.rules.load.rules_from_bytes`); swapping it in is the
caller's single assignment. Cancelling the coroutine (a newer version of the file arrived)
kills the child. The child runs the function the request names (``serve``, pickled by
reference): the rules file's here, the Envoy configuration's in
:mod:`control_plane.envoy.offload`, which builds on :func:`in_child` and the steps here (the
rules do not know Envoy: it is above them).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import os
import pickle
import select
import shutil
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from .errors import RulesError
from .yaml_source import gc_paused, read_file

if TYPE_CHECKING:
    from ..settings import Settings
    from .model import Rules

__all__ = [
    "FRAME_RECORDS",
    "MEMORY_BYTES",
    "PAUSE_S",
    "SLICE_S",
    "SMALL_BYTES",
    "SUPERSEDED",
    "TIMEOUT_S",
    "WALL_TIMEOUT_S",
    "Changed",
    "ChildProcess",
    "breathe",
    "cancelled_if_changed",
    "in_child",
    "keep_out_of_collections",
    "parse_rules_offloaded",
    "pickled",
    "release_steps",
    "retire",
    "run_steps",
]

SMALL_BYTES = 64 * 1024
"""Files up to this size in all are read in a thread; bigger ones in a child process."""
TIMEOUT_S = 30.0
"""The most CPU time a child may spend reading a configuration: it stops past it (the
kernel's ``RLIMIT_CPU``), the file refused. CPU time, not time: a child waiting for a core
(it runs at a lower priority than the control plane) is not refused for that."""
WALL_TIMEOUT_S = 300.0
"""The longest a child may take, waiting included: it is killed past it, the file refused."""
MEMORY_BYTES = 1024 * 1024 * 1024
"""The most memory (address space) a child may add to what it holds once started."""
SLICE_S = 0.002
"""The longest the event loop builds routes before it answers calls again."""
PAUSE_S = 0.0005
"""How long it then waits: a real wait (not just a turn of the loop) lets the threads that
need the GIL to deliver calls to the loop (gRPC's) take it at once instead of after the
interpreter's 5 ms switch interval."""
TURNS = 4
"""The turns of the loop given after a pause, before the next slice: a gRPC call's answer
takes a few callbacks, each scheduled by the one before; they all run between two slices."""
NICE = 19
"""How much the child lowers its CPU priority (``nice``): when both want a core, the
control plane gets it (the child's share is 1.5%); the child's bound is CPU time, so it is
never refused for waiting."""
FRAME_RECORDS = 1_000
"""Descriptor records per frame sent by the child: unpickled in well under 1 ms."""
FRAME_ROUTES = 40
"""Routes (of a rules file) per frame: built again, and checked, in about 1 ms."""

T = TypeVar("T")
# the child's priority is lowered before it starts (nice), else first thing; then it reads the request
_CHILD = "import sys; from control_plane.rules.offload import main; sys.exit(main())"
_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # where control_plane is, for the child
_NICE_BIN = shutil.which("nice")


async def breathe(pause_s: float = PAUSE_S) -> None:
    """Between two slices of work: ``pause_s`` of real wait, then :data:`TURNS` turns of the
    loop, so that what waits (a call's chain of callbacks) completes before the next slice."""
    await asyncio.sleep(pause_s)
    for _ in range(TURNS):
        await asyncio.sleep(0)


async def run_steps(steps: Generator[Any, None, T], slice_s: float = SLICE_S) -> T:
    """Run a generator of steps on the event loop, pausing :data:`PAUSE_S` every ``slice_s``
    seconds of work."""
    start = time.perf_counter()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            value: T = done.value
            return value
        if time.perf_counter() - start >= slice_s:
            await breathe()
            start = time.perf_counter()


SUPERSEDED = object()
"""What a watcher's load returns when a newer version of the file cancelled it."""


async def cancelled_if_changed(parse: asyncio.Future[Any], changed: Callable[[], bool], poll_s: float) -> bool:
    """Wait for ``parse`` to finish; but when ``changed()`` (asked in a thread every
    ``poll_s`` seconds) says a newer version of the file arrived, cancel it (killing its
    child) and return True: the newest version is read next, never a pile of them."""
    try:
        while not parse.done():
            await asyncio.wait([parse], timeout=poll_s)
            if not parse.done() and await asyncio.to_thread(changed):
                parse.cancel()
                with contextlib.suppress(asyncio.CancelledError, RulesError, Changed):
                    await parse
                return True
        return False
    except asyncio.CancelledError:
        parse.cancel()
        raise


# -- what the parent calls ------------------------------------------------------------------


async def parse_rules_offloaded(
    data: bytes, settings: Settings, source: str, *, digest: str, clock: Callable[[], float] = time.time
) -> Rules:
    """:func:`~control_plane.rules.load.rules_from_bytes`, without holding the loop."""
    from .load import rules_from_bytes
    from .model import Rules

    if len(data) <= SMALL_BYTES:
        return await asyncio.to_thread(rules_from_bytes, data, settings, source, digest=digest, clock=clock)
    frames = await in_child({"serve": _serve_rules, "sources": [source], "digest": digest, "settings": settings})
    with gc_paused():
        default, loaded_at = pickle.loads(frames[0])
        routes: list[Any] = []
        for chunk in frames[1:]:
            routes.extend(pickle.loads(chunk))  # the routes are built (and checked) here, a frame at a time
            await breathe()
        base = Rules(routes=(), default=default, source=source, loaded_at=loaded_at, digest=digest)
        rules: Rules = await run_steps(base.with_routes_steps(tuple(routes), digest))
        keep_out_of_collections()
    return rules


def release_steps(items: list[Any], step: int = 1_000) -> Generator[None, None, None]:
    """Drop the items of a list ``step`` at a time, from the end (children before parents)."""
    while items:
        del items[-step:]
        yield


async def retire(*configs: Any) -> None:
    """Free replaced configurations (:class:`Rules`, :class:`EnvoyConfig`) a step at a time.

    Freeing 50,000 routes at once (when the last reference goes) stops the loop for
    25 ms. This takes the references it is given (the caller keeps none), holds every
    route and descriptor node itself, lets the containers go, waits until nobody else
    holds the configurations (a call in flight may), then drops its holds a step at a time."""
    parts: list[Any] = []
    alive: list[weakref.ref[Any]] = []
    config = None
    for config in configs:
        if config is None:
            continue
        parts.extend(config.routes)
        todo = list(getattr(config, "domains", {}).values())
        while todo:
            node = todo.pop()
            parts.append(node)
            todo.extend(node.children.values())
            if len(parts) % 1_000 == 0:
                await breathe()
        alive.append(weakref.ref(config))
    del configs, config
    deadline = time.monotonic() + 60.0  # held that long: not by a call in flight, let go anyway
    while any(ref() is not None for ref in alive) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await run_steps(release_steps(parts))


def keep_out_of_collections() -> None:
    """With the control plane's collector tuning (control_plane/gctune.py), the new
    routes join what was frozen at startup: full collections never walk them (a walk of
    a few hundred thousand objects would stop the loop for tens of ms, again and again).
    They are freed as usual once replaced (they hold no reference cycles)."""
    from ..gctune import tunings_in_effect

    if tunings_in_effect():
        gc.freeze()


async def in_child(request: dict[str, Any]) -> list[Any]:
    """The frames a child sends for ``request`` (a RulesError if it refused the file, ran
    out of time or memory, or died; :class:`Changed` if the files changed).

    The child is started and talked to from a thread: ``subprocess`` starts it with
    ``vfork`` (the event loop's own way, libuv's ``fork`` under uvloop, copies the page
    tables of the whole control plane first: 5 to 10 ms of the loop for every reload)."""
    request["memory"], request["cpu"] = MEMORY_BYTES, TIMEOUT_S
    child = ChildProcess(request)
    try:
        return await asyncio.to_thread(child.run)
    finally:
        child.kill()  # cancelled, or done: never left behind


class ChildProcess:
    """One child process and the frames it sends (blocking: run in a thread)."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.current = request["sources"][0] if request["sources"] else ""  # the file being read (the child says)
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()
        self.killed = False

    def kill(self) -> None:
        with self.lock:
            self.killed = True
            if self.proc is not None and self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()

    def run(self) -> list[Any]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
        niced = [_NICE_BIN, "-n", str(NICE)] if _NICE_BIN else []  # from its very start (else first thing)
        with self.lock:
            if self.killed:
                raise asyncio.CancelledError
            self.proc = proc = subprocess.Popen(
                [*niced, sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
            )
        try:
            return self._talk(proc, time.monotonic() + WALL_TIMEOUT_S)
        finally:
            self.kill()
            proc.wait()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.close()
            proc.stdout.close()

    def _talk(self, proc: subprocess.Popen[bytes], deadline: float) -> list[Any]:
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(BrokenPipeError):  # it died: said below
            proc.stdin.write(_frame(self.request))
            proc.stdin.close()
        fd = proc.stdout.fileno()
        frames: list[Any] = []
        while True:
            size = int.from_bytes(self._read(proc, fd, 8, deadline), "big")
            kind, payload = pickle.loads(self._read(proc, fd, size, deadline))
            if kind == "file":
                self.current = payload
            elif kind == "frame":
                frames.append(payload)  # unpickled by the caller, one frame between two yields
            elif kind == "error":
                raise payload
            elif kind == "changed":
                raise Changed(payload)
            else:  # "end"
                return frames

    def _read(self, proc: subprocess.Popen[bytes], fd: int, n: int, deadline: float) -> bytes:
        """Exactly ``n`` bytes from the child (a RulesError when it ends first or the time is up)."""
        chunks, left = [], n
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                self.kill()
                raise RulesError(
                    f"reading the configuration took longer than {WALL_TIMEOUT_S:.0f} s: refused",
                    path=self.current or None,
                )
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                if self.killed:
                    raise asyncio.CancelledError
                code = proc.wait()
                how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
                raise RulesError(f"the process reading the configuration {how}", path=self.current or None)
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


# -- the child --------------------------------------------------------------------------------


def pickled(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(8, "big") + data


class _OutOfTime(Exception):
    pass


def _on_sigxcpu(signum: int, frame: Any) -> None:
    raise _OutOfTime


def _limit(memory: int, cpu: float) -> None:
    """At most ``memory`` bytes more address space than the child holds now (Linux), and
    ``cpu`` seconds of CPU (then SIGXCPU: :class:`_OutOfTime`; the kernel kills it 5 s later)."""
    try:
        import resource
        import signal

        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime + cpu + 0.999)
        signal.signal(signal.SIGXCPU, _on_sigxcpu)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 5))
        with open("/proc/self/statm") as f:
            now = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (now + memory, hard))  # the soft limit, raised again to report
    except (ImportError, OSError, ValueError, AttributeError):  # not Linux: the parent's wall-clock bound holds
        pass


def _unlimit_memory() -> None:
    """Room to report running out of memory (the soft limit back to the hard one)."""
    with contextlib.suppress(ImportError, OSError, ValueError):
        import resource

        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def _serve(request: dict[str, Any], send: Callable[[str, Any], None]) -> None:
    """Read the files the request names (as the parent read them: else ``changed``) and let
    the request's ``serve`` function (the rules', or the Envoy configuration's:
    :func:`control_plane.envoy.offload.serve_in_child`) send back what they hold, in frames."""
    try:
        files = [(source, read_file(Path(source))) for source in request["sources"]]
    except RulesError as err:
        return send("changed", str(err))
    request["serve"](files, request, send)
    return None


def _serve_rules(files: list[tuple[str, bytes]], request: dict[str, Any], send: Callable[[str, Any], None]) -> None:
    from .load import rules_from_bytes

    ((source, data),) = files
    digest = request["digest"]
    if hashlib.sha256(data).hexdigest() != digest:
        return send("changed", "the file changed since the parent read it")
    rules = rules_from_bytes(data, request["settings"], source, digest=digest)
    send("frame", pickled((rules.default, rules.loaded_at)))
    for i in range(0, len(rules.routes), FRAME_ROUTES):
        send("frame", pickled(rules.routes[i : i + FRAME_ROUTES]))
    return None


def main(stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> int:
    """The child: one request on stdin, its frames on stdout."""
    if not _NICE_BIN:
        with contextlib.suppress(OSError):
            os.nice(NICE)
    stdin = stdin or sys.stdin.buffer
    out = stdout or sys.stdout.buffer
    size = int.from_bytes(stdin.read(8), "big")
    request = pickle.loads(stdin.read(size))
    gc.disable()  # a short-lived process: the collector would only walk the growing data again and again
    current = [request["sources"][0] if request["sources"] else ""]

    def send(kind: str, payload: Any) -> None:
        if kind == "file":
            current[0] = payload
        out.write(_frame((kind, payload)))
        out.flush()

    _limit(request["memory"], request["cpu"])
    out_of_memory = False
    try:
        _serve(request, send)
    except RulesError as err:
        send("error", err)
    except _OutOfTime:
        cpu = request["cpu"]
        send(
            "error", RulesError(f"reading the configuration took more than {cpu:g} s of CPU: refused", path=current[0])
        )
    except MemoryError as exc:
        exc.__traceback__ = exc.__context__ = None  # the frames, and the data they hold, go
        del exc
        out_of_memory = True
    except Exception:  # noqa: BLE001 - said to the parent, as a refusal
        last = traceback.format_exc().strip().splitlines()[-1]
        send("error", RulesError(f"the configuration could not be read: {last}", path=current[0]))
    if out_of_memory:
        _unlimit_memory()
        mb = request["memory"] // (1024 * 1024)
        send("error", RulesError(f"reading the configuration needs more than {mb} MB: refused", path=current[0]))
    send("end", None)
    return 0


class Changed(Exception):
    """The files changed between the parent's read and the child's: read them again."""
