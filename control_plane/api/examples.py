"""One example per endpoint for ``/openapi.json`` (answers taken from a real replica running
``tests/cp_server.py``'s rules, lists trimmed). ``tests/e2e/test_api_schema.py`` checks
each against its declared schema."""

from __future__ import annotations

from typing import Any

_POLICY_10 = {"algorithm": "token_bucket", "average": 10.0, "period": 1.0, "burst": 10}
_GATE = {
    "passed": False,
    "required": True,
    "reasons": ["only 120 compared decisions in the last 300s (need 500)"],
    "window_s": 300,
    "compared": 120,
    "min_samples": 500,
    "new_rejections": 0,
    "new_rejection_rate": 0.0,
    "max_new_rejection_rate": 0.01,
    "backend_errors": 0,
    "backend_error_rate": 0.0,
    "max_backend_error_rate": 0.001,
    "shadow_dropped": 0,
    "sampled_share": 1.0,
    "min_sampled_share": 0.9,
}
_STATE = {
    "mode": "shadow",
    "canary_percent": 0,
    "updated_at": 1795710208.09,
    "updated_by": "alice@10.0.0.7",
    "reason": "start measuring",
    "version": 1,
}
_AUDIT = {
    "id": "1795710208089-0",
    "kind": "mode_change",
    "route": "search",
    "actor": "alice@10.0.0.7",
    "at": 1795710208.09,
    "from": "off",
    "to": "shadow",
    "from_percent": 0,
    "to_percent": 0,
    "reason": "start measuring",
    "forced": False,
    "automatic": False,
    "gate": {**_GATE, "passed": True, "required": False, "reasons": []},
}
_TOTALS = {
    "agree": 119,
    "local_allow_distributed_deny": 1,
    "local_deny_distributed_allow": 0,
    "compared": 120,
    "backend_errors": 0,
    "distributed_attempts": 120,
    "shadow_dropped": 0,
    "cause_replicas": 0,
    "cause_tighter": 1,
    "cause_fresh_local": 0,
    "cause_clock": 0,
    "cause_uneven": 0,
    "cause_looser": 0,
    "minutes": 5,
    "new_rejection_rate": 0.008333,
    "reverse_rate": 0.0,
    "backend_error_rate": 0.0,
    "sampled_share": 1.0,
}
_MINUTE = {k: v for k, v in _TOTALS.items() if not k.endswith("rate") and k not in ("minutes", "sampled_share")}
_BUCKET = {"tokens": 7.5, "limit": 10, "exists": True, "reset_after_us": 250000}
_REPLAY = {
    "policy": {"algorithm": "token_bucket", "average": 5.0, "period": 1.0, "burst": 5},
    "policy_describe": "5/1s burst 5 (token_bucket)",
    "events": 19,
    "keys": 4,
    "requests": 19.0,
    "rejections": 8.0,
    "reject_share": 0.421053,
    "top_keys": [{"key": "alice", "requests": 13.0, "rejections": 8.0}],
    "per_minute": [{"minute": 1795710180, "requests": 19.0, "rejections": 8.0}],
    "recorded_share": 1.0,
}
_HEADERS = {
    "X-RateLimit-Limit": "10",
    "X-RateLimit-Remaining": "9",
    "X-RateLimit-Reset": "1795710209",
    "RateLimit-Policy": '"search";q=10;w=1',
    "RateLimit": '"search";r=9;t=1',
}

