"""Waiting in tests: on a condition with a bound, or on the engine's own flushes -- never a
fixed sleep that hopes the system got there.

``eventually(predicate, timeout)`` polls until ``predicate()`` is truthy (and returns it) or
fails naming what it waited for and the last value; ``settle(engine)`` makes an engine's
buffered work visible at once (shadow evaluations, counter deltas, fleet views), so a test
that checks that *nothing* was counted can say so without waiting out a flush interval.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["aeventually", "eventually", "installed_binary", "run_in_loop", "settle"]

T = TypeVar("T")


def eventually(fn: Callable[[], T], timeout: float, interval: float = 0.05, what: str = "condition") -> T:
    """Call ``fn`` until it returns something truthy (returned) or ``timeout`` passes
    (AssertionError naming ``what`` and the last value / exception)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = fn()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - reported if the wait times out
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


async def aeventually(fn: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = "condition") -> Any:
    """:func:`eventually` for a coroutine test (``fn`` may be sync or return an awaitable)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = fn()
            if isinstance(last, Awaitable):
                last = await last
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - reported if the wait times out
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(interval)


def run_in_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
    """Run ``fn()`` on ``loop`` (a server's, in another thread) and wait for its result."""
    fut: Future[T] = asyncio.run_coroutine_threadsafe(fn(), loop)  # type: ignore[arg-type]
    return fut.result(timeout)


async def settle(engine: Any) -> None:
    """Evaluate the queued shadow work, write the counter deltas, refresh the fleet views."""
    await engine.shadow.drain()
    await engine.flush()
    await engine.views.refresh()


def installed_binary(name: str, package: str | None = None) -> str:
    """The path of the program ``name`` (on PATH, else in /usr/sbin): a test that needs a
    tool that is absent fails naming the Debian package to install, it never skips."""
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None)
    assert path, f"{name} is not installed: apt-get install {package or name} (.ci/run and ./dev test install it)"
    return path
