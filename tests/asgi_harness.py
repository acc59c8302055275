"""Driving an ASGI app with the middleware in tests: its lifespan by hand (httpx's
ASGITransport does not), the middleware found in the app's stack, a route's mode changed in
Redis the way another control plane would, and the app served by a real uvicorn on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from control_plane.middleware import ShadowLimitMiddleware
from control_plane.model.rollout import AuditEntry, Mode, RouteState
from control_plane.store import RolloutStore
from limiter.redis_limiter import make_redis_py_client

__all__ = ["lifespan", "middleware_of", "serve", "set_mode"]


async def lifespan(app: Any) -> Callable[[], Awaitable[None]]:
    """Start ``app``'s lifespan; the coroutine function returned shuts it down."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await queue.put({"type": "lifespan.startup"})

    async def receive() -> dict[str, Any]:
        return await queue.get()

    async def send(msg: dict[str, Any]) -> None:
        await sent.put(msg)

    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send))
    assert (await asyncio.wait_for(sent.get(), 10))["type"] == "lifespan.startup.complete"

    async def stop() -> None:
        await queue.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(sent.get(), 10)
        await task

    return stop


def middleware_of(app: Any) -> ShadowLimitMiddleware:
    """The middleware in a started Starlette/FastAPI app's stack."""
    mw = app.middleware_stack
    while not isinstance(mw, ShadowLimitMiddleware):
        mw = mw.app
    return mw


async def set_mode(redis_url: str, namespace: str, route: str, mode: Mode, *, follower: Any = None) -> None:
    """Put ``route`` in ``mode`` in Redis as a control plane elsewhere would; with ``follower``
    (an engine), wait (at most 2 s) until it follows."""
    client = make_redis_py_client(redis_url)
    try:
        store = RolloutStore(client, namespace)
        old = await store.get(route)
        new = RouteState(mode=mode, updated_by="elsewhere", reason="test", version=1)
        entry = AuditEntry(
            route=route,
            actor="elsewhere",
            from_mode="shadow" if old is None else old.mode.value,
            to_mode=mode.value,
            reason="test",
            at=time.time(),
        )
        await store.change(route, new, entry, expected_version=None)
    finally:
        await client.aclose()
    if follower is not None:
        deadline = time.monotonic() + 2.0
        while follower.rollout.state_for(route).mode is not mode:
            assert time.monotonic() < deadline, f"the engine did not follow {route} to {mode.value} within 2 s"
            await asyncio.sleep(0.02)


@asynccontextmanager
async def serve(app: Any) -> AsyncIterator[int]:
    """``app`` served by uvicorn (httptools, its lifespan on) on a loopback port it picks;
    yields the port."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning", http="httptools")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 10.0
    while not server.started:
        assert not task.done(), "uvicorn stopped before it started"
        assert time.monotonic() < deadline, "uvicorn did not start within 10 s"
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
