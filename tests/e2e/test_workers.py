"""``shadowlimit serve --workers 2``: two processes on one port, each a fleet instance with
its own local limiter and heartbeat; a worker that dies is started again; SIGTERM stops
them all cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from cp_server import clean_env, free_port, wait_until

pytestmark = pytest.mark.timeout(120)

SHADOWLIMIT = Path(sys.executable).parent / "shadowlimit"


def _children(pid: int) -> list[int]:
    """The worker processes of the supervisor ``pid`` (not multiprocessing's resource tracker)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    workers = []
    for child in out.split():
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            workers.append(int(child))
    return workers


def _instances(url: str, n: int = 60) -> set[str]:
    """The instance ids that answered ``n`` requests, each on a new connection."""
    seen = set()
    for i in range(n):
        r = httpx.post(url + "/v1/decide", json={"route": "default", "key": f"w{i}"}, timeout=5)
        seen.add(r.json()["request_id"].rsplit("-", 1)[0])
    return seen


def test_two_workers_share_the_port_are_two_instances_and_stop_cleanly(redis_url) -> None:
    port = free_port()
    env = clean_env()
    env.update(RATE_LIMIT_REDIS_URL=redis_url, SHADOWLIMIT_PORT=str(port), SHADOWLIMIT_INSTANCE_ID="wk")
    env["SHADOWLIMIT_NAMESPACE"] = f"workers-{port}"
    env["ENABLE_DISTRIBUTED_RATE_LIMITING"] = "true"  # a kill-switched replica reads the fleet without joining it
    proc = subprocess.Popen(
        [str(SHADOWLIMIT), "serve", "--workers", "2", "--log-level", "warning"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: len(_children(proc.pid)) >= 2, 30, 0.1, "two worker processes")
        wait_until(lambda: _instances(url) == {"wk-0", "wk-1"}, 60, 0.2, "both workers answering on the one port")
        # each one is a fleet instance: both heartbeats are seen
        wait_until(
            lambda: httpx.get(url + "/v1/backend", timeout=5).json()["live_instances"] == 2,
            30,
            0.2,
            "two live instances",
        )
        # a worker that dies is started again
        first = _children(proc.pid)
        victim = first[0]
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: victim not in _children(proc.pid) and len(_children(proc.pid)) >= 2, 30, 0.2, "a new worker")
        wait_until(lambda: _instances(url) == {"wk-0", "wk-1"}, 60, 0.2, "both answering again")
        workers = _children(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    for pid in workers:  # no worker left behind
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_workers_refuse_a_port_someone_holds(redis_url) -> None:
    import socket

    env = clean_env()
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # workers would join it silently
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env.update(RATE_LIMIT_REDIS_URL=redis_url, SHADOWLIMIT_PORT=str(port))
        proc = subprocess.run(
            [str(SHADOWLIMIT), "serve", "--workers", "2"], env=env, capture_output=True, text=True, timeout=60
        )
    assert proc.returncode == 2, proc.stderr
    assert f"SHADOWLIMIT_PORT / --port: cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
