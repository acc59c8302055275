"""Where shadowlimit's time goes: a cost breakdown of ``LocalLimiter.check`` and a
cProfile of the client side of ``RedisLimiter.check`` at 100 concurrent tasks.

Component costs are measured one by one with ``timeit`` (best of 5), so they are
not inflated by the profiler; cProfile tables show call counts and the share of
time per function (with the profiler's overhead).
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import itertools
import pstats
import re
import statistics
import time
import timeit
from typing import Any

import redis
import uvloop

from .harness import Settings, log

__all__ = ["run_profile"]


def _top(pr: cProfile.Profile, n: int, calls_norm: int) -> list[dict[str, Any]]:
    st = pstats.Stats(pr)
    total = st.total_tt  # type: ignore[attr-defined]
    rows = []
    for (fname, line, func), (_cc, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
        where = "/".join(fname.split("/")[-2:])
        rows.append((tt, ct, nc, re.sub(r" at 0x[0-9a-f]+", "", func) if fname == "~" else f"{where}:{line}({func})"))
    rows.sort(reverse=True)
    return [
        {
            "function": name,
            "ncalls": nc,
            "tottime_s": round(tt, 4),
            "cumtime_s": round(ct, 4),
            "share_of_total": round(tt / total, 3),
            "tottime_us_per_op": round(tt / calls_norm * 1e6, 3),
        }
        for tt, ct, nc, name in rows[:n]
    ]


def local_breakdown(settings: Settings) -> dict[str, Any]:
    setup = """
import threading, time
from collections import OrderedDict
from limiter import LocalLimiter, Policy
from limiter.algorithms import token_bucket
from limiter.policy import make_decision, Decision
p = Policy(average=1e9, burst=10**9)
lim = LocalLimiter(); chk = lim.check
chk('hot-key', p)
limpy = LocalLimiter(speedups=False); chkpy = limpy.check
chkpy('hot-key', p)
now = time.time_ns() // 1000
state = (now, 5.0e8)
lock = threading.Lock()
od = OrderedDict((f'k{i}', [0]) for i in range(1000))
class Plain:
    __slots__ = ('allowed', 'remaining', 'limit', 'retry_after_us', 'reset_after_us')
    def __init__(s, a, b, c, d, e):
        s.allowed = a; s.remaining = b; s.limit = c; s.retry_after_us = d; s.reset_after_us = e