DECIDE_REQUEST: dict[str, Any] = {"route": "search", "key": "alice"}
DECISION: dict[str, Any] = {
    "allowed": True,
    "route": "search",
    "mode": "shadow",
    "canary_percent": 0,
    "enforced_by": "local",
    "key": "alice",
    "request_id": "2fce927b8478-13",
    "status_code": 200,
    "local": {"allowed": True, "remaining": 9, "limit": 10, "retry_after_us": 0, "reset_after_us": 100000},
    "distributed": None,
    "divergence": None,
    "list_match": None,
    "backend_error": None,
    "limits_source": None,
    "backend_url": None,
    "headers": _HEADERS,
}
REJECTION: dict[str, Any] = {
    **DECISION,
    "allowed": False,
    "status_code": 429,
    "local": {"allowed": False, "remaining": 0, "limit": 10, "retry_after_us": 83397, "reset_after_us": 983397},
    "headers": {**_HEADERS, "X-RateLimit-Remaining": "0", "RateLimit": '"search";r=0;t=1', "Retry-After": "1"},
    "error": "rate limit exceeded",
    "message": "Too many requests. Please try again later.",
    "identifier": "search:alice",
}
BATCH_REQUEST: dict[str, Any] = {"requests": [{"route": "search", "key": "alice"}, {"route": "nope", "key": "bob"}]}
BATCH: dict[str, Any] = {
    "decisions": [
        DECISION,
        {"error": "unknown_route", "message": "no route named 'nope'", "index": 1, "field": "route", "status": 404},
    ]
}
CHARGE_REQUEST: dict[str, Any] = {"route": "search", "key": "alice", "cost": 25}
CHARGE: dict[str, Any] = {
    "route": "search",
    "key": "alice",
    "cost": 25,
    "over": True,
    "remaining": -16,
    "limit": 10,
    "retry_after_us": 1700000,
    "reset_after_us": 2600000,
    "mode": "shadow",
    "enforced_by": "local",
    "request_id": "2fce927b8478-14",
    "local": {"allowed": False, "remaining": -16, "limit": 10, "retry_after_us": 1700000, "reset_after_us": 2600000},
    "distributed": None,
    "backend_error": None,
}
CHARGE_BATCH_REQUEST: dict[str, Any] = {
    "charges": [{"route": "search", "key": "alice", "cost": 25}, {"route": "nope", "key": "bob", "cost": 3}]
}
CHARGE_BATCH: dict[str, Any] = {
    "charges": [
        CHARGE,
        {"error": "unknown_route", "message": "no route named 'nope'", "index": 1, "field": "route", "status": 404},
    ]
}

_POLICY_5 = {"algorithm": "token_bucket", "average": 5.0, "period": 1.0, "burst": 5}
_LIMIT_10 = {
    "in_force": _POLICY_10,
    "rules": _POLICY_10,
    "adjusted": False,
    "describe": "10/1s burst 10 (token_bucket)",
}
_CANDIDATE_GATE = {
    "passed": False,
    "required": True,
    "reasons": ["only 120 compared decisions since the candidate was set 95s ago (need 500)"],
    "window_s": 300,
    "compared": 120,
    "min_samples": 500,
    "new_rejections": 6,
    "new_rejection_rate": 0.05,
    "max_new_rejection_rate": 0.01,
    "backend_errors": 0,
    "backend_error_rate": 0.0,
    "max_backend_error_rate": 0.001,
    "shadow_dropped": 0,
    "sampled_share": 1.0,
    "min_sampled_share": 0.9,
    "in_step_s": 95.0,
    "min_dwell_s": 600.0,
}
_CANDIDATE_TOTALS = {
    "agree": 114, "newly_rejected": 6, "newly_admitted": 0, "errors": 0, "dropped": 0, "compared": 120,
    "newly_rejected_share": 0.05, "newly_admitted_share": 0.0, "sampled_share": 1.0,
}  # fmt: skip
_CANDIDATE = {
    "id": "4f1c2a9b7e10",
    "policy": _POLICY_5,
    "describe": "5/1s burst 5 (token_bucket)",
    "since": 1795710115.2,
    "age_s": 95.0,
    "actor": "alice@10.0.0.7",
    "reason": "tighten checkout",
    "totals": _CANDIDATE_TOTALS,
    "gate": _CANDIDATE_GATE,
}
_CANDIDATE_AUDIT = {
    **_AUDIT,
    "id": "1795710115201-0",
    "kind": "candidate",
    "route": "checkout",
    "at": 1795710115.2,
    "from": "",
    "to": "candidate 5/1s burst 5 (token_bucket)",
    "reason": "tighten checkout",
    "gate": None,
}
CANDIDATE_REQUEST: dict[str, Any] = {"limit": "5/second", "reason": "tighten checkout"}
CANDIDATE_SET: dict[str, Any] = {
    "route": "checkout",
    "candidate": {**_CANDIDATE, "age_s": 0.0, "since": 1795710115.2, "totals": None, "gate": None},
    "audit": _CANDIDATE_AUDIT,
}
CANDIDATE_ACTION: dict[str, Any] = {"reason": "not now"}
CANDIDATE_PROMOTE: dict[str, Any] = {"reason": "clean for a day"}
CANDIDATE_DROPPED: dict[str, Any] = {
    "route": "checkout",
    "candidate": None,
    "audit": {**_CANDIDATE_AUDIT, "to": "dropped candidate 5/1s burst 5 (token_bucket)", "reason": "not now"},
}
CANDIDATE_PROMOTED: dict[str, Any] = {
    "route": "checkout",
    "limit": _POLICY_5,
    "adjustment": {
        **_CANDIDATE_AUDIT, "kind": "config_change", "to": "5/1s burst 5 (token_bucket)",
        "reason": "promoted candidate: clean for a day (distributed)",
    },
    "audit": {
        **_CANDIDATE_AUDIT, "to": "promoted candidate 5/1s burst 5 (token_bucket)", "reason": "clean for a day",
        "gate": {**_CANDIDATE_GATE, "passed": True, "reasons": [], "compared": 5210, "new_rejections": 3,
                 "new_rejection_rate": 0.000576, "in_step_s": 86400.0},
    },
    "gate": {**_CANDIDATE_GATE, "passed": True, "reasons": [], "compared": 5210, "new_rejections": 3,
             "new_rejection_rate": 0.000576, "in_step_s": 86400.0},
}  # fmt: skip

