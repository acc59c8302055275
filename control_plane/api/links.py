"""OpenAPI links: which answer feeds which request, and which reads show what a change did.

``/openapi.json`` declares them on the answers (``responses.<status>.links``), where client
generators and schemathesis' stateful phase read them: a route name from ``GET /v1/routes``
goes into every operation that takes a route; a decision's ``route`` and ``key`` into the
operations that take a key; a change (a mode, an adjustment, a reset, a reload) leads to the
reads whose answers it changes. :func:`add_links` writes :data:`LINKS` into the document
(``tests/e2e/test_api_schema.py`` walks them against a live control plane: every operation
but the endless ``/v1/stream`` is reachable).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..auth import ACCESS

__all__ = ["LINKS", "add_links"]


class Link(NamedTuple):
    """One link: its name, the target operation, what it is for, and what of the answer goes
    into the target's parameters and request body."""

    name: str
    method: str
    path: str
    description: str
    parameters: dict[str, str]
    body: dict[str, Any] | None


_ROUTE = "$response.body#/routes/0/name"
_AUTHZ_METHODS = sorted(m for (m, p) in ACCESS if p == "/v1/authz")


def _link(name: str, target: str, description: str, parameters: dict[str, str] | None = None, body: Any = None) -> Link:
    """A link to ``target`` (``"METHOD /path"``)."""
    method, path = target.split(" ", 1)
    return Link(name=name, method=method, path=path, description=description, parameters=parameters or {}, body=body)


def _route_links(route: str) -> list[Link]:
    """What takes a route name, the name given by the expression ``route``."""
    body, query = {"route": route}, {"query.route": route}
    return [
        _link("setMode", "PUT /v1/routes/{route}/mode", "Change the route's mode.", {"path.route": route}),
        _link("decide", "POST /v1/decide", "Decide a request on the route.", body=body),
        _link(
            "decideBatch",
            "POST /v1/decide/batch",
            "Decide requests on the route.",
            body={"requests": [{**body, "key": "198.51.100.7"}]},
        ),
        _link(
            "charge",
            "POST /v1/charge",
            "Charge a cost known after the answer on the route.",
            body={**body, "key": "198.51.100.7", "cost": 40},
        ),
        _link(
            "chargeBatch",
            "POST /v1/charge/batch",
            "Charge costs known after the answer on the route.",
            body={"charges": [{**body, "key": "198.51.100.7", "cost": 40}]},
        ),
        _link(
            "settleBatch",
            "POST /v1/settle/batch",
            "Settle reservations made on the route (ids from decisions with an estimate).",
            body={
                "settles": [
                    {"reservation": "rsv1.c2hhZG93bGltaXQKY2hhdAphY21lCmIKa1gzdlFtMGNXbjZ5cTFwMGJNMmFKdw", "cost": 30}
                ]
            },
        ),
        _link(
            "reserve",
            "POST /v1/decide",
            "Reserve an estimate on the route (one with a budget), settled later at the actual cost.",
            body={**body, "key": "198.51.100.7", "estimate": 40},
        ),
        _link("audit", "GET /v1/rollout/audit", "The route's audit trail.", query),
        _link("buckets", "GET /v1/buckets", "The route's busiest keys.", query),
        _link("clients", "GET /ratelimit/clients", "The route's active clients.", query),
        _link("external", "GET /v1/external", "The route's external limits.", query),
        _link(
            "reservations",
            "GET /v1/reservations",
            "A key's reservations on the route.",
            {**query, "query.key": "198.51.100.7"},
        ),
        _link("adjust", "PUT /ratelimit/config", "Adjust the route's limit.", body=body),
        _link("whatif", "POST /v1/whatif", "Replay the route's traffic against a candidate limit.", body=body),
        _link("suggest", "POST /v1/whatif/suggest", "The smallest limit within a rejection share.", body=body),
    ]


_READS = {
    "routes": ("GET /v1/routes", "Modes, next steps and gates now."),
    "stats": ("GET /ratelimit/stats", "Totals, modes and adjustments on this replica."),
    "audit": ("GET /v1/rollout/audit", "The audit trail."),
    "divergence": ("GET /v1/divergence", "Fleet-wide divergence per route."),
    "backend": ("GET /v1/backend", "The circuit breaker and the failure policy."),
    "metrics": ("GET /metrics", "The Prometheus series."),
    "readiness": ("GET /readyz", "Whether this replica can decide (its rules included)."),
    "liveness": ("GET /healthz", "The process is up, ready or not."),
}


