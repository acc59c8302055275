"""Raw HTTP/2 attack tools for the hostile-client tests (tests/e2e/test_grpc_*.py), on
loopback, every loop bounded by a deadline:

* :class:`Drain` -- a thread reading everything a server sends on a socket (so the server's
  writes never block on us) and noting the GOAWAY, the resets, the DATA bytes;
* :func:`blast` -- send chunks as fast as the socket takes them, until a deadline, the
  server's GOAWAY or the connection's end;
* :class:`FlowSender` -- connections that send request bytes only within the windows the
  server grants (a peer keeping to flow control), never giving any window back for what it
  receives, until a deadline;
* :func:`open_idle` / :func:`count_open` -- many connections that send the preface and stay idle.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from h2_raw import (
    DATA,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_FRAME_SIZE,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    RawConn,
    raw_frame,
    settings_payload,
)  # fmt: skip

__all__ = ["Drain", "FlowSender", "Stream", "blast", "count_open", "open_idle"]


def split_frames(buf: bytearray) -> list[tuple[int, int, int, bytes]]:
    """Whole frames (type, flags, stream, payload) taken off the front of ``buf``."""
    out = []
    pos = 0
    while pos + 9 <= len(buf):
        n = int.from_bytes(buf[pos : pos + 3], "big")
        if pos + 9 + n > len(buf):
            break
        sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFF_FFFF
        out.append((buf[pos + 3], buf[pos + 4], sid, bytes(buf[pos + 9 : pos + 9 + n])))
        pos += 9 + n
    del buf[:pos]
    return out


class Drain(threading.Thread):
    """Reads ``conn``'s socket until it closes or :meth:`stop` (what the handshake left
    buffered is read first)."""

    def __init__(self, conn: RawConn) -> None:
        super().__init__(daemon=True)
        self.sock = conn.sock
        self.buf = bytearray(conn.buf)
        self.goaway: int | None = None
        self.resets: Counter[int] = Counter()  # error code -> count
        self.reset_streams: dict[int, int] = {}  # stream -> error code
        self.headers: Counter[int] = Counter()  # stream -> HEADERS frames
        self.data_bytes = 0
        self.frames: Counter[int] = Counter()
        self.closed = threading.Event()
        self.halt = threading.Event()

    def run(self) -> None:
        self.sock.settimeout(0.2)
        try:
            while not self.halt.is_set():
                try:
                    chunk = self.sock.recv(1 << 20)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                self.buf += chunk
                for ftype, _, sid, payload in split_frames(self.buf):
                    self._frame(ftype, sid, payload)
        except OSError:
            pass
        finally:
            self.closed.set()

    def _frame(self, ftype: int, sid: int, payload: bytes) -> None:
        self.frames[ftype] += 1
        if ftype == GOAWAY and self.goaway is None:
            self.goaway = int.from_bytes(payload[4:8], "big")
        elif ftype == RST_STREAM:
            code = int.from_bytes(payload[:4], "big")
            self.resets[code] += 1
            self.reset_streams[sid] = code
        elif ftype == DATA:
            self.data_bytes += len(payload)
        elif ftype == HEADERS:
            self.headers[sid] += 1

    def wait_goaway_or_close(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.goaway is None and not self.closed.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        self.halt.set()
        self.join(5)


def blast(conn: RawConn, chunks: Iterable[bytes], drain: Drain, seconds: float) -> int:
    """Send ``chunks`` in order until they run out, ``seconds`` pass, the server says GOAWAY or
    the connection ends; the bytes sent."""
    sent = 0
    deadline = time.monotonic() + seconds
    conn.sock.settimeout(1.0)
    for chunk in chunks:
        if time.monotonic() > deadline or drain.goaway is not None or drain.closed.is_set():
            break
        view = memoryview(chunk)
        while view and time.monotonic() < deadline and not drain.closed.is_set():
            try:
                n = conn.sock.send(view)
            except TimeoutError:
                continue  # the server is not reading: keep trying until the deadline
            except OSError:
                return sent
            sent += n
            view = view[n:]
    return sent


@dataclass
class Stream:
    """What a :class:`FlowSender` stream sends: ``pattern`` repeated ``total`` bytes in all
    (None: without end), as DATA without END_STREAM."""

    pattern: bytes
    total: int | None
    sent: int = 0
    window: int = 0
    reset: int | None = None

    def take(self, n: int) -> bytes:
        if self.total is not None:
            n = min(n, self.total - self.sent)
        start = self.sent % len(self.pattern)
        reps = (start + n) // len(self.pattern) + 1
        out = (self.pattern * reps)[start : start + n]
        self.sent += n
        return out

    @property
    def done(self) -> bool:
        return self.reset is not None or (self.total is not None and self.sent >= self.total)


@dataclass
class FlowConn:
    conn: RawConn
    streams: dict[int, Stream]
    window: int = 65_535  # what the server lets us send on the connection
    initial: int = 65_535  # the server's SETTINGS_INITIAL_WINDOW_SIZE
    frame_max: int = 16_384
    out: bytearray = field(default_factory=bytearray)
    inbuf: bytearray = field(default_factory=bytearray)
    goaway: int | None = None
    closed: bool = False
    data_received: int = 0
    resets: Counter[int] = field(default_factory=Counter)


class FlowSender:
    """Connections whose streams send :class:`Stream` bytes within the server's windows
    (HEADERS of each stream sent at once, first)."""

    def __init__(self) -> None:
        self.conns: list[FlowConn] = []

    def add(self, conn: RawConn, headers: dict[int, bytes], streams: dict[int, Stream]) -> FlowConn:
        """``conn`` past its handshake; ``headers``: each stream's HEADERS frame (bytes)."""
        fc = FlowConn(conn, streams, window=conn.granted, inbuf=bytearray(conn.buf))
        fc.initial = conn.settings.get(INITIAL_WINDOW_SIZE, 65_535)
        fc.frame_max = conn.settings.get(MAX_FRAME_SIZE, 16_384)
        for s in streams.values():
            s.window = fc.initial
        fc.out += b"".join(headers.values())
        conn.sock.setblocking(False)
        self.conns.append(fc)
        return fc

    def run(self, seconds: float) -> None:
        """Send what the windows allow, read what comes, for ``seconds`` (or until every
        connection is done)."""
        deadline = time.monotonic() + seconds
        with selectors.DefaultSelector() as sel:
            for i, fc in enumerate(self.conns):
                sel.register(fc.conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, i)
            while time.monotonic() < deadline and any(not fc.closed for fc in self.conns):
                for key, events in sel.select(timeout=0.05):
                    fc = self.conns[key.data]
                    if fc.closed:
                        continue
                    if events & selectors.EVENT_READ:
                        self._read(fc)
                    if events & selectors.EVENT_WRITE and not fc.closed:
                        self._fill(fc)
                        self._write(fc)
                for i, fc in enumerate(self.conns):
                    if not fc.closed:
                        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if fc.out or self._can_send(fc) else 0)
                        sel.modify(fc.conn.sock, want, i)
                    else:
                        try:
                            sel.unregister(fc.conn.sock)
                        except (KeyError, ValueError):
                            pass

    def _can_send(self, fc: FlowConn) -> bool:
        return fc.goaway is None and fc.window > 0 and any(not s.done and s.window > 0 for s in fc.streams.values())

    def _fill(self, fc: FlowConn) -> None:
        """Queue DATA within the windows while little is queued."""
        for sid, s in fc.streams.items():
            if len(fc.out) > 1 << 20 or fc.window <= 0 or fc.goaway is not None:
                return
            n = min(s.window, fc.window, fc.frame_max)
            if n <= 0 or s.done:
                continue
            payload = s.take(n)
            s.window -= len(payload)
            fc.window -= len(payload)
            fc.out += raw_frame(DATA, 0, sid, payload)

    def _write(self, fc: FlowConn) -> None:
        try:
            n = fc.conn.sock.send(fc.out)
            del fc.out[:n]
        except BlockingIOError:
            pass
        except OSError:
            fc.closed = True

    def _read(self, fc: FlowConn) -> None:
        try:
            chunk = fc.conn.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            fc.closed = True
            return
        fc.inbuf += chunk
        for ftype, flags, sid, payload in split_frames(fc.inbuf):
            self._frame(fc, ftype, flags, sid, payload)

    def _frame(self, fc: FlowConn, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == WINDOW_UPDATE:
            incr = int.from_bytes(payload[:4], "big") & 0x7FFF_FFFF
            if sid == 0:
                fc.window += incr
            elif sid in fc.streams:
                fc.streams[sid].window += incr
        elif ftype == SETTINGS and not flags & 1:
            values = {int.from_bytes(payload[i : i + 2], "big"): int.from_bytes(payload[i + 2 : i + 6], "big")
                      for i in range(0, len(payload) - 5, 6)}  # fmt: skip
            if INITIAL_WINDOW_SIZE in values:
                delta = values[INITIAL_WINDOW_SIZE] - fc.initial
                fc.initial = values[INITIAL_WINDOW_SIZE]
                for s in fc.streams.values():
                    s.window += delta
            fc.out += raw_frame(SETTINGS, 0x1, 0)
        elif ftype == PING and not flags & 1:
            fc.out += raw_frame(PING, 0x1, 0, payload)
        elif ftype == RST_STREAM:
            fc.resets[int.from_bytes(payload[:4], "big")] += 1
            if sid in fc.streams:
                fc.streams[sid].reset = int.from_bytes(payload[:4], "big")
        elif ftype == GOAWAY:
            fc.goaway = int.from_bytes(payload[4:8], "big")
        elif ftype == DATA:
            fc.data_received += len(payload)

    def sent(self) -> int:
        return sum(s.sent for fc in self.conns for s in fc.streams.values())


def open_idle(port: int, n: int, *, batch: int = 500, timeout: float = 45.0) -> tuple[list[socket.socket], int]:
    """``n`` connections that send the preface and an empty SETTINGS frame, then nothing;
    (the ones established, how many could not be: refused or not accepted in time)."""
    hello = PREFACE + raw_frame(SETTINGS, 0, 0, settings_payload())
    done: list[socket.socket] = []
    failed = 0
    deadline = time.monotonic() + timeout
    for start in range(0, n, batch):
        pending: list[socket.socket] = []
        for _ in range(min(batch, n - start)):
            try:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            except OSError:  # out of file descriptors: what was opened is what there is
                failed += 1
                continue
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            pending.append(s)
        with selectors.DefaultSelector() as sel:
            for s in pending:
                sel.register(s, selectors.EVENT_WRITE)
            left = len(pending)
            while left and time.monotonic() < deadline:
                for key, _ in sel.select(timeout=0.5):
                    s = key.fileobj  # type: ignore[assignment]
                    sel.unregister(s)
                    left -= 1
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 and _send(s, hello):
                        done.append(s)
                    else:
                        failed += 1
                        s.close()
            for key in list(sel.get_map().values()):
                failed += 1
                key.fileobj.close()  # type: ignore[union-attr]
    return done, failed


def _send(s: socket.socket, data: bytes) -> bool:
    try:
        return s.send(data) == len(data)
    except OSError:
        return False


def count_open(socks: list[socket.socket], *, settle: float = 0.2) -> int:
    """How many of ``socks`` the server has not closed (what it sent is read and dropped)."""
    open_ = 0
    with selectors.DefaultSelector() as sel:
        for s in socks:
            if s.fileno() >= 0:
                sel.register(s, selectors.EVENT_READ)
        ready = {key.fileobj for key, _ in sel.select(timeout=settle)}
        for s in socks:
            if s.fileno() < 0:
                continue
            if s in ready and not _drained(s):
                s.close()
            else:
                open_ += 1
    return open_


def _drained(s: socket.socket) -> bool:
    """Read what is there; False once the server closed the connection."""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False
