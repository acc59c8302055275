"""The reservation endpoints' examples for ``/openapi.json`` (a decision with an estimate, a
settle, a key's reservations), beside :mod:`.examples`; ``tests/e2e/test_api_schema.py`` checks
each against its declared schema."""

from __future__ import annotations

from typing import Any

from .examples import DECISION

_RESERVATION = "rsv1.c2hhZG93bGltaXQKY2hhdAphY21lCmIKa1gzdlFtMGNXbjZ5cTFwMGJNMmFKdw"
_CHAT_HEADERS = {
    "X-RateLimit-Limit": "100000",
    "X-RateLimit-Remaining": "98800",
    "X-RateLimit-Reset": "1",
    "RateLimit-Policy": '"chat";q=100000;w=60',
    "RateLimit": '"chat";r=98800;t=1',
}
RESERVE_REQUEST: dict[str, Any] = {"route": "chat", "key": "acme", "estimate": 1200}
RESERVED: dict[str, Any] = {
    **DECISION,
    "route": "chat",
    "mode": "enforce",
    "enforced_by": "distributed",
    "key": "acme",
    "local": {"allowed": True, "remaining": 98800, "limit": 100000, "retry_after_us": 0, "reset_after_us": 720000},
    "distributed": {"allowed": True, "remaining": 98800, "limit": 100000, "retry_after_us": 0,
                    "reset_after_us": 720000},
    "divergence": "agree",
    "headers": _CHAT_HEADERS,
    "estimate": 1200,
    "reservation": _RESERVATION,
}  # fmt: skip
SETTLE_REQUEST: dict[str, Any] = {"reservation": _RESERVATION, "cost": 830}
_SETTLED_DECISION = {
    "allowed": True,
    "remaining": 99170,
    "limit": 100000,
    "retry_after_us": 0,
    "reset_after_us": 498000,
}
SETTLE: dict[str, Any] = {
    "reservation": _RESERVATION,
    "route": "chat",
    "key": "acme",
    "status": "settled",
    "estimate": 1200,
    "cost": 830,
    "over": False,
    "remaining": 99170,
    "limit": 100000,
    "retry_after_us": 0,
    "reset_after_us": 498000,
    "mode": "enforce",
    "enforced_by": "distributed",
    "local": {"status": "settled", "decision": _SETTLED_DECISION},
    "distributed": {"status": "settled", "decision": _SETTLED_DECISION},
    "backend_error": None,
}
SETTLE_BATCH_REQUEST: dict[str, Any] = {"settles": [SETTLE_REQUEST, {"reservation": "rsv1.bm90IGFuIGlk", "cost": 10}]}
SETTLE_BATCH: dict[str, Any] = {
    "settles": [
        {**SETTLE, "status": "again"},
        {
            "error": "invalid_request",
            "message": "reservation: not a reservation id: its fields are not a namespace, route, key, store and nonce",
            "index": 1,
            "field": "reservation",
            "status": 422,
        },
    ]
}
RESERVATIONS: dict[str, Any] = {
    "route": "chat",
    "key": "acme",
    "local": {"outstanding": 1, "settled": 1, "charged": 0, "released": 0, "records": [
        {"state": "outstanding", "estimate": 4000, "actual": None, "age_us": 2100000, "due_in_us": 297900000},
        {"state": "settled", "estimate": 1200, "actual": 830, "age_us": 9500000, "due_in_us": 298800000},
    ]},
    "distributed": {"outstanding": 1, "settled": 1, "charged": 0, "released": 0, "records": [
        {"state": "outstanding", "estimate": 4000, "actual": None, "age_us": 2100000, "due_in_us": 297900000},
        {"state": "settled", "estimate": 1200, "actual": 830, "age_us": 9500000, "due_in_us": 298800000},
    ]},
    "backend_error": None,
    "max_reservations": 1000,
}  # fmt: skip
