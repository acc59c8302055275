"""What-if: ``POST /v1/whatif`` replays a route's recorded requests against a candidate
policy; ``POST /v1/whatif/suggest`` searches the smallest limit within a rejection share.

Neither changes anything (no admin token needed: read access, as the other views). Both
are bounded: one replay at a time per process (another gets 503 ``busy``), at most
:data:`MAX_EVENTS` recorded requests (more: 422, ask for fewer minutes), and the decoding
and replays run in one dedicated worker thread, off the event loop (they still share the
interpreter with it: a long replay slows the replica's requests a little, never stops them).
See :mod:`control_plane.whatif`.
"""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field

from limiter.policy import NO_LOG_CHARGE, Policy, takes_charges
from limiter.reservations import Terms

from ..rules.model import ROUTE_NAME_MAX
from ..whatif.recorder import TooManyEvents, decode
from ..whatif.replay import ReplayResult, replay, replay_budget
from . import examples
from .deps import ApiError
from .openapi import errors, json_request, ok
from .requests import json_body
from .schemas import ADJUST_MAX_PERIOD_S, StrictBody
from .whatif_models import Suggestion, WhatIfResult

router = APIRouter(prefix="/v1", tags=["whatif"])

Algorithm = Literal["token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log"]

#: the most recorded requests one replay takes
MAX_EVENTS = 2_000_000
#: the highest average the suggestion searches
MAX_AVERAGE = 1e9
_RECORDING_OFF = {
    "error": "recording_off",
    "message": "recording is turned off (SHADOWLIMIT_RECORD=false)",
    "field": "route",
}
_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="whatif")
_BUSY = asyncio.Lock()


async def _off_loop(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, fn, *args)


class _one_at_a_time:  # noqa: N801 - used as a statement: async with _one_at_a_time()
    """One replay at a time in this process; another is told to come back (503 busy)."""

    async def __aenter__(self) -> None:
        if _BUSY.locked():
            raise ApiError(503, "busy", "another what-if replay is running on this replica; try again shortly")
        await _BUSY.acquire()

    async def __aexit__(self, *exc: object) -> None:
        _BUSY.release()


class PolicyIn(StrictBody):
    algorithm: Algorithm = "token_bucket"
    average: float = Field(..., gt=0, le=MAX_AVERAGE, description="Tokens (requests) per period.")
    period: float = Field(1.0, gt=0, le=ADJUST_MAX_PERIOD_S, description="Seconds.")
    burst: int | None = Field(None, ge=1, le=1_000_000_000, description="Bucket size (default ceil(average)).")


class WhatIfRequest(StrictBody):
    route: str = Field(..., min_length=1, max_length=ROUTE_NAME_MAX)
    policy: PolicyIn
    minutes: int = Field(15, ge=1, le=24 * 60)


class SuggestRequest(StrictBody):
    route: str = Field(..., min_length=1, max_length=ROUTE_NAME_MAX)
    algorithm: Algorithm = "token_bucket"
    max_reject_share: float = Field(..., ge=0, le=1, description="0.005 = at most 0.5% of requests rejected.")
    minutes: int = Field(15, ge=1, le=24 * 60)


WhatIfBody = Annotated[WhatIfRequest, json_body(WhatIfRequest)]
SuggestBody = Annotated[SuggestRequest, json_body(SuggestRequest)]


async def _recording(request: Request, route: str, minutes: int) -> tuple[Any, Any, dict[str, Any], float, int]:
    engine = request.app.state.engine
    rule = engine.rules.get(route)
    if rule is None:
        raise ApiError(404, "unknown_route", f"no route named {route!r}", field="route")
    recorder = engine.recorder
    if not recorder.enabled:
        raise ApiError(409, "recording_off", "recording is turned off (SHADOWLIMIT_RECORD=false)", field="route")
    if minutes > recorder.minutes:
        raise ApiError(
            422,
            "invalid_request",
            f"minutes: at most {recorder.minutes} minutes are kept (SHADOWLIMIT_RECORD_MINUTES), got {minutes}",
            field="minutes",
        )
    await recorder.flush()  # this replica's latest requests too
    try:
        raw, decided = await recorder.read_raw(route, minutes)
    except Exception as exc:  # noqa: BLE001 - Redis is the only thing this reads
        raise ApiError(
            503, "backend_unavailable", f"Redis is unreachable, the recording cannot be read: {exc}"
        ) from exc
    try:
        by_key, share, with_data = await _off_loop(decode, raw, decided, MAX_EVENTS)
    except TooManyEvents as exc:
        raise ApiError(
            422, "invalid_request", f"minutes: {exc} in {minutes} minutes; ask for fewer minutes", field="minutes"
        ) from exc
    if not by_key:
        raise ApiError(404, "no_recording", f"no recorded requests for route {route!r} in {minutes} min", field="route")
    _, dp = engine.adjustments.route_policies(rule)
    return rule, dp, by_key, share, with_data


