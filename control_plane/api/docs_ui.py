"""``/docs`` (Swagger UI) and ``/redoc`` with their JavaScript, CSS and icon served by the
control plane itself, so the API docs work on a network without Internet access (FastAPI's
defaults load them from a CDN and show a blank page offline).

The files come from the ``fastapi-offline`` package (a dependency: Swagger UI 5, which
reads OpenAPI 3.1, and ReDoc 2), served from ``/docs/assets/<name>``; nothing else is
served from there. The pages are FastAPI's own (``get_swagger_ui_html``,
``get_redoc_html``) pointed at those URLs, with Google Fonts and Swagger UI's online
validator turned off. The routes are plain Starlette routes, outside the schema, and
open like the docs (``control_plane.auth.ACCESS``).
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse

__all__ = ["ASSETS", "ASSETS_PATH", "DOCS_URL", "REDOC_URL", "asset_dir", "install_docs"]

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
#: the route the assets are served from (its one parameter is the file name)
ASSETS_PATH = "/docs/assets/{name}"

#: every file served, with its media type
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}


def asset_dir() -> Path:
    """Where the installed ``fastapi-offline`` package keeps the files."""
    return Path(str(importlib.resources.files("fastapi_offline") / "static"))


def install_docs(app: FastAPI) -> None:
    """Add the docs pages and their assets to ``app`` (built with ``docs_url=None`` and
    ``redoc_url=None``). A missing asset is a startup error naming the file."""
    folder = asset_dir()
    missing = [name for name in ASSETS if not (folder / name).is_file()]
    if missing:
        raise RuntimeError(
            f"the API docs' files are missing from {folder}: {', '.join(missing)} (reinstall fastapi-offline)"
        )
    openapi_url = app.openapi_url or "/openapi.json"

    def asset_url(request: Request, name: str) -> str:
        return f"{request.scope.get('root_path', '').rstrip('/')}/docs/assets/{name}"

    async def swagger(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=root + OAUTH2_REDIRECT_URL,
            swagger_js_url=asset_url(request, "swagger-ui-bundle.js"),
            swagger_css_url=asset_url(request, "swagger-ui.css"),
            swagger_favicon_url=asset_url(request, "favicon.png"),
            # no badge fetched from the online validator
            swagger_ui_parameters={"validatorUrl": None},
        )

    async def oauth2_redirect(request: Request) -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_redoc_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=asset_url(request, "redoc.standalone.js"),
            redoc_favicon_url=asset_url(request, "favicon.png"),
            with_google_fonts=False,
        )

    async def asset(request: Request) -> FileResponse:
        name = request.path_params["name"]
        media = ASSETS.get(name)
        if media is None:
            raise HTTPException(404, f"no docs asset named {name!r}")
        return FileResponse(folder / name, media_type=media, headers={"Cache-Control": "public, max-age=86400"})

    app.add_route(DOCS_URL, swagger, include_in_schema=False)
    app.add_route(OAUTH2_REDIRECT_URL, oauth2_redirect, include_in_schema=False)
    app.add_route(REDOC_URL, redoc, include_in_schema=False)
    app.add_route(ASSETS_PATH, asset, include_in_schema=False)
