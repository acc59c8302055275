"""What the rollout plans' tests run beside the control planes, all on loopback:

- :class:`Upstream`: the protected service, as Prometheus sees it: ``/metrics`` with
  ``upstream_requests_total{route, code}`` growing by ``rate`` requests a second, a share
  ``error_ratio`` of them 500s (the test flips it);
- :class:`Receiver`: a webhook receiver (``SHADOWLIMIT_NOTIFY_URL``) that keeps what it is sent
  and can refuse the first deliveries;
- :class:`Traffic`: decisions sent in the background, round robin over the replicas;
- :class:`ServeProcess`: ``shadowlimit serve`` as an OS process (so it can be killed outright).

Every wait is bounded; nothing here sleeps in place of a condition (the generators' pauses
are their pace, not waits).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from cp_server import ADMIN_TOKEN, clean_env, free_port
from support import eventually

__all__ = ["SHADOWLIMIT", "Receiver", "ServeProcess", "Traffic", "Upstream", "upstream_ratio"]

SHADOWLIMIT = Path(sys.executable).parent / "shadowlimit"


def upstream_ratio(window: str = "5s") -> str:
    """The PromQL of the upstream's 5xx share on a plan's route (``{route}`` is the route)."""
    return (
        f'sum(rate(upstream_requests_total{{route="{{route}}",code="500"}}[{window}]))'
        f' / sum(rate(upstream_requests_total{{route="{{route}}"}}[{window}]))'
    )


class _Server:
    """A ThreadingHTTPServer on a free loopback port, in a daemon thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> Any:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class _UpstreamHandler(_Quiet):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        up: Upstream = self.server.owner  # type: ignore[attr-defined]
        body = up.exposition().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Upstream(_Server):
    """The protected service's request counters, growing in a thread of their own."""

    def __init__(self, routes: tuple[str, ...], rate: float = 50.0) -> None:
        super().__init__(_UpstreamHandler)
        self.routes = routes
        self.rate = rate
        self.error_ratio = 0.0
        self._counts = {(r, c): 0.0 for r in routes for c in ("200", "500")}
        self._lock = threading.Lock()
        self._running = True
        self._gen = threading.Thread(target=self._generate, daemon=True)

    def start(self) -> Upstream:
        self._gen.start()
        super().start()
        return self

    def stop(self) -> None:
        self._running = False
        self._gen.join(5)
        super().stop()

    def _generate(self) -> None:
        step = 0.05
        while self._running:
            with self._lock:
                n = self.rate * step
                for r in self.routes:
                    self._counts[(r, "500")] += n * self.error_ratio
                    self._counts[(r, "200")] += n * (1 - self.error_ratio)
            time.sleep(step)

    def exposition(self) -> str:
        with self._lock:
            lines = ["# TYPE upstream_requests_total counter"]
            for (route, code), v in sorted(self._counts.items()):
                lines.append(f'upstream_requests_total{{route="{route}",code="{code}"}} {v}')
        return "\n".join(lines) + "\n"


class _ReceiverHandler(_Quiet):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        rec: Receiver = self.server.owner  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        status = rec.take(body)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


class Receiver(_Server):
    """A webhook receiver: ``posts`` holds every JSON body it accepted; the first ``refuse``
    deliveries get a 503."""

    def __init__(self, refuse: int = 0) -> None:
        super().__init__(_ReceiverHandler)
        self.refuse = refuse
        self.posts: list[dict[str, Any]] = []
        self.refused = 0
        self._lock = threading.Lock()

    def take(self, body: bytes) -> int:
        with self._lock:
            if self.refused < self.refuse:
                self.refused += 1
                return 503
            self.posts.append(json.loads(body))
            return 200

    def texts(self) -> list[str]:
        with self._lock:
            return [p["text"] for p in self.posts]


class Traffic:
    """Decisions on ``route`` sent in a thread, round robin over ``urls``, for ``keys`` in turn,
    every ``pause_s``; :meth:`set` changes the keys (and pace) while it runs. ``costs``: a key's
    cost (a budget route's), 1 for the others."""

    def __init__(
        self, urls: list[str], route: str, keys: list[str], pause_s: float = 0.01, costs: dict[str, int] | None = None
    ) -> None:
        self.costs = costs or {}
        self.urls = urls
        self.route = route
        self.keys = keys
        self.pause_s = pause_s
        self.sent = 0
        self.errors: list[str] = []
        self._running = True
        self._thread = threading.Thread(target=self._run, daemon=True)

    def set(self, keys: list[str], pause_s: float | None = None) -> None:
        self.keys = keys
        if pause_s is not None:
            self.pause_s = pause_s

    def _run(self) -> None:
        clients = [httpx.Client(base_url=u, timeout=5) for u in self.urls]
        try:
            i = 0
            while self._running:
                keys = self.keys
                if keys:
                    c = clients[i % len(clients)]
                    try:
                        key = keys[i % len(keys)]
                        r = c.post("/v1/decide", json={"route": self.route, "key": key, "cost": self.costs.get(key, 1)})
                        if r.status_code not in (200, 429):
                            self.errors.append(f"{r.status_code} {r.text[:200]}")
                    except httpx.HTTPError as exc:  # a replica killed by the test: the others go on
                        self.errors.append(repr(exc))
                    self.sent += 1
                    i += 1
                time.sleep(self.pause_s)
        finally:
            for c in clients:
                c.close()

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._running = False
        self._thread.join(10)


class ServeProcess:
    """``shadowlimit serve`` in an OS process of its own, on a free loopback port."""

    def __init__(self, *, redis_url: str, rules: Path, namespace: str, instance_id: str, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.instance_id = instance_id
        self.env = clean_env(
            RATE_LIMIT_REDIS_URL=redis_url,
            RATE_LIMIT_RULES_PATH=str(rules),
            SHADOWLIMIT_NAMESPACE=namespace,
            SHADOWLIMIT_INSTANCE_ID=instance_id,
            SHADOWLIMIT_ADMIN_TOKEN=ADMIN_TOKEN,
            SHADOWLIMIT_PORT=str(self.port),
            ENABLE_DISTRIBUTED_RATE_LIMITING="true",
            **env,
        )
        self.log = rules.parent / f"{instance_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServeProcess:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(SHADOWLIMIT), "serve", "--log-level", "info"], env=self.env, stdout=log, stderr=subprocess.STDOUT
            )

        def healthy() -> bool:
            assert self.proc is not None and self.proc.poll() is None, f"serve exited: {self.log.read_text()}"
            try:
                return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        eventually(healthy, 30, 0.05, f"{self.instance_id} to serve")
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown, no lease given up."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
