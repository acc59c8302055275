"""Decisions/s against a private embedded redis-server, sequential and 100 asyncio tasks.

All async cases share one uvloop event loop (``uvloop.run``); each case has its own
client and its own key prefix, and traffic is spread round robin over 10,000 keys
with a limit of 1e6/s (expressed per minute, so no key expires during the run) so
every decision is an allow that writes. ``sequential`` = one task awaiting one
decision at a time; ``100 tasks`` = 100 tasks on the event loop, sharing the
library's client (its pipelining or its connection pool).

Every case is warmed up and calibrated first; then the repetitions are interleaved
(repetition 1 of every case, then repetition 2, ...) so a burst of background load
on the shared machine hits every library alike. Around each timed repetition the
run also records the Redis server's CPU time (``INFO cpu``), its per-command
statistics (``CONFIG RESETSTAT`` / ``INFO commandstats``) and the client process'
CPU time, to say which side is busy.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import uvloop

from .harness import Settings, log, summarize

__all__ = ["run_distributed"]

BIG = 10**9
# 10^6/s (far above what any client here reaches), as a per-minute limit so keys outlive the
# whole run; no more, because gcra's finest step is 1 us per token (limiter.policy.MIN_EMISSION_US)
PER_MINUTE = 60 * 10**6

# factory(url, tag) -> (call(key or keys) -> awaitable, decisions per call, async close())
Factory = Callable[..., Awaitable[tuple[Callable[[Any], Any], int, Callable[[], Awaitable[None]]]]]


# --------------------------------------------------------------------------- #
# clients
# --------------------------------------------------------------------------- #


def shadow_factory(
    algorithm: str, batch: int = 0, policy_kw: dict[str, Any] | None = None, state_format: int = 2
) -> Factory:
    """shadowlimit's ``RedisLimiter`` deciding ``algorithm`` (``batch``: ``check_many`` of that
    many); ``state_format`` 2 by default, what a new deployment writes (docs/state-format.md)."""

    async def make(url: str, tag: str = "bench"):
        from limiter import Policy, RedisLimiter

        rl = RedisLimiter.from_url(url, namespace=tag, state_format=state_format)
        policy = Policy(
            **(policy_kw or {"average": float(PER_MINUTE), "period": 60.0, "burst": BIG}), algorithm=algorithm
        )
        if batch:
            many = rl.check_many

            def call(keys: list[str]) -> Awaitable[Any]:
                return many([(k, policy, 1, None) for k in keys])

            return call, batch, rl.aclose
        chk = rl.check
        return (lambda k: chk(k, policy)), 1, rl.aclose

    return make


_LIMITS_STRATEGIES = ("moving", "fixed", "sliding")


def limits_async_factory(strategy: str, implementation: str, limit: str | None = None) -> Factory:
    async def make(url: str, tag: str = "LIMITS"):
        import limits
        from limits.aio.storage import RedisStorage
        from limits.aio.strategies import (
            FixedWindowRateLimiter,
            MovingWindowRateLimiter,
            SlidingWindowCounterRateLimiter,
        )

        cls = {
            "moving": MovingWindowRateLimiter,
            "fixed": FixedWindowRateLimiter,
            "sliding": SlidingWindowCounterRateLimiter,
        }[strategy]
        storage = RedisStorage("async+" + url, implementation=implementation, key_prefix=tag)
        lim = cls(storage)
        item = limits.RateLimitItemPerMinute(PER_MINUTE) if limit is None else limits.parse(limit)
        hit = lim.hit

        async def close() -> None:
            client = storage.bridge.storage
            for name in ("aclose", "close"):
                fn = getattr(client, name, None)
                if fn is not None:
                    try:
                        r = fn()
                        if asyncio.iscoroutine(r):
                            await r
                    except Exception:  # noqa: BLE001 - closing a benchmark client must not stop the run
                        pass
                    return

        return (lambda k: hit(item, k)), 1, close

    return make


def limits_sync_factory(strategy: str) -> Factory:
    """The synchronous ``limits.storage.RedisStorage`` (redis-py); ``call`` is a plain function."""

    async def make(url: str, tag: str = "LIMITS"):
        import limits
        from limits.storage import RedisStorage
        from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter, SlidingWindowCounterRateLimiter

        cls = {
            "moving": MovingWindowRateLimiter,
            "fixed": FixedWindowRateLimiter,
            "sliding": SlidingWindowCounterRateLimiter,
        }[strategy]
        storage = RedisStorage(url, key_prefix=tag)
        lim = cls(storage)
        item = limits.RateLimitItemPerMinute(PER_MINUTE)
        hit = lim.hit

        async def close() -> None:
            try:
                storage.storage.close()
            except Exception:  # noqa: BLE001
                pass

        return (lambda k: hit(item, k)), 1, close

    return make


def pyrate_redis_factory(kind: str, per_minute: int | None = None) -> Factory:
    async def make(url: str, tag: str = "pyrate"):
        import redis.asyncio as aredis
        from pyrate_limiter import (
            BucketFactory,
            Duration,
            Limiter,
            Rate,
            RateItem,
            RedisBucket,
            RedisStateStore,
            StateBucket,
            TokenBucket,
            WallClock,
        )
        from pyrate_limiter.buckets.redis_bucket import LuaScript

        client = aredis.Redis.from_url(url)
        rate = Rate(PER_MINUTE if per_minute is None else per_minute, Duration.MINUTE)
        script_hash = await client.script_load(LuaScript.PUT_ITEM)
        clock = WallClock()

        def make_bucket(key: str) -> Any:
            if kind == "token_bucket":
                return StateBucket([rate], algorithm=TokenBucket(), store=RedisStateStore(client, f"{tag}:{key}"))
            return RedisBucket([rate], client, f"{tag}:{key}", script_hash)

        class PerKey(BucketFactory):
            """One bucket per key (Limiter's default factory routes every name to one bucket)."""

            def __init__(self) -> None:
                self.buckets: dict[str, Any] = {}

            def wrap_item(self, name: str, weight: int = 1) -> Any:
                return RateItem(name, clock.now(), weight=weight)

            def get(self, item: Any) -> Any:
                b = self.buckets.get(item.name)
                if b is None:
                    b = self.buckets[item.name] = make_bucket(item.name)
                return b

        limiter = Limiter(PerKey())
        acq = limiter.try_acquire

        async def close() -> None:
            await client.aclose()

        return (lambda k: acq(k, 1, blocking=False)), 1, close

    return make


# --------------------------------------------------------------------------- #
# driving
# --------------------------------------------------------------------------- #


async def _drive(
    call: Callable[[Any], Awaitable[Any]], per_call: int, src: Any, total_calls: int, concurrency: int, batch: int
) -> float:
    """Issue ``total_calls`` calls from ``concurrency`` tasks; returns elapsed seconds."""
    counter = iter(range(total_calls))
    islice = itertools.islice

    if batch:

        async def worker() -> None:
            for _ in counter:
                await call(list(islice(src, batch)))

    else:

        async def worker() -> None:
            for _ in counter:
                await call(next(src))

    t0 = time.perf_counter()
    if concurrency == 1:
        await worker()
    else:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


def _redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _commandstats(r: redis.Redis) -> dict[str, dict[str, float]]:
    out = {}
    for k, v in r.info("commandstats").items():
        name = k.removeprefix("cmdstat_")
        out[name] = {"calls": int(v["calls"]), "usec": int(v["usec"]), "usec_per_call": float(v["usec_per_call"])}
    return out


def _allowed(result: Any) -> tuple[int, int]:
    """(allowed, total) for one call's result: a bool, a Decision or a list of them."""
    if isinstance(result, list):
        return sum(1 for r in result if getattr(r, "allowed", False)), len(result)
    return int(bool(getattr(result, "allowed", result))), 1


class _Meter:
    """Per repetition: a forced GC first (untimed), then wall time, the client process'
    CPU time and the Redis server's CPU time of the timed part only."""

    def __init__(self, stats: redis.Redis) -> None:
        self.stats = stats
        self.reps: list[float] = []
        self.wall = self.redis_cpu = self.client_cpu = 0.0
        self.decisions = 0

    def start(self) -> None:
        gc.collect()
        self._r0 = _redis_cpu(self.stats)
        self._p0 = time.process_time()

    def stop(self, elapsed: float, decisions: int) -> None:
        p1 = time.process_time()
        self.client_cpu += p1 - self._p0
        self.redis_cpu += _redis_cpu(self.stats) - self._r0
        self.wall += elapsed
        self.decisions += decisions
        self.reps.append(decisions / elapsed)


def _case_result(calls: int, per_rep: int, m: _Meter, cmd: dict[str, Any]) -> dict[str, Any]:
    cmds = {k: v for k, v in cmd.items() if not k.startswith(("info", "config"))}
    wall, redis_cpu, client_cpu, decisions = m.wall, m.redis_cpu, m.client_cpu, m.decisions
    return {
        "calls_per_rep": calls,
        "decisions_per_rep": per_rep,
        "decisions_per_s": summarize(m.reps),
        "redis_cpu_util": round(redis_cpu / wall, 3),
        "client_cpu_util": round(client_cpu / wall, 3),
        "redis_cpu_us_per_decision": round(redis_cpu / decisions * 1e6, 2),
        "client_cpu_us_per_decision": round(client_cpu / decisions * 1e6, 2),
        # INFO commandstats counts commands run inside a Lua script as well as the EVALSHA itself
        "redis_calls_per_decision": {
            k: round(v["calls"] / decisions, 3)
            for k, v in sorted(
                cmds.items(),
                key=lambda kv: (-round(kv[1]["calls"] / decisions, 2), not kv[0].startswith("eval"), kv[0]),
            )
        },
        "redis_usec_per_call": {k: v["usec_per_call"] for k, v in cmds.items()},
    }


class _Case:
    def __init__(
        self, lib: str, variant: str, conc: int, note: str, factory: Factory, batch: int = 0, sync: bool = False
    ) -> None:
        self.lib, self.variant, self.conc, self.note = lib, variant, conc, note
        self.factory, self.batch, self.sync = factory, batch, sync
        self.tag = "".join(ch if ch.isalnum() else "-" for ch in f"b{conc}-{lib}-{variant}")[:60]
        self.cmd: dict[str, dict[str, float]] = {}

    async def open(self, url: str, keys: list[str]) -> None:
        self.call, self.per_call, self.close = await self.factory(url, self.tag)
        self.src = itertools.cycle(keys)
        self.meter: _Meter | None = None

    async def drive(self, calls: int) -> float:
        if self.sync:
            call, src = self.call, self.src
            t0 = time.perf_counter()
            for k in itertools.islice(src, calls):
                call(k)
            return time.perf_counter() - t0
        return await _drive(self.call, self.per_call, self.src, calls, self.conc, self.batch)

    async def one(self) -> Any:
        arg = list(itertools.islice(self.src, self.batch)) if self.batch else next(self.src)
        r = self.call(arg)
        return r if self.sync else await r


async def _warm_up(case: _Case, keys: list[str], settings: Settings) -> None:
    """Connections, script loads, every key created; then ``case.calls`` calibrated to about one
    ``dist_rep_s`` of traffic (bounded)."""
    warm = max(case.conc, (200 if settings.quick else 1000) // case.per_call)
    if case.sync or case.batch:
        await case.drive(len(keys) // case.per_call)
    else:  # create every key quickly, whatever the case's own concurrency
        await _drive(case.call, 1, case.src, len(keys), settings.concurrency, 0)
    el = await case.drive(warm)
    rate = warm / el
    case.calls = int(
        min(
            settings.dist_max_ops // case.per_call,
            max(case.conc * 5, 200 // case.per_call, rate * settings.dist_rep_s),
        )
    )


async def _timed_rep(case: _Case, stats: redis.Redis) -> None:
    """One timed repetition of ``case``: wall time, CPU of both sides, Redis commandstats."""
    stats.config_resetstat()
    case.meter.start()  # type: ignore[union-attr]
    el = await case.drive(case.calls)
    case.meter.stop(el, case.calls * case.per_call)  # type: ignore[union-attr]
    for name, v in _commandstats(stats).items():
        acc = case.cmd.setdefault(name, {"calls": 0, "usec": 0})
        acc["calls"] += v["calls"]
        acc["usec"] += v["usec"]


def _cases(settings: Settings) -> list[_Case]:
    c = settings.concurrency
    own = "RedisLimiter (own RESP client, auto-pipelined, hiredis)"
    out: list[_Case] = []
    for conc in (1, c):
        for alg in ("token_bucket", "gcra", "sliding_window"):
            out.append(_Case("shadowlimit", alg, conc, own + ".check", shadow_factory(alg)))
    out.append(
        _Case(
            "shadowlimit",
            f"token_bucket, check_many x{settings.batch}",
            1,
            f"one task, batches of {settings.batch} requests",
            shadow_factory("token_bucket", batch=settings.batch),
            batch=settings.batch,
        )
    )
    names = {"moving": "MovingWindow", "fixed": "FixedWindow", "sliding": "SlidingWindowCounter"}
    for conc in (1, c):
        for impl in ("coredis", "redispy"):
            for strat in _LIMITS_STRATEGIES:
                note = (
                    "limits.aio RedisStorage, implementation=" + impl + (" (the default)" if impl == "coredis" else "")
                )
                out.append(
                    _Case(f"limits (async, {impl})", names[strat], conc, note, limits_async_factory(strat, impl))
                )
        for kind, name in (
            ("log", "RedisBucket (sliding log)"),
            ("token_bucket", "StateBucket(TokenBucket)+RedisStateStore"),
        ):
            out.append(
                _Case(
                    "pyrate-limiter (async)",
                    name,
                    conc,
                    "redis.asyncio client, one bucket per key",
                    pyrate_redis_factory(kind),
                )
            )
    for strat in _LIMITS_STRATEGIES:
        out.append(
            _Case(
                "limits (sync, redis-py)",
                names[strat],
                1,
                "limits.storage.RedisStorage",
                limits_sync_factory(strat),
                sync=True,
            )
        )
    return out


def run_distributed(settings: Settings, url: str) -> list[dict[str, Any]]:
    keys = [f"client-{i}" for i in range(settings.dist_keys)]
    stats = redis.Redis.from_url(url)
    cases = _cases(settings)

    async def main() -> None:
        try:
            for case in cases:
                await case.open(url, keys)
            # warm-up (connections, script loads, every key created) and calibration
            for case in cases:
                await _warm_up(case, keys, settings)
                case.meter = _Meter(stats)
            for rep in range(settings.dist_reps):
                k = rep % len(cases)
                for case in cases[k:] + cases[:k]:
                    await _timed_rep(case, stats)
            for case in cases:
                # sanity: with a 1e6/s limit every decision must be an allow
                got = [_allowed(await case.one()) for _ in range(max(1, 100 // case.per_call))]
                case.allowed = sum(a for a, _ in got) / sum(n for _, n in got)
        finally:
            for case in cases:
                if hasattr(case, "close"):
                    await case.close()

    try:
        stats.flushall()
        uvloop.run(main())
    finally:
        stats.flushall()
        stats.close()

    return [_case_row(case) for case in cases]


def _case_row(case: _Case, tag: str = "dist") -> dict[str, Any]:
    """One measured case as a result row (logged as it is built)."""
    for v in case.cmd.values():
        v["usec_per_call"] = round(v["usec"] / v["calls"], 2) if v["calls"] else 0.0
    res = _case_result(case.calls, case.calls * case.per_call, case.meter, case.cmd)  # type: ignore[arg-type]
    row = {
        "library": case.lib,
        "variant": case.variant,
        "concurrency": case.conc,
        "note": case.note,
        **res,
        "allowed_fraction": case.allowed,
    }
    med = res["decisions_per_s"]["median"]
    log(
        f"  {tag} c={case.conc:<3d} {case.lib:28s} {case.variant:42s} {med:>9,.0f}/s  "
        f"(redis cpu {res['redis_cpu_util']:.0%} = {res['redis_cpu_us_per_decision']:.1f} us/decision, "
        f"client cpu {res['client_cpu_util']:.0%} = {res['client_cpu_us_per_decision']:.1f} us/decision)"
    )
    return row


def run_same_script(settings: Settings, url: str) -> dict[str, Any]:
    """redis-benchmark (C: a client that costs next to nothing) sending the token bucket's own
    EVALSHA under the rows' policy, over as many keys, from as many connections as the rows'
    tasks with one request in flight each: the pace the shard takes the same script at. The rows'
    figures over it say how near ``RedisLimiter`` drives a shard to that pace."""
    from limiter import Policy
    from limiter.scripts import script_for

    from .capacity import _bench, _script_call

    policy = Policy(average=float(PER_MINUTE), period=60.0, burst=BIG, algorithm="token_bucket")
    stats = redis.Redis.from_url(url)
    kw = stats.connection_pool.connection_kwargs
    address = (str(kw["host"]), int(kw["port"]))
    command = _script_call("token_bucket", "rl:bench:__rand_int__", False, policy)
    requests = 50_000 if settings.quick else 300_000
    reps, cpu_us = [], []
    try:
        stats.flushall()
        stats.script_load(script_for(policy).source)
        for _ in range(settings.dist_reps):
            cpu0 = _redis_cpu(stats)
            reps.append(_bench(address, command, requests, settings.dist_keys, connections=(settings.concurrency, 1)))
            cpu_us.append((_redis_cpu(stats) - cpu0) / requests * 1e6)
    finally:
        stats.flushall()
        stats.close()
    row = {
        "tool": "redis-benchmark",
        "connections": settings.concurrency,
        "pipeline": 1,
        "requests_per_rep": requests,
        "decisions_per_s": summarize(reps),
        "redis_cpu_us_per_decision": round(statistics.median(cpu_us), 2),
    }
    log(
        f"  dist redis-benchmark, the same EVALSHA, {settings.concurrency} connections: "
        f"{row['decisions_per_s']['median']:>9,.0f}/s (redis cpu {row['redis_cpu_us_per_decision']:.1f} us/decision)"
    )
    return row
