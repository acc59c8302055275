"""``GET /v1/stream``: Server-Sent Events, snapshots at a steady rate plus events as they happen.

Snapshots are shared: subscribers asking for the same view (route filter, minutes) get
the same bytes, built and encoded once per interval by the app's :class:`Streams`. Events
carry SSE ids (``<boot>-<seq>``); a client that reconnects with ``Last-Event-ID`` first
gets the events it missed (see :meth:`control_plane.observe.events.EventHub.replay`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from limiter.errors import BackendError

from ..engine import Engine
from ..observe.snapshots import SnapshotCache, StreamSlots
from ..settings import env_name
from ..store import StoreUnavailable
from . import examples
from .deps import EngineDep
from .openapi import RETRY_AFTER, errors
from .readmodels import Buckets, buckets_view, divergence_view, route_views

__all__ = ["Streams", "router", "snapshot"]

router = APIRouter(prefix="/v1", tags=["stream"])

#: what a refused subscriber is told to wait before trying again (seconds)
RETRY_AFTER_S = 5


async def snapshot(engine: Engine, route: str | None, minutes: int) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "at": engine.clock(),
        "instance_id": engine.instance_id,
        "backend": engine.backend_snapshot(),
    }
    rules = engine.rules
    snap["routes"] = await route_views(
        rules, engine.rollout, engine.activity, engine.views, engine.metrics.deadline_counts(), engine.plans
    )
    try:
        snap["divergence"] = await divergence_view(
            rules, engine.views, minutes, engine.adjustments.candidates, engine.rollout
        )
    except (StoreUnavailable, BackendError) as exc:
        snap["divergence"] = None
        snap["divergence_error"] = str(exc)
    buckets = Buckets(
        engine.activity,
        engine.adjustments,
        engine.local,
        engine.redis,
        engine.breaker,
        clock_us=engine.decider.clock_us,
    )
    try:
        view = await asyncio.wait_for(
            buckets_view(rules, buckets, route if route and rules.get(route) else None, 20), timeout=1.5
        )
        snap["buckets"] = view["buckets"]
    except Exception as exc:  # noqa: BLE001 - a snapshot must always go out
        snap["buckets"] = []
        snap["buckets_error"] = str(exc) or type(exc).__name__
    snap["external"] = engine.external.snapshot(limit=50)
    snap["events"] = engine.events.recent(30)
    return snap


def _sse(event: str, data: Any, event_id: str | None = None) -> bytes:
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return (head + "data: " + json.dumps(data, separators=(",", ":"), default=str) + "\n\n").encode()


class Streams:
    """What the stream endpoint shares across subscribers: one :class:`SnapshotCache`
    (snapshots carry no SSE id, so they never move a client's ``Last-Event-ID``) and the
    subscriber slots (``SHADOWLIMIT_MAX_STREAMS``). One per app, built in its lifespan."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        metrics = engine.metrics
        self.cache = SnapshotCache(
            self._build, version=lambda: engine.events.last_seq, on_build=metrics.stream_snapshot_builds.labels().inc
        )
        self.slots = StreamSlots(engine.settings.max_streams)
        self._subscribers = metrics.stream_subscribers.labels()
        self._refused = metrics.stream_refused.labels()

    async def _build(self, view: Hashable) -> bytes:
        route: str | None = view[0]  # type: ignore[index]
        minutes: int = view[1]  # type: ignore[index]
        return _sse("snapshot", await snapshot(self.engine, route, minutes))

    async def snapshot(self, route: str | None, minutes: int, max_age: float, after_seq: int = 0) -> bytes:
        """The encoded ``snapshot`` event of this view, at most ``max_age`` seconds old and
        built after event ``after_seq`` (the last one sent to the subscriber asking)."""
        # buckets of an unknown route are those of every route: one view, not one per name
        view = (route if route and self.engine.rules.get(route) else None, minutes)
        return await self.cache.get(view, max_age, min_version=after_seq)

    async def aclose(self) -> None:
        await self.cache.aclose()

    def open(self) -> bool:
        """Take a subscriber slot (False: all taken)."""
        ok = self.slots.acquire()
        if not ok:
            self._refused.inc()
        self._subscribers.set(self.slots.active)
        return ok

    def close(self) -> None:
        self.slots.release()
        self._subscribers.set(self.slots.active)


async def get_streams(request: Request) -> Streams:
    return request.app.state.streams  # type: ignore[no-any-return]


StreamsDep = Annotated[Streams, Depends(get_streams)]


class _Stream(StreamingResponse):
    """A streaming response that runs ``on_close`` once the response is over, however it
    ends (finished, client gone, or never started)."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def _too_many(limit: int) -> JSONResponse:
    body = {
        "error": "too_many_streams",
        "message": f"this replica already serves {limit} event streams ({env_name('max_streams')}); "
        "retry later or use another replica",
        "limit": limit,
    }
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})


class EventStream(StreamingResponse):
    """For OpenAPI: the stream's media type (the handler builds its own response)."""

    media_type = "text/event-stream"


_RESPONSES: dict[int | str, Any] = {
    200: {
        "description": "Server-Sent Events: `snapshot` (no id) every interval, `event` (with an id) as things"
        " happen, `gap` when Last-Event-ID cannot be placed. Each `data:` line is one JSON object.",
        "content": {"text/event-stream": {"schema": {"type": "string"}, "example": examples.STREAM}},
    },
    **errors(422),
    503: {
        **errors(503)[503],
        "description": "too_many_streams: the replica already serves SHADOWLIMIT_MAX_STREAMS streams.",
        "headers": RETRY_AFTER,
        "content": {
            "application/json": {
                "schema": {"$ref": "#/components/schemas/ErrorBody"},
                "example": {
                    "error": "too_many_streams",
                    "message": "this replica already serves 64 event streams (SHADOWLIMIT_MAX_STREAMS);"
                    " retry later or use another replica",
                    "limit": 64,
                },
            }
        },
    },
}


@router.get("/stream", response_model=None, response_class=EventStream, responses=_RESPONSES)
async def stream(
    request: Request,
    engine: EngineDep,
    streams: StreamsDep,
    *,
    route: str | None = Query(None, max_length=256),
    minutes: int = Query(30, ge=1, le=120),
    interval: float | None = Query(
        None,
        gt=0,
        le=60,
        description="Seconds between snapshots; at least SHADOWLIMIT_STREAM_MIN_INTERVAL_S (smaller: 422).",
    ),
    last_event_id: str | None = Header(
        None,
        alias="Last-Event-ID",
        max_length=256,
        description="The id of the last event received: the events after it are sent first.",
    ),
) -> StreamingResponse | JSONResponse:
    """A ``snapshot`` event every interval (routes, buckets, divergence, backend, external
    limits) and ``event`` events (mode changes, breaker transitions, rules reloads) as they
    happen, each with an SSE id. With ``Last-Event-ID``, the events after that id come first
    (after a ``gap`` event when the id cannot be placed). 503 ``too_many_streams`` when the
    replica already serves ``SHADOWLIMIT_MAX_STREAMS`` streams."""
    settings = engine.settings
    floor = settings.stream_min_interval_s
    if interval is not None and interval < floor:
        msg = f"Input should be greater than or equal to {floor:g} ({env_name('stream_min_interval_s')})"
        raise RequestValidationError(
            [{"loc": ("query", "interval"), "msg": msg, "type": "greater_than_equal", "input": interval}]
        )
    period = interval if interval is not None else max(settings.stream_interval_s, floor)
    if not streams.open():
        return _too_many(streams.slots.limit)
    # subscribe and replay with no await between: nothing missed, nothing sent twice
    queue = engine.events.subscribe()
    backlog, gap = engine.events.replay(last_event_id) if last_event_id else ([], None)  # empty: none (as EventSource)
    # a snapshot never shows a state older than the events of before this stream or sent on it
    seen = engine.events.last_seq

    def close() -> None:
        engine.events.unsubscribe(queue)
        streams.close()

    async def gen() -> AsyncIterator[bytes]:
        yield b"retry: 1000\n\n"
        if gap is not None:
            yield _sse("gap", gap.to_dict(len(backlog)))
        sent = seen
        for ev in backlog:
            yield _sse("event", ev, ev["id"])
        yield await streams.snapshot(route, minutes, period, sent)
        next_at = time.monotonic() + period
        while not await request.is_disconnected():
            timeout = max(0.0, next_at - time.monotonic())
            try:
                ev = await asyncio.wait_for(queue.get(), timeout)
                sent = ev["seq"]
                yield _sse("event", ev, ev["id"])
            except TimeoutError:
                yield await streams.snapshot(route, minutes, period, sent)
                next_at = time.monotonic() + period

    return _Stream(
        gen(), close, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
