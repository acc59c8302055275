"""Typed views of the replica's backend: its circuit breaker, failure policy and fleet
(``backend`` in a snapshot), and the limits services' breakers, cache and calls
(``external``). Lenient parsing, like :mod:`dashboard.models`, which re-exports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .coerce import as_dict, as_float, as_int, as_str, opt_float, opt_str

__all__ = ["BackendView", "ExternalBreakerView", "ExternalView"]


@dataclass(frozen=True, slots=True)
class BackendView:
    """The replica's circuit breaker, failure policy and fleet."""

    state: str = "closed"
    consecutive_failures: int = 0
    last_error: str | None = None
    next_probe_in_s: float | None = None
    probe_attempt: int = 0
    total_failures: int = 0
    opened_at: float | None = None
    failure_policy: str = ""
    failure_code: int = 429
    redis: str = ""
    live_instances: int = 1
    fleet: tuple[str, ...] = ()
    instance_id: str = ""
    shadow_queue: int = 0
    shadow_queue_capacity: int = 0
    shadow_dropped: int = 0
    shadow_evaluated: int = 0
    pending_rollbacks: tuple[str, ...] = ()
    distributed_enabled: bool = True
    redis_kind: str = ""  # standalone | cluster | sentinel
    redis_master: str = ""  # where decisions go now (cluster: the masters)
    redis_tls: str = ""  # "off", or how certificates are checked
    deadline_redis_timeout: int = 0  # answered by the failure policy: Redis not in time for the caller
    deadline_no_time: int = 0  # answered by the failure policy: too little time left to ask Redis
    over_limit_hits: int | None = None  # keys over their limit answered without Redis (None: cache off)
    over_limit_keys: int = 0
    # this replica's clock against Redis' TIME (None: not measured yet, or an older control plane)
    clock_offset_ms: float | None = None
    clock_tolerance_ms: float = 250.0
    clock_past_tolerance: bool = False  # the control plane's own judgement of the offset
    clock_reported: bool = False  # the snapshot has a clock at all
    clock_error: str | None = None
    time_source: str = "local"  # whose clock the policies are decided on: local | redis

    @classmethod
    def parse(cls, d: Any) -> BackendView:
        d = as_dict(d)
        topo = as_dict(d.get("redis_topology"))
        tls = topo.get("tls")
        late = as_dict(d.get("deadline_answers"))
        over = d.get("over_limit_cache")
        clock = d.get("clock")
        c = as_dict(clock)
        return cls(
            state=as_str(d.get("state"), "closed"),
            consecutive_failures=as_int(d.get("consecutive_failures")),
            last_error=opt_str(d.get("last_error")),
            next_probe_in_s=opt_float(d.get("next_probe_in_s")),
            probe_attempt=as_int(d.get("probe_attempt")),
            total_failures=as_int(d.get("total_failures")),
            opened_at=opt_float(d.get("opened_at")),
            failure_policy=as_str(d.get("failure_policy")),
            failure_code=as_int(d.get("failure_code"), 429),
            redis=as_str(d.get("redis")),
            live_instances=as_int(d.get("live_instances"), 1),
            fleet=tuple(str(m) for m in d.get("fleet") or ()),
            instance_id=as_str(d.get("instance_id")),
            shadow_queue=as_int(d.get("shadow_queue")),
            shadow_queue_capacity=as_int(d.get("shadow_queue_capacity")),
            shadow_dropped=as_int(d.get("shadow_dropped")),
            shadow_evaluated=as_int(d.get("shadow_evaluated")),
            pending_rollbacks=tuple(str(r) for r in d.get("pending_rollbacks") or ()),
            distributed_enabled=bool(d.get("distributed_enabled", True)),
            redis_kind=as_str(topo.get("kind")),
            redis_master=_masters(topo),
            redis_tls=_tls_summary(tls) if topo else "",
            deadline_redis_timeout=as_int(late.get("redis_timeout")),
            deadline_no_time=as_int(late.get("no_time")),
            over_limit_hits=as_int(as_dict(over).get("hits")) if isinstance(over, dict) else None,
            over_limit_keys=as_int(as_dict(over).get("keys")),
            clock_offset_ms=opt_float(c.get("offset_ms")),
            clock_tolerance_ms=as_float(c.get("tolerance_ms"), 250.0),
            clock_past_tolerance=c.get("past_tolerance") is True,
            clock_reported=isinstance(clock, dict),
            clock_error=opt_str(c.get("error")),
            time_source=as_str(d.get("time_source"), "local"),
        )


def _masters(topo: dict[str, Any]) -> str:
    masters = topo.get("masters")
    if isinstance(masters, list):
        return ", ".join(as_str(as_dict(m).get("address")) for m in masters)
    return as_str(topo.get("master"))


def _tls_summary(tls: Any) -> str:
    if not isinstance(tls, dict):
        return "off"
    verify = as_str(tls.get("verify"), "required")
    name = " + name" if tls.get("check_hostname") else ""
    mutual = " · client certificate" if tls.get("client_certificate") else ""
    return f"on (verify {verify}{name}{mutual})"


@dataclass(frozen=True, slots=True)
class ExternalBreakerView:
    """One key's circuit breaker in front of a route's limits service."""

    route: str
    key: str
    state: str
    failures: int
    next_probe_in_s: float | None
    last_error: str | None

    @classmethod
    def parse(cls, d: Any) -> ExternalBreakerView:
        d = as_dict(d)
        return cls(
            as_str(d.get("route")),
            as_str(d.get("key")),
            as_str(d.get("state"), "closed"),
            as_int(d.get("failures")),
            opt_float(d.get("next_probe_in_s")),
            opt_str(d.get("last_error")),
        )


@dataclass(frozen=True, slots=True)
class ExternalView:
    """Routes whose limits come from a limits service: breakers, cache, calls (``/v1/external``)."""

    routes: tuple[str, ...] = ()
    breakers_total: int = 0
    breakers_open: int = 0
    breakers_half_open: int = 0
    breakers: tuple[ExternalBreakerView, ...] = ()
    cache_enabled: bool = True
    cache_available: bool = True
    cache_hits: int = 0
    cache_misses: int = 0
    stale_used: int = 0
    hit_ratio: float | None = None
    calls_ok: int = 0
    calls_failed: int = 0
    static_fallbacks: int = 0

    @classmethod
    def parse(cls, d: Any) -> ExternalView | None:
        if not isinstance(d, dict):
            return None
        cache = as_dict(d.get("cache"))
        calls = {str(k): as_int(v) for k, v in as_dict(d.get("calls")).items()}
        return cls(
            routes=tuple(as_str(as_dict(r).get("route")) for r in d.get("routes") or ()),
            breakers_total=as_int(d.get("breakers_total")),
            breakers_open=as_int(d.get("breakers_open")),
            breakers_half_open=as_int(d.get("breakers_half_open")),
            breakers=tuple(ExternalBreakerView.parse(b) for b in d.get("breakers") or ()),
            cache_enabled=bool(cache.get("enabled", True)),
            cache_available=bool(cache.get("available", True)),
            cache_hits=as_int(cache.get("hit")),
            cache_misses=as_int(cache.get("miss")),
            stale_used=as_int(cache.get("stale")),
            hit_ratio=opt_float(cache.get("hit_ratio")),
            calls_ok=calls.get("ok", 0),
            calls_failed=sum(v for k, v in calls.items() if k != "ok"),
            static_fallbacks=as_int(as_dict(d.get("sources")).get("static")),
        )
