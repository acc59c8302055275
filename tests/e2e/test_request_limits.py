"""Request size limits end to end: a real control plane over real HTTP (raw sockets where a
client must misbehave), a real Redis. Oversized bodies get 413 before or while they are
read, oversized header sets 431, both as JSON; a decide sent meanwhile is answered."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from cp_server import ADMIN_TOKEN, ControlPlaneServer, free_port, wait_until, write_rules
from ext_service import AppServer
from pydantic import TypeAdapter

from control_plane.api.schemas import BatchRequest, DecideRequest
from control_plane.server.limits import MAX_TARGET_BYTES, RequestLimits, RequestLimitsMiddleware
from control_plane.settings import Settings, SettingsError, load_settings

WAIT_S = 10.0  # the longest any answer is waited for
DECIDE = {"route": "search", "key": "alice"}
SHADOWLIMIT = Path(sys.executable).with_name("shadowlimit")


@pytest.fixture
def make_cp(redis_url, tmp_path):
    servers: list[ControlPlaneServer] = []

    def make(**overrides: Any) -> ControlPlaneServer:
        overrides.setdefault("redis_url", redis_url)
        overrides.setdefault("rules_path", write_rules(tmp_path))
        cp = ControlPlaneServer(**overrides)
        servers.append(cp)
        return cp.start()

    yield make
    for s in reversed(servers):
        s.stop()


# --------------------------------------------------------------------------- raw HTTP


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)


def _answered(sock: socket.socket, timeout: float = 0.0) -> bool:
    """Whether the server has written something (or closed) on this connection."""
    return bool(select.select([sock], [], [], timeout)[0])


class _Reader:
    """HTTP/1.1 responses with a Content-Length, one after another, from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)  # bounded by the socket's timeout
        self.buf += chunk
        return bool(chunk)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        """(status, lower-cased headers, body)"""
        while b"\r\n\r\n" not in self.buf:
            assert self._fill(), f"connection closed before a complete response head: {self.buf!r}"
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length and self._fill():
            pass
        body, self.buf = self.buf[:length], self.buf[length:]
        return int(lines[0].split()[1]), headers, body


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    return _Reader(sock).response()


def _closed_by_server(sock: socket.socket) -> bool:
    """After a refusal the server closes: reads end (EOF or reset) within the wait."""
    try:
        for _ in range(1000):  # bounded: each read takes data or ends
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def _head(method: str, path: str, *lines: str) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"{line}\r\n" for line in lines) + "\r\n"
    ).encode()


def _refusal(
    status: int, headers: dict[str, str], body: bytes, expected_status: int, error: str, limit: int
) -> dict[str, Any]:
    assert status == expected_status, body
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    data = json.loads(body)
    assert data["error"] == error and data["limit"] == limit and data["message"], data
    return data


def _decide_ok(cp: ControlPlaneServer) -> None:
    r = httpx.post(cp.url + "/v1/decide", json=DECIDE, timeout=WAIT_S)
    assert r.status_code == 200, r.text


# --------------------------------------------------------------------------- bodies


@pytest.mark.parametrize(
    "method, path, extra",
    [
        ("POST", "/v1/decide/batch", ()),
        ("POST", "/v1/decide", ()),
        ("PUT", "/v1/routes/search/mode", ()),  # admin, no token: refused before auth reads anything
        ("PUT", "/v1/routes/search/mode", (f"Authorization: Bearer {ADMIN_TOKEN}",)),
    ],
)
def test_declared_oversized_body_is_refused_before_it_is_read(make_cp, method, path, extra):
    cp = make_cp(max_body_bytes=65536)
    with _connect(cp.port) as big:
        # 100 MB announced, 4 KiB sent, the rest never comes: only a server that answers
        # from the Content-Length alone can reply
        big.sendall(
            _head(method, path, "Content-Type: application/json", "Content-Length: 100000000", *extra) + b"[" * 4096
        )
        _decide_ok(cp)  # a decide while the oversized request is open
        status, headers, body = _read_response(big)
        _refusal(status, headers, body, 413, "payload_too_large", 65536)
        assert _closed_by_server(big)
    _decide_ok(cp)


