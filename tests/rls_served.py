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

import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
from cp_server import ADMIN_TOKEN, clean_env, free_port, metric_value, unique_namespace, wait_until

__all__ = ["EXAMPLE_CONFIG", "RlsServed", "rss_mb"]

EXAMPLE_CONFIG = Path(__file__).parent / "fixtures" / "envoyproxy-ratelimit" / "example.yaml"


def rss_mb(pid: int) -> float:
    """The resident set of process ``pid`` (VmRSS), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


class RlsServed:
    """The server (``env``: its settings beyond the test defaults)."""

    def __init__(self, redis_url: str, tmp: Path, config: Path = EXAMPLE_CONFIG, **env: str) -> None:
        self.port, self.grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stderr_path = tmp / f"shadowlimit-{self.grpc_port}.stderr"
        self.settings = {
            "RATE_LIMIT_REDIS_URL": redis_url,
            "SHADOWLIMIT_PORT": str(self.port),
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

    def start(self) -> RlsServed:
        shadowlimit = str(Path(sys.executable).parent / "shadowlimit")
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [shadowlimit, "serve", "--grpc-port", str(self.grpc_port), "--log-level", "warning"],
                env=clean_env(**self.settings),
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        wait_until(self._up, timeout=60, what="shadowlimit serve answering on both ports")
        return self

    def _up(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.stderr()[-3000:]
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
