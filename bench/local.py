"""In-process checks/s: shadowlimit ``LocalLimiter`` vs ``limits`` in-memory vs PyrateLimiter.

Scenarios (one row per library / strategy, all measured in the same process):

* ``hot``       one key, a limit so large that every check is allowed, so every
                library does its full "allow and record" work on every call;
* ``hot_deny``  one key, a realistic 100/s limit (token buckets: burst 20), so
                almost every check is denied;
* ``rr``        100,000 keys visited round robin (every key pre-created before
                timing), the same huge limit.

Every library reads its own clock inside the call (shadowlimit: ``now_us=None``);
one extra row shows shadowlimit with a caller-supplied ``now_us``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from .harness import Settings, calibrate, log, summarize, timed_reps

__all__ = ["run_local", "SCENARIOS"]

BIG = 10**9  # "allow everything" limit (per second) for all libraries

SCENARIOS = {
    "hot": "one hot key, limit 1e9/s (every check allowed)",
    "hot_deny": "one hot key, realistic limit 100/s (token buckets: burst 20) - most checks denied",
    "rr": "{keys:,} keys round robin, limit 1e9/s (every check allowed)",
}


# --------------------------------------------------------------------------- #
# case builders: each returns (run(n), allowed(n) -> int, extra metadata)
# --------------------------------------------------------------------------- #

Case = tuple[Callable[[int], None], Callable[[int], int], dict[str, Any]]


def _source(keys: list[str] | None) -> Iterator[str]:
    """Where keys come from: one hot key forever, or the key list round robin."""
    return itertools.repeat("hot-key") if keys is None else itertools.cycle(keys)


def shadow_case(
    policy_kw: dict[str, Any], keys: list[str] | None, *, max_keys: int | None = None, explicit_now: bool = False
) -> Case:
    import time

    from limiter import LocalLimiter, Policy

    policy = Policy(**policy_kw)
    lim = LocalLimiter() if max_keys is None else LocalLimiter(max_keys=max_keys)
    chk = lim.check
    src = _source(keys)
    islice = itertools.islice

    if explicit_now:

        def run(n: int) -> None:
            now = time.time_ns() // 1000
            for k in islice(src, n):
                chk(k, policy, 1, now)

    else:

        def run(n: int) -> None:
            for k in islice(src, n):
                chk(k, policy)

    def allowed(n: int) -> int:
        return sum(chk(k, policy).allowed for k in islice(src, n))

    meta = {"policy": policy.describe(), "max_keys": lim.max_keys, "_limiter": lim}
    return run, allowed, meta


def limits_case(strategy: str, limit: str | None, keys: list[str] | None) -> Case:
    import limits
    from limits.storage import MemoryStorage
    from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter, SlidingWindowCounterRateLimiter

    cls = {
        "fixed": FixedWindowRateLimiter,
        "moving": MovingWindowRateLimiter,
        "sliding": SlidingWindowCounterRateLimiter,
    }[strategy]
    item = limits.RateLimitItemPerSecond(BIG) if limit is None else limits.parse(limit)
    storage = MemoryStorage()
    lim = cls(storage)
    hit = lim.hit
    src = _source(keys)
    islice = itertools.islice

    def run(n: int) -> None:
        for k in islice(src, n):
            hit(item, k)

    def allowed(n: int) -> int:
        return sum(bool(hit(item, k)) for k in islice(src, n))

    return run, allowed, {"policy": str(item), "_storage": storage}


class PerKeyFactory:
    """PyrateLimiter routes every name to one bucket unless a factory says otherwise;
    this one keeps one bucket per key (the library leaves per-key routing to users)."""

    def __new__(cls, make_bucket: Callable[[], Any]) -> Any:  # build a real BucketFactory subclass lazily
        from pyrate_limiter import BucketFactory, MonotonicClock, RateItem

        class _Factory(BucketFactory):
            def __init__(self) -> None:
                self.buckets: dict[str, Any] = {}
                self.clock = MonotonicClock()

            def wrap_item(self, name: str, weight: int = 1) -> Any:
                return RateItem(name, self.clock.now(), weight=weight)

            def get(self, item: Any) -> Any:
                b = self.buckets.get(item.name)
                if b is None:
                    b = self.buckets[item.name] = make_bucket()
                return b

        return _Factory()


def pyrate_case(kind: str, realistic: bool, keys: list[str] | None) -> Case:
    from pyrate_limiter import Duration, InMemoryBucket, Limiter, Rate, StateBucket, TokenBucket

    if realistic:
        rate = Rate(100, Duration.SECOND, burst=20) if kind == "token_bucket" else Rate(100, Duration.SECOND)
    else:
        rate = Rate(BIG, Duration.SECOND)

    def make_bucket() -> Any:
        if kind == "token_bucket":
            return StateBucket([rate], algorithm=TokenBucket())
        return InMemoryBucket([rate])

    if keys is None:
        # the documented single-bucket use: Limiter(bucket) / Limiter(Rate(...))
        limiter = Limiter(make_bucket()) if kind == "token_bucket" else Limiter(rate)
    else:
        limiter = Limiter(PerKeyFactory(make_bucket))
    acq = limiter.try_acquire
    src = _source(keys)
    islice = itertools.islice

    def run(n: int) -> None:
        for k in islice(src, n):
            acq(k, 1, blocking=False)

    def allowed(n: int) -> int:
        return sum(bool(acq(k, 1, blocking=False)) for k in islice(src, n))

    return run, allowed, {"policy": str(rate), "_limiter": limiter}


# --------------------------------------------------------------------------- #


def _cases(settings: Settings) -> list[tuple[str, str, str, Callable[[list[str] | None], Case], str]]:
    """(scenario, library, variant, builder(keys), note) in run order."""
    perm = {"average": 1e9, "burst": BIG}
    real = {"average": 100, "burst": 20}
    out: list[tuple[str, str, str, Callable[[list[str] | None], Case], str]] = []
    for scen in ("hot", "hot_deny", "rr"):
        if scen == "hot":
            out.append(
                (scen, "shadowlimit", "token_bucket", lambda k: shadow_case(perm, k), "LocalLimiter.check(key, policy)")
            )
            out.append(
                (
                    scen,
                    "shadowlimit",
                    "token_bucket, caller now_us",
                    lambda k: shadow_case(perm, k, explicit_now=True),
                    "check(key, policy, 1, now_us)",
                )
            )
            # gcra's finest step is 1 us per token (limiter.policy.MIN_EMISSION_US): 10^6/s, still never limiting here
            out.append(
                (
                    scen,
                    "shadowlimit",
                    "gcra",
                    lambda k: shadow_case({**perm, "average": 1e6, "algorithm": "gcra"}, k),
                    "",
                )
            )
        elif scen == "hot_deny":
            for alg in ("token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log"):
                out.append((scen, "shadowlimit", alg, lambda k, a=alg: shadow_case({**real, "algorithm": a}, k), ""))
        else:
            out.append(
                (
                    scen,
                    "shadowlimit",
                    "token_bucket, max_keys=131072",
                    lambda k: shadow_case(perm, k, max_keys=131_072),
                    "all keys fit",
                )
            )
            out.append(
                (
                    scen,
                    "shadowlimit",
                    "token_bucket, default max_keys=65536",
                    lambda k: shadow_case(perm, k),
                    "LRU evicts: every check is a new key",
                )
            )
        limit = "100/second" if scen == "hot_deny" else None
        for strat in ("fixed", "moving", "sliding"):
            name = {"fixed": "FixedWindow", "moving": "MovingWindow", "sliding": "SlidingWindowCounter"}[strat]
            out.append((scen, "limits", name, lambda k, s=strat, lm=limit: limits_case(s, lm, k), "MemoryStorage"))
        routing = "single bucket" if scen != "rr" else "one bucket per key"
        out.append(
            (
                scen,
                "pyrate-limiter",
                "InMemoryBucket (sliding log)",
                lambda k, r=scen == "hot_deny": pyrate_case("log", r, k),
                routing,
            )
        )
        out.append(
            (
                scen,
                "pyrate-limiter",
                "StateBucket(TokenBucket)",
                lambda k, r=scen == "hot_deny": pyrate_case("token_bucket", r, k),
                routing,
            )
        )
    return out


def _quiesce(meta: dict[str, Any]) -> None:
    """Stop a limits MemoryStorage's expiry timer so its background sweep (a thread
    that walks every key) does not run during the next case's timing."""
    st = meta.get("_storage")
    if st is not None:
        st.timer.cancel()
        if st.timer.is_alive():
            st.timer.join(1.0)


