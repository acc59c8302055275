"""``GET /v1/stream``: Server-Sent Events, snapshots at a steady rate plus events as they happen."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from limiter.errors import BackendError

from ..engine import Engine
from ..store import StoreUnavailable
from .deps import EngineDep
from .observe import buckets_view, divergence_view
from .routes import route_views

router = APIRouter(prefix="/v1", tags=["stream"])


async def snapshot(engine: Engine, route: str | None, minutes: int) -> dict[str, Any]:
    snap: dict[str, Any] = {"at": time.time(), "instance_id": engine.instance_id, "backend": engine.backend_snapshot()}
    snap["routes"] = await route_views(engine)
    try:
        snap["divergence"] = await divergence_view(engine, minutes)
    except (StoreUnavailable, BackendError) as exc:
        snap["divergence"] = None
        snap["divergence_error"] = str(exc)
    try:
        view = await asyncio.wait_for(buckets_view(engine, route if route and engine.rules.get(route) else None, 20), timeout=1.5)
        snap["buckets"] = view["buckets"]
    except Exception as exc:  # noqa: BLE001 - a snapshot must always go out
        snap["buckets"] = []
        snap["buckets_error"] = str(exc) or type(exc).__name__
    snap["external"] = engine.external.snapshot(limit=50)
    snap["events"] = engine.events.recent(30)
    return snap


def _sse(event: str, data: Any, event_id: int | None = None) -> bytes:
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return (head + "data: " + json.dumps(data, separators=(",", ":"), default=str) + "\n\n").encode()


@router.get("/stream")
async def stream(request: Request, engine: EngineDep, route: str | None = Query(None, max_length=64), minutes: int = Query(30, ge=1, le=120), interval: float | None = Query(None, ge=0.2, le=60)) -> StreamingResponse:
    """A ``snapshot`` event every interval (routes, buckets, divergence, backend, external
    limits) and ``event`` events (mode changes, breaker transitions, rules reloads) as they
    happen."""
    period = interval or engine.settings.stream_interval_s
    queue = engine.events.subscribe()

    async def gen() -> AsyncIterator[bytes]:
        try:
            yield b"retry: 1000\n\n"
            yield _sse("snapshot", await snapshot(engine, route, minutes))
            next_at = time.monotonic() + period
            while not await request.is_disconnected():
                timeout = max(0.0, next_at - time.monotonic())
                try:
                    ev = await asyncio.wait_for(queue.get(), timeout)
                    yield _sse("event", ev, ev.get("seq"))
                except asyncio.TimeoutError:
                    yield _sse("snapshot", await snapshot(engine, route, minutes))
                    next_at = time.monotonic() + period
        finally:
            engine.events.unsubscribe(queue)

    return StreamingResponse(gen(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
