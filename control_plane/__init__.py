"""shadowlimit's control plane: shadow, measure, and roll out a global rate limit.

>>> from control_plane import create_app, load_settings
>>> app = create_app(load_settings())  # doctest: +SKIP

The public names are re-exported lazily so that importing a submodule (the CLI, the
settings) does not pull in FastAPI.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Engine",
    "Settings",
    "SettingsError",
    "ShadowLimitMiddleware",
    "create_app",
    "load_settings",
]


def package_version() -> str:
    """The installed shadowlimit's version ("unknown" for a checkout that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shadowlimit")
    except PackageNotFoundError:
        return "unknown"


_HOME = {
    "Engine": "engine",
    "Settings": "settings",
    "SettingsError": "settings",
    "ShadowLimitMiddleware": "middleware",
    "create_app": "server.app",
    "load_settings": "settings",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'control_plane' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{home}", __name__), name)
