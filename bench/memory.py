"""Redis memory per key for each shadowlimit algorithm and each peer's strategy.

Method, per row: warm the client up (connections, Lua scripts cached), ``FLUSHALL``,
read ``INFO memory`` ``used_memory``, write N keys through the library's own API
(one decision per key, all allowed), wait for Redis' incremental rehash, read
``used_memory`` again. ``bytes/key`` = delta / N, so it includes the keyspace's
own overhead (dict entry, expires entry, the hash table's growth), not only the
value. ``MEMORY USAGE`` (``SAMPLES 0``) averaged over 100 keys found by SCAN is the
per-key figure Redis reports for key + value alone. A second set of rows writes
10 decisions to each of fewer keys, to show which structures grow with traffic.

Policies have a long window (1000 per minute; shadowlimit token buckets: burst
1000) so no key expires while the run writes.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import redis
import uvloop

from .distributed import limits_async_factory, pyrate_redis_factory, shadow_factory
from .harness import Settings, log

__all__ = ["run_memory"]

POLICY = {"average": 1000, "period": 60.0, "burst": 1000}
LIMIT = "1000/minute"


def _rows() -> list[tuple[str, str, Any, int, str]]:
    out: list[tuple[str, str, Any, int, str]] = []
    for alg in ("token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log"):
        out.append(("shadowlimit", alg, shadow_factory(alg, batch=500, policy_kw=POLICY), 500, "1000/60s burst 1000"))
    for alg in ("gcra", "fixed_window", "sliding_window"):  # the hash their compact form replaces
        factory = shadow_factory(alg, batch=500, policy_kw=POLICY, state_format=1)
        out.append(("shadowlimit", f"{alg} (state format 1, the hash)", factory, 500, "1000/60s burst 1000"))
    for strat, name in (("moving", "MovingWindow"), ("fixed", "FixedWindow"), ("sliding", "SlidingWindowCounter")):
        out.append(("limits", name, limits_async_factory(strat, "redispy", LIMIT), 0, LIMIT))
    out.append(
        ("pyrate-limiter", "RedisBucket (sliding log)", pyrate_redis_factory("log", per_minute=1000), 0, "1000/minute")
    )
    out.append(
        (
            "pyrate-limiter",
            "StateBucket(TokenBucket)+RedisStateStore",
            pyrate_redis_factory("token_bucket", per_minute=1000),
            0,
            "1000/minute",
        )
    )
    return out


async def _write(call: Any, batch: int, keys: list[str], hits: int, concurrency: int = 100) -> None:
    for _ in range(hits):
        if batch:
            chunks = iter([keys[i : i + batch] for i in range(0, len(keys), batch)])
            await asyncio.gather(*(_drain(chunks, call) for _ in range(4)))
        else:
            one_by_one = iter(keys)
            await asyncio.gather(*(_drain(one_by_one, call) for _ in range(concurrency)))


async def _drain(items: Iterator[Any], call: Any) -> None:
    """One worker: call ``call`` on items from the shared iterator until it runs out."""
    for item in items:
        await call(item)


def _used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def _sample_usage(r: redis.Redis, n: int = 100) -> tuple[float, int]:
    keys: list[bytes] = []
    for k in r.scan_iter(count=1000):
        keys.append(k)
        if len(keys) >= n:
            break
    if not keys:
        return 0.0, 0
    sizes = [int(r.memory_usage(k, samples=0) or 0) for k in keys]
    return sum(sizes) / len(sizes), len(keys)


def _measure(
    url: str, stats: redis.Redis, factory: Any, batch: int, n_keys: int, hits: int, settle_s: float
) -> dict[str, Any]:
    keys = [f"client-{i}" for i in range(n_keys)]

    async def main() -> dict[str, Any]:
        call, _, close = await factory(url)
        try:
            await _write(call, batch, ["warm-up"], 1)
            stats.flushall()
            time.sleep(settle_s / 2)
            before = _used(stats)
            t0 = time.perf_counter()
            await _write(call, batch, keys, hits)
            elapsed = time.perf_counter() - t0
        finally:
            await close()
        time.sleep(settle_s)  # let the incremental rehash finish
        after = _used(stats)
        dbsize = int(stats.dbsize())
        usage, sampled = _sample_usage(stats)
        return {
            "keys": n_keys,
            "hits_per_key": hits,
            "used_memory_delta": after - before,
            "bytes_per_key": round((after - before) / n_keys, 1),
            "redis_keys_per_key": round(dbsize / n_keys, 3),
            "memory_usage_sample_avg": round(usage, 1),
            "memory_usage_sampled_keys": sampled,
            "write_s": round(elapsed, 2),
        }

    return uvloop.run(main())


def run_memory(settings: Settings, url: str) -> list[dict[str, Any]]:
    stats = redis.Redis.from_url(url)
    results = []
    try:
        for lib, variant, factory, batch, policy in _rows():
            for n, hits in ((settings.memory_keys, 1), (settings.memory_log_keys, 10)):
                res = _measure(url, stats, factory, batch, n, hits, 0.1 if settings.quick else 0.4)
                results.append({"library": lib, "variant": variant, "policy": policy, **res})
                log(
                    f"  memory {lib:15s} {variant:42s} N={n:<7d} hits={hits:<2d} "
                    f"{res['bytes_per_key']:>7.1f} B/key (MEMORY USAGE {res['memory_usage_sample_avg']:.0f} B, "
                    f"{res['redis_keys_per_key']:.2f} redis keys/key, {res['write_s']:.1f}s)"
                )
                stats.flushall()
    finally:
        stats.flushall()
        stats.close()
    return results


def run_memory_upstream(settings: Settings) -> dict[str, Any]:
    """Section 3 again on Redis' own build of the same version (:mod:`bench.upstream_redis`):
    its bundled jemalloc steps by 8 bytes where the system's steps by 16. ``error`` says why
    it was not measured (the report prints it)."""
    import os

    from limiter.embedded import EmbeddedRedis
    from limiter.embedded.process import ENV_SERVER_BIN

    from .upstream_redis import UpstreamRedisError, ensure

    try:
        binary = ensure()
    except (UpstreamRedisError, OSError, subprocess.TimeoutExpired) as exc:
        log(f"  memory on Redis' own build: not measured: {exc}")
        return {"error": str(exc)}
    before = os.environ.get(ENV_SERVER_BIN)
    os.environ[ENV_SERVER_BIN] = str(binary)
    try:
        with EmbeddedRedis() as server:
            info = redis.Redis.from_url(server.url).info()
            rows = run_memory(settings, server.url)
    finally:
        if before is None:
            os.environ.pop(ENV_SERVER_BIN, None)
        else:
            os.environ[ENV_SERVER_BIN] = before
    return {"redis_server": f"{info['redis_version']} ({info['mem_allocator']}, Redis' own build)", "rows": rows}
