"""What the hostile-client tests hold a server to while an attack runs (tests/e2e/test_grpc_*.py):

* an honest client: grpcio (over mutual TLS when given its files), in a process of its own (the
  attacker's Python loops in the test process would otherwise take the GIL from it and make it late itself), calling
  ``ShouldRateLimit`` every 20 ms on a connection of its own, each call with a 1 s deadline
  (ten times the latency bound: a server that stalls for a second has failed Envoy's calls for
  a second, whose deadline is 20 ms): no call may fail and the 99th percentile of their
  latency stays under 100 ms;
* the server's memory: VmRSS every 100 ms; the growth (the largest sample less the one taken
  just before the attack) stays under a bound (64 MB; 256 MB for the window attacks);
* both go on for a second after the attack (what it leaves behind counts too), and 5 s in
  all at least (250 calls: a 99th percentile that is not merely the slowest call);
* the server and the honest client run at a raised priority where allowed (root, as in CI:
  rls_served.raise_priority), the attacker at the usual one: the bounds measure what the attack
  does to the server, not what the tests running beside it on the other core do to the machine;
* protocol refusals are not rate limit answers: ``rate_limit_envoy_requests_total{code="overloaded"}``
  does not move.

Usage::

    with Attack(served) as attack:
        ...  # the hostile frames
    attack.check(rss_mb=64)

One attack at a time across pytest-xdist's workers (a file lock): two at once on a 2-core
machine would measure each other.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from cp_server import metric_value, wait_until
from rls_served import RlsServed, raise_priority, rss_mb

__all__ = ["KINDS", "Attack", "Honest", "P99_BOUND_S", "protocol_errors", "served_with"]

P99_BOUND_S = 0.100
PERIOD_S = 0.020
CALL_DEADLINE_S = 1.0
TAIL_S = 1.0  # the honest client and the RSS samples go on this long after the attack
MIN_WINDOW_S = 5.0  # and for this long at least in all: 250 calls, whose p99 is not their slowest
LOCK = Path(tempfile.gettempdir()) / "shadowlimit-grpc-hostile.lock"
#: the labels of rate_limit_grpc_protocol_errors_total
KINDS = (
    "goaway_protocol_error", "goaway_flow_control_error", "goaway_frame_size_error", "goaway_compression_error",
    "goaway_stream_closed", "goaway_enhance_your_calm", "reset_received", "reset_sent", "refused_stream",
    "flow_control", "idle_close", "keepalive_timeout", "connection_refused", "bad_header",
)  # fmt: skip


def protocol_errors(served: RlsServed) -> dict[str, float]:
    """``rate_limit_grpc_protocol_errors_total`` by kind (0 for a kind not exported)."""
    text = served.metrics()
    return {kind: metric_value(text, "rate_limit_grpc_protocol_errors_total", kind=kind) for kind in KINDS}


@contextmanager
def served_with(redis_url: str, tmp: Path, **env: str) -> Iterator[RlsServed]:
    """A started server with these settings, stopped after."""
    served = RlsServed(redis_url, tmp, **env).start()
    try:
        yield served
    finally:
        served.stop()


def _honest(port: int, token: str | None, stop: Any, calls: Any, results: Any, tls: Any = None) -> None:
    import grpc
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
    from rls_client import descriptor

    raise_priority()

    if tls is None:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    else:  # (CA, client certificate, key): over mutual TLS to the server's name
        ca, cert, key = (Path(p).read_bytes() for p in tls)
        channel = grpc.secure_channel(f"localhost:{port}", grpc.ssl_channel_credentials(ca, key, cert))
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    metadata = [("authorization", f"Bearer {token}")] if token else None
    latencies: list[float] = []
    failures: list[str] = []
    request = rls_pb2.RateLimitRequest(domain="rl", descriptors=[descriptor(("foo", f"honest-{os.getpid()}"))])
    next_at = time.monotonic()
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            stub.ShouldRateLimit(request, timeout=CALL_DEADLINE_S, metadata=metadata)
            latencies.append(time.perf_counter() - t0)
        except grpc.RpcError as exc:
            took = (time.perf_counter() - t0) * 1000
            failures.append(
                f"{exc.code().name} after {took:.0f} ms at {time.time() - took / 1000:.2f}: {exc.details()}"
            )
        with calls.get_lock():
            calls.value += 1
        next_at = max(next_at + PERIOD_S, time.monotonic())
        time.sleep(max(0.0, next_at - time.monotonic()))
    channel.close()
    results.put((latencies, failures))


class Honest:
    """The honest client (see the module docstring), started and stopped around an attack."""

    def __init__(self, port: int, token: str | None = None, tls: tuple[str, str, str] | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop_event = ctx.Event()
        self.calls = ctx.Value("i", 0)
        self.results = ctx.Queue()
        self.proc = ctx.Process(target=_honest, args=(port, token, self.stop_event, self.calls, self.results, tls))
        self.latencies: list[float] = []
        self.failures: list[str] = []

    def start(self) -> Honest:
        self.proc.start()
        wait_until(lambda: self.calls.value >= 5, timeout=30, what="the honest client calling")
        return self

    def stop(self) -> None:
        self.stop_event.set()
        try:
            self.latencies, self.failures = self.results.get(timeout=30)
        except Exception:  # noqa: BLE001 - it died: said in the failures
            self.failures.append(f"the honest client ended with {self.proc.exitcode}")
        self.proc.join(10)

    @property
    def p99_s(self) -> float:
        lat = sorted(self.latencies) or [float("inf")]
        return lat[min(len(lat) - 1, int(len(lat) * 0.99))]

    def summary(self, since: float = 0.0) -> str:
        """The answered calls' latency and the failures (their start less ``since``, a time.time())."""
        lat = sorted(self.latencies) or [0.0]
        failures = [re.sub(r" at (\d+\.\d+)", lambda m: f" at +{float(m[1]) - since:.2f} s", f) for f in self.failures]
        return (
            f"{len(self.latencies)} honest calls answered, {len(failures)} failed {failures[:3]};"
            f" p50 {lat[len(lat) // 2] * 1000:.1f} ms, p99 {self.p99_s * 1000:.1f} ms, max {lat[-1] * 1000:.1f} ms"
        )


