"""Slow clients: a request head must arrive within ``SHADOWLIMIT_HEADER_TIMEOUT_S``.

A real control plane under uvicorn (both HTTP implementations), raw loopback sockets for the
misbehaving clients: a head trickling in one byte at a time is cut off at the bound with a JSON
408 and counted in ``rate_limit_slow_clients_total``, on a fresh connection and on a keep-alive
one, while other clients are served; idle keep-alive and a head that is merely slow are not cut.
``shadowlimit serve`` (one process and ``--workers 2``) applies the setting too.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from cp_server import ControlPlaneServer, clean_env, free_port, metric_value, wait_until, write_rules

from control_plane.observe.metrics import Metrics
from control_plane.server.limits import RequestLimits
from control_plane.settings import SettingsError, load_settings

pytestmark = pytest.mark.timeout(120)

BOUND_S = 1.0  # the head timeout these tests run with
SLACK_S = 1.5  # how late a close may come (a loaded test machine)
TRICKLE_S = 0.5  # one byte every this often
GIVE_UP_S = 8.0  # a trickle that is never cut off ends here (the test then fails)
SHADOWLIMIT = Path(sys.executable).with_name("shadowlimit")
PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "  # a head that is not finished
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
HTTP = pytest.mark.parametrize("http", ["h11", "httptools"])


@pytest.fixture
def make_cp(redis_url, tmp_path):
    servers: list[ControlPlaneServer] = []

    def make(**overrides: Any) -> ControlPlaneServer:
        overrides.setdefault("redis_url", redis_url)
        overrides.setdefault("rules_path", write_rules(tmp_path))
        overrides.setdefault("header_timeout_s", BOUND_S)
        cp = ControlPlaneServer(**overrides)
        servers.append(cp)
        return cp.start()

    yield make
    for s in reversed(servers):
        s.stop()


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _slow_count(url: str) -> float:
    return metric_value(httpx.get(url + "/metrics", timeout=10).text, "rate_limit_slow_clients_total")


def _read_chunk(sock: socket.socket) -> bytes | None:
    """What the server sent, b"" at its close, None if nothing is there yet."""
    if not select.select([sock], [], [], 0)[0]:
        return None
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""


def _trickle(sock: socket.socket, start: bytes) -> tuple[float, bytes, bool]:
    """Send ``start``, then one byte every :data:`TRICKLE_S` until the server closes (or
    :data:`GIVE_UP_S`): (seconds from ``start`` to the close, what the server sent, closed)."""
    t0 = time.monotonic()
    sock.sendall(start)
    got = b""
    while time.monotonic() - t0 < GIVE_UP_S:
        if select.select([sock], [], [], TRICKLE_S)[0]:
            chunk = _read_chunk(sock)
            if not chunk:
                return time.monotonic() - t0, got, True
            got += chunk
            continue
        try:
            sock.sendall(b"a")
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - t0, got, True
    return time.monotonic() - t0, got, False


def _response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _assert_408(data: bytes) -> None:
    status, headers, body = _response(data)
    assert status == 408, data
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    answer = json.loads(body)
    assert answer["error"] == "request_timeout" and answer["limit"] == BOUND_S, answer
    assert f"within {BOUND_S:g} s" in answer["message"]


def _assert_cut_at_the_bound(elapsed: float, closed: bool) -> None:
    assert closed, f"a trickling head was still open after {elapsed:.1f} s (bound {BOUND_S} s)"
    assert BOUND_S - 0.05 <= elapsed <= BOUND_S + SLACK_S, elapsed


def _healthz_on(sock: socket.socket) -> None:
    sock.sendall(HEALTHZ)
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith(b"}"):  # /healthz answers a JSON object
        chunk = sock.recv(65536)
        assert chunk, f"closed before the answer: {data!r}"
        data += chunk
    assert _response(data)[0] == 200, data


# --------------------------------------------------------------------------- one connection


@HTTP
def test_a_trickling_head_is_cut_off_at_the_bound_and_counted(make_cp, http):
    cp = make_cp(http=http)
    before = _slow_count(cp.url)
    with _connect(cp.port) as slow, _connect(cp.port) as other:
        t0 = time.monotonic()
        slow.sendall(PARTIAL)
        _healthz_on(other)  # another client is served while the slow head arrives
        waited = time.monotonic() - t0
        elapsed, got, closed = _trickle(slow, b"a")
        _assert_cut_at_the_bound(waited + elapsed, closed)
        _assert_408(got)
        _healthz_on(other)  # and after it (the same keep-alive connection, idle meanwhile)
    assert _slow_count(cp.url) == before + 1
    r = httpx.post(cp.url + "/v1/decide", json={"route": "search", "key": "alice"}, timeout=10)
    assert r.status_code == 200, r.text


@HTTP
def test_a_connection_that_says_nothing_is_closed_without_an_answer(make_cp, http):
    cp = make_cp(http=http)
    before = _slow_count(cp.url)
    with _connect(cp.port) as silent:
        t0 = time.monotonic()
        assert select.select([silent], [], [], BOUND_S + SLACK_S)[0], "a silent connection was kept"
        assert _read_chunk(silent) == b""  # closed, no 408 to a client that asked nothing
        assert time.monotonic() - t0 >= BOUND_S - 0.05
    assert _slow_count(cp.url) == before + 1


@HTTP
def test_keep_alive_idles_under_its_own_timeout_and_a_later_trickling_head_is_cut_off(make_cp, http):
    cp = make_cp(http=http)
    before = _slow_count(cp.url)
    with _connect(cp.port) as s:
        _healthz_on(s)
        time.sleep(BOUND_S + 0.5)  # idle longer than the head bound, within uvicorn's keep-alive (5 s)
        _healthz_on(s)
        time.sleep(0.3)
        elapsed, got, closed = _trickle(s, PARTIAL)  # the second head's clock starts at its first byte
        _assert_cut_at_the_bound(elapsed, closed)
        _assert_408(got)
    assert _slow_count(cp.url) == before + 1


@HTTP
def test_a_partial_head_pipelined_behind_a_request_is_cut_off(make_cp, http):
    cp = make_cp(http=http)
    before = _slow_count(cp.url)
    with _connect(cp.port) as s:
        elapsed, got, closed = _trickle(s, HEALTHZ + PARTIAL)  # the first is answered, the second never ends
        _assert_cut_at_the_bound(elapsed, closed)
        first, _, rest = got.partition(b"}")  # /healthz's JSON object, then the 408
        assert _response(first + b"}")[0] == 200, got
        _assert_408(rest)
    assert _slow_count(cp.url) == before + 1


@HTTP
def test_a_slow_head_within_the_bound_is_served(make_cp, http):
    cp = make_cp(http=http)
    before = _slow_count(cp.url)
    with _connect(cp.port) as s:
        for piece in (HEALTHZ[:10], HEALTHZ[10:30], HEALTHZ[30:]):  # 3 pieces over 0.3 s
            s.sendall(piece)
            time.sleep(0.15)
        data = b""
        while not data.endswith(b"}"):
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        assert _response(data)[0] == 200, data
        # many requests on the connection, each head well within the bound: none is cut
        for _ in range(5):
            time.sleep(BOUND_S / 4)
            _healthz_on(s)
    assert _slow_count(cp.url) == before


# --------------------------------------------------------------------------- many at once


@HTTP
def test_many_slow_connections_are_all_closed_by_the_bound(make_cp, http):
    n = 200
    cp = make_cp(http=http)
    before = _slow_count(cp.url)
    with ExitStack() as stack:
        # each connection's bound runs from when the server accepted it, never before its connect began
        began: dict[int, float] = {}
        socks = []
        for _ in range(n):
            start = time.monotonic()
            s = stack.enter_context(_connect(cp.port))
            began[s.fileno()] = start
            socks.append(s)
        t0 = time.monotonic()
        for s in socks:
            s.sendall(PARTIAL)
        open_ = {s.fileno(): s for s in socks}
        closed_at: dict[int, float] = {}
        served = False
        while open_ and time.monotonic() - t0 < GIVE_UP_S:
            readable = select.select(list(open_.values()), [], [], TRICKLE_S)[0]
            for s in readable:
                chunk = _read_chunk(s)
                if not chunk:
                    closed_at[s.fileno()] = time.monotonic() - began[s.fileno()]
                    del open_[s.fileno()]
                else:
                    assert chunk.startswith(b"HTTP/1.1 408 "), chunk
            if not readable:
                if not served:  # a normal request while they all trickle
                    r = httpx.get(cp.url + "/healthz", timeout=10)
                    assert r.status_code == 200
                    served = True
                for s in open_.values():
                    try:
                        s.sendall(b"a")
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # closed meanwhile: its EOF comes next
        assert not open_, f"{len(open_)} of {n} slow connections still open after {GIVE_UP_S} s"
        assert served
        assert max(closed_at.values()) <= BOUND_S + SLACK_S + 1.0, sorted(closed_at.values())[-5:]
        assert min(closed_at.values()) >= BOUND_S - 0.05
    assert _slow_count(cp.url) == before + n


# --------------------------------------------------------------------------- the setting and `serve`


def test_the_setting_is_validated_named_and_carried_to_the_protocol(monkeypatch):
    assert load_settings().header_timeout_s == 5.0
    assert load_settings().request_limits.header_timeout_s == 5.0
    assert load_settings(header_timeout_s=2.5).request_limits == RequestLimits(33554432, 100, 16384, 2.5)
    monkeypatch.setenv("SHADOWLIMIT_HEADER_TIMEOUT_S", "0.5")
    assert load_settings().request_limits.header_timeout_s == 0.5
    for bad in (0, -1, 301, "soon"):
        with pytest.raises(SettingsError, match="SHADOWLIMIT_HEADER_TIMEOUT_S"):
            load_settings(header_timeout_s=bad)


def test_the_counter_exists_at_0_from_the_start():
    assert metric_value(Metrics().render().decode(), "rate_limit_slow_clients_total") == 0
    assert "# TYPE rate_limit_slow_clients_total counter" in Metrics().render().decode()


def _serve(redis_url: str, port: int, *args: str) -> subprocess.Popen[bytes]:
    env = clean_env(
        RATE_LIMIT_REDIS_URL=redis_url,
        SHADOWLIMIT_PORT=str(port),
        SHADOWLIMIT_NAMESPACE=f"slow-{port}",
        SHADOWLIMIT_HEADER_TIMEOUT_S=str(BOUND_S),
    )
    return subprocess.Popen(
        [str(SHADOWLIMIT), "serve", "--log-level", "warning", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_cuts_off_trickling_heads(redis_url, workers):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(redis_url, port, "--workers", str(workers))
    try:
        wait_until(lambda: _healthy(url), 60, 0.1, "shadowlimit serve to listen")
        if workers > 1:  # both workers listening: new connections reach either
            time.sleep(2.0)
        before = _slow_count(url) if workers == 1 else 0.0
        for _ in range(4 if workers > 1 else 1):  # with 2 workers, most likely both get one
            with _connect(port) as slow:
                elapsed, got, closed = _trickle(slow, PARTIAL)
                _assert_cut_at_the_bound(elapsed, closed)
                _assert_408(got)
        if workers == 1:
            assert _slow_count(url) == before + 1
    finally:
        _stop(proc)
