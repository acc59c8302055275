"""What goes into a decision and what comes out of it, as records with named fields, and the
errors a request can be refused with, as types.

Errors (each names the ``field`` that is wrong; the HTTP API answers 4xx with it)::

    LookupError
     ├── UnknownRoute       no route by that name (404)
     ├── UnknownReservation a settle of a reservation nobody holds (404)
     └── ExpiredReservation a settle of one that expired first (409)
    ValueError
     ├── InvalidKeyError    (limiter.keys) a key that cannot be a bucket's (422 invalid_key)
     └── DecideError        a request the decider refuses (422 invalid_request)
          ├── InvalidCost   a cost above what the route's policies can ever admit; carries the
          │                 request's path, so a front end knows whether the refusal counts
          └── MissingTarget no route (or method + path), or no key (or client address + headers)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from limiter import Decision

from ..model.rollout import Divergence
from .enforce import Path

__all__ = [
    "DecideError",
    "DecideInput",
    "DecideResult",
    "ExpiredReservation",
    "InputLike",
    "InvalidCost",
    "MissingTarget",
    "PlainInput",
    "UnknownReservation",
    "UnknownRoute",
]


class UnknownRoute(LookupError):
    """No route by that name."""

    field = "route"

    def __init__(self, route: str) -> None:
        super().__init__(route)
        self.route = route


class UnknownReservation(LookupError):
    """A settle of a reservation neither this replica nor the distributed store holds (never
    made, or ended and forgotten)."""

    field = "reservation"


class ExpiredReservation(LookupError):
    """A settle of a reservation that expired first: ``fate`` says what became of its estimate
    (``charged``: kept spent, ``released``: given back)."""

    field = "reservation"

    def __init__(self, fate: str, estimate: int) -> None:
        super().__init__(fate)
        self.fate = fate
        self.estimate = estimate


class DecideError(ValueError):
    """A request the decider refuses: ``field`` names what is wrong, ``message`` says why
    (``str(err)`` is ``"<field>: <message>"``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class InvalidCost(DecideError):
    """A cost the route's policies cannot admit. ``path`` is the way the request would have
    gone (a shadowed one's refusal does not count, as its decision would not have)."""

    def __init__(self, message: str, path: Path) -> None:
        super().__init__("cost", message)
        self.path = path


class MissingTarget(DecideError):
    """A request that names no route (nor method + path) or no key (nor client + headers);
    ``str(err)`` is the message alone."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(field, message)
        self.args = (message,)

    def __str__(self) -> str:
        return self.message


class InputLike(Protocol):
    """What the decider reads of a request: a :class:`DecideInput`, or any object with these
    attributes (the HTTP API's validated body)."""

    @property
    def route(self) -> str | None: ...
    @property
    def method(self) -> str | None: ...
    @property
    def path(self) -> str | None: ...
    @property
    def key(self) -> str | None: ...
    @property
    def client_ip(self) -> str | None: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def cost(self) -> int: ...
    @property
    def request_id(self) -> str | None: ...
    @property
    def estimate(self) -> int | None: ...


@dataclass(slots=True, kw_only=True)
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
    estimate: int | None = None  # a reservation of this many units (the route's budget block), not a cost


#: A request as a tuple ``(route, key, cost, request_id)``: what
#: ``DecideInput(route=route, key=key, cost=cost, request_id=request_id)`` says, without
#: building the object (Envoy's descriptors, the middleware; a tuple of plain values also
#: drops out of the garbage collector's tracking, a DecideInput does not).
PlainInput = tuple[str, str, int, "str | None"]


@dataclass(slots=True, kw_only=True)
class DecideResult:
    """One decision: what counted and why.

    ``path`` is the way the request went (:class:`~.enforce.Path`): the local answer alone
    (off), the local answer with the distributed one evaluated aside (shadow, and the keys
    outside a canary's share: :attr:`shadowed`), or the distributed answer. ``enforced`` is the
    answer that counted and ``enforced_by`` whose it is (``local``, ``distributed``, or
    ``failure_policy`` when Redis failed); ``allowed`` and ``status_code`` follow from it.
    ``headers`` are the rate-limit headers, rendered only when the caller asked for them
    (empty otherwise). ``shadow_allowed`` is Redis's verdict on a shadowed request evaluated
    in the request path (None: not asked).

    Not frozen: one is built per request, and a frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__``."""

    route: str
    mode: str
    canary_percent: int
    key: str
    request_id: str
    path: Path
    enforced: Decision
    enforced_by: str  # local | distributed | failure_policy
    status_code: int
    local: Decision
    distributed: Decision | None = None
    divergence: Divergence | None = None
    headers: dict[str, str] = field(default_factory=dict)
    list_match: str | None = None  # allow | deny
    backend_error: str | None = None
    limits_source: str | None = None  # external | cache | stale | static, on routes with external limits
    backend_url: str | None = None  # from the limits service, allow-listed hosts only
    shadow_allowed: bool | None = None
    estimate: int | None = None  # a reservation's: its estimate, and its id when it was admitted
    reservation: str | None = None

    @property
    def allowed(self) -> bool:
        """Whether the answer that counted admits the request."""
        return self.enforced.allowed

    @property
    def shadowed(self) -> bool:
        """The local answer was given while the route's distributed one was evaluated aside:
        what Envoy's shadow mode answers OK whatever the limit says."""
        return self.path is Path.SHADOW

    def to_dict(self) -> dict[str, Any]:
        """The decision as the HTTP API sends it (a reservation's with its estimate and id)."""
        out = {
            "allowed": self.enforced.allowed,
            "route": self.route,
            "mode": self.mode,
            "canary_percent": self.canary_percent,
            "enforced_by": self.enforced_by,
            "key": self.key,
            "request_id": self.request_id,
            "status_code": self.status_code,
            "local": self.local.to_dict(),
            "distributed": None if self.distributed is None else self.distributed.to_dict(),
            "divergence": None if self.divergence is None else self.divergence.value,
            "list_match": self.list_match,
            "backend_error": self.backend_error,
            "limits_source": self.limits_source,
            "backend_url": self.backend_url,
            "headers": self.headers,
        }
        if self.estimate is not None:
            out["estimate"] = self.estimate
            out["reservation"] = self.reservation
        return out
