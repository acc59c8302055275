"""What a response cost, read from the response as it passes: for the ASGI middleware's budget
routes (:class:`~control_plane.middleware.ShadowLimitMiddleware`), whose cost is known only when
the answer ends (an LLM answer's tokens).

:class:`Metering` says where the cost is: a callable given the response (:class:`Response`),
a response header (``x-usage-tokens`` by default), and, for JSON answers and event streams, the
``usage`` object the way OpenAI-style APIs send it (in a JSON body, or in a
``text/event-stream``'s events, the last that carries one: ``total_tokens``, else
``prompt_tokens + completion_tokens``, else ``input_tokens + output_tokens``), tried in that
order. :class:`Meter` watches one response's messages without holding them up: the header
when the response starts, the body's JSON (up to :attr:`Metering.max_body` bytes) or each
event (a line of at most :attr:`Metering.max_event` bytes; a longer one is skipped, never
buffered whole).

When the answer ends early (the client went away, the app failed mid-body), what was produced
is charged: the cost if it was already known, else, for an event stream, one unit per event
carrying data that the app produced (an OpenAI-style stream sends about a token an event), else
the reservation's estimate (nothing learnt: what was reserved is kept), else nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["Meter", "Metering", "Response", "usage_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    """A response as a cost callable sees it: its status and headers (lower-case names), its body
    when it is JSON and small enough (``None`` otherwise), the last event that carried a JSON
    object (an event stream's), and how many data events it had."""

    status: int
    headers: Mapping[str, str]
    body: bytes | None
    last_event: Any
    events: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Metering:
    """Where a budget route's cost is read (see the module docstring). ``cost``: a callable given
    the :class:`Response`, returning the cost or None (then the header, then the usage)."""

    header: str | None = "x-usage-tokens"
    cost: Callable[[Response], int | None] | None = None
    usage: Callable[[Any], int | None] = field(default=lambda obj: usage_of(obj))
    max_body: int = 1 << 20
    max_event: int = 64 << 10


def usage_of(obj: Any) -> int | None:
    """The total of an OpenAI-style ``usage`` object in ``obj`` (None: no usage there)."""
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(usage, dict):
        return None
    total = _whole(usage.get("total_tokens"))
    if total is not None:
        return total
    for a, b in (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens")):
        x, y = _whole(usage.get(a)), _whole(usage.get(b))
        if x is not None and y is not None:
            return x + y
    return None


def _whole(v: Any) -> int | None:
    """``v`` when it is a whole number of at least 0 (a bool is not), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


class Meter:
    """One response, watched (see the module docstring): :meth:`start` and :meth:`body` with each
    message the app sends, then :meth:`cost` when it ended and :meth:`produced` when it did not."""

    __slots__ = (
        "_body",
        "_buf",
        "_json",
        "_last",
        "_sse",
        "_too_big",
        "_usage",
        "events",
        "headers",
        "metering",
        "status",
    )

    def __init__(self, metering: Metering) -> None:
        self.metering = metering
        self.status = 0
        self.headers: dict[str, str] = {}
        self.events = 0
        self._sse = self._json = self._too_big = False
        self._buf = bytearray()
        self._body = bytearray()
        self._last: Any = None
        self._usage: int | None = None  # the last usage an event carried

    def start(self, message: Mapping[str, Any]) -> None:
        self.status = int(message.get("status", 200))
        for k, v in message.get("headers", []):
            self.headers[k.decode("latin-1").lower()] = v.decode("latin-1")
        media = self.headers.get("content-type", "").split(";")[0].strip().lower()
        self._sse = media == "text/event-stream"
        self._json = media == "application/json" or media.endswith("+json")

    def body(self, chunk: bytes) -> None:
        if self._sse:
            self._lines(chunk)
        elif self._json and not self._too_big:
            if len(self._body) + len(chunk) > self.metering.max_body:
                self._too_big = True
                self._body.clear()
            else:
                self._body += chunk

    def _lines(self, chunk: bytes) -> None:
        """Each complete line of the event stream; a line past ``max_event`` is dropped."""
        buf = self._buf
        buf += chunk
        while True:
            end = buf.find(b"\n")
            if end < 0:
                if len(buf) > self.metering.max_event:
                    buf.clear()
                    self._too_big = True  # the rest of this line is skipped
                return
            line = bytes(buf[:end]).rstrip(b"\r")
            del buf[: end + 1]
            if self._too_big:
                self._too_big = False
                continue
            if line.startswith(b"data:"):
                self._data(line[5:].strip())

    def _data(self, data: bytes) -> None:
        if not data or data == b"[DONE]":
            return
        self.events += 1
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if isinstance(obj, dict):
            self._last = obj
            usage = self.metering.usage(obj)
            if usage is not None:
                self._usage = usage

    def response(self) -> Response:
        body = bytes(self._body) if self._json and not self._too_big else None
        return Response(status=self.status, headers=self.headers, body=body, last_event=self._last, events=self.events)

    def cost(self) -> int | None:
        """The response's cost, once it has ended: the callable's, else the header's, else the
        usage in the last event that carried one or in the JSON body; None when none says.
        ValueError when the callable returns something other than None or a whole number of
        at least 0."""
        m = self.metering
        if m.cost is not None:
            c = m.cost(self.response())
            if c is not None:
                if _whole(c) is None:
                    raise ValueError(f"the cost callable returned {c!r}: a cost is a whole number of at least 0")
                return c
        header = self.header_cost()
        if header is not None:
            return header
        if self._usage is not None:
            return self._usage
        if self._json and not self._too_big and self._body:
            try:
                return m.usage(orjson.loads(bytes(self._body)))
            except orjson.JSONDecodeError:
                return None
        return None

    def produced(self, estimate: int | None) -> int | None:
        """What an answer that ended early produced (see the module docstring)."""
        known = self.header_cost()
        if known is not None:
            return known
        if self._usage is not None:
            return self._usage
        if self._sse:
            return self.events
        return estimate

    def header_cost(self) -> int | None:
        """The cost header's value: ASCII digits (at most 18), else None."""
        h = self.metering.header
        text = self.headers.get(h.lower()) if h is not None else None
        if text is None:
            return None
        text = text.strip()
        return int(text) if 0 < len(text) <= 18 and text.isascii() and text.isdigit() else None
