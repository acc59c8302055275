"""Dependencies: the engine, settings and the two bearer-token guards."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from ..engine import Engine
from ..settings import Settings


class ApiError(Exception):
    """An error with a status and a JSON body ``{"error", "message", ...details}``."""

    def __init__(self, status: int, error: str, message: str, **details: object) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message
        self.details = details


async def get_engine(request: Request) -> Engine:
    return request.app.state.engine  # type: ignore[no-any-return]


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def require_admin(request: Request) -> str:
    """Mutating endpoints: ``Authorization: Bearer <admin token>``, compared in constant time."""
    settings: Settings = request.app.state.settings
    if settings.admin_token is None or not settings.admin_token.get_secret_value():
        raise ApiError(403, "admin_disabled", "no admin token is configured (SHADOWLIMIT_ADMIN_TOKEN), so changes through the API are refused")
    token = _bearer(request)
    if token is None:
        raise ApiError(401, "unauthorized", "this endpoint needs Authorization: Bearer <admin token>")
    if not hmac.compare_digest(token.encode(), settings.admin_token.get_secret_value().encode()):
        raise ApiError(401, "unauthorized", "the admin token is not valid")
    return "admin"


async def require_client(request: Request) -> None:
    """The data plane: open on loopback unless SHADOWLIMIT_CLIENT_TOKEN is set."""
    settings: Settings = request.app.state.settings
    if settings.client_token is None or not settings.client_token.get_secret_value():
        return
    token = _bearer(request)
    secret = settings.client_token.get_secret_value().encode()
    admin = settings.admin_token.get_secret_value().encode() if settings.admin_token else None
    if token is None or not (hmac.compare_digest(token.encode(), secret) or (admin and hmac.compare_digest(token.encode(), admin))):
        raise ApiError(401, "unauthorized", "the decide endpoints need Authorization: Bearer <client token>")


def actor_of(request: Request) -> str:
    who = request.headers.get("x-shadowlimit-actor", "").strip()[:64]
    peer = request.client.host if request.client else "unknown"
    return f"{who or 'admin'}@{peer}"


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
AdminDep = Annotated[str, Depends(require_admin)]
ClientDep = Annotated[None, Depends(require_client)]
