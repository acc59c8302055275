"""uvicorn's HTTP protocols with a bound on the request head while it arrives.

uvicorn enforces no header limits of its own that answer cleanly:

* httptools (the default when installed) has none: a 10 MB header is buffered whole (in
  pieces joined with ``bytes +=``) and handed to the app; only the URL is refused (400).
* h11 refuses an *incomplete* head larger than ``h11_max_incomplete_event_size`` (16 KiB
  by default; a larger head arriving in one read passes), but with a plain-text 400.

:func:`http_protocol` gives the class to pass as uvicorn's ``http=``: the chosen
implementation, refusing a head that grows past :attr:`RequestLimits.head_bytes` with the
same JSON 431 as :class:`~control_plane.limits.RequestLimitsMiddleware` and closing the
connection. A head is thus never buffered beyond that plus one read from the socket; the
middleware then applies the exact count and size limits to the parsed header list.

>>> uvicorn.run(app, http=http_protocol(settings.request_limits))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import RequestLimits, refusal_body

__all__ = ["http_protocol"]


def _head_refusal(limits: RequestLimits) -> bytes:
    return refusal_body(
        431,
        f"the request head (request line and header fields) passed {limits.head_bytes:,} bytes;"
        f" header fields may take {limits.max_header_bytes:,}",
        limits.max_header_bytes,
    )


def http_protocol(limits: RequestLimits, impl: str = "auto") -> type[asyncio.Protocol]:
    """uvicorn's ``impl`` protocol (``auto``: httptools if installed, else h11) bounded by ``limits``."""
    if impl == "auto":
        try:
            import httptools  # noqa: F401
        except ImportError:  # pragma: no cover - uvicorn[standard] installs it
            impl = "h11"
        else:
            impl = "httptools"
    if impl == "h11":
        base: type[Any] = _BoundedH11Protocol
    elif impl == "httptools":
        base = _bounded_httptools()
    else:
        raise ValueError(f"unknown HTTP implementation {impl!r} (auto, httptools, h11)")
    return type(base.__name__, (base,), {"limits": limits, "refusal": _head_refusal(limits)})


class _RefusalMemo(h11.Connection):
    """h11's connection, remembering the status hint of the protocol error it raised."""

    refused_status: int | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.refused_status = exc.error_status_hint
            raise


class _BoundedH11Protocol(H11Protocol):
    """h11 with its incomplete-event bound set to the head limit and its 431 answered in JSON."""

    limits: ClassVar[RequestLimits]
    refusal: ClassVar[bytes]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _RefusalMemo(h11.SERVER, max_incomplete_event_size=self.limits.head_bytes)

    def send_400_response(self, msg: str) -> None:
        if not isinstance(self.conn, _RefusalMemo) or self.conn.refused_status != 431:
            super().send_400_response(msg)
            return
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.refusal)).encode()),
            (b"connection", b"close"),
        ]
        self.transport.write(
            self.conn.send(h11.Response(status_code=431, headers=headers, reason=b"Request Header Fields Too Large"))
        )
        self.transport.write(self.conn.send(h11.Data(data=self.refusal)))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()


def _bounded_httptools() -> type[Any]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class _BoundedHttpToolsProtocol(HttpToolsProtocol):
        """httptools counting the bytes received while no body is arriving (a head is)."""

        limits: ClassVar[RequestLimits]
        refusal: ClassVar[bytes]
        _head_bytes = 0

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            in_head = cycle is None or not cycle.more_body  # before parsing: these bytes start or continue a head
            super().data_received(data)
            if self.cycle is not cycle:  # a head completed (the rest of this read is not counted)
                self._head_bytes = 0
            elif in_head:
                self._head_bytes += len(data)
                if self._head_bytes > self.limits.head_bytes and not self.transport.is_closing():
                    self._refuse_head()

        def _refuse_head(self) -> None:
            if self.cycle is None or self.cycle.response_complete:
                head = [b"HTTP/1.1 431 Request Header Fields Too Large\r\n"]
                head += [b"%s: %s\r\n" % (name, value) for name, value in self.server_state.default_headers]
                head.append(
                    b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                    % len(self.refusal)
                )
                self.transport.write(b"".join(head) + self.refusal)
            # else: a pipelined head during a response in progress; no room for an answer
            self.transport.close()

    return _BoundedHttpToolsProtocol
