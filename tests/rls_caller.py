"""A process that calls Envoy's rate limit service one call at a time with a deadline
(Envoy's 20 ms by default), for the tests that measure whether a control plane ever misses it.

A process of its own, not a thread of the test: the test's other threads (polling
``/healthz``, waiting on conditions) would otherwise take the GIL from the client, and a
call late on the client's side fails its deadline as surely as one late on the server's.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from typing import Any

__all__ = ["DEADLINE_S", "Caller"]

DEADLINE_S = 0.02  # Envoy's default timeout for the rate limit service


def _run(port: int, deadline_s: float, stop: Any, seen_new: Any, old_answers: Any, results: Any) -> None:
    from envoy.service.ratelimit.v3 import rls_pb2
    from rls_client import OK, Rls, descriptor

    rls = Rls(port)
    latencies: list[float] = []
    failures: list[str] = []
    slow: list[tuple[float, float]] = []  # (time.time() it started, seconds) of the calls over 10 ms

    def call(*entries: tuple[str, str]) -> Any:
        req = rls_pb2.RateLimitRequest(domain="edge", descriptors=[descriptor(*entries)])
        t0 = time.perf_counter()
        try:
            r = rls.stub.ShouldRateLimit(req, timeout=deadline_s)
        except Exception as exc:  # noqa: BLE001 - every failure is reported
            code = exc.code().name if hasattr(exc, "code") else type(exc).__name__
            ms = (time.perf_counter() - t0) * 1000
            failures.append(f"{entries}: {code} after {ms:.1f} ms at {time.time():.2f}")
            return None
        took = time.perf_counter() - t0
        latencies.append(took)
        if took > 0.010:
            slow.append((time.time() - took, took))
        return r

    i = 0
    while not stop.is_set():
        i += 1
        r = call(("old", "x"))
        if r is not None and r.statuses[0].current_limit.requests_per_unit == 1_000_000:
            with old_answers.get_lock():
                old_answers.value += 1
        r = call(("k", f"v{i % 50_000}"))
        if r is not None and r.statuses[0].HasField("current_limit") and not seen_new.is_set():
            if r.overall_code != OK or r.statuses[0].current_limit.requests_per_unit != 10:
                failures.append(f"unexpected answer from the new configuration: {r}")
            seen_new.set()
        time.sleep(0.005)
    rls.close()
    results.put((latencies, failures, slow))


class Caller:
    """ShouldRateLimit one call at a time, each with ``deadline_s`` (Envoy's 20 ms by default), alternating a
    descriptor of the old configuration (``old=x``, 1,000,000/second) and one only the big
    new one limits (``k=v<i>``, 10/second), in a process of its own."""

    def __init__(self, port: int, deadline_s: float = DEADLINE_S) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop_event = ctx.Event()
        self.seen_new = ctx.Event()
        self.old = ctx.Value("i", 0)
        self.results = ctx.Queue()
        self.proc = ctx.Process(
            target=_run, args=(port, deadline_s, self.stop_event, self.seen_new, self.old, self.results), daemon=True
        )
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.slow: list[tuple[float, float]] = []
        self.new_limit_seen_at: float | None = None

    def start(self) -> None:
        self.proc.start()

    @property
    def old_limit_answers(self) -> int:
        return int(self.old.value)

    def new_limit_seen(self) -> bool:
        if self.new_limit_seen_at is None and self.seen_new.is_set():
            self.new_limit_seen_at = time.monotonic()
        return self.new_limit_seen_at is not None

    def stop(self) -> None:
        """Stop calling; collect the latencies and failures."""
        if self.proc.pid is None:
            return
        self.stop_event.set()
        if self.proc.is_alive() or not self.latencies:
            try:
                self.latencies, self.failures, self.slow = self.results.get(timeout=30)
            except Exception:  # noqa: BLE001 - it died: said in the failures
                self.failures.append(f"the calling process ended with {self.proc.exitcode}")
        self.proc.join(10)

    def summary(self, since: float | None = None) -> str:
        """The answered calls' latency and the failures (their times after ``since``, a
        :func:`time.time`, when given)."""
        lat = sorted(self.latencies) or [0.0]
        failures = self.failures
        if since is not None:
            failures = [
                f"{f.rsplit(' at ', 1)[0]} at +{float(f.rsplit(' at ', 1)[1]) - since:.2f} s" if " at " in f else f
                for f in failures
            ]
        slowest = sorted(self.slow, key=lambda s: -s[1])[:3]
        when = [f"{ms * 1000:.1f} ms at +{t - since:.2f} s" for t, ms in slowest] if since is not None else []
        return (
            f"{len(self.latencies)} calls answered, {len(failures)} failed {failures[:5]}; latency"
            f" p50 {statistics.median(lat) * 1000:.1f} ms, p99 {lat[int(len(lat) * 0.99)] * 1000:.1f} ms,"
            f" max {lat[-1] * 1000:.1f} ms {when}"
        )
