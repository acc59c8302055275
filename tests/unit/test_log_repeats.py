"""A log line any client can cause (uvicorn's ``Invalid HTTP request received.``) passes once
per window; the next one to pass says how many were left out; other lines are untouched."""

from __future__ import annotations

import logging

from control_plane.observe.logs import Repeats


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, msg, None, None)


def test_once_a_window_then_the_count_of_those_left_out():
    now = [0.0]
    f = Repeats(["Invalid HTTP request received."], window_s=60, clock=lambda: now[0])
    first = _record("Invalid HTTP request received.")
    assert f.filter(first) and first.getMessage() == "Invalid HTTP request received."
    assert [f.filter(_record("Invalid HTTP request received.")) for _ in range(500)] == [False] * 500
    assert f.filter(_record("something else")) is True
    now[0] = 61.0
    again = _record("Invalid HTTP request received.")
    assert f.filter(again)
    assert again.getMessage() == "Invalid HTTP request received. (500 more like it in the last 60 s, not logged)"
    assert f.filter(_record("Invalid HTTP request received.")) is False
