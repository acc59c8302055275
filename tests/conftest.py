"""Shared fixtures: real redis-server processes started by the project's own launcher.

A test that needs Redis and cannot get one fails loudly (the launcher raises with the
reason); nothing is skipped.
"""

from __future__ import annotations

import pytest
import redis as redis_sync

from limiter.embedded import EmbeddedCluster, EmbeddedRedis


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
    if request.param == "standalone":
        server = request.getfixturevalue("redis_server")
        redis_sync.Redis.from_url(server.url).flushall()
        return server.url
    cluster = request.getfixturevalue("redis_cluster")
    for host, port in cluster.nodes:
        redis_sync.Redis(host=host, port=port).flushall()
    return cluster.url
