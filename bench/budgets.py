"""What a budget's reserve and settle cost the server, against one plain decision.

The control plane is built as ``shadowlimit serve`` builds it (``create_app``, its lifespan, a
private ``redis-server``), with two routes of the same limits: ``api`` (no budget) and ``llm``
(a budget block, reservations kept 60 s). 32 concurrent callers, each yielding to the event
loop after every operation as a server's loop would (so the shadow worker and the Redis client
run in between and their CPU is counted), over 1,000 keys round robin; every row is the CPU
time (``time.process_time``, this process: the server's side, not redis-server's) per
operation of the loop with it minus the loop without it, the least disturbed of interleaved
repetitions, per mode (off, shadow, enforce):

* **plain**: ``Decider.decide`` of a cost of 1 on ``api`` (what ``POST /v1/decide`` decides);
* **reserve**: ``Decider.reserve`` of an estimate of 100 on ``llm`` (``POST /v1/decide`` with an
  ``estimate``), and **settle**: ``Decider.settle_reservation`` of that id at 80 (``POST
  /v1/settle``), measured as a **pair** (reserve, then its settle) and the reserve alone;
* **middleware**: a request through :class:`~control_plane.middleware.ShadowLimitMiddleware` to
  a tiny ASGI app answering a JSON usage, on a plain route and on a budget route with an
  ``estimate=`` (reserved, metered, settled), the whole ASGI call.

The keys' books fill as production's would: every settled reservation is remembered 60 s,
so a key holds its recent records (the run reports how many, at the end).

Run: ``python -m bench.budgets [--ops 16000] [--reps 5]``; the results land in
``bench/results/budgets.json`` and ``python -m bench --render-only`` puts them in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .control_plane import RULES as PLAIN_RULES

__all__ = ["measure", "render"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "budgets.json"
CALLERS = 32
KEYS = 1000
MODES = ("off", "shadow", "enforce")
KINDS = ("loop", "plain", "reserve", "pair", "mw_plain", "mw_budget")
TARGET = 1.3
#: bench.control_plane's ``api`` route, and ``llm``: the same limits with a budget block
RULES = (
    PLAIN_RULES
    + """\
  - name: llm
    match: {path: /llm/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 1000000, period: 1s, burst: 1000000}
    distributed: {average: 1000000, period: 1s, burst: 1000000}
    budget: {reservation_ttl: 60s}
"""
)


async def _usage_app(scope: Any, receive: Any, send: Any) -> None:
    """The app behind the middleware: a JSON answer with its usage."""
    body = b'{"choices":[],"usage":{"total_tokens":80}}'
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def _measure(ops: int, reps: int) -> dict[str, Any]:
    from control_plane.decision import DecideInput
    from control_plane.middleware import ShadowLimitMiddleware
    from control_plane.server.app import create_app
    from control_plane.settings import load_settings
    from limiter.embedded import EmbeddedRedis

    work = Path(tempfile.mkdtemp(prefix="shadowlimit-bench-budgets-"))
    (work / "rules.yaml").write_text(RULES)
    with EmbeddedRedis() as redis:
        settings = load_settings(
            redis_url=redis.url,
            rules_path=str(work / "rules.yaml"),
            enable_distributed_rate_limiting=True,
            namespace="bench-budgets",
            admin_token="x" * 32,
        )
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            engine = app.state.engine
            decider = engine.decider
            mw = ShadowLimitMiddleware(_usage_app, engine=engine, estimate=lambda info: 100)
            keys = [f"k{i}" for i in range(KEYS)]
            scopes = {
                route: [
                    {
                        "type": "http",
                        "method": "POST",
                        "path": f"/{route}/chat",
                        "query_string": b"",
                        "headers": [(b"x-client-id", k.encode()), (b"content-type", b"application/json")],
                        "client": ("127.0.0.1", 5000),
                    }  # fmt: skip
                    for k in keys
                ]
                for route in ("api", "llm")
            }
            request = {"type": "http.request", "body": b'{"max_tokens":100}', "more_body": False}

            async def receive() -> Any:
                return request

            async def send(_: Any) -> None:
                return None

            async def plain(i: int) -> None:
                await decider.decide(DecideInput(route="api", key=keys[i]))

            async def reserve(i: int) -> Any:
                return await decider.reserve(DecideInput(route="llm", key=keys[i], estimate=100))

            async def pair(i: int) -> None:
                await decider.settle_reservation((await reserve(i)).reservation, 80)

            async def mw_plain(i: int) -> None:
                await mw(scopes["api"][i], receive, send)

            async def mw_budget(i: int) -> None:
                await mw(scopes["llm"][i], receive, send)

            async def loop(i: int) -> None:
                return None

            ops_of = {"loop": loop, "plain": plain, "reserve": reserve, "pair": pair, "mw_plain": mw_plain,
                      "mw_budget": mw_budget}  # fmt: skip

            out = await _modes(engine, ops_of, ops, reps)
            books = [len(decider.local.book(f"{decider.plan(engine.rules.get('llm')).prefix}{k}").held) for k in keys]
            out["records_per_key"] = sum(books) / len(books)
    return out


async def _modes(engine: Any, ops_of: dict[str, Any], ops: int, reps: int) -> dict[str, Any]:
    """Every kind's CPU per operation, per mode (see the module docstring)."""
    from control_plane.model.rollout import Mode

    decider = engine.decider

    async def caller(kind: str, n: int, offset: int) -> None:
        sleep = asyncio.sleep
        op = ops_of[kind]
        for j in range(n):
            await op((offset + j * CALLERS) % KEYS)
            await sleep(0)

    async def run(kind: str) -> float:
        per = ops // CALLERS
        await asyncio.sleep(0.01)
        c0 = time.process_time()
        await asyncio.gather(*(caller(kind, per, k) for k in range(CALLERS)))
        await decider.shadow.drain()  # what is still queued is this run's work
        return (time.process_time() - c0) / (per * CALLERS) * 1e6

    out: dict[str, Any] = {}
    for mode in MODES:
        for route in ("api", "llm"):
            await engine.rollout.set_mode(route, Mode(mode), reason="benchmark", actor="bench", force=True)
        await asyncio.sleep(0.2)
        for kind in KINDS:
            await run(kind)  # warm-up
        cpu: dict[str, list[float]] = {k: [] for k in KINDS}
        for _ in range(reps):
            for kind in KINDS:
                cpu[kind].append(await run(kind))
        m = {k: min(v) for k, v in cpu.items()}
        row = {k: m[k] - m["loop"] for k in KINDS if k != "loop"}
        row["settle"] = row["pair"] - row["reserve"]
        out[mode] = row
    return out


