"""One decision path: a batch gives exactly what deciding its items one by one gives.

``Decider.decide`` decides one request (gathered with the others asked in the same pass of
the event loop into one batch), so these tests run the same items through one engine as one
batch (answers as objects), through a second as one batch (answers as dicts), through a
third one item at a time and through a fourth all at once, each item its own ``decide``
call (one gathering), each engine with the same injected clock, and compare everything
observable: the answers (and their JSON), the
metrics, the shadow queue, request ids, both limiters' state, the divergence deltas,
the would-be-blocked keys and the activity views. The items mix every kind of route
(lists, overrides, per-key and route adjustments, windowed algorithms, unlimited local
limits), every mode, bad items, odd costs, a full shadow queue and failed Redis answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
import uuid
from typing import Any

import orjson
import pytest

from control_plane.decision import DecideInput
from control_plane.engine import Engine
from control_plane.model.rollout import Mode, RouteState
from control_plane.observe.metrics import Metrics
from control_plane.rules import parse_rules
from control_plane.settings import load_settings
from control_plane.wiring import build_engine
from limiter import RedisLimiter
from limiter.policy import make_decision
from limiter.redis_limiter import make_redis_py_client
from limiter.resilience import Outcome

RULES = """\
version: 1
routes:
  - name: plain
    match: {path: /api/plain/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 5, period: 1s, burst: 5}
    distributed: {average: 5, period: 1s, burst: 5}
  - name: tight
    match: {path: /api/tight/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 100, period: 1s, burst: 100}
    distributed: {average: 1, period: 10s, burst: 3}
    failure_policy: failClosed
    failure_code: 503
  - name: window
    match: {path: /api/window/**}
    key: {strategy: header, header: X-Client-Id}
    local: {algorithm: sliding_window, average: 4, period: 10s}
    distributed: {algorithm: fixed_window, average: 6, period: 10s}
  - name: listed
    match: {path: /api/listed/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 5, period: 1s, burst: 5}
    allow: ["vip"]
    deny: ["bad", "203.0.113.0/24"]
  - name: over
    match: {path: /api/over/**}
    key: {strategy: header, header: X-Tenant}
    local: {average: 5, period: 1s, burst: 5}
    overrides:
      tenants: {big: {average: 50, burst: 50}}
  - name: adjusted
    match: {path: /api/adjusted/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 5, period: 1s, burst: 5}
  - name: keyadjusted
    match: {path: /api/keyadjusted/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 5, period: 1s, burst: 5}
  - name: free
    match: {path: /api/free/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 0}
    distributed: {average: 3, period: 10s, burst: 3}
"""

ROUTES = ["plain", "tight", "window", "listed", "over", "adjusted", "keyadjusted", "free", "default"]


class Clock:
    """The decisions' clock: a fixed start, +step_us per call, so engines fed the same
    items see the same timestamps (minute rollovers included)."""

    def __init__(self, start_us: int, step_us: int) -> None:
        self.start_us = start_us
        self.step_us = step_us
        self.reset()

    def reset(self) -> None:
        self._n = itertools.count()

    def __call__(self) -> int:
        return self.start_us + next(self._n) * self.step_us


@pytest.fixture
def clock() -> Clock:
    # start 30 ms before a minute boundary, so batches cross it
    return Clock((int(time.time()) // 60 * 60 + 60) * 1_000_000 - 30_000, 997)


ADJUSTMENTS = {
    "adjusted": {"local": {"average": 3, "burst": 3}, "distributed": {"average": 2, "period": 5, "burst": 2}},
    "keyadjusted\x00k1": {"local": {"average": 1, "burst": 1}},
}


def set_adjustments(engines: list[Engine], adjustments: dict[str, Any]) -> None:
    for e in engines:
        e.memory.adjustments = {k: json.dumps(v) for k, v in adjustments.items()}
        e.adjustments.apply()


async def make_engine(redis_url: str, clock: Clock, *, queue: int = 10_000) -> Engine:
    ns = f"dp{uuid.uuid4().hex[:10]}"
    s = load_settings(
        redis_url=redis_url,
        namespace=ns,
        instance_id="inst",
        enable_distributed_rate_limiting=True,
        shadow_queue_size=queue,
        rules_path=None,
        # the cache answers a key's later requests without Redis: which ones depends on how they
        # are batched, so the one-by-one and batch runs compared here keep it off
        # (tests/e2e/test_envoy_deadlines.py covers it)
        over_limit_cache_keys=0,
    )
    redis = RedisLimiter.from_url(redis_url, namespace=ns)
    client = make_redis_py_client(redis_url)
    # the stores' wall clock (divergence minutes, rates) fixed at the decisions' start, the same for
    # every engine: engines built and fed one after another must not straddle a real minute
    wall = clock.start_us / 1_000_000
    eng = build_engine(
        s, redis=redis, client=client, metrics=Metrics(), rules=parse_rules(RULES, s), clock_us=clock,
        clock=lambda: wall,
    )  # fmt: skip
    await redis.load_scripts()
    set_adjustments([eng], ADJUSTMENTS)
    return eng


async def close(*engines: Engine) -> None:
    for e in engines:
        await e.redis.aclose()
        await e.client.aclose()


_version = itertools.count(1)


def set_modes(engines: list[Engine], modes: dict[str, tuple[Mode, int]]) -> None:
    """As a mode_change event from another replica would (the public way in)."""
    for name, (mode, pct) in modes.items():
        state = RouteState(mode=mode, canary_percent=pct, version=next(_version)).to_dict()
        for e in engines:
            e.rollout.note_event({"type": "mode_change", "route": name, "state": state})


def norm_exc(x: Any) -> Any:
    if isinstance(x, Exception):
        return (type(x).__name__, str(x), getattr(x, "field", None))
    return x


#: not comparable between a batch and its items one by one: the latency (a batch is
#: observed once, as a batch) and the last tokens-remaining gauge (a batch answers its
#: distributed requests after all its local ones, so the last value written differs)
_ORDER_DEPENDENT = ("rate_limit_decision_duration", "rate_limit_tokens_remaining")


#: the process's own figures (CPU time, memory, collections): about the process, not the decisions
_PROCESS = ("process_", "python_", "shadowlimit_build")


def metrics_state(m: Metrics, *, all_samples: bool = False) -> list[Any]:
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for fam in m.registry.collect()
        if (all_samples or not fam.name.startswith(_ORDER_DEPENDENT)) and not fam.name.startswith(_PROCESS)
        for s in fam.samples
        if not s.name.endswith("_created")
    )


def engine_state(e: Engine, keys: list[str]) -> dict[str, Any]:
    return {
        "metrics": metrics_state(e.metrics),
        "activity": {
            r: (e.activity.hot_keys(r, 100), [e.activity.last_decision(r, k) for k in keys], e.activity.rate(r))
            for r in ROUTES
        },
        # each key's shadow evaluations in order: a batch queues its shadowed requests as it goes
        # and its decided ones' candidate and reference evaluations after their burst, one by one
        # each in its turn; only the order within a key reaches Redis as state (a stable sort)
        "queue": sorted(e.shadow.queue.take(len(e.shadow)), key=lambda item: (item.route, item.key)),
        "dropped": e.comparisons.dropped,
        "seq": e.decider.next_id(),
        "local": [(i.key, i.algorithm, i.last_seen_us) for i in e.local.items()],
        "divergence": sorted(e.divergence.pending().items()),
        "blocked": {r: e.blocked.top(r, n=50) for r in ROUTES},
    }


def _fresh(inputs: list[DecideInput]) -> list[DecideInput]:
    return [
        DecideInput(
            route=i.route,
            method=i.method,
            path=i.path,
            key=i.key,
            client_ip=i.client_ip,
            headers=dict(i.headers),
            cost=i.cost,
            request_id=i.request_id,
        )  # fmt: skip
        for i in inputs
    ]


async def run_all(engines: list[Engine], clock: Clock, inputs: list[DecideInput]) -> list[list[Any]]:
    """The items one by one through ``decide`` (engines[0]), as one batch (engines[1]), as
    one batch that asks for no headers (engines[2]) and each through its own ``decide`` call,
    all asked at once (engines[3]: gathered), same clock."""
    outs = []
    for n, e in enumerate(engines):
        clock.reset()
        fresh = _fresh(inputs)
        if n == 0:
            one: list[Any] = []
            for inp in fresh:
                try:
                    one.append(await e.decide(inp))
                except Exception as exc:  # noqa: BLE001 - compared with the batch's item in place
                    one.append(exc)
            outs.append(one)
            continue
        if n == 3:
            outs.append(list(await asyncio.gather(*(e.decide(inp) for inp in fresh), return_exceptions=True)))
            continue
        # the batch also gets every other plain item as a PlainInput tuple
        given: list[Any] = [
            (i.route, i.key, i.cost, i.request_id)
            if j % 2 and i.method is i.path is i.client_ip is None and not i.headers
            else i
            for j, i in enumerate(fresh)
        ]
        before = list(given)
        outs.append(await e.decider.decide_many(given, headers=n == 1))
        assert given == before  # the caller's list is left alone
    return outs


def check_same(engines: list[Engine], outs: list[list[Any]], inputs: list[DecideInput]) -> None:
    one, objs, dicts, gathered = outs
    assert len(one) == len(objs) == len(dicts) == len(gathered)
    for i, (a, b, c, d) in enumerate(zip(one, objs, dicts, gathered)):
        if isinstance(a, Exception):
            assert norm_exc(a) == norm_exc(b) == norm_exc(c) == norm_exc(d), i
            continue
        assert a == b == d, i
        assert c.headers == {} and dataclasses.replace(a, headers={}) == c, i  # the same answer, no headers
        assert orjson.dumps(a.to_dict()) == orjson.dumps(b.to_dict())
    keys = sorted({i.key for i in inputs if isinstance(i.key, str)})
    states = [engine_state(e, keys) for e in engines]
    for k in states[0]:
        assert states[0][k] == states[1][k] == states[2][k] == states[3][k], k
    # the two batch engines agree on every sample (the latency's count included)
    batch_metrics = [metrics_state(e.metrics, all_samples=True) for e in engines[1:3]]
    timed = ("_sum", "_bucket")  # wall time: how long each took differs
    assert [[x for x in b if not x[0].endswith(timed)] for b in batch_metrics][0] == [
        [x for x in b if not x[0].endswith(timed)] for b in batch_metrics
    ][1]


def batch(seed: int, n: int = 120) -> list[DecideInput]:
    """A mix of everything: plain items, request ids, costs that are fine, too big,
    zero or floats, unknown routes, bad and non-ASCII keys, method + path items, keys
    from headers, allow/deny-listed keys and IPs, overridden and adjusted keys."""
    import random

    rnd = random.Random(seed)
    out: list[DecideInput] = []
    for j in range(n):
        r = rnd.random()
        route = rnd.choice(ROUTES[:-1])
        key = f"k{rnd.randrange(6)}"
        if r < 0.55:
            out.append(DecideInput(route=route, key=key))
        elif r < 0.62:
            out.append(DecideInput(route=route, key=key, request_id=f"req-{seed}-{j}"))
        elif r < 0.67:
            out.append(DecideInput(route=route, key=key, cost=rnd.choice([2, 3, 0, 7, 10**6, 2.0, True])))
        elif r < 0.70:
            out.append(DecideInput(route="nope", key=key))
        elif r < 0.74:
            out.append(
                DecideInput(
                    route=route,
                    key=rnd.choice([" lead", "trail ", "tab\tkey", "x" * 257, "ключ", "é" * 200, "a:b/c d"]),
                )
            )
        elif r < 0.80:
            out.append(
                DecideInput(
                    method="GET",
                    path=f"/api/{route}/x",
                    headers={"X-Client-Id": key, "X-Tenant": rnd.choice(["big", "small"])},
                )
            )
        elif r < 0.84:
            out.append(
                DecideInput(
                    route="listed",
                    key=rnd.choice(["vip", "bad", "k1"]),
                    client_ip=rnd.choice([None, "203.0.113.9", "10.0.0.1"]),
                )
            )
        elif r < 0.88:
            out.append(DecideInput(route="over", key=rnd.choice(["big", "small"])))
        elif r < 0.92:
            out.append(DecideInput(route="keyadjusted", key=rnd.choice(["k1", "k2"])))
        elif r < 0.95:
            out.append(DecideInput(route=route, key=None, headers={"X-Client-Id": key}))
        else:
            out.append(DecideInput(method="GET", path="/elsewhere", client_ip=f"10.1.0.{rnd.randrange(3)}"))
    return out


MODES = [
    {n: (Mode.OFF, 0) for n in ROUTES},
    {n: (Mode.SHADOW, 0) for n in ROUTES},
    {n: (Mode.CANARY, 50) for n in ROUTES},
    {n: (Mode.ENFORCE, 0) for n in ROUTES},
    {
        n: (m, p)
        for n, (m, p) in zip(
            ROUTES, itertools.cycle([(Mode.OFF, 0), (Mode.SHADOW, 0), (Mode.CANARY, 30), (Mode.ENFORCE, 0)])
        )
    },
]


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("modes", MODES, ids=["off", "shadow", "canary", "enforce", "mixed"])
async def test_a_batch_is_its_items_one_by_one(redis_url, clock, modes):
    engines = [await make_engine(redis_url, clock) for _ in range(4)]
    try:
        set_modes(engines, modes)
        for seed in range(4):
            items = batch(seed)
            check_same(engines, await run_all(engines, clock, items), items)
        plain = [DecideInput(route="plain", key=f"b{i % 7}") for i in range(60)]  # the benchmark's shape
        check_same(engines, await run_all(engines, clock, plain), plain)
    finally:
        await close(*engines)


async def test_a_full_shadow_queue_drops_the_same_evaluations(redis_url, clock):
    engines = [await make_engine(redis_url, clock, queue=9) for _ in range(4)]
    try:
        set_modes(engines, {n: (Mode.SHADOW, 0) for n in ROUTES})
        items = [DecideInput(route="plain", key=f"q{i % 4}") for i in range(6)]
        items.insert(3, DecideInput(route="listed", key="k1"))
        items += [DecideInput(route="tight", key="q1") for _ in range(8)]
        check_same(engines, await run_all(engines, clock, items), items)
        check_same(engines, await run_all(engines, clock, items), items)
        assert engines[1].comparisons.dropped > 0
        totals = engines[1].divergence.pending()
        assert sum(c["shadow_dropped"] for c in totals.values()) == engines[1].comparisons.dropped
    finally:
        await close(*engines)


async def test_failed_redis_answers_go_through_the_failure_policy_alike(redis_url, clock):
    engines = [await make_engine(redis_url, clock) for _ in range(4)]
    try:
        set_modes(engines, {n: (Mode.ENFORCE, 0) for n in ROUTES})
        for e in engines:
            real = e.resilient.check_many
            calls = itertools.count()

            async def flaky(requests, *, overrides=None, degrade=True, _real=real, _calls=calls):
                outs = await _real(requests, overrides=overrides, degrade=degrade)
                for j, (_k, p, _c, _n) in enumerate(requests):
                    if next(_calls) % 3 == 1:  # every third request over the whole run, however batched
                        outs[j] = Outcome(
                            make_decision(False, 0, p.limit, 1_000_000, 1_000_000), "fail_closed", "injected", 503
                        )
                return outs

            real_one = e.resilient.check

            async def flaky_one(key, policy, cost=1, now_us=None, *, _real=real_one, _calls=calls, **kw):
                out = await _real(key, policy, cost, now_us, **kw)
                if next(_calls) % 3 == 1:
                    out = Outcome(
                        make_decision(False, 0, policy.limit, 1_000_000, 1_000_000), "fail_closed", "injected", 503
                    )
                return out

            e.resilient.check_many = flaky  # type: ignore[method-assign]
            e.resilient.check = flaky_one  # type: ignore[method-assign]  # decide's one request
        for seed in range(3):
            items = batch(100 + seed)
            check_same(engines, await run_all(engines, clock, items), items)
    finally:
        await close(*engines)


async def test_plans_follow_mode_and_adjustment_changes(redis_url, clock):
    engines = [await make_engine(redis_url, clock) for _ in range(4)]
    try:
        for modes in MODES:
            set_modes(engines, modes)
            items = batch(7, 40)
            check_same(engines, await run_all(engines, clock, items), items)
        # the route's plan is rebuilt when its adjustment changes ...
        set_modes(engines, {"plain": (Mode.ENFORCE, 0)})
        set_adjustments(engines, {"plain": {"distributed": {"average": 2, "period": 60, "burst": 2}}})
        items = [DecideInput(route="plain", key="z") for _ in range(4)]
        outs = await run_all(engines, clock, items)
        check_same(engines, outs, items)
        assert [(r.allowed, r.distributed.limit) for r in outs[1]] == [(True, 2), (True, 2), (False, 2), (False, 2)]
        # ... and when its mode does
        set_modes(engines, {"plain": (Mode.OFF, 0)})
        items = [DecideInput(route="plain", key="z2")]
        outs = await run_all(engines, clock, items)
        assert (outs[1][0].mode, outs[1][0].enforced_by, outs[1][0].distributed) == ("off", "local", None)
    finally:
        await close(*engines)


async def test_decide_is_the_batch_path_with_one_item(redis_url, clock):
    """decide() raises the item's error; the latency is observed under the mode."""
    (e,) = [await make_engine(redis_url, clock)]
    try:
        set_modes([e], {"plain": (Mode.ENFORCE, 0)})
        r = await e.decide(DecideInput(route="plain", key="x"))
        assert (r.enforced_by, r.mode, r.distributed is not None) == ("distributed", "enforce", True)
        with pytest.raises(ValueError, match="cost"):
            await e.decide(DecideInput(route="plain", key="x", cost=99))
        m = e.metrics.registry
        assert m.get_sample_value("rate_limit_decision_duration_seconds_count", {"mode": "enforce"}) == 1
    finally:
        await close(e)


def _batch_sizes(e: Engine) -> list[int]:
    """The size of every batch the engine's decider runs from now on."""
    sizes: list[int] = []
    run = e.decider._run

    async def counted(inputs, *args, **kwargs):
        sizes.append(len(inputs))
        return await run(inputs, *args, **kwargs)

    e.decider._run = counted  # type: ignore[method-assign]
    return sizes


def _evalsha_calls(redis_url: str) -> int:
    import redis as redis_sync

    stats = redis_sync.Redis.from_url(redis_url).info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_single_decisions_asked_together_are_one_batch_and_one_redis_call(redis_url, clock):
    """Ten callers in one pass of the loop: one batch, one call to Redis, each caller its own
    answer, in the order asked; a caller asking later opens another gathering."""
    e = await make_engine(redis_url, clock)
    try:
        set_modes([e], {"plain": (Mode.ENFORCE, 0)})
        sizes = _batch_sizes(e)
        before = _evalsha_calls(redis_url)
        got = await asyncio.gather(*(e.decide(DecideInput(route="plain", key="g")) for _ in range(10)))
        assert sizes == [10]
        assert _evalsha_calls(redis_url) - before == 1  # the script made for many keys, once
        # the route allows 5 a second: the first five asked are allowed, in order
        assert [r.allowed for r in got] == [True] * 5 + [False] * 5
        assert [r.distributed.remaining for r in got[:5]] == [4, 3, 2, 1, 0]
        assert [int(r.request_id.rsplit("-", 1)[1]) for r in got] == list(range(1, 11))
        await e.decide(DecideInput(route="plain", key="h"))
        assert sizes == [10, 1]
    finally:
        await close(e)


async def test_a_gathering_holds_at_most_its_bound_and_one_per_headers_flag(redis_url, clock):
    from control_plane.decision.gather import MAX_GATHERED

    e = await make_engine(redis_url, clock)
    try:
        set_modes([e], {"free": (Mode.OFF, 0)})
        sizes = _batch_sizes(e)
        n = MAX_GATHERED + 44
        got = await asyncio.gather(*(e.decide(DecideInput(route="free", key=f"m{i}")) for i in range(n)))
        assert sizes == [MAX_GATHERED, 44] and all(r.allowed for r in got)
        sizes.clear()
        plain, bare = await asyncio.gather(
            e.decider.decide(DecideInput(route="plain", key="p")),
            e.decider.decide(DecideInput(route="plain", key="p"), headers=False),
        )
        assert sorted(sizes) == [1, 1]  # one batch renders headers, the other does not
        assert plain.headers and bare.headers == {}
        assert plain.local.remaining == 4 and bare.local.remaining == 3  # asked in this order, decided in it
    finally:
        await close(e)


async def test_a_caller_cancelled_while_it_waits_leaves_the_others_decided(redis_url, clock):
    e = await make_engine(redis_url, clock)
    try:
        set_modes([e], {"plain": (Mode.ENFORCE, 0)})
        tasks = [asyncio.create_task(e.decide(DecideInput(route="plain", key="c"))) for _ in range(5)]
        await asyncio.sleep(0)  # every caller has asked; the gathering's own task has not run yet
        tasks[2].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[2], asyncio.CancelledError)
        others = [r for i, r in enumerate(done) if i != 2]
        # the cancelled caller's request was decided all the same (it had been asked): it counted
        assert [r.distributed.remaining for r in others] == [4, 3, 1, 0]
    finally:
        await close(e)


async def test_a_failed_batch_fails_each_caller_with_its_error(redis_url, clock):
    e = await make_engine(redis_url, clock)
    try:

        async def broken(*_args, **_kwargs):
            raise RuntimeError("the batch broke")

        e.decider._run = broken  # type: ignore[method-assign]
        got = await asyncio.gather(
            *(e.decide(DecideInput(route="plain", key="f")) for _ in range(3)), return_exceptions=True
        )
        assert [str(x) for x in got] == ["the batch broke"] * 3
        assert not e.decider._tasks  # the gathering's task ended (its error went to the callers, not the loop)
    finally:
        await close(e)