ROUTES: dict[str, Any] = {
    "routes": [
        {
            "name": "search",
            "mode": "shadow",
            "stored_mode": "shadow",
            "canary_percent": 0,
            "state": _STATE,
            "rule": {
                "name": "search",
                "methods": ["GET"],
                "path": "/api/search/**",
                "key": {"strategy": "header", "header": "X-Client-Id"},
                "local": _POLICY_10,
                "distributed": _POLICY_10,
                "local_describe": "10/1s burst 10 (token_bucket)",
                "distributed_describe": "10/1s burst 10 (token_bucket)",
            },
            "decisions_per_s": 1.9,
            "deadline_answers": {"redis_timeout": 0, "no_time": 0},
            "divergence_5m": _TOTALS,
            "next_step": {"mode": "canary", "canary_percent": 10},
            "gate": {"target": "canary", "target_percent": 10, **_GATE},
            "figures_age_s": 0.6,
            "limit": _LIMIT_10,
            "candidate": None,
        },
        {
            "name": "checkout",
            "mode": "enforce",
            "stored_mode": "enforce",
            "canary_percent": 0,
            "state": {**_STATE, "mode": "enforce", "reason": "canary clean", "version": 5},
            "rule": {
                "name": "checkout",
                "methods": ["POST"],
                "path": "/api/checkout",
                "key": {"strategy": "clientIP", "forwarded_mode": "first"},
                "local": _POLICY_10,
                "distributed": _POLICY_10,
                "local_describe": "10/1s burst 10 (token_bucket)",
                "distributed_describe": "10/1s burst 10 (token_bucket)",
            },
            "decisions_per_s": 0.4,
            "deadline_answers": {"redis_timeout": 0, "no_time": 0},
            "divergence_5m": _TOTALS,
            "next_step": None,  # enforced: no next step, no gate
            "gate": None,
            "figures_age_s": 0.6,
            "limit": _LIMIT_10,
            "candidate": _CANDIDATE,
        },
    ],
    "distributed_enabled": True,
    "rules_source": "/etc/shadowlimit/rules.yaml",
    "rules_error": None,
    "figures_age_s": 0.6,
    "figures_error": None,
}
MODE_REQUEST: dict[str, Any] = {"mode": "shadow", "reason": "start measuring"}
MODE_CHANGED: dict[str, Any] = {"route": "search", "state": _STATE, "audit": _AUDIT, "gate": _AUDIT["gate"]}
AUDIT: dict[str, Any] = {"entries": [_AUDIT]}

