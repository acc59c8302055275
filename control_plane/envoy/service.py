"""Envoy's rate limit service, ``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit``,
over gRPC: what ``envoy.filters.http.ratelimit`` (and Istio, Envoy Gateway, Contour) call.

A request's descriptors are looked up in the Envoy configuration
(:mod:`control_plane.envoy.config`); every limited one is a route of the rollout and is
decided through the one decision path (:class:`~control_plane.decision.Decider`), all of
them in one pipelined burst to Redis. As envoyproxy/ratelimit answers:

* each :class:`DescriptorStatus` carries ``current_limit`` (requests_per_unit, unit,
  name), ``limit_remaining`` and ``duration_until_reset``; a descriptor with no limit is
  OK with no ``current_limit``; ``unlimited`` is OK with ``limit_remaining`` 2^32-1; a
  limit named in another matched limit's ``replaces`` is not checked;
* ``hits_addend`` is the cost (the descriptor's own, else the request's, 0 meaning 1);
* the overall code is OVER_LIMIT when any descriptor whose answer counts is over, or when
  every ``quota_mode`` descriptor is;
* a descriptor of a route in **shadow** (or a key outside a canary's share) answers OK:
  its distributed decision is compared with the local one exactly as for HTTP;
* the rate-limit headers (the same settings as HTTP) of the descriptor that is over the
  limit, else of the one closest to it, go in ``response_headers_to_add``;
* when Redis fails, the failure policy answers (Envoy's ``failure_mode_deny`` never sees
  an error for it).

Refused with ``INVALID_ARGUMENT`` (and counted as ``invalid``): an empty domain, no
descriptors or more than :data:`MAX_DESCRIPTORS`, a descriptor with more than
:data:`MAX_ENTRIES` entries, a per-request ``limit`` override and a ``hits_addend`` of 0
(a check that does not count: not supported). With ``SHADOWLIMIT_CLIENT_TOKEN`` set, a
call without ``authorization: Bearer <client token>`` metadata is ``UNAUTHENTICATED``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

import grpc
from envoy.config.core.v3.base_pb2 import HeaderValue
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf.duration_pb2 import Duration

from .. import incidents
from ..auth import Access, Denied, check
from ..decision import DecideResult, PlainInput
from ..decision.enforce import Path, path_for
from .config import UNITS, EnvoyLimit, Match

if TYPE_CHECKING:
    from ..auth import Authenticator
    from ..decision import Decider
    from ..live_rules import LiveRules
    from ..metrics import Metrics

__all__ = ["MAX_DESCRIPTORS", "MAX_ENTRIES", "RateLimitService"]

log = logging.getLogger("shadowlimit.envoy")

#: the most descriptors in one request
MAX_DESCRIPTORS = 64
#: the most entries in one descriptor
MAX_ENTRIES = 32

_Response = rls_pb2.RateLimitResponse
_OK = _Response.OK
_OVER = _Response.OVER_LIMIT
_UNLIMITED_REMAINING = 2**32 - 1
_SHADOWED_MODES = frozenset({"shadow", "canary"})


def _bearer_of(metadata: Any) -> str | None:
    """The token of an ``authorization: Bearer <token>`` metadata entry."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None


class _Invalid(Exception):
    """A request refused with INVALID_ARGUMENT."""


