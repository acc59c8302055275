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
from .settings import Settings, SettingsError

__all__ = ["NO_REDIS_URL", "EngineHandle", "open_engine"]

#: why a control plane without a Redis URL does not start
NO_REDIS_URL = (
    "RATE_LIMIT_REDIS_URL is not set: every replica must share one Redis (e.g. redis://10.0.0.5:6379/0). "
    "For development only, --embedded-redis (SHADOWLIMIT_EMBEDDED_REDIS=true) starts a private redis-server "
    "for this process -- each process then has its own 'global' limit."
)

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
    """Connect to Redis (RATE_LIMIT_REDIS_URL; a private embedded one only when the
    development setting SHADOWLIMIT_EMBEDDED_REDIS asks for it), build the engine and
    start its background work."""
    embedded = None
    url = settings.redis_url
    if url is None:
        if not settings.embedded_redis:
            raise SettingsError(NO_REDIS_URL)
        from limiter.embedded import EmbeddedRedis

        embedded = EmbeddedRedis().start()
        url = embedded.url
        log.warning(
            "development mode (--embedded-redis): started a private redis-server at %s; this process's 'global' limit is its own",
            url,
        )
    redis = RedisLimiter.from_url(
        url,
        namespace=settings.namespace,
        time_source=settings.time_source,  # type: ignore[arg-type]
        connect_timeout=settings.redis_connect_timeout_s,
        command_timeout=settings.redis_command_timeout_s,
    )
    client = make_redis_py_client(
        url,
        socket_timeout=max(1.0, settings.redis_command_timeout_s * 4),
        connect_timeout=settings.redis_connect_timeout_s,
    )
    engine = Engine(settings, redis=redis, client=client, metrics=metrics or Metrics())
    handle = EngineHandle(engine, redis, client, url, embedded)
    try:
        await engine.start()
    except BaseException:
        await handle.aclose()
        raise
    return handle
