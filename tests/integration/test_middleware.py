"""The ASGI middleware embeds the engine in a FastAPI app and follows rollout state in Redis."""

from __future__ import annotations

import textwrap
import time
import uuid

import httpx
from asgi_harness import lifespan, middleware_of, set_mode
from cp_server import metric_value
from fastapi import FastAPI

from control_plane.middleware import ShadowLimitMiddleware
from control_plane.model.rollout import Mode
from control_plane.settings import load_settings

RULES = textwrap.dedent(
    """
    version: 1
    routes:
      - name: items
        match: {methods: [GET], path: /items/**}
        key: {strategy: header, header: X-Client-Id}
        local: {average: 1, period: 60s, burst: 3}
        distributed: {average: 1, period: 60s, burst: 2}
    """
)


def make_app(redis_url, tmp_path, ns, **middleware):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    settings = load_settings(
        redis_url=redis_url, enable_distributed_rate_limiting=True, rules_path=str(rules), namespace=ns
    )
    app = FastAPI()

    @app.get("/items/{item}")
    async def item(item: str) -> dict[str, str]:
        return {"item": item}

    app.add_middleware(ShadowLimitMiddleware, settings=settings, **middleware)
    return app


async def test_middleware_enforces_local_in_shadow_and_distributed_in_enforce(redis_url, tmp_path):
    ns = "mw" + uuid.uuid4().hex[:8]
    app = make_app(redis_url, tmp_path, ns)
    stop = await lifespan(app)
    try:
        engine = middleware_of(app).engine
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            codes = [(await http.get("/items/1", headers={"X-Client-Id": "alice"})).status_code for _ in range(4)]
            # shadow: the local policy (burst 3) is enforced
            assert codes == [200, 200, 200, 429]
            r = await http.get("/items/1", headers={"X-Client-Id": "bob"})
            assert r.status_code == 200 and r.json() == {"item": "1"}
            assert r.headers["x-ratelimit-limit"] == "3"
            assert r.headers["ratelimit-policy"] == '"items";q=1;w=60;sl-burst=3'  # no sl-shadow unless announced
            denied = await http.get("/items/1", headers={"X-Client-Id": "alice"})
            assert denied.json()["error"] == "rate limit exceeded" and "retry-after" in denied.headers
            # missing key header: a clear 400 naming the header
            bad = await http.get("/items/1")
            assert bad.status_code == 400 and bad.json()["field"] == "header:X-Client-Id"

            # a control plane elsewhere flips the route to enforce in Redis; the app follows within 1 s
            t0 = time.monotonic()
            await set_mode(redis_url, ns, "items", Mode.ENFORCE, follower=engine)
            assert time.monotonic() - t0 < 1.0
            codes = [(await http.get("/items/2", headers={"X-Client-Id": "carol"})).status_code for _ in range(3)]
            # the distributed policy (burst 2) now rules
            assert codes == [200, 200, 429]
    finally:
        await stop()


async def test_metrics_path_serves_the_engines_metrics(redis_url, tmp_path):
    """metrics_path: the engine's own metrics on the app, never rate-limited; off by default."""
    ns = "mw" + uuid.uuid4().hex[:8]
    app = make_app(redis_url, tmp_path, ns, metrics_path="/shadowlimit/metrics")
    stop = await lifespan(app)
    try:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            fresh = await http.get("/shadowlimit/metrics")
            assert fresh.status_code == 200 and fresh.headers["content-type"].startswith("text/plain; version=")
            # the route's series exist at 0 before any request (the first one is an increase)
            labels = {"route": "items", "mode": "shadow", "enforced_by": "local", "allowed": "false"}
            zero = 'rate_limit_decisions_total{allowed="false",enforced_by="local",mode="shadow",route="items"} 0.0'
            assert zero in fresh.text
            codes = [(await http.get("/items/1", headers={"X-Client-Id": "dave"})).status_code for _ in range(4)]
            assert codes == [200, 200, 200, 429]
            # scraped as often as wanted: never limited, never counted as a decision
            for _ in range(5):
                r = await http.get("/shadowlimit/metrics")
                assert r.status_code == 200
            text = r.text
            assert metric_value(text, "rate_limit_decisions_total", **labels) == 1
            assert metric_value(text, "rate_limit_decisions_total", route="items", allowed="true") == 3
            assert metric_value(text, "rate_limit_decision_duration_seconds_count", mode="shadow") == 4
            assert metric_value(text, "rate_limit_mode_changes_total", route="items", automatic="true") == 0
            assert "rate_limit_shadow_divergence_total" in text and "shadowlimit_build_info" in text
            head = await http.head("/shadowlimit/metrics")
            assert head.status_code == 200 and head.content == b""
            post = await http.post("/shadowlimit/metrics")
            assert post.status_code == 405 and post.json()["error"] == "method_not_allowed"
    finally:
        await stop()

    # without metrics_path the app's own routes answer (here: none, 404)
    plain = make_app(redis_url, tmp_path, "mw" + uuid.uuid4().hex[:8])
    stop = await lifespan(plain)
    try:
        transport = httpx.ASGITransport(app=plain, client=("127.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            assert (await http.get("/shadowlimit/metrics")).status_code == 404
            assert (await http.get("/metrics")).status_code == 404
    finally:
        await stop()
