"""HTTP API routers, combined in :func:`control_plane.app.create_app`."""