def _reads(*names: str) -> list[Link]:
    """Reads without parameters whose answers a change shows."""
    return [_link(name, *_READS[name]) for name in names]


def _authz() -> list[Link]:
    """Forward-auth: a gateway asks about a request (described by its headers) on these routes."""
    return [
        _link(f"authz{m.capitalize()}", f"{m} /v1/authz", "Forward-auth: a gateway asks about a request.")
        for m in _AUTHZ_METHODS
    ]


def _reservation_links() -> list[Link]:
    """What takes a decision's reservation, and the key's reservations."""
    route, key, rid = "$response.body#/route", "$response.body#/key", "$response.body#/reservation"
    return [
        _link(
            "settle",
            "POST /v1/settle",
            "Settle the reservation at its actual cost.",
            body={"reservation": rid, "cost": 30},
        ),
        _link(
            "settleBatch",
            "POST /v1/settle/batch",
            "Settle reservations at their actual costs.",
            body={"settles": [{"reservation": rid, "cost": 30}]},
        ),
        _link(
            "reservations", "GET /v1/reservations", "The key's reservations.", {"query.route": route, "query.key": key}
        ),
    ]


def _decision_links() -> list[Link]:
    route, key = "$response.body#/route", "$response.body#/key"
    return [
        _link(
            "reset",
            "POST /ratelimit/reset/{client_id}",
            "Reset the key's buckets on the route.",
            {"path.client_id": key, "query.route": route},
        ),
        _link(
            "adjustKey",
            "PUT /ratelimit/config",
            "Adjust the key's limit on the route.",
            body={"route": route, "key": key},
        ),
        _link("buckets", "GET /v1/buckets", "The route's busiest keys.", {"query.route": route}),
        _link("clients", "GET /ratelimit/clients", "The route's active clients.", {"query.route": route}),
        *_reads("stats", "divergence", "backend", "metrics"),
    ]


def _audit_of(route: str) -> Link:
    return _link("audit", "GET /v1/rollout/audit", "The route's audit trail.", {"query.route": route})


#: (source method, source path) -> (its statuses that carry the links, the links)
LINKS: dict[tuple[str, str], tuple[tuple[str, ...], list[Link]]] = {
    ("GET", "/v1/routes"): (
        ("200",),
        _route_links(_ROUTE) + _reads("divergence", "backend", "metrics") + _authz(),
    ),
    ("POST", "/v1/decide"): (("200", "429"), _decision_links() + _reservation_links()),
    ("POST", "/v1/settle"): (("200",), _reservation_links()[2:] + _reads("metrics")),
    ("POST", "/v1/charge"): (("200",), _decision_links()),
    ("PUT", "/v1/routes/{route}/mode"): (
        ("200",),
        [_audit_of("$response.body#/route"), *_reads("routes", "stats")],
    ),
    ("PUT", "/ratelimit/config"): (("200",), [_audit_of("$response.body#/audit/route"), *_reads("stats")]),
    ("POST", "/ratelimit/reset/{client_id}"): (
        ("200",),
        [
            _link(
                "clients",
                "GET /ratelimit/clients",
                "The route's active clients.",
                {"query.route": "$response.body#/routes/0"},
            ),
            *_reads("audit"),
        ],
    ),
    ("POST", "/ratelimit/rules/reload"): (
        ("200",),
        _route_links("$response.body#/routes/0")[:1] + _reads("routes", "readiness", "liveness"),
    ),
}


def _ref(method: str, path: str) -> str:
    """The JSON pointer of an operation in the document."""
    return "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method.lower()


def add_links(paths: dict[str, Any]) -> None:
    """Write :data:`LINKS` into the document's ``paths`` (a link to an operation the
    document lacks is a ``RuntimeError``)."""
    for (method, path), (statuses, links) in LINKS.items():
        responses = paths[path][method.lower()]["responses"]
        out: dict[str, Any] = {}
        for ln in links:
            if ln.method.lower() not in paths.get(ln.path, {}):
                raise RuntimeError(
                    f"an OpenAPI link from {method} {path} to {ln.method} {ln.path}, which is not served"
                )
            link: dict[str, Any] = {"operationRef": _ref(ln.method, ln.path), "description": ln.description}
            if ln.parameters:
                link["parameters"] = ln.parameters
            if ln.body is not None:
                link["requestBody"] = ln.body
            out[ln.name] = link
        for status in statuses:
            responses[status]["links"] = out
