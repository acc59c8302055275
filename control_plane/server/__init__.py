"""The HTTP server: the app factory (:mod:`.app`), the hot path that answers plain decide
and authz requests before the framework (:mod:`.hotpath`), uvicorn's protocols with the
request-head bounds (:mod:`.serving`), the request size limits (:mod:`.limits`), the worker
processes of ``serve --workers`` (:mod:`.workers`) and the collector's tuning
(:mod:`.gctune`). Nothing here is imported by the rooms below it; ``create_app`` is
re-exported lazily (it pulls in FastAPI and the whole engine)."""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module 'control_plane.server' has no attribute {name!r}")
