"""limiter.embedded high availability: a Sentinel set and a Cluster with replicas fail over after
their master is SIGKILLed. Real redis-server processes (sentinels are ``redis-server --sentinel``),
loopback only; every wait is bounded.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from limiter.embedded import (
    EmbeddedCluster,
    EmbeddedRedisError,
    EmbeddedSentinelSet,
    TestPki,
    make_test_pki,
    slot_ranges,
)

pytestmark = pytest.mark.timeout(90)

FAILOVER_BOUND = 20.0  # seconds; a failover takes ~2-6 s on loopback


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


def key_in_range(first: int, last: int) -> str:
    return next(f"key:{i}" for i in range(100_000) if first <= key_slot(f"key:{i}".encode()) <= last)


# --------------------------------------------------------------------------- #
# Sentinel
# --------------------------------------------------------------------------- #


def _fail_over(sentinels: EmbeddedSentinelSet) -> tuple[tuple[str, int], tuple[str, int], float]:
    """Write through the sentinel-discovered master, kill it, wait for the new one; returns
    (old, new, seconds the failover took)."""
    client = sentinels.sentinel_client(socket_timeout=2).master_for(sentinels.master_name, decode_responses=True)
    client.set("survives", "the failover")
    assert client.wait(1, 2000) >= 1  # the replica has it
    client.close()
    started = time.monotonic()
    old = sentinels.kill_master()
    new = sentinels.wait_for_failover(old, timeout=FAILOVER_BOUND)
    return old, new, time.monotonic() - started


@pytest.mark.sentinel
def test_sentinel_set_fails_over_after_kill_master() -> None:
    with EmbeddedSentinelSet(replicas=1) as sentinels:
        ports = [p for _, p in sentinels.sentinel_addresses]
        assert len(ports) == 3 and len(sentinels.servers) == 2
        assert sentinels.url == "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/mymaster"
        first = sentinels.servers[0]
        assert sentinels.master_address() == (first.host, first.port)
        old, new, took = _fail_over(sentinels)
        assert old == (first.host, first.port) and not first.running
        assert new == (sentinels.servers[1].host, sentinels.servers[1].port)
        assert took < FAILOVER_BOUND
        promoted = sentinels.servers[1].client(decode_responses=True)
        assert promoted.get("survives") == "the failover"
        promoted.set("after", "failover")  # writable: a master now
        promoted.close()
        via_sentinel = sentinels.sentinel_client(socket_timeout=2).master_for("mymaster", decode_responses=True)
        assert via_sentinel.get("after") == "failover"
        via_sentinel.close()
        with pytest.raises(EmbeddedRedisError, match="no failover"):
            sentinels.wait_for_failover(new, timeout=0.3)  # nothing happens to the new master
        sentinels.start()  # the old master comes back as a replica of the new one
        assert first.running and first.port == old[1]
        rejoined = first.client(decode_responses=True)
        info = rejoined.info("replication")
        assert info["role"] == "slave" and int(info["master_port"]) == new[1], (info, sentinels.master_address())
        assert rejoined.get("after") == "failover"
        rejoined.close()


@pytest.mark.sentinel
def test_sentinel_set_with_tls_acl_and_sentinel_password_fails_over(pki: TestPki) -> None:
    with EmbeddedSentinelSet(
        replicas=1,
        tls=pki.server_config(client_auth="yes"),
        acl_users=[("app", "s3cret")],
        sentinel_password="sentinel-pw",
    ) as sentinels:
        assert sentinels.url.startswith("rediss+sentinel://app:s3cret@127.0.0.1:")
        assert sentinels.url.endswith("/mymaster")
        sentinel = sentinels.sentinels[0]
        assert sentinel.url.startswith("rediss://:sentinel-pw@127.0.0.1:")
        with pytest.raises(redis.AuthenticationError):  # the sentinels want their password
            no_password = pki.server_config().client_kwargs()
            redis.Redis(host=sentinel.host, port=sentinel.port, retry=Retry(NoBackoff(), 0), **no_password).ping()
        old, new, took = _fail_over(sentinels)
        assert new != old and took < FAILOVER_BOUND
        promoted = sentinels.server_at(new)
        assert promoted is not None
        client = promoted.client(decode_responses=True)
        assert client.acl_whoami() == "app" and client.get("survives") == "the failover"
        client.close()


def test_sentinel_set_stop_leaves_nothing_behind() -> None:
    sentinels = EmbeddedSentinelSet(replicas=0, sentinels=1)
    sentinels.start()
    root = sentinels.data_dir
    processes = [*sentinels.servers, *sentinels.sentinels]
    assert root is not None and Path(root).is_dir() and all(p.running for p in processes)
    sentinels.stop()
    assert not Path(root).exists() and not any(p.running for p in processes)
    sentinels.stop()  # idempotent


# --------------------------------------------------------------------------- #
# Cluster with replicas
# --------------------------------------------------------------------------- #


@pytest.mark.cluster
def test_cluster_with_replicas_fails_over_after_kill_master() -> None:
    with EmbeddedCluster(replicas=1) as cluster:
        assert len(cluster.nodes) == 6
        admin = cluster.servers[0].client()
        for _first, _last, master, *replicas in admin.execute_command("CLUSTER", "SLOTS"):
            assert int(master[1]) in [p for _, p in cluster.nodes[:3]] and len(replicas) == 1
        admin.close()
        first, last = slot_ranges(3)[0]
        key = key_in_range(first, last)
        master = cluster.servers[0].client(decode_responses=True)
        master.set(key, "survives")
        assert master.wait(1, 2000) == 1
        master.close()

        started = time.monotonic()
        old = cluster.kill_master(0)
        assert old == cluster.nodes[0]
        new = cluster.wait_for_failover(timeout=FAILOVER_BOUND)
        assert time.monotonic() - started < FAILOVER_BOUND
        assert new == cluster.nodes[3]  # node 3 is the replica of master 0
        rc = cluster.client(decode_responses=True)
        assert rc.get(key) == "survives"
        for lo, hi in slot_ranges(3):
            rc.set(key_in_range(lo, hi), "after")
        rc.close()

        cluster.start_node(0)  # comes back as a replica of its successor
        node0 = cluster.servers[0].client(decode_responses=True)
        assert node0.info("replication")["role"] == "slave"
        node0.close()


@pytest.mark.cluster
def test_cluster_with_tls_and_acl_fails_over(pki: TestPki) -> None:
    with EmbeddedCluster(
        replicas=1, tls=pki.server_config(client_auth="yes"), acl_users=[("app", "s3cret")]
    ) as cluster:
        host, port = cluster.nodes[0]
        assert cluster.url == f"rediss+cluster://app:s3cret@{host}:{port}"
        rc = cluster.client(decode_responses=True)
        keys = [key_in_range(lo, hi) for lo, hi in slot_ranges(3)]
        for key in keys:
            rc.set(key, "over tls")
        rc.close()
        for node in cluster.servers[:3]:
            client = node.client()
            assert client.wait(1, 2000) == 1
            client.close()
        old = cluster.kill_master(1)
        new = cluster.wait_for_failover(timeout=FAILOVER_BOUND)
        assert new != old and new == cluster.nodes[4]
        rc = cluster.client(decode_responses=True)
        assert [rc.get(key) for key in keys] == ["over tls"] * 3
        rc.close()


def test_cluster_without_replicas_cannot_fail_over() -> None:
    cluster = EmbeddedCluster(masters=1)
    with pytest.raises(EmbeddedRedisError, match="without replicas"):
        cluster.wait_for_failover(timeout=0.1)