"""
    stmts = [
        ("LocalLimiter.check(key, policy)  [whole call, reads clock]", "chk('hot-key', p)"),
        ("LocalLimiter.check(key, policy, 1, now_us)", "chk('hot-key', p, 1, now)"),
        ("  same, pure-Python path (speedups=False)  [reads clock]", "chkpy('hot-key', p)"),
        ("  same, pure-Python path (speedups=False), caller now_us", "chkpy('hot-key', p, 1, now)"),
        ("algorithms.token_bucket(state, now, policy, 1)  [math + Decision]", "token_bucket(state, now, p, 1)"),
        ("policy.make_decision(...)  [5 slot-descriptor __set__ calls]", "make_decision(True, 1, 2, 0, 0)"),
        ("Decision(...)  [frozen dataclass __init__]", "Decision(True, 1, 2, 0, 0)"),
        ("plain __slots__ class with __init__  [alternative]", "Plain(True, 1, 2, 0, 0)"),
        ("lock.acquire(); lock.release()  [threading.Lock]", "lock.acquire(); lock.release()"),
        ("time.time_ns() // 1000  [clock read]", "time.time_ns() // 1000"),
        ("builtin min(a, b) on floats  [used once per refill]", "min(1.0, 2.0)"),
        ("OrderedDict.get + move_to_end", "od.get('k500'); od.move_to_end('k500')"),
        ("empty statement  [timeit loop overhead]", "pass"),
    ]
    number = 30_000 if settings.quick else 100_000
    out = []
    for label, stmt in stmts:
        best = min(timeit.repeat(stmt, setup, number=number, repeat=5))
        out.append({"component": label, "stmt": stmt, "ns": round(best / number * 1e9, 1)})

    from limiter import LocalLimiter, Policy

    lim = LocalLimiter()
    p = Policy(average=1e9, burst=10**9)
    chk = lim.check
    n = 50_000 if settings.quick else 200_000

    def run() -> None:
        for k in itertools.repeat("hot-key", n):
            chk(k, p)

    run()
    pr = cProfile.Profile()
    pr.enable()
    run()
    pr.disable()
    return {"components": out, "cprofile_ops": n, "cprofile": _top(pr, 10, n)}


def distributed_profile(settings: Settings, url: str) -> dict[str, Any]:
    """cProfile of 100 tasks calling ``RedisLimiter.check``, and the same load split
    over 1, 2 and 4 ``RedisLimiter`` instances (one pipelined connection each)."""
    from limiter import Policy, RedisLimiter

    total = 6_000 if settings.quick else 20_000
    stats = redis.Redis.from_url(url)

    async def main() -> dict[str, Any]:
        p = Policy(average=6e7, period=60.0, burst=10**9)  # 1e6/s: never limits here, keys live for the whole run
        keys = itertools.cycle([f"client-{i}" for i in range(settings.dist_keys)])
        out: dict[str, Any] = {"ops": total, "connections": []}

        async def drive(rls: list[Any], n: int, conc: int = 100) -> float:
            it = iter(range(n))

            async def w(rl: Any) -> None:
                chk = rl.check
                for _ in it:
                    await chk(next(keys), p)

            t0 = time.perf_counter()
            await asyncio.gather(*(w(rls[i % len(rls)]) for i in range(conc)))
            return time.perf_counter() - t0

        sets = {n: [RedisLimiter.from_url(url, namespace=f"prof{n}") for _ in range(n)] for n in (1, 2, 4)}
        acc: dict[int, dict[str, list[float]]] = {n: {"dps": [], "cpu": [], "rcpu": []} for n in sets}
        for rls in sets.values():
            await drive(rls, 2_000)
        for _ in range(3 if settings.quick else 5):  # interleaved, like the other sections
            for n, rls in sets.items():
                gc.collect()
                i0 = stats.info("cpu")
                c0 = time.process_time()
                el = await drive(rls, total)
                c1 = time.process_time()
                i1 = stats.info("cpu")
                acc[n]["dps"].append(total / el)
                acc[n]["cpu"].append((c1 - c0) / el)
                acc[n]["rcpu"].append(
                    (i1["used_cpu_sys"] + i1["used_cpu_user"] - i0["used_cpu_sys"] - i0["used_cpu_user"]) / el
                )
        for n, a in acc.items():
            out["connections"].append(
                {
                    "instances": n,
                    "decisions_per_s_median": round(statistics.median(a["dps"])),
                    "decisions_per_s_reps": [round(x) for x in a["dps"]],
                    "client_cpu_util": round(statistics.median(a["cpu"]), 2),
                    "redis_cpu_util": round(statistics.median(a["rcpu"]), 2),
                }
            )
        one = sets[1]
        c0 = time.process_time()
        await drive(one, total)
        out["client_cpu_us_per_decision"] = round((time.process_time() - c0) / total * 1e6, 2)
        pr = cProfile.Profile()
        pr.enable()
        await drive(one, total)
        pr.disable()
        out["cprofile"] = _top(pr, 12, total)
        for rls in sets.values():
            for rl in rls:
                await rl.aclose()
        return out

    try:
        stats.flushall()
        return uvloop.run(main())
    finally:
        stats.flushall()
        stats.close()


def run_profile(settings: Settings, url: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"local": local_breakdown(settings)}
    for c in out["local"]["components"]:
        log(f"  profile local  {c['component']:70s} {c['ns']:8.1f} ns")
    if url is not None:
        out["distributed"] = distributed_profile(settings, url)
        for c in out["distributed"]["connections"]:
            log(
                f"  profile dist   100 tasks over {c['instances']} RedisLimiter instance(s): "
                f"{c['decisions_per_s_median']:>9,}/s (client cpu {c['client_cpu_util']:.0%}, "
                f"redis cpu {c['redis_cpu_util']:.0%})"
            )
    return out
