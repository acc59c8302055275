"""The admin API (docs/api.md#the-admin-api): ``/ratelimit/stats``, ``/ratelimit/clients``, ``/ratelimit/reset/{id}``,
``/ratelimit/config``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

from limiter import Policy
from limiter.errors import BackendError
from limiter.keys import InvalidKeyError, validate_key

from ..decision import UnknownRoute
from ..model.rollout import AuditEntry
from ..store import StoreUnavailable
from . import examples
from .deps import AdjustmentsDep, AdminDep, ApiError, EngineDep, OperatorDep, RulesDep, actor_of
from .openapi import errors, json_request, ok
from .readmodels import key_policies
from .requests import json_body
from .responses import ClientsList, ConfigResult, ResetResult, RulesReloaded, Stats
from .schemas import ADJUST_MAX_PERIOD_S, KEY_LEN, ConfigAdjust

_BAD_RULES = {
    "error": "invalid_rules",
    "message": "/etc/shadowlimit/rules.yaml:7: routes[1].local.average: must be >= 0",
    "field": "routes[1].local.average",
    "line": 7,
}

router = APIRouter(prefix="/ratelimit", tags=["admin"])

ConfigAdjustBody = Annotated[ConfigAdjust, json_body(ConfigAdjust)]


def _counter_total(counter: Any, **labels: str) -> float:
    total = 0.0
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


@router.get("/stats", responses=ok(Stats, examples.STATS))
async def stats(engine: EngineDep) -> dict[str, Any]:
    """Totals since start: checks allowed/denied per limiter, active clients, modes, backend."""
    m = engine.metrics
    return {
        "instance_id": engine.instance_id,
        "uptime_s": round(engine.clock() - engine.started_at, 1),
        "requests": {
            lt: {
                "allowed": int(_counter_total(m.requests, limiter_type=lt, status="allowed")),
                "denied": int(_counter_total(m.requests, limiter_type=lt, status="denied")),
            }
            for lt in ("local", "distributed")
        },
        "exceeded": {
            lt: int(_counter_total(m.exceeded, limiter_type=lt)) for lt in ("local", "distributed", "failure_policy")
        },
        "active_clients": {"local": len(engine.local), "fallback": len(engine.resilient.fallback)},
        "routes": {name: engine.rollout.state_for(name).label() for name in engine.rules.names()},
        "shadow": {
            "evaluated": engine.comparisons.evaluated,
            "dropped": engine.comparisons.dropped,
            "queued": len(engine.shadow),
        },
        "backend": {
            "state": engine.breaker.state.value,
            "failure_policy": engine.resilient.failure_policy.value,
            "errors": engine.resilient.backend_errors,
        },
        "adjustments": engine.adjustments.listing(),
    }


@router.get("/clients", responses={**ok(ClientsList, examples.CLIENTS), **errors(422)})
async def clients(
    engine: EngineDep, route: str | None = Query(None, max_length=256), limit: int = Query(50, ge=1, le=1000)
) -> dict[str, Any]:
    """Active rate-limited clients on this replica, most recently used first."""
    items = list(engine.local.items())
    items.reverse()
    out = []
    for info in items:
        r, _, key = info.key.partition(":")
        if route and r != route:
            continue
        rule = engine.rules.get(r)
        view = None
        if rule is not None:
            lp, _ = key_policies(engine.activity, engine.adjustments, rule, key)
            view = engine.local.peek(info.key, lp, engine.decider.clock_us()).to_dict()
        out.append(
            {
                "route": r,
                "key": key,
                "algorithm": info.algorithm.value,
                "last_seen_us": info.last_seen_us,
                "local": view,
            }
        )
        if len(out) >= limit:
            break
    return {"clients": out, "total": len(engine.local)}


@router.post("/reset/{client_id:key}", responses={**ok(ResetResult, examples.RESET), **errors(404, 422, 503)})
async def reset(
    request: Request,
    engine: EngineDep,
    _: OperatorDep,
    client_id: str = Path(
        min_length=KEY_LEN[0], max_length=KEY_LEN[1], description="The rate-limit key, as /v1/decide takes it."
    ),
    route: str | None = Query(None, max_length=256),
) -> dict[str, Any]:
    """Reset one client's buckets (local on this replica and distributed), on one route or all."""
    try:  # a key /v1/decide would accept (no bucket is held under another), checked the same way
        validate_key(client_id, field="client_id")
    except InvalidKeyError as exc:
        raise ApiError(422, "invalid_key", str(exc), field=exc.field) from exc
    names = [route] if route else engine.rules.names()
    if route and engine.rules.get(route) is None:
        raise ApiError(404, "unknown_route", f"no route named {route!r}", field="route")
    local_reset = 0
    dist_reset = 0
    try:
        for name in names:
            lk = f"{name}:{client_id}"
            local_reset += engine.local.reset(lk)
            engine.resilient.fallback.reset(lk)
            if engine.decider.over_limit is not None:
                engine.decider.over_limit.forget(lk)
            dist_reset += await engine.redis.reset(lk)
        await engine.store.append_audit(
            AuditEntry(
                route=route or "*",
                actor=actor_of(request),
                from_mode="",
                to_mode="reset",
                reason=f"reset client {client_id}",
                at=engine.clock(),
                kind="reset",
            )
        )
    except (BackendError, StoreUnavailable) as exc:
        raise ApiError(
            503,
            "backend_unavailable",
            f"Redis is unreachable; the local buckets were reset ({local_reset}) but not the distributed ones: {exc}",
        ) from exc
    return {"id": client_id, "routes": names, "local_reset": local_reset, "distributed_reset": dist_reset}