class RssWatch(threading.Thread):
    """VmRSS of ``pid`` every 100 ms until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.baseline = rss_mb(pid)
        self.samples = [self.baseline]
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.1):
            try:
                self.samples.append(rss_mb(self.pid))
            except (OSError, AssertionError):
                return

    def stop(self) -> None:
        self.halt.set()
        self.join(5)
        try:
            self.samples.append(rss_mb(self.pid))
        except (OSError, AssertionError):
            pass

    @property
    def growth_mb(self) -> float:
        return max(self.samples) - self.baseline


class Attack:
    """The honest client calling and the server's memory watched while the ``with`` block runs."""

    def __init__(self, served: RlsServed, token: str | None = None, tls: tuple[str, str, str] | None = None) -> None:
        self.served = served
        self.honest = Honest(served.grpc_port, token, tls)
        self.overloaded_before = 0.0
        self.overloaded_after = 0.0
        self.seconds = 0.0
        self.http_error: str | None = None

    def __enter__(self) -> Attack:
        self._lock = open(LOCK, "w")  # noqa: SIM115 - held until __exit__
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.overloaded_before = self.served.metric("rate_limit_envoy_requests_total", code="overloaded")
        self.honest.start()
        self.rss = RssWatch(self.served.pid)
        self.rss.start()
        self.t0 = time.monotonic()
        self.started = time.time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.t0
        # what an attack leaves behind shows after it too; and a p99 needs a few hundred calls
        time.sleep(max(TAIL_S, MIN_WINDOW_S - self.seconds))
        self.rss.stop()
        self.honest.stop()
        try:
            self.overloaded_after = self.served.metric("rate_limit_envoy_requests_total", code="overloaded")
        except httpx.HTTPError as exc:
            self.http_error = f"/metrics on the HTTP port, after the attack: {type(exc).__name__}"
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()

    def summary(self) -> str:
        return (
            f"attack {self.seconds:.1f} s; RSS {self.rss.baseline:.0f} MB + {self.rss.growth_mb:.0f} MB;"
            f" {self.honest.summary(since=self.started)}"
        )

    def check(self, rss_mb: float = 64) -> None:
        """The bounds: RSS growth, the honest client's failures and p99, no overloaded answer."""
        assert self.served.alive(), f"the server died; {self.summary()}"
        assert self.http_error is None, f"{self.http_error}; {self.summary()}"
        assert self.rss.growth_mb < rss_mb, f"RSS grew past {rss_mb} MB: {self.summary()}"
        assert len(self.honest.latencies) >= 10 and not self.honest.failures, self.summary()
        assert self.honest.p99_s < P99_BOUND_S, f"honest p99 over {P99_BOUND_S * 1000:.0f} ms: {self.summary()}"
        assert self.overloaded_after == self.overloaded_before, (
            f"protocol refusals counted as rate limit answers: overloaded {self.overloaded_before:.0f}"
            f" -> {self.overloaded_after:.0f}"
        )
