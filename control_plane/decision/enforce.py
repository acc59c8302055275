"""Which answer counts, pure: the one place that says, for a route's mode, which limiter's
decision is enforced, how a pair of decisions is classified and what status a request
gets. Every decision goes through these functions (the decider asks them; nothing else
decides it again).

Decide first, enforce last (envoy's shadow mode): both limiters decide, then one answer
is picked:

==========  ==================================================  =======================
mode        distributed limiter                                 answer enforced
==========  ==================================================  =======================
off         not called                                          local
shadow      evaluated later, off the request path               local
canary p%   keys with ``canary_bucket < p``: on the request     distributed for the
            path; the others as in shadow                       share, local otherwise
enforce     on the request path                                 distributed
==========  ==================================================  =======================
"""

from __future__ import annotations

from enum import Enum

from limiter.resilience import Outcome

from ..model.rollout import Divergence, Mode, canary_bucket, classify

__all__ = ["Path", "Verdict", "classify", "failure_verdict", "path_for", "route_path"]


class Path(Enum):
    """What happens to a request after its local decision."""

    LOCAL = "local"  # the local answer counts, nothing is compared (mode off)
    SHADOW = "shadow"  # the local answer counts; the distributed one is evaluated later and compared
    DISTRIBUTED = "distributed"  # the distributed answer (or the failure policy) counts; both are compared


_FIXED = {Mode.OFF: Path.LOCAL, Mode.SHADOW: Path.SHADOW, Mode.ENFORCE: Path.DISTRIBUTED}


def route_path(mode: Mode) -> Path | None:
    """The path of every request of a route in ``mode``; None for canary (per key)."""
    return _FIXED.get(mode)


def path_for(mode: Mode, percent: int, route: str, key: str) -> Path:
    """The path of one request."""
    fixed = _FIXED.get(mode)
    if fixed is not None:
        return fixed
    return Path.DISTRIBUTED if canary_bucket(route, key) < percent else Path.SHADOW


class Verdict:
    """Status and rejection reason of an enforced answer (the metrics' labels)."""

    __slots__ = ()
    LOCAL_REJECTED = "local_exhausted"
    DISTRIBUTED_REJECTED = "distributed_exhausted"
    DENY_LIST = "deny_list"


def failure_verdict(outcome: Outcome) -> tuple[int, str]:
    """The status of a request the failure policy answered when it rejects it, and the
    rejection reason: ``failClosed``'s code, else 429; the fallback limiter's own
    rejection is ``fallback_exhausted``, a refusal for want of Redis ``backend_error``."""
    status = outcome.status_code if outcome.source == "fail_closed" else 429
    return status, "fallback_exhausted" if outcome.source == "fallback" else "backend_error"


def divergence_of(local_allowed: bool, distributed_allowed: bool) -> Divergence:
    """The pair's class (``local_allow_distributed_deny``: what enforcement would newly reject)."""
    return classify(local_allowed, distributed_allowed)