def _adjusted_policy(change: ConfigAdjust) -> Policy:
    """The policy of an adjustment: ``limit`` text, or ``average`` (and ``period``); a 422
    naming the field otherwise."""
    algorithm = change.algorithm or "token_bucket"
    try:
        if change.limit is not None:
            if change.average is not None or change.period is not None:
                raise ValueError('limit: give limit (like "100/minute") or average and period, not both')
            policy = Policy.parse(change.limit, burst=change.burst, algorithm=algorithm)
            if policy.period > ADJUST_MAX_PERIOD_S:
                raise ValueError(
                    f"limit: a runtime adjustment's period is at most {ADJUST_MAX_PERIOD_S} s, got {change.limit!r}"
                )
            return policy
        if change.average is None:
            raise ValueError('average: required (or give limit, like "100/minute")')
        period = change.period if change.period is not None else 1.0
        return Policy(average=change.average, period=period, burst=change.burst, algorithm=algorithm)
    except ValueError as exc:
        raise ApiError(422, "invalid_request", str(exc), field=str(exc).split(":", 1)[0]) from exc


@router.put(
    "/config",
    responses={**ok(ConfigResult, examples.CONFIG), **errors(404, 413, 422, 503)},
    openapi_extra=json_request(ConfigAdjust, examples.CONFIG_REQUEST),
)
async def config(
    request: Request,
    adjustments: AdjustmentsDep,
    _: OperatorDep,
    change: ConfigAdjustBody,
) -> dict[str, Any]:
    """Adjust a route's (or one client's) limit at runtime, fleet-wide and audited."""
    policy = None
    rule = request.app.state.engine.rules.get(change.route)
    if rule is not None and not rule.http and not change.clear:
        raise ApiError(
            422,
            "invalid_request",
            f"route {change.route!r} takes its limit from the Envoy configuration (SHADOWLIMIT_ENVOY_CONFIG):"
            " change the file, it is reloaded",
            field="route",
        )
    if not change.clear:
        if change.key is not None:
            # the key /v1/decide would accept, checked the same way (clearing takes any
            # stored key, so one saved before this check can still be removed)
            try:
                validate_key(change.key, field="key")
            except InvalidKeyError as exc:
                raise ApiError(422, "invalid_key", str(exc), field=exc.field) from exc
        policy = _adjusted_policy(change)
    try:
        entry = await adjustments.adjust(
            change.route, change.key, change.target, policy, reason=change.reason, actor=actor_of(request)
        )
    except UnknownRoute as exc:
        raise ApiError(404, "unknown_route", f"no route named {exc.route!r}", field="route") from exc
    except StoreUnavailable as exc:
        raise ApiError(503, "backend_unavailable", f"Redis is unreachable, nothing was changed: {exc}") from exc
    return {"adjustments": adjustments.listing(), "audit": entry.to_dict()}


@router.post(
    "/rules/reload",
    responses={**ok(RulesReloaded, examples.RULES_RELOADED), **errors(422, e422=_BAD_RULES)},
)
async def reload_rules(live: RulesDep, _: AdminDep) -> dict[str, Any]:
    """Re-read the rules file now; a bad file keeps the last good rules and is reported."""
    from ..rules import RulesError

    try:
        rules = await live.reload_async()  # read off the event loop (control_plane/rules/offload.py)
    except RulesError as exc:
        await live.settle()  # the answer comes after the reload is on record
        raise ApiError(
            422, "invalid_rules", str(exc), field=getattr(exc, "field", None), line=getattr(exc, "line", None)
        ) from exc
    await live.settle()
    return {"routes": rules.names(), "digest": rules.digest, "source": rules.source}
