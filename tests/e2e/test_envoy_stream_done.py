"""Budgets whose cost is known only when the answer ends, through a real Envoy 1.40: each route's
filter makes a request-time check (``hits_addend: 0``, a look) and, with
``apply_on_stream_done: true``, a second call when the stream ends whose ``hits_addend`` is read
from the upstream's response, in front of a small streaming upstream that reports its usage in
its last Server-Sent Event (tests/streaming_upstream.py; a Lua filter puts it in dynamic metadata,
``%DYNAMIC_METADATA(shadowlimit.usage:tokens)%``) or, when it knows it before streaming, in a
response header (``%RESP(x-usage-tokens)%``, envoyproxy/ratelimit's way). Against ``shadowlimit
serve --grpc-port`` on real Redis, with envoyproxy/ratelimit's configuration format unchanged:

* a tenant's stream-done charges add up to the upstream's reported usage, exactly, whatever is
  left (the request that crosses the budget completes), and the request-time check refuses once
  the budget is spent;
* ``shadow_mode`` is honoured on both calls: every request goes through, every charge is counted;
* a response without its usage: Envoy makes no stream-done call (its log says ``Invalid
  hits_addend``), so nothing is charged for it (docs/gateways.md)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cp_server import metric_value, wait_until
from envoy_proxy import EnvoyProxy, rate_limit, request_headers, route, usage_entry, usage_filter
from rls_client import clear_of_minute_edge, serve
from streaming_upstream import StreamingUpstream

pytestmark = pytest.mark.timeout(180)

CONFIG = """\
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 100}
"""
STREAMED = "%DYNAMIC_METADATA(shadowlimit.usage:tokens)%"
HEADER = "%RESP(x-usage-tokens)%"


def budget_routes() -> list[dict]:
    """Each route's two descriptors in its ``RateLimitPerRoute`` (where ``hits_addend`` takes
    effect: docs/gateways.md): the look at request time, the charge at stream done."""

    def both(header: str, key: str, usage: str) -> list[dict]:
        action = request_headers(header, key)
        return [rate_limit(action, hits_addend=0), rate_limit(action, hits_addend=usage, apply_on_stream_done=True)]

    return [
        route("/v1/chat", per_filter=both("x-tenant", "tenant", STREAMED)),
        route("/v1/completions", per_filter=both("x-tenant", "tenant", HEADER)),
        route("/v1/trial", per_filter=both("x-tenant", "trial", STREAMED)),
        route(
            "/v1/metered",
            per_filter=[
                rate_limit(request_headers("x-tenant", "tenant"), hits_addend=0),
                rate_limit(
                    request_headers("x-tenant", "tenant"),
                    usage_entry(),
                    hits_addend=STREAMED,
                    apply_on_stream_done=True,
                ),  # fmt: skip
            ],
        ),
    ]


#: what the Lua filter charges an answer that did not say its usage
FALLBACK = 50


@pytest.fixture
def gateway(redis_url, tmp_path: Path) -> Iterator[tuple[object, EnvoyProxy, StreamingUpstream]]:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    cp = serve(redis_url, config)
    upstream = StreamingUpstream().start()
    envoy = EnvoyProxy(
        cp.settings.grpc_port, domain="llm", routes=budget_routes(), upstream=upstream,  # type: ignore[arg-type]
        extra_filters=[usage_filter(FALLBACK)], x_ratelimit_headers=None,
    )  # fmt: skip
    try:
        envoy.start()
        yield cp, envoy, upstream
    finally:
        envoy.stop()
        upstream.stop()
        cp.stop()


def hits(cp: object, route: str, stat: str = "total_hits") -> float:
    text = httpx.get(f"{cp.url}/metrics", timeout=10).text  # type: ignore[attr-defined]
    return metric_value(text, "rate_limit_envoy_hits_total", route=route, stat=stat)


def ask(envoy: EnvoyProxy, path: str, tenant: str, tokens: int, **headers: str) -> int:
    r = envoy.get(path, headers={"x-tenant": tenant, "x-tokens": str(tokens), **headers})
    if r.status_code == 200:
        assert f'"total_tokens": {tokens}' in r.text  # the whole stream came through
    return r.status_code


def test_stream_done_charges_add_up_to_the_reported_usage_and_the_check_refuses_once_spent(gateway) -> None:
    """The budget is a fixed window aligned on the minute: a busy machine that takes the scenario
    across a minute's end starts it again with another tenant (at most twice), as the window does."""
    cp, envoy, upstream = gateway
    for attempt in range(3):
        acme, globex = f"acme{attempt}", f"globex{attempt}"
        clear_of_minute_edge(20)
        minute, before = int(time.time() // 60), hits(cp, "llm/tenant")
        usages = (300, 250, 400, 100)  # 1,050 of a budget of 1,000 a minute
        for n in usages:  # each request-time look finds budget left; the fourth crosses the budget, and completes
            assert ask(envoy, "/v1/chat", acme, n) == 200
        want = before + sum(usages)
        wait_until(lambda want=want: hits(cp, "llm/tenant") == want, 10.0, 0.05, "every stream-done charge landed")
        spent = ask(envoy, "/v1/chat", acme, 5)  # spent: the request-time check refuses
        if int(time.time() // 60) != minute:
            continue  # the window ended meanwhile (its count started afresh): again, in the next minute
        assert spent == 429
        assert ask(envoy, "/v1/chat", globex, 5) == 200  # another tenant's budget is its own
        time.sleep(0.5)  # (a refused request is never streamed, so no stream-done call follows it)
        reported = sum(n for tenant, n in upstream.reported if tenant == acme)
        assert reported == sum(usages) and hits(cp, "llm/tenant") == before + reported + 5  # acme's and globex's
        assert hits(cp, "llm/tenant", "over_limit") >= 50  # the 50 past the budget are over (the peer's split)
        return
    raise AssertionError("three attempts each crossed a minute's end")


def test_a_usage_in_a_response_header_is_charged_as_envoyproxy_ratelimit_configures_it(gateway) -> None:
    cp, envoy, _ = gateway
    clear_of_minute_edge(10)
    assert ask(envoy, "/v1/completions", "initech", 77, **{"x-usage-header": "1"}) == 200
    wait_until(lambda: hits(cp, "llm/tenant") == 77, 10.0, 0.05, "the stream-done charge of the header's 77")


def test_shadow_mode_is_honoured_on_both_calls_and_every_charge_counts(gateway) -> None:
    cp, envoy, _ = gateway
    clear_of_minute_edge(20)
    codes = [ask(envoy, "/v1/trial", "umbrella", 80) for _ in range(4)]  # 320 of a shadowed 100
    assert codes == [200] * 4  # shadow: never refused, at request time or after
    wait_until(lambda: hits(cp, "llm/trial") == 320, 10.0, 0.05, "every shadowed charge counted")
    assert hits(cp, "llm/trial", "shadow_mode") > 0  # the hits past the limit, answered OK


def test_an_answer_without_its_usage_is_not_charged_envoy_makes_no_call(gateway) -> None:
    """The header route, answered without the header: Envoy finds no number for ``hits_addend``,
    logs it and skips the stream-done descriptor; the request-time look alone reaches shadowlimit."""
    cp, envoy, _ = gateway
    clear_of_minute_edge(10)
    calls = metric_value(httpx.get(f"{cp.url}/metrics", timeout=10).text, "rate_limit_envoy_requests_total", code="ok")
    assert ask(envoy, "/v1/completions", "hooli", 33) == 200  # no x-usage-header: no x-usage-tokens
    time.sleep(1.0)
    after = metric_value(httpx.get(f"{cp.url}/metrics", timeout=10).text, "rate_limit_envoy_requests_total", code="ok")
    assert after - calls == 1 and hits(cp, "llm/tenant") == 0  # the look only, 0 hits
    assert "Invalid hits_addend" in envoy.log_tail(50)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_an_answer_that_does_not_say_its_usage_is_counted_logged_once_and_charged_the_fallback(gateway) -> None:
    """The Lua filter of docs/gateways.md gives such an answer the fallback's tokens and says why in
    the descriptor's ``shadowlimit_usage`` entry: shadowlimit takes the entry off (the peer's config
    is looked up unchanged), charges the fallback, counts the reason and logs it once."""
    cp, envoy, _ = gateway
    records = _Records()
    logger = logging.getLogger("shadowlimit.envoy")
    logger.addHandler(records)
    try:
        clear_of_minute_edge(20)
        assert ask(envoy, "/v1/metered", "wayne", 30) == 200  # reported: its 30
        wait_until(lambda: hits(cp, "llm/tenant") == 30, 10.0, 0.05, "the reported usage charged")
        for usage in ("none", "none", "null"):
            r = envoy.get("/v1/metered", headers={"x-tenant": "wayne", "x-tokens": "30", "x-usage": usage})
            assert r.status_code == 200
        wait_until(lambda: hits(cp, "llm/tenant") == 30 + 3 * FALLBACK, 10.0, 0.05, "the fallback charged thrice")
        text = httpx.get(f"{cp.url}/metrics", timeout=10).text
        bad = {
            reason: metric_value(text, "rate_limit_envoy_bad_costs_total", route="llm/tenant", reason=reason)
            for reason in ("missing", "not_a_number")
        }
        assert bad == {"missing": 2, "not_a_number": 1}
        logged = [line for line in records.lines if "rate_limit_envoy_bad_costs_total" in line]
        assert len(logged) == 1 and "tenant" in logged[0] and f"charged its hits_addend {FALLBACK}" in logged[0]
    finally:
        logger.removeHandler(records)
