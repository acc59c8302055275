"""The service near the server's own limit: every decision endpoint against a bare ASGI ceiling.

One run, on this machine, in interleaved rounds so the machine's drift hits every line alike:

* **ceiling**: a bare ASGI app (a few lines: read the body, ``orjson.loads`` it, answer the
  bytes of a real ``/v1/decide`` answer, same headers) under the same server as ``shadowlimit
  serve`` (uvicorn, httptools, the same bounded protocol class), loaded by the same wrk script;
* ``POST /v1/decide``, ``/v1/authz`` and gRPC ``ShouldRateLimit`` per mode (off, shadow,
  enforce), 1,000 keys, every request decided in full, as a ratio to the ceiling;
* ``POST /v1/decide/batch`` decisions/s per mode (1,000 per request);
* **shadow drops**: batches paced at 30,000 decisions/s for ``DROP_SECONDS`` in shadow mode
  with the default queue: the share of shadow comparisons dropped;
* **workers**: ``serve --workers 2`` against 1, ``/v1/decide`` in shadow;
* **middleware**: a Starlette app with ``ShadowLimitMiddleware`` against the same app without.

Run: ``python -m bench.service [--seconds 3] [--rounds 5]`` (``python -m bench`` runs it as its
``service`` section); wrk and the servers are separate processes on loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from . import hotpath_profile
from .control_plane import WRK_AUTHZ_LUA, WRK_LUA, Server, ensure_wrk, free_port, run_batch, run_wrk
from .grpc_rls import ROUTE, run_client, start_server

__all__ = ["measure", "render"]

MODES = ("off", "shadow", "enforce")
DROP_RATE = 30_000
DROP_SECONDS = 10.0


# -- the processes measured ------------------------------------------------------------


def _ceiling_app(body: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
    import orjson

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        more = True
        while more:
            m = await receive()
            chunks.append(m.get("body", b""))
            more = m.get("more_body", False)
        raw = b"".join(chunks)
        if raw:
            orjson.loads(raw)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def _serve_ceiling(port: int, answer_file: str) -> None:
    import uvicorn

    from control_plane.server.serving import http_protocol
    from control_plane.settings import load_settings

    answer = json.loads(Path(answer_file).read_text())
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer["headers"]]
    app = _ceiling_app(answer["body"].encode(), headers)
    limits = load_settings(redis_url="redis://127.0.0.1:1").request_limits
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, http=http_protocol(limits))


def _serve_middleware(port: int, redis_url: str, work: str, with_middleware: bool) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def item(_: Any) -> JSONResponse:
        return JSONResponse({"ok": True, "items": [1, 2, 3]})

    app = Starlette(routes=[Route("/api/items", item, methods=["GET", "POST"])])
    if with_middleware:
        from control_plane.middleware import ShadowLimitMiddleware
        from control_plane.settings import load_settings

        rules = Path(work) / "mw-rules.yaml"
        rules.write_text(
            "version: 1\nroutes:\n  - name: api\n    match: {path: /api/**}\n"
            "    key: {strategy: header, header: X-Client-Id}\n"
            "    local: {average: 1000000, period: 1s, burst: 1000000}\n    mode: shadow\n"
        )
        settings = load_settings(
            redis_url=redis_url,
            rules_path=str(rules),
            enable_distributed_rate_limiting=True,
            namespace=f"bench-mw-{port}",
        )
        app.add_middleware(ShadowLimitMiddleware, settings=settings)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _spawn(*args: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    out = open(log, "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([sys.executable, "-m", "bench.service", *args, str(port)], stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/api/items", timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{args[0]} did not start: see {log}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- the measures ----------------------------------------------------------------------------

WRK_GET = WRK_LUA.replace(
    """  local body = '{"route":"api","key":"k' .. (counter % 1000) .. '"}'
  return wrk.format("POST", "/v1/decide", {["Content-Type"] = "application/json"}, body)""",
    """  return wrk.format("GET", "/api/items", {["X-Client-Id"] = "k" .. (counter % 1000)})""",
)


def _wrk(wrk: str, url: str, script: Path, seconds: float, pid: int | None = None) -> dict[str, Any]:
    return run_wrk(wrk, url, script, seconds, 32, pid)


def _pace_batches(url: str, seconds: float, rate: int) -> dict[str, Any]:
    """Batches of 1,000 decisions sent at ``rate`` decisions/s for ``seconds`` (shadow)."""
    before = httpx.get(url + "/v1/backend", timeout=10).json()
    per = 1000
    interval = per / rate
    body = json.dumps({"requests": [{"route": "api", "key": f"d{i}"} for i in range(per)]})
    sent = 0
    t0 = time.perf_counter()
    with httpx.Client(timeout=30) as c:
        while time.perf_counter() - t0 < seconds:
            due = t0 + (sent / per) * interval
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            c.post(url + "/v1/decide/batch", content=body, headers={"Content-Type": "application/json"})
            sent += per
    elapsed = time.perf_counter() - t0
    time.sleep(1.0)  # the last evaluations
    after = httpx.get(url + "/v1/backend", timeout=10).json()
    dropped = after["shadow_dropped"] - before["shadow_dropped"]
    evaluated = after["shadow_evaluated"] - before["shadow_evaluated"]
    return {
        "offered_per_s": sent / elapsed,
        "dropped": dropped,
        "evaluated": evaluated,
        "dropped_share": dropped / max(1, dropped + evaluated),
        "queue_capacity": after["shadow_queue_capacity"],
    }


def _answer_file(url: str, work: Path) -> Path:
    """A real ``/v1/decide`` answer (its headers and body) for the ceiling to send."""
    r = httpx.post(url + "/v1/decide", json={"route": "api", "key": "k1"}, timeout=10)
    headers = [(k, v) for k, v in r.headers.raw if k.lower() not in (b"date", b"server")]
    path = work / "answer.json"
    path.write_text(json.dumps({"headers": [(k.decode(), v.decode()) for k, v in headers], "body": r.text}))
    return path


def measure(seconds: float = 3.0, rounds: int = 5) -> dict[str, Any]:
    wrk = ensure_wrk()
    work = Path(tempfile.mkdtemp(prefix="shadowlimit-bench-service-"))
    decide_lua, authz_lua, get_lua = work / "decide.lua", work / "authz.lua", work / "get.lua"
    decide_lua.write_text(WRK_LUA)
    authz_lua.write_text(WRK_AUTHZ_LUA)
    get_lua.write_text(WRK_GET)
    server, grpc_port = start_server(work)
    ceiling, ceiling_url = _spawn("--ceiling", str(_answer_file(server.url, work)), log=work / "ceiling.log")
    runs: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}

    def record(name: str, r: dict[str, Any]) -> None:
        runs.setdefault(name, []).append(r["rps"])
        if "server_cpu_us_per_request" in r:
            cpu.setdefault(name, []).append(r["server_cpu_us_per_request"])

    try:
        _wrk(wrk, server.url, decide_lua, 2)  # warm-up
        for _ in range(rounds):
            record("ceiling", _wrk(wrk, ceiling_url, decide_lua, seconds, ceiling.pid))
            for mode in MODES:
                for route in (ROUTE, "api"):
                    server.set_mode(mode, 0, route)
                time.sleep(0.3)
                record(f"decide {mode}", _wrk(wrk, server.url, decide_lua, seconds, server.proc.pid))
                record(f"authz {mode}", _wrk(wrk, server.url, authz_lua, seconds, server.proc.pid))
                g = run_client(grpc_port, seconds, 32)
                runs.setdefault(f"grpc {mode}", []).append(g["calls_per_s"])
        batch = {}
        for mode in ("shadow", "enforce"):
            server.set_mode(mode, 0, "api")
            batch[mode] = statistics.median(run_batch(server.url, seconds)["decisions_per_s"] for _ in range(rounds))
        server.set_mode("shadow", 0, "api")
        drops = _pace_batches(server.url, DROP_SECONDS, DROP_RATE)
    finally:
        _stop(ceiling)
        server.stop()
    out: dict[str, Any] = {
        "rps": {k: statistics.median(v) for k, v in runs.items()},
        "runs": runs,
        "cpu_us_per_request": {k: statistics.median(v) for k, v in cpu.items()},
        "batch": batch,
        "shadow_drops": drops,
    }
    out["workers"] = _measure_workers(wrk, work, decide_lua, seconds, rounds)
    out["middleware"] = _measure_middleware(wrk, work, get_lua, seconds, rounds)
    out["hotpath"] = hotpath_profile.measure()
    out["meta"] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "seconds_per_run": seconds,
        "rounds": rounds,
        "connections": 32,
        "cores": os.cpu_count(),
    }
    return out


def _measure_workers(wrk: str, work: Path, script: Path, seconds: float, rounds: int) -> dict[str, Any]:
    res: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(rounds):
        for n in (1, 2):
            server = Server(work, rules_text=_SHADOW_RULES, args=("--workers", str(n)))
            try:
                time.sleep(1.0 if n > 1 else 0.3)  # every worker up
                _wrk(wrk, server.url, script, 1)
                res[n].append(_wrk(wrk, server.url, script, seconds)["rps"])
            finally:
                server.stop()
    return {str(n): statistics.median(v) for n, v in res.items()} | {"runs": {str(k): v for k, v in res.items()}}


def _measure_middleware(wrk: str, work: Path, script: Path, seconds: float, rounds: int) -> dict[str, Any]:
    from limiter.embedded import EmbeddedRedis

    redis = EmbeddedRedis().start()
    res: dict[str, list[float]] = {"without": [], "with": []}
    cpu: dict[str, list[float]] = {"without": [], "with": []}
    try:
        for _ in range(rounds):
            for name in ("without", "with"):
                proc, url = _spawn("--middleware", redis.url, str(work), name, log=work / "mw.log")
                try:
                    _wrk(wrk, url, script, 1)
                    r = _wrk(wrk, url, script, seconds, proc.pid)
                    res[name].append(r["rps"])
                    if "server_cpu_us_per_request" in r:
                        cpu[name].append(r["server_cpu_us_per_request"])
                finally:
                    _stop(proc)
    finally:
        redis.stop()
    return {
        "rps": {k: statistics.median(v) for k, v in res.items()},
        "cpu_us_per_request": {k: statistics.median(v) for k, v in cpu.items() if v},
        "runs": res,
    }


_SHADOW_RULES = """\
version: 1
routes:
  - name: api
    match: {path: /api/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 1000000, period: 1s, burst: 1000000}
    mode: shadow
