"""The rules file's one error type and how a field's path is shown in it.

Every problem in a rules file, from a YAML syntax error to a policy the limiter would refuse, is a
:class:`RulesError` naming the file, the line and the field::

    ValueError
     └── RulesError        rules.yaml:14: routes[1].local.burst: must be between 1 and 1000000000000, got 0

A field's path is a tuple of mapping keys and list indexes (:data:`FieldPath`), shown dotted by
:func:`field_name` (``("routes", 1, "local", "burst")`` is ``routes[1].local.burst``). Raw API keys
(map keys under ``overrides.api_keys``) are shown as their ``apikey:<32 hex>`` ids, never as typed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from limiter.keys import api_key_id

__all__ = ["API_KEY_ID", "FieldPath", "RulesError", "display_path", "field_name"]

API_KEY_ID = re.compile(r"apikey:[0-9a-f]{32}")
"""A ready-made API key id (what :func:`~limiter.keys.api_key_id` returns)."""

FieldPath = tuple[str | int, ...]
"""Where a value sits in the document: mapping keys and list indexes (``("routes", 0, "name")``)."""

_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


class RulesError(ValueError):
    """The rules file (or one of its values) is invalid.

    ``path`` is the file (None for text given directly), ``line`` the 1-based line
    (None when unknown), ``field`` the dotted field path (``routes[0].local.burst``;
    ``""`` for file-level problems) and ``message`` the bare reason.
    ``str(err)`` is ``"<path>:<line>: <field>: <message>"`` without the unknown parts
    (``"line 3: ..."`` when only the line is known).
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None, field: str = "") -> None:
        self.message = message
        self.path = path
        self.line = line
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        parts: list[str] = []
        if self.path is not None and self.line is not None:
            parts.append(f"{self.path}:{self.line}")
        elif self.path is not None:
            parts.append(self.path)
        elif self.line is not None:
            parts.append(f"line {self.line}")
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return ": ".join(parts)

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self) -> tuple[Callable[..., RulesError], tuple[str, str | None, int | None, str]]:
        # keep the keyword-only attributes across pickling
        return (_rebuild_rules_error, (self.message, self.path, self.line, self.field))

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "line": self.line, "field": self.field, "message": self.message, "error": str(self)}


def _rebuild_rules_error(message: str, path: str | None, line: int | None, field: str) -> RulesError:
    return RulesError(message, path=path, line=line, field=field)


def _format_path(path: FieldPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_NAME.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out


def _redact_api_key(raw: str) -> str:
    if API_KEY_ID.fullmatch(raw):
        return raw
    try:
        return api_key_id(raw)
    except ValueError:
        return "<api key>"


def display_path(path: FieldPath) -> FieldPath:
    """The path with raw API keys (map keys under ``overrides.api_keys``) shown as their ids."""
    out: list[str | int] = []
    for i, part in enumerate(path):
        if isinstance(part, str) and i >= 2 and path[i - 2 : i] == ("overrides", "api_keys"):
            part = _redact_api_key(part)
        out.append(part)
    return tuple(out)


def field_name(path: FieldPath) -> str:
    """The field as errors show it: ``routes[0].local.burst``, ``overrides.tenants["a b"]``."""
    return _format_path(display_path(path))
