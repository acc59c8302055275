"""Reservations on the decision path, under the route's mode: :meth:`ReservationCalls.reserve`
(a decision with an ``estimate``), :meth:`ReservationCalls.settle_reservation` (its actual cost) and
:meth:`ReservationCalls.reservations` (a key's, as each store holds them), methods of the
:class:`~.decider.Decider`. The model is :mod:`limiter.reservations`; a route's ``budget`` block
gives its terms.

**Reserve.** The route and key are resolved as a decision's; the local limiter reserves the
estimate, and Redis does where the route's mode asks it (shadow and canary beside the local
answer, enforce as the answer; ``off`` not at all). Unlike a shadowed decision, a shadowed
reservation is made in Redis before the answer goes out, so that its settle, whichever replica
gets it, finds it there. The answer is a decision (its status and headers as any), with the
estimate and, when the answer that counts admitted it, the reservation's id
(:class:`~control_plane.model.reservation.ReservationId`: the namespace, route, key, whether
Redis booked it, and a random nonce). A deny-listed client is refused (403); an allow-listed one
is admitted with nothing reserved (its id is null: nothing to settle).

**Settle.** The id names the route and key, so any replica can settle it: this replica's local
limiter settles it if it holds it (the replica that reserved it does; another one does not, and
the reservation there expires as the route says), and Redis does where it was booked, or, when
Redis was not asked or could not answer at the reserve, charges the actual cost in full (once:
it is remembered) where the route's mode asks Redis now. The answer is the side that counts in
the route's mode if it knows the reservation, else the other: settled (now, or before: the first
answer again), expired (409, saying whether its estimate was kept or given back) or unknown to
both (404). In enforce, Redis failing to answer a settle is a 503 (nothing settled there; a retry
is safe, a settle being idempotent); in shadow it is counted and the local answer stands.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from limiter import Decision, LocalLimiter
from limiter.keys import validate_key
from limiter.policy import Charge, Policy, make_decision, validate_charge, validate_cost
from limiter.reservations import Book, Reserved, Settled, Terms, sweep

from ..model.candidate import blocked_view_name
from ..model.causes import FORWARD, needs_reference
from ..model.reservation import ReservationId, Store, new_nonce
from ..model.rollout import Divergence
from ..store import DIVERGENCE_TTL_S
from ..whatif.replay import Booked
from .enforce import Path, divergence_of, failure_verdict
from .shadow import ShadowItem, ShadowPipeline
from .types import DecideError, DecideResult, ExpiredReservation, InputLike, UnknownReservation, UnknownRoute

if TYPE_CHECKING:
    from ..external import ExternalManager
    from ..observe.activity import Activity
    from ..observe.metrics import Metrics
    from ..rules import RouteRule, Rules
    from ..whatif.recorder import Recorder
    from .compare import Comparisons
    from .plan import RoutePlan

__all__ = ["BackendUnavailable", "ReservationCalls", "SettleResult"]

_NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
_KEY_MAX = 65_536  # the longest key a route may allow (rules: key.max_length)
_TAG = 12  # a reservation's what-if tag: the first characters of its nonce (72 bits)


class BackendUnavailable(RuntimeError):
    """A settle the distributed store had to make, in enforce, and could not (503)."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


