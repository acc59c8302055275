"""One route's lookups (:class:`ExternalResolver`): the Redis cache shared by every replica
with its stale copy, singleflight per key, the per-key breakers, a semaphore capping
concurrent calls, and the httpx call bounded by the route's timeout."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import httpx
import orjson

from limiter.breaker import BreakerState
from limiter.policy import Algorithm

from .breakers import BreakerSet, KeyBreaker
from .config import ExternalConfig
from .responses import ExternalLimits, InvalidResponse, parse_limits
from .ttl import STALE_TTL_S, resolve_ttl, response_forbids_storing

if TYPE_CHECKING:
    from .manager import ExternalManager

__all__ = [
    "ExternalResolver",
    "MAX_RESPONSE_BYTES",
    "Resolution",
    "SOURCES",
    "Source",
]

log = logging.getLogger("shadowlimit.external")

MAX_RESPONSE_BYTES = 64 * 1024
_LOG_EVERY_S = 10.0  # a failing service is logged at most this often per route
_MEMO_SIZE = 4096
_REQUEST_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json",
    "User-Agent": "shadowlimit-external/1",
}

Source = Literal["external", "cache", "stale", "static"]
SOURCES: tuple[Source, ...] = ("external", "cache", "stale", "static")


@dataclass(frozen=True, slots=True)
class Resolution:
    """Where a decision's limits came from: ``limits`` is None for ``static``."""

    source: Source
    limits: ExternalLimits | None = None
    error: str | None = None


@dataclass(slots=True)
class _Fetched:
    limits: ExternalLimits | None
    error: str | None = None
    ttl_s: float = 0.0
    keep_stale: bool = False
    raw: bytes = b""


@dataclass(slots=True)
class _Lookup:
    stale: ExternalLimits | None = None
    error: str | None = None


class _CallFailed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # timeout | error | invalid
        self.message = message