def test_body_of_exactly_the_limit_is_read_and_one_byte_more_is_refused(make_cp):
    cp = make_cp(max_body_bytes=65536)
    batch = json.dumps({"requests": [DECIDE] * 10}).encode()
    with cp.client() as c:
        body = batch + b" " * (65536 - len(batch))  # JSON allows trailing whitespace
        r = c.post("/v1/decide/batch", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        assert len(r.json()["decisions"]) == 10
        r = c.post("/v1/decide/batch", content=body + b" ", headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert r.json() == {"error": "payload_too_large", "message": r.json()["message"], "limit": 65536}
        # the same bodies sent chunked (no Content-Length): counted while they stream
        chunks = [body[i : i + 8192] for i in range(0, len(body), 8192)]
        for sent, expected in ((chunks, 200), (chunks + [b" "], 413)):
            r = c.post("/v1/decide/batch", content=iter(sent), headers={"Content-Type": "application/json"})
            assert r.status_code == expected, r.text


def test_chunked_body_is_cut_off_while_streaming_and_a_decide_is_answered_meanwhile(make_cp):
    limit = 256 * 1024
    cp = make_cp(max_body_bytes=limit)
    chunk = b"[" * 16384
    with _connect(cp.port) as big:
        big.sendall(_head("POST", "/v1/decide/batch", "Content-Type: application/json", "Transfer-Encoding: chunked"))
        sent = 0
        while sent <= limit // 2:
            big.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
        _decide_ok(cp)  # answered while the big request is half way
        assert not _answered(big), "the streaming request was answered before it reached the limit"
        while sent <= limit:
            big.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
        # past the limit, the body not finished (no terminating chunk): the answer comes now
        assert _answered(big, WAIT_S), f"no answer after {sent} streamed bytes (limit {limit})"
        status, headers, body = _read_response(big)
        _refusal(status, headers, body, 413, "payload_too_large", limit)
        assert _closed_by_server(big)
    _decide_ok(cp)


def test_the_app_never_receives_more_than_the_limit():
    """The middleware alone, in front of an app that records what it is handed."""
    seen: dict[str, Any] = {"bytes": 0, "messages": []}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            seen["messages"].append(message["type"])
            seen["bytes"] += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        # the app answers as if it had the whole body: swallowed after a refusal
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    limit = 100_000
    with AppServer(RequestLimitsMiddleware(app, RequestLimits(limit, 100, 16384))) as server:
        r = httpx.post(server.url + "/", content=iter([b"x" * 10_000] * 30), timeout=WAIT_S)
    assert r.status_code == 413 and r.json()["limit"] == limit
    assert seen["bytes"] <= limit
    assert seen["messages"][-1] == "http.disconnect"


def test_content_length_shorter_than_the_body_never_delivers_the_rest(make_cp):
    """The server frames a body by its Content-Length: bytes beyond it are parsed as the
    next request and refused by the parser (this held before the limits too)."""
    cp = make_cp(max_body_bytes=65536)
    with _connect(cp.port) as liar:
        try:
            liar.sendall(
                _head("POST", "/v1/decide", "Content-Type: application/json", "Content-Length: 10") + b"{" * 1_000_000
            )
        except (ConnectionResetError, BrokenPipeError):
            pass  # refused and closed while the rest was still being sent
        status, _, _ = _read_response(liar)
        assert status in (400, 422, 431)
        assert _closed_by_server(liar)
    _decide_ok(cp)


# --------------------------------------------------------------------------- headers


def _header_lines(count: int, value_size: int = 1) -> list[str]:
    return [f"X-H{i:03d}: {'v' * value_size}" for i in range(count)]


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_header_count_and_size_are_bounded(make_cp, http):
    cp = make_cp(http=http)
    body = json.dumps(DECIDE).encode()
    fixed = ["Content-Type: application/json", f"Content-Length: {len(body)}"]  # with Host: 3 fields
    for count, expected in ((97, 200), (98, 431)):  # 100 header fields pass, 101 do not
        with _connect(cp.port) as s:
            s.sendall(_head("POST", "/v1/decide", *fixed, *_header_lines(count)) + body)
            status, headers, data = _read_response(s)
            assert status == expected, data
            if expected == 431:
                assert (
                    "101 header fields"
                    in _refusal(status, headers, data, 431, "request_header_fields_too_large", 100)["message"]
                )
    # names and values add up to 16 KiB at most
    base = sum(
        len(n) + len(v)
        for n, v in (("host", "127.0.0.1"), ("content-type", "application/json"), ("content-length", str(len(body))))
    )
    for total, expected in ((16384, 200), (16385, 431)):
        with _connect(cp.port) as s:
            s.sendall(_head("POST", "/v1/decide", *fixed, "X-Big: " + "b" * (total - base - len("x-big"))) + body)
            status, headers, data = _read_response(s)
            assert status == expected, data
            if expected == 431:
                _refusal(status, headers, data, 431, "request_header_fields_too_large", 16384)


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_huge_head_is_refused_while_it_arrives(make_cp, http):
    cp = make_cp(http=http)
    piece = b"a" * 8192
    with _connect(cp.port) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + piece)
        _decide_ok(cp)  # a decide while a head is arriving
        sent = len(piece)
        try:
            while sent < 1024 * 1024 and not _answered(s):  # the head never ends
                s.sendall(piece)
                sent += len(piece)
        except (ConnectionResetError, BrokenPipeError):
            pass  # refused and closed while the head was still being sent
        assert _answered(s, WAIT_S), f"no answer after {sent} bytes of an unfinished head"
        status, headers, body = _read_response(s)
        _refusal(status, headers, body, 431, "request_header_fields_too_large", 16384)
        assert _closed_by_server(s)
    _decide_ok(cp)


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_many_heads_on_one_connection_are_each_counted_alone(make_cp, http):
    """The head bound is per request: a keep-alive connection (or a pipelined burst)
    carrying many times the bound in heads is served."""
    cp = make_cp(http=http)
    padding = {f"X-Pad-{i}": "p" * 40 for i in range(10)}  # about 600 bytes of head per request
    with httpx.Client(base_url=cp.url, timeout=WAIT_S) as c:
        for i in range(100):  # 60 KB of heads, over twice the bound
            r = c.post("/v1/decide", json={"route": "search", "key": f"k{i}"}, headers=padding)
            assert r.status_code == 200, r.text
    body = json.dumps(DECIDE).encode()
    one = (
        _head(
            "POST",
            "/v1/decide",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in padding.items()),
        )
        + body
    )
    with _connect(cp.port) as s:
        s.sendall(one * 60)  # pipelined, in one write
        reader = _Reader(s)
        statuses = [reader.response()[0] for _ in range(60)]
    assert set(statuses) <= {200, 429}, statuses