def _policy(p: PolicyIn) -> Policy:
    try:
        return Policy(average=p.average, period=p.period, burst=p.burst, algorithm=p.algorithm)
    except ValueError as exc:
        field = str(exc).split(":", 1)[0]
        raise ApiError(422, "invalid_request", f"policy.{exc}", field=f"policy.{field}") from exc


@router.post(
    "/whatif",
    responses={**ok(WhatIfResult, examples.WHATIF), **errors(404, 409, 413, 422, 503, e409=_RECORDING_OFF)},
    openapi_extra=json_request(WhatIfRequest, examples.WHATIF_REQUEST),
)
async def whatif(body: WhatIfBody, request: Request) -> dict[str, Any]:
    """Replay the route's recorded requests of the last ``minutes`` against ``policy``
    and against the route's current global policy (a budget route's: its charges, and its
    reservations reserved and settled as they were, ``units`` per key what the refused reserves
    would have held)."""
    candidate = _policy(body.policy)
    async with _one_at_a_time():
        rule, current, by_key, share, with_data = await _recording(request, body.route, body.minutes)
        if rule.budget is not None and not takes_charges(candidate):
            raise ApiError(422, "invalid_request", f"policy.{NO_LOG_CHARGE}", field="policy.algorithm")
        cand, cur = await _off_loop(_both, by_key, candidate, current, share, rule.budget)
    return {
        "route": rule.name,
        "minutes": body.minutes,
        "minutes_recorded": with_data,
        "recorded_share": share,
        "candidate": cand.to_dict(),
        "current": cur.to_dict(),
    }


def _both(
    by_key: dict[str, Any], a: Policy, b: Policy, share: float, terms: Terms | None
) -> tuple[ReplayResult, ReplayResult]:
    if terms is not None:  # a budget route
        return replay_budget(by_key, a, terms, recorded_share=share), replay_budget(
            by_key, b, terms, recorded_share=share
        )
    return replay(by_key, a, recorded_share=share), replay(by_key, b, recorded_share=share)


@router.post(
    "/whatif/suggest",
    responses={**ok(Suggestion, examples.SUGGEST), **errors(404, 409, 413, 422, 503, e409=_RECORDING_OFF)},
    openapi_extra=json_request(SuggestRequest, examples.SUGGEST_REQUEST),
)
async def suggest(body: SuggestBody, request: Request) -> dict[str, Any]:
    """The smallest average (burst in the current policy's proportion) whose replay rejects
    at most ``max_reject_share`` of the recorded requests."""
    async with _one_at_a_time():
        rule, current, by_key, share, with_data = await _recording(request, body.route, body.minutes)
        found = await _off_loop(_search, by_key, body.algorithm, current, body.max_reject_share, share)
    if found is None:
        raise ApiError(
            422, "no_policy", "no policy up to 10^9 per period stays within that share", field="max_reject_share"
        )
    return {
        "route": rule.name,
        "minutes": body.minutes,
        "minutes_recorded": with_data,
        "recorded_share": share,
        "max_reject_share": body.max_reject_share,
        "policy": found.policy.to_dict(),
        "policy_describe": found.policy.describe(),
        "replay": found.to_dict(),
    }


def _search(
    by_key: dict[str, Any], algorithm: str, current: Policy, target: float, share: float
) -> ReplayResult | None:
    """Binary search over the average (period and burst/average ratio of ``current``)."""
    ratio = current.burst / current.average if not current.unlimited and current.average > 0 else 1.0

    def run(avg: float) -> ReplayResult | None:
        burst = min(1_000_000_000, max(1, math.ceil(avg * ratio)))
        try:
            policy = Policy(average=avg, period=current.period, burst=burst, algorithm=algorithm)
        except ValueError:  # beyond what the limiter accepts (e.g. gcra's 1 us per token)
            return None
        return replay(by_key, policy, recorded_share=share)

    lo, hi = 0.0, 1.0
    best = run(hi)
    while best is None or best.reject_share > target:
        if best is None or hi >= MAX_AVERAGE:
            return None
        lo, hi = hi, min(MAX_AVERAGE, hi * 4)
        best = run(hi)
    for _ in range(20):  # integer averages: a few more steps than log2(hi)
        if hi - lo <= max(1.0, hi * 0.01):
            break
        mid = math.floor((lo + hi) / 2) or 1.0
        if mid >= hi:
            break
        r = run(mid)
        if r is not None and r.reject_share <= target:
            hi, best = mid, r
        else:
            lo = mid
    return best