def run_local(settings: Settings) -> list[dict[str, Any]]:
    """Per scenario: build every library's case, calibrate each, then run the
    repetitions interleaved (rep 1 of every case, rep 2 of every case, ...), so a
    burst of background load hits all libraries of a scenario alike."""
    import threading

    thread_errors: list[str] = []
    previous_hook = threading.excepthook

    def hook(args: Any) -> None:
        # limits' MemoryStorage expiry timer thread can race with the caller's thread
        # (KeyError in its __expire_events); count it instead of printing a traceback
        thread_errors.append(f"{args.exc_type.__name__}: {args.exc_value}")

    threading.excepthook = hook
    try:
        return _run_local(settings, thread_errors)
    finally:
        threading.excepthook = previous_hook
        if thread_errors:
            log(
                f"  local: {len(thread_errors)} exception(s) in background threads "
                f"(limits MemoryStorage expiry timer), e.g. {thread_errors[0]}"
            )


def _run_local(settings: Settings, thread_errors: list[str]) -> list[dict[str, Any]]:
    keys = [f"client-{i}" for i in range(settings.local_keys)]
    results = []
    all_cases = _cases(settings)
    for scenario in SCENARIOS:
        cases = []
        for scen, lib, variant, build, note in all_cases:
            if scen != scenario:
                continue
            ks = keys if scen == "rr" else None
            run, allowed, meta = build(ks)
            if ks is not None:
                run(len(ks))  # create every key before timing (steady state, not inserts)
            ops = calibrate(run, settings.local_rep_s, settings.local_max_ops)
            run(min(ops, 20_000))  # warm-up
            _quiesce(meta)
            cases.append(
                {
                    "lib": lib,
                    "variant": variant,
                    "note": note,
                    "run": run,
                    "allowed": allowed,
                    "meta": meta,
                    "ops": ops,
                    "reps": [],
                }
            )
        for rep in range(settings.reps):
            k = rep % len(cases)
            for c in cases[k:] + cases[:k]:
                c["reps"] += timed_reps(c["run"], c["ops"], 1)
                _quiesce(c["meta"])
        for c in cases:
            meta = c["meta"]
            sample = min(c["ops"], 2_000 if settings.quick else 10_000)
            frac = c["allowed"](sample) / sample
            _quiesce(meta)
            st = summarize(c["reps"])
            row = {
                "scenario": scenario,
                "library": c["lib"],
                "variant": c["variant"],
                "note": c["note"],
                "policy": meta["policy"],
                "ops_per_rep": c["ops"],
                "ns_per_check": st,
                "checks_per_s": 1e9 / st["median"],
                "allowed_fraction": round(frac, 4),
            }
            if thread_errors and c["lib"] == "limits":
                row["background_thread_errors_so_far"] = len(thread_errors)
            if "max_keys" in meta:
                row["max_keys"] = meta["max_keys"]
                row["evicted"] = meta["_limiter"].evicted
            if c["lib"] == "pyrate-limiter":
                try:
                    meta["_limiter"].close()
                except Exception:  # noqa: BLE001 - closing a benchmark object must not stop the run
                    pass
            results.append(row)
            log(
                f"  local {scenario:8s} {c['lib']:14s} {c['variant']:38s} {st['median']:9.0f} ns/check  "
                f"({1e9 / st['median']:>10,.0f}/s, allowed {frac:.0%})"
            )
        del cases
    return results
