"""What goes into a decision and what comes out of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from limiter import Decision

from ..model.rollout import Divergence

__all__ = ["DecideInput", "DecideResult", "PlainInput", "UnknownRoute", "result_dict"]


class UnknownRoute(LookupError):
    """No route by that name."""

    def __init__(self, route: str) -> None:
        super().__init__(route)
        self.route = route


@dataclass(slots=True)
class DecideInput:
    """One request to decide: a route by name (or method + path for the rules to match)
    and a key (or the client address and headers for the route's key strategy)."""

    route: str | None = None
    method: str | None = None
    path: str | None = None
    key: str | None = None
    client_ip: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    cost: int = 1
    request_id: str | None = None


#: A batch item as a tuple ``(route, key, cost, request_id)``: what
#: ``DecideInput(route=route, key=key, cost=cost, request_id=request_id)`` says, without
#: building the object (the batch endpoint's usual item; a tuple of plain values also
#: drops out of the garbage collector's tracking, a DecideInput does not).
PlainInput = tuple[str, str, int, "str | None"]


@dataclass(slots=True)
class DecideResult:
    """One decision: who enforced it, both limiters' answers, the status and headers.

    Not frozen: one is built per request, and a frozen dataclass's ``__init__`` sets each
    of these 18 fields through ``object.__setattr__`` (about 3 us a result, 10x a plain one)."""

    allowed: bool
    route: str
    mode: str
    canary_percent: int
    enforced_by: str  # local | distributed | failure_policy
    key: str
    local: Decision
    distributed: Decision | None
    divergence: Divergence | None
    status_code: int
    headers: dict[str, str]
    request_id: str
    list_match: str | None = None  # allow | deny
    backend_error: str | None = None
    limits_source: str | None = None  # external | cache | stale | static, on routes with external limits
    backend_url: str | None = None  # from the limits service, allow-listed hosts only
    enforced: Decision | None = None  # the answer that counted (local, distributed or the failure policy's)
    shadow_allowed: bool | None = None  # Redis's verdict on a shadowed request evaluated inline (None: not asked)

    def to_dict(self) -> dict[str, Any]:
        return result_dict(
            self.allowed,
            self.route,
            self.mode,
            self.canary_percent,
            self.enforced_by,
            self.key,
            self.request_id,
            self.status_code,
            self.local,
            self.distributed,
            self.divergence,
            self.list_match,
            self.backend_error,
            self.limits_source,
            self.backend_url,
            self.headers,
        )


def result_dict(
    allowed: bool,
    route: str,
    mode: str,
    canary_percent: int,
    enforced_by: str,
    key: str,
    request_id: str,
    status_code: int,
    local: Decision,
    distributed: Decision | None,
    divergence: Divergence | None,
    list_match: str | None,
    backend_error: str | None,
    limits_source: str | None,
    backend_url: str | None,
    headers: dict[str, str],
) -> dict[str, Any]:
    """A decision as the API sends it (the batch endpoint builds these without the object)."""
    return {
        "allowed": allowed,
        "route": route,
        "mode": mode,
        "canary_percent": canary_percent,
        "enforced_by": enforced_by,
        "key": key,
        "request_id": request_id,
        "status_code": status_code,
        "local": local.to_dict(),
        "distributed": None if distributed is None else distributed.to_dict(),
        "divergence": None if divergence is None else divergence.value,
        "list_match": list_match,
        "backend_error": backend_error,
        "limits_source": limits_source,
        "backend_url": backend_url,
        "headers": headers,
    }
