"""One description of how to reach Redis (``limiter.RedisConnection``) builds both clients of a
replica, the RESP client of the decisions and redis-py, and they agree on every part of it:
the nodes, the ACL login, the database, TLS and Sentinel's service (no Redis is contacted:
building a client does not connect)."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
from redis.asyncio.connection import RedisSSLContext

from control_plane.settings import load_settings
from limiter import RedisConnection, RedisLimiter
from limiter.redis_url import Endpoint
from limiter.resp.tls import tls_context

STANDALONE = "rediss://app:s3cret@10.0.0.5:6380/2?ssl_cert_reqs=none&ssl_check_hostname=false"
SENTINEL = "redis+sentinel://app:s3cret@10.0.0.1:26379,10.0.0.2:26380/mymaster/3"
CLUSTER = "rediss+cluster://app:s3cret@10.0.0.1:7000,10.0.0.2:7001?ssl_cert_reqs=optional&ssl_check_hostname=false"


def _resp_nodes(rl: RedisLimiter) -> tuple[Endpoint, ...]:
    """The endpoints the RESP backend connects to (its nodes, or the sentinels and the data node)."""
    b: Any = rl.backend
    if hasattr(b, "sentinels"):
        return tuple(b.sentinels)
    if hasattr(b, "seeds"):
        return tuple(b.seeds)
    return (b.endpoint,)


def _same_tls(e: Endpoint, kwargs: dict[str, Any]) -> None:
    """The RESP client's SSL context and the one redis-py makes from its keyword arguments
    verify the same way."""
    if e.tls is None:
        assert kwargs.get("ssl_cert_reqs") in (None, "required") and not kwargs.get("ssl")
        return
    ours = tls_context(e.tls)
    theirs = RedisSSLContext(
        keyfile=kwargs["ssl_keyfile"],
        certfile=kwargs["ssl_certfile"],
        cert_reqs=kwargs["ssl_cert_reqs"],
        ca_certs=kwargs["ssl_ca_certs"],
        check_hostname=kwargs["ssl_check_hostname"],
    ).get()
    assert (ours.verify_mode, ours.check_hostname) == (theirs.verify_mode, theirs.check_hostname)


def test_standalone_with_tls_and_an_acl_user() -> None:
    conn = RedisConnection.parse(STANDALONE, connect_timeout=0.3, command_timeout=0.2, socket_timeout=0.7)
    rl = RedisLimiter.from_connection(conn)
    (node,) = _resp_nodes(rl)
    assert node == conn.target.endpoint
    kw = rl.client.connection_pool.connection_kwargs
    got = (kw["host"], kw["port"], kw["db"], kw["username"], kw["password"])
    assert (
        got == (node.host, node.port, node.db, node.username, node.password) == ("10.0.0.5", 6380, 2, "app", "s3cret")
    )
    assert (kw["socket_connect_timeout"], kw["socket_timeout"]) == (0.3, 0.7)
    _same_tls(node, kw)
    assert tls_context(node.tls).verify_mode is ssl.CERT_NONE  # type: ignore[arg-type]


def test_sentinel_service_sentinels_and_data_node_login() -> None:
    conn = RedisConnection.parse(SENTINEL)
    rl = RedisLimiter.from_connection(conn)
    backend: Any = rl.backend
    assert backend.service_name == conn.target.service_name == rl.client.connection_pool.service_name == "mymaster"
    sentinels = rl.client.connection_pool.sentinel_manager.sentinels
    theirs = [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"],
         s.connection_pool.connection_kwargs["username"], s.connection_pool.connection_kwargs["password"])
        for s in sentinels
    ]  # fmt: skip
    assert theirs == [(e.host, e.port, e.username, e.password) for e in _resp_nodes(rl)]
    kw = rl.client.connection_pool.connection_kwargs
    data = conn.target.endpoint
    assert (kw["db"], kw["username"], kw["password"]) == (data.db, data.username, data.password) == (3, "app", "s3cret")


def test_cluster_seeds_login_and_tls() -> None:
    conn = RedisConnection.parse(CLUSTER)
    rl = RedisLimiter.from_connection(conn)
    nodes = _resp_nodes(rl)
    assert [(n.host, n.port) for n in rl.client.startup_nodes] == [(e.host, e.port) for e in nodes]
    kw = rl.client.connection_kwargs
    for e in nodes:
        assert (kw["username"], kw["password"]) == (e.username, e.password) == ("app", "s3cret")
        _same_tls(e, kw)


@pytest.mark.parametrize("url", [STANDALONE, SENTINEL, CLUSTER])
def test_the_tls_each_client_is_given_comes_from_one_place(url: str) -> None:
    conn = RedisConnection.parse(url)
    settings = conn.tls_settings()
    assert set(settings) == {e.label for e in conn.nodes()}
    for e in conn.nodes():
        assert settings[e.label] == (None if e.tls is None else e.tls.redis_py_kwargs())


def test_a_replica_builds_both_clients_from_its_settings_connection() -> None:
    """The settings' password file and TLS options go into the one description (here the
    timeouts), and the engine's limiter and its redis-py client are both built from it."""
    s = load_settings(redis_url=STANDALONE, redis_connect_timeout_s=0.4, redis_command_timeout_s=0.3)
    conn = s.redis_connection(s.redis_url or "")
    assert (conn.connect_timeout, conn.command_timeout, conn.socket_timeout) == (0.4, 0.3, 1.2)
    rl = RedisLimiter.from_connection(conn)
    assert rl.connection is conn
    assert rl.client.connection_pool.connection_kwargs["socket_timeout"] == 1.2
