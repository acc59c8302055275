"""Shared fixtures: real redis-server processes started by the project's own launcher.

A test that needs Redis and cannot get one fails loudly (the launcher raises with the
reason); nothing is skipped.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
import redis as redis_sync

from limiter.embedded import EmbeddedCluster, EmbeddedRedis, EmbeddedSentinelSet, TestPki, make_test_pki

#: the password of the ACL user ``app`` on the managed-Redis fixtures (quoted in URLs)
MANAGED_PASSWORD = "Man@ged:pa ss/1"


@pytest.fixture(scope="session")
def redis_server():
    """One standalone Redis for the session (TCP, loopback)."""
    server = EmbeddedRedis().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster():
    """A 3-master Redis Cluster on loopback for the session."""
    cluster = EmbeddedCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_url(redis_server):
    """The standalone server's URL, flushed before each test."""
    redis_sync.Redis.from_url(redis_server.url).flushall()
    return redis_server.url


@pytest.fixture(params=["standalone", "cluster"])
def any_redis_url(request):
    """Parametrises a test over standalone Redis and the cluster (both flushed)."""
    return _plain(request, request.param)


@pytest.fixture(scope="session")
def test_pki(tmp_path_factory) -> TestPki:
    """A CA, server/client certificates and the wrong ones, made by openssl for the session."""
    return make_test_pki(tmp_path_factory.mktemp("pki"))


def _tls_query(pki: TestPki) -> str:
    return f"ssl_ca_certs={quote(pki.ca_cert)}"


def _login() -> str:
    return f"app:{quote(MANAGED_PASSWORD, safe='')}@"


@pytest.fixture(scope="session")
def redis_tls_acl(test_pki):
    """Managed-Redis style: TLS only (verified with the test CA) and an ACL user ``app``."""
    server = EmbeddedRedis(tls=test_pki.server_config(client_auth="optional"), acl_users=[("app", MANAGED_PASSWORD)])
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_sentinels():
    """A master, a replica and 3 sentinels; the data nodes need a password, the sentinels none."""
    sentinels = EmbeddedSentinelSet(replicas=1, acl_users=[("app", MANAGED_PASSWORD)])
    sentinels.start()
    yield sentinels
    sentinels.stop()


@pytest.fixture(scope="session")
def redis_cluster_tls_acl(test_pki):
    """A 3-master cluster (one replica each) over TLS with an ACL user."""
    cluster = EmbeddedCluster(
        replicas=1, tls=test_pki.server_config(client_auth="optional"), acl_users=[("app", MANAGED_PASSWORD)]
    )
    cluster.start()
    yield cluster
    cluster.stop()


def _flush(client) -> None:
    try:
        client.flushall()
    finally:
        client.close()


@pytest.fixture(params=["standalone", "cluster", "tls_acl", "sentinel", "cluster_tls_acl"])
def every_redis_url(request, test_pki):
    """Every connection kind shadowlimit supports (flushed), as the URL shadowlimit is given:
    plain standalone and cluster, TLS + ACL user, Sentinel (login on the data nodes), and a
    cluster with replicas over TLS + ACL."""
    kind = request.param
    if kind in ("standalone", "cluster"):
        return _plain(request, kind)
    if kind == "tls_acl":
        server = request.getfixturevalue("redis_tls_acl")
        _flush(server.client())
        return f"rediss://{_login()}127.0.0.1:{server.port}/0?{_tls_query(test_pki)}"
    if kind == "sentinel":
        sentinels = request.getfixturevalue("redis_sentinels")
        host, port = sentinels.master_address()
        _flush(redis_sync.Redis(host=host, port=port, **sentinels.connection_kwargs()))
        hosts = ",".join(f"{h}:{p}" for h, p in sentinels.sentinel_addresses)
        return f"redis+sentinel://{_login()}{hosts}/{sentinels.master_name}?sentinel_password="
    cluster = request.getfixturevalue("redis_cluster_tls_acl")
    for server in cluster.servers:
        if server.running:
            c = server.client()
            if c.execute_command("ROLE")[0] == b"master":
                _flush(c)
            else:
                c.close()
    hosts = ",".join(f"{h}:{p}" for h, p in cluster.nodes)
    return f"rediss+cluster://{_login()}{hosts}?{_tls_query(test_pki)}"


def _plain(request, kind: str) -> str:
    if kind == "standalone":
        server = request.getfixturevalue("redis_server")
        redis_sync.Redis.from_url(server.url).flushall()
        return server.url
    cluster = request.getfixturevalue("redis_cluster")
    for host, port in cluster.nodes:
        redis_sync.Redis(host=host, port=port).flushall()
    return cluster.url
