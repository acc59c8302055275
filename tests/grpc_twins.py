"""Two connections of the gRPC transport fed the same bytes: one as it is served (Envoy's unary
calls read beside h2, whole answers written beside it: control_plane/envoy/unary.py and
``Output.answer_whole``), one where python-hyper's h2 reads and writes every frame. What each
wrote, how each ended, what each counted and the HTTP/2 state each kept must be the same.

* :class:`Pair`: both in the test's event loop, fed by the test (:meth:`Pair.feed`);
  :meth:`Pair.same` compares them;
* :class:`TwinServer`: a loopback port whose every connection is such a pair, the served one
  answering the socket, the other one writing to a :class:`Wire`; each pair is compared when
  its connection ends (:attr:`TwinServer.unequal` lists what differed), so that a suite of
  raw-socket cases (the h2spec conformance cases) runs through both ways at once.

Usage::

    pair = Pair(methods, limits)
    await pair.feed(client_bytes)
    pair.same()               # the bytes, the counts, h2's state (the calls read beside it allowed for)
    pair.same(settle=True)    # ... with those calls' streams made in h2 first: everything equal
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from control_plane.envoy.frames import FrameWalk
from control_plane.envoy.transport import GrpcConnection
from control_plane.envoy.wire import Call, Limits, Method

__all__ = ["Owner", "Pair", "TwinServer", "Wire", "h2_only", "unequal"]


class Wire:
    """A connection's transport that keeps what was written (and forwards it to ``real``, if given)."""

    def __init__(self, real: Any = None) -> None:
        self.real = real
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data
        if self.real is not None:
            self.real.write(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True
        if self.real is not None:
            self.real.close()

    def pause_reading(self) -> None:
        if self.real is not None:
            self.real.pause_reading()

    def resume_reading(self) -> None:
        if self.real is not None:
            self.real.resume_reading()

    def get_extra_info(self, *args: Any, **kwargs: Any) -> Any:
        return None if self.real is None else self.real.get_extra_info(*args, **kwargs)


class Owner:
    """A connection's owner (the server's part): admits (and keeps) every connection, counts,
    authorizes everything."""

    tls = None  # cleartext

    def __init__(self) -> None:
        self.connections: set[Any] = set()
        self.counts: dict[str, int] = {}
        self.slow_count = 0

    def admit(self, conn: Any) -> bool:
        self.connections.add(conn)
        return True

    def count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def authorize(self, call: Call, names: tuple[str, ...] = ()) -> None:
        pass

    def slow(self) -> None:
        self.slow_count += 1

    def closed(self, conn: Any) -> None:
        self.connections.discard(conn)


class Clock:
    """The event loop as a connection sees it, with the time held where the test puts it
    (:attr:`now`): both connections of a pair read the same time, so that their bounds on
    frames a second (the control-frame bucket) refill alike."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.now = loop.time()

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loop, name)


def _clocked(conn: GrpcConnection, clock: Clock) -> GrpcConnection:
    conn.loop = clock  # type: ignore[assignment]
    conn.walk = FrameWalk(clock.now)
    conn.opened_at = conn.last_frame = conn.last_call = conn.last_drain = clock.now
    return conn


def h2_only(conn: GrpcConnection) -> GrpcConnection:
    """``conn`` with h2 reading and writing every frame: no call read beside it, no answer
    written beside it."""
    conn.unary_reads = False
    conn.answer_whole = lambda *args: False  # type: ignore[method-assign]
    return conn


def _h2_state(conn: GrpcConnection) -> dict[str, Any]:
    """What h2 keeps of a connection, unread streams left out (see :func:`unequal`)."""
    h2 = conn.h2
    table = h2.decoder.hpack.header_table  # type: ignore[attr-defined]
    inbound = h2._inbound_flow_control_window_manager
    return {
        "state": h2.state_machine.state,
        "highest_inbound": h2.highest_inbound_stream_id,
        "inbound_window": (inbound.current_window_size, inbound._bytes_processed),
        "outbound_window": h2.outbound_flow_control_window,
        "hpack_table": (list(table.dynamic_entries), table.maxsize),
        "closed_streams": dict(h2._closed_streams),
        "data_to_send": bytes(h2._data_to_send),
    }


def _stream_state(stream: Any) -> tuple[Any, ...]:
    return (
        stream.state_machine.state,
        stream.state_machine.headers_sent,
        stream.outbound_flow_control_window,
        stream.inbound_flow_control_window,
        stream._inbound_window_manager._bytes_processed,
        stream._actual_content_length,
        stream.max_outbound_frame_size,
    )


def unequal(
    served: GrpcConnection, reference: GrpcConnection, served_wire: Wire, reference_wire: Wire, *, settle: bool = False
) -> list[str]:
    """What differs between a connection as served and one where h2 does everything (empty:
    nothing). The streams of calls read beside h2 and not answered yet (``served.unread``) are
    not in h2's own table; with ``settle`` they are made there first (``tell_h2_all``), else
    they are counted with the open ones and the rest is compared."""
    out = []
    if bytes(served_wire.data) != bytes(reference_wire.data):
        a, b = bytes(served_wire.data), bytes(reference_wire.data)
        at = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
        first = f"{a[at : at + 24]!r} / {b[at : at + 24]!r}"
        out.append(f"written: {len(a)} against {len(b)} bytes, first difference at {at}: {first}")
    for name in ("closed",):
        if getattr(served_wire, name) != getattr(reference_wire, name):
            out.append(f"wire {name}: {getattr(served_wire, name)} against {getattr(reference_wire, name)}")
    for name in (
        "closing",
        "stopping",
        "preface",
        "reading_paused",
        "pending",
        "started_calls",
        "resets",
        "finished_calls",
    ):
        if getattr(served, name) != getattr(reference, name):
            out.append(f"{name}: {getattr(served, name)} against {getattr(reference, name)}")
    if set(served.streams) != set(reference.streams):
        out.append(f"streams: {sorted(served.streams)} against {sorted(reference.streams)}")
    if served.owner.counts != reference.owner.counts:
        out.append(f"counts: {served.owner.counts} against {reference.owner.counts}")
    if served.closing or not hasattr(served, "h2") or not served.h2.__dict__:
        return out
    if settle:
        served.tell_h2_all()
    open_a, open_b = served.h2.open_inbound_streams, reference.h2.open_inbound_streams  # (h2 forgets closed ones)
    a, b = _h2_state(served), _h2_state(reference)
    out += [f"h2 {k}: {a[k]!r} against {b[k]!r}" for k in a if a[k] != b[k]]
    unread = set(served.unread)
    if open_a + len(unread) != open_b or (set(served.h2.streams) | unread) != set(reference.h2.streams):
        out.append(
            f"h2 streams: {sorted(served.h2.streams)} + unread {sorted(unread)} against {sorted(reference.h2.streams)}"
        )
        return out
    for sid, stream in reference.h2.streams.items():
        if sid in unread:
            continue
        if _stream_state(served.h2.streams[sid]) != _stream_state(stream):
            out.append(f"h2 stream {sid}: {_stream_state(served.h2.streams[sid])} against {_stream_state(stream)}")
    return out


class Pair:
    """A served connection and an h2-only one, in this event loop, fed the same bytes.
    ``taken``: the calls the served one read beside h2; ``whole``: its answers written
    beside h2."""

    def __init__(self, methods: dict[str, Method], limits: Limits) -> None:
        self.owners = {"served": Owner(), "h2": Owner()}
        self.wires = {"served": Wire(), "h2": Wire()}
        self.clock = Clock(asyncio.get_running_loop())
        self.conns = {
            name: _clocked(GrpcConnection(methods, limits, self.owners[name]), self.clock) for name in self.owners
        }
        h2_only(self.conns["h2"])
        self.taken = self.whole = 0
        served = self.conns["served"]
        took, whole = served.took_unary, served.answer_whole

        def counting(calls: Any) -> None:
            self.taken += len(calls)
            took(calls)

        def answering(*args: Any) -> bool:
            done = whole(*args)
            self.whole += done
            return done

        served.took_unary = counting  # type: ignore[method-assign]
        served.answer_whole = answering  # type: ignore[method-assign]
        for name, conn in self.conns.items():
            conn.connection_made(self.wires[name])

    @property
    def served(self) -> GrpcConnection:
        return self.conns["served"]

    async def feed(self, *pieces: bytes, turns: int = 6) -> None:
        """Each piece as one read of both, then ``turns`` turns of the event loop."""
        for piece in pieces:
            for conn in self.conns.values():
                if not conn.closing:
                    conn.data_received(piece)
        for _ in range(turns):
            await asyncio.sleep(0)

    def same(self, *, settle: bool = False) -> None:
        diff = unequal(self.served, self.conns["h2"], self.wires["served"], self.wires["h2"], settle=settle)
        assert not diff, "\n".join(diff)

    async def close(self) -> None:
        """Both connections lost (their methods cancelled), and the loop turned for that."""
        for conn in self.conns.values():
            conn.connection_lost(None)
        await self.feed()


class _Twin(asyncio.Protocol):
    """One connection of a :class:`TwinServer`: the served connection answers the socket."""

    def __init__(self, server: TwinServer) -> None:
        self.server = server
        self.clock = Clock(asyncio.get_running_loop())
        self.served = _clocked(GrpcConnection(server.methods, server.limits, Owner()), self.clock)
        self.reference = h2_only(_clocked(GrpcConnection(server.methods, server.limits, Owner()), self.clock))
        self.wires = (Wire(), Wire())
        took = self.served.took_unary

        def counting(calls: Any) -> None:
            server.taken += len(calls)
            took(calls)

        self.served.took_unary = counting  # type: ignore[method-assign]

    def connection_made(self, transport: Any) -> None:
        self.wires[0].real = transport
        self.served.connection_made(self.wires[0])
        self.reference.connection_made(self.wires[1])

    def data_received(self, data: bytes) -> None:
        self.clock.now = self.clock.loop.time()
        for conn in (self.served, self.reference):
            if not conn.closing:
                conn.data_received(data)

    def pause_writing(self) -> None:
        self.served.pause_writing()
        self.reference.pause_writing()

    def resume_writing(self) -> None:
        self.served.resume_writing()
        self.reference.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        # compared before either lets go of its state; a reference still open is closed as the socket was
        diff = unequal(self.served, self.reference, self.wires[0], self.wires[1])
        self.served.connection_lost(exc)
        self.reference.connection_lost(exc)
        self.server.connections += 1
        if diff:
            self.server.unequal.append(diff)


class TwinServer:
    """A loopback port, in an event loop of its own thread, whose connections are pairs
    (see the module docstring). ``with TwinServer(methods, limits) as server: ... server.port``;
    :meth:`settled` waits until every connection opened has ended and been compared."""

    def __init__(self, methods: dict[str, Method], limits: Limits) -> None:
        self.methods = methods
        self.limits = limits
        self.unequal: list[list[str]] = []
        self.connections = 0
        self.taken = 0
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="twin-server", daemon=True)
        self._opened: list[_Twin] = []

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop

        def factory() -> _Twin:
            twin = _Twin(self)
            self._opened.append(twin)
            return twin

        async def start() -> Any:
            return await loop.create_server(factory, "127.0.0.1", 0)

        server = loop.run_until_complete(start())
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()

    def __enter__(self) -> TwinServer:
        self._thread.start()
        assert self._ready.wait(10), "the twin server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def call(self, fn: Callable[[], Any]) -> None:
        """``fn`` in the server's event loop."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn)

    def settled(self, timeout: float = 5.0) -> bool:
        """True once every connection opened so far has ended (and been compared)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.connections >= len(self._opened):
                return True
            time.sleep(0.01)
        return False
