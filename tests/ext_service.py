"""Limits services for the external-limits tests, all on loopback.

- :class:`AppServer`: any ASGI app under uvicorn in a daemon thread (the example service,
  :func:`scripted_app`).
- :func:`scripted_app` / :class:`Script`: a limits service whose answer (status, body,
  headers, delay) the test sets per tenant, recording every request (JSON body and raw
  HTTP headers), the number of calls and the peak concurrency.
- :class:`RawServer`: a TCP server that misbehaves below HTTP (garbage bytes, a slow
  drip, silence, an abrupt close, a huge body), in a thread.
- :func:`load_example_service`: ``examples/limits_service.py`` imported from its file.

Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from cp_server import free_port

ROOT = Path(__file__).resolve().parent.parent


def load_example_service() -> Any:
    """``examples/limits_service.py`` as a module (``examples`` is not an installed package)."""
    path = ROOT / "examples" / "limits_service.py"
    spec = importlib.util.spec_from_file_location("shadowlimit_example_limits_service", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class AppServer:
    """An ASGI app served by uvicorn on a free loopback port, in a daemon thread."""

    def __init__(self, app: Any, *, port: int | None = None) -> None:
        self.app = app
        self.port = port or free_port()
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> AppServer:
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off", access_log=False
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"limits-service-{self.port}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"limits service on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(10)
            if self.thread.is_alive() and self.server is not None:
                self.server.force_exit = True
                self.thread.join(5)
        self.server = self.thread = None

    def __enter__(self) -> AppServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Answer:
    """What the scripted service answers: a JSON body (or raw bytes), status, headers, delay."""

    body: Any = field(default_factory=lambda: {"average": 10, "burst": 10, "period": "1s"})
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    raw: bytes | None = None


class Script:
    """The scripted service's state: answers per tenant (key) plus a default, and what it saw."""

    def __init__(self) -> None:
        self.default = Answer()
        self.answers: dict[str, Answer] = {}
        self.lock = threading.Lock()
        self.calls = 0
        self.calls_by_key: dict[str, int] = {}
        self.requests: list[dict[str, Any]] = []  # {"json", "raw", "http_headers"}
        self.active = 0
        self.peak = 0

    def answer_for(self, key: str) -> Answer:
        return self.answers.get(key, self.default)

    def reset_counts(self) -> None:
        with self.lock:
            self.calls = 0
            self.calls_by_key.clear()
            self.requests.clear()
            self.peak = self.active


def scripted_app(script: Script) -> Any:
    """A raw ASGI app (no framework in the way of odd answers) driven by ``script``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        raw = b"".join(chunks)
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        key = str(data.get("key")) if isinstance(data, dict) else ""
        http_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        with script.lock:
            script.calls += 1
            script.calls_by_key[key] = script.calls_by_key.get(key, 0) + 1
            script.requests.append({"json": data, "raw": raw, "http_headers": http_headers})
            script.active += 1
            script.peak = max(script.peak, script.active)
            answer = script.answer_for(key)
        try:
            if answer.delay_s:
                await asyncio.sleep(answer.delay_s)
            payload = answer.raw if answer.raw is not None else json.dumps(answer.body).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
            headers += [(k.lower().encode(), v.encode()) for k, v in answer.headers.items()]
            await send({"type": "http.response.start", "status": answer.status, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
        finally:
            with script.lock:
                script.active -= 1

    return app


class RawServer:
    """A TCP server answering every connection the same bad way, in a thread.

    ``mode``: ``garbage`` (non-HTTP bytes), ``drip`` (a valid head, then one body byte
    every 0.2 s), ``hang`` (read, never answer), ``close`` (close at once), ``huge`` (a
    valid 200 with a 1 MiB body), ``bad_length`` (Content-Length larger than the body,
    then close).
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.stop_event = threading.Event()
        server_self = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                sock.settimeout(0.5)
                try:
                    sock.recv(65536)
                except OSError:
                    pass
                server_self._answer(sock)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/limits"

    def _answer(self, sock: socket.socket) -> None:
        try:
            if self.mode == "garbage":
                sock.sendall(b"\x00\xffthis is not HTTP at all\r\n\r\n\x16\x03")
            elif self.mode == "drip":
                sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 200\r\n\r\n")
                for _ in range(100):
                    if self.stop_event.wait(0.2):
                        return
                    sock.sendall(b" ")
            elif self.mode == "hang":
                self.stop_event.wait(10)
            elif self.mode == "close":
                pass
            elif self.mode == "huge":
                body = b'{"average": 1, "burst": 1, "period": "1s", "pad": "' + b"x" * (1024 * 1024) + b'"}'
                sock.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
            elif self.mode == "bad_length":
                sock.sendall(
                    b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{"average": 1'
                )
            else:  # pragma: no cover
                raise ValueError(self.mode)
        except OSError:
            pass
        finally:
            try:
                sock.close()
            except OSError:
                pass

    def start(self) -> RawServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def __enter__(self) -> RawServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def closed_port_url() -> str:
    """A loopback URL nobody listens on (connection refused)."""
    return f"http://127.0.0.1:{free_port()}/limits"
