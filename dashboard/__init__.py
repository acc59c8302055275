"""The shadowlimit terminal dashboard: talks to the control plane over HTTP only.

``dashboard.client`` (httpx + typed views) can be used without importing Textual.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ShadowlimitDashboard", "run_dashboard"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module 'dashboard' has no attribute {name!r}")
