"""The audit trail outside Redis: every audit entry this replica writes is also one JSON
line on the ``shadowlimit.audit`` logger and, with ``SHADOWLIMIT_AUDIT_LOG=/path``, one
line appended to that file, so the trail outlives the store.

Each entry is written by exactly one replica (the one that stored it), so the fleet's
logs together hold every entry once. Lines are appended with one ``write`` on a file
opened with ``O_APPEND`` (whole lines even when several processes share the file).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ..model.rollout import AuditEntry
from .logs import event_fields

__all__ = ["AUDIT_LOGGER", "AuditSink", "check_audit_path"]

AUDIT_LOGGER = "shadowlimit.audit"

log = logging.getLogger(AUDIT_LOGGER)
_errors = logging.getLogger("shadowlimit.engine")


def check_audit_path(path: Path) -> None:
    """Raise ``ValueError`` unless ``path`` can be appended to (created if missing)."""
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a file")
    if not path.parent.is_dir():
        raise ValueError(f"directory {path.parent} does not exist")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    except OSError as exc:
        raise ValueError(f"cannot append to {path}: {exc.strerror}") from None
    os.close(fd)


class AuditSink:
    """Writes audit entries to the log and, if configured, to an append-only file."""

    def __init__(self, instance_id: str, path: Path | None = None) -> None:
        self.instance_id = instance_id
        self.path = path
        self.written = 0
        self.errors = 0

    def fields(self, entry: AuditEntry, **extra: Any) -> dict[str, Any]:
        return {"instance": self.instance_id, **entry.to_dict(), **extra}

    def line(self, entry: AuditEntry, **extra: Any) -> str:
        return json.dumps(self.fields(entry, **extra), separators=(",", ":"), ensure_ascii=False, default=str)

    def emit(self, entry: AuditEntry, **extra: Any) -> None:
        """Log ``entry`` as one JSON line (``extra`` adds fields, e.g. ``stored=False``); with
        ``SHADOWLIMIT_LOG_FORMAT=json`` its fields are the log object's (``event: "audit"``)."""
        fields = self.fields(entry, **extra)
        text = json.dumps(fields, separators=(",", ":"), ensure_ascii=False, default=str)
        log.info(text, extra=event_fields("audit", **fields))
        if self.path is None:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                os.write(fd, (text + "\n").encode())
            finally:
                os.close(fd)
            self.written += 1
        except OSError as exc:
            self.errors += 1
            _errors.error("could not append to the audit log %s: %s (the entry is in the log above)", self.path, exc)
