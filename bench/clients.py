"""The own client is kept only if it earns its place: the project's RESP client
against redis-py, running the same Lua script with the same KEYS/ARGV.

Rows, in pairs measured side by side (repetition i of A, then of B; the order flips every
repetition so neither side always runs first):

- ``RedisLimiter.check`` (own client: two auto-pipelined connections, hiredis) vs
  :class:`RedisPyLimiter.check` (``redis.asyncio.Redis``, hiredis parser, one EVALSHA per
  decision, a connection pool as large as the concurrency), sequential and at 100 tasks;
- ``RedisLimiter.check_many`` of 100 requests vs 100 EVALSHA in one redis-py
  ``pipeline(transaction=False)``: the batch row (a pipeline is not a substitute for
  independent tasks, so it appears only here).

Everything else follows the distributed section (:mod:`bench.distributed`, whose warm-up,
calibration, meters and rows are reused): the token-bucket script, the same policy
(``average`` 60,000,000 per 60 s with a burst of 1e9, so every decision is an allow that
writes), the same private redis-server, one uvloop event loop, traffic round robin over
10,000 keys created during the warm-up. Both clients work on the *same* keys
(``rl:ab:client-N``). Before timing, :func:`compare_decisions` checks pairwise that both
paths give identical decisions for the same inputs (fixed clock, fresh keys, allows and
denies).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
import uvloop
from redis.exceptions import NoScriptError

from limiter import Policy, RedisLimiter
from limiter.errors import BackendReplyError
from limiter.policy import Decision, make_decision, validate_cost
from limiter.scripts import SCRIPTS, Script, policy_args

from .distributed import (
    BIG,
    PER_MINUTE,
    Factory,
    _allowed,
    _Case,
    _case_row,
    _Meter,
    _timed_rep,
    _warm_up,
    shadow_factory,
)
from .harness import Settings, log

__all__ = ["RedisPyLimiter", "compare_decisions", "comparison_inputs", "render", "run_clients"]

NAMESPACE = "ab"  # both clients on the same keys: rl:ab:client-N
CRITERION = 1.5  # the own client must be >= 1.5x redis-py at 100 tasks
REPS = 9  # interleaved repetitions per row (quick runs: settings.dist_reps)
OWN, PY = "own client", "redis-py"

Request = tuple[str, Policy, int, int | None]


def _now_us() -> int:
    return time.time_ns() // 1000


def bench_policy() -> Policy:
    """The distributed section's token-bucket policy (``shadow_factory``'s default)."""
    return Policy(average=float(PER_MINUTE), period=60.0, burst=BIG, algorithm="token_bucket")


def decision_of(reply: Any, script: Script) -> Decision:
    """A script reply as a :class:`Decision`. ``RedisLimiter`` decodes inline (it has no
    separate decode function); this is the same expression on the same reply."""
    if type(reply) is not list:
        raise BackendReplyError(f"unexpected reply from the {script.name} script: {reply!r}")
    return make_decision(reply[0] == 1, reply[1], reply[2], reply[3], reply[4])


class RedisPyLimiter:
    """``RedisLimiter.check`` / ``check_many`` through ``redis.asyncio``: the same script
    (EVALSHA; EVAL on NOSCRIPT), KEYS[1] = ``rl:<namespace>:<key>``, ARGV = the policy's
    three arguments, now in microseconds (the caller's, else the local clock) and the cost,
    and the same decoding. Only what the benchmark needs: the local clock (no
    ``time_source='redis'``), standalone Redis, redis-py's exceptions left as they are."""

    def __init__(self, client: Any, *, namespace: str = NAMESPACE, clock: Callable[[], int] = _now_us) -> None:
        self.client = client
        self._prefix = f"rl:{namespace}:".encode()
        self._clock = clock
        self._prepared: dict[int, tuple[Policy, Script, bytes, bytes, bytes]] = {}

    @classmethod
    def from_url(
        cls, url: str, *, namespace: str = NAMESPACE, max_connections: int = 100, clock: Callable[[], int] = _now_us
    ) -> RedisPyLimiter:
        import redis.asyncio as aredis

        return cls(aredis.Redis.from_url(url, max_connections=max_connections), namespace=namespace, clock=clock)

    def _prepare(self, policy: Policy) -> tuple[Policy, Script, bytes, bytes, bytes]:
        # cached per policy object, as RedisLimiter._prepare does
        p = self._prepared.get(id(policy))
        if p is None or p[0] is not policy:
            p = self._prepared[id(policy)] = (policy, SCRIPTS[policy.algorithm], *policy_args(policy))
        return p

    def _args(self, key: str, policy: Policy, cost: int, now_us: int | None) -> tuple[Script, tuple[Any, ...]]:
        _, script, a1, a2, a3 = self._prepare(policy)
        return script, (self._prefix + key.encode(), a1, a2, a3, self._clock() if now_us is None else now_us, cost)

    async def check(self, key: str, policy: Policy, cost: int = 1, now_us: int | None = None) -> Decision:
        if type(cost) is not int or cost < 1 or cost > policy.limit:
            cost = validate_cost(policy, cost)
        if policy.unlimited:
            return make_decision(True, policy.limit, policy.limit, 0, 0)
        script, args = self._args(key, policy, cost, now_us)
        try:
            reply = await self.client.evalsha(script.sha, 1, *args)
        except NoScriptError:
            reply = await self.client.eval(script.source, 1, *args)
        return decision_of(reply, script)

    async def check_many(self, requests: Sequence[Request]) -> list[Decision | Exception]:
        """All requests' EVALSHA in one ``pipeline(transaction=False)``; failures in place."""
        out: list[Any] = [None] * len(requests)
        pipe = self.client.pipeline(transaction=False)
        sent: list[tuple[int, Script, tuple[Any, ...]]] = []
        for i, (key, policy, cost, now_us) in enumerate(requests):
            if type(cost) is not int or cost < 1 or cost > policy.limit:
                cost = validate_cost(policy, cost)
            if policy.unlimited:
                out[i] = make_decision(True, policy.limit, policy.limit, 0, 0)
                continue
            script, args = self._args(key, policy, cost, now_us)
            pipe.evalsha(script.sha, 1, *args)
            sent.append((i, script, args))
        if sent:
            replies = await pipe.execute(raise_on_error=False)
            for (i, script, args), reply in zip(sent, replies):
                if isinstance(reply, NoScriptError):
                    reply = await self.client.eval(script.source, 1, *args)
                out[i] = reply if isinstance(reply, Exception) else decision_of(reply, script)
        return out

    def connections(self) -> int:
        """Connections the pool holds now (redis-py internals; 0 if they moved)."""
        pool = self.client.connection_pool
        return len(getattr(pool, "_available_connections", ())) + len(getattr(pool, "_in_use_connections", ()))

    async def aclose(self) -> None:
        await self.client.aclose()


# --------------------------------------------------------------------------- #
# same inputs, same decisions
# --------------------------------------------------------------------------- #

T0 = 1_700_000_000_000_000


def comparison_inputs(n: int, seed: int = 12, keys: int = 4) -> list[tuple[str, int, int]]:
    """``n`` deterministic ``(key, cost, now_us)``: a few keys, costs 1-3, a fixed clock that
    moves irregularly (sometimes back), so a tight policy gives allows and denies."""
    rnd = random.Random(seed)
    now = T0
    out = []
    for _ in range(n):
        now += rnd.choice((0, 0, 1_000, 20_000, 37_000, 250_000, -5_000))
        out.append((f"k{rnd.randrange(keys)}", rnd.choice((1, 1, 1, 2, 3)), now))
    return out


def _tally(acc: dict[str, Any], a: Any, b: Any, what: str) -> None:
    acc["pairs"] += 1
    if a != b:
        acc["mismatches"] += 1
        if len(acc["examples"]) < 5:
            acc["examples"].append(f"{what}: own {a!r} != redis-py {b!r}")
    elif isinstance(a, Decision):
        acc["allowed" if a.allowed else "denied"] += 1


async def compare_decisions(
    own: RedisLimiter, rp: RedisPyLimiter, policies: Sequence[Policy], n: int = 300, batch: int = 100
) -> dict[str, Any]:
    """Feed both clients the same ``n`` inputs per policy, on fresh keys (each client has
    its own namespace), one by one (``check``) and in batches (``check_many`` vs the
    pipeline); count the pairs that differ."""
    acc: dict[str, Any] = {"pairs": 0, "mismatches": 0, "allowed": 0, "denied": 0, "examples": []}
    for pi, policy in enumerate(policies):
        inputs = comparison_inputs(n, seed=pi)
        for key, cost, now in inputs:
            k = f"one-{pi}-{key}"
            _tally(acc, await own.check(k, policy, cost, now), await rp.check(k, policy, cost, now), k)
        reqs: list[Request] = [(f"many-{pi}-{key}", policy, cost, now) for key, cost, now in inputs]
        for i in range(0, len(reqs), batch):
            chunk = reqs[i : i + batch]
            for req, a, b in zip(chunk, await own.check_many(chunk), await rp.check_many(chunk)):
                _tally(acc, a, b, req[0])
    return acc


async def _checked_decisions(url: str, n: int) -> dict[str, Any]:
    own = RedisLimiter.from_url(url, namespace="cmp-own")
    rp = RedisPyLimiter.from_url(url, namespace="cmp-py", max_connections=4)
    try:
        tight = Policy(average=10, period=1.0, burst=5, algorithm="token_bucket")
        return await compare_decisions(own, rp, (tight, bench_policy()), n=n)
    finally:
        await own.aclose()
        await rp.aclose()


# --------------------------------------------------------------------------- #
# the A/B
# --------------------------------------------------------------------------- #


def _shared_keys(factory: Factory) -> Factory:
    """The distributed section's own-client factory, on this section's shared keys."""

    async def make(url: str, tag: str = NAMESPACE) -> Any:
        return await factory(url, NAMESPACE)

    return make


def redispy_factory(batch: int = 0, max_connections: int = 100) -> Factory:
    async def make(url: str, tag: str = NAMESPACE) -> Any:
        rp = RedisPyLimiter.from_url(url, namespace=NAMESPACE, max_connections=max_connections)
        policy = bench_policy()
        make.limiter = rp  # type: ignore[attr-defined]
        if batch:
            many = rp.check_many
            return (lambda keys: many([(k, policy, 1, None) for k in keys])), batch, rp.aclose
        chk = rp.check
        return (lambda k: chk(k, policy)), 1, rp.aclose

    return make


def _pairs(settings: Settings) -> list[tuple[str, _Case, _Case]]:
    c, b = settings.concurrency, settings.batch
    own = "RedisLimiter (own RESP client: 2 auto-pipelined connections, hiredis)"
    py = f"redis.asyncio.Redis, hiredis parser, pool of up to {c} connections"
    tb = "token_bucket"
    return [
        (
            "sequential",
            _Case(OWN, "RedisLimiter.check", 1, own, _shared_keys(shadow_factory(tb))),
            _Case(PY, "EVALSHA", 1, py, redispy_factory(0, c)),
        ),
        (
            f"{c} tasks",
            _Case(OWN, "RedisLimiter.check", c, own, _shared_keys(shadow_factory(tb))),
            _Case(PY, "EVALSHA", c, py, redispy_factory(0, c)),
        ),
        (
            f"batches of {b}",
            _Case(OWN, f"check_many x{b}", 1, own, _shared_keys(shadow_factory(tb, batch=b)), batch=b),
            _Case(PY, f"pipeline(transaction=False), {b} EVALSHA", 1, py, redispy_factory(b, c), batch=b),
        ),
    ]


def _ratio(own: dict[str, Any], py: dict[str, Any]) -> dict[str, Any]:
    a, b = own["decisions_per_s"], py["decisions_per_s"]
    paired = [x / y for x, y in zip(a["reps"], b["reps"])]
    return {
        "own": round(a["median"]),
        "redis_py": round(b["median"]),
        "ratio": round(a["median"] / b["median"], 3),
        "paired_median": round(statistics.median(paired), 3),
        "paired_min": round(min(paired), 3),
        "paired_max": round(max(paired), 3),
        "client_cpu_us": [own["client_cpu_us_per_decision"], py["client_cpu_us_per_decision"]],
    }


def run_clients(settings: Settings, url: str) -> dict[str, Any]:
    keys = [f"client-{i}" for i in range(settings.dist_keys)]
    stats = redis.Redis.from_url(url)
    pairs = _pairs(settings)
    cases = [case for _, a, b in pairs for case in (a, b)]
    reps = settings.dist_reps if settings.quick else max(settings.dist_reps, REPS)
    out: dict[str, Any] = {"reps": reps, "criterion": CRITERION, "concurrency": settings.concurrency}

    async def main() -> None:
        try:
            out["correctness"] = await _checked_decisions(url, 100 if settings.quick else 300)
            for case in cases:
                await case.open(url, keys)
            for case in cases:
                await _warm_up(case, keys, settings)
                case.meter = _Meter(stats)
            for rep in range(reps):
                for _, a, b in pairs:
                    for case in (a, b) if rep % 2 == 0 else (b, a):
                        await _timed_rep(case, stats)
            for case in cases:  # with a 1e6/s limit every decision must be an allow
                got = [_allowed(await case.one()) for _ in range(max(1, 100 // case.per_call))]
                case.allowed = sum(x for x, _ in got) / sum(n for _, n in got)
                rp = getattr(case.factory, "limiter", None)
                case.note += f" ({rp.connections()} opened)" if rp is not None else ""
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

    cmp = out["correctness"]
    if cmp["mismatches"]:
        log(f"  clients: {cmp['mismatches']} of {cmp['pairs']} decisions differ: {cmp['examples']}")
    rows, ratios = [], {}
    for name, a, b in pairs:
        ra, rb = _case_row(a, "clients"), _case_row(b, "clients")
        ra["workload"] = rb["workload"] = name
        rows += [ra, rb]
        ratios[name] = _ratio(ra, rb)
        log(f"  clients {name}: own / redis-py = {ratios[name]['ratio']:.2f}x")
    out["rows"], out["ratios"] = rows, ratios
    return out


# --------------------------------------------------------------------------- #
# report
# --------------------------------------------------------------------------- #


def verdict(data: dict[str, Any]) -> dict[str, Any] | None:
    """The issue's criterion, judged on the medians at ``concurrency`` tasks."""
    r = data["ratios"].get(f"{data['concurrency']} tasks")
    if r is None:
        return None
    valid = data["correctness"]["mismatches"] == 0
    return {
        "target": f"clients: own client >= {data['criterion']:g}x redis-py at {data['concurrency']} tasks",
        "measured": f"{r['ratio']:.2f}x ({r['own']:,}/s vs {r['redis_py']:,}/s)"
        + ("" if valid else f"; INVALID: {data['correctness']['mismatches']} decisions differ"),
        "met": valid and r["ratio"] >= data["criterion"],
    }


def _table(data: dict[str, Any]) -> list[str]:
    out = [
        "| Workload | Client | Call | decisions/s (median) | min - max | own / redis-py | client CPU us/dec |"
        " Redis CPU us/dec | client CPU util | Redis CPU util | allowed | Redis commands per decision | Client |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|---|",
    ]
    for r in data["rows"]:
        s = r["decisions_per_s"]
        ratio = f"{data['ratios'][r['workload']]['ratio']:.2f}x" if r["library"] == OWN else ""
        cmds = ", ".join(f"{k} {v:g}" for k, v in r["redis_calls_per_decision"].items() if v >= 0.005)
        out.append(
            f"| {r['workload']} | {r['library']} | {r['variant']} | **{s['median']:,.0f}** |"
            f" {s['min']:,.0f} - {s['max']:,.0f} | {ratio} | {r['client_cpu_us_per_decision']:.1f} |"
            f" {r['redis_cpu_us_per_decision']:.1f} | {r['client_cpu_util']:.2f} | {r['redis_cpu_util']:.2f} |"
            f" {r.get('allowed_fraction', 0):.0%} | {cmds} | {r['note']} |"
        )
    return out


def render(data: dict[str, Any]) -> list[str]:
    """The ``clients`` section of ``docs/benchmarks.md``."""
    cmp, c = data["correctness"], data["concurrency"]
    out = [
        "## 5. Own RESP client vs redis-py",
        "",
        "The same token-bucket script, KEYS and ARGV, the same policy (1e6/s written per minute, burst 1e9) and "
        "the same 10,000 keys (shared by every row, created during the warm-up), against the same redis-server, "
        "on one uvloop event loop: `RedisLimiter` (own client) vs `redis.asyncio.Redis` calling EVALSHA and "
        f"decoding the reply into the same `Decision` (`bench.clients.RedisPyLimiter`). decisions/s: median of "
        f"{data['reps']} repetitions, interleaved pairwise (own, redis-py, then redis-py, own, ...). "
        "`own / redis-py` = ratio of the medians. CPU columns as in section 2. "
        "The batch rows are one task sending 100 requests at a time: `check_many` (one call of the script "
        "made for many keys, `lua/many.lua`, the same script run per key) vs 100 EVALSHA in one "
        "redis-py `pipeline(transaction=False)`.",
        "",
        *_table(data),
        "",
    ]
    for name, r in data["ratios"].items():
        out.append(
            f"- {name}: own / redis-py = **{r['ratio']:.2f}x** ({r['own']:,}/s vs {r['redis_py']:,}/s; "
            f"per repetition pair {r['paired_min']:.2f}x - {r['paired_max']:.2f}x, median {r['paired_median']:.2f}x)"
        )
    out += [
        f"- Same decisions: {cmp['pairs']:,} pairs compared ({cmp['allowed']:,} allowed, {cmp['denied']:,} denied; "
        f"fixed clock, fresh keys, `check` and batches), **{cmp['mismatches']} differ**"
        + (f": {'; '.join(cmp['examples'])}" if cmp["examples"] else "")
        + ".",
        "",
    ]
    v = verdict(data)
    if v is not None:
        out += [
            f"**Verdict: own client >= {data['criterion']:g}x redis-py at {c} tasks: "
            f"{'met' if v['met'] else 'not met'}** ({v['measured']}).",
            "",
        ]
    return out
