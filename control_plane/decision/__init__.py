"""Decisions: what goes in and out (:mod:`.types`), the rate-limit headers
(:mod:`.headers`), which answer counts (:mod:`.enforce`, pure), the per-route plan
(:mod:`.plan`), where comparisons are counted (:mod:`.compare`) and the one decision path
(:mod:`.decider`)."""

from .compare import Comparisons
from .decider import Decider, wall_clock_us
from .enforce import Path, failure_verdict, path_for, route_path
from .headers import rate_limit_headers
from .plan import RoutePlan, check_cost
from .shadow import CandidateItem, ShadowItem
from .types import (
    DecideError,
    DecideInput,
    DecideResult,
    ExpiredReservation,
    InputLike,
    InvalidCost,
    MissingTarget,
    PlainInput,
    UnknownReservation,
    UnknownRoute,
)

__all__ = [
    "CandidateItem",
    "Comparisons",
    "DecideError",
    "DecideInput",
    "DecideResult",
    "Decider",
    "ExpiredReservation",
    "InputLike",
    "InvalidCost",
    "MissingTarget",
    "Path",
    "PlainInput",
    "RoutePlan",
    "ShadowItem",
    "UnknownReservation",
    "UnknownRoute",
    "check_cost",
    "failure_verdict",
    "path_for",
    "rate_limit_headers",
    "route_path",
    "wall_clock_us",
]