DIVERGENCE: dict[str, Any] = {
    "minutes": 1,
    "routes": {
        "search": {
            "totals": {**_TOTALS, "minutes": 1},
            "series": [{"minute": 1795710180, **_MINUTE}],
            "would_be_blocked": [
                {"key": "alice", "count": 1, "last_request_id": "2fce927b8478-14", "cause": "tighter"}
            ],
            "causes": {
                "explain": True,
                "meaning": {
                    "replicas": "the fleet multiplied the old limit",
                    "tighter": "the new limit is tighter",
                    "fresh_local": "a replica's bucket was new (restart or eviction)",
                    "clock": "a replica's clock is off",
                    "uneven": "the load was uneven over the replicas",
                    "looser": "the new limit is looser",
                },
                "new_rejections": {
                    "total": 1,
                    "by_cause": {"clock": 0, "fresh_local": 0, "replicas": 0, "tighter": 1},
                    "unexplained": 0,
                    "shares": {"clock": 0.0, "fresh_local": 0.0, "replicas": 0.0, "tighter": 1.0},
                    "summary": "100% the new limit is tighter",
                },
                "reverse": {
                    "total": 0,
                    "by_cause": {"looser": 0, "uneven": 0},
                    "unexplained": 0,
                    "shares": {"looser": 0.0, "uneven": 0.0},
                    "summary": "",
                },
            },
            "candidate": {
                **_CANDIDATE,
                "series": [
                    {
                        "minute": 1795710180,
                        "agree": 114,
                        "newly_rejected": 6,
                        "newly_admitted": 0,
                        "errors": 0,
                        "dropped": 0,
                    },
                ],
                "would_be_blocked": [{"key": "bob", "count": 6, "last_request_id": "2fce927b8478-31"}],
            },
        }
    },
    "as_of": 1795710210.1,
    "age_s": 0.4,
    "error": None,
}
BUCKETS: dict[str, Any] = {
    "buckets": [
        {
            "route": "search",
            "key": "alice",
            "recent_requests": 13,
            "local": {**_BUCKET, "burst": 10, "policy": _POLICY_10},
            "distributed": {**_BUCKET, "tokens": 8.0, "burst": 10, "policy": _POLICY_10},
            "last_decision": {"at": 1795710208.07, "allowed": False, "enforced_by": "local"},
        }
    ]
}
BACKEND: dict[str, Any] = {
    "state": "closed",
    "consecutive_failures": 0,
    "last_error": None,
    "last_failure_at": None,
    "opened_at": None,
    "next_probe_in_s": None,
    "probe_attempt": 0,
    "total_failures": 0,
    "transitions": 0,
    "failure_policy": "inMemoryFallback",
    "failure_code": 429,
    "redis": "10.0.0.5:6379",
    "redis_topology": {"kind": "standalone", "master": "10.0.0.5:6379"},
    "time_source": "local",
    "clock": {
        "offset_ms": 0.412,
        "round_trip_ms": 0.198,
        "tolerance_ms": 250.0,
        "past_tolerance": False,
        "measured_at_us": 1795710208431022,
        "error": None,
    },
    "live_instances": 1,
    "fleet": ["2fce927b8478"],
    "instance_id": "2fce927b8478",
    "fallback_decisions": 0,
    "backend_errors": 0,
    "shadow_queue": 0,
    "shadow_queue_capacity": 10000,
    "shadow_dropped": 0,
    "shadow_evaluated": 16,
    "deadline_answers": {"redis_timeout": 0, "no_time": 0},
    "over_limit_cache": {"keys": 0, "max_keys": 65536, "hits": 0, "stored": 0},
    "auto_rollback_after_s": 30.0,
    "pending_rollbacks": [],
    "distributed_enabled": True,
}
EXTERNAL: dict[str, Any] = {
    "instance_id": "2fce927b8478",
    "routes": [{"route": "tenants", "url": "http://limits.internal:9100/limits", "in_flight": 0}],
    "breakers": [
        {
            "route": "tenants",
            "key": "acme",
            "state": "open",
            "failures": 5,
            "total_failures": 5,
            "next_probe_in_s": 2.5,
            "open_for_s": 1.2,
            "idle_s": 0.3,
            "last_error": "timeout",
        }
    ],
    "breakers_total": 1,
    "breakers_open": 1,
    "breakers_half_open": 0,
    "cache": {"enabled": True, "available": True, "hit": 40, "miss": 2, "stale": 1, "hit_ratio": 0.9524, "errors": 0},
    "calls": {"ok": 2, "timeout": 5, "error": 0, "invalid": 0},
    "errors": {"timeout": 5},
    "sources": {"external": 2, "cache": 40, "stale": 1, "static": 0},
    "shared_calls": 0,
    "breaker_transitions": {"closed": 0, "open": 1, "half_open": 0},
    "backend_hosts": ["*.backend.internal"],
    "backend_url_rejected": 0,
}
STATS: dict[str, Any] = {
    "instance_id": "2fce927b8478",
    "uptime_s": 2.7,
    "requests": {"local": {"allowed": 16, "denied": 3}, "distributed": {"allowed": 3, "denied": 0}},
    "exceeded": {"local": 3, "distributed": 0, "failure_policy": 0},
    "active_clients": {"local": 4, "fallback": 0},
    "routes": {"search": "canary 10%", "login": "shadow"},
    "shadow": {"evaluated": 16, "dropped": 0, "queued": 0},
    "backend": {"state": "closed", "failure_policy": "inMemoryFallback", "errors": 0},
    "adjustments": [],
}
CLIENTS: dict[str, Any] = {
    "clients": [
        {
            "route": "search",
            "key": "alice",
            "algorithm": "token_bucket",
            "last_seen_us": 1795710208074802,
            "local": _BUCKET,
        }
    ],
    "total": 1,
}
RESET: dict[str, Any] = {"id": "alice", "routes": ["search", "login"], "local_reset": 1, "distributed_reset": 1}
CONFIG_REQUEST: dict[str, Any] = {"route": "search", "average": 50, "period": 1, "reason": "launch day"}
CONFIG: dict[str, Any] = {
    "adjustments": [{"route": "search", "key": None, "local": {**_POLICY_10, "average": 50.0, "burst": 50}}],
    "audit": {
        **_AUDIT,
        "kind": "config_change",
        "from": "",
        "to": "50/1s burst 50 (token_bucket)",
        "reason": "launch day (both)",
        "gate": None,
    },
}
RULES_RELOADED: dict[str, Any] = {
    "routes": ["search", "login", "default"],
    "digest": "0facffee351245af2ab8cab1ec7ad7db33e8e5b1cd2b2442ff2dab41bba4362d",
    "source": "/etc/shadowlimit/rules.yaml",
}
WHATIF_REQUEST: dict[str, Any] = {"route": "search", "policy": {"average": 5}, "minutes": 15}
WHATIF: dict[str, Any] = {
    "route": "search",
    "minutes": 15,
    "minutes_recorded": 1,
    "recorded_share": 1.0,
    "candidate": _REPLAY,
    "current": {
        **_REPLAY,
        "policy": _POLICY_10,
        "policy_describe": "10/1s burst 10 (token_bucket)",
        "rejections": 3.0,
        "reject_share": 0.157895,
        "top_keys": [{"key": "alice", "requests": 13.0, "rejections": 3.0}],
        "per_minute": [{"minute": 1795710180, "requests": 19.0, "rejections": 3.0}],
    },
}
SUGGEST_REQUEST: dict[str, Any] = {"route": "search", "max_reject_share": 0.01, "minutes": 15}
SUGGEST: dict[str, Any] = {
    "route": "search",
    "minutes": 15,
    "minutes_recorded": 1,
    "recorded_share": 1.0,
    "max_reject_share": 0.01,
    "policy": {"algorithm": "token_bucket", "average": 13.0, "period": 1.0, "burst": 13},
    "policy_describe": "13/1s burst 13 (token_bucket)",
    "replay": {
        **_REPLAY,
        "policy": {"algorithm": "token_bucket", "average": 13.0, "period": 1.0, "burst": 13},
        "policy_describe": "13/1s burst 13 (token_bucket)",
        "rejections": 0.0,
        "reject_share": 0.0,
        "top_keys": [],
        "per_minute": [{"minute": 1795710180, "requests": 19.0, "rejections": 0.0}],
    },
}
HEALTH: dict[str, Any] = {"status": "ok", "instance_id": "2fce927b8478"}
READY: dict[str, Any] = {
    "status": "ready",
    "can_decide": True,
    "reasons": [],
    "requires_redis": False,
    "redis": {"reachable": True, "scripts": True},
    "breaker": "closed",
    "failure_policy": "inMemoryFallback",
    "rules": {"source": "/etc/shadowlimit/rules.yaml", "error": None},
    "instance_id": "2fce927b8478",
}
NOT_READY: dict[str, Any] = {
    **READY,
    "status": "not_ready",
    "reasons": ["Redis is unreachable and SHADOWLIMIT_READY_REQUIRES_REDIS=true"],
    "requires_redis": True,
    "redis": {"reachable": False, "scripts": False, "error": "Connection refused"},
    "breaker": "open",
}
METRICS = (
    "# HELP rate_limit_requests_total Rate-limit checks.\n"
    "# TYPE rate_limit_requests_total counter\n"
    'rate_limit_requests_total{limiter_type="local",status="allowed"} 16.0\n'
)
STREAM = (
    "retry: 1000\n\n"
    'event: snapshot\ndata: {"at":1795710210.7,"instance_id":"2fce927b8478","backend":{...},"routes":[...],'
    '"divergence":{...},"buckets":[...],"external":{...},"events":[...]}\n\n'
    "event: event\nid: 2fce927b8478-7\n"
    'data: {"seq":7,"id":"2fce927b8478-7","at":1795710211.2,"type":"breaker","from":"closed","to":"open",...}\n\n'
)
