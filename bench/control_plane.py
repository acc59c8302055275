"""Control-plane benchmark: ``POST /v1/decide`` under load from a separate process.

One control plane (``shadowlimit serve`` in its own process, embedded Redis) and one
load generator in another process: ``wrk`` (Debian's package; installed on demand when
running as root) with a Lua script that POSTs decide requests over many keys. For each
mode (off, shadow, canary 50%, enforce) it records requests/s and the p50/p99 latency
wrk measures; then the batch endpoint's decisions/s with batches of 1,000.

Run: ``python -m bench.control_plane [--seconds 3] [--repeats 20] [--connections 32]``; the report
lands in ``bench/results/control_plane.json`` and is rendered into docs/benchmarks.md by
``python -m bench``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

RULES = """\
version: 1
routes:
  - name: api
    match: {path: /api/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 1000000, period: 1s, burst: 1000000}
    distributed: {average: 1000000, period: 1s, burst: 1000000}
"""

WRK_LUA = """\
local counter = 0
request = function()
  counter = counter + 1
  local body = '{"route":"api","key":"k' .. (counter % 1000) .. '"}'
  return wrk.format("POST", "/v1/decide", {["Content-Type"] = "application/json"}, body)
end
done = function(summary, latency, requests)
  io.write(string.format("JSON{\\"requests\\":%d,\\"duration_us\\":%d,\\"errors\\":%d,\\"non2xx\\":%d,\\"p50_us\\":%d,\\"p90_us\\":%d,\\"p99_us\\":%d,\\"mean_us\\":%.1f}\\n",
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
"""

#: the same requests through the forward-auth endpoint, as a gateway sends them
WRK_AUTHZ_LUA = WRK_LUA.replace(
    """  local body = '{"route":"api","key":"k' .. (counter % 1000) .. '"}'
  return wrk.format("POST", "/v1/decide", {["Content-Type"] = "application/json"}, body)""",
    """  local headers = {["X-Forwarded-Method"] = "GET", ["X-Forwarded-Uri"] = "/api/items",
    ["X-Client-Id"] = "k" .. (counter % 1000)}
  return wrk.format("GET", "/v1/authz", headers)""",
)

MODES: list[tuple[str, int]] = [("off", 0), ("shadow", 0), ("canary", 50), ("enforce", 0)]


def measure_authz(
    wrk: str, server: Server, scripts: tuple[Path, Path], seconds: float, connections: int, repeats: int
) -> dict[str, Any]:
    """``/v1/authz`` next to ``/v1/decide``, per mode, the two interleaved in every round."""
    runs: dict[str, dict[str, list[float]]] = {}
    for _ in range(repeats):
        for mode in ("off", "shadow", "enforce"):
            server.set_mode(mode, 0)
            time.sleep(0.3)
            for name, script in zip(("decide", "authz"), scripts):
                r = run_wrk(wrk, server.url, script, seconds, connections)
                runs.setdefault(mode, {}).setdefault(name, []).append(r["rps"])
    return {
        mode: {name: {"runs": v, "rps": statistics.median(v)} for name, v in by.items()} for mode, by in runs.items()
    }


def free_port() -> int:
    """A TCP port free on loopback right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_wrk() -> str:
    path = shutil.which("wrk")
    if path:
        return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "wrk"],
            check=False,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        path = shutil.which("wrk")
        if path:
            return path
    raise SystemExit("bench.control_plane needs wrk (apt-get install wrk)")


class Server:
    """A control plane in its own process, on a free loopback port."""

    def __init__(
        self,
        workdir: Path,
        *,
        rules_text: str = RULES,
        env_extra: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        redis_url: str | None = None,
        tree: Path | None = None,
    ) -> None:
        """``redis_url``: use that Redis (the caller's, e.g. to stall or kill it) instead of
        ``--embedded-redis``'s private one; ``tree``: run that checkout's ``control_plane``
        (another revision's, for an A/B) instead of this one's."""
        self.port = free_port()
        self.token = secrets.token_hex(12)
        self.url = f"http://127.0.0.1:{self.port}"
        rules = workdir / "rules.yaml"
        rules.write_text(rules_text)
        env = dict(
            os.environ,
            ENABLE_DISTRIBUTED_RATE_LIMITING="true",
            RATE_LIMIT_RULES_PATH=str(rules),
            SHADOWLIMIT_ADMIN_TOKEN=self.token,
            SHADOWLIMIT_NAMESPACE="bench",
        )
        env.update(env_extra or {})
        if tree is not None:  # `python -m` puts its working directory first on sys.path
            env["PYTHONPATH"] = str(tree)
        env.pop("RATE_LIMIT_REDIS_URL", None)
        if redis_url is not None:
            env["RATE_LIMIT_REDIS_URL"] = redis_url
        self.log = open(workdir / "server.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "control_plane.cli",
                "serve",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                *(() if redis_url else ("--embedded-redis",)),
                *args,
            ],
            env=env,
            cwd=tree,
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
        raise SystemExit(f"control plane did not start: see {workdir / 'server.log'}")

    def set_mode(self, mode: str, percent: int, route: str = "api") -> None:
        r = httpx.put(
            f"{self.url}/v1/routes/{quote(route, safe='')}/mode",
            json={"mode": mode, "canary_percent": percent, "reason": "benchmark", "force": True},
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=10,
        )
        r.raise_for_status()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used so far; None off Linux."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_wrk(
    wrk: str,
    url: str,
    script: Path,
    seconds: float,
    connections: int,
    server_pid: int | None = None,
    *,
    cpus: str | None = None,
) -> dict[str, Any]:
    """One wrk run; with ``server_pid``, also the server's CPU time per request; with ``cpus``,
    wrk runs on those CPUs only (``taskset -c``)."""
    cpu0 = process_cpu_s(server_pid) if server_pid else None
    pinned = ["taskset", "-c", cpus] if cpus else []
    out = subprocess.run(
        [*pinned, wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = re.search(r"JSON(\{.*\})", out)
    if not m:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    data = json.loads(m.group(1))
    data["rps"] = data["requests"] / (data["duration_us"] / 1e6)
    cpu1 = process_cpu_s(server_pid) if server_pid else None
    if cpu0 is not None and cpu1 is not None and data["requests"]:
        data["server_cpu_us_per_request"] = (cpu1 - cpu0) / data["requests"] * 1e6
    return data


def run_batch(url: str, seconds: float, size: int = 1000) -> dict[str, Any]:
    body = json.dumps({"requests": [{"route": "api", "key": f"b{i % 1000}"} for i in range(size)]})
    headers = {"Content-Type": "application/json"}
    with httpx.Client(timeout=30) as c:
        c.post(url + "/v1/decide/batch", content=body, headers=headers).raise_for_status()
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            c.post(url + "/v1/decide/batch", content=body, headers=headers).raise_for_status()
            n += size
        dt = time.perf_counter() - t0
    return {"decisions": n, "seconds": dt, "decisions_per_s": n / dt, "batch_size": size}


def measure(seconds: float = 3.0, connections: int = 32, repeats: int = 20) -> dict[str, Any]:
    wrk = ensure_wrk()
    work = Path(tempfile.mkdtemp(prefix="shadowlimit-bench-cp-"))
    script = work / "decide.lua"
    script.write_text(WRK_LUA)
    server = Server(work)
    results: dict[str, Any] = {"modes": {}, "batch": {}}
    try:
        run_wrk(wrk, server.url, script, 2, connections)  # warm-up
        # repetitions interleaved across modes (off, shadow, canary, enforce, off, ...), so a
        # drift in the machine's speed hits every mode alike instead of one mode's runs
        runs_by_mode: dict[str, list[dict[str, Any]]] = {}
        for _ in range(repeats):
            for mode, pct in MODES:
                server.set_mode(mode, pct)
                time.sleep(0.5)
                runs_by_mode.setdefault(f"{mode}{f' {pct}%' if pct else ''}", []).append(
                    run_wrk(wrk, server.url, script, seconds, connections, server.proc.pid)
                )
        off_runs = runs_by_mode["off"]
        for name, runs in runs_by_mode.items():
            cpu = [r["server_cpu_us_per_request"] for r in runs if "server_cpu_us_per_request" in r]
            results["modes"][name] = {
                "runs": runs,
                "rps": statistics.median(r["rps"] for r in runs),
                "p50_us": statistics.median(r["p50_us"] for r in runs),
                "p99_us": statistics.median(r["p99_us"] for r in runs),
                # each run against the off run of the same round (seconds apart): the
                # machine's drift between rounds cancels out
                "p50_vs_off_paired": statistics.median(r["p50_us"] / o["p50_us"] for r, o in zip(runs, off_runs)),
                "server_cpu_us_per_request": statistics.median(cpu) if cpu else None,
                "non2xx": sum(r["non2xx"] for r in runs),
                "errors": sum(r["errors"] for r in runs),
            }
        batch_runs: dict[str, list[dict[str, Any]]] = {}
        for _ in range(repeats):
            for mode in ("off", "shadow", "enforce"):
                server.set_mode(mode, 0)
                batch_runs.setdefault(mode, []).append(run_batch(server.url, seconds / 2))
        for mode, runs in batch_runs.items():
            results["batch"][mode] = {
                "runs": runs,
                "decisions_per_s": statistics.median(r["decisions_per_s"] for r in runs),
            }
        authz = work / "authz.lua"
        authz.write_text(WRK_AUTHZ_LUA)
        results["authz"] = measure_authz(wrk, server, (script, authz), seconds, connections, max(1, repeats // 4))
    finally:
        server.stop()
    results["engine"] = measure_engine()
    results["meta"] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "wrk": subprocess.run([wrk, "-v"], capture_output=True, text=True).stdout.splitlines()[0],
        "connections": connections,
        "seconds_per_run": seconds,
        "repeats": repeats,
        "python": platform.python_version(),
        "load_avg": os.getloadavg(),
    }
    return results


def measure_engine(seconds: float = 1.0, repeats: int = 10, tasks: int = 32) -> dict[str, Any]:
    """The engine alone, in this process (no HTTP): ``tasks`` concurrent callers of
    ``Engine.decide`` on the same rules and an embedded Redis, interleaved across modes as
    above. The process's CPU time per decision says what each mode adds to a decision,
    shadow worker included, without the HTTP stack's cost and noise around it."""
    import asyncio

    from control_plane.engine import DecideInput
    from control_plane.gctune import tune_gc
    from control_plane.model.rollout import Mode
    from control_plane.settings import load_settings
    from control_plane.wiring import open_engine

    async def run() -> dict[str, list[float]]:
        work = Path(tempfile.mkdtemp(prefix="shadowlimit-bench-engine-"))
        rules = work / "rules.yaml"
        rules.write_text(RULES)
        handle = await open_engine(
            load_settings(
                rules_path=rules,
                enable_distributed_rate_limiting=True,
                namespace="bench-engine",
                redis_url=None,
                embedded_redis=True,
            )
        )
        tuning = tune_gc()  # as `shadowlimit serve` does
        engine = handle.engine
        inputs = [DecideInput(route="api", key=f"k{i}") for i in range(1000)]
        done = [0]
        per_mode: dict[str, list[float]] = {}

        async def caller(offset: int, stop: list[bool]) -> None:
            i = offset
            while not stop[0]:
                await engine.decide(inputs[i % 1000])
                i += 1
                done[0] += 1
                await asyncio.sleep(0)  # one decision per task per loop turn, like requests

        try:
            for _ in range(repeats):
                for mode, pct in MODES:
                    await engine.rollout.set_mode(
                        "api", Mode(mode), canary_percent=pct, reason="benchmark", actor="bench", force=True
                    )
                    await asyncio.sleep(0.2)
                    stop = [False]
                    done[0] = 0
                    workers = [asyncio.ensure_future(caller(k * 31, stop)) for k in range(tasks)]
                    cpu0 = time.process_time()
                    await asyncio.sleep(seconds)
                    stop[0] = True
                    await asyncio.gather(*workers)
                    await engine.shadow.drain()  # the shadow work this run queued is part of its cost
                    cpu1 = time.process_time()
                    per_mode.setdefault(f"{mode}{f' {pct}%' if pct else ''}", []).append((cpu1 - cpu0) / done[0] * 1e6)
        finally:
            tuning.undo()
            await handle.aclose()
        return per_mode

    per_mode = asyncio.run(run())
    off = per_mode["off"]
    return {
        "seconds_per_run": seconds,
        "repeats": repeats,
        "tasks": tasks,
        "modes": {
            name: {
                "runs_us": runs,
                "cpu_us_per_decision": statistics.median(runs),
                "added_vs_off_us": statistics.median(r - o for r, o in zip(runs, off)),
            }
            for name, runs in per_mode.items()
        },
    }


def _ratio_range(results: dict[str, Any], mode: str) -> str:
    """The lowest and highest per-round p50 ratio of ``mode`` to off, as text."""
    runs, off = results["modes"].get(mode, {}).get("runs", []), results["modes"].get("off", {}).get("runs", [])
    ratios = [r["p50_us"] / o["p50_us"] for r, o in zip(runs, off) if o.get("p50_us")]
    return f"from {min(ratios):.2f}x to {max(ratios):.2f}x" if ratios else "(no runs)"


def _authz_lines(authz: dict[str, Any] | None) -> list[str]:
    if not authz:
        return []
    lines = [
        "",
        "Forward-auth (`GET /v1/authz`, the request described by `X-Forwarded-Method`/`X-Forwarded-Uri` as a "
        "gateway sends it) next to `POST /v1/decide`, same connections and keys, the two interleaved in every "
        "round; requests/s, median of the rounds:",
        "",
        "| mode | /v1/decide | /v1/authz | authz / decide |",
        "|---|--:|--:|--:|",
    ]
    for mode, r in authz.items():
        d, a = r["decide"]["rps"], r["authz"]["rps"]
        lines.append(f"| {mode} | {d:,.0f} | {a:,.0f} | {a / d:.2f}x |")
    return lines


def render(results: dict[str, Any]) -> str:
    """A markdown section for docs/benchmarks.md."""
    meta = results["meta"]
    off = results["modes"].get("off", {})
    lines = [
        "## Control plane: `POST /v1/decide` under load",
        "",
        "One `shadowlimit serve` process (uvicorn, one worker, embedded Redis) and `wrk` in another process on "
        f"loopback: {meta['connections']} connections, {meta['seconds_per_run']:g} s per run, median of "
        f"{meta['repeats']} rounds (each round runs every mode once, in turn); 1,000 keys round robin, limit 1e6/s "
        "so every request is decided in full. Both processes and Redis share the 2 cores. "
        f"{meta['wrk']}; measured {meta['date']}.",
        "",
        "p50 vs off: the ratio of the medians, and the median of each round's ratio to that round's off run "
        "(paired: runs seconds apart, so the machine's drift between rounds cancels). Server CPU: the server "
        "process's CPU time (user + system, from /proc) per request; the server uses one core in every mode, "
        "so this is what sets its throughput. This machine's speed drifts: one round's ratio to off ranges "
        f"{_ratio_range(results, 'shadow')} for shadow in this run, so only medians over many rounds mean anything.",
        "",
        "| mode | requests/s | p50 | p99 | p50 vs off | p50 vs off, paired | server CPU/request | non-2xx |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, r in results["modes"].items():
        ratio = r["p50_us"] / off["p50_us"] if off.get("p50_us") else float("nan")
        paired = r.get("p50_vs_off_paired")
        cpu = r.get("server_cpu_us_per_request")
        lines.append(
            f"| {name} | {r['rps']:,.0f} | {r['p50_us'] / 1000:.2f} ms | {r['p99_us'] / 1000:.2f} ms | {ratio:.2f}x | "
            f"{f'{paired:.2f}x' if paired is not None else '-'} | "
            f"{f'{cpu:.0f} µs' if cpu is not None else '-'} | {r['non2xx']} |"
        )
    lines += [
        "",
        "Batch endpoint (`POST /v1/decide/batch`, 1,000 decisions per request, one client):",
        "",
        "| mode | decisions/s |",
        "|---|--:|",
    ]
    for name, r in results["batch"].items():
        lines.append(f"| {name} | {r['decisions_per_s']:,.0f} |")
    lines += _authz_lines(results.get("authz"))
    engine = results.get("engine")
    if engine:
        lines += [
            "",
            "The engine alone, in the benchmark's own process (no HTTP): "
            f"{engine['tasks']} tasks calling `Engine.decide` on the same rules, "
            f"{engine['seconds_per_run']:g} s per run, median of {engine['repeats']} interleaved rounds; "
            "process CPU time per decision, shadow worker and Redis client included. "
            "\"Added\" is the median of each round's difference from that round's off run.",
            "",
            "| mode | CPU per decision | added vs off |",
            "|---|--:|--:|",
        ]
        for name, r in engine["modes"].items():
            lines.append(f"| {name} | {r['cpu_us_per_decision']:.1f} µs | {r['added_vs_off_us']:+.1f} µs |")
    shadow = results["modes"].get("shadow", {})
    # met only when both estimates agree: the ratio of the medians and the paired one
    p50_ok = (
        bool(shadow and off)
        and shadow["p50_us"] <= off["p50_us"] * 1.10
        and shadow.get("p50_vs_off_paired", 99.0) <= 1.10
    )
    best_batch = max((r["decisions_per_s"] for r in results["batch"].values()), default=0)
    lines += [
        "",
        "| target | measured | met? |",
        "|---|---|---|",
        "| shadow p50 within 10% of off | "
        f"{shadow.get('p50_us', 0) / 1000:.2f} ms vs {off.get('p50_us', 0) / 1000:.2f} ms "
        f"({shadow.get('p50_us', 0) / max(1, off.get('p50_us', 1)):.2f}x; "
        f"paired {shadow.get('p50_vs_off_paired', float('nan')):.2f}x) | {'met' if p50_ok else '**not met**'} |",
        f"| batch endpoint >= 50,000 decisions/s | {best_batch:,.0f} (best mode) | "
        f"{'met' if best_batch >= 50_000 else '**not met**'} |",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="bench/results/control_plane.json")
    args = ap.parse_args(argv)
    results = measure(args.seconds, args.connections, args.repeats)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
