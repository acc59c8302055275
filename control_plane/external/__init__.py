"""Per-tenant limits from an external HTTP service (docs/operations.md#external-limits-services).

A route with an ``external`` block in the rules file asks a limits service for each key's
limits instead of using the file's policy, which stays as the fallback::

    POST <url>  {"key": "acme", "headers": {"X-Tenant-Id": "acme"}, "method": "GET", "path": "/api/x"}
    200         {"average": 100, "burst": 20, "period": "1s", "tenant_key": "acme", ...}

The pure parts (no IO, unit-tested on their own):

- :mod:`.headers`: :class:`HeaderFilter`, which request headers are forwarded
  (credentials never are, :func:`is_sensitive_header`);
- :mod:`.config`: :class:`ExternalConfig`, the rules-file block, validated, and
  :class:`BackendHosts`, where a response's ``backend_url`` may point;
- :mod:`.responses`: :func:`parse_limits`, a response body to a typed
  :class:`ExternalLimits`, or :class:`InvalidResponse` (an invalid or partial answer is
  never applied);
- :mod:`.ttl`: :func:`resolve_ttl`, the cache TTL of an HTTP response (headers, then the body);
- :mod:`.breakers`: :class:`BreakerSet`, one circuit breaker per key (5 consecutive
  failures open it for 30 s, then one half-open probe; breakers idle for 60 s are
  evicted), each a :class:`limiter.resilience.CircuitBreaker`, clock injected.

The IO parts: :class:`ExternalResolver` in :mod:`.resolver` (one per route: httpx call
bounded by the timeout, Redis cache ``rl:<ns>:extcache:{<route>:<key>}`` shared by every
replica with the stale copy ``rl:<ns>:extcache:stale:{<route>:<key>}`` kept 5 minutes,
singleflight per key, a semaphore capping concurrent calls) and :class:`ExternalManager`
in :mod:`.manager` (the resolvers of the current rules, shared HTTP client, counters,
metrics and events).

:meth:`ExternalManager.resolve` never raises and never takes longer than the route's
``timeout``: when the service is slow, down, returns garbage or its breaker is open, the
answer falls back to the stale copy, then to the static policy (``source`` says which).
"""

from .breakers import BreakerSet, KeyBreaker
from .config import (
    DEFAULT_CACHE_TTL_S,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_TIMEOUT_S,
    BackendHosts,
    ExternalConfig,
    check_service_url,
)
from .headers import HeaderFilter, is_sensitive_header
from .manager import ExternalManager
from .resolver import ExternalResolver, Resolution
from .responses import ExternalLimits, InvalidResponse, parse_limits
from .ttl import STALE_TTL_S, resolve_ttl, response_forbids_storing

__all__ = [
    "BackendHosts",
    "BreakerSet",
    "DEFAULT_CACHE_TTL_S",
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_TIMEOUT_S",
    "ExternalConfig",
    "ExternalLimits",
    "ExternalManager",
    "ExternalResolver",
    "HeaderFilter",
    "InvalidResponse",
    "KeyBreaker",
    "Resolution",
    "STALE_TTL_S",
    "check_service_url",
    "is_sensitive_header",
    "parse_limits",
    "resolve_ttl",
    "response_forbids_storing",
]
