"""A small streaming upstream for Envoy's stream-done tests: each answer is Server-Sent Events over
HTTP/1.1 chunked encoding, a few delta events then a last one with an OpenAI-style ``usage``
object (``{"usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}``), as an LLM API
streams. The request says how many tokens its answer uses (``x-tokens``, default 100);
``x-usage-header: 1`` also sends that number up front as ``x-usage-tokens`` (an upstream that
knows its cost before it streams); ``x-usage: none`` leaves the usage out, ``x-usage: null`` sends
it with ``null`` numbers. Every usage it was asked for is kept (:attr:`reported`).

Usage::

    with StreamingUpstream() as up:
        EnvoyProxy(port, upstream=up, ...)   # Envoy's ``mock`` cluster points at up.port
        ...
        sum(tokens for tenant, tokens in up.reported)
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

__all__ = ["StreamingUpstream"]

MAX_HEAD = 16 * 1024


class StreamingUpstream:
    """The server (see the module docstring), on ``127.0.0.1`` and a free port."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.reported: list[tuple[str, int]] = []  # (the request's x-tenant, tokens)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, name="streaming-upstream", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> StreamingUpstream:
        """Serve (again: a no-op once it serves)."""
        if not self.thread.is_alive():
            self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.sock.close()

    def __enter__(self) -> StreamingUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(10)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """Requests on one keep-alive connection until it closes."""
        buf = b""
        try:
            while not self.stopping.is_set():
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(4096)
                    if not chunk or len(buf) > MAX_HEAD:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                headers = self._headers(head)
                length = int(headers.get("content-length", "0") or 0)
                while len(buf) < length:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    buf += chunk
                buf = buf[length:]
                self._answer(conn, headers)
        except OSError:
            return
        finally:
            conn.close()

    @staticmethod
    def _headers(head: bytes) -> dict[str, str]:
        out = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            out[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        return out

    def _answer(self, conn: socket.socket, headers: dict[str, str]) -> None:
        tokens = int(headers.get("x-tokens", "100"))
        with self.lock:
            self.reported.append((headers.get("x-tenant", ""), tokens))
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
        if headers.get("x-usage-header") == "1":
            head += b"x-usage-tokens: %d\r\n" % tokens
        conn.sendall(head + b"\r\n")
        for i in range(3):
            self._event(conn, {"choices": [{"delta": {"content": f"part {i} "}}]})
        prompt = min(tokens, 10)
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": tokens - prompt, "total_tokens": tokens}
        if headers.get("x-usage") == "null":  # an answer whose usage is not a number
            usage = {"prompt_tokens": None, "completion_tokens": None, "total_tokens": None}
        if headers.get("x-usage") != "none":  # none: an answer without its usage
            self._event(conn, {"choices": [], "usage": usage})
        conn.sendall(b"0\r\n\r\n")

    @staticmethod
    def _event(conn: socket.socket, data: dict[str, Any]) -> None:
        event = b"data: " + json.dumps(data).encode() + b"\n\n"
        conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