"""


# -- the report ----------------------------------------------------------------------------


def _target(ok: bool) -> str:
    return "met" if ok else "**not met**"


def render(results: dict[str, Any]) -> str:
    meta, rps, cpu = results["meta"], results["rps"], results["cpu_us_per_request"]
    ceiling = rps["ceiling"]
    lines = [
        "## The service near the server's limit",
        "",
        f"Measured {meta['date']} by `python -m bench.service` (the `service` section of `./dev bench`): wrk "
        f"({meta['connections']} connections, 1,000 keys, {meta['seconds_per_run']:g} s per run), median of "
        f"{meta['rounds']} interleaved rounds, {meta['cores']} cores shared by wrk, the server, Redis and the "
        "gRPC client. The ceiling is a bare ASGI app (read the body, `orjson.loads`, answer the bytes of a real "
        "`/v1/decide` answer) under the same server (uvicorn, httptools, the same bounded protocol, which writes "
        "a whole answer in one write: what the server gains, the ceiling gains too).",
        "",
        "| endpoint | requests/s | of the ceiling | server CPU/request |",
        "|---|--:|--:|--:|",
        f"| ceiling (bare ASGI) | {ceiling:,.0f} | 100% | {cpu.get('ceiling', 0):.0f} µs |",
    ]
    for name in [f"{e} {m}" for e in ("decide", "authz", "grpc") for m in MODES]:
        if name in rps:
            c = cpu.get(name)
            label = name.replace("decide", "POST /v1/decide").replace("authz", "/v1/authz")
            label = label.replace("grpc", "gRPC ShouldRateLimit")
            lines.append(f"| {label} | {rps[name]:,.0f} | {rps[name] / ceiling:.0%} | {f'{c:.0f} µs' if c else '-'} |")
    b, d, w, mw = results["batch"], results["shadow_drops"], results["workers"], results["middleware"]
    lines += [
        "",
        "| measure | figure |",
        "|---|--:|",
        f"| batch, shadow (decisions/s) | {b['shadow']:,.0f} |",
        f"| batch, enforce (decisions/s) | {b['enforce']:,.0f} |",
        f"| shadow comparisons dropped at {d['offered_per_s']:,.0f} decisions/s for {DROP_SECONDS:g} s "
        f"(queue {d['queue_capacity']:,}) | {d['dropped_share']:.1%} ({d['dropped']:,} of "
        f"{d['dropped'] + d['evaluated']:,}) |",
        f"| `serve --workers 1`, POST /v1/decide shadow (requests/s) | {w['1']:,.0f} |",
        f"| `serve --workers 2`, the same | {w['2']:,.0f} ({w['2'] / w['1']:.2f}x) |",
        f"| Starlette app without / with ShadowLimitMiddleware (requests/s) | {mw['rps']['without']:,.0f} / "
        f"{mw['rps']['with']:,.0f} ({mw['rps']['with'] / mw['rps']['without']:.2f}x) |",
    ]
    mcpu = mw.get("cpu_us_per_request", {})
    if "with" in mcpu and "without" in mcpu:
        lines.append(
            f"| the middleware's added server CPU per request | {mcpu['with'] - mcpu['without']:.0f} µs "
            f"({mcpu['with'] / mcpu['without']:.2f}x) |"
        )
    lines += [
        "",
        "| target | measured | met? |",
        "|---|---|---|",
        f"| /v1/decide shadow >= 50% of the ceiling | {rps['decide shadow'] / ceiling:.0%} | "
        f"{_target(rps['decide shadow'] >= ceiling * 0.5)} |",
        f"| /v1/decide enforce >= 40% of the ceiling | {rps['decide enforce'] / ceiling:.0%} | "
        f"{_target(rps['decide enforce'] >= ceiling * 0.4)} |",
        f"| batch shadow >= 100,000 decisions/s | {b['shadow']:,.0f} | {_target(b['shadow'] >= 100_000)} |",
        f"| batch enforce >= 50,000 decisions/s | {b['enforce']:,.0f} | {_target(b['enforce'] >= 50_000)} |",
        f"| < 1% shadow comparisons dropped at 30,000/s | {d['dropped_share']:.1%} at {d['offered_per_s']:,.0f}/s | "
        f"{_target(d['dropped_share'] < 0.01 and d['offered_per_s'] >= 0.95 * DROP_RATE)} |",
    ]
    if "hotpath" in results:
        lines += _render_hotpath(results["hotpath"], cpu)
    return "\n".join(lines) + "\n"


def _render_hotpath(h: dict[str, Any], cpu: dict[str, float]) -> list[str]:
    """Where a decision's CPU goes (``bench.hotpath_profile``), next to the server's figures."""
    lines = [
        "",
        "### Where a decision's CPU goes",
        "",
        "In-process (`python -m bench.hotpath_profile`): the app built as `serve` builds it, its ASGI call made "
        f"directly by {hotpath_profile.CALLERS} concurrent callers that yield to the event loop after each request; "
        "CPU per request of each stage added (the shadow worker's evaluation and the Redis client count in "
        "*decide*). The last rows put it next to the server: what a request costs under wrk beyond the ceiling "
        "app's own cost (uvicorn's parsing, the ASGI task, the write) is this Python work as it runs in a "
        "loaded server, between network reads and writes.",
        "",
        "| CPU per request | off | shadow | enforce |",
        "|---|--:|--:|--:|",
    ]
    names = {"parse": "parse the body", "decide": "decide (`Decider.decide`)", "answer": "answer bytes",
             "glue": "hot-path glue (bounds, body, sends)"}  # fmt: skip
    for stage, label in names.items():
        lines.append(f"| {label} | " + " | ".join(f"{h[m]['stages_us'][stage]:.1f} µs" for m in MODES) + " |")
    lines.append("| **in-process total** | " + " | ".join(f"**{h[m]['total_us']:.1f} µs**" for m in MODES) + " |")
    if "ceiling" in cpu and all(f"decide {m}" in cpu for m in MODES):
        lines.append(
            "| server under wrk, minus the ceiling's CPU/request | "
            + " | ".join(f"{cpu[f'decide {m}'] - cpu['ceiling']:.0f} µs" for m in MODES)
            + " |"
        )
        lines.append(
            "| what 50% / 40% of the ceiling allow beyond it | "
            f"{cpu['ceiling']:.0f} µs | {cpu['ceiling']:.0f} µs | {cpu['ceiling'] * 1.5:.0f} µs |"
        )
    b = h["batch"]
    lines += [
        "",
        "`POST /v1/decide/batch` (batches of 1,000), CPU per decision, same process; the shadow worker's "
        "evaluation is timed on its own (batches of up to 4x256); Redis = the redis-server's own CPU "
        "(`INFO cpu`) per decision of the run (in shadow, only what the 10,000-item queue let through was "
        "evaluated):",
        "",
        "| CPU per decision | off | shadow | enforce |",
        "|---|--:|--:|--:|",
        "| the body read (`read_batch`) | " + " | ".join(f"{b[m]['parse_us']:.1f} µs" for m in MODES) + " |",
        "| decide + `orjson.dumps` (`answer_batch`) | "
        + " | ".join(f"{b[m]['decide_and_dump_us']:.1f} µs" for m in MODES)
        + " |",
        f"| shadow evaluation, per evaluated decision | - | {b['shadow'].get('shadow_evaluation_us', 0):.1f} µs | - |",
        "| redis-server | " + " | ".join(f"{b[m]['redis_cpu_us']:.1f} µs" for m in MODES) + " |",
    ]
    sh, en = b["shadow"], b["enforce"]
    shadow_server = sh["parse_us"] + sh["decide_and_dump_us"] + sh.get("shadow_evaluation_us", 0)
    enforce_server = en["parse_us"] + en["decide_and_dump_us"]
    lines += [
        "",
        f"At 100,000 decisions/s in shadow, every one evaluated, the server process alone needs "
        f"{shadow_server * 0.1:.2f} cores (one event loop has 1) and Redis another "
        f"{b['enforce']['redis_cpu_us'] * 0.1:.2f}; at 50,000/s in enforce, {enforce_server * 0.05:.2f} + "
        f"{en['redis_cpu_us'] * 0.05:.2f} cores, before the HTTP transfer and the client, on a machine of "
        f"{os.cpu_count()} cores.",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--ceiling":
        _serve_ceiling(int(argv[2]), argv[1])
        return 0
    if argv and argv[0] == "--middleware":
        _serve_middleware(int(argv[4]), argv[1], argv[2], argv[3] == "with")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/results/service.json")
    args = ap.parse_args(argv)
    results = measure(args.seconds, args.rounds)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
