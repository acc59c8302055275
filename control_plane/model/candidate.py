"""A candidate limit, pure: the limit a route might move to, evaluated in shadow beside the
one it enforces, and the gate before it takes over.

A route has at most one candidate: a distributed policy with an id of its own (its Redis
keys and counters are the candidate's, so the current limit's are untouched), when it was
set, by whom and why. It is kept in the runtime adjustments hash under
:func:`candidate_field` (a name no route can have), so the store restores it as it restores
the adjustments after Redis lost its data.

Each request of the route whose current global answer is known (enforce; a canary's share;
shadow, where the current global limit is itself evaluated in shadow) is also decided
under the candidate, later, on the shadow pipeline, and the two answers are compared:
**newly rejected** (the current limit admits, the candidate would refuse), **newly
admitted** (the reverse), or agreeing. :func:`candidate_gate` promotes it only after
``min_dwell_s`` since it was set, with enough comparisons, a small enough share of newly
rejected requests, few failed evaluations and few dropped ones (the rollout gate's
figures, :class:`~control_plane.model.rollout.GateConfig`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from limiter import Policy

from .rollout import GateConfig, GateResult, GateStats, figure_problems

__all__ = [
    "CANDIDATE_PREFIX",
    "Candidate",
    "CandidateDirection",
    "blocked_view_name",
    "candidate_field",
    "candidate_gate",
    "candidate_key_prefix",
    "route_of_field",
]

#: the adjustments hash's fields of candidates start with this (no route name can: route
#: names are printable, and \x01 is not)
CANDIDATE_PREFIX = "\x01candidate\x00"


class CandidateDirection:
    """How a candidate's answer compares with the current limit's."""

    AGREE = "agree"
    NEWLY_REJECTED = "newly_rejected"  # the current limit admits, the candidate would refuse
    NEWLY_ADMITTED = "newly_admitted"  # the current limit refuses, the candidate would admit
    ALL = (AGREE, NEWLY_REJECTED, NEWLY_ADMITTED)


def candidate_field(route: str) -> str:
    """The adjustments hash's field holding ``route``'s candidate."""
    return CANDIDATE_PREFIX + route


def route_of_field(name: str) -> str | None:
    """The route of a candidate's field, None for any other field."""
    return name[len(CANDIDATE_PREFIX) :] if name.startswith(CANDIDATE_PREFIX) else None


def candidate_key_prefix(cid: str) -> str:
    """The prefix of a candidate's bucket keys (before the route's own prefix and the key)."""
    return f"cand:{cid}:"


def blocked_view_name(route: str) -> str:
    """The would-be-blocked view of a route's candidate: the keys it would newly reject
    (``#`` is in no route name)."""
    return f"{route}#candidate"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A route's candidate limit (see the module docstring)."""

    route: str
    policy: Policy
    reason: str
    actor: str
    since: float  # wall-clock seconds (the caller's clock)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def to_json(self) -> str:
        return json.dumps(
            {
                "policy": self.policy.to_dict(),
                "reason": self.reason,
                "actor": self.actor,
                "since": self.since,
                "id": self.id,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, route: str, raw: str) -> Candidate:
        """Raises ``ValueError`` for anything that is not a candidate written by :meth:`to_json`."""
        try:
            d = json.loads(raw)
            p = d["policy"]
            policy = Policy(
                average=p["average"], period=p["period"], burst=p["burst"], algorithm=p.get("algorithm", "token_bucket")
            )
            return cls(route, policy, str(d["reason"]), str(d["actor"]), float(d["since"]), str(d["id"]))
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a candidate: {exc}") from None

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "policy": self.policy.to_dict(),
            "describe": self.policy.describe(),
            "since": self.since,
            "actor": self.actor,
            "reason": self.reason,
        }
        if now is not None:
            out["age_s"] = round(max(0.0, now - self.since), 1)
        return out


def candidate_gate(candidate: Candidate, stats: GateStats, config: GateConfig, *, now: float) -> GateResult:
    """May ``candidate`` become its route's limit at ``now``? ``stats`` are its comparisons
    since it was set (``new_rejections``: newly rejected; ``compared``: compared;
    ``backend_errors``: evaluations that failed; ``shadow_dropped``: dropped), judged as
    the rollout gate judges a promotion, and ``config.min_dwell_s`` since it was set."""
    in_step = max(0.0, now - candidate.since)
    reasons = figure_problems(stats, config, since=f"since the candidate was set {in_step:.0f}s ago")
    if in_step < config.min_dwell_s:
        reasons.append(
            f"the candidate was set {in_step:.0f}s ago, the minimum before promoting it is"
            f" {config.min_dwell_s:.0f}s (min_dwell; {config.min_dwell_s - in_step:.0f}s to go)"
        )
    return GateResult(not reasons, True, tuple(reasons), stats, config, in_step)
