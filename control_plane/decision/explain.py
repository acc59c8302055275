"""Divergence explained by cause, on the shadow pipeline (off the request path): the figures
:func:`~control_plane.model.causes.cause_of` needs, gathered for each divergent decision.

The *reference* is the route's local policy evaluated fleet-wide in Redis beside the global
one, under its own keys (:data:`REFERENCE_PREFIX` + the bucket's key; ``#`` is in no route
name, so no bucket key starts with it), in the same burst as the shadow evaluation: it answers
"would the old limit have stopped this client had the fleet been one replica?". Only a global
limit stricter than the local one needs that answer
(:func:`~control_plane.model.causes.needs_reference`); under any other, the reference is not
evaluated and a new rejection is ``replicas``. (So after a route's global limit becomes
stricter, its reference buckets start unused: for one refill time some new rejections the old
limit would have made are counted ``tighter``.)

A replica's bucket that is young (``fresh_local``) needs one more figure: whether the global
state remembered earlier use when the bucket was made. The bucket's first request (its
``now_us`` is the bucket's ``created_us``) has its global answer asked in full
(``compare_many(decisions=...)``) and compared with a new key's answer
(:func:`~control_plane.model.causes.remembers`); the result is kept per bucket
(:attr:`Explainer.births`, bounded) for the divergences that follow.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from limiter import Decision, LocalLimiter
from limiter.algorithms import decide

from ..model.causes import Birth, Cause, CauseFigures, cause_of, is_fresh, remembers

if TYPE_CHECKING:
    from ..observe.clock import ClockSkew
    from .shadow import ShadowItem

__all__ = ["BIRTHS_KEPT", "REFERENCE_PREFIX", "Explainer"]

#: the reference's bucket keys: this + the bucket's own (``<route>:<key>``)
REFERENCE_PREFIX = "#ref:"
#: buckets whose first global answer is remembered (the oldest forgotten first)
BIRTHS_KEPT = 65_536


class Explainer:
    """What the shadow pipeline asks to explain a divergence: the local store's births, this
    replica's clock offset, the fleet's size and whether it was deciding a route before a
    moment (``fleet_before(route, unix seconds)``)."""

    def __init__(
        self,
        *,
        local: LocalLimiter,
        skew: ClockSkew,
        caller_clock: bool,
        fleet_size: Callable[[], int] = lambda: 1,
        fleet_before: Callable[[str, float], bool] = lambda route, t: False,
        births_kept: int = BIRTHS_KEPT,
    ) -> None:
        self.local = local
        self.skew = skew
        self.caller_clock = caller_clock
        self.fleet_size = fleet_size
        self.fleet_before = fleet_before
        self.births_kept = births_kept
        #: bucket key -> (its created_us, the global state remembered earlier use then)
        self.births: OrderedDict[str, tuple[int, bool]] = OrderedDict()

    def first_requests(self, batch: list[ShadowItem], main: dict[int, int]) -> set[int]:
        """The requests (indexes into the burst: ``main`` maps a batch index to its request's)
        whose global answer is wanted in full: explained buckets' first requests. A first
        request whose global answer is already known (decided on the request path) is
        learnt from at once."""
        full: set[int] = set()
        seen: set[str] = set()
        births = self.births
        for i, item in enumerate(batch):
            lkey, _, _, now_us = item.request
            if item.ref is None or lkey is None or lkey in seen:
                continue
            born = self.local.birth(lkey)
            if born is None or born[0] != now_us:
                continue
            known = births.get(lkey)
            if known is not None and known[0] == born[0]:
                continue  # another request of the same microsecond came first
            seen.add(lkey)
            if item.known is not None:
                self.learn(item, item.known)
            elif i in main:
                full.add(main[i])
        return full

    def learn(self, item: ShadowItem, answer: Decision) -> None:
        """A bucket's first request got ``answer`` from the global limiter: remember whether
        that shows earlier use."""
        lkey, policy, cost, now_us = item.request
        assert lkey is not None and policy is not None
        fresh, _ = decide(None, now_us, policy, cost)
        births = self.births
        births[lkey] = (now_us, remembers(answer, fresh, policy.algorithm))
        births.move_to_end(lkey)
        while len(births) > self.births_kept:
            births.popitem(last=False)

    def cause(self, item: ShadowItem, global_allowed: bool, reference_allowed: bool | None) -> Cause | None:
        """The cause of an explained request's divergence (None: not explained)."""
        lkey, policy, _, now_us = item.request
        assert item.ref is not None and policy is not None and lkey is not None
        born = self.local.birth(lkey)
        birth = None if born is None else Birth(created_us=born[0], forgot_us=born[1])
        kept = self.births.get(lkey)
        remembered = birth is not None and kept is not None and kept[0] == birth.created_us and kept[1]
        # whether the fleet decided the route before, read only for a bucket that may be fresh
        fresh = remembered and birth is not None and is_fresh(birth, now_us, item.ref)
        figures = CauseFigures(
            local_allowed=item.local_allowed,
            global_allowed=global_allowed,
            reference_allowed=reference_allowed,
            now_us=now_us,
            local_policy=item.ref,
            global_policy=policy,
            birth=birth,
            fleet_before=fresh and birth is not None and self.fleet_before(item.route, birth.forgot_us / 1e6),
            remembered=remembered,
            skew_us=self.skew.offset_us,
            tolerance_us=self.skew.tolerance_us,
            caller_clock=self.caller_clock,
            fleet_size=self.fleet_size(),
        )
        return cause_of(figures)
