"""What-if replay, the pure part: recorded requests run through the limiters' own algorithm
functions (:mod:`limiter.algorithms`) under a candidate policy. No IO, no clock.

Each key's requests are replayed in timestamp order from a fresh bucket (the recording
starts somewhere; a bucket that expired is a fresh one too, so expiry needs no modelling).
A request whose cost is above what the policy can ever allow counts as rejected, as the
limiter refuses it. Every event carries the weight of its sampling (``1 / rate``): counts
are scaled by it, so a replay of a sampled recording estimates the whole route's traffic,
and says how much of it was recorded.

A budget route's recording also holds its charges (:class:`~limiter.policy.Charge` costs) and
its reservations and settles (:class:`Booked`, matched by a tag of the reservation's id):
:func:`replay_budget` runs them through :mod:`limiter.reservations` and :mod:`limiter.charges`,
each reserve of its estimate and each settle of its actual cost at the times they were made, and
counts the refused reserves and what their estimates would have held (``units``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from limiter import reservations
from limiter.algorithms import ALGORITHMS
from limiter.charges import charge
from limiter.policy import Charge, Policy, takes_charges
from limiter.reservations import Book, Terms

__all__ = ["Booked", "Event", "KeyFigures", "ReplayResult", "group_events", "replay", "replay_budget"]


@dataclass(frozen=True, slots=True)
class Booked:
    """A recorded reserve (``kind`` ``r``: its estimate) or settle (``s``: its actual cost) of a
    reservation, ``tag`` naming it (the first characters of its id's nonce). Recorded as
    ``r<amount>.<tag>`` and ``s<amount>.<tag>``."""

    kind: str
    amount: int
    tag: str

    def __str__(self) -> str:
        return f"{self.kind}{self.amount}.{self.tag}"


#: one recorded request: (timestamp in us, cost, weight = 1 / sampling rate); the cost is a
#: request's (an int), a charge's (:class:`Charge`) or a reservation's reserve or settle (:class:`Booked`)
Event = tuple[int, Any, float]


@dataclass(frozen=True, slots=True)
class KeyFigures:
    key: str
    requests: float  # scaled
    rejections: float  # scaled
    units: float = 0.0  # a budget replay's: what the refused reserves' estimates would have held (scaled)


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
                {
                    "key": k.key,
                    "requests": round(k.requests, 1),
                    "rejections": round(k.rejections, 1),
                    "units": round(k.units, 1),
                }
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
    takes = takes_charges(policy)
    rejected_at: dict[int, float] = {}  # minute -> rejections
    requests_at: dict[int, float] = {}  # minute -> requests
    figures: list[KeyFigures] = []
    events = 0
    total_req = total_rej = 0.0
    for key, evs in by_key.items():
        events += len(evs)
        evs = [e if e[1].__class__ is int else _as_request(e) for e in evs if not _is_settle(e[1])]
        req = sum([e[2] for e in evs])
        total_req += req
        for (m, w), n in Counter([(e[0] // 60_000_000, e[2]) for e in evs]).items():  # per minute and weight
            requests_at[m] = requests_at.get(m, 0.0) + n * w
        if unlimited:
            continue
        state: Any = None
        rej = 0.0
        for ts, cost, weight in evs:
            if cost.__class__ is Charge and takes:  # counted whatever is left (Envoy's hits); over if it did not fit
                decision, state = charge(state, ts, policy, cost)
                if decision.allowed:
                    continue
            elif cost <= limit:  # (a charge on a policy that takes none, the sliding log: a request of its cost)
                decision, state = fn(state, ts, policy, int(cost))
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


def _is_settle(cost: Any) -> bool:
    return cost.__class__ is Booked and cost.kind == "s"


def _as_request(e: Event) -> Event:
    """A reserve replayed as what a plain replay understands: a request of its estimate."""
    cost = e[1]
    return (e[0], cost.amount, e[2]) if cost.__class__ is Booked else e


def replay_budget(
    by_key: Mapping[str, Sequence[Event]], policy: Policy, terms: Terms, *, top: int = 10, recorded_share: float = 1.0
) -> ReplayResult:
    """Replay a budget route's recording under ``policy`` and its reservations' ``terms`` (see
    the module docstring): requests as decisions, charges landing whatever is left, each
    reserve of its estimate and each settle of its actual cost; the requests are the decisions,
    charges and reserves, the rejections the refused ones, ``units`` what they would have cost
    (a reserve's estimate)."""
    fn = ALGORITHMS[policy.algorithm]
    figures: list[KeyFigures] = []
    requests_at: dict[int, float] = {}
    rejected_at: dict[int, float] = {}
    events = 0
    total_req = total_rej = 0.0
    for key, evs in by_key.items():
        events += len(evs)
        state: Any = None
        book = Book.empty()
        req = rej = units = 0.0
        for ts, cost, weight in evs:
            m = ts // 60_000_000
            if cost.__class__ is Booked and cost.kind == "s":
                _, state, book = reservations.settle(state, book, ts, policy, rid=cost.tag, actual=cost.amount,
                                                     terms=terms)  # fmt: skip
                continue
            req += weight
            requests_at[m] = requests_at.get(m, 0.0) + weight
            if cost.__class__ is Charge:  # a request whose cost lands whatever is left: never refused
                _, state = charge(state, ts, policy, cost)
                continue
            if cost.__class__ is Booked:
                out, state, book = reservations.reserve(state, book, ts, policy, estimate=cost.amount, rid=cost.tag,
                                                        terms=terms)  # fmt: skip
                allowed = out.reserved
            elif cost <= policy.limit:
                d, state = fn(state, ts, policy, cost)
                allowed = d.allowed
            else:
                allowed = False
            if not allowed:
                rej += weight
                units += weight * (cost.amount if cost.__class__ is Booked else cost)
                rejected_at[m] = rejected_at.get(m, 0.0) + weight
        total_req += req
        total_rej += rej
        if rej:
            figures.append(KeyFigures(key, req, rej, units))
    figures.sort(key=lambda f: (-f.units, -f.rejections, f.key))
    minutes = [(m * 60, r, rejected_at.get(m, 0.0)) for m, r in sorted(requests_at.items())]
    return ReplayResult(
        policy=policy, events=events, requests=total_req, rejections=total_rej, top_keys=figures[:top],
        per_minute=minutes, recorded_share=recorded_share, keys=len(by_key),
    )  # fmt: skip
