"""A small external limits service for shadowlimit routes with an ``external`` block.

It speaks the external limits schema (docs/configuration.md#external-limits-external):
shadowlimit POSTs ``{"key", "headers", "method", "path"}``
and gets the tenant's limits back. The tenant is the ``X-Tenant-Id`` header when the
route forwards it (any spelling), else the key. A few tenants show the optional fields:

==========  ==================  ==============================================================
tenant      limits              also
==========  ==================  ==============================================================
acme        50/s, burst 50      ``Cache-Control: max-age=30``; ``backend_url`` of its own
acme-eu     (acme's)            ``tenant_key: acme``: shares acme's bucket
globex      5/s, burst 5        body ``cache_max_age_seconds: 10``
initech     100/min, burst 20   fails closed with 503 when Redis is down; ``cache_no_store``
(others)    2/s, burst 2        the free plan; no cache hints (the route's ``cache_ttl``)
==========  ==================  ==============================================================

Run it::

    python -m examples.limits_service --port 9100      # from the repository root
    python examples/limits_service.py --port 9100
    uvicorn examples.limits_service:app --port 9100

and point a route at it (``external: {url: http://127.0.0.1:9100/limits}``).
``GET /stats`` counts the lookups per tenant and lists the header names it was sent.
"""

from __future__ import annotations

import argparse
import copy
from collections import Counter
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

__all__ = ["DEFAULT_TENANTS", "FREE_PLAN", "app", "create_app", "main"]

#: tenant -> (response body, response headers)
DEFAULT_TENANTS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "acme": (
        {
            "average": 50,
            "burst": 50,
            "period": "1s",
            "tenant_key": "acme",
            "backend_url": "http://acme.backend.internal:8080",
        },
        {"Cache-Control": "max-age=30"},
    ),
    "acme-eu": (
        {
            "average": 50,
            "burst": 50,
            "period": "1s",
            "tenant_key": "acme",
            "backend_url": "http://acme.backend.internal:8080",
        },
        {"Cache-Control": "max-age=30"},
    ),
    "globex": ({"average": 5, "burst": 5, "period": "1s", "cache_max_age_seconds": 10}, {}),
    "initech": (
        {
            "average": 100,
            "burst": 20,
            "period": "1m",
            "failure_policy": "failclosed",
            "failure_code": 503,
            "cache_no_store": True,
        },
        {},
    ),
}
FREE_PLAN: dict[str, Any] = {"average": 2, "burst": 2, "period": "1s"}


def create_app(tenants: dict[str, tuple[dict[str, Any], dict[str, str]]] | None = None) -> FastAPI:
    """The service; ``tenants`` replaces :data:`DEFAULT_TENANTS`."""
    table = copy.deepcopy(DEFAULT_TENANTS if tenants is None else tenants)
    lookups: Counter[str] = Counter()
    headers_seen: set[str] = set()
    service = FastAPI(title="example limits service", version="1")

    @service.post("/limits")
    async def limits(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "expected a JSON body"}, status_code=400)
        if not isinstance(body, dict):
            return JSONResponse({"error": "expected a JSON object"}, status_code=400)
        headers = body.get("headers") if isinstance(body.get("headers"), dict) else {}
        headers_seen.update(str(h).lower() for h in headers)
        headers_seen.update(f"http:{h.lower()}" for h in request.headers)
        tenant = next((str(v) for k, v in headers.items() if str(k).lower() == "x-tenant-id"), None) or str(
            body.get("key") or ""
        )
        lookups[tenant] += 1
        answer, extra = table.get(tenant, (FREE_PLAN, {}))
        return JSONResponse(answer, headers=extra)

    @service.get("/stats")
    async def stats() -> dict[str, Any]:
        return {"lookups": dict(lookups), "total": sum(lookups.values()), "headers_seen": sorted(headers_seen)}

    @service.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return service


app = create_app()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="An example external limits service for shadowlimit.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
