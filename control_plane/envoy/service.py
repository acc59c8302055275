"""Envoy's rate limit service, ``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit``,
over gRPC: what ``envoy.filters.http.ratelimit`` (and Istio, Envoy Gateway, Contour) call.

A request's descriptors are looked up in the Envoy configuration
(:mod:`control_plane.envoy.config`); every limited one is a route of the rollout and is
decided through the one decision path (:class:`~control_plane.decision.Decider`). The
method is ``gathered`` (:mod:`.calls`): the calls whose requests one turn of the event loop
read (Envoy sends them by the dozen in one write) are decided together, every limited
descriptor of all of them in one pipelined burst to Redis, in the calls' order, within the
earliest call's deadline; each call's answer is the one it would get alone. As envoyproxy/ratelimit answers:

* each :class:`DescriptorStatus` carries ``current_limit`` (requests_per_unit, unit,
  name), ``limit_remaining`` and ``duration_until_reset``; a descriptor with no limit is
  OK with no ``current_limit``; ``unlimited`` is OK with ``limit_remaining`` 2^32-1; a
  limit named in another matched limit's ``replaces`` is not checked;
  ``requests_per_unit: 0`` is over for every request (no Redis call);
* ``hits_addend`` is the cost (the descriptor's own, else the request's, whose 0 means
  1), and every hit is counted, refused or not (a :class:`~limiter.policy.Charge`, into
  debt on a bucket), as envoyproxy/ratelimit's counter counts it: Envoy's stream-done call
  (``apply_on_stream_done``, its ``hits_addend`` read from the response) lands whatever is
  left, and the next check sees it. A descriptor's own ``hits_addend`` of 0 looks at the
  limit without spending: OVER when no quota is left (a request of one hit would be
  refused), else OK with what remains;
* the overall code is OVER_LIMIT when any descriptor whose answer counts is over, or when
  every ``quota_mode`` descriptor is;
* a descriptor of a route in **shadow** (or a key outside a canary's share) answers OK:
  its distributed decision is compared with the local one exactly as for HTTP. With the
  would-limit header on (``SHADOWLIMIT_ENVOY_WOULD_LIMIT_HEADER``, the default), that
  distributed decision is made in the request path, and the routes whose global limit is
  over for this very request are named to the upstream in ``request_headers_to_add``;
* ``response_headers_to_add`` is empty by default, as the peer's; with
  ``SHADOWLIMIT_ENVOY_RESPONSE_HEADERS=peer`` it holds the peer's three headers of the
  descriptor that is over the limit, else of the one closest to it, with ``draft`` the
  draft-ietf-httpapi-ratelimit-headers fields of the HTTP API (``RateLimit-Policy``,
  ``RateLimit``, and ``Retry-After`` when over; never ``X-RateLimit-*``, which Envoy's
  ``enable_x_ratelimit_headers`` adds): never two headers of one name;
* the peer's per-descriptor stats are counted (:mod:`.stats`);
* when Redis fails, the failure policy answers (Envoy's ``failure_mode_deny`` never sees
  an error for it).

Refused with ``INVALID_ARGUMENT`` (and counted as ``invalid``): bytes that are not a
``RateLimitRequest`` (bad protobuf, a string field that is not UTF-8), an empty domain, no
descriptors or more than :data:`MAX_DESCRIPTORS`, a descriptor with more than
:data:`MAX_ENTRIES` entries, and a per-request ``limit`` override. With
``SHADOWLIMIT_CLIENT_TOKEN`` set, a call without ``authorization: Bearer <client token>``
metadata is ``UNAUTHENTICATED`` (the transport checks it: :meth:`.server.GrpcServer.authorize`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from envoy.config.core.v3.base_pb2 import HeaderValue
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError

from limiter.policy import MAX_COST, Charge

from ..decision import DecideResult, InvalidCost, Path, PlainInput
from ..observe import incidents
from ..settings.envoy import EnvoyHeaders
from .config import UNITS, EnvoyLimit, Match
from .stats import HitStats
from .wire import Call, Method, RpcError, StatusCode

if TYPE_CHECKING:
    from ..decision import Decider
    from ..live_rules import LiveRules
    from ..observe.metrics import Metrics

__all__ = ["MAX_DESCRIPTORS", "MAX_ENTRIES", "RLS_SERVICE", "RateLimitService", "methods"]

log = logging.getLogger("shadowlimit.envoy")

#: the most descriptors in one request
MAX_DESCRIPTORS = 64
#: the most entries in one descriptor
MAX_ENTRIES = 32

#: a descriptor's last entry under this key says whether the answer reported its usage
#: (``reported``) or not (``missing``, ``not_a_number``): put there by the Lua filter of
#: docs/gateways.md, taken off before the descriptor is looked up
USAGE_ENTRY = "shadowlimit_usage"
_UNMETERED = frozenset({"missing", "not_a_number"})
#: the most descriptor shapes whose bad cost is logged (each once)
_BAD_LOGGED = 1000

#: the full name of Envoy's rate limit service
RLS_SERVICE = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"].full_name
_Request = rls_pb2.RateLimitRequest
_Response = rls_pb2.RateLimitResponse
_OK = _Response.OK
_OVER = _Response.OVER_LIMIT
_UNLIMITED_REMAINING = 2**32 - 1
_DRAFT_FIELDS = frozenset({"RateLimit-Policy", "RateLimit", "Retry-After"})
_NO_HEADERS = EnvoyHeaders(
    response="none",
    limit="RateLimit-Limit",
    remaining="RateLimit-Remaining",
    reset="RateLimit-Reset",
    would_limit=None,
    near_limit_ratio=0.8,
)


class _Invalid(Exception):
    """A request refused with INVALID_ARGUMENT."""


class _Verdict:
    """One descriptor's answer: its status, whether it counts (not shadowed), whether its
    limit is over for this request (None: not known), what the hit stats need, and
    whether it is shadowed with Redis's own verdict over (the would-limit header)."""

    __slots__ = ("status", "counted", "over", "limit", "used_before", "headers", "would")

    def __init__(
        self, status: Any, counted: bool, over: bool | None = None, limit: int = 0, used_before: int = 0,
        headers: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.status = status
        self.counted = counted
        self.over = over
        self.limit = limit
        self.used_before = used_before
        self.headers = headers
        self.would = False


class _Asked:
    """A call's request matched: each descriptor's match and cost, and the limited ones' indexes
    and decision inputs."""

    __slots__ = ("matches", "costs", "todo", "inputs")

    def __init__(self, *, matches: list[Match | None], costs: list[int]) -> None:
        self.matches = matches
        self.costs = costs
        self.todo: list[int] = []
        self.inputs: list[PlainInput] = []


class RateLimitService:
    """The servicer (see the module docstring)."""

    def __init__(
        self, live: LiveRules, decider: Decider, metrics: Metrics, headers: EnvoyHeaders = _NO_HEADERS
    ) -> None:
        self.live = live
        self.decider = decider
        self.metrics = metrics
        self.headers = headers
        self.hits = HitStats(metrics, headers.near_limit_ratio)
        self._bad_logged: set[tuple[str, ...]] = set()  # descriptor shapes whose bad cost was logged
        self.in_flight = 0  # calls being answered (at most headers.max_calls)
        self._limits = {name: _Response.RateLimit.Unit.Value(name) for name in _Response.RateLimit.Unit.keys()}

    async def should_rate_limit(self, messages: list[bytes], calls: list[Call]) -> list[bytes | RpcError]:
        """The gRPC method (``gathered``: the calls whose requests one turn of the event loop
        read), from the requests' bytes to the responses' bytes: every limited descriptor of
        every call decided in one :meth:`~control_plane.decision.Decider.decide_many` (one
        burst to Redis, within the earliest call's budget), each response made from its call's
        share. A call's own mistake is its own error: bytes that do not parse (INVALID_ARGUMENT,
        counted, the client's mistake, not the server's), a bad descriptor, or ``max_calls``
        calls in progress (RESOURCE_EXHAUSTED at once, counted)."""
        out: list[bytes | RpcError] = []
        asked: list[tuple[int, _Asked]] = []
        budget: float | None = None
        for data, call in zip(messages, calls, strict=True):
            try:
                ask = self._ask(data, self.in_flight + len(asked))
            except RpcError as exc:
                out.append(exc)
                continue
            remaining = call.time_remaining()  # Envoy's grpc-timeout, less what has passed (None: none sent)
            if remaining is not None:  # kept for the way back: the margin, and a tenth (timers fire late under load)
                mine = remaining * 0.9 - self.headers.deadline_margin_s
                budget = mine if budget is None else min(budget, mine)
            asked.append((len(out), ask))
            out.append(b"")
        if not asked:
            return out
        self.in_flight += len(asked)
        try:
            inputs = [item for _, ask in asked for item in ask.inputs]
            results = await self._decide(inputs, budget) if inputs else []
        except Exception as exc:  # noqa: BLE001 - a bug: logged under an incident id, never shown
            failed = self._internal(exc)
            for i, _ in asked:
                self.metrics.envoy_requests.labels("error").inc()
                out[i] = failed
            return out
        finally:
            self.in_flight -= len(asked)
        at = 0
        for i, ask in asked:
            try:
                out[i] = self._response(ask, results[at : at + len(ask.inputs)])
            except Exception as exc:  # noqa: BLE001 - as above, for this call alone
                self.metrics.envoy_requests.labels("error").inc()
                out[i] = self._internal(exc)
            at += len(ask.inputs)
        return out

    @staticmethod
    def _internal(exc: Exception) -> RpcError:
        """A bug's answer: INTERNAL, naming the incident it is logged under."""
        incident = incidents.report(exc, "ShouldRateLimit")
        return RpcError(StatusCode.INTERNAL, f"{incidents.MESSAGE} (incident {incident})")

    def _ask(self, data: bytes, in_flight: int) -> _Asked:
        """One call's request parsed and its descriptors matched (raises :class:`RpcError`,
        counted: past ``max_calls`` calls in progress, a message that is not a
        RateLimitRequest, a request refused by :meth:`_matches`)."""
        if in_flight >= self.headers.max_calls:
            self.metrics.envoy_requests.labels("overloaded").inc()
            raise RpcError(StatusCode.RESOURCE_EXHAUSTED, f"more than {self.headers.max_calls} calls in progress")
        try:
            request = _Request.FromString(data)
            matches, costs = self._matches(request)
        except (DecodeError, ValueError, UnicodeDecodeError):
            self.metrics.envoy_requests.labels("invalid").inc()
            raise RpcError(
                StatusCode.INVALID_ARGUMENT,
                "the request is not a RateLimitRequest (not valid protobuf, or a string field that is not UTF-8)",
            ) from None
        except _Invalid as exc:
            self.metrics.envoy_requests.labels("invalid").inc()
            raise RpcError(StatusCode.INVALID_ARGUMENT, str(exc)) from None
        ask = _Asked(matches=matches, costs=costs)
        for i, m in enumerate(matches):
            if m is not None and m.limit.route is not None:  # limited (an unlimited one has no route)
                ask.todo.append(i)
                ask.inputs.append((m.limit.route, m.key, costs[i], None))
        return ask

    async def _decide(self, inputs: list[PlainInput], budget_s: float | None) -> list[Any]:
        """The descriptors' decisions; Redis gets ``budget_s`` seconds, then the failure policy answers."""
        return await self.decider.decide_many(
            inputs,
            headers=self.headers.response == "draft",  # the only style that sends the decision's own headers
            inline_shadow=self.headers.would_limit is not None,
            budget_s=budget_s,
        )

    def _response(self, ask: _Asked, results: list[Any]) -> bytes:
        """A call's response from its descriptors' decisions, counted as Envoy will read it."""
        response = self._respond(ask, results)
        self.metrics.envoy_requests.labels("over_limit" if response.overall_code == _OVER else "ok").inc()
        return response.SerializeToString()  # type: ignore[no-any-return]

    def _respond(self, ask: _Asked, results: list[Any]) -> Any:
        """The ``RateLimitResponse`` of a call whose limited descriptors were decided as ``results``."""
        matches, costs = ask.matches, ask.costs
        by_index = dict(zip(ask.todo, results, strict=True))
        would_limit = self.headers.would_limit
        statuses: list[Any] = []
        over = quota = quota_over = 0
        shadow_over: list[str] = []
        # the headers: of a counted descriptor over the limit, else of the one closest to it
        chosen: tuple[int, int, _Verdict] | None = None  # (over first, remaining, verdict)
        for i, m in enumerate(matches):
            v = self._status(m, by_index.get(i), costs[i])
            statuses.append(v.status)
            if m is None or m.limit.unlimited:
                continue
            is_over = v.status.code == _OVER
            if m.limit.quota_mode:
                quota += 1
                quota_over += is_over
            else:
                over += is_over
            route = m.limit.route or ""
            self.hits.add(
                route, costs[i], over=bool(v.over), limit=v.limit, used_before=v.used_before, shadowed=not v.counted
            )
            if v.would and route not in shadow_over:
                shadow_over.append(route)
            rank = (0 if is_over and not m.limit.quota_mode else 1, v.status.limit_remaining, v)
            if chosen is None or rank[:2] < chosen[:2]:
                chosen = rank
        code = _OVER if over or (quota and quota == quota_over) else _OK
        response = _Response(overall_code=code, statuses=statuses)
        if chosen is not None and self.headers.response != "none":
            response.response_headers_to_add.extend(self._headers(chosen[2], code))
        if would_limit is not None and shadow_over:
            response.request_headers_to_add.append(HeaderValue(key=would_limit, value=", ".join(shadow_over)))
        return response

    def _headers(self, v: _Verdict, code: int) -> list[Any]:
        """The rate-limit headers of the chosen descriptor, in the configured style."""
        h = self.headers
        if h.response == "peer":
            st = v.status
            return [
                HeaderValue(key=h.limit, value=str(st.current_limit.requests_per_unit)),
                HeaderValue(key=h.remaining, value=str(st.limit_remaining)),
                HeaderValue(key=h.reset, value=str(st.duration_until_reset.seconds)),
            ]
        if v.headers is None:
            return []
        # the draft's own fields only: Envoy's enable_x_ratelimit_headers owns X-RateLimit-*
        return [
            HeaderValue(key=k, value=val)
            for k, val in v.headers.items()
            if k in _DRAFT_FIELDS and (code == _OVER or k != "Retry-After")
        ]

    def _matches(self, request: Any) -> tuple[list[Match | None], list[int]]:
        """Each descriptor's match (None: no limit, or replaced) and cost."""
        if not request.domain:
            raise _Invalid("domain: must not be empty")
        descriptors = request.descriptors
        if not descriptors:
            raise _Invalid("descriptors: at least one descriptor is needed")
        if len(descriptors) > MAX_DESCRIPTORS:
            raise _Invalid(f"descriptors: at most {MAX_DESCRIPTORS} per request, got {len(descriptors)}")
        config = self.live.envoy
        default_cost = max(1, request.hits_addend)
        matches: list[Match | None] = []
        costs: list[int] = []
        for i, d in enumerate(descriptors):
            if len(d.entries) > MAX_ENTRIES:
                raise _Invalid(f"descriptors[{i}].entries: at most {MAX_ENTRIES}, got {len(d.entries)}")
            if d.HasField("limit"):
                raise _Invalid(f"descriptors[{i}].limit: per-request limit overrides are not supported")
            # the descriptor's own hits_addend, 0 included (a look without spending); every other
            # hit is a charge, counted refused or not, as envoyproxy/ratelimit counts it
            cost = d.hits_addend.value if d.HasField("hits_addend") else default_cost
            costs.append(Charge(cost) if cost else 0)
            entries = [(e.key, e.value) for e in d.entries]
            reason = None
            if entries and entries[-1][0] == USAGE_ENTRY:  # the usage's own report (docs/gateways.md), not a key
                reason = entries.pop()[1]
                reason = None if reason == "reported" else reason if reason in _UNMETERED else "other"
            match = config.lookup(request.domain, entries) if config is not None and entries else None
            if reason is not None or cost > MAX_COST:
                self._bad_cost(request.domain, entries, match, reason or "too_large", cost)
            matches.append(match)
        replaced = {name for m in matches if m is not None for name in m.limit.replaces}
        if replaced:  # an unlimited one is never checked, so never replaced
            matches = [None if m and not m.limit.unlimited and m.limit.name in replaced else m for m in matches]
        return matches, costs

    def _bad_cost(
        self, domain: str, entries: list[tuple[str, str]], match: Match | None, reason: str, cost: int
    ) -> None:
        """A descriptor whose cost the answer did not say (or said past the bound): counted in
        ``rate_limit_envoy_bad_costs_total`` and logged once per descriptor (its domain and
        entries' keys); what it is charged: docs/gateways.md."""
        route = match.limit.route if match is not None and match.limit.route else "-"  # a bounded label
        m = self.metrics
        m.child(m.envoy_bad_costs, route, reason).inc()
        shape = (domain, *(k for k, _ in entries))
        if shape in self._bad_logged or len(self._bad_logged) >= _BAD_LOGGED:
            return
        self._bad_logged.add(shape)
        charged = "answered OVER_LIMIT, nothing charged" if reason == "too_large" else f"charged its hits_addend {cost}"
        log.warning(
            "Envoy descriptor %s (domain %s): its cost is %s (%s); counted in rate_limit_envoy_bad_costs_total, "
            "logged once", "/".join(shape[1:]) or "-", domain, reason.replace("_", " "), charged,
        )  # fmt: skip

    def _status(self, m: Match | None, res: Any, cost: int) -> _Verdict:
        """A descriptor's answer (see :class:`_Verdict`)."""
        if m is None:
            return _Verdict(_Response.DescriptorStatus(code=_OK), False)
        limit = m.limit
        if limit.unlimited:
            return _Verdict(_Response.DescriptorStatus(code=_OK, limit_remaining=_UNLIMITED_REMAINING), False)
        current = self._current(limit)
        if not isinstance(res, DecideResult):
            return self._refused(limit, res, current)
        d = res.enforced
        counted = not res.shadowed  # a shadowed descriptor answers OK, whatever its limit says
        code = _OK if res.allowed or not counted else _OVER
        reset = Duration(seconds=math.ceil(d.reset_after_us / 1_000_000))
        status = _Response.DescriptorStatus(
            code=code, current_limit=current, limit_remaining=max(0, d.remaining), duration_until_reset=reset
        )
        # the limit's verdict for this request: the global one where it was asked
        verdict = res.allowed if counted else res.local.allowed if res.shadow_allowed is None else res.shadow_allowed
        over = not verdict
        used = d.limit - d.remaining - cost  # a hit is counted refused or not (a charge)
        v = _Verdict(status, counted, over, d.limit, used, res.headers)
        v.would = not counted and res.shadow_allowed is False
        return v

    def _refused(self, limit: EnvoyLimit, exc: Any, current: Any) -> _Verdict:
        """An item the decider refused: a cost above the limit is over the limit (as
        envoyproxy/ratelimit answers it, unless shadowed); anything else is a bug."""
        if not isinstance(exc, InvalidCost):
            raise exc if isinstance(exc, BaseException) else RuntimeError(f"no decision for {limit.route}")
        counted = exc.path is not Path.SHADOW
        unit_s = UNITS[limit.unit]
        now_s = self.decider.clock_us() // 1_000_000  # the decisions' clock
        reset = Duration(seconds=unit_s - now_s % unit_s)
        code = _OVER if counted else _OK
        status = _Response.DescriptorStatus(code=code, current_limit=current, duration_until_reset=reset)
        return _Verdict(status, counted, True, limit.requests_per_unit, 0)

    def _current(self, limit: EnvoyLimit) -> Any:
        return _Response.RateLimit(
            requests_per_unit=limit.requests_per_unit, unit=self._limits[limit.unit], name=limit.name
        )


def methods(service: RateLimitService) -> dict[str, Method]:
    """Envoy's rate limit service's one method, taking the request's bytes, so that a
    message that does not parse is answered INVALID_ARGUMENT by
    :meth:`RateLimitService.should_rate_limit`."""
    return {f"/{RLS_SERVICE}/ShouldRateLimit": Method("gathered", service.should_rate_limit)}
