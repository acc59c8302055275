"""Where a decision request's CPU goes, measured in-process (no HTTP server, no wrk).

The control plane is built as ``shadowlimit serve`` builds it (``create_app``, its
lifespan, a private ``redis-server``), then its ASGI app is called directly with a
``POST /v1/decide`` scope and a no-op ``send``: 32 concurrent callers, each yielding to the
event loop after every request as a server's loop would (so the shadow worker and the Redis
client run in between, and their CPU is counted). Stages are added one at a time and each
line is the CPU time (``time.process_time``) per request of the loop with that stage minus
the loop without it, each the least disturbed of interleaved repetitions (their noise is a few
microseconds, so a small stage can come out near zero):

* **parse**: the body read as the endpoint reads it (``read_decide``: the plain ``{"route", "key"}``
  of this benchmark recognised as the model reads it, without running it);
* **decide**: ``Decider.decide`` (route, key, local check, mode, shadow queueing and the
  shadow worker's evaluation, the Redis call in enforce, headers, metrics, activity, the
  what-if recorder);
* **answer**: the answer's bytes (``result_answer``: ``orjson.dumps``, the raw headers);
* **hot-path glue**: the rest of the hot path's ASGI call (header bounds, body read, dispatch,
  the two ``send`` calls) -- the whole app call minus the three above.

For ``POST /v1/decide/batch``, per decision: the body read (``read_batch``), ``decide_many`` +
``orjson.dumps`` (``answer_batch``), the shadow worker's evaluation of a full batch, and the
Redis server's own CPU per decision (``INFO cpu``) in enforce.

Run: ``python -m bench.hotpath_profile`` (JSON on stdout); ``python -m bench.service`` runs
it in a subprocess and renders it in its section.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["measure"]

CALLERS = 32
MODES = ("off", "shadow", "enforce")
STAGES = ("loop", "parse", "decide", "answer", "app")


async def _measure(requests: int, reps: int) -> dict[str, Any]:

    from control_plane.api.decide import read_decide, result_answer
    from control_plane.model.rollout import Mode
    from control_plane.server.app import create_app
    from control_plane.settings import load_settings
    from limiter.embedded import EmbeddedRedis

    from .control_plane import RULES

    work = Path(tempfile.mkdtemp(prefix="shadowlimit-bench-hotpath-"))
    rules = work / "rules.yaml"
    rules.write_text(RULES)
    with EmbeddedRedis() as redis:
        settings = load_settings(
            redis_url=redis.url,
            rules_path=str(rules),
            enable_distributed_rate_limiting=True,
            namespace="bench-hotpath",
            admin_token="x" * 32,
        )
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            engine = app.state.engine
            decider = engine.decider
            bodies = [b'{"route":"api","key":"k%d"}' % (i % 1000) for i in range(1000)]
            headers = [[(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(b)).encode())] for b in bodies]  # fmt: skip

            async def send(_: Any) -> None:
                return None

            def receive_of(body: bytes) -> Any:
                message = {"type": "http.request", "body": body, "more_body": False}

                async def receive() -> Any:
                    return message

                return receive

            async def caller(stage: str, n: int, offset: int) -> None:
                sleep = asyncio.sleep
                decide = decider.decide
                for j in range(n):
                    i = (offset + j * CALLERS) % 1000
                    body = bodies[i]
                    if stage == "app":
                        scope = {"type": "http", "method": "POST", "path": "/v1/decide", "query_string": b"",
                                 "headers": headers[i], "client": ("127.0.0.1", 5000)}  # fmt: skip
                        await app(scope, receive_of(body), send)
                    elif stage != "loop":
                        item = read_decide(body)
                        if stage != "parse":
                            res = await decide(item)
                            if stage == "answer":
                                result_answer(res, res.status_code)
                    await sleep(0)

            async def run(stage: str) -> float:
                per = requests // CALLERS
                await asyncio.sleep(0.01)
                c0 = time.process_time()
                await asyncio.gather(*(caller(stage, per, k) for k in range(CALLERS)))
                await engine.decider.shadow.drain()  # what is still queued is this run's work
                return (time.process_time() - c0) / (per * CALLERS) * 1e6

            out: dict[str, Any] = {}
            for mode in MODES:
                await engine.rollout.set_mode("api", Mode(mode), reason="benchmark", actor="bench", force=True)
                await asyncio.sleep(0.2)
                for stage in STAGES:
                    await run(stage)  # warm-up
                cpu: dict[str, list[float]] = {s: [] for s in STAGES}
                for _ in range(reps):
                    for stage in STAGES:
                        cpu[stage].append(await run(stage))
                m = {s: min(v) for s, v in cpu.items()}  # the least disturbed run of each
                stages = {
                    "parse": m["parse"] - m["loop"],
                    "decide": m["decide"] - m["parse"],
                    "answer": m["answer"] - m["decide"],
                    "glue": m["app"] - m["answer"],
                }
                out[mode] = {"stages_us": stages, "total_us": m["app"] - m["loop"], "loop_us": m["loop"]}

            out["batch"] = await _batch(engine, redis.url)
    return out


async def _batch(engine: Any, redis_url: str) -> dict[str, Any]:
    """Per decision in ``POST /v1/decide/batch`` (batches of 1,000), by stage."""
    import orjson
    import redis as redispy

    from control_plane.api.decide import answer_batch, read_batch
    from control_plane.model.rollout import Mode

    decider = engine.decider
    body = orjson.dumps({"requests": [{"route": "api", "key": f"b{i}"} for i in range(1000)]})
    client = redispy.Redis.from_url(redis_url)

    def redis_cpu() -> float:
        info = client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    out: dict[str, Any] = {}
    batches = 40
    for mode in ("off", "shadow", "enforce"):
        await engine.rollout.set_mode("api", Mode(mode), reason="benchmark", actor="bench", force=True)
        await asyncio.sleep(0.2)
        await answer_batch(decider, read_batch(body))
        await decider.shadow.drain()
        t_parse = t_decide = 0.0
        r0 = redis_cpu()
        for _ in range(batches):
            a = time.process_time()
            items = read_batch(body)
            b = time.process_time()
            await answer_batch(decider, items)
            c = time.process_time()
            t_parse += b - a
            t_decide += c - b
        n = batches * 1000
        c0 = time.process_time()
        evaluated = await decider.shadow.drain()  # shadow: everything these batches queued (up to the queue's size)
        t_eval = time.process_time() - c0
        row = {"parse_us": t_parse / n * 1e6, "decide_and_dump_us": t_decide / n * 1e6}
        if mode == "shadow" and evaluated:
            row["shadow_evaluation_us"] = t_eval / evaluated * 1e6
        row["redis_cpu_us"] = (redis_cpu() - r0) / n * 1e6
        out[mode] = row
    client.close()
    return out


def measure(requests: int = 24_000, reps: int = 5) -> dict[str, Any]:
    """The breakdown, measured in a fresh process (the control plane tunes its GC and
    starts background tasks: not in the caller's process)."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "bench.hotpath_profile", str(requests), str(reps)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
        env=dict(os.environ, SHADOWLIMIT_LOG_LEVEL="warning"),
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main(argv: list[str]) -> int:
    import uvloop

    requests = int(argv[0]) if argv else 24_000
    reps = int(argv[1]) if len(argv) > 1 else 5
    result = uvloop.run(_measure(requests, reps))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
