"""One example of each rollout plan request and answer, for ``/openapi.json`` (a plan on
``search`` walked by its driver: in canary 10% for 42 s, the analysis passing)."""

from __future__ import annotations

from typing import Any

__all__ = ["PLAN", "PLAN_ACTION", "PLAN_CHANGED", "PLAN_DELETED", "PLAN_REQUEST", "PLAN_SUMMARY"]

PLAN_REQUEST: dict[str, Any] = {
    "steps": [{"shadow": "10m"}, {"canary": 10, "for": "10m"}, "approve", "enforce"],
    "analysis": {
        "min_compared": 500,
        "max_new_rejection_rate": "1%",
        "prometheus": [
            {
                "name": "upstream 5xx",
                "query": 'sum(rate(http_requests_total{route="{route}",code=~"5.."}[1m]))'
                ' / sum(rate(http_requests_total{route="{route}"}[1m]))',
                "max": 0.01,
            }
        ],
    },
    "on_failure": "rollback",
    "reason": "let search walk to enforce",
}
PLAN_ACTION: dict[str, Any] = {"reason": "checked the dashboards: go"}

_CHECKS = [
    {"name": "compared decisions", "value": 812.0, "threshold": ">= 500", "outcome": "pass", "reason": ""},
    {"name": "new rejection rate", "value": 0.0012, "threshold": "<= 1%", "outcome": "pass", "reason": ""},
    {"name": "backend error rate", "value": 0.0, "threshold": "<= 0.1%", "outcome": "pass", "reason": ""},
    {"name": "upstream 5xx", "value": 0.002, "threshold": "<= 0.01", "outcome": "pass", "reason": ""},
]
PLAN_SUMMARY: dict[str, Any] = {
    "source": "api",
    "state": "running",
    "step": 2,
    "steps": 4,
    "current": "canary 10%",
    "labels": ["shadow", "canary 10%", "approve", "enforce"],
    "describe": "shadow 10m -> canary 10% for 10m -> approve -> enforce",
    "in_step_s": 42.0,
    "time_left_s": 558.0,
    "waits_for": "558s more in canary 10%",
    "reason": "shadow passed",
    "verdict": "pass",
    "first_problem": None,
}
_SPEC = {
    "steps": [
        {"step": "shadow", "for_s": 600.0},
        {"step": "canary", "percent": 10, "for_s": 600.0},
        {"step": "approve"},
        {"step": "enforce", "for_s": 0.0},
    ],
    "analysis": {
        "min_compared": 500,
        "max_new_rejection_rate": 0.01,
        "max_backend_error_rate": 0.001,
        "prometheus": [{**PLAN_REQUEST["analysis"]["prometheus"][0], "min": None, "url": None}],
    },
    "on_failure": "rollback",
}
_STEP = {"percent": 0, "started_at": None, "last_event": None}
PLAN: dict[str, Any] = {
    "route": "search",
    **PLAN_SUMMARY,
    "plan": _SPEC,
    "step_list": [
        {**_STEP, "index": 1, "step": "shadow", "label": "shadow", "describe": "shadow 10m", "for_s": 600.0,
         "status": "passed", "started_at": 1795710160.0,
         "last_event": {"step": 0, "at": 1795710160.0, "event": "started", "note": "plan started at shadow"}},
        {**_STEP, "index": 2, "step": "canary", "label": "canary 10%", "describe": "canary 10% for 10m",
         "percent": 10, "for_s": 600.0, "status": "current", "started_at": 1795710768.0,
         "last_event": {"step": 1, "at": 1795710768.0, "event": "started", "note": "shadow passed"}},
        {**_STEP, "index": 3, "step": "approve", "label": "approve", "describe": "approve", "for_s": 0.0,
         "status": "pending"},
        {**_STEP, "index": 4, "step": "enforce", "label": "enforce", "describe": "enforce", "for_s": 0.0,
         "status": "pending"},
    ],
    "checks": _CHECKS,
    "analysed_at": 1795710810.0,
    "analysed_step": 2,
    "recent": [{"at": 1795710810.0, "step": 1, "verdict": "pass", "reason": ""}],
    "history": [
        {"step": 0, "at": 1795710160.0, "event": "started", "note": "plan started at shadow"},
        {"step": 1, "at": 1795710768.0, "event": "started", "note": "shadow passed"},
    ],
    "driver": "replica-2#7",
    "version": 2,
    "updated_at": 1795710768.0,
    "updated_by": "plan",
}  # fmt: skip
_PLAN_AUDIT = {
    "id": "1795710160211-0",
    "kind": "plan",
    "route": "search",
    "actor": "alice@10.0.0.7",
    "at": 1795710160.2,
    "from": "",
    "to": "running at shadow (step 1 of 4)",
    "from_percent": 0,
    "to_percent": 0,
    "reason": "plan set: shadow 10m -> canary 10% for 10m -> approve -> enforce: let search walk to enforce",
    "forced": False,
    "automatic": False,
    "gate": None,
}
PLAN_CHANGED: dict[str, Any] = {"route": "search", "plan": PLAN, "audit": _PLAN_AUDIT}
PLAN_DELETED: dict[str, Any] = {
    "route": "search",
    "plan": None,
    "audit": {**_PLAN_AUDIT, "from": "running", "to": "plan removed", "reason": "not this week"},
}
