"""What an oversized request costs the server: peak memory and time to answer (a script, not a test).

For each case a fresh ``shadowlimit serve`` process (the checkout given by ``--source``,
default this one) on a redis-server of its own, then one oversized request:

* ``batch``: ``POST /v1/decide/batch`` with a ``--mb`` MB body of plain items, Content-Length set;
* ``chunked``: the same body sent chunked (no Content-Length);
* ``admin``: ``PUT /v1/routes/api/mode`` with a ``--mb`` MB body and no token.

While it is in flight, another connection sends ``POST /v1/decide`` one after another;
the slowest of those is reported with the oversized request's status and time to answer,
and the server's peak RSS (``VmHWM`` in ``/proc/<pid>/status``) before and after.

Run: ``python -m bench.body_limit [--source DIR] [--mb 100] [--case batch ...]``; compare
two checkouts by running it once with each ``--source`` (``git worktree add /tmp/old <commit>``).
Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from limiter.embedded import EmbeddedRedis

from .control_plane import RULES, free_port

ROOT = Path(__file__).resolve().parent.parent
CASES = ("batch", "chunked", "admin")


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


class Serve:
    """``python -m control_plane.cli serve`` run from ``source`` (its code, not the installed one)."""

    def __init__(self, source: Path, redis_url: str, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        rules = workdir / "rules.yaml"
        rules.write_text(RULES)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SHADOWLIMIT_", "RATE_LIMIT_", "ENABLE_DISTRIBUTED", "PYTHONPATH"))
        }
        env.update(
            RATE_LIMIT_REDIS_URL=redis_url,
            RATE_LIMIT_RULES_PATH=str(rules),
            SHADOWLIMIT_NAMESPACE=f"bodylimit-{self.port}",
            SHADOWLIMIT_ADMIN_TOKEN="bench-token",
        )
        self.log = open(workdir / f"serve-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "control_plane.cli", "serve", "--port", str(self.port), "--log-level", "warning"],
            cwd=source,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise SystemExit(f"serve from {source} did not start: see {self.log.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _body(mb: int) -> bytes:
    item = b'{"route":"api","key":"k0000001"},'
    n = mb * 1_000_000 // len(item)
    return b'{"requests":[' + item * n + b'{"route":"api","key":"k"}]}'


def _chunks(body: bytes, size: int = 65536) -> Iterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


def _decides(url: str, stop: threading.Event, out: list[float]) -> None:
    """Decide requests one after another until ``stop``; their latencies into ``out``."""
    with httpx.Client(base_url=url, timeout=120) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            r = c.post("/v1/decide", json={"route": "api", "key": "probe"})
            out.append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"decide answered {r.status_code}: {r.text[:200]}")
            time.sleep(0.01)


def run_case(case: str, source: Path, redis_url: str, body: bytes, workdir: Path) -> dict[str, Any]:
    server = Serve(source, redis_url, workdir)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:  # warm up: routes, scripts, first decisions
            for _ in range(20):
                c.post("/v1/decide", json={"route": "api", "key": "warm"}).raise_for_status()
        pid = server.proc.pid
        hwm0, rss0 = _status_kib(pid, "VmHWM"), _status_kib(pid, "VmRSS")
        stop = threading.Event()
        latencies: list[float] = []
        prober = threading.Thread(target=_decides, args=(server.url, stop, latencies), daemon=True)
        prober.start()
        time.sleep(0.2)
        before = len(latencies)
        headers = {"Content-Type": "application/json"}
        t0 = time.perf_counter()
        try:
            with httpx.Client(base_url=server.url, timeout=300) as c:
                if case == "batch":
                    r = c.post("/v1/decide/batch", content=body, headers=headers)
                elif case == "chunked":
                    r = c.post("/v1/decide/batch", content=_chunks(body), headers=headers)
                else:
                    r = c.put("/v1/routes/api/mode", content=body, headers=headers)
            status, answer = r.status_code, r.text[:160]
        except httpx.HTTPError as exc:
            status, answer = 0, f"{type(exc).__name__}: {exc}"
        elapsed = time.perf_counter() - t0
        time.sleep(0.2)
        stop.set()
        prober.join(130)
        during = latencies[before:]
        return {
            "case": case,
            "body_bytes": len(body),
            "status": status,
            "answer": answer,
            "answer_s": round(elapsed, 3),
            "vmhwm_mb_before": round(hwm0 / 1024, 1),
            "vmhwm_mb_after": round(_status_kib(pid, "VmHWM") / 1024, 1),
            "vmrss_mb_before": round(rss0 / 1024, 1),
            "decides_during": len(during),
            "slowest_decide_during_ms": round(max(during) * 1000, 1) if during else None,
        }
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.body_limit", description=__doc__.split("\n", 1)[0])
    ap.add_argument("--source", type=Path, default=ROOT, help="checkout whose control plane to run (default: this one)")
    ap.add_argument("--mb", type=int, default=100, help="size of the oversized body in MB (default 100)")
    ap.add_argument("--case", choices=CASES, action="append", help="run only this case (repeatable)")
    args = ap.parse_args(argv)
    body = _body(args.mb)
    work = Path(tempfile.mkdtemp(prefix="shadowlimit-bodylimit-"))
    with EmbeddedRedis() as redis_server:
        for case in args.case or CASES:
            print(
                json.dumps(
                    {
                        "source": str(args.source.resolve()),
                        **run_case(case, args.source.resolve(), redis_server.url, body, work),
                    }
                ),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
