"""How the store reads and writes its values: namespaces, Redis replies, JSON, audit entries."""

from __future__ import annotations

import json
import re
from typing import Any

from ..model.rollout import AuditEntry

__all__ = ["audit_entry_from_dict", "check_namespace", "dumps", "text"]

_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_namespace(namespace: str) -> str:
    """``namespace`` if it is 1-64 letters, digits, ``_``, ``.`` or ``-``; else ``ValueError``."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise ValueError(f"namespace: must be 1-64 characters of letters, digits, '_', '.', '-', got {namespace!r}")
    return namespace


def text(v: Any) -> str:
    """A Redis reply value as text (bytes decoded as UTF-8, undecodable bytes replaced)."""
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)


def dumps(obj: Any) -> str:
    """Compact JSON, non-ASCII kept as is (what the Lua scripts receive)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def audit_entry_from_dict(d: dict[str, Any], id: str | None = None) -> AuditEntry:
    """Inverse of :meth:`AuditEntry.to_dict` (``id`` overrides the dict's id)."""
    return AuditEntry(
        route=str(d.get("route", "")),
        actor=str(d.get("actor", "")),
        from_mode=str(d.get("from", "")),
        to_mode=str(d.get("to", "")),
        reason=str(d.get("reason", "")),
        at=float(d.get("at", 0.0)),
        from_percent=int(d.get("from_percent", 0)),
        to_percent=int(d.get("to_percent", 0)),
        forced=bool(d.get("forced", False)),
        automatic=bool(d.get("automatic", False)),
        gate=d.get("gate"),
        kind=d.get("kind", "mode_change"),
        id=id if id is not None else str(d.get("id", "")),
    )
