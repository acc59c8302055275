"""Reserve and settle (limiter/reservations.py) agree bit for bit across the pure functions, both
``LocalLimiter`` paths and ``lua/reserve.lua`` / ``lua/settle.lua`` on real Redis (standalone and
a 3-master cluster): hypothesis mixes reservations, settles (first and repeated, unknown ids, ones never booked),
decisions and charges on one key at random times, past reservations' TTLs and the time an ended
one is remembered, under every way a route may keep them (cover or positive, charged or released
on expiry, a bound on the records); each answer, the key's state and its whole book are compared
after every step, and Redis keeps the key at least as long as
the record a call wrote."""

from __future__ import annotations

import asyncio
import itertools
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_strategies import policies

from limiter import Algorithm, LocalLimiter, RedisLimiter
from limiter.algorithms import decide
from limiter.charges import charge
from limiter.policy import Charge
from limiter.reservations import Book, Terms, reserve, settle
from limiter.resp import encode_command

T0 = 1_700_000_000_000_000
_ids = itertools.count()
CHARGING = [a for a in Algorithm if a is not Algorithm.SLIDING_LOG]


@st.composite
def terms(draw, period_us):
    return Terms(
        ttl_us=draw(st.sampled_from([period_us // 2 or 1, period_us, 3 * period_us])),
        positive=draw(st.booleans()),
        max_held=draw(st.integers(1, 8)),
        release=draw(st.booleans()),
        keep_us=draw(st.sampled_from([1, period_us, 2 * period_us, 10 * period_us])),
    )


@st.composite
def operations(draw, policy, t):
    """Steps, each ``(kind, step, amount, id)``: "reserve" an estimate, "settle" at an actual cost,
    "unbooked" (a settle of a reservation never booked), "decide" or "charge" a cost (no id).
    Most settles name a reservation made before (at, below or above its estimate, or nothing), a
    few an unknown id; most reservations a new id, a few a used one; steps land on either side of
    a TTL, of the time an ended record is remembered and of a window's end."""
    w = policy.period_us
    top = 6 if policy.unlimited else min(policy.limit, 6)
    out = []
    made: dict[str, int] = {}
    for _ in range(draw(st.integers(1, 30))):
        step = draw(
            st.one_of(
                st.just(0),
                st.integers(0, w),
                st.integers(0, 4 * w),
                st.integers(-w, 0),
                st.sampled_from([t.ttl_us - 1, t.ttl_us, t.keep_us, w - 1, w]),
            )
        )
        kind = draw(
            st.sampled_from(["reserve", "reserve", "settle", "settle", "settle", "unbooked", "decide", "charge"])
        )
        if kind == "settle" and not made:
            kind = "reserve"
        if kind == "unbooked":  # a settle of a reservation never booked here: mostly a new id
            used = list(made)
            rid = draw(st.sampled_from(used)) if used and draw(st.integers(0, 3)) == 0 else f"u{len(made)}"
            made.setdefault(rid, 0)
            out.append((kind, step, draw(st.integers(0, 2 * top)), rid))
            continue
        if kind == "reserve":
            used = list(made)
            rid = draw(st.sampled_from(used)) if used and draw(st.integers(0, 9)) == 0 else f"r{len(made)}"
            amount = draw(st.integers(1, top))
            made.setdefault(rid, amount)
        elif kind == "settle":
            if draw(st.integers(0, 9)):
                rid = draw(st.sampled_from(list(made)))
                estimate = made[rid]
                amount = draw(st.sampled_from([0, estimate - 1, estimate, estimate + 1, 2 * estimate + 3]))
                amount = max(0, amount)
            else:
                rid = "unknown"
                amount = draw(st.integers(0, 9))
        elif kind == "decide":
            rid, amount = "", draw(st.integers(1, min(top, 3)))
        else:
            rid, amount = "", draw(st.integers(-3, 2 * top))
        out.append((kind, step, amount, rid))
    return out


def pure(state, book, now, policy, op, t):
    kind, _, amount, rid = op
    if kind == "reserve":
        out, state, book = reserve(state, book, now, policy, estimate=amount, rid=rid, terms=t)
    elif kind in ("settle", "unbooked"):
        out, state, book = settle(
            state, book, now, policy, rid=rid, actual=amount, terms=t, unbooked=kind == "unbooked"
        )
    elif kind == "decide":
        out, state = decide(state, now, policy, amount)
    else:
        out, state = charge(state, now, policy, Charge(amount))
    return out, state, book


async def on_limiter(lim, key, policy, op, now, t):
    kind, _, amount, rid = op
    if kind == "reserve":
        r = lim.reserve(key, policy, amount, rid=rid, terms=t, now_us=now)
    elif kind in ("settle", "unbooked"):
        r = lim.settle(key, policy, amount, rid=rid, terms=t, now_us=now, unbooked=kind == "unbooked")
    else:
        r = lim.check(key, policy, amount if kind == "decide" else Charge(amount), now)
    return await r if asyncio.iscoroutine(r) else r


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
def test_reservations_agree_in_python_both_local_paths_and_lua(any_redis_url, data):
    policy = data.draw(policies(CHARGING))
    t = data.draw(terms(policy.period_us))
    ops = data.draw(operations(policy, t))
    key = f"res{next(_ids)}"

    async def run() -> None:
        rl = RedisLimiter.from_url(any_redis_url, namespace="reservediff", state_format=2)
        local, local_py = LocalLimiter(speedups=True), LocalLimiter(speedups=False)
        state, book, now = None, Book.empty(), T0
        try:
            for i, op in enumerate(ops):
                now += op[1]
                began = time.monotonic()
                want, state, book = pure(state, book, now, policy, op, t)
                got = [await on_limiter(lim, key, policy, op, now, t) for lim in (rl, local, local_py)]
                assert got == [want] * 3, f"step {i} {op}: pure={want} redis/local/py={got} {policy} {t}"
                assert await rl.raw_state(key, policy) == state, f"step {i} {op}: state"
                assert local.state(key) == local_py.state(key) == state or state is None, f"step {i}: local state"
                assert await rl.raw_book(key) == book == local.book(key) == local_py.book(key), f"step {i} {op}: book"
                h = book.held.get(op[3])
                wrote = want.reserved if op[0] == "reserve" else op[0] != "decide" and op[0] != "charge" and (
                    getattr(want, "status", None) == "settled")  # fmt: skip
                if wrote and h is not None and h.until_us > now:  # Redis keeps the key as long as the record it wrote
                    rkey = rl.redis_key(key)
                    pttl_ms = await rl.backend.call(rkey, encode_command("PTTL", rkey))
                    waited_ms = (time.monotonic() - began) * 1000
                    assert pttl_ms >= (h.until_us - now) / 1000 - waited_ms - 1, f"step {i} {op}: the key's TTL"
        finally:
            await rl.aclose()

    asyncio.run(run())
