"""Loading rules: from YAML text (:func:`parse_rules`), from the file (:func:`load_rules`).

Both read the whole document before returning anything: the result is a complete
:class:`~control_plane.rules.model.Rules` or a :class:`~control_plane.rules.errors.RulesError`.
``clock`` (wall-clock seconds, :func:`time.time` by default) stamps ``Rules.loaded_at``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .document import read_document
from .errors import RulesError
from .model import Rules, default_route
from .yaml_source import decode_file, gc_paused, load_yaml, read_file

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["load_rules", "parse_rules", "rules_from_bytes"]


def _parse(text: str, settings: Settings, source: str | None, digest: str, clock: Callable[[], float]) -> Rules:
    with gc_paused():  # the collector would walk a big file's growing data again and again
        data, lines = load_yaml(text, source)
        routes, redefined = read_document(data, lines, source, settings)
    return Rules(
        routes=tuple(routes),
        default=redefined if redefined is not None else default_route(settings),
        source=source,
        loaded_at=clock(),
        digest=digest,
    )


def parse_rules(
    text: str, settings: Settings, *, source: str | None = None, clock: Callable[[], float] = time.time
) -> Rules:
    """Parse rules from YAML text; raises :class:`RulesError` (``source`` names the file)."""
    if not isinstance(text, str):
        raise RulesError(f"expected YAML text, got {type(text).__name__}", path=source)
    return _parse(text, settings, source, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), clock)


def rules_from_bytes(
    data: bytes, settings: Settings, source: str, *, digest: str | None = None, clock: Callable[[], float] = time.time
) -> Rules:
    """Parse a rules file's bytes (``digest``: their SHA-256 hex digest, if already known)."""
    if digest is None:
        digest = hashlib.sha256(data).hexdigest()
    return _parse(decode_file(data, source), settings, source, digest, clock)


def load_rules(path: str | Path | None, settings: Settings, *, clock: Callable[[], float] = time.time) -> Rules:
    """Load the rules file (``None``: only the built-in default route)."""
    if path is None or str(path).strip() == "":
        return Rules(routes=(), default=default_route(settings), source=None, loaded_at=clock(), digest="builtin")
    p = Path(path)
    return rules_from_bytes(read_file(p), settings, str(p), clock=clock)
