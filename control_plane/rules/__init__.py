"""The control plane's YAML rules file: routes, their keys, their local and distributed policies.

The file is parsed strictly: unknown keys, duplicate keys, wrong types and values the
limiter would refuse are all errors, and every error is a :class:`RulesError` naming
the file, the line and the field (``rules.yaml:14: routes[1].local.burst: must be
between 1 and 1000000000000, got 0``). A bad file never half-applies: :class:`RulesWatcher`
keeps serving the last good rules and reports the error.

Schema (see ``examples/rules.yaml`` for a commented example)::

    version: 1                       # optional, must be 1
    defaults:                        # optional; used by every route that does not set them
      key: {strategy: clientIP}      # strategy, header, api_key_header, forwarded_mode, max_length
      failure_policy: inMemoryFallback
      failure_code: 429
    routes:                          # required (may be empty); first match wins
      - name: search                 # required, unique, [A-Za-z0-9_.-]{1,64}
        match:
          methods: [GET, POST]       # optional (default any); "*" = any
          path: /api/v1/search/**    # required: literal, *, ** or {name} segments
        key: {strategy: header, header: X-Tenant-Id}
        local: {algorithm: token_bucket, average: 100, period: 1s, burst: 20}    # required
        distributed: {average: 300, period: 1s, burst: 60}   # optional, default = local
                                     # or a limit text: 300/second, {limit: "1000 per hour", burst: 60}
        overrides:
          api_keys: {"apikey:<32 hex>": {average: 1000, burst: 200}}
          tenants: {acme: {average: 500, burst: 100}}
        allow: ["10.0.0.0/8", "internal-job"]
        deny: ["203.0.113.0/24", "bad-tenant"]
        failure_policy: failClosed
        failure_code: 503
        mode: shadow                 # initial mode when Redis has no stored state
        canary_percent: 10           # only with mode: canary
        min_dwell: 10m               # gate: minimum time in a step (default SHADOWLIMIT_GATE_MIN_DWELL_S)
        explain: false               # divergence not explained by cause (default true: a reference in Redis)
        external:                    # optional: per-key limits from a limits service
          url: http://limits:8080/limits   # POSTed {key, headers, method, path}
          timeout: 5s                # default 5s, at most 60s
          cache_ttl: 60s             # default 60s; 0 caches only answers with cache hints
          max_concurrent_requests: 50
          header_filter: {allow_list: [X-Tenant-Id]}   # or deny_list; credentials never go

Details worth knowing:

- A policy may be a limit text (``local: 100/minute``) or ``{limit: ..., burst, algorithm}``
  (:meth:`~limiter.policy.Policy.parse`; ``burst`` then defaults to the quantity).
- ``distributed`` and every override policy inherit ``algorithm`` and ``period`` from
  the route's ``local`` policy when they do not set them (``burst`` is never inherited:
  it defaults to ``ceil(average)`` as in :class:`~limiter.policy.Policy`).
- Overrides apply to both limiters: a privileged key gets the override policy as its
  local *and* its distributed policy. ``api_keys`` entries may be raw API keys (hashed
  with :func:`~limiter.keys.api_key_id` at load time; the raw key is never kept or
  echoed in errors) or ready-made ``apikey:<32 hex>`` ids; they are only allowed on
  routes whose key strategy is ``apiKey``.
- The route named ``default`` is the built-in fallback (``/**``, clientIP, the
  ``RATE_LIMIT_GLOBAL_*`` token bucket). A file may redefine it (its ``match`` may be
  omitted and, if given, must be ``/**`` for any method); it is always tried last.
  ``defaults`` apply to user routes (including a redefined ``default``), never to the
  built-in one.
- Trusted proxies for ``clientIP`` keys come from ``SHADOWLIMIT_TRUSTED_PROXIES``
  (``settings.proxies``), never from the file.
- A route's ``external`` answer replaces its ``local``/``distributed`` policies (and
  tenant overrides) for that key, in both limiters; the file's policies are the fallback
  when the service cannot answer (see :mod:`control_plane.external`).
- YAML 1.1 reads ``off``/``on``/``yes``/``no`` as booleans; this loader does not (only
  ``true``/``false`` are booleans), so ``mode: off`` means the mode ``"off"``.

The modules, in the order a file goes through them:

- :mod:`.yaml_source`: the file's bytes, its text, the YAML data and the line of every field;
- :mod:`.spec`: the file described once, as tables of keys (reader, default, schema, docs);
- :mod:`.document`, :mod:`.schema` and :mod:`.fields`: the tables (the document, a route and
  its blocks, ``key`` and policies), read key by key;
- :mod:`.paths` and :mod:`.lists`: path patterns and allow/deny lists;
- :mod:`.model`: the compiled :class:`RouteRule` and :class:`Rules`, and :func:`default_route`;
- :mod:`.load`: :func:`parse_rules` and :func:`load_rules`;
- :mod:`.watcher`: :class:`RulesWatcher`, hot reload;
- :mod:`.offload`: big files read off the event loop (a child process), routes built in slices;
- :mod:`.json_schema`: the file's JSON Schema (``docs/rules.schema.json``) and the tables of
  docs/configuration.md, generated from the tables;
- :mod:`.errors`: :class:`RulesError`, the one error type.
"""

from ..durations import parse_duration
from .errors import RulesError
from .lists import ListMatcher
from .load import load_rules, parse_rules
from .model import RouteRule, Rules, default_route
from .paths import compile_path_pattern
from .watcher import RulesWatcher

__all__ = [
    "ListMatcher",
    "RouteRule",
    "Rules",
    "RulesError",
    "RulesWatcher",
    "compile_path_pattern",
    "default_route",
    "load_rules",
    "parse_duration",
    "parse_rules",
]
