"""The decision endpoints answer byte for byte the same through the way in in front of
FastAPI (the hot path) and through FastAPI's routes, which call the same implementation.

Two real control planes on one Redis, identical but for ``SHADOWLIMIT_HOT_PATH`` (on / off),
with the same instance id and the same frozen decision clock, get the same requests in the
same order over raw HTTP: the requests of the decide, batch and forward-auth tests (valid,
refused by the engine, refused by validation, by the size limits, by the client token,
malformed). Every answer -- status line, headers in order (but ``date``), body -- must be
the same bytes.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cp_server import RULES_YAML, Clocks, ControlPlaneServer, admin_headers, write_rules

pytestmark = pytest.mark.timeout(120)

TOKEN = "hot-client-token-0123456789"
FROZEN_US = 1_795_000_000_123_456


def raw_request(
    port: int, method: str, target: str, body: bytes = b"", headers: list[tuple[str, str]] | None = None
) -> bytes:
    """One request on its own connection; the whole answer as bytes, ``date`` removed."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    hs = list(headers or [])
    if body and not any(k.lower() in ("content-length", "transfer-encoding") for k, _ in hs):
        hs.append(("Content-Length", str(len(body))))
    lines += [f"{k}: {v}" for k, v in hs]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        chunks = []
        while True:
            got = s.recv(65536)
            if not got:
                break
            chunks.append(got)
    head, _, rest = b"".join(chunks).partition(b"\r\n\r\n")
    kept = [h for h in head.split(b"\r\n") if not h.lower().startswith(b"date:")]
    return b"\r\n".join(kept) + b"\r\n\r\n" + rest


@pytest.fixture
def pair(redis_url, tmp_path) -> Iterator[tuple[ControlPlaneServer, ControlPlaneServer]]:
    rules = write_rules(tmp_path, RULES_YAML)
    # the same frozen decision clock for both: the same answers, to the reset times in the headers
    frozen = Clocks(clock=time.time, clock_us=lambda: FROZEN_US)
    common: dict[str, Any] = {"redis_url": redis_url, "rules_path": rules, "instance_id": "hot-diff", "clocks": frozen}
    hot = ControlPlaneServer(hot_path=True, client_token=TOKEN, **common).start()
    cold = ControlPlaneServer(hot_path=False, client_token=TOKEN, **common).start()
    try:
        for cp in (hot, cold):
            for route, mode in (("export", "enforce"), ("search", "shadow")):
                body = json.dumps({"mode": mode, "reason": "diff", "force": True}).encode()
                h = [("Content-Type", "application/json"), ("Authorization", admin_headers()["Authorization"])]
                assert b" 200 " in raw_request(cp.port, "PUT", f"/v1/routes/{route}/mode", body, h)[:20]
        yield hot, cold
    finally:
        hot.stop()
        cold.stop()


AUTH = [("Authorization", f"Bearer {TOKEN}")]
JSON = [("Content-Type", "application/json"), *AUTH]


def decide(body: Any) -> tuple[str, str, bytes, list[tuple[str, str]]]:
    raw = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
    return "POST", "/v1/decide", raw, JSON


def batch(items: Any) -> tuple[str, str, bytes, list[tuple[str, str]]]:
    return "POST", "/v1/decide/batch", json.dumps({"requests": items}).encode(), JSON


def authz(
    uri: str, method: str = "GET", query: str = "", **extra: str
) -> tuple[str, str, bytes, list[tuple[str, str]]]:
    h = [("X-Forwarded-Method", "GET"), ("X-Forwarded-Uri", uri), ("X-Client-Id", "az"), *AUTH]
    h += [(k.replace("_", "-"), v) for k, v in extra.items()]
    return method, "/v1/authz" + query, b"", h


