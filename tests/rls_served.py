"""``shadowlimit serve --grpc-port`` in a process of its own, as in production, serving
envoyproxy/ratelimit's example configuration (tests/fixtures/envoyproxy-ratelimit, domain
``rl``) on real Redis: for the tests that attack its gRPC port over raw sockets and watch its
memory (``/proc/<pid>/status``), its stderr (a file: a pipe nobody reads would block it) and
its metrics.

Usage::

    served = RlsServed(redis_url, tmp_path, SHADOWLIMIT_DEFAULT_MODE="enforce").start()
    served.rss_mb(), served.metric("rate_limit_grpc_connections"), served.stop()
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from cp_server import ADMIN_TOKEN, clean_env, metric_value, unique_namespace

__all__ = ["EXAMPLE_CONFIG", "RlsServed", "raise_priority", "rss_mb"]

EXAMPLE_CONFIG = Path(__file__).parent / "fixtures" / "envoyproxy-ratelimit" / "example.yaml"


def quiet_port() -> int:
    """A free port below the kernel's ephemeral range (32768 and up), which the tests' own client
    connections (20,000 of them at times) draw from: a port picked there could be taken by one of
    them before the server binds it."""
    for _ in range(1000):
        port = random.randrange(20_000, 32_000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in 20000-32000")


def raise_priority() -> None:
    """The server under attack (and the honest client that times it) run before the other
    tests' processes, where the system allows it (root: CI): the bounds on its latency measure
    what the attacker does to it, not what the tests pytest-xdist runs beside it do to the
    machine. The attacker keeps the usual priority."""
    try:
        os.nice(-10)
    except OSError:  # not allowed: the usual priority
        pass


def rss_mb(pid: int) -> float:
    """The resident set of process ``pid`` (VmRSS), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


class RlsServed:
    """The server (``env``: its settings beyond the test defaults)."""

    def __init__(self, redis_url: str, tmp: Path, config: Path = EXAMPLE_CONFIG, **env: str) -> None:
        self.tmp = tmp
        self.port = self.grpc_port = 0
        self.stderr_path = tmp / "shadowlimit.stderr"
        self.settings = {
            "RATE_LIMIT_REDIS_URL": redis_url,
            "SHADOWLIMIT_NAMESPACE": unique_namespace(),
            "SHADOWLIMIT_ADMIN_TOKEN": ADMIN_TOKEN,
            "ENABLE_DISTRIBUTED_RATE_LIMITING": "true",
            "SHADOWLIMIT_ENVOY_CONFIG": str(config),
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RlsServed:
        """Start it on two free ports (others, if one was taken meanwhile), answering within 60 s."""
        for _ in range(3):
            self.port, self.grpc_port = quiet_port(), quiet_port()
            self.stderr_path = self.tmp / f"shadowlimit-{self.grpc_port}.stderr"
            self._spawn()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.alive() and not self._up():
                time.sleep(0.1)
            if self.alive() and self._up():
                return self
            if self.alive() or "address already in use" not in self.stderr():
                self.stop()
                raise AssertionError(f"shadowlimit serve did not answer within 60 s: {self.stderr()[-3000:]}")
        raise AssertionError(f"shadowlimit serve found no free ports: {self.stderr()[-3000:]}")

    def _spawn(self) -> None:
        shadowlimit = str(Path(sys.executable).parent / "shadowlimit")
        env = {**self.settings, "SHADOWLIMIT_PORT": str(self.port)}
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [shadowlimit, "serve", "--grpc-port", str(self.grpc_port), "--log-level", "warning"],
                env=clean_env(**env),
                stdout=subprocess.DEVNULL,
                stderr=err,
                preexec_fn=raise_priority,
            )

    def _up(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.grpc_port), timeout=1):
                pass
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except (OSError, httpx.HTTPError):
            return False

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text

    def metric(self, name: str, **labels: str) -> float:
        return metric_value(self.metrics(), name, **labels)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def stop(self) -> str:
        """Stop it (SIGTERM, then SIGKILL after 30 s); its stderr."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.stderr()
