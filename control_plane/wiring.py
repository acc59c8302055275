"""The one place that builds an engine from settings (used by the app and the middleware)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from limiter import RedisLimiter
from limiter.redis_limiter import make_redis_py_client

from .engine import Engine
from .metrics import Metrics
from .settings import Settings

__all__ = ["EngineHandle", "open_engine"]

log = logging.getLogger("shadowlimit.wiring")


@dataclass
class EngineHandle:
    """A started engine and what must be closed with it."""

    engine: Engine
    redis: RedisLimiter
    client: Any
    url: str
    embedded: Any = None

    async def aclose(self) -> None:
        await self.engine.stop()
        await self.redis.aclose()
        with contextlib.suppress(Exception):
            await self.client.aclose()
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None


async def open_engine(settings: Settings, *, metrics: Metrics | None = None) -> EngineHandle:
    """Connect to Redis (or start an embedded one when RATE_LIMIT_REDIS_URL is unset),
    build the engine and start its background work."""
    embedded = None
    url = settings.redis_url
    if url is None:
        from limiter.embedded import EmbeddedRedis

        embedded = EmbeddedRedis().start()
        url = embedded.url
        log.warning("RATE_LIMIT_REDIS_URL is not set: started an embedded redis-server at %s", url)
    redis = RedisLimiter.from_url(
        url,
        namespace=settings.namespace,
        time_source=settings.time_source,  # type: ignore[arg-type]
        connect_timeout=settings.redis_connect_timeout_s,
        command_timeout=settings.redis_command_timeout_s,
    )
    client = make_redis_py_client(url, socket_timeout=max(1.0, settings.redis_command_timeout_s * 4), connect_timeout=settings.redis_connect_timeout_s)
    engine = Engine(settings, redis=redis, client=client, metrics=metrics or Metrics())
    handle = EngineHandle(engine, redis, client, url, embedded)
    try:
        await engine.start()
    except BaseException:
        await handle.aclose()
        raise
    return handle
