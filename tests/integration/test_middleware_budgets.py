"""The ASGI middleware on a route with a budget: each answer charged what it used, read from the
answer as it passes (an OpenAI-style stream's usage, a JSON body's, a header), or reserved at an
estimate read from the request and settled when the answer ends; a client that goes away
mid-stream charged what was produced. Real Redis, a FastAPI app, and uvicorn on loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import textwrap
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_harness import lifespan, middleware_of, serve, set_mode
from cp_server import metric_value
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from control_plane.decision import DecideInput
from control_plane.metering import Metering
from control_plane.middleware import RequestInfo, ShadowLimitMiddleware
from control_plane.model.rollout import Mode
from control_plane.settings import load_settings

RULES = textwrap.dedent(
    """
    version: 1
    routes:
      - name: chat
        match: {methods: [POST], path: /v1/chat/completions}
        key: {strategy: header, header: X-Tenant}
        local: {average: 1000, period: 24h, burst: 1000}
        distributed: {average: 1000, period: 24h, burst: 1000}
        budget: {admit: positive}
      - name: strict
        match: {methods: [POST], path: /v1/strict}
        key: {strategy: header, header: X-Tenant}
        local: {average: 1000, period: 24h, burst: 1000}
        budget: {admit: cover}
      - name: items
        match: {path: /items/**}
        key: {strategy: header, header: X-Tenant}
        local: {average: 1, period: 60s, burst: 2}
    """
)


class Upstream:
    """An LLM-like app: answers as the request's JSON asks (see :meth:`answer`) and counts the
    events it produced and the requests it was called for."""

    def __init__(self) -> None:
        self.calls = 0
        self.produced = 0
        self.gone = asyncio.Event()  # set when a stream stopped before its end

    async def answer(self, request: Request) -> Any:
        """``{"stream": n}``: n content events then one with the usage; ``{"usage": u}``: a JSON
        answer; ``{"header": c}``: the cost in ``x-usage-tokens``; ``{"fail_after": k}``: a
        stream that fails after k events; ``{"nothing": true}``: no cost anywhere; ``delay``
        between events."""
        self.calls += 1
        ask = json.loads(await request.body() or b"{}")
        if "header" in ask:
            return JSONResponse({"ok": True}, headers={"x-usage-tokens": str(ask["header"])})
        if "usage" in ask:
            return JSONResponse({"choices": [], "usage": ask["usage"]})
        if ask.get("nothing"):
            return JSONResponse({"choices": []})
        return StreamingResponse(self._events(ask), media_type="text/event-stream")

    async def _events(self, ask: dict[str, Any]) -> AsyncIterator[bytes]:
        n = int(ask.get("stream", ask.get("fail_after", 0)))
        delay = float(ask.get("delay", 0))
        try:
            for i in range(n):
                if delay:
                    await asyncio.sleep(delay)
                self.produced += 1
                yield b"data: " + json.dumps({"choices": [{"delta": {"content": f"t{i}"}}]}).encode() + b"\n\n"
            if "fail_after" in ask:
                raise RuntimeError("the model went away")
            usage = {"prompt_tokens": int(ask.get("prompt", 0)), "completion_tokens": n}
            yield b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n"
        except asyncio.CancelledError:
            self.gone.set()
            raise


def estimate_of(info: RequestInfo) -> int | None:
    """The test's estimate: the request's ``max_tokens`` and its prompt, when it says them."""
    ask = json.loads(info.body or b"{}")
    return None if "max_tokens" not in ask else int(ask["max_tokens"]) + int(ask.get("prompt", 0))


def make_app(redis_url: str, tmp_path: Any, ns: str, **middleware: Any) -> tuple[FastAPI, Upstream]:
    rules = tmp_path / f"rules-{uuid.uuid4().hex[:6]}.yaml"
    rules.write_text(RULES)
    settings = load_settings(
        redis_url=redis_url, enable_distributed_rate_limiting=True, rules_path=str(rules), namespace=ns
    )
    app = FastAPI()
    upstream = Upstream()
    app.add_api_route("/v1/chat/completions", upstream.answer, methods=["POST"])
    app.add_api_route("/v1/strict", upstream.answer, methods=["POST"])

    @app.get("/items/{item}")
    async def item(item: str) -> dict[str, str]:
        return {"item": item}

    app.add_middleware(ShadowLimitMiddleware, settings=settings, **middleware)
    return app, upstream


def _ns() -> str:
    return "mwb" + uuid.uuid4().hex[:8]


async def _left(app: FastAPI, tenant: str, route: str = "chat") -> int:
    """What is left of a tenant's budget, as the answer that counts sees it (a look: nothing spent)."""
    engine = middleware_of(app).engine
    assert engine is not None
    look = await engine.decider.decide(DecideInput(route=route, key=tenant, cost=0), headers=False)
    return look.enforced.remaining


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 5000)), base_url="http://app")


def _metered(app: FastAPI, route: str, result: str) -> float:
    engine = middleware_of(app).engine
    assert engine is not None
    return metric_value(
        engine.metrics.render().decode(), "rate_limit_metered_responses_total", route=route, result=result
    )


async def _chat(http: httpx.AsyncClient, tenant: str, ask: dict[str, Any], path: str = "/v1/chat/completions") -> Any:
    return await http.post(path, json=ask, headers={"X-Tenant": tenant})


async def test_each_answer_is_charged_what_it_used_and_the_spent_budget_refuses(redis_url, tmp_path):
    app, upstream = make_app(redis_url, tmp_path, _ns())
    stop = await lifespan(app)
    try:
        async with _client(app) as http:
            r = await _chat(http, "acme", {"stream": 280, "prompt": 20})
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = [line for line in r.text.split("\n") if line.startswith("data: ")]
            assert len(events) == 282 and events[-1] == "data: [DONE]"  # passed on whole
            assert "x-ratelimit-limit" in r.headers
            assert await _left(app, "acme") == 700  # 20 + 280 of the stream's usage
            r = await _chat(http, "acme", {"usage": {"total_tokens": 300}})
            assert r.status_code == 200 and r.json()["usage"] == {"total_tokens": 300}
            assert await _left(app, "acme") == 400
            r = await _chat(http, "acme", {"header": 350})
            assert r.status_code == 200 and await _left(app, "acme") == 50
            # 50 left: admitted (the route admits while anything is left) and charged in full, into debt
            r = await _chat(http, "acme", {"usage": {"input_tokens": 100, "output_tokens": 200}})
            assert r.status_code == 200 and await _left(app, "acme") == -250
            calls = upstream.calls
            refused = await _chat(http, "acme", {"usage": {"total_tokens": 1}})
            assert refused.status_code == 429 and refused.json()["error"] == "rate limit exceeded"
            assert "retry-after" in refused.headers and upstream.calls == calls  # the app never saw it
            assert await _left(app, "acme") == -250  # a refusal costs nothing
            # another tenant's budget is its own
            r = await _chat(http, "globex", {"stream": 3})
            assert r.status_code == 200 and await _left(app, "globex") == 997
        assert _metered(app, "chat", "metered") == 5
    finally:
        await stop()


async def test_an_estimate_is_reserved_and_settled_at_the_actual_cost(redis_url, tmp_path):
    app, upstream = make_app(redis_url, tmp_path, _ns(), estimate=estimate_of)
    stop = await lifespan(app)
    try:
        engine = middleware_of(app).engine
        assert engine is not None
        async with _client(app) as http:
            r = await _chat(http, "acme", {"max_tokens": 500, "prompt": 10, "stream": 40})
            assert r.status_code == 200
            assert await _left(app, "acme") == 950  # 510 reserved, 50 charged: 460 back
            held = await engine.decider.reservations("chat", "acme")
            book = held["local"]
            assert (book["outstanding"], book["settled"]) == (0, 1)
            assert [(r["estimate"], r["actual"]) for r in book["records"]] == [(510, 50)]
            # cover: a strict route admits only what its budget covers, before the app is called
            r = await _chat(http, "acme", {"max_tokens": 900, "usage": {"total_tokens": 900}}, "/v1/strict")
            assert r.status_code == 200 and await _left(app, "acme", "strict") == 100
            calls = upstream.calls
            r = await _chat(http, "acme", {"max_tokens": 101, "usage": {"total_tokens": 1}}, "/v1/strict")
            assert r.status_code == 429 and upstream.calls == calls
            r = await _chat(http, "acme", {"max_tokens": 100, "usage": {"total_tokens": 1}}, "/v1/strict")
            assert r.status_code == 200 and await _left(app, "acme", "strict") == 99
            # an estimate its limits can never cover is refused naming it
            r = await _chat(http, "acme", {"max_tokens": 5000}, "/v1/strict")
            assert r.status_code == 422 and r.json()["field"] == "estimate" and upstream.calls == calls + 1
            # no estimate: a look, then a charge
            r = await _chat(http, "acme", {"usage": {"total_tokens": 9}})
            assert r.status_code == 200 and await _left(app, "acme") == 941
            # an answer that names no cost keeps its reservation's estimate
            r = await _chat(http, "acme", {"max_tokens": 40, "nothing": True})
            assert r.status_code == 200 and await _left(app, "acme") == 901
        assert _metered(app, "chat", "unmetered") == 1 and _metered(app, "chat", "metered") == 2
        # how far off each estimate was: 50 of 510, then 40 of 40 (nothing learnt: the estimate kept)
        text = engine.metrics.render().decode()
        ratio = {
            le: metric_value(text, "rate_limit_settle_cost_ratio_bucket", route="chat", le=le)
            for le in ("0.25", "0.9", "1.0")
        }
        assert ratio == {"0.25": 1, "0.9": 1, "1.0": 2}
        assert metric_value(text, "rate_limit_settle_cost_ratio_count", route="strict") == 2  # 900 of 900, 1 of 100
    finally:
        await stop()


async def test_replicas_share_a_budget_in_redis(any_redis_url, tmp_path):
    ns = _ns()
    a, _ = make_app(any_redis_url, tmp_path, ns, estimate=estimate_of)
    b, _ = make_app(any_redis_url, tmp_path, ns, estimate=estimate_of)
    stop_a, stop_b = await lifespan(a), await lifespan(b)
    try:
        await set_mode(any_redis_url, ns, "chat", Mode.ENFORCE, follower=middleware_of(a).engine)
        await set_mode(any_redis_url, ns, "chat", Mode.ENFORCE, follower=middleware_of(b).engine)
        async with _client(a) as ha, _client(b) as hb:
            assert (await _chat(ha, "acme", {"max_tokens": 300, "stream": 250})).status_code == 200
            assert (await _chat(hb, "acme", {"usage": {"total_tokens": 600}})).status_code == 200
            assert await _left(a, "acme") == await _left(b, "acme") == 150
            assert (await _chat(hb, "acme", {"max_tokens": 10, "stream": 200})).status_code == 200  # into debt
            assert await _left(a, "acme") == -50
            refused = await _chat(ha, "acme", {"max_tokens": 10, "stream": 1})
            assert refused.status_code == 429 and await _left(b, "acme") == -50
    finally:
        await stop_a()
        await stop_b()


async def test_a_request_too_large_to_estimate_is_refused_and_the_app_gets_the_body_otherwise(redis_url, tmp_path):
    app, upstream = make_app(redis_url, tmp_path, _ns(), estimate=estimate_of, max_request_body=4096)
    stop = await lifespan(app)
    try:
        async with _client(app) as http:
            big = {"max_tokens": 10, "pad": "x" * 5000, "usage": {"total_tokens": 1}}
            r = await _chat(http, "acme", big)
            assert r.status_code == 413 and r.json()["error"] == "payload_too_large" and upstream.calls == 0
            assert await _left(app, "acme") == 1000
            fits = {"max_tokens": 10, "pad": "x" * 3000, "usage": {"total_tokens": 7}}
            r = await _chat(http, "acme", fits)  # read whole to estimate, then handed to the app as sent
            assert r.status_code == 200 and upstream.calls == 1 and await _left(app, "acme") == 993
            missing = await http.post("/v1/chat/completions", json={"max_tokens": 10})
            assert missing.status_code == 400 and missing.json()["field"] == "header:X-Tenant"
            # routes without a budget are decided as before: a request is one unit, nothing metered
            codes = [(await http.get("/items/1", headers={"X-Tenant": "acme"})).status_code for _ in range(3)]
            assert codes == [200, 200, 429]
    finally:
        await stop()


async def test_an_app_that_fails_mid_stream_is_charged_what_it_produced(redis_url, tmp_path, caplog):
    app, upstream = make_app(redis_url, tmp_path, _ns(), estimate=estimate_of)
    stop = await lifespan(app)
    try:
        async with _client(app) as http:
            with pytest.raises(RuntimeError, match="the model went away"):
                await _chat(http, "acme", {"max_tokens": 400, "fail_after": 30})
            assert upstream.produced == 30 and await _left(app, "acme") == 970
            with pytest.raises(RuntimeError):
                await _chat(http, "acme", {"fail_after": 12})  # no estimate: charged the same way
            assert await _left(app, "acme") == 958
        assert _metered(app, "chat", "early") == 2
    finally:
        await stop()


async def _read_until(reader: asyncio.StreamReader, count: int) -> bytes:
    """The response read until ``count`` data events have arrived (bounded by the test's timeout)."""
    seen = b""
    while seen.count(b"data: ") < count:
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        assert chunk, "the server closed the connection first"
        seen += chunk
    return seen


async def test_a_client_that_goes_away_mid_stream_is_charged_what_was_produced(redis_url, tmp_path):
    """Over a real socket through uvicorn: the client reads a few events and closes; the stream
    stops and the reservation is settled at what was produced, not the estimate."""
    app, upstream = make_app(redis_url, tmp_path, _ns(), estimate=estimate_of)
    async with serve(app) as port:
        body = json.dumps({"max_tokens": 900, "stream": 800, "delay": 0.005}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Tenant: acme\r\n"
            b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        await writer.drain()
        head = await _read_until(reader, 10)
        assert head.startswith(b"HTTP/1.1 200 ")
        writer.transport.abort()  # gone, mid-answer
        await asyncio.wait_for(upstream.gone.wait(), 10)
        produced = upstream.produced
        assert 10 <= produced < 800
        for _ in range(200):
            if await _left(app, "acme") != 100:  # reserved 900: settled once the stream stops
                break
            await asyncio.sleep(0.01)
        assert await _left(app, "acme") == 1000 - produced
        assert _metered(app, "chat", "early") == 1
        # an honest client meanwhile and after: answered whole and charged exactly
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            r = await _chat(http, "acme", {"max_tokens": 50, "stream": 20, "prompt": 5})
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
            assert await _left(app, "acme") == 1000 - produced - 25


@pytest.mark.parametrize("bad", [-5, 2.5, "7", True])
async def test_a_cost_callable_that_answers_nonsense_is_logged_and_charges_nothing(redis_url, tmp_path, caplog, bad):
    """Never a refund or an error after the answer has gone out: the answer stands, the cost
    is unmetered (the estimate kept, else nothing charged) and the callable's answer logged."""
    app, _ = make_app(redis_url, tmp_path, _ns(), metering=Metering(cost=lambda response: bad), estimate=estimate_of)
    stop = await lifespan(app)
    try:
        async with _client(app) as http:
            with caplog.at_level(logging.WARNING, logger="shadowlimit.middleware"):
                r = await _chat(http, "acme", {"usage": {"total_tokens": 5}})
                assert r.status_code == 200 and await _left(app, "acme") == 1000
                r = await _chat(http, "acme", {"max_tokens": 30, "usage": {"total_tokens": 5}})
                assert r.status_code == 200 and await _left(app, "acme") == 970
            assert caplog.text.count(f"the cost callable returned {bad!r}") == 2
        assert _metered(app, "chat", "unmetered") == 2
    finally:
        await stop()
