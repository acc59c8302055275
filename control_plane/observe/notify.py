"""Notifications of the rollout plans: a JSON POST to ``SHADOWLIMIT_NOTIFY_URL`` at each step,
failure, pause and approval needed.

The body has a ``text`` field, so a Slack or Mattermost incoming webhook takes it as it is, and
the same facts as fields under ``shadowlimit`` (route, event, step, reason) for anything else.
Sending never holds up the plan: :meth:`Notifier.send` queues (a full queue drops the
notification, counted), a background task delivers, trying a failed delivery (an error, a
status other than 2xx) again after 1 s and 2 s; ``rate_limit_notifications_total{result}``
counts ``sent``, ``retried``, ``failed`` (given up) and ``dropped``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from .metrics import Metrics

__all__ = ["Notifier"]

log = logging.getLogger("shadowlimit.notify")


class Notifier:
    """Queued, retried webhook deliveries (see the module docstring)."""

    def __init__(
        self,
        url: str | None,
        metrics: Metrics,
        *,
        attempts: int = 3,
        backoff_s: float = 1.0,
        queue_size: int = 100,
        timeout_s: float = 5.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        transport: Any = None,
    ) -> None:
        self.url = url
        self.metrics = metrics
        self.attempts = attempts
        self.backoff_s = backoff_s
        self._queue: deque[dict[str, Any]] = deque(maxlen=None)
        self._size = queue_size
        self._ready = asyncio.Event()
        self._sleep = sleep
        self._client = httpx.AsyncClient(timeout=timeout_s, transport=transport, follow_redirects=False)

    @property
    def enabled(self) -> bool:
        return self.url is not None

    def send(self, text: str, **fields: Any) -> None:
        """Queue a notification (nothing when no URL is set); never waits."""
        if self.url is None:
            return
        if len(self._queue) >= self._size:
            self.metrics.notifications.labels("dropped").inc()
            log.warning("notification dropped (queue full): %s", text)
            return
        self._queue.append({"text": text, "shadowlimit": fields})
        self._ready.set()

    def __len__(self) -> int:
        return len(self._queue)

    async def run(self) -> None:
        """Deliver what is queued, one at a time, until cancelled."""
        while True:
            await self._ready.wait()
            while self._queue:
                await self.deliver(self._queue.popleft())
            self._ready.clear()

    async def deliver(self, body: dict[str, Any]) -> bool:
        """POST one notification, trying again after ``backoff_s``, twice that, ...; True once sent."""
        assert self.url is not None
        for attempt in range(self.attempts):
            if attempt:
                self.metrics.notifications.labels("retried").inc()
                await self._sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                r = await self._client.post(self.url, json=body)
                if 200 <= r.status_code < 300:
                    self.metrics.notifications.labels("sent").inc()
                    return True
                why = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
            log.info("notification not delivered (attempt %d of %d): %s", attempt + 1, self.attempts, why)
        self.metrics.notifications.labels("failed").inc()
        log.warning("notification given up after %d attempts: %s", self.attempts, body.get("text"))
        return False

    async def aclose(self) -> None:
        await self._client.aclose()
