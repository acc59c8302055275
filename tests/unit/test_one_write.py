"""The served HTTP protocol writes a whole answer in one write: the same bytes as uvicorn's own
httptools protocol, in the same order, only fewer writes (the head held for the body's first
bytes when the body is framed by its Content-Length, nothing held otherwise).

Both protocols are driven alike here, each with a transport that records its writes, on
requests and apps chosen for each way a response can go: whole, streamed (chunked), ``HEAD``,
empty, ``100 Continue``, pipelined, a body sent after an await, an app failing after its head."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from control_plane.server.serving import http_protocol
from control_plane.settings import load_settings

App = Callable[[Any, Any, Any], Awaitable[None]]
HEADERS = [(b"content-type", b"application/json")]


class Transport(asyncio.Transport):
    """Records what is written; closing is remembered in order with the writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.done = False  # the drive is over: what the connection's loss does is not recorded

    def write(self, data: Any) -> None:
        assert not self.closed, "written after close"
        if data:
            self.writes.append(bytes(data))

    def close(self) -> None:
        if not self.closed and not self.done:
            self.writes.append(b"<close>")
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def _drive(protocol_class: type[Any], app: App, data: list[bytes]) -> Transport:
    config = Config(app, interface="asgi3", access_log=False, log_level="warning")
    state = ServerState()
    state.default_headers = [(b"date", b"Sat, 28 Nov 2026 00:00:00 GMT"), (b"server", b"uvicorn")]
    protocol = protocol_class(config=config, server_state=state, app_state={})
    transport = Transport()
    protocol.connection_made(transport)
    try:
        for chunk in data:
            protocol.data_received(chunk)
            await asyncio.sleep(0)
        for _ in range(200):  # every task the requests started has run (bounded)
            await asyncio.sleep(0.001)
            if not [t for t in state.tasks if not t.done()]:
                break
    finally:
        transport.done = True
        protocol.connection_lost(None)
    return transport


def _whole(body: bytes = b'{"allowed":true}') -> App:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [*HEADERS, (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def _streamed(scope: Any, receive: Any, send: Any) -> Awaitable[None]:
    async def app() -> None:
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        for part in (b"one", b"two"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app()


def _after_an_await(scope: Any, receive: Any, send: Any) -> Awaitable[None]:
    async def app() -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await asyncio.sleep(0.005)
        await send({"type": "http.response.body", "body": b"ok"})

    return app()


def _fails_after_head(scope: Any, receive: Any, send: Any) -> Awaitable[None]:
    async def app() -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        raise RuntimeError("the app failed after its head")

    return app()


def _echo(scope: Any, receive: Any, send: Any) -> Awaitable[None]:
    async def app() -> None:
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        await _whole(body)(scope, receive, send)

    return app()


GET = b"GET /v1/decide HTTP/1.1\r\nhost: x\r\n\r\n"
CASES: dict[str, tuple[App, list[bytes], int]] = {
    # name: (app, what the client sends, how many writes the one-write protocol makes)
    "whole": (_whole(), [GET], 1),
    "empty body": (_whole(b""), [GET], 1),
    "HEAD": (_whole(), [b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n"], 1),
    "streamed": (_streamed, [GET], 4),
    "pipelined": (_whole(), [GET * 3], 3),
    "body after an await": (_after_an_await, [GET], 1),
    "fails after its head": (_fails_after_head, [GET], 2),
    "100 continue": (
        _echo,
        [b"POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n", b"ping"],
        2,
    ),
    "closing": (_whole(), [b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"], 2),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_bytes_are_uvicorns_in_fewer_writes(case: str) -> None:
    app, data, writes = CASES[case]
    served = http_protocol(load_settings(redis_url="redis://127.0.0.1:1").request_limits, "httptools")
    theirs = await _drive(HttpToolsProtocol, app, data)
    ours = await _drive(served, app, data)
    assert b"".join(ours.writes) == b"".join(theirs.writes), case
    assert ours.closed == theirs.closed
    assert len(ours.writes) == writes, ours.writes
    assert b"HTTP/1.1 " in b"".join(ours.writes)


async def test_a_whole_answer_is_one_write_where_uvicorn_makes_two() -> None:
    served = http_protocol(load_settings(redis_url="redis://127.0.0.1:1").request_limits, "httptools")
    theirs = await _drive(HttpToolsProtocol, _whole(), [GET])
    ours = await _drive(served, _whole(), [GET])
    assert len(theirs.writes) == 2 and ours.writes == [theirs.writes[0] + theirs.writes[1]]
    assert ours.writes[0].endswith(b'\r\n\r\n{"allowed":true}')


async def test_requests_leave_no_more_for_the_garbage_collector_than_uvicorns() -> None:
    """The held head's transport lets go of its cycle once the head is written: otherwise
    the cycle and the transport hold each other, and every request's objects (its scope, its
    headers, its task's) wait for the garbage collector instead of going when it ends."""
    served = http_protocol(load_settings(redis_url="redis://127.0.0.1:1").request_limits, "httptools")

    async def garbage(protocol_class: type[Any]) -> int:
        gc.collect()
        gc.disable()
        try:
            await _drive(protocol_class, _whole(), [GET * 20])
            return gc.collect()
        finally:
            gc.enable()

    theirs, ours = await garbage(HttpToolsProtocol), await garbage(served)
    assert ours <= theirs + 10, (ours, theirs)
