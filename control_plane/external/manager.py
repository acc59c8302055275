"""The engine's entry point to external limits (:class:`ExternalManager`): the resolvers of
the current rules, what they share (HTTP client, Redis cache, background tasks), and the
counters, metrics, events and read model of ``GET /v1/external``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import httpx

from limiter.breaker import BreakerState
from limiter.policy import Algorithm

from .breakers import KeyBreaker
from .config import BackendHosts, ExternalConfig
from .resolver import SOURCES, ExternalResolver, Resolution

__all__ = ["ExternalManager"]

log = logging.getLogger("shadowlimit.external")

_EVENTS_PER_SECOND = 20  # breaker events published at most; a dead service must not flood the stream
_REJECTED_LOGGED = 100  # distinct backend_url rejections logged at most


class ExternalManager:
    """The resolvers of the current rules and what they share.

    ``client`` is the engine's redis-py client (None: no cache, every lookup calls the
    service); ``cache_ok`` says whether Redis is usable now (the engine passes "its
    breaker is not open"), so an outage costs no cache timeouts. ``metrics`` and
    ``publish`` (the event hub) are optional; ``clock`` drives the breakers (monotonic)
    and ``wall_clock`` the ``Expires`` header.
    """

    def __init__(
        self,
        *,
        namespace: str,
        client: Any = None,
        backend_hosts: BackendHosts | str = "",
        cache_ok: Callable[[], bool] | None = None,
        cache_timeout_s: float = 0.5,
        metrics: Any = None,
        publish: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        instance_id: str = "",
    ) -> None:
        self.namespace = namespace
        self.client = client
        self.backend_hosts = backend_hosts if isinstance(backend_hosts, BackendHosts) else BackendHosts(backend_hosts)
        self.cache_ok = cache_ok
        self.cache_timeout_s = cache_timeout_s
        self.metrics = metrics
        self.publish = publish
        self.clock = clock
        self.wall_clock = wall_clock
        self.instance_id = instance_id
        self._resolvers: dict[str, ExternalResolver] = {}
        self._http: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.calls: dict[str, int] = {"ok": 0, "timeout": 0, "error": 0, "invalid": 0}
        self.errors: dict[str, int] = {}
        self.cache: dict[str, int] = {"hit": 0, "miss": 0, "stale": 0}
        self.sources: dict[str, int] = dict.fromkeys(SOURCES, 0)
        self.transitions: dict[str, int] = {s.value: 0 for s in BreakerState}
        self.shared_calls = 0
        self.cache_errors = 0
        self.backend_url_rejected = 0
        self._rejected_logged: set[str] = set()
        self._events_second = 0
        self._events_in_second = 0
        self.events_suppressed = 0

    # -- resolvers ----------------------------------------------------------------------

    @property
    def resolvers(self) -> Mapping[str, ExternalResolver]:
        """The current resolvers by route (read-only)."""
        return MappingProxyType(self._resolvers)

    def resolver(self, route: str, config: ExternalConfig, algorithm: Algorithm) -> ExternalResolver:
        r = self._resolvers.get(route)
        if r is not None and r.config is config and r.algorithm is algorithm:
            return r
        if r is None or r.config != config or r.algorithm is not algorithm:
            r = self._resolvers[route] = ExternalResolver(route, config, algorithm, self)
        else:
            r.config = config  # an identical block from reloaded rules: keep the breakers
        return r

    def configure(self, routes: Iterable[Any]) -> None:
        """Keep the resolvers (and their breakers) of routes whose ``external`` block is
        unchanged; drop the others (rebuilt on first use)."""
        wanted = {r.name: r for r in routes if getattr(r, "external", None) is not None}
        for name in list(self._resolvers):
            rule = wanted.get(name)
            if (
                rule is None
                or self._resolvers[name].config != rule.external
                or self._resolvers[name].algorithm is not rule.local.algorithm
            ):
                del self._resolvers[name]
        for name, rule in wanted.items():
            self.resolver(name, rule.external, rule.local.algorithm)

    async def resolve(
        self, rule: Any, key: str, method: str | None, path: str | None, headers: Mapping[str, str]
    ) -> Resolution:
        """The limits for one request on a route with an ``external`` block."""
        try:
            r = self.resolver(rule.name, rule.external, rule.local.algorithm)
            res = await r.resolve(key, method, path, headers)
        except Exception as exc:  # noqa: BLE001 - belt and braces: never fail a decision
            log.exception("external limits lookup failed")
            res = Resolution("static", None, f"{type(exc).__name__}: {exc}")
        self.sources[res.source] += 1
        if self.metrics is not None:
            self.metrics.child(self.metrics.external_limits, rule.name, res.source).inc()
        return res

    # -- shared resources ---------------------------------------------------------------

    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(
                trust_env=False,
                follow_redirects=False,
                # idle connections retired before the 5 s after which common servers (uvicorn,
                # Node) close them: a lookup never goes out on one being closed
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0),
            )
        return self._http

    def cache_client(self) -> Any:
        if self.client is None:
            return None
        if self.cache_ok is not None and not self.cache_ok():
            return None
        return self.client

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def background_tasks(self) -> int:
        """Calls and cache writes still running in the background."""
        return len(self._tasks)

    async def join(self, timeout_s: float = 2.0) -> bool:
        """Wait until no background task runs (the calls started so far and their cache
        writes have landed); False if some still run after ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._tasks:
                    await asyncio.wait(list(self._tasks))
        except TimeoutError:
            return False
        return True

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        if self._http is not None:
            http, self._http = self._http, None
            with contextlib.suppress(Exception):
                await http.aclose()

    # -- counters, metrics, events ------------------------------------------------------

    def count_call(self, result: str) -> None:
        self.calls[result] = self.calls.get(result, 0) + 1
        if self.metrics is not None:
            self.metrics.child(self.metrics.external_calls, result).inc()

    def count_error(self, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1
        if self.metrics is not None:
            self.metrics.child(self.metrics.external_errors, reason).inc()

    def count_cache(self, result: str) -> None:
        self.cache[result] += 1
        if self.metrics is not None:
            self.metrics.child(self.metrics.external_cache, result).inc()

    def count_cache_error(self, what: str, exc: BaseException) -> None:
        """A cache ``read`` or ``write`` failed: a miss or a lost copy, not a failure."""
        self.cache_errors += 1
        log.debug("external cache %s failed: %s", what, exc)

    def note_backend_url_rejected(self, route: str, why: str) -> None:
        self.backend_url_rejected += 1
        if self.metrics is not None:
            self.metrics.child(self.metrics.external_backend_url_rejected).inc()
        if why not in self._rejected_logged and len(self._rejected_logged) < _REJECTED_LOGGED:
            self._rejected_logged.add(why)
            log.warning("route %s: dropped a backend_url from the limits service: %s", route, why)

    def on_breaker(self, route: str, b: KeyBreaker, frm: BreakerState, to: BreakerState) -> None:
        self.transitions[to.value] += 1
        if self.metrics is not None:
            self.metrics.child(self.metrics.external_breaker_transitions, to.value).inc()
        if to is BreakerState.OPEN:
            log.warning(
                "external limits breaker for route %s key %r opened after %d failures: %s",
                route,
                b.key,
                b.failures,
                b.last_error,
            )
        if self.publish is None or not self._event_allowed():
            return
        self.publish(
            {
                "type": "external_breaker",
                "route": route,
                "key": b.key,
                "from": frm.value,
                "to": to.value,
                "failures": b.failures,
                "reason": b.last_error,
                "instance": self.instance_id,
            }
        )

    def _event_allowed(self) -> bool:
        """At most ``_EVENTS_PER_SECOND`` breaker events per wall-clock second."""
        sec = int(self.wall_clock())
        if sec != self._events_second:
            self._events_second, self._events_in_second = sec, 0
        self._events_in_second += 1
        if self._events_in_second > _EVENTS_PER_SECOND:
            self.events_suppressed += 1
            return False
        return True

    # -- the read model -----------------------------------------------------------------

    def snapshot(self, limit: int = 100, route: str | None = None) -> dict[str, Any]:
        """Routes, breakers (open first), cache and call figures; for ``GET /v1/external``,
        the event stream and the dashboard."""
        resolvers = [r for name, r in sorted(self._resolvers.items()) if route is None or name == route]
        for r in resolvers:
            r.breakers.sweep()
        breakers: list[dict[str, Any]] = []
        counts = {s.value: 0 for s in BreakerState}
        for r in resolvers:
            for s, n in r.breakers.counts().items():
                counts[s] += n
        for r in resolvers:
            breakers.extend({"route": r.route, **b} for b in r.breakers.snapshot(limit))
        order = {"open": 0, "half_open": 1, "closed": 2}
        breakers.sort(key=lambda b: order.get(b["state"], 3))
        looked_up = self.cache["hit"] + self.cache["miss"]
        return {
            "routes": [r.describe() for r in resolvers],
            "breakers": breakers[:limit],
            "breakers_total": sum(counts.values()),
            "breakers_open": counts["open"],
            "breakers_half_open": counts["half_open"],
            "cache": {
                "enabled": self.client is not None,
                "available": self.cache_client() is not None,
                **self.cache,
                "hit_ratio": round(self.cache["hit"] / looked_up, 4) if looked_up else None,
                "errors": self.cache_errors,
            },
            "calls": dict(self.calls),
            "errors": dict(self.errors),
            "sources": dict(self.sources),
            "shared_calls": self.shared_calls,
            "breaker_transitions": dict(self.transitions),
            "backend_hosts": self.backend_hosts.entries(),
            "backend_url_rejected": self.backend_url_rejected,
        }
