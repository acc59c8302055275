"""The registry of the HTTP/2 conformance cases (tests/e2e/test_h2_conformance.py): h2spec's
cases ported to Python (summerwind/h2spec: ``http2/``, ``hpack/``, ``generic/``, in
``h2spec_http2.py``, ``h2spec_frames.py``, ``h2spec_generic.py``) and RFC 9113's message checks
that h2spec lacks (``h2_message_checks.py``).

A case is a function of a :class:`Ctx` (a fresh connection to the server, not yet past the
preface) registered with :func:`case` under h2spec's id (``http2/6.5.3/2``: the spec, its
section in RFC 7540's numbering as h2spec keeps it, the case's number in the section); its
docstring names the section of RFC 9113 and what must happen.

Where h2spec sends a GET (HEADERS with END_STREAM), a case sends a gRPC call instead: HEADERS
then the ``RateLimitRequest`` in a DATA frame with END_STREAM (:meth:`Ctx.call`); where h2spec
posts ``test`` as a body, the body is that message. A header block of h2spec's
``DummyHeaders`` is ``x-dummyN: 'x' * 4000`` (its default ``--max-header-length``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from h2_raw import ErrorCodes, RawConn, rls_message
from h2_verdicts import stream_error, stream_error_and_connection_lives

__all__ = ["CASES", "Case", "Ctx", "case", "dummy_headers"]

MAX_HEADER_LEN = 4000  # h2spec's --max-header-length default
TIMEOUT_S = 2.0  # h2spec's --timeout default: nothing within it fails a verdict


def dummy_headers(n: int) -> list[tuple[str, str]]:
    return [(f"x-dummy{i}", "x" * MAX_HEADER_LEN) for i in range(n)]


class Ctx:
    """What a case works with: ``conn`` (fresh, before the preface), the server's port for
    another connection, and the verdict of a malformed request (:meth:`malformed`)."""

    def __init__(self, port: int, *, strict: bool = False, timeout: float = TIMEOUT_S) -> None:
        self.port = port
        self.strict = strict
        self.timeout = timeout
        self.conn = RawConn(port, timeout=timeout)
        self.opened = [self.conn]

    def new_conn(self) -> RawConn:
        conn = RawConn(self.port, timeout=self.timeout)
        self.opened.append(conn)
        return conn

    def close(self) -> None:
        for conn in self.opened:
            conn.close()

    @property
    def headers(self) -> list[tuple[str, str]]:
        """The call's request headers (h2spec's ``CommonHeaders``)."""
        return self.conn.grpc_headers()

    def call(self, sid: int, headers: list[tuple[str, str]] | None = None, **kw: object) -> None:
        """The gRPC call where h2spec sends a GET: HEADERS (``kw``: flags, padding, priority),
        then the message with END_STREAM."""
        kw.setdefault("block", self.conn.encode(self.headers if headers is None else headers))
        self.conn.request(sid, **kw)

    def finish(self, sid: int) -> None:
        """The message with END_STREAM, after a header block sent in pieces."""
        self.conn.data(sid, rls_message(), end_stream=True)

    def server_data_length(self) -> int:
        """h2spec's ServerDataLength: the DATA bytes of one answer, on a connection of its own."""
        conn = self.new_conn()
        conn.handshake()
        conn.request(1)
        total = 0
        while not conn.closed:
            ev = conn.wait_event()
            if ev.kind == "frame" and ev.frame.type in (0, 1):
                total += ev.frame.body_len if ev.frame.type == 0 else 0
                if ev.end_stream:
                    return total
        raise AssertionError(f"no whole answer to measure (h2spec's ServerDataLength): {conn.seen()}")

    def malformed(self, sid: int = 1) -> None:
        """The verdict of a malformed request (RFC 9113 8.1.1): h2spec's, a stream error
        PROTOCOL_ERROR; with ``strict``, a RST_STREAM on that very stream and the connection
        answering the next call."""
        if self.strict:
            stream_error_and_connection_lives(self.conn, sid, ErrorCodes.PROTOCOL_ERROR, sid + 2)
        else:
            stream_error(self.conn, ErrorCodes.PROTOCOL_ERROR)


@dataclass(frozen=True)
class Case:
    id: str
    doc: str
    run: Callable[[Ctx], None]
    message_check: bool
    timeout: float


CASES: dict[str, Case] = {}


def case(
    cid: str, *, message_check: bool = False, timeout: float = TIMEOUT_S
) -> Callable[[Callable[[Ctx], None]], Callable[[Ctx], None]]:
    """Register a case under h2spec's id; ``message_check``: a malformed request whose verdict
    is :meth:`Ctx.malformed` (also run with ``strict``); ``timeout``: h2spec's ``--timeout``
    for it, if not its default."""

    def register(fn: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        assert cid not in CASES, cid
        assert fn.__doc__ and "RFC" in fn.__doc__, f"{cid}: a docstring naming the RFC section"
        CASES[cid] = Case(cid, " ".join(fn.__doc__.split()), fn, message_check, timeout)
        return fn

    return register