def measure(ops: int = 16_000, reps: int = 5) -> dict[str, Any]:
    """The rows, measured in a fresh process (the control plane tunes its GC and starts
    background tasks: not in the caller's process)."""
    import subprocess

    raw = subprocess.run(
        [sys.executable, "-m", "bench.budgets", "--child", "--ops", str(ops), "--reps", str(reps)],
        capture_output=True,
        text=True,
        check=True,
        timeout=1200,
        cwd=ROOT,
        env=dict(os.environ, SHADOWLIMIT_LOG_LEVEL="warning"),
    ).stdout
    rows = json.loads(raw.strip().splitlines()[-1])
    from .harness import environment

    env = environment(["--only", "budgets"])
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "ops": ops,
        "reps": reps,
        "cpu": env.get("cpu"),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "git": env.get("git"),
    }
    return {"meta": meta, "rows": rows}


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for mode in MODES:
        r = results["rows"][mode]
        ratio = r["pair"] / r["plain"]
        out.append(
            {
                "target": f"budgets, {mode}: a reserve and its settle <= {TARGET}x the server CPU of a plain decision",
                "measured": f"{ratio:.2f}x ({r['pair']:.1f} µs against {r['plain']:.1f} µs)",
                "met": ratio <= TARGET,
            }
        )
    return out


def render(results: dict[str, Any]) -> str:
    meta, rows = results["meta"], results["rows"]
    lines = [
        "## Budgets: reserve and settle against a plain decision",
        "",
        f"Measured {meta['date']} (git {meta['git']}) by `python -m bench.budgets`: the control plane as `serve` "
        f"builds it, in-process, {CALLERS} concurrent callers over {KEYS:,} keys, {meta['ops']:,} operations a run, "
        f"the least disturbed of {meta['reps']} interleaved repetitions; server CPU per operation (this process, "
        f"not redis-server), the event loop's own cost taken off. {meta['cpu']}, {meta['cores']} cores, "
        f"CPython {meta['python']}. The books held {rows['records_per_key']:.0f} records a key at the end (settled "
        "reservations are remembered 60 s).",
        "",
        "| server CPU per operation | off | shadow | enforce |",
        "|---|--:|--:|--:|",
    ]
    labels = (
        ("plain", "plain decision (`Decider.decide`, cost 1)"),
        ("reserve", "reserve (`Decider.reserve`, estimate 100)"),
        ("settle", "its settle (`Decider.settle_reservation`, 80)"),
        ("pair", "**reserve + settle**"),
        ("mw_plain", "middleware request, plain route"),
        ("mw_budget", "middleware request, budget route (estimate, metered, settled)"),
    )
    for key, label in labels:
        lines.append(f"| {label} | " + " | ".join(f"{rows[m][key]:.1f} µs" for m in MODES) + " |")
    lines.append(
        "| reserve + settle / plain | " + " | ".join(f"{rows[m]['pair'] / rows[m]['plain']:.2f}x" for m in MODES) + " |"
    )
    lines.append(
        "| middleware budget / plain request | "
        + " | ".join(f"{rows[m]['mw_budget'] / rows[m]['mw_plain']:.2f}x" for m in MODES)
        + " |"
    )
    lines += ["", "| target | measured | met? |", "|---|---|---|"]
    for t in targets(results):
        lines.append(f"| {t['target']} | {t['measured']} | {'met' if t['met'] else '**not met**'} |")
    lines += ["", "_Measured separately by `python -m bench.budgets`; read from `bench/results/budgets.json`._", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.budgets", description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=16_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        import uvloop

        print(json.dumps(uvloop.run(_measure(args.ops, args.reps))))
        return 0
    results = measure(args.ops, args.reps)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
