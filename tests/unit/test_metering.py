"""What a response cost, read as it passes (control_plane/metering.py): the usage of an event
stream's last event or a JSON body, a header, a callable; what an answer that ended early
produced; and every read bounded, whatever the app sends."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.metering import Meter, Metering, Response, usage_of


def _start(meter: Meter, content_type: str | None, **headers: str) -> None:
    raw = [(b"content-type", content_type.encode())] if content_type else []
    raw += [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    meter.start({"type": "http.response.start", "status": 200, "headers": raw})


def _events(*objs: Any, done: bool = True) -> bytes:
    out = b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs)
    return out + (b"data: [DONE]\n\n" if done else b"")


def _chunk(i: int) -> dict[str, Any]:
    return {"id": "c", "choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}


def test_the_usage_of_an_openai_style_answer():
    assert usage_of({"usage": {"total_tokens": 42, "prompt_tokens": 1, "completion_tokens": 2}}) == 42
    assert usage_of({"usage": {"prompt_tokens": 10, "completion_tokens": 32}}) == 42
    assert usage_of({"usage": {"input_tokens": 40, "output_tokens": 2}}) == 42  # Anthropic-style
    assert usage_of({"usage": {"total_tokens": 0}}) == 0
    for no in (
        {},
        {"usage": None},
        {"usage": 42},
        {"usage": {"total_tokens": -1}},
        {"usage": {"total_tokens": "42"}},
        {"usage": {"total_tokens": True}},
        {"usage": {"total_tokens": 4.2}},
        {"usage": {"prompt_tokens": 10}},
        [1, 2],
        "usage",
    ):
        assert usage_of(no) is None, no


def test_an_event_streams_last_usage_is_its_cost_however_the_stream_is_cut():
    stream = _events(
        *(_chunk(i) for i in range(5)), {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}
    )
    stream = stream.replace(b"\n\n", b"\r\n\r\n", 2)  # CRLF line ends too
    for size in (1, 2, 3, 7, 64, len(stream)):
        meter = Meter(Metering())
        _start(meter, "text/event-stream; charset=utf-8")
        for i in range(0, len(stream), size):
            meter.body(stream[i : i + size])
        assert meter.cost() == 12 and meter.events == 6, size


def test_a_json_answers_usage_is_its_cost():
    meter = Meter(Metering())
    _start(meter, "application/json")
    body = json.dumps({"choices": [], "usage": {"total_tokens": 99}}).encode()
    meter.body(body[:10])
    meter.body(body[10:])
    assert meter.cost() == 99
    problem = Meter(Metering())
    _start(problem, "application/problem+json")
    problem.body(b'{"usage": {"total_tokens": 3}}')
    assert problem.cost() == 3


def test_the_header_wins_over_the_usage_and_the_callable_over_both():
    meter = Meter(Metering())
    _start(meter, "application/json", x_usage_tokens=" 250 ")
    meter.body(b'{"usage": {"total_tokens": 99}}')
    assert meter.cost() == 250
    seen: list[Response] = []

    def cost(r: Response) -> int | None:
        seen.append(r)
        return 7 if r.status == 200 else None

    called = Meter(Metering(cost=cost, header="X-Cost"))
    _start(called, "application/json", x_cost="5")
    called.body(b'{"usage": {"total_tokens": 99}}')
    assert called.cost() == 7
    assert seen[0].headers["x-cost"] == "5" and json.loads(seen[0].body or b"") == {"usage": {"total_tokens": 99}}
    declined = Meter(Metering(cost=lambda r: None, header="X-Cost"))
    _start(declined, "application/json", x_cost="5")
    assert declined.cost() == 5  # the callable said nothing: the header


@pytest.mark.parametrize("value", ["", "abc", "12abc", "-5", "+5", "1.5", "\u00b2", "1" * 19, "0x10", "1 2"])
def test_a_header_that_is_not_a_whole_number_is_no_cost(value):
    meter = Meter(Metering())
    meter.start(
        {"type": "http.response.start", "status": 200, "headers": [(b"x-usage-tokens", value.encode("latin-1"))]}
    )
    assert meter.header_cost() is None and meter.cost() is None


def test_without_a_usage_an_answer_has_no_cost():
    for content_type, body in (
        ("application/json", b'{"choices": []}'),
        ("application/json", b"not json"),
        ("text/plain", b'{"usage": {"total_tokens": 3}}'),  # not JSON by its type: never read
        (None, b""),
        ("text/event-stream", _events(_chunk(0), {"usage": {}})),
    ):
        meter = Meter(Metering())
        _start(meter, content_type)
        meter.body(body)
        assert meter.cost() is None, (content_type, body)


def test_what_an_answer_that_ended_early_produced():
    sse = Meter(Metering())
    _start(sse, "text/event-stream")
    sse.body(_events(*(_chunk(i) for i in range(9)), done=False) + b'data: {"partial')
    assert sse.produced(500) == 9  # one a data event, the partial line not among them
    known = Meter(Metering())
    _start(known, "text/event-stream", x_usage_tokens="40")
    known.body(_events(_chunk(0), done=False))
    assert known.produced(500) == 40  # the header said it up front
    usage = Meter(Metering())
    _start(usage, "text/event-stream")
    usage.body(_events(_chunk(0), {"usage": {"total_tokens": 31}}, _chunk(1), done=False))
    assert usage.produced(500) == 31
    unknown = Meter(Metering())
    _start(unknown, "application/json")
    unknown.body(b'{"choi')
    assert unknown.produced(500) == 500 and unknown.produced(None) is None  # nothing learnt: the estimate kept
    never = Meter(Metering())  # the app failed before it started the answer
    assert never.produced(500) == 500 and never.produced(None) is None


def test_a_json_body_past_its_bound_is_not_kept():
    meter = Meter(Metering(max_body=1000))
    _start(meter, "application/json")
    body = json.dumps({"pad": "x" * 2000, "usage": {"total_tokens": 5}}).encode()
    for i in range(0, len(body), 100):
        meter.body(body[i : i + 100])
    assert meter.cost() is None and meter.response().body is None and len(meter._body) == 0


def test_an_event_line_past_its_bound_is_skipped_and_never_buffered_whole():
    meter = Meter(Metering(max_event=1024))
    _start(meter, "text/event-stream")
    tracemalloc.start()
    try:
        meter.body(b'data: {"junk": "')
        for _ in range(10_000):  # 10 MB of one line, in 1 KiB pieces
            meter.body(b"x" * 1024)
            assert len(meter._buf) <= 2048
        meter.body(b'"}\n\n')
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024
    meter.body(_events(_chunk(1), {"usage": {"total_tokens": 8}}))
    assert meter.cost() == 8 and meter.events == 2  # the stream goes on being read after it


@given(st.lists(st.binary(max_size=200), max_size=50))
def test_any_bytes_are_read_without_an_error(chunks):
    for content_type in ("text/event-stream", "application/json"):
        meter = Meter(Metering(max_event=256, max_body=512))
        _start(meter, content_type)
        for c in chunks:
            meter.body(c)
        cost = meter.cost()
        assert cost is None or cost >= 0
        assert meter.produced(3) is not None
