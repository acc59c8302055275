"""The batch fast path gives exactly what the per-item path gives.

``Engine.decide_many`` decides plain items (a named route without lists, overrides,
per-key adjustments or external limits; a plain key; an int cost) inline, with per-route
lookups hoisted out of the loop and metric increments added up. These tests run the
same batches through the new code and through the original per-item implementation
(kept below as :func:`reference_decide_many`), each on its own engine with the same
clock, and compare everything: the answers, metrics (values and label order), activity,
the shadow queue, request ids, limiter state, divergence and would-be-blocked records.

The endpoint's hand-written body check (``_fast_items``) is compared with pydantic +
``_input`` on generated bodies, and ``_rejected`` with ``_body``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import types
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import control_plane.engine as engine_mod
from control_plane.api import decide as decide_api
from control_plane.api.deps import ApiError
from control_plane.api.schemas import BatchRequest, DecideRequest
from control_plane.engine import DecideInput, DecideResult, Engine, UnknownRoute, _Pending, _with_source
from control_plane.external import Resolution
from control_plane.metrics import Metrics, _Family
from control_plane.rollout import Mode, RouteState
from control_plane.rules import parse_rules
from control_plane.settings import load_settings
from limiter import Policy, RedisLimiter
from limiter.redis_limiter import make_redis_py_client

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


# --------------------------------------------------------------------------- reference


async def reference_decide_many(self: Engine, inputs: list[DecideInput]) -> list[Any]:
    """Engine.decide_many before the fast path (verbatim, one item at a time)."""
    t0 = time.perf_counter()
    out: list[Any] = []
    pending: list[tuple[int, _Pending]] = []
    resolved: list[Any] = []
    lookups: list[int] = []
    for i, inp in enumerate(inputs):
        try:
            rk = self.resolve(inp)
        except (UnknownRoute, ValueError) as exc:
            resolved.append(exc)
            continue
        resolved.append(rk)
        if rk[0].external is not None and not self._listed(rk[0], rk[1], inp.client_ip):
            lookups.append(i)
    ext: dict[int, Resolution] = {}
    if lookups:
        got = await asyncio.gather(
            *[
                self.external.resolve(
                    resolved[i][0], resolved[i][1], inputs[i].method, inputs[i].path, inputs[i].headers
                )
                for i in lookups
            ]
        )
        ext = dict(zip(lookups, got))
    for i, (inp, rk) in enumerate(zip(inputs, resolved)):
        if isinstance(rk, Exception):
            out.append(rk)
            continue
        res = ext.get(i)
        try:
            step = self._begin(
                rk[0],
                rk[1],
                inp.cost,
                inp.request_id or self._next_id(),
                inp.client_ip,
                res.limits if res is not None else None,
            )
        except (UnknownRoute, ValueError) as exc:
            out.append(exc)
            continue
        if isinstance(step, _Pending):
            pending.append((len(out), step))
        out.append(step)
    if pending:
        outcomes = await self.resilient.check_many(
            [(p.lkey, p.dist_policy, p.cost, p.now_us) for _, p in pending],
            overrides=[(p.failure_policy, p.failure_code) for _, p in pending],
        )
        for (i, p), outcome in zip(pending, outcomes):
            out[i] = self._complete(p, outcome)
    for i, res in ext.items():
        r = out[i]
        if isinstance(r, DecideResult):
            out[i] = _with_source(r, res)
    if inputs:
        per = (time.perf_counter() - t0) / len(inputs)
        self.metrics.child(self.metrics.latency, "batch").observe(per)
    return out


# --------------------------------------------------------------------------- harness


class Clock:
    """time.time_ns for the engine module: a fixed start, +step_us per call, so two
    engines fed the same batches see the same timestamps (minute rollovers included)."""

    def __init__(self, start_us: int, step_us: int) -> None:
        self.start_us = start_us
        self.step_us = step_us
        self.reset()

    def reset(self) -> None:
        self._n = itertools.count()

    def time_ns(self) -> int:
        return (self.start_us + next(self._n) * self.step_us) * 1000


@pytest.fixture
def clock(monkeypatch):
    # start 30 ms before a minute boundary, so batches cross it
    start = (int(time.time()) // 60 * 60 + 60) * 1_000_000 - 30_000
    c = Clock(start, 997)
    fake = types.SimpleNamespace(
        time_ns=c.time_ns, time=time.time, perf_counter=time.perf_counter, monotonic=time.monotonic
    )
    monkeypatch.setattr(engine_mod, "time", fake)
    return c


async def make_engine(redis_url: str, *, queue: int = 10_000) -> Engine:
    ns = f"fp{uuid.uuid4().hex[:10]}"
    s = load_settings(
        redis_url=redis_url,
        namespace=ns,
        instance_id="inst",
        enable_distributed_rate_limiting=True,
        shadow_queue_size=queue,
        rules_path=None,
    )
    redis = RedisLimiter.from_url(redis_url, namespace=ns)
    client = make_redis_py_client(redis_url)
    eng = Engine(s, redis=redis, client=client, metrics=Metrics(), rules=parse_rules(RULES, s))
    await redis.load_scripts()
    eng._adjust = {
        "adjusted": {"local": Policy(average=3, burst=3), "distributed": Policy(average=2, period=5, burst=2)},
        "keyadjusted\x00k1": {"local": Policy(average=1, burst=1)},
    }
    return eng


async def close(*engines: Engine) -> None:
    for e in engines:
        await e.redis.aclose()
        await e.client.aclose()


def set_modes(engines: list[Engine], modes: dict[str, tuple[Mode, int]]) -> None:
    for e in engines:
        for name, (mode, pct) in modes.items():
            e._states[name] = RouteState(mode=mode, canary_percent=pct)


def norm_exc(x: Any) -> Any:
    if isinstance(x, Exception):
        return (type(x).__name__, str(x), getattr(x, "field", None))
    return x


def metrics_state(m: Metrics) -> list[Any]:
    fams = []
    for name, fam in vars(m).items():
        if isinstance(fam, _Family):
            fams.append((name, [(k, v.value) for k, v in fam._children.items()]))
    fams.append(
        (
            "latency_count",
            sorted(
                (s.labels.get("mode"), s.value)
                for f in m.latency.collect()
                for s in f.samples
                if s.name.endswith("_count")
            ),
        )
    )
    fams.append(
        (
            "backend_errors",
            [s.value for f in m.backend_errors.collect() for s in f.samples if s.name.endswith("_total")],
        )
    )
    return fams


def engine_state(e: Engine) -> dict[str, Any]:
    return {
        "metrics": metrics_state(e.metrics),
        "activity": {
            n: (a.counts, a.previous, list(a.last.items()), a.minute, a.per_second, a.external)
            for n, a in e._activity.items()
        },
        "queue": list(e._queue._queue),  # type: ignore[attr-defined]
        "dropped": e.shadow_dropped,
        "seq": e._seq,
        "local": [(k, list(v)) for k, v in e.local._data.items()],
        "divergence": sorted((route, tuple(c)) for (route, _), c in e.divergence._pending.items()),
        "blocked": {r: e.blocked.top(r, n=50) for r in ROUTES},
    }


async def run_all(engines: list[Engine], clock: Clock, inputs: list[DecideInput]) -> list[list[Any]]:
    """The batch through the reference (engines[0]), the new code returning objects
    (engines[1]) and the new code returning dicts (engines[2]), same clock for each."""
    outs = []
    for n, e in enumerate(engines):
        clock.reset()
        fresh = [
            DecideInput(i.route, i.method, i.path, i.key, i.client_ip, dict(i.headers), i.cost, i.request_id)
            for i in inputs
        ]
        if n == 0:
            outs.append(await reference_decide_many(e, fresh))
        else:
            # the new code also gets every other plain item as a PlainInput tuple
            given: list[Any] = [
                (i.route, i.key, i.cost, i.request_id)
                if j % 2 and i.method is i.path is i.client_ip is None and not i.headers
                else i
                for j, i in enumerate(fresh)
            ]
            before = list(given)
            outs.append(await e.decide_many(given, as_dicts=n == 2))
            assert given == before  # the caller's list is left alone
    return outs


def check_same(engines: list[Engine], outs: list[list[Any]]) -> None:
    ref, objs, dicts = outs
    assert len(ref) == len(objs) == len(dicts)
    for i, (a, b, c) in enumerate(zip(ref, objs, dicts)):
        if isinstance(a, Exception):
            assert norm_exc(a) == norm_exc(b) == norm_exc(c), i
            continue
        assert a == b, i
        assert list(a.to_dict().items()) == list(c.items()), i  # same keys, same order
        assert orjson.dumps(a.to_dict()) == orjson.dumps(c)
    states = [engine_state(e) for e in engines]
    for k in states[0]:
        assert states[0][k] == states[1][k] == states[2][k], k


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


# --------------------------------------------------------------------------- engine


@pytest.mark.parametrize("modes", MODES, ids=["off", "shadow", "canary", "enforce", "mixed"])
async def test_fast_path_matches_per_item_path(redis_url, clock, modes):
    engines = [await make_engine(redis_url) for _ in range(3)]
    try:
        set_modes(engines, modes)
        for seed in range(4):
            check_same(engines, await run_all(engines, clock, batch(seed)))
        # a plain batch, the benchmark's shape
        check_same(
            engines, await run_all(engines, clock, [DecideInput(route="plain", key=f"b{i % 7}") for i in range(60)])
        )
    finally:
        await close(*engines)


@pytest.mark.parametrize("mode", [Mode.OFF, Mode.SHADOW, Mode.ENFORCE])
async def test_general_items_between_fast_ones_keep_the_order_of_updates(redis_url, clock, mode):
    """A float or bool cost takes the general path; the gauge must end at the last
    item's value and metric children must appear in first-seen order, also on a fresh
    engine whose first local answer is a rejection."""
    engines = [await make_engine(redis_url) for _ in range(3)]
    try:
        set_modes(engines, {n: (mode, 0) for n in ROUTES})
        for e in engines:  # the first local answer of the batch is a rejection
            e.local.check("plain:d1", e.rules.get("plain").local, 5, clock.start_us)
            e.local.check("tight:d1", e.rules.get("tight").local, 100, clock.start_us)
        items = [
            DecideInput(route="plain", key="d0", cost=0),  # an error: plain's plan is made first
            DecideInput(route="tight", key="d1"),  # rejected locally; finishes before plain's first
            DecideInput(route="plain", key="d1"),
            DecideInput(route="plain", key="d2"),
            DecideInput(route="listed", key="k9"),
            DecideInput(route="plain", key="d3", cost=2.0),
            DecideInput(route="tight", key="d2"),
            DecideInput(route="tight", key="d3", cost=True),
            DecideInput(route="plain", key="d4", cost=1),
            DecideInput(route="plain", key="d5", cost=2.0),  # last for plain: its gauge value stays
        ]
        check_same(engines, await run_all(engines, clock, items))
        check_same(engines, await run_all(engines, clock, items[::-1]))
    finally:
        await close(*engines)


async def test_fast_path_when_the_shadow_queue_fills(redis_url, clock):
    engines = [await make_engine(redis_url, queue=9) for _ in range(3)]
    try:
        set_modes(engines, {n: (Mode.SHADOW, 0) for n in ROUTES})
        items = [DecideInput(route="plain", key=f"q{i % 4}") for i in range(6)]
        items.insert(3, DecideInput(route="listed", key="k1"))  # the general path in between
        items += [DecideInput(route="tight", key="q1") for _ in range(8)]
        check_same(engines, await run_all(engines, clock, items))
        check_same(engines, await run_all(engines, clock, items))
        assert engines[1].shadow_dropped > 0
    finally:
        await close(*engines)


async def test_fast_path_when_redis_answers_are_missing(redis_url, clock):
    """Failed distributed answers go through the failure policy exactly as before."""
    engines = [await make_engine(redis_url) for _ in range(3)]
    try:
        set_modes(engines, {n: (Mode.ENFORCE, 0) for n in ROUTES})
        for e in engines:
            real = e.resilient.check_many

            async def flaky(requests, *, overrides=None, degrade=True, _real=real, _e=e):
                outs = await _real(requests, overrides=overrides, degrade=degrade)
                res = _e.resilient
                for j, ((k, p, c, n), (fp, fc)) in enumerate(
                    zip(requests, overrides or [(None, None)] * len(requests))
                ):
                    if j % 3 == 1:
                        res.backend_errors += 1
                        outs[j] = res._degraded(k, p, c, n, "injected", fp, fc)
                return outs

            e.resilient.check_many = flaky  # type: ignore[method-assign]
        for seed in range(3):
            check_same(engines, await run_all(engines, clock, batch(100 + seed)))
    finally:
        await close(*engines)


async def test_fast_path_follows_a_mode_change_between_batches(redis_url, clock):
    engines = [await make_engine(redis_url) for _ in range(3)]
    try:
        for modes in MODES:
            set_modes(engines, modes)
            check_same(engines, await run_all(engines, clock, batch(7, 40)))
        for e in engines:  # adjustments change too
            e._adjust = {"plain": {"distributed": Policy(average=2, burst=2)}}
        check_same(engines, await run_all(engines, clock, batch(8, 40)))
    finally:
        await close(*engines)


# --------------------------------------------------------------------------- endpoint


def _pydantic_inputs(raw: bytes) -> list[Any] | None:
    try:
        req = BatchRequest.model_validate_json(raw)
    except Exception:  # noqa: BLE001
        return None
    out: list[Any] = []
    for item in req.requests:
        try:
            out.append(decide_api._input(item))
        except ApiError as exc:
            out.append(exc)
    return out


def _norm_inputs(items: list[Any]) -> list[Any]:
    """Comparable forms; types count too (``True == 1``, but a bool cost is an error)."""
    out: list[Any] = []
    for x in items:
        if isinstance(x, ApiError):
            out.append((x.status, x.error, x.message, x.details))
        elif type(x) is tuple:  # a PlainInput
            assert len(x) == 4
            out.append(_norm_inputs([DecideInput(route=x[0], key=x[1], cost=x[2], request_id=x[3])])[0])
        else:
            out.append(
                [
                    (f, type(getattr(x, f)), getattr(x, f))
                    for f in ("route", "method", "path", "key", "client_ip", "headers", "cost", "request_id")
                ]
            )
    return out


_H100 = {f"h{i}": "v" for i in range(100)}
#: per field: values pydantic takes, then values it refuses or converts
_POOLS: dict[str, tuple[list[Any], list[Any]]] = {
    "route": ([None, "a", "api", "x" * 64, "é", " r "], ["x" * 65, "", 5]),
    "method": ([None, "GET", "get", "x" * 16], ["A" * 17, "", "GET\n", "PÖST", "G1", 1, "ǅ"]),
    "path": ([None, "/", "/a/b", "/" + "x" * 2047, "/é"], ["/" + "x" * 2048, "a", "", 3]),
    "key": ([None, "k", "x" * 256, "é" * 256, " k"], ["x" * 257, "", "é" * 257, 1]),
    "client_ip": ([None, "", "10.0.0.1", "x" * 64], ["x" * 65, 7]),
    "headers": (
        [{}, {"a": "b"}, {"X-Client-Id": "c"}, _H100],
        [{"a": 1}, None, [], "h", {**_H100, "one-more": "v"}, {"a": None}],
    ),
    "cost": ([1, 2, 10**6], [10**6 + 1, 0, -1, 1.0, 2.5, True, False, "2", None, 10**20]),
    "request_id": ([None, "", "r", "x" * 128], ["x" * 129, 5]),
}
_item = st.tuples(
    st.fixed_dictionaries(
        {},
        optional={
            f: st.sampled_from(ok) | st.sampled_from(ok) | st.sampled_from(ok) | st.sampled_from(bad)
            for f, (ok, bad) in _POOLS.items()
        },
    ),
    st.sampled_from([False] * 9 + [True]),
).map(lambda t: {**t[0], "extra": 1} if t[1] else t[0])  # "extra" is not a field
TAKEN: list[bool] = []


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.lists(_item, min_size=0, max_size=3), st.sampled_from(["plain"] * 6 + ["extra", "list"]))
def test_fast_body_check_agrees_with_pydantic(items, shape):
    body: Any = {"requests": items} if shape == "plain" else {"requests": items, "x": 1} if shape == "extra" else items
    raw = json.dumps(body).encode()
    fast = decide_api._fast_items(raw)
    slow = _pydantic_inputs(raw)
    TAKEN.append(fast is not None)
    if fast is not None:  # taken: pydantic must agree exactly
        assert slow is not None
        assert _norm_inputs(fast) == _norm_inputs(slow)
    else:  # both strict: what the fast check leaves to pydantic, pydantic refuses too
        assert slow is None, items


@pytest.mark.parametrize(
    "body",
    [
        {"requests": [{"route": "api", "key": "b1"}]},
        {"requests": [{"route": "api", "key": "b1", "cost": 3, "request_id": "r"}, {"route": "api"}, {"key": "x"}]},
        {
            "requests": [
                {"method": "GET", "path": "/a", "headers": {"X-Client-Id": "z"}},
                {"method": "post", "path": "/b", "client_ip": "10.0.0.1"},
            ]
        },
        {
            "requests": [
                {"route": "api", "key": "k", "headers": {}},
                {"route": "api", "client_ip": ""},
                {"route": "r", "request_id": ""},
            ]
        },
    ],
)
def test_plain_bodies_take_the_fast_check(body):
    raw = orjson.dumps(body)
    fast = decide_api._fast_items(raw)
    assert fast is not None
    assert _norm_inputs(fast) == _norm_inputs(_pydantic_inputs(raw))


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"[]",
        b'{"requests": []}',
        b'{"requests": {}}',
        b'{"requests": [1]}',
        b'{"requests": [{"route": "a", "key": "k", "cost": 1.0}]}',
        b'{"requests": [{"route": "a", "key": "k", "cost": "2"}]}',
        b'{"requests": [{"route": "a", "key": "k", "cost": true}]}',
        b'{"requests": [{"route": "a", "key": "k"}], "more": 1}',
        b'{"requests": [{"route": "a", "key": "k", "nope": 1}]}',
        b'\xef\xbb\xbf{"requests": [{"route": "a", "key": "k"}]}',
        b'{"requests": [{"route": "a", "key": "k\\ud800"}]}',
    ],
)
def test_anything_unusual_goes_to_pydantic(raw):
    assert decide_api._fast_items(raw) is None


@pytest.mark.parametrize("cost", ["1.0", "2.0", '"2"', "true", "false", "null", "1e2"])
def test_a_cost_that_is_not_an_integer_is_refused_by_both(cost):
    """Strict types: neither check turns a float, a string or a bool into a cost."""
    raw = b'{"requests": [{"route": "a", "key": "k", "cost": %s}]}' % cost.encode()
    assert decide_api._fast_items(raw) is None
    with pytest.raises(ValidationError) as info:
        BatchRequest.model_validate_json(raw)
    assert info.value.errors()[0]["loc"] == ("requests", 0, "cost")


def test_too_many_items_are_refused_before_any_is_looked_at():
    """More than MAX_BATCH items: the 422 names ``requests``, whatever the items are
    (pydantic would validate every one of them first)."""
    from fastapi.exceptions import RequestValidationError

    for items in ([{"route": "a", "key": "k"}] * 10_001, [1] * 20_000, [{"cost": "x"}] * 10_001):
        with pytest.raises(RequestValidationError) as info:
            decide_api._fast_items(orjson.dumps({"requests": items}))
        (err,) = info.value.errors()
        assert err["loc"] == ("body", "requests") and f"got {len(items)}" in err["msg"]
    assert decide_api._fast_items(orjson.dumps({"requests": [{"route": "a", "key": "k"}] * 10_000})) is not None


def test_fast_body_check_mirrors_the_schema():
    """_fast_items hard-codes DecideRequest's and BatchRequest's constraints."""
    schema = DecideRequest.model_json_schema()["properties"]

    def limits(name: str) -> dict[str, Any]:
        p = schema[name]
        flat = dict(p)
        for alt in p.get("anyOf", []):
            flat.update(alt)
        return {k: flat.get(k) for k in ("minLength", "maxLength", "pattern", "minimum", "maximum", "maxProperties")}

    assert (
        set(schema)
        == set(decide_api._ITEM_FIELDS)
        == {"route", "method", "path", "key", "client_ip", "headers", "cost", "request_id"}
    )
    assert limits("route") == {
        "minLength": 1,
        "maxLength": 64,
        "pattern": None,
        "minimum": None,
        "maximum": None,
        "maxProperties": None,
    }
    assert limits("method") == {
        "minLength": 1,
        "maxLength": 16,
        "pattern": "^[A-Za-z]+$",
        "minimum": None,
        "maximum": None,
        "maxProperties": None,
    }
    assert limits("path") == {
        "minLength": 1,
        "maxLength": 2048,
        "pattern": "^/",
        "minimum": None,
        "maximum": None,
        "maxProperties": None,
    }
    assert limits("key") == {
        "minLength": 1,
        "maxLength": 256,
        "pattern": None,
        "minimum": None,
        "maximum": None,
        "maxProperties": None,
    }
    assert limits("client_ip") == {
        "minLength": None,
        "maxLength": 64,
        "pattern": None,
        "minimum": None,
        "maximum": None,
        "maxProperties": None,
    }
    assert limits("request_id") == {
        "minLength": None,
        "maxLength": 128,
        "pattern": None,
        "minimum": None,
        "maximum": None,
        "maxProperties": None,
    }
    assert limits("cost") == {
        "minLength": None,
        "maxLength": None,
        "pattern": None,
        "minimum": 1,
        "maximum": 1_000_000,
        "maxProperties": None,
    }
    assert limits("headers")["maxProperties"] == 100
    assert DecideRequest.model_config.get("extra") == "forbid" and BatchRequest.model_config.get("extra") == "forbid"
    req = BatchRequest.model_json_schema()["properties"]["requests"]
    assert (req["minItems"], req["maxItems"]) == (1, 10_000) == (1, decide_api.MAX_BATCH)
    # strict types on both sides (a test above checks the fast side by hand)
    assert DecideRequest.model_config.get("strict") is True and BatchRequest.model_config.get("strict") is True


def _result(**kw: Any) -> DecideResult:
    from limiter.policy import make_decision

    base: dict[str, Any] = dict(
        allowed=False, route="r", mode="enforce", canary_percent=0, enforced_by="local", key="k:1",
        local=make_decision(False, 0, 5, 100, 200), distributed=None, divergence=None, status_code=429,
        headers={"X-RateLimit-Limit": "5"}, request_id="id",
    )  # fmt: skip
    base.update(kw)
    return DecideResult(**base)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"allowed": True, "status_code": 200},
        {"list_match": "deny", "status_code": 403},
        {"enforced_by": "failure_policy", "status_code": 503, "backend_error": "down"},
        {"enforced_by": "distributed", "list_match": "allow"},
        {"limits_source": "stale", "backend_url": "http://x"},
    ],
)
def test_rejected_body_is_body(kw):
    """The batch endpoint's bodies (``_rejected`` on dicts) are what ``_body`` made of a
    DecideResult before (the original code, kept here)."""

    def original_body(result: DecideResult) -> dict[str, Any]:
        body = result.to_dict()
        if not result.allowed:
            body.update(decide_api._REJECTION)
            body["identifier"] = f"{result.route}:{result.key}"
            if result.list_match == "deny":
                body["error"] = "denied"
                body["message"] = "This client is on the route's deny list."
            elif result.enforced_by == "failure_policy":
                body["message"] = "The rate-limit backend is unavailable and this route fails closed."
        return body

    r = _result(**kw)
    want = list(original_body(r).items())
    assert list(decide_api._body(r).items()) == want
    got = r.to_dict() if r.allowed else decide_api._rejected(r.to_dict())
    assert list(got.items()) == want


def test_zz_generated_bodies_often_take_the_fast_check():
    """The generated bodies above are not mostly refused (which would test nothing)."""
    if len(TAKEN) > 100:  # the generated test ran in this session
        assert sum(TAKEN) > len(TAKEN) // 10, (sum(TAKEN), len(TAKEN))