@dataclass(frozen=True, slots=True, kw_only=True)
class SettleResult:
    """A settle's answer: ``status`` ``settled`` (now) or ``again`` (before: the first answer),
    ``enforced`` the answer of the side that counts (``enforced_by``), what each side said
    (None: not asked), and the distributed store's error when it could not answer."""

    reservation: str
    route: str
    key: str
    mode: str
    status: str
    estimate: int
    cost: int
    enforced: Decision
    enforced_by: str
    local: Settled
    distributed: Settled | None
    backend_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The answer as the HTTP API sends it."""
        d = self.enforced
        return {
            "reservation": self.reservation,
            "route": self.route,
            "key": self.key,
            "status": self.status,
            "estimate": self.estimate,
            "cost": self.cost,
            "over": not d.allowed,
            "remaining": d.remaining,
            "limit": d.limit,
            "retry_after_us": d.retry_after_us,
            "reset_after_us": d.reset_after_us,
            "mode": self.mode,
            "enforced_by": self.enforced_by,
            "local": _side(self.local),
            "distributed": None if self.distributed is None else _side(self.distributed),
            "backend_error": self.backend_error,
        }


def _side(s: Settled) -> dict[str, Any]:
    return {"status": s.status, "decision": None if s.decision is None else s.decision.to_dict()}


def book_dict(book: Book, now_us: int, policy: Policy, terms: Terms) -> dict[str, Any]:
    """A key's book as the API shows it, as a sweep now would leave it (the stores sweep records
    past their time together, later: limiter.reservations.sweep): counts by state and each record
    (its nonce, the secret a settle needs, left out), soonest due first."""
    _, book = sweep(None, book, now_us, policy, terms, force=True)  # the state is the stores' own: not shown
    records = sorted(book.held.values(), key=lambda h: h.until_us)
    counts = {"outstanding": 0, "settled": 0, "charged": 0, "released": 0}
    for h in records:
        counts[h.state] += 1
    return {
        **counts,
        "records": [
            {
                "state": h.state,
                "estimate": h.estimate,
                "actual": h.actual,
                "age_us": max(0, now_us - h.made_us),
                "due_in_us": max(0, h.until_us - now_us),
            }
            for h in records
        ],
    }


class ReservationCalls:
    """The reservation methods of the :class:`~.decider.Decider` (see the module docstring)."""

    local: LocalLimiter
    resilient: Any
    activity: Activity
    external: ExternalManager
    shadow: ShadowPipeline
    recorder: Recorder | None
    comparisons: Comparisons
    metrics: Metrics
    _rules: Any

    def resolve(self, inp: InputLike) -> tuple[RouteRule, str]:
        raise NotImplementedError

    def plan(self, rule: RouteRule) -> RoutePlan:
        raise NotImplementedError

    def next_id(self) -> str:
        raise NotImplementedError

    def now_us(self) -> int:
        raise NotImplementedError

    @property
    def namespace(self) -> str:
        """The distributed store's namespace: a reservation is settled by a service of its own."""
        return str(self.resilient.redis.namespace)

    # -- reserve -------------------------------------------------------------------------

    async def reserve(self, inp: InputLike, *, headers: bool = True) -> DecideResult:
        """A decision of ``inp.estimate`` that books it (see the module docstring); raises as
        :meth:`~.decider.Decider.decide` does, and DecideError naming ``estimate`` on a route
        without a budget or an estimate its policies cannot take."""
        rule, key = self.resolve(inp)
        estimate = inp.estimate
        assert estimate is not None
        terms = _terms_of(rule, required=True)
        p = self.plan(rule)
        lp, dp, key, fp, fc = p.policies(key, None)
        listed = _listed(rule, key, inp.client_ip, lp)
        res = None
        if rule.external is not None and listed is None:  # the key's own budget, from the limits service
            res = await self.external.resolve(rule, key, inp.method, inp.path, inp.headers)
            lp, dp, key, fp, fc = p.policies(key, res.limits)
        _check_estimate(lp, dp, estimate, terms)
        request_id = inp.request_id or self.next_id()
        now = self.now_us()
        now_s = now / 1_000_000
        if listed is not None:
            d, status, match = listed
            result = p.answer(
                enforced=d, enforced_by="local", status=status, key=key, request_id=request_id, path=p.path_of(key),
                local=d, policy=lp, now_s=now_s, headers=headers, list_match=match,
            )  # fmt: skip
            result.estimate = estimate
            return result
        lkey = p.prefix + key
        nonce = new_nonce()
        local = self.local.reserve(lkey, lp, estimate, rid=nonce, terms=terms, now_us=now)
        path = p.path_of(key)
        store: Store = "unasked"
        outcome = booked = None
        dist = div = None
        if path is not Path.LOCAL:
            outcome, booked = await self.resilient.reserve(
                lkey, dp, estimate, rid=nonce, terms=terms, now_us=now, failure_policy=fp, failure_code=fc
            )
            if booked is not None:
                store = "booked" if booked.reserved else "refused"
                dist = booked.decision
                div = divergence_of(local.decision.allowed, dist.allowed)
                self.comparisons.pair(p.name, key, div, request_id, estimate, "estimate")
                self._explain(p, key, (lkey, dp, estimate, now), (lp, local.decision.allowed, dist.allowed))
                if p.cand is not None:
                    await self._reserve_candidate(
                        p.name, p.cand, (key, lkey, request_id), estimate=estimate, nonce=nonce, terms=terms,
                        current=booked.reserved,
                    )  # fmt: skip
            else:
                self.comparisons.backend_error(p.name)
        counted: Reserved = local
        status, by, policy = 429, "local", lp
        if path is Path.DISTRIBUTED:
            assert outcome is not None
            policy = dp
            if booked is not None:
                counted, by = booked, "distributed"
            else:
                counted = Reserved(decision=outcome.decision, reserved=outcome.allowed)
                status, by = failure_verdict(outcome)[0], "failure_policy"
        self._count("reservation", p.name, "reserved" if counted.reserved else "full" if counted.full else "refused")
        # counted as a request of the route (its rate, its busiest keys and their last answer), recorded for what-if
        self.activity.note(p.name, key, now_s)[key] = (now_s, counted.decision.allowed, by)
        if self.recorder is not None:
            self.recorder.offer(p.name, key, Booked("r", estimate, nonce[:_TAG]), now, p.mode_value, counted.reserved)
        result = p.answer(
            enforced=counted.decision, enforced_by=by, status=status, key=key, request_id=request_id, path=path,
            local=local.decision, policy=policy, now_s=now_s, headers=headers, dist=dist, div=div,
            shadow=dp if path is Path.SHADOW else None, backend_error=None if outcome is None else outcome.error,
            res=res,
        )  # fmt: skip
        result.estimate = estimate
        if counted.reserved:
            rid = ReservationId(
                namespace=self.namespace, route=p.name, key=key, store=store, nonce=nonce,
                compared=None if div is None else div.value, minute=int(now_s // 60) * 60,
            )  # fmt: skip
            result.reservation = rid.encode()
        return result

    def _explain(
        self, p: RoutePlan, key: str, request: tuple[str, Policy, int, int], answers: tuple[Policy, bool, bool]
    ) -> None:
        """A reservation's divergence explained at once, as the shadow pipeline explains a
        decision's (control_plane/model/causes.py), where no reference is needed (a global
        budget no stricter than the local one: a new rejection is then the fleet multiplying
        the local budget, a replica's fresh bucket or its clock); under a stricter one the
        reference is not evaluated for reservations and the divergence stays unexplained."""
        explainer = self.shadow.explainer
        lp, local_allowed, global_allowed = answers
        if not p.explain or explainer is None or local_allowed == global_allowed:
            return
        if local_allowed and needs_reference(request[1], lp):
            return
        route = p.name
        item = ShadowItem(request=request, route=route, key=key, local_allowed=local_allowed, request_id="", ref=lp)
        cause = explainer.cause(item, global_allowed, None)
        if cause is not None:
            self.comparisons.causes_batch(route, {cause: 1})
            if cause in FORWARD:
                self.comparisons.blocked.record_cause(route, key, cause)

    async def _reserve_candidate(
        self, route: str, cand: Any, who: tuple[str, str, str], *, estimate: int, nonce: str, terms: Terms,
        current: bool,
    ) -> None:  # fmt: skip
        """The route's candidate budget reserves the same estimate under the same id in its own
        bucket (its settle, on any replica, settles it there too), compared with the current
        global answer and counted as a candidate's decisions are."""
        prefix, policy, cid, most = cand
        key, lkey, request_id = who
        mine: bool | None = False  # an estimate the candidate can never cover: refused outright
        if terms.positive or estimate <= most:
            got = (await self.resilient.reserve(prefix + lkey, policy, estimate, rid=nonce, terms=terms))[1]
            mine = None if got is None else got.reserved
        counts = [0, 0, 0, 0]  # agree, newly rejected, newly admitted, errors
        counts[3 if mine is None else 0 if mine == current else 1 if current else 2] += 1
        self.comparisons.candidate_batch(route, cid, *counts)
        if counts[1]:
            self.comparisons.blocked.record(blocked_view_name(route), key, request_id, units=estimate)

    # -- settle --------------------------------------------------------------------------

    async def settle_reservation(self, reservation: str, cost: int) -> SettleResult:
        """Settle ``reservation`` at ``cost`` (see the module docstring). Raises DecideError
        (422) naming ``reservation`` or ``cost``, UnknownRoute (its route is gone),
        UnknownReservation (404), ExpiredReservation (409), BackendUnavailable (503)."""
        rid = self._decode(reservation)
        rules: Rules = self._rules()
        rule = rules.get(rid.route)
        if rule is None:
            raise UnknownRoute(rid.route)
        terms = _terms_of(rule, required=False)
        p = self.plan(rule)
        res = None
        if rule.external is not None:  # the key's budget as the limits service says it now (its cache, mostly)
            res = await self.external.resolve(rule, rid.key, None, None, {})
        lp, dp, key, _, _ = p.policies(rid.key, None if res is None else res.limits)
        try:
            validate_charge(lp, Charge(cost))
            validate_charge(dp, Charge(cost))
        except ValueError as exc:
            raise DecideError("cost", str(exc).removeprefix("cost: ")) from None
        now = self.now_us()
        lkey = p.prefix + key
        local = self.local.settle(lkey, lp, cost, rid=rid.nonce, terms=terms, now_us=now)
        path = p.path_of(key)
        dist: Settled | None = None
        error = None
        if rid.store == "booked" or (rid.store == "unasked" and path is not Path.LOCAL):
            out = await self.resilient.settle(
                lkey, dp, cost, rid=rid.nonce, terms=terms, now_us=now, unbooked=rid.store == "unasked"
            )
            if isinstance(out, str):
                error = out
            else:
                dist = out
        if error is not None and path is Path.DISTRIBUTED:
            self._count("settle", p.name, "failed")
            raise BackendUnavailable(error)
        await self._settle_beside(p, rid, cost, terms=terms, now=now, lkey=lkey)
        sides = [("local", local), ("distributed", dist)]
        if path is Path.DISTRIBUTED:
            sides.reverse()
        known = [(by, s) for by, s in sides if s is not None and s.status != "unknown"]
        if not known:
            self._count("settle", p.name, "unknown")
            raise UnknownReservation(reservation)
        by, s = known[0]
        if s.decision is None:  # expired first: what became of its estimate
            self._count("settle", p.name, "expired")
            raise ExpiredReservation(s.status, s.estimate)
        self._count("settle", p.name, s.status)
        self._settle_counts(p.name, local, (by, s), cost)
        self._settle_compared(p.name, rid, local, dist, cost, now)
        return SettleResult(
            reservation=reservation, route=p.name, key=key, mode=p.mode_value, status=s.status, estimate=s.estimate,
            cost=cost if s.actual is None else s.actual, enforced=s.decision, enforced_by=by, local=local,
            distributed=dist, backend_error=error,
        )  # fmt: skip

    def _settle_compared(
        self, route: str, rid: ReservationId, local: Settled, dist: Settled | None, cost: int, now: int
    ) -> None:
        """A reservation compared at its reserve, settled for the first time fleet-wide (by
        Redis where it was booked there, else by the local limiter, the only one that holds
        it): its minute's divergence figures go from its estimate to ``cost``."""
        if rid.compared is None or now / 1e6 - rid.minute >= DIVERGENCE_TTL_S:  # (its minute is gone)
            return
        first = dist if rid.store == "booked" else local
        if first is not None and first.status == "settled":
            self.comparisons.settled(route, Divergence(rid.compared), first.estimate, cost, rid.minute)

    async def _settle_beside(
        self, p: RoutePlan, rid: ReservationId, cost: int, *, terms: Terms, now: int, lkey: str
    ) -> None:
        """What a settle does beside the limiters: recorded for what-if (its key's recording
        keeps it), and its candidate budget's reservation settled, if it made one (else it is
        unknown there)."""
        if self.recorder is not None:
            self.recorder.offer_settle(p.name, lkey.removeprefix(p.prefix), Booked("s", cost, rid.nonce[:_TAG]), now)
        if p.cand is not None:
            prefix, policy, _, _ = p.cand
            await self.resilient.settle(prefix + lkey, policy, cost, rid=rid.nonce, terms=terms, now_us=now)

    def _settle_counts(self, route: str, local: Settled, counted: tuple[str, Settled], cost: int) -> None:
        """A settle's metrics: each side's, and at the first settle how far off the estimate
        was, its refund or its charge past the budget (on the side that ``counted``)."""
        by, s = counted
        m = self.metrics
        mine = "elsewhere" if local.status == "unknown" else "expired" if local.decision is None else local.status
        m.child(m.settle_local, route, mine).inc()
        if s.status != "settled":
            return
        if s.estimate > 0:
            m.child(m.cost_ratio, route).observe(cost / s.estimate)
        if cost < s.estimate:
            m.child(m.refunded, route).inc(s.estimate - cost)
        elif s.decision is not None and not s.decision.allowed:
            self.comparisons.over_budget(route, by)

    def _decode(self, reservation: str) -> ReservationId:
        try:
            rid = ReservationId.decode(reservation)
        except ValueError as exc:
            raise DecideError("reservation", str(exc)) from None
        if rid.namespace != self.namespace:
            raise DecideError(
                "reservation",
                f"made by the service of namespace {rid.namespace!r}, not this one ({self.namespace!r}): settle it "
                "where it was made",
            )
        if _NONCE.fullmatch(rid.nonce) is None:
            raise DecideError("reservation", "not a reservation id: its nonce is not one this service makes")
        try:
            validate_key(rid.key, field="reservation", max_length=_KEY_MAX)
        except ValueError:
            raise DecideError("reservation", "not a reservation id: its key is not a valid key") from None
        return rid

    # -- what is held --------------------------------------------------------------------

    async def reservations(self, route: str, key: str) -> dict[str, Any]:
        """The key's reservations on the route, as this replica's local limiter and the
        distributed store hold them (None: the store could not answer, with the error)."""
        rule = self._rules().get(route)
        if rule is None:
            raise UnknownRoute(route)
        key = validate_key(key, field="key", max_length=_KEY_MAX)
        p = self.plan(rule)
        lkey = p.prefix + key
        now = self.now_us()
        terms = _terms_of(rule, required=False)
        lp = p.policies(key, None)[0]
        out: dict[str, Any] = {
            "route": route,
            "key": key,
            "local": book_dict(self.local.book(lkey), now, lp, terms),
        }
        try:
            out["distributed"] = book_dict(await self.resilient.redis.raw_book(lkey), now, lp, terms)
            out["backend_error"] = None
        except Exception as exc:  # noqa: BLE001 - the store's failure is the answer's, not an error of the request
            out["distributed"] = None
            out["backend_error"] = str(exc) or type(exc).__name__
        budget = rule.budget
        out["max_reservations"] = None if budget is None else budget.max_held
        return out

    def _count(self, what: str, route: str, result: str) -> None:
        m = self.metrics
        family = m.reservations if what == "reservation" else m.settles
        m.child(family, route, result).inc()


def _terms_of(rule: RouteRule, *, required: bool) -> Terms:
    if rule.budget is not None:
        return rule.budget
    if required:
        raise DecideError(
            "estimate",
            f"route {rule.name!r} keeps no reservations: give it a budget block (docs/configuration.md#budgets-budget)",
        )
    return Terms()  # a budget removed since the reservation was made: the defaults


def _check_estimate(lp: Policy, dp: Policy, estimate: int, terms: Terms) -> None:
    """An estimate the route's policies can take: a whole number from 1 to 10^9 on limits that
    take charges, and one they can ever cover unless the route admits while anything is left."""
    try:
        for policy in (lp, dp):
            validate_charge(policy, Charge(estimate))
            if not terms.positive:
                validate_cost(policy, estimate)
    except ValueError as exc:
        message = str(exc).removeprefix("cost: ")
        raise DecideError("estimate", message) from None


def _listed(rule: RouteRule, key: str, client_ip: str | None, policy: Policy) -> tuple[Decision, int, str] | None:
    """A deny-listed client's refusal (403), an allow-listed one's admission, or None."""
    if rule.deny.matches(key, client_ip):
        return make_decision(False, 0, policy.limit, policy.period_us, 0), 403, "deny"
    if rule.allow.matches(key, client_ip):
        return make_decision(True, policy.limit, policy.limit, 0, 0), 200, "allow"
    return None
