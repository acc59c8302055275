"""A real Prometheus for tests: Debian's ``/usr/bin/prometheus`` with its own configuration,
storage and loopback port, scraping its jobs every second, ``deploy/prometheus/alerts.yaml``
loaded.

Usage::

    with prometheus(tmp_path / "prom", {"shadowlimit": [f"127.0.0.1:{cp.port}"]}) as prom:
        prom.query('up{job="shadowlimit"}')
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from cp_server import free_port
from promql import ALERTS
from support import eventually, installed_binary

__all__ = ["Prometheus", "prometheus"]


class Prometheus:
    """Debian's prometheus on a loopback port, scraping each job's targets every second."""

    def __init__(self, workdir: Path, jobs: dict[str, list[str]]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir()
        self.config = workdir / "prometheus.yml"
        scrapes = "".join(
            f"  - job_name: {job}\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: [{', '.join(repr(t) for t in targets)}]\n"
            for job, targets in jobs.items()
        )
        self.config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {ALERTS}\nscrape_configs:\n{scrapes}"
        )
        self.log = workdir / "prometheus.log"
        self.argv = [
            installed_binary("prometheus"),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Prometheus:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)

        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, f"prometheus exited: {self.log.read_text()}"
            try:
                return httpx.get(self.url + "/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        eventually(ready, 30, 0.1, "prometheus to be ready")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (expr, body)
        assert body["data"]["resultType"] == "vector", (expr, body["data"]["resultType"])
        return list(body["data"]["result"])

    def rules(self) -> list[dict[str, Any]]:
        body = httpx.get(self.url + "/api/v1/rules", timeout=10).json()
        return [r for g in body["data"]["groups"] for r in g["rules"]]


@contextmanager
def prometheus(workdir: Path, jobs: dict[str, list[str]]) -> Iterator[Prometheus]:
    prom = Prometheus(workdir, jobs).start()
    try:
        yield prom
    finally:
        prom.stop()