CASES: list[tuple[str, str, bytes, list[tuple[str, str]]]] = [
    # plain decisions, up to and past the limit (search: 10 per second, frozen clock)
    *[decide({"route": "search", "key": "alice"}) for _ in range(11)],
    decide({"route": "search", "key": "bob", "request_id": "req-1", "cost": 3}),
    decide({"route": "search", "key": "bob", "cost": 11}),  # above the burst: 422 from the engine
    decide({"route": "nope", "key": "alice"}),  # 404
    decide({"route": "nöpe", "key": "alice"}),  # 404 with non-ASCII in the message
    decide({"route": "search", "key": "bad\nkey"}),  # 422 invalid_key
    decide({"route": "search", "key": "clé"}),  # 422 with non-ASCII in the message
    decide({"route": "login", "key": "203.0.113.9"}),  # deny list: 403
    decide({"route": "login", "key": "internal-job"}),  # allow list
    *[decide({"route": "export", "key": "e1"}) for _ in range(4)],  # enforce: distributed, then 429
    # bodies the hot path hands to FastAPI
    decide({"route": "search", "key": "a", "cost": "many"}),
    decide({"route": "search", "key": "a", "bogus": 1}),
    decide({"key": "a"}),
    decide({"route": "search"}),
    decide(b"{not json"),
    decide(b"[1, 2]"),
    decide(b""),
    decide({"method": "GET", "path": "/api/search/x", "headers": {"X-Client-Id": "carl"}}),
    decide({"route": "search", "key": "a", "cost": 1.0}),
    # the batch endpoint
    batch(
        [{"route": "search", "key": "b1"}, {"route": "nope", "key": "x"}, {"route": "search", "key": "b1", "cost": 99}]
    ),
    batch([{"route": "export", "key": "e2"}] * 4),
    batch([{"route": "search", "key": "b2", "request_id": "r-9"}, {"route": "search", "key": "bad key "}]),
    batch([{"route": "search", "key": "b3", "bogus": True}]),
    batch([]),
    batch([{"route": "search", "key": "k"}] * 10_001),
    # forward-auth
    *[authz("/api/search/q?x=1") for _ in range(11)],
    authz("/api/search/q", query="?deny_status=403"),
    authz("/api/search/q", query="?deny_status=999"),
    authz("/api/search/q", query="?other=1"),
    authz("no-slash"),
    authz("/api/search/q", method="HEAD"),
    authz("/api/search/q", method="POST"),
    ("GET", "/v1/authz", b"", AUTH),  # no description: 400
    # refused before any decision: client token, sizes, framing, paths
    ("POST", "/v1/decide", b'{"route":"search","key":"t"}', [("Content-Type", "application/json")]),
    ("POST", "/v1/decide", b'{"route":"search","key":"t"}', [("Authorization", "Bearer wrong")]),
    ("POST", "/v1/decide", b"x" * 10, [*JSON, ("Content-Length", str(64 * 1024 * 1024))]),
    (
        "POST",
        "/v1/decide",
        b'{"route":"search","key":"many-headers"}',
        [*JSON, *[(f"X-H{i}", "v") for i in range(120)]],
    ),
    (
        "POST",
        "/v1/decide",
        b"1c\r\n" + b'{"route":"search","key":"ch"}' + b"\r\n0\r\n\r\n",
        [*JSON, ("Transfer-Encoding", "chunked")],
    ),
    ("POST", "/v1/decide/", b'{"route":"search","key":"slash"}', JSON),
    ("GET", "/v1/decide", b"", AUTH),
]


def test_the_hot_path_answers_byte_for_byte_as_fastapi(pair) -> None:
    hot, cold = pair
    for i, (method, target, body, headers) in enumerate(CASES):
        a = raw_request(hot.port, method, target, body, headers)
        b = raw_request(cold.port, method, target, body, headers)
        assert a == b, f"case {i} {method} {target} {body[:80]!r}:\nhot:  {a[:600]!r}\ncold: {b[:600]!r}"
    # the hot one answered all but another method, a HEAD and a body without a length itself
    assert hot.app.state.hot.answered >= 55 and 3 <= hot.app.state.hot.handed_over <= 6
    assert cold.app.state.hot is None