class ExternalResolver:
    """One route's lookups: cache, singleflight, breakers, semaphore, the call."""

    def __init__(self, route: str, config: ExternalConfig, algorithm: Algorithm, manager: ExternalManager) -> None:
        self.route = route
        self.config = config
        self.algorithm = algorithm
        self.manager = manager
        self.filter = config.header_filter
        self.breakers = BreakerSet(
            clock=manager.clock, wall_clock=manager.wall_clock, on_transition=self._on_transition
        )
        self.semaphore = asyncio.Semaphore(config.max_concurrent_requests)
        self.active = 0
        self.waiting = 0
        self._inflight: dict[str, asyncio.Future[_Fetched]] = {}
        self._memo: collections.OrderedDict[bytes, ExternalLimits | None] = collections.OrderedDict()
        self._ns = manager.namespace
        self._logged_at: float | None = None

    # -- keys and cached values ---------------------------------------------------------

    def cache_key(self, key: str) -> str:
        return f"rl:{self._ns}:extcache:{{{self.route}:{key}}}"

    def stale_key(self, key: str) -> str:
        return f"rl:{self._ns}:extcache:stale:{{{self.route}:{key}}}"

    def _decode(self, raw: Any) -> ExternalLimits | None:
        if not raw:
            return None
        if isinstance(raw, str):
            raw = raw.encode()
        memo = self._memo
        if raw in memo:
            return memo[raw]
        try:
            limits: ExternalLimits | None = parse_limits(
                orjson.loads(raw), algorithm=self.algorithm, backend_hosts=self.manager.backend_hosts
            )
        except (InvalidResponse, orjson.JSONDecodeError):
            limits = None
        memo[raw] = limits
        if len(memo) > _MEMO_SIZE:
            memo.popitem(last=False)
        return limits

    # -- the lookup ---------------------------------------------------------------------

    async def resolve(self, key: str, method: str | None, path: str | None, headers: Mapping[str, str]) -> Resolution:
        """Limits for ``key``: cache, else the service, else stale, else static. Never
        raises; returns within the route's timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout_s
        state = _Lookup()
        try:
            async with asyncio.timeout_at(deadline):
                res = await self._lookup(key, method, path, headers, state, deadline)
            if res is not None:
                return res
        except TimeoutError:
            state.error = state.error or f"no answer within the timeout ({self.config.timeout_s:g}s)"
        except Exception as exc:  # noqa: BLE001 - a lookup must never fail a decision
            state.error = f"{type(exc).__name__}: {exc}"
            self.manager.count_error("internal")
            log.exception("external limits lookup failed on route %s", self.route)
        return self._fallback(state)

    def _fallback(self, state: _Lookup) -> Resolution:
        self._log_failure(state.error)
        if state.stale is not None:
            self.manager.count_cache("stale")
            return Resolution("stale", state.stale, state.error)
        return Resolution("static", None, state.error)

    async def _lookup(
        self,
        key: str,
        method: str | None,
        path: str | None,
        headers: Mapping[str, str],
        state: _Lookup,
        deadline: float,
    ) -> Resolution | None:
        m = self.manager
        client = m.cache_client()
        if client is not None:
            cached = await self._read_cache(client, key, state, deadline)
            if cached is not None:
                return cached
        m.count_cache("miss")
        fut = self._inflight.get(key)
        if fut is not None:
            m.shared_calls += 1
        else:
            fut = self._start_call(key, method, path, headers, cache=client is not None, deadline=deadline, state=state)
            if fut is None:
                return None
        fetched = await asyncio.shield(fut)
        if fetched.limits is not None:
            return Resolution("external", fetched.limits)
        state.error = fetched.error
        return None

    async def _read_cache(self, client: Any, key: str, state: _Lookup, deadline: float) -> Resolution | None:
        """The fresh copy as a ``cache`` resolution, if any; the stale copy goes to ``state``."""
        fresh_raw = stale_raw = None
        budget = min(self.manager.cache_timeout_s, max(0.0, deadline - asyncio.get_running_loop().time()))
        try:
            async with asyncio.timeout(budget):
                fresh_raw, stale_raw = await client.mget(self.cache_key(key), self.stale_key(key))
        except Exception as exc:  # noqa: BLE001 - an unreadable cache is a miss, not a failure
            self.manager.count_cache_error("read", exc)
        fresh = self._decode(fresh_raw)
        if fresh is not None:
            self.manager.count_cache("hit")
            return Resolution("cache", fresh)
        state.stale = self._decode(stale_raw)
        return None

    def _start_call(
        self,
        key: str,
        method: str | None,
        path: str | None,
        headers: Mapping[str, str],
        *,
        cache: bool,
        deadline: float,
        state: _Lookup,
    ) -> asyncio.Future[_Fetched] | None:
        """Become the key's singleflight leader and start the call, unless its breaker is open."""
        if not self.breakers.allow(key):
            b = self.breakers.get(key)
            state.error = f"circuit open for this key ({b.last_error if b is not None else 'failing'})"
            self.manager.count_error("circuit_open")
            return None
        fut: asyncio.Future[_Fetched] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        body = {"key": key, "headers": self.filter.apply(headers), "method": method or "", "path": path or ""}
        self.manager.spawn(self._fetch(key, orjson.dumps(body), fut, cache, deadline))
        return fut

    async def _fetch(self, key: str, payload: bytes, fut: asyncio.Future[_Fetched], cache: bool, end: float) -> None:
        """One call for ``key`` by the singleflight leader, within the leader's deadline
        ``end`` (loop time); sets ``fut``, then caches the answer."""
        result = _Fetched(None, "cancelled")
        try:
            if await self._acquire_slot(end):
                result = await self._call_and_count(key, payload, end)
            else:
                self.breakers.abandon(key)
                self.manager.count_error("overloaded")
                result = _Fetched(
                    None,
                    "no free slot for a call within the timeout "
                    f"({self.config.max_concurrent_requests} calls in flight)",
                )
        except BaseException:
            self.breakers.abandon(key)
            raise
        finally:
            if not fut.done():
                fut.set_result(result)
            try:
                if cache and result.limits is not None:
                    await self._store(key, result)  # still in flight: late arrivals join, no second call
            finally:
                if self._inflight.get(key) is fut:
                    del self._inflight[key]

    async def _acquire_slot(self, end: float) -> bool:
        """One of the route's ``max_concurrent_requests`` slots, in time to still make a
        call before ``end`` (loop time); False (and no slot held) otherwise."""
        self.waiting += 1
        try:
            async with asyncio.timeout_at(end):
                await self.semaphore.acquire()
        except TimeoutError:
            return False
        finally:
            self.waiting -= 1
        if end - asyncio.get_running_loop().time() < max(0.01, self.config.timeout_s * 0.05):  # too late to start
            self.semaphore.release()
            return False
        return True

    async def _call_and_count(self, key: str, payload: bytes, end: float) -> _Fetched:
        """The call, with a slot held (released here); counts it and tells the key's breaker."""
        m = self.manager
        self.active += 1
        try:
            async with asyncio.timeout_at(end):
                result = await self._call(payload)
            m.count_call("ok")
            if result.limits is not None and result.limits.backend_url_rejected:
                m.note_backend_url_rejected(self.route, result.limits.backend_url_rejected)
            self.breakers.success(key)
            return result
        except TimeoutError:
            m.count_call("timeout")
            m.count_error("timeout")
            self.breakers.failure(key, "timeout")
            return _Fetched(None, f"the limits service did not answer within {self.config.timeout_s:g}s")
        except _CallFailed as exc:
            m.count_call(exc.kind)
            m.count_error(exc.kind)
            self.breakers.failure(key, exc.message)
            return _Fetched(None, exc.message)
        finally:
            self.active -= 1
            self.semaphore.release()

    async def _call(self, payload: bytes) -> _Fetched:
        raw, cache_control, expires = await self._post(payload)
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise _CallFailed("invalid", f"invalid response: not JSON ({raw[:40]!r})") from None
        try:
            limits = parse_limits(data, algorithm=self.algorithm, backend_hosts=self.manager.backend_hosts)
        except InvalidResponse as exc:
            raise _CallFailed("invalid", f"invalid response: {exc}") from None
        ttl = resolve_ttl(
            cache_control,
            expires,
            body_no_store=limits.cache_no_store,
            body_max_age=limits.cache_max_age_seconds,
            default_ttl_s=self.config.cache_ttl_s,
            now=self.manager.wall_clock(),
        )
        keep = not response_forbids_storing(cache_control, limits.cache_no_store)
        return _Fetched(limits, None, ttl, keep, orjson.dumps(limits.to_wire()))

    async def _post(self, payload: bytes) -> tuple[bytes, str | None, str | None]:
        """POST to the service: (body, Cache-Control, Expires) of a 2xx answer; raises
        :class:`_CallFailed` or ``TimeoutError``."""
        http = self.manager.http()
        try:
            async with http.stream(
                "POST", self.config.url, content=payload, headers=_REQUEST_HEADERS, timeout=self.config.timeout_s
            ) as resp:
                if not 200 <= resp.status_code < 300:
                    raise _CallFailed("error", f"the limits service answered HTTP {resp.status_code}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_RESPONSE_BYTES:
                        raise _CallFailed("invalid", f"response body larger than {MAX_RESPONSE_BYTES // 1024} KiB")
                    chunks.append(chunk)
                cache_control = ", ".join(resp.headers.get_list("cache-control")) or None
                expires = resp.headers.get("expires")
        except httpx.TimeoutException:
            raise TimeoutError from None
        except httpx.HTTPError as exc:
            raise _CallFailed("error", f"{type(exc).__name__}: {exc}".rstrip(": ")[:300]) from None
        return b"".join(chunks), cache_control, expires

    async def _store(self, key: str, fetched: _Fetched) -> None:
        client = self.manager.cache_client()
        if client is None:
            return
        try:
            async with asyncio.timeout(self.manager.cache_timeout_s):
                pipe = client.pipeline(transaction=False)
                if fetched.ttl_s > 0:
                    pipe.set(self.cache_key(key), fetched.raw, px=max(1, int(fetched.ttl_s * 1000)))
                if fetched.keep_stale:
                    pipe.set(self.stale_key(key), fetched.raw, ex=STALE_TTL_S)
                else:
                    pipe.delete(self.stale_key(key))
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - caching is best effort
            self.manager.count_cache_error("write", exc)

    # -- reporting ----------------------------------------------------------------------

    def _on_transition(self, b: KeyBreaker, frm: BreakerState, to: BreakerState) -> None:
        self.manager.on_breaker(self.route, b, frm, to)

    def _log_failure(self, error: str | None) -> None:
        if not error:
            return
        now = self.manager.clock()
        if self._logged_at is None or now - self._logged_at >= _LOG_EVERY_S:
            self._logged_at = now
            log.warning("external limits for route %s unavailable (%s); using the fallback", self.route, error)

    def describe(self) -> dict[str, Any]:
        return {
            "route": self.route,
            **self.config.to_dict(),
            "algorithm": self.algorithm.value,
            "in_flight": len(self._inflight),
            "active_calls": self.active,
            "waiting_calls": self.waiting,
            "breakers": self.breakers.counts(),
        }
