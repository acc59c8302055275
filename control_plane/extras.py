"""The optional parts of shadowlimit, installed as extras: ``shadowlimit[dashboard]`` (the
terminal dashboard, Textual) and ``shadowlimit[envoy]`` (Envoy's rate limit service over gRPC).
``pip install shadowlimit`` is enough to ``shadowlimit serve`` the HTTP API; a command that needs
a part that is not installed says which extra to install.

>>> missing_modules("envoy")  # doctest: +SKIP
['grpc_health']
>>> require_extra("dashboard", "shadowlimit dash")  # doctest: +SKIP
Traceback (most recent call last):
MissingExtra: shadowlimit dash needs the dashboard extra (textual is not installed): pip install ...
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRAS", "MissingExtra", "missing_modules", "require_extra"]

#: extra -> the modules it brings that shadowlimit imports (pyproject.toml's optional dependencies)
EXTRAS: dict[str, tuple[str, ...]] = {
    "dashboard": ("textual",),
    "envoy": (
        "h2",
        "hpack",
        "grpc",
        "grpc_health.v1",
        "grpc_reflection.v1alpha",
        "google.protobuf",
        "envoy.service.ratelimit.v3",
    ),
}


class MissingExtra(RuntimeError):
    """A command needs an extra that is not installed; the message names it and how to install it."""

    def __init__(self, extra: str, what: str, missing: list[str]) -> None:
        self.extra = extra
        self.missing = missing
        verb = "is" if len(missing) == 1 else "are"
        super().__init__(
            f"{what} needs the {extra} extra ({', '.join(missing)} {verb} not installed):"
            f" pip install 'shadowlimit[{extra}]'"
        )


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (none when it is installed)."""
    return [name for name in EXTRAS[extra] if not _importable(name)]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package is missing (envoy.service... without xds-protos)
        return False


def require_extra(extra: str, what: str) -> None:
    """Raise :class:`MissingExtra` naming ``extra`` when a module of it is missing; ``what``
    names what needs it (a command, a setting)."""
    missing = missing_modules(extra)
    if missing:
        raise MissingExtra(extra, what, missing)
