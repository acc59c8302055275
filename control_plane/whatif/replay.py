"""What-if replay, the pure part: recorded requests run through the limiters' own algorithm
functions (:mod:`limiter.algorithms`) under a candidate policy. No IO, no clock.

Each key's requests are replayed in timestamp order from a fresh bucket (the recording
starts somewhere; a bucket that expired is a fresh one too, so expiry needs no modelling).
A request whose cost is above what the policy can ever allow counts as rejected, as the
limiter refuses it. Every event carries the weight of its sampling (``1 / rate``): counts
are scaled by it, so a replay of a sampled recording estimates the whole route's traffic,
and says how much of it was recorded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from limiter.algorithms import ALGORITHMS
from limiter.policy import Policy

__all__ = ["Event", "KeyFigures", "ReplayResult", "group_events", "replay"]

#: one recorded request: (timestamp in us, cost, weight = 1 / sampling rate)
Event = tuple[int, int, float]


@dataclass(frozen=True, slots=True)
class KeyFigures:
    key: str
    requests: float  # scaled
    rejections: float  # scaled


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    """A replay's figures (scaled by the sampling weights unless said otherwise)."""

    policy: Policy
    events: int  # recorded events replayed (not scaled)
    requests: float
    rejections: float
    top_keys: list[KeyFigures]
    per_minute: list[tuple[int, float, float]]  # (minute start, epoch s; requests; rejections)
    recorded_share: float  # of the route's requests in the replayed minutes, the share recorded
    keys: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def reject_share(self) -> float:
        return self.rejections / self.requests if self.requests else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.to_dict(),
            "policy_describe": self.policy.describe(),
            "events": self.events,
            "keys": self.keys,
            "requests": round(self.requests, 1),
            "rejections": round(self.rejections, 1),
            "reject_share": self.reject_share,
            "top_keys": [
                {"key": k.key, "requests": round(k.requests, 1), "rejections": round(k.rejections, 1)}
                for k in self.top_keys
            ],
            "per_minute": [
                {"minute": m, "requests": round(r, 1), "rejections": round(j, 1)} for m, r, j in self.per_minute
            ],
            "recorded_share": self.recorded_share,
        }


def group_events(rows: Iterable[tuple[str, int, int, float]]) -> dict[str, list[Event]]:
    """``(key, ts_us, cost, weight)`` rows into each key's events in timestamp order."""
    by_key: dict[str, list[Event]] = {}
    for key, ts, cost, weight in rows:
        evs = by_key.get(key)
        if evs is None:
            evs = by_key[key] = []
        evs.append((ts, cost, weight))
    for evs in by_key.values():
        evs.sort(key=_ts)  # stable: requests of the same microsecond stay in recorded order
    return by_key


def _ts(e: Event) -> int:
    return e[0]


def replay(
    by_key: Mapping[str, Sequence[Event]], policy: Policy, *, top: int = 10, recorded_share: float = 1.0
) -> ReplayResult:
    """Replay every key's events under ``policy`` (see the module docstring)."""
    fn = ALGORITHMS[policy.algorithm]
    limit = policy.limit
    unlimited = policy.unlimited
    rejected_at: dict[int, float] = {}  # minute -> rejections
    requests_at: dict[int, float] = {}  # minute -> requests
    figures: list[KeyFigures] = []
    events = 0
    total_req = total_rej = 0.0
    for key, evs in by_key.items():
        events += len(evs)
        req = sum([e[2] for e in evs])
        total_req += req
        for (m, w), n in Counter([(e[0] // 60_000_000, e[2]) for e in evs]).items():  # per minute and weight
            requests_at[m] = requests_at.get(m, 0.0) + n * w
        if unlimited:
            continue
        state: Any = None
        rej = 0.0
        for ts, cost, weight in evs:
            if cost <= limit:
                decision, state = fn(state, ts, policy, cost)
                if decision.allowed:
                    continue
            rej += weight
            m = ts // 60_000_000
            rejected_at[m] = rejected_at.get(m, 0.0) + weight
        total_rej += rej
        if rej:
            figures.append(KeyFigures(key, req, rej))
    figures.sort(key=lambda f: (-f.rejections, -f.requests, f.key))
    minutes = [(m * 60, r, rejected_at.get(m, 0.0)) for m, r in sorted(requests_at.items())]
    return ReplayResult(
        policy=policy,
        events=events,
        requests=total_req,
        rejections=total_rej,
        top_keys=figures[:top],
        per_minute=minutes,
        recorded_share=recorded_share,
        keys=len(by_key),
    )
