"""The HTTP API: one router module per resource (``decide``, ``authz``, ``routes``,
``candidates``, ``plans``, ``admin``, ``observe``, ``external``, ``whatif``, ``health``,
``stream``), the dependencies they share
(:mod:`.deps`: ``ApiError`` and the ``Annotated`` aliases), the request and response models
(:mod:`.requests`, :mod:`.responses`, :mod:`.schemas`), the read models behind the route
and divergence views (:mod:`.readmodels`), the OpenAPI document and its offline docs pages
(:mod:`.openapi`, :mod:`.docs_ui`). Combined in :func:`control_plane.server.app.create_app`;
nothing is imported here, so a router is loaded only by the app that mounts it."""

from __future__ import annotations

#: the router modules (submodules: ``from control_plane.api import *`` loads them)
__all__ = [
    "admin", "authz", "candidates", "decide", "external", "health", "observe", "plans", "routes", "stream", "whatif",
]  # fmt: skip