# --------------------------------------------------------------------------- request lines


def _json_refusal(sock: socket.socket, status: int, error: str) -> dict[str, Any]:
    got, headers, body = _read_response(sock)
    assert got == status, body
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    data = json.loads(body)
    assert data["error"] == error and data["message"], data
    assert _closed_by_server(sock)
    return data


@pytest.mark.parametrize("http", ["httptools", "h11"])
@pytest.mark.parametrize("pieces", [1, 8])
def test_a_request_line_too_long_is_a_json_414_however_it_arrives(make_cp, http, pieces):
    """A target over 16 KiB (64 KiB here: httptools' own URL parser gives up there with a
    plain-text 400) is refused in the API's error shape, in one read or in pieces."""
    cp = make_cp(http=http)
    line = b"GET /ratelimit/reset/" + b"a" * 65536 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with _connect(cp.port) as s:
        try:
            for i in range(pieces):
                s.sendall(line[i * len(line) // pieces : (i + 1) * len(line) // pieces])
        except (ConnectionResetError, BrokenPipeError):
            pass  # refused and closed while the rest was still being sent
        data = _json_refusal(s, 414, "uri_too_long")
        assert data["limit"] == MAX_TARGET_BYTES == 16384
    _decide_ok(cp)


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_the_longest_target_reaches_the_app(make_cp, http):
    cp = make_cp(http=http)
    for size, status in ((MAX_TARGET_BYTES, 404), (MAX_TARGET_BYTES + 1, 414)):
        with _connect(cp.port) as s:
            s.sendall(_head("GET", "/" + "a" * (size - 1)))
            got, _, body = _read_response(s)
            assert got == status and json.loads(body)["error"] == ("not_found" if status == 404 else "uri_too_long")


@pytest.mark.parametrize("http", ["httptools", "h11"])
@pytest.mark.parametrize("request_line", [b"G(T / HTTP/1.1", b"\x00\x01 nothing"])
def test_a_request_that_is_not_http_gets_the_json_error_body(make_cp, http, request_line):
    cp = make_cp(http=http)
    with _connect(cp.port) as s:
        s.sendall(request_line + b"\r\nHost: 127.0.0.1\r\n\r\n")
        data = _json_refusal(s, 400, "bad_request")
        assert data["message"].startswith("the request is not valid HTTP/1.1") and len(data["message"]) < 300
    _decide_ok(cp)


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_a_body_with_bad_chunked_framing_gets_the_json_error_body(make_cp, http):
    cp = make_cp(http=http)
    chunk = b'{"route":"search","key":"ch"}'  # 29 bytes, announced as 28
    with _connect(cp.port) as s:
        s.sendall(
            _head("POST", "/v1/decide", "Content-Type: application/json", "Transfer-Encoding: chunked")
            + b"1c\r\n"
            + chunk
            + b"\r\n0\r\n\r\n"
        )
        _json_refusal(s, 400, "bad_request")
    _decide_ok(cp)


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_a_bad_request_pipelined_after_a_good_one_is_answered_after_it(make_cp, http):
    cp = make_cp(http=http)
    body = json.dumps(DECIDE).encode()
    good = _head("POST", "/v1/decide", "Content-Type: application/json", f"Content-Length: {len(body)}") + body
    with _connect(cp.port) as s:
        s.sendall(good + b"G(T / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # in one write
        reader = _Reader(s)
        status, _, answer = reader.response()
        assert status == 200 and json.loads(answer)["allowed"] is True
        status, headers, refusal = reader.response()
        assert status == 400 and headers["content-type"] == "application/json"
        assert json.loads(refusal)["error"] == "bad_request"
        assert _closed_by_server(s)


# --------------------------------------------------------------------------- settings and `serve`


def _max_item() -> dict[str, Any]:
    """A decide item with every field at the schema's largest size (ASCII)."""
    item: dict[str, Any] = {}
    for name, prop in TypeAdapter(DecideRequest).json_schema()["properties"].items():
        flat = dict(prop)
        for alt in prop.get("anyOf", []):
            flat.update(alt)
        max_len, le = flat.get("maxLength"), flat.get("maximum")
        if name == "headers":
            item[name] = {}  # the schema bounds how many, not how long (docs/configuration.md)
        elif le is not None:
            item[name] = le
        else:
            assert max_len is not None, f"{name} has no maximum length: the body limit's default must be recomputed"
            item[name] = "/" + "p" * (max_len - 1) if name == "path" else ("M" if name == "method" else "x") * max_len
    return TypeAdapter(DecideRequest).validate_python(item)


def test_default_body_limit_fits_a_full_batch_at_the_largest_field_sizes():
    max_items = TypeAdapter(BatchRequest).json_schema()["properties"]["requests"]["maxItems"]
    assert max_items == 10_000
    item = json.dumps(_max_item())  # Python's default separators, the roomier ones
    full = len('{"requests": [') + max_items * len(item) + (max_items - 1) * len(", ") + len("]}")
    assert full == 27_190_014  # the figure docs/configuration.md explains
    assert full <= Settings.model_fields["max_body_bytes"].default == 32 * 1024 * 1024


def test_limit_settings_are_validated_and_named():
    limits = load_settings(max_body_bytes=65536, max_headers=50, max_header_bytes=8192).request_limits
    assert limits == RequestLimits(65536, 50, 8192)
    for field, env, bad in (
        ("max_body_bytes", "SHADOWLIMIT_MAX_BODY_BYTES", 10),
        ("max_headers", "SHADOWLIMIT_MAX_HEADERS", 0),
        ("max_header_bytes", "SHADOWLIMIT_MAX_HEADER_BYTES", "lots"),
    ):
        with pytest.raises(SettingsError, match=env):
            load_settings(**{field: bad})


def test_serve_refuses_oversized_heads_and_bodies(redis_url, tmp_path):
    """`shadowlimit serve` itself (its uvicorn protocol and the app's middleware)."""
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SHADOWLIMIT_", "RATE_LIMIT_", "ENABLE_DISTRIBUTED"))
    }
    env.update(
        RATE_LIMIT_REDIS_URL=redis_url,
        SHADOWLIMIT_PORT=str(port),
        SHADOWLIMIT_MAX_BODY_BYTES="65536",
        SHADOWLIMIT_NAMESPACE=f"serve-{port}",
    )
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen(
            [str(SHADOWLIMIT), "serve", "--log-level", "warning"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200,
            timeout=30,
            what="shadowlimit serve to listen",
        )
        with _connect(port) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 65536)
            _refusal(*_read_response(s), 431, "request_header_fields_too_large", 16384)
        with _connect(port) as s:
            s.sendall(_head("POST", "/v1/decide/batch", "Content-Type: application/json", "Content-Length: 100000000"))
            _refusal(*_read_response(s), 413, "payload_too_large", 65536)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
