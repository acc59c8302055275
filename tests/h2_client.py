"""An HTTP/2 client of its own (python-hyper's ``h2``, not the project's code) for the gRPC
transport's protocol tests: raw frames, small windows, resets, pings, bad input."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings

__all__ = ["Answer", "H2Client", "grpc_message"]


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    return bytes((1 if compressed else 0,)) + len(payload).to_bytes(4, "big") + payload


@dataclass
class Answer:
    """What came back on one stream."""

    headers: dict[str, str] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    trailers: dict[str, str] = field(default_factory=dict)
    reset: int | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def status(self) -> int | None:
        """grpc-status, from the trailers (or the headers of a trailers-only answer)."""
        value = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if value is None else int(value)

    def messages(self) -> list[bytes]:
        out, data = [], bytes(self.data)
        while data:
            n = int.from_bytes(data[1:5], "big")
            out.append(data[5 : 5 + n])
            data = data[5 + n :]
        return out


class H2Client:
    """One HTTP/2 connection to ``127.0.0.1:port``, read by a task of its own."""

    def __init__(self, window: int | None = None, auto_ack: bool = True) -> None:
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.window = window
        self.auto_ack = auto_ack  # give received DATA back to the windows at once
        self.answers: dict[int, Answer] = {}
        self.events: list[Any] = []
        self.closed = asyncio.Event()
        self.terminated: Any = None
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None

    async def connect(self, port: int) -> H2Client:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        if self.window is not None:
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: self.window}
            )
        self.conn.initiate_connection()
        self.flush()
        self.task = asyncio.get_running_loop().create_task(self._read())
        return self

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.writer is not None and not self.writer.is_closing():
            self.writer.write(data)

    async def _read(self) -> None:
        assert self.reader is not None
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                for ev in self.conn.receive_data(data):
                    self._event(ev)
                self.flush()
        except (ConnectionError, h2.exceptions.ProtocolError) as exc:
            self.events.append(exc)
        finally:
            self.closed.set()
            for a in self.answers.values():
                a.ended.set()

    def _event(self, ev: Any) -> None:
        self.events.append(ev)
        sid = getattr(ev, "stream_id", None)
        answer = self.answers.get(sid) if sid else None
        if isinstance(ev, h2.events.ResponseReceived) and answer is not None:
            answer.headers = dict(ev.headers)
        elif isinstance(ev, h2.events.TrailersReceived) and answer is not None:
            answer.trailers = dict(ev.headers)
        elif isinstance(ev, h2.events.DataReceived) and answer is not None:
            answer.data += ev.data
            if self.auto_ack:
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, h2.events.StreamEnded) and answer is not None:
            answer.ended.set()
        elif isinstance(ev, h2.events.StreamReset) and answer is not None:
            answer.reset = ev.error_code
            answer.ended.set()
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.terminated = ev

    def start(
        self, path: str, body: bytes | None = None, *, extra: list[tuple[str, str]] | None = None,
        end: bool = True, method: str = "POST", content_type: str = "application/grpc",
    ) -> int:  # fmt: skip
        """Open a stream with a call's headers (and ``body``, raw bytes); its stream id."""
        sid = self.conn.get_next_available_stream_id()
        headers = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "test")]
        headers += [("content-type", content_type), ("te", "trailers"), *(extra or [])]
        self.answers[sid] = Answer()
        self.conn.send_headers(sid, headers, end_stream=body is None and end)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=end)
        self.flush()
        return sid

    async def call(self, path: str, message: bytes, timeout: float = 5.0, **kw: Any) -> Answer:
        sid = self.start(path, grpc_message(message), **kw)
        await asyncio.wait_for(self.answers[sid].ended.wait(), timeout)
        return self.answers[sid]

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
