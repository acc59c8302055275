"""RedisLimiter against real Redis (standalone and a 3-master cluster).

Everything runs on loopback against ``redis-server`` processes started by
:mod:`limiter.embedded` (fixtures in ``conftest.py``); Redis is inspected with
redis-py. No fakes, no mocks of Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
import time

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

import limiter
from limiter import Algorithm, BucketView, Decision, LocalLimiter, Policy, RedisLimiter
from limiter.algorithms import token_bucket_tokens
from limiter.embedded import EmbeddedRedis, move_slots
from limiter.scripts import BOOKED, PEEK, SCRIPT_SETS, STATE_FORMATS, many

T0 = 1_700_000_000_000_000
SEC = 1_000_000
ALGS = list(Algorithm)

POLICIES = {
    Algorithm.TOKEN_BUCKET: Policy(average=10, period=1.0, burst=5, algorithm="token_bucket"),
    Algorithm.GCRA: Policy(average=10, period=1.0, burst=5, algorithm="gcra"),
    Algorithm.FIXED_WINDOW: Policy(average=5, period=1.0, algorithm="fixed_window"),
    Algorithm.SLIDING_WINDOW: Policy(average=5, period=1.0, algorithm="sliding_window"),
    Algorithm.SLIDING_LOG: Policy(average=5, period=1.0, algorithm="sliding_log"),
}

# policies whose TTL is more than the bare minimum (ttl_s is 4-6 s)
TTL_POLICIES = {
    Algorithm.TOKEN_BUCKET: Policy(average=10, period=1.0, burst=50, algorithm="token_bucket"),
    Algorithm.GCRA: Policy(average=10, period=1.0, burst=50, algorithm="gcra"),
    Algorithm.FIXED_WINDOW: Policy(average=5, period=2.0, algorithm="fixed_window"),
    Algorithm.SLIDING_WINDOW: Policy(average=5, period=2.0, algorithm="sliding_window"),
    Algorithm.SLIDING_LOG: Policy(average=5, period=2.0, algorithm="sliding_log"),
}

# each request's scripts, then the same made for many requests in one call (decisions, peeks,
# charges), then reserve and settle
ALL_SHAS = [
    *(s.sha for f in STATE_FORMATS for s in SCRIPT_SETS[f].all()),
    PEEK.sha,
    *(many(s).sha for f in STATE_FORMATS for s in SCRIPT_SETS[f].all()),
    *(s.sha for s in BOOKED.values()),
]


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def is_cluster(url: str) -> bool:
    return url.startswith("redis+cluster://")


def _host_port(url: str) -> tuple[str, int]:
    hostport = url.split("://", 1)[1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    return host, int(port)


def sync_client(url: str):
    """A redis-py client that routes keys (RedisCluster for the cluster URL)."""
    if is_cluster(url):
        host, port = _host_port(url)
        return RedisCluster(host=host, port=port)
    return redis.Redis.from_url(url)


def node_clients(url: str) -> list[redis.Redis]:
    """One plain client per master."""
    if is_cluster(url):
        rc = sync_client(url)
        try:
            return [redis.Redis(host=n.host, port=n.port) for n in rc.get_primaries()]
        finally:
            rc.close()
    return [redis.Redis.from_url(url)]


def node_for_key(url: str, rkey: bytes) -> redis.Redis:
    if is_cluster(url):
        rc = sync_client(url)
        try:
            n = rc.get_node_from_key(rkey)
            return redis.Redis(host=n.host, port=n.port)
        finally:
            rc.close()
    return redis.Redis.from_url(url)


@contextlib.asynccontextmanager
async def open_limiter(url: str, **kwargs):
    rl = RedisLimiter.from_url(url, **kwargs)
    try:
        yield rl
    finally:
        await rl.aclose()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def scenario(policy: Policy) -> list[tuple[int, int]]:
    """A fixed request sequence: bursts, refills, an out-of-order request, costs."""
    w = policy.period_us
    steps = [
        (0, 1),
        (0, 1),
        (0, 2),
        (0, 1),
        (0, 1),
        (w // 10, 1),
        (w // 3, 1),
        (-(w // 2), 1),
        (w, 3),
        (0, 2),
        (w // 7, 1),
        (2 * w, 5),
        (1, 1),
        (w // 2, 1),
        (w // 2 + 1, 4),
        (5 * w, 1),
    ]
    now = T0 + 123
    out = []
    for dt, cost in steps:
        now += dt
        out.append((now, cost))
    return out


# ---------------------------------------------------------------------------
# decisions and storage
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ALGS, ids=str)
async def test_check_equals_local_limiter(any_redis_url, alg):
    policy = POLICIES[alg]
    local = LocalLimiter()
    async with open_limiter(any_redis_url, namespace="parity") as rl:
        for now, cost in scenario(policy):
            got = await rl.check("client-1", policy, cost, now_us=now)
            exp = local.check("client-1", policy, cost, now_us=now)
            assert isinstance(got, Decision)
            assert got == exp, (now, cost)
            assert await rl.raw_state("client-1", alg) == local.state("client-1")
            # peek agrees too
            assert await rl.peek("client-1", policy, now_us=now + 1) == local.peek("client-1", policy, now_us=now + 1)


@pytest.mark.parametrize("alg", ALGS, ids=str)
async def test_keys_layout_and_ttl(any_redis_url, alg):
    policy = TTL_POLICIES[alg]
    client = sync_client(any_redis_url)
    try:
        async with open_limiter(any_redis_url, namespace="tenant-a.v1") as rl:
            now = time.time_ns() // 1000
            d = await rl.check("user:42/é", policy, now_us=now)
            assert d.allowed
            rkey = "rl:tenant-a.v1:user:42/é".encode()
            assert rl.redis_key("user:42/é") == rkey
            assert client.exists(rkey) == 1
            assert client.type(rkey) == (b"zset" if alg is Algorithm.SLIDING_LOG else b"hash")
            if alg is not Algorithm.SLIDING_LOG:
                from limiter.scripts import STATE_FIELDS

                assert set(client.hgetall(rkey)) == {f.encode() for f in STATE_FIELDS[alg]}
            # the key's TTL, extended when the state needs longer to become fresh
            expected = max(policy.ttl_s, math.ceil(d.reset_after_us / SEC) + 1)
            pttl = client.pttl(rkey)
            assert expected * 1000 - 1500 < pttl <= expected * 1000
            if alg in (Algorithm.TOKEN_BUCKET, Algorithm.GCRA, Algorithm.SLIDING_LOG, Algorithm.FIXED_WINDOW):
                assert expected == policy.ttl_s
            # nothing else was written
            if is_cluster(any_redis_url):
                total = sum(c.dbsize() for c in node_clients(any_redis_url))
            else:
                total = client.dbsize()
            assert total == 1
    finally:
        client.close()


async def test_ttl_formula_values():
    # the TTL target: max(ceil(burst / average_per_second), period_seconds) + period_seconds
    assert TTL_POLICIES[Algorithm.TOKEN_BUCKET].ttl_s == 6
    assert TTL_POLICIES[Algorithm.FIXED_WINDOW].ttl_s == 4
    assert Policy(average=100, period=60, burst=10).ttl_s == 120


async def test_default_namespace(redis_url):
    async with open_limiter(redis_url) as rl:
        await rl.check("k", POLICIES[Algorithm.TOKEN_BUCKET])
    assert redis.Redis.from_url(redis_url).keys() == [b"rl:shadowlimit:k"]


async def test_url_database_is_selected(redis_server):
    base = redis_server.url.rsplit("/", 1)[0]
    c5 = redis.Redis.from_url(base + "/5")
    c0 = redis.Redis.from_url(base + "/0")
    c5.flushdb()
    c0.flushdb()
    async with open_limiter(base + "/5", namespace="db") as rl:
        assert (await rl.check("k", POLICIES[Algorithm.GCRA])).allowed
        assert (await rl.check("k", POLICIES[Algorithm.GCRA])).remaining == 3
    assert c5.exists("rl:db:k") == 1
    assert c0.exists("rl:db:k") == 0
    c5.flushdb()


@pytest.mark.parametrize("cost", [0.0, False, -1, 1.5, "1", None, 6])
async def test_invalid_cost_raises(redis_url, cost):
    """(An int 0 is a peek, tests/integration/test_peek_parity.py; 0.0 and False are not.)"""
    async with open_limiter(redis_url) as rl:
        with pytest.raises(ValueError, match="^cost:"):
            await rl.check("k", POLICIES[Algorithm.TOKEN_BUCKET], cost=cost)
        with pytest.raises(ValueError, match="^cost:"):
            await rl.check_many([("k", POLICIES[Algorithm.TOKEN_BUCKET], cost, None)])


async def test_invalid_cost_for_unlimited_policy_is_rejected_like_local(redis_url):
    """BUG (minor parity): LocalLimiter.check validates the cost before the unlimited
    shortcut and raises; RedisLimiter.check / check_many return "allowed" for an
    unlimited policy before validating, so cost=0 / -5 / 1.5 pass silently."""
    unlimited = Policy.unlimited_policy()
    with pytest.raises(ValueError, match="^cost:"):
        LocalLimiter().check("k", unlimited, cost=-5)
    async with open_limiter(redis_url) as rl:
        with pytest.raises(ValueError, match="^cost:"):
            await rl.check("k", unlimited, cost=-5)


async def test_unlimited_policy_writes_nothing(any_redis_url):
    async with open_limiter(any_redis_url) as rl:
        for alg in ALGS:
            d = await rl.check("free", Policy(average=0, algorithm=alg))
            assert d.allowed
        assert await rl.peek("free", Policy.unlimited_policy()) == BucketView(1.0, 1, False, 0)
    assert sum(c.dbsize() for c in node_clients(any_redis_url)) == 0


# ---------------------------------------------------------------------------
# peek
# ---------------------------------------------------------------------------


async def test_peek_token_bucket_is_exact_and_writes_nothing(any_redis_url):
    policy = POLICIES[Algorithm.TOKEN_BUCKET]  # 10/s, burst 5
    client = sync_client(any_redis_url)
    rkey = b"rl:peek:k"
    try:
        async with open_limiter(any_redis_url, namespace="peek") as rl:
            # absent key: full bucket, stays absent
            view = await rl.peek("k", policy, now_us=T0)
            assert view == BucketView(5.0, 5, False, 0)
            assert client.exists(rkey) == 0

            await rl.check("k", policy, cost=4, now_us=T0)  # 1 token left
            before = client.hgetall(rkey)
            pttl_before = client.pttl(rkey)
            view = await rl.peek("k", policy, now_us=T0 + 150_000)
            state = await rl.raw_state("k", Algorithm.TOKEN_BUCKET)
            assert view.tokens == token_bucket_tokens(state, T0 + 150_000, policy)  # bit-exact
            assert view.tokens == pytest.approx(2.5, abs=1e-9)
            assert view.tokens != math.floor(view.tokens)  # fractional tokens are reported
            assert view.exists and view.limit == 5
            assert view.reset_after_us == 250_000
            # a peek before the stored time does not refill
            assert (await rl.peek("k", policy, now_us=T0 - SEC)).tokens == pytest.approx(1.0)
            # capped at burst
            assert (await rl.peek("k", policy, now_us=T0 + 60 * SEC)).tokens == 5.0
            for _ in range(20):
                await rl.peek("k", policy, now_us=T0 + 150_000)
            assert client.hgetall(rkey) == before
            pttl_after = client.pttl(rkey)
            assert 0 < pttl_after <= pttl_before
            # nothing consumed: exactly the refilled 2 whole tokens are there
            d = await rl.check("k", policy, cost=2, now_us=T0 + 150_000)
            assert d.allowed and d.remaining == 0
            assert not (await rl.check("k", policy, cost=1, now_us=T0 + 150_000)).allowed
    finally:
        client.close()


@pytest.mark.parametrize("alg", [a for a in ALGS if a is not Algorithm.TOKEN_BUCKET], ids=str)
async def test_peek_other_algorithms(any_redis_url, alg):
    policy = POLICIES[alg]
    client = sync_client(any_redis_url)
    rkey = b"rl:peek:k"
    local = LocalLimiter()
    try:
        async with open_limiter(any_redis_url, namespace="peek") as rl:
            view = await rl.peek("k", policy, now_us=T0)
            assert (view.tokens, view.limit, view.exists) == (5.0, 5, False)
            assert client.exists(rkey) == 0
            for now, cost in [(T0, 2), (T0 + 10, 1)]:
                await rl.check("k", policy, cost, now_us=now)
                local.check("k", policy, cost, now_us=now)
            snapshot = (
                client.zrange(rkey, 0, -1, withscores=True) if alg is Algorithm.SLIDING_LOG else client.hgetall(rkey)
            )
            pttl = client.pttl(rkey)
            for t in [T0 + 10, T0 + 400_000, T0 + SEC - 1, T0 + SEC + 20, T0 + 3 * SEC]:
                v = await rl.peek("k", policy, now_us=t)
                assert v == local.peek("k", policy, now_us=t)
                assert v.exists
            assert (await rl.peek("k", policy, now_us=T0 + 10)).tokens == 2.0
            after = (
                client.zrange(rkey, 0, -1, withscores=True) if alg is Algorithm.SLIDING_LOG else client.hgetall(rkey)
            )
            assert after == snapshot
            assert 0 < client.pttl(rkey) <= pttl
            # the 2 remaining requests are still there
            assert (await rl.check("k", policy, 2, now_us=T0 + 10)).allowed
            assert not (await rl.check("k", policy, 1, now_us=T0 + 10)).allowed
    finally:
        client.close()


# ---------------------------------------------------------------------------
# reset, check_many
# ---------------------------------------------------------------------------


async def test_reset(any_redis_url):
    policy = POLICIES[Algorithm.FIXED_WINDOW]
    client = sync_client(any_redis_url)
    try:
        async with open_limiter(any_redis_url, namespace="r") as rl:
            for _ in range(5):
                await rl.check("k", policy, now_us=T0)
            assert not (await rl.check("k", policy, now_us=T0)).allowed
            assert await rl.reset("k") is True
            assert client.exists(b"rl:r:k") == 0
            assert await rl.reset("k") is False
            assert await rl.reset("never") is False
            assert (await rl.check("k", policy, now_us=T0)).remaining == 4
    finally:
        client.close()


async def test_check_many_preserves_order_and_equals_sequential_checks(any_redis_url):
    tb, gc, fw, sw, sl = (POLICIES[a] for a in ALGS)
    unlimited = Policy.unlimited_policy()
    requests = []
    now = T0
    keys = ["user-a", "user-b"]
    pols = [tb, gc, fw, sw, sl]
    for i in range(120):
        now += (i % 5) * 7_000 - (40_000 if i % 11 == 0 else 0)
        key = keys[i % len(keys)]
        policy = pols[(i // 3) % len(pols)]
        requests.append((f"{key}-{policy.algorithm.value}", policy, 1 + i % 2, now))
        if i % 17 == 0:
            requests.append((key, unlimited, 1, now))
    async with (
        open_limiter(any_redis_url, namespace="batch") as batch_rl,
        open_limiter(any_redis_url, namespace="seq") as seq_rl,
    ):
        batch = await batch_rl.check_many(requests)
        sequential = [await seq_rl.check(k, p, c, now_us=t) for k, p, c, t in requests]
    assert len(batch) == len(requests)
    assert all(isinstance(d, Decision) for d in batch)
    assert batch == sequential
    assert any(not d.allowed for d in batch) and any(d.allowed for d in batch)
    # and both equal the in-process limiter
    local = LocalLimiter()
    assert batch == [local.check(k, p, c, now_us=t) for k, p, c, t in requests]


async def test_check_many_reports_a_failing_key_in_place(any_redis_url):
    client = sync_client(any_redis_url)
    try:
        client.rpush(b"rl:bad:broken", b"no algorithm keeps a list")  # a key of the wrong type: a script error
        policy = POLICIES[Algorithm.TOKEN_BUCKET]
        async with open_limiter(any_redis_url, namespace="bad") as rl:
            out = await rl.check_many([("a", policy, 1, T0), ("broken", policy, 1, T0), ("a", policy, 1, T0)])
            assert isinstance(out[0], Decision) and out[0].remaining == 4
            assert isinstance(out[1], limiter.BackendReplyError)
            assert isinstance(out[2], Decision) and out[2].remaining == 3
            with pytest.raises(limiter.BackendReplyError):
                await rl.check("broken", policy)
            assert (await rl.check("a", policy, now_us=T0)).remaining == 2
    finally:
        client.close()


# ---------------------------------------------------------------------------
# time source, scripts, ping
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("alg", [Algorithm.TOKEN_BUCKET, Algorithm.GCRA, Algorithm.SLIDING_LOG], ids=str)
async def test_time_source_redis(any_redis_url, alg):
    # slow refill (1 token/s, or a 60 s log window) so that the test's own duration
    # cannot add a whole token between the assertions
    if alg is Algorithm.SLIDING_LOG:
        policy = Policy(average=10, period=60.0, algorithm=alg)
    else:
        policy = Policy(average=5, period=5.0, burst=5, algorithm=alg)
    # a caller clock that is one hour wrong must not matter
    wrong_clock = lambda: time.time_ns() // 1000 - 3600 * SEC  # noqa: E731
    async with open_limiter(any_redis_url, namespace="rt", time_source="redis", clock=wrong_clock) as rl:
        decisions = [await rl.check("k", policy) for _ in range(3)]
        assert all(d.allowed for d in decisions)
        assert decisions[-1].remaining == policy.limit - 3
        server_now = await rl.redis_time_us()
        tnode = node_for_key(any_redis_url, rl.redis_key("k"))
        secs, micros = tnode.time()
        assert abs(server_now - (secs * SEC + micros)) < 2 * SEC
        state = await rl.raw_state("k", alg)
        if alg is Algorithm.TOKEN_BUCKET:
            stored = state[0]
        elif alg is Algorithm.GCRA:
            stored = state - 3 * policy.emission_us  # TAT = first arrival + 3 emissions
        else:
            stored = state[-1]
        assert abs(stored - server_now) < 2 * SEC
        view = await rl.peek("k", policy)
        assert view.exists and policy.limit - 3 - 1e-9 <= view.tokens < policy.limit - 2
        # explicit now_us is ignored with the Redis clock (no refill from the year 2286)
        d = await rl.check("k", policy, now_us=9_999_999_999_999_999)
        assert d.allowed and d.remaining <= policy.limit - 3


def _script_flush(url: str) -> None:
    for c in node_clients(url):
        c.script_flush()
        assert c.script_exists(*ALL_SHAS) == [False] * len(ALL_SHAS)


async def test_noscript_is_recovered_and_scripts_recached(any_redis_url):
    tb = POLICIES[Algorithm.TOKEN_BUCKET]
    async with open_limiter(any_redis_url, namespace="ns") as rl:
        assert (await rl.check("k", tb, now_us=T0)).remaining == 4
        _script_flush(any_redis_url)
        d = await rl.check("k", tb, now_us=T0)
        assert d.allowed and d.remaining == 3  # state survived, the script was re-sent
        owner = node_for_key(any_redis_url, rl.redis_key("k"))
        assert owner.script_exists(SCRIPT_SETS[rl.state_format].decisions[Algorithm.TOKEN_BUCKET].sha) == [True]
        # the cached script is used again afterwards
        assert (await rl.check("k", tb, now_us=T0)).remaining == 2
        # peek, check_many and the other algorithms recover too
        _script_flush(any_redis_url)
        assert (await rl.peek("k", tb, now_us=T0)).tokens == pytest.approx(2.0)
        assert owner.script_exists(PEEK.sha) == [True]
        _script_flush(any_redis_url)
        out = await rl.check_many([(f"m{i}", POLICIES[a], 1, T0) for i, a in enumerate(ALGS)])
        assert [d.remaining for d in out] == [4] * 5


async def test_load_scripts_and_scripts_loaded(any_redis_url):
    _script_flush(any_redis_url)
    async with open_limiter(any_redis_url) as rl:
        assert await rl.scripts_loaded() is False
        shas = await rl.load_scripts()
        assert shas == ALL_SHAS
        assert await rl.scripts_loaded() is True
        for c in node_clients(any_redis_url):
            assert c.script_exists(*ALL_SHAS) == [True] * len(ALL_SHAS)
        _script_flush(any_redis_url)
        assert await rl.scripts_loaded() is False


async def test_ping(any_redis_url):
    async with open_limiter(any_redis_url) as rl:
        assert await rl.ping() is None
        assert rl.describe()


async def test_ping_unreachable_raises_backend_unavailable():
    async with open_limiter(f"redis://127.0.0.1:{free_port()}", connect_timeout=0.5) as rl:
        with pytest.raises(limiter.BackendUnavailable):
            await rl.ping()


# ---------------------------------------------------------------------------
# construction and URLs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("namespace", ["", "a b", "x:y", "a" * 65, "é", "new\nline", 123, None])
def test_namespace_validation(namespace):
    with pytest.raises(ValueError) as exc:
        RedisLimiter.from_url("redis://127.0.0.1:6379/0", namespace=namespace)
    assert str(exc.value).startswith("namespace:")


@pytest.mark.parametrize("namespace", ["a", "A-b_c.d", "x" * 64, "0"])
def test_valid_namespaces(namespace):
    rl = RedisLimiter.from_url("redis://127.0.0.1:6379/0", namespace=namespace)
    assert rl.redis_key("k") == f"rl:{namespace}:k".encode()


def test_time_source_validation():
    with pytest.raises(ValueError, match="^time_source:"):
        RedisLimiter.from_url("redis://127.0.0.1:6379/0", time_source="server")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "http://127.0.0.1:6379",
        "127.0.0.1:6379",
        "redis://",
        "redis://127.0.0.1:port",
        "redis://127.0.0.1:6379/abc",
        "redis+cluster://127.0.0.1:7000/3",
        "redis://127.0.0.1:6379/2?cluster=true",
        "unix://",
    ],
)
def test_from_url_rejects_bad_urls(url):
    with pytest.raises(ValueError) as exc:
        RedisLimiter.from_url(url)
    assert str(exc.value).startswith("redis url:")


def test_from_url_rejects_a_bad_unix_db():
    """BUG: parse_redis_url (then in limiter/resp.py, now limiter/redis_url.py) does ``int(query.get("db", ["0"])[0])``
    for unix URLs without catching the error, so the ValueError reads
    "invalid literal for int() with base 10: 'abc'" instead of "redis url: ..."."""
    with pytest.raises(ValueError) as exc:
        RedisLimiter.from_url("unix:///tmp/redis.sock?db=abc")
    assert str(exc.value).startswith("redis url:")


@pytest.mark.parametrize("port", [-1, 70000])
def test_from_url_rejects_an_out_of_range_port(port):
    """BUG: parse_redis_url accepts any integer port. With 70000 the first check
    then fails with a bare ``OverflowError`` from ``connect()`` (outside the
    limiter's error tree, so a breaker never sees it); see the next test."""
    with pytest.raises(ValueError) as exc:
        RedisLimiter.from_url(f"redis://127.0.0.1:{port}/0")
    assert str(exc.value).startswith("redis url:")


async def test_an_out_of_range_port_fails_as_a_backend_error():
    """An Endpoint built directly (not from a URL) with a bad port still fails as a BackendError."""
    from limiter.resp import Endpoint, StandaloneBackend

    rl = RedisLimiter(StandaloneBackend(Endpoint(host="127.0.0.1", port=70000), connect_timeout=0.5))
    try:
        with pytest.raises(limiter.BackendError):
            await rl.check("k", POLICIES[Algorithm.TOKEN_BUCKET])
    finally:
        await rl.aclose()


def test_from_url_accepts_good_urls():
    for url, cluster in [
        ("redis://127.0.0.1:6379/0", False),
        ("redis://user:p%40ss@127.0.0.1:6380/2", False),
        ("rediss://127.0.0.1", False),
        ("redis+cluster://127.0.0.1:7000,127.0.0.1:7001", True),
        ("redis://127.0.0.1:7000?cluster=true", True),
        ("unix:///tmp/redis.sock?db=3", False),
    ]:
        rl = RedisLimiter.from_url(url)
        assert rl.backend.cluster is cluster


async def test_unix_socket_url():
    server = EmbeddedRedis(unix_socket=True)
    await asyncio.to_thread(server.start)
    try:
        assert server.url.startswith("unix://")
        policy = POLICIES[Algorithm.SLIDING_LOG]
        async with open_limiter(server.url, namespace="unix") as rl:
            decisions = [await rl.check("k", policy, now_us=T0) for _ in range(6)]
            assert [d.allowed for d in decisions] == [True] * 5 + [False]
            await rl.ping()
            assert (await rl.peek("k", policy, now_us=T0)).tokens == 0.0
        c = server.client()
        assert c.zcard("rl:unix:k") == 5
        c.close()
    finally:
        await asyncio.to_thread(server.stop)


# ---------------------------------------------------------------------------
# failures: refused, connect timeout, command timeout
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["redis", "redis+cluster"])
async def test_nothing_listening_raises_backend_unavailable_quickly(scheme):
    port = free_port()
    async with open_limiter(f"{scheme}://127.0.0.1:{port}", connect_timeout=0.5) as rl:
        t0 = time.monotonic()
        with pytest.raises(limiter.BackendUnavailable):
            await rl.check("k", POLICIES[Algorithm.TOKEN_BUCKET])
        assert time.monotonic() - t0 < 1.0
        # and again (no stuck connecting state)
        with pytest.raises(limiter.BackendUnavailable):
            await rl.check("k", POLICIES[Algorithm.TOKEN_BUCKET])


