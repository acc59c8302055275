"""The service's own log lines on stderr (``SHADOWLIMIT_LOG_FORMAT``):

- ``text`` (the default): ``<time> <LEVEL> <logger>: <message>``; the audit trail (logger
  ``shadowlimit.audit``) as bare JSON lines, one entry each.
- ``json``: one JSON object per line (python-json-logger) for every logger, uvicorn's included:
  ``time``, ``level``, ``logger``, ``message`` and the record's structured fields. Operational
  events carry ``event`` (``mode_change``, ``rules_reloaded``, ``rules_rejected``,
  ``auto_rollback``, ``breaker``) and their figures, so a log pipeline can filter on them; an
  audit entry is one object with ``event: "audit"`` and the entry's fields at the top level.

Code logs events with :func:`event_fields`: ``log.info("...", extra=event_fields("rules_reloaded",
routes=3))``; the text format shows only the message.

A line any client can cause at will (uvicorn's ``Invalid HTTP request received.``: garbage, or
TLS sent to a cleartext port) is logged once a minute at most, the next one saying how many
were left out (:func:`quiet_repeats`): an attack cannot fill the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from pythonjsonlogger.json import JsonFormatter

__all__ = ["CLIENT_MADE", "LOG_FORMATS", "Repeats", "configure_logging", "event_fields", "quiet_repeats"]

#: uvicorn's lines that a client makes at will, by logger
CLIENT_MADE = {"uvicorn.error": ("Invalid HTTP request received.",)}

LOG_FORMATS = ("text", "json")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_FIELDS = "sl_fields"  # the record attribute holding an event's structured fields


def event_fields(event: str, **fields: Any) -> dict[str, Any]:
    """``extra=`` for a log call that is an operational event (see the module docstring)."""
    return {_FIELDS: {"event": event, **fields}}


class _Json(JsonFormatter):
    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            datefmt="%Y-%m-%dT%H:%M:%S%z",
            json_ensure_ascii=False,
        )

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        super().add_fields(log_data, record, message_dict)
        log_data.pop("color_message", None)  # uvicorn's copy of the message with terminal colours
        extra = log_data.pop(_FIELDS, None)
        if isinstance(extra, dict):
            if extra.get("event") == "audit":
                log_data.pop("message", None)  # the text format's line: the same fields as JSON text
            log_data.update(extra)


def _handler(formatter: logging.Formatter) -> logging.Handler:
    h = logging.StreamHandler()
    h.setFormatter(formatter)
    return h


def configure_logging(level: str, fmt: str = "text") -> None:
    """Install the handlers (once per process): ``shadowlimit.*`` at ``level``, the audit
    trail always; in ``json``, uvicorn's loggers too (they keep their own lines in ``text``)."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {fmt!r}")
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    as_json = fmt == "json"
    root = logging.getLogger("shadowlimit")
    if not root.handlers:
        root.addHandler(_handler(_Json() if as_json else logging.Formatter(_TEXT)))
        root.setLevel(lvl)
        root.propagate = False
    audit = logging.getLogger("shadowlimit.audit")
    if not audit.handlers:
        audit.addHandler(_handler(_Json() if as_json else logging.Formatter("%(message)s")))
        audit.setLevel(logging.INFO)
        audit.propagate = False
    if as_json:
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
            lg = logging.getLogger(name)
            lg.handlers = [_handler(_Json())]
            lg.propagate = False


class Repeats(logging.Filter):
    """Each of ``messages`` (a log call's format string) once per ``window_s`` at most; the
    next one that passes says how many were left out meanwhile."""

    def __init__(
        self, messages: Iterable[str], window_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.messages = frozenset(messages)
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[str, tuple[float, int]] = {}  # message -> (when it last passed, left out since)

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if not isinstance(msg, str) or msg not in self.messages:
            return True
        now = self._clock()
        passed, dropped = self._seen.get(msg, (float("-inf"), 0))
        if now - passed < self.window_s:
            self._seen[msg] = (passed, dropped + 1)
            return False
        self._seen[msg] = (now, 0)
        if dropped:
            record.msg = f"{msg} ({dropped} more like it in the last {self.window_s:g} s, not logged)"
        return True


def quiet_repeats(window_s: float = 60.0) -> None:
    """:class:`Repeats` on the loggers of :data:`CLIENT_MADE` (after uvicorn set its logging up)."""
    for name, messages in CLIENT_MADE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, Repeats) for f in logger.filters):
            logger.addFilter(Repeats(messages, window_s))
