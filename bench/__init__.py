"""shadowlimit's benchmark suite: ``python -m bench`` (or ``./dev bench``).

Sections (``--only``):

* ``local``       in-process checks/s: shadowlimit ``LocalLimiter`` vs ``limits``
                  (``MemoryStorage``) and PyrateLimiter in-memory buckets.
* ``distributed`` decisions/s against a private embedded ``redis-server``:
                  ``RedisLimiter`` vs ``limits`` (async and sync Redis storage)
                  and PyrateLimiter's Redis buckets, sequential and 100 tasks.
* ``memory``      Redis bytes per key for each algorithm / strategy.
* ``explain``     what explaining divergence costs: the shadow pipeline's comparisons/s
                  and Redis CPU per comparison with the reference and without
                  (``explain: false``); its own ``bench/results/explain.json``.

Results go to ``bench/results/latest.json`` and ``docs/benchmarks.md``.
"""
