"""Asking a Prometheus: the rollout plans' checks of the protected service's health.

One instant query per check (``GET <url>/api/v1/query``), bounded by
``SHADOWLIMIT_PROMETHEUS_TIMEOUT_S``; the answer is read by the pure
:func:`~control_plane.model.plan_analysis.read_prometheus_answer` (one number, or why there is
none: unreachable, empty, refused). Nothing here decides what the number means.
"""

from __future__ import annotations

from typing import Any

import httpx

from ..model.plan_analysis import PromReading, Verdict, read_prometheus_answer

__all__ = ["PrometheusClient"]


class PrometheusClient:
    """Instant queries to ``default_url`` (``SHADOWLIMIT_PROMETHEUS_URL``) or a check's own URL."""

    def __init__(self, *, default_url: str | None, timeout_s: float, transport: Any = None) -> None:
        self.default_url = default_url
        self._client = httpx.AsyncClient(timeout=timeout_s, transport=transport, follow_redirects=False)

    async def query(self, expr: str, *, url: str | None = None) -> PromReading:
        base = url or self.default_url
        if base is None:
            return PromReading(
                outcome=Verdict.INCONCLUSIVE,
                reason="no Prometheus to ask: set SHADOWLIMIT_PROMETHEUS_URL or the check's url",
            )
        try:
            r = await self._client.get(base.rstrip("/") + "/api/v1/query", params={"query": expr})
        except httpx.HTTPError as exc:
            return read_prometheus_answer(None, None, error=f"{type(exc).__name__}: {exc}".rstrip(": "))
        try:
            body = r.json()
        except ValueError:
            body = None
        return read_prometheus_answer(r.status_code, body)

    async def aclose(self) -> None:
        await self._client.aclose()