async def test_connect_timeout_is_honoured_by_a_silent_server():
    """A listener that never accepts and never answers: the check gives up after
    about connect_timeout with BackendUnavailable."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    # fill the accept queue so further SYNs may be dropped (a truly hanging connect)
    fillers = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(OSError):
            s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    try:
        async with open_limiter(f"redis://127.0.0.1:{port}", connect_timeout=0.3, command_timeout=5.0) as rl:
            t0 = time.monotonic()
            with pytest.raises(limiter.BackendUnavailable):
                await rl.check("k", POLICIES[Algorithm.TOKEN_BUCKET])
            elapsed = time.monotonic() - t0
            assert 0.25 <= elapsed < 1.0
    finally:
        for s in fillers:
            s.close()
        srv.close()


async def test_command_timeout_then_the_connection_is_reopened():
    server = EmbeddedRedis(extra_config={"enable-debug-command": "local"})
    await asyncio.to_thread(server.start)
    sleeper = server.client(socket_timeout=10)
    try:
        policy = POLICIES[Algorithm.TOKEN_BUCKET]
        async with open_limiter(server.url, namespace="slow", command_timeout=0.3, connect_timeout=1.0) as rl:
            assert (await rl.check("k", policy, now_us=T0)).remaining == 4  # connection is open
            thread = threading.Thread(target=sleeper.execute_command, args=("DEBUG", "SLEEP", 2), daemon=True)
            thread.start()
            await asyncio.sleep(0.2)  # the server is now asleep
            t0 = time.monotonic()
            with pytest.raises(limiter.BackendTimeout):
                await rl.check("k", policy, now_us=T0)
            elapsed = time.monotonic() - t0
            assert 0.25 <= elapsed < 1.0
            await asyncio.to_thread(thread.join, 10)
            assert not thread.is_alive()
            d = await rl.check("k", policy, now_us=T0)
            assert d.allowed
            # the timed-out request may or may not have been executed by the server
            assert d.remaining in (2, 3)
            await rl.ping()
    finally:
        sleeper.close()
        await asyncio.to_thread(server.stop)


# ---------------------------------------------------------------------------
# Redis Cluster
# ---------------------------------------------------------------------------


def _flush_cluster(cluster) -> list[redis.Redis]:
    clients = [redis.Redis(host=h, port=p) for h, p in cluster.nodes]
    for c in clients:
        c.flushall()
    return clients


async def test_cluster_keys_spread_over_all_masters(redis_cluster):
    clients = _flush_cluster(redis_cluster)
    policy = POLICIES[Algorithm.GCRA]
    names = [f"client-{i}" for i in range(300)]
    async with open_limiter(redis_cluster.url, namespace="spread") as rl:
        first = await asyncio.gather(*(rl.check(n, policy, now_us=T0) for n in names))
        assert all(d.allowed and d.remaining == 4 for d in first)
        second = await rl.check_many([(n, policy, 2, T0) for n in names])
        assert all(isinstance(d, Decision) and d.remaining == 2 for d in second)
        third = [await rl.check(n, policy, 3, now_us=T0) for n in names]
        assert not any(d.allowed for d in third)
    sizes = [c.dbsize() for c in clients]
    assert sum(sizes) == len(names)
    assert all(s > 50 for s in sizes), sizes  # ~100 per master
    # every key sits on exactly one master, the one that serves its slot: the others answer
    # MOVED (asked of the nodes themselves, not of a client's slot map, which can be older than
    # a topology change an earlier test made)
    for n in names[:30]:
        rkey = f"rl:spread:{n}".encode()
        answers = []
        for c in clients:
            try:
                answers.append(c.exists(rkey))
            except redis.exceptions.MovedError:
                answers.append("moved")
        assert sorted(answers, key=str) == [1, "moved", "moved"], (n, answers)


def _node_id(c: redis.Redis) -> str:
    nid = c.execute_command("CLUSTER", "MYID")
    return nid.decode() if isinstance(nid, bytes) else nid


def _migrate_slot(cluster, slot: int, dst: redis.Redis) -> None:
    """The slot and its keys to ``dst``, as ``redis-cli --cluster reshard`` moves them."""
    kw = dst.connection_pool.connection_kwargs
    move_slots(cluster, [slot], (kw["host"], kw["port"]))


def _owner(clients: list[redis.Redis], slot: int) -> redis.Redis:
    for entry in clients[0].execute_command("CLUSTER", "SLOTS"):
        if entry[0] <= slot <= entry[1]:
            port = int(entry[2][1])
            return next(c for c in clients if c.connection_pool.connection_kwargs["port"] == port)
    raise AssertionError(f"no owner for slot {slot}")


async def test_cluster_moved_after_a_slot_migration(redis_cluster):
    """BUG: RedisLimiter.check (and check_many) queue the EVALSHA with
    ``backend.send_now`` straight onto the connection of the node in the cached slot
    table; a ``MOVED`` reply then goes to ``_recover``, which only understands
    NOSCRIPT and raises BackendReplyError("Redis rejected the ... script: MOVED ...").
    ClusterBackend.call handles MOVED/ASK, but the hot path never uses it while the
    old node's connection is alive, and the slot table is never corrected, so every
    later check on that slot fails too, until something else refreshes the table."""
    clients = _flush_cluster(redis_cluster)
    policy = POLICIES[Algorithm.TOKEN_BUCKET]
    async with open_limiter(redis_cluster.url, namespace="mv") as rl:
        rkey = rl.redis_key("moving")
        slot = key_slot(rkey)
        for _ in range(3):
            await rl.check("moving", policy, now_us=T0)  # 2 tokens left
        src = _owner(clients, slot)
        dst = next(c for c in clients if c is not src)
        old_node = rl.backend.node_for_slot(slot)
        _migrate_slot(redis_cluster, slot, dst)
        try:
            assert dst.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 1
            assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
            assert rl.backend.node_for_slot(slot) is old_node  # the limiter's table is stale
            d = await rl.check("moving", policy, now_us=T0)
            assert d.allowed and d.remaining == 1  # state moved with the key
            assert rl.backend.node_for_slot(slot) is not old_node
            assert rl.backend.node_for_slot(slot).endpoint.port == dst.connection_pool.connection_kwargs["port"]
            out = await rl.check_many([("moving", policy, 1, T0), ("moving", policy, 1, T0)])
            assert [getattr(x, "allowed", x) for x in out] == [True, False]
        finally:
            _migrate_slot(redis_cluster, slot, src)  # put the cluster back as it was
            await asyncio.to_thread(redis_cluster.wait_until_ok)


async def test_cluster_ask_during_a_slot_migration(redis_cluster):
    """Same bug for ``ASK``: while a slot is half migrated (MIGRATING on the source,
    IMPORTING on the target, the key already moved), the source answers ASK; the hot
    path raises BackendReplyError("... script: ASK ...") instead of retrying with
    ASKING on the target, as ClusterBackend.call would."""
    clients = _flush_cluster(redis_cluster)
    policy = POLICIES[Algorithm.GCRA]
    async with open_limiter(redis_cluster.url, namespace="ask") as rl:
        rkey = rl.redis_key("half")
        slot = key_slot(rkey)
        assert (await rl.check("half", policy, now_us=T0)).remaining == 4
        src = _owner(clients, slot)
        dst = next(c for c in clients if c is not src)
        src_id, dst_id = _node_id(src), _node_id(dst)
        dst_kw = dst.connection_pool.connection_kwargs
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        try:
            src.execute_command("MIGRATE", dst_kw["host"], dst_kw["port"], rkey, 0, 5000)
            assert dst.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 1
            d = await rl.check("half", policy, now_us=T0)
            assert d.allowed and d.remaining == 3
        finally:
            # finish the migration, then move the slot back
            for c in [dst, src] + [c for c in clients if c not in (src, dst)]:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            _migrate_slot(redis_cluster, slot, src)
            await asyncio.to_thread(redis_cluster.wait_until_ok)


async def test_cluster_stale_slot_table_is_corrected_by_moved(redis_cluster):
    """Same bug, without a migration: point the slot at a wrong (connected) node."""
    _flush_cluster(redis_cluster)
    policy = POLICIES[Algorithm.FIXED_WINDOW]
    async with open_limiter(redis_cluster.url, namespace="stale") as rl:
        assert (await rl.check("k", policy, now_us=T0)).remaining == 4
        await rl.ping()  # opens a connection to every master
        backend = rl.backend
        slot = key_slot(rl.redis_key("k"))
        right = backend.node_for_slot(slot)
        wrong = next(n for n in backend.nodes if n is not right)
        assert wrong.send_now(b"*1\r\n$4\r\nPING\r\n") is not None  # it is connected
        backend.assign_slot(slot, wrong)
        d = await rl.check("k", policy, now_us=T0)
        assert d.allowed and d.remaining == 3
        assert backend.node_for_slot(slot) is right


async def test_cluster_stale_slot_to_an_unconnected_node_is_corrected(redis_cluster):
    """When the wrong node has no open connection, the slow path (ClusterBackend.call)
    is taken, which does follow MOVED."""
    _flush_cluster(redis_cluster)
    policy = POLICIES[Algorithm.FIXED_WINDOW]
    async with open_limiter(redis_cluster.url, namespace="stale2") as rl:
        assert (await rl.check("k", policy, now_us=T0)).remaining == 4
        backend = rl.backend
        slot = key_slot(rl.redis_key("k"))
        right = backend.node_for_slot(slot)
        wrong = next(n for n in backend.nodes if n is not right)
        wrong.close()
        backend.assign_slot(slot, wrong)
        d = await rl.check("k", policy, now_us=T0)
        assert d.allowed and d.remaining == 3
        assert backend.node_for_slot(slot) is right
