"""Dependencies: the part of the engine each router uses, the caller's identity (checked by
the auth gate) and the audit trail's actor."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Request

from ..auth import Identity, Role
from ..engine import Engine
from ..external import ExternalManager
from ..live_rules import LiveRules
from ..observe.activity import Activity
from ..observe.metrics import Metrics
from ..observe.views import FleetViews
from ..rollout.adjustments import Adjustments
from ..rollout.candidates import Candidates
from ..rollout.manager import RolloutManager
from ..rollout.plans import Plans
from ..store import RolloutStore


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


async def get_rollout(request: Request) -> RolloutManager:
    return request.app.state.engine.rollout  # type: ignore[no-any-return]


async def get_rules(request: Request) -> LiveRules:
    return request.app.state.engine.live_rules  # type: ignore[no-any-return]


async def get_views(request: Request) -> FleetViews:
    return request.app.state.engine.views  # type: ignore[no-any-return]


async def get_activity(request: Request) -> Activity:
    return request.app.state.engine.activity  # type: ignore[no-any-return]


async def get_adjustments(request: Request) -> Adjustments:
    return request.app.state.engine.adjustments  # type: ignore[no-any-return]


async def get_candidates(request: Request) -> Candidates:
    return request.app.state.engine.candidates  # type: ignore[no-any-return]


async def get_plans(request: Request) -> Plans:
    return request.app.state.engine.plans  # type: ignore[no-any-return]


async def get_external(request: Request) -> ExternalManager:
    return request.app.state.engine.external  # type: ignore[no-any-return]


async def get_store(request: Request) -> RolloutStore:
    return request.app.state.engine.store  # type: ignore[no-any-return]


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.engine.metrics  # type: ignore[no-any-return]


def identity_of(request: Request) -> Identity | None:
    """The caller the auth gate (:class:`control_plane.auth.AuthGate`) identified, if any."""
    ident = request.scope.get("state", {}).get("identity")
    return ident if isinstance(ident, Identity) else None


def requires(role: Role) -> Callable[[Request], Awaitable[Identity]]:
    """A dependency: the caller's identity, which the auth gate has already checked has
    ``role`` before the body was read. Without one (the gate not installed) the call is
    refused, never let through."""

    async def dependency(request: Request) -> Identity:
        ident = identity_of(request)
        if ident is None or not ident.may(role):
            raise ApiError(
                401,
                "unauthorized",
                f"this endpoint needs Authorization: Bearer <token> with the {role.value} role",
                needs=role.value,
            )
        return ident

    return dependency


def gate_failed(gate: Any) -> ApiError:
    """A promotion the gate refused: a 409 with its reasons and figures."""
    return ApiError(
        409,
        "gate_failed",
        "promotion refused by the gate: " + "; ".join(gate.reasons) + " (use force with a reason to override)",
        gate=gate.to_dict(),
    )


def actor_of(request: Request) -> str:
    """The audit trail's actor: the token's (or client certificate's) name and the peer
    address, and the certificate's name when the identity came from one; the optional
    ``X-Shadowlimit-Actor`` header only adds a note (it cannot change who acted)."""
    ident = identity_of(request)
    name = ident.name if ident is not None else "anonymous"
    peer = request.client.host if request.client else "unknown"
    note = "".join(c for c in request.headers.get("x-shadowlimit-actor", "")[:64] if c.isprintable()).strip()
    via = f" (certificate {ident.certificate})" if ident is not None and ident.certificate else ""
    return f"{name}@{peer}{via}" + (f" (note: {note})" if note and note != name else "")


EngineDep = Annotated[Engine, Depends(get_engine)]
RolloutDep = Annotated[RolloutManager, Depends(get_rollout)]
RulesDep = Annotated[LiveRules, Depends(get_rules)]
ViewsDep = Annotated[FleetViews, Depends(get_views)]
ActivityDep = Annotated[Activity, Depends(get_activity)]
AdjustmentsDep = Annotated[Adjustments, Depends(get_adjustments)]
CandidatesDep = Annotated[Candidates, Depends(get_candidates)]
PlansDep = Annotated[Plans, Depends(get_plans)]
ExternalDep = Annotated[ExternalManager, Depends(get_external)]
StoreDep = Annotated[RolloutStore, Depends(get_store)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
OperatorDep = Annotated[Identity, Depends(requires(Role.OPERATOR))]
AdminDep = Annotated[Identity, Depends(requires(Role.ADMIN))]