class RateLimitService(rls_pb2_grpc.RateLimitServiceServicer):  # type: ignore[misc]
    """The servicer (see the module docstring)."""

    def __init__(self, live: LiveRules, decider: Decider, metrics: Metrics, auth: Authenticator | None = None) -> None:
        self.live = live
        self.decider = decider
        self.metrics = metrics
        self.auth = auth
        self._limits = {name: _Response.RateLimit.Unit.Value(name) for name in _Response.RateLimit.Unit.keys()}

    async def ShouldRateLimit(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method's name
        if self.auth is not None and self.auth.client_token_required:
            try:
                check(self.auth, Access.DATA, _bearer_of(context.invocation_metadata()))
            except Denied as exc:
                self.metrics.envoy_requests.labels("invalid").inc()
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
        try:
            response = await self.answer(request)
        except _Invalid as exc:
            self.metrics.envoy_requests.labels("invalid").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug: logged under an incident id, never shown
            self.metrics.envoy_requests.labels("error").inc()
            await context.abort(
                grpc.StatusCode.INTERNAL, f"{incidents.MESSAGE} (incident {incidents.report(exc, 'ShouldRateLimit')})"
            )
        self.metrics.envoy_requests.labels("over_limit" if response.overall_code == _OVER else "ok").inc()
        return response

    async def answer(self, request: Any) -> Any:
        """The response to a ``RateLimitRequest`` (raises :class:`_Invalid`)."""
        matches, costs = self._matches(request)
        todo: list[int] = []
        inputs: list[PlainInput] = []
        for i, m in enumerate(matches):
            if m is not None and m.limit.route is not None:  # limited (an unlimited one has no route)
                todo.append(i)
                inputs.append((m.limit.route, m.key, costs[i], None))
        results = await self.decider.decide_many(inputs) if inputs else []
        by_index = dict(zip(todo, results))
        statuses: list[Any] = []
        over = quota = quota_over = 0
        # the headers: of a counted descriptor over the limit, else of the one closest to it
        chosen: tuple[int, int, dict[str, str]] | None = None  # (over first, remaining, headers)
        for i, m in enumerate(matches):
            res = by_index.get(i)
            status, counted = self._status(m, res)
            statuses.append(status)
            if m is None or m.limit.unlimited:
                continue
            is_over = status.code == _OVER
            if m.limit.quota_mode:
                quota += 1
                quota_over += is_over
            else:
                over += is_over
            if counted and isinstance(res, DecideResult):
                rank = (0 if is_over and not m.limit.quota_mode else 1, status.limit_remaining, res.headers)
                if chosen is None or rank[:2] < chosen[:2]:
                    chosen = rank
        code = _OVER if over or (quota and quota == quota_over) else _OK
        headers = []
        if chosen is not None:
            headers = [HeaderValue(key=k, value=v) for k, v in chosen[2].items() if code == _OVER or k != "Retry-After"]
        return _Response(overall_code=code, statuses=statuses, response_headers_to_add=headers)

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
            cost = default_cost
            if d.HasField("hits_addend"):
                cost = d.hits_addend.value
                if cost == 0:
                    raise _Invalid(f"descriptors[{i}].hits_addend: 0 (check without counting) is not supported")
            costs.append(cost)
            entries = [(e.key, e.value) for e in d.entries]
            matches.append(config.lookup(request.domain, entries) if config is not None and entries else None)
        replaced = {name for m in matches if m is not None for name in m.limit.replaces}
        if replaced:  # an unlimited one is never checked, so never replaced
            matches = [None if m and not m.limit.unlimited and m.limit.name in replaced else m for m in matches]
        return matches, costs

    def _status(self, m: Match | None, res: Any) -> tuple[Any, bool]:
        """A descriptor's status, and whether its answer counts (not shadowed)."""
        if m is None:
            return _Response.DescriptorStatus(code=_OK), False
        limit = m.limit
        if limit.unlimited:
            return _Response.DescriptorStatus(code=_OK, limit_remaining=_UNLIMITED_REMAINING), False
        current = self._current(limit)
        if not isinstance(res, DecideResult):
            return self._refused(limit, m.key, res, current)
        d = res.enforced or res.local
        counted = not (res.enforced_by == "local" and res.mode in _SHADOWED_MODES)
        code = _OK if res.allowed or not counted else _OVER
        reset = Duration(seconds=math.ceil(d.reset_after_us / 1_000_000))
        return (
            _Response.DescriptorStatus(
                code=code, current_limit=current, limit_remaining=max(0, d.remaining), duration_until_reset=reset
            ),
            counted,
        )

    def _refused(self, limit: EnvoyLimit, key: str, exc: Any, current: Any) -> tuple[Any, bool]:
        """An item the decider refused: a cost above the limit is over the limit (as
        envoyproxy/ratelimit answers it, unless shadowed); anything else is a bug."""
        if not (isinstance(exc, ValueError) and str(exc).startswith("cost:")):
            raise exc if isinstance(exc, BaseException) else RuntimeError(f"no decision for {limit.route}")
        route = limit.route or ""
        mode, percent = self.decider.modes.effective_mode(route)
        counted = path_for(mode, percent, route, key) is not Path.SHADOW
        unit_s = UNITS[limit.unit]
        reset = Duration(seconds=unit_s - int(time.time()) % unit_s)
        code = _OVER if counted else _OK
        return _Response.DescriptorStatus(code=code, current_limit=current, duration_until_reset=reset), counted

    def _current(self, limit: EnvoyLimit) -> Any:
        return _Response.RateLimit(
            requests_per_unit=limit.requests_per_unit, unit=self._limits[limit.unit], name=limit.name
        )
