"""Redis persistence of the control plane: rollout state, audit log, events, and the
fleet-wide divergence counters.

Keys (``ns`` = namespace; the ``{ns}`` hash tag keeps the keys that one Lua script
touches together in one Redis Cluster slot)::

    rl:{ns}:rollout              hash    route -> RouteState JSON
    rl:{ns}:audit                stream  audit entries (XADD MAXLEN ~ 10000)
    rl:{ns}:meta                 hash    epoch: a random id naming this copy of the data
                                         (gone or changed = the store lost its data)
    rl:{ns}:adjust               hash    runtime adjustments (written by the engine)
    rl:{ns}:plans                hash    route -> its rollout plan's record (PlanRecord JSON)
    rl:{ns}:plan-lease           string  the replica driving the rollout plans ("<id>#<fence>", PX)
    rl:{ns}:plan-fence           string  the lease's fencing counter
    rl:{ns}:plan-analysis        hash    route -> its plan's latest analysis (JSON)
    rl:{ns}:events               channel event JSON (PUBLISH)
    rl:ns:div:<route>:<minute>   hash    per-minute divergence counters (no hash tag:
                                         they spread over the cluster; EXPIRE 2 h)

Limiter bucket keys (``rl:ns:<key>``) are never touched here.

Rooms: :mod:`.errors` (the exception tree and :func:`translate_errors`, the one place
redis-py exceptions become :class:`StoreUnavailable` / :class:`StoreError`: callers never
see redis-py exceptions), :mod:`.rollouts` (:class:`RolloutStore`), :mod:`.divergence`
(:class:`DivergenceStore`, :func:`totals_of`, :func:`gate_stats_of`), :mod:`.plans`
(:class:`PlanStore`: rollout plans' records, the plan driver's lease, the analyses), :mod:`.scripts`
(the Lua scripts, ``*.lua`` package data) and :mod:`.codec` (JSON and reply decoding).

Both stores take a redis-py asyncio client (``redis.asyncio.Redis`` or
``redis.asyncio.cluster.RedisCluster``, e.g. from
:func:`limiter.connection.make_redis_py_client`); they do not own or close it. Both
take a ``clock`` (wall-clock seconds, ``time.time`` by default) read when a call is given
no time::

    store = DivergenceStore(client, "shadowlimit", clock=lambda: 1_700_000_000.0)
"""

from .codec import audit_entry_from_dict
from .divergence import DIVERGENCE_FIELDS, DIVERGENCE_TTL_S, DivergenceStore, gate_stats_of, totals_of
from .errors import LeaseLost, PlanConflict, StoreError, StoreUnavailable, VersionConflict, translate_errors
from .plans import PlanStore
from .rollouts import AUDIT_MAXLEN, AuditListener, PlanWrite, RestoreResult, RolloutStore

__all__ = [
    "AUDIT_MAXLEN",
    "AuditListener",
    "DIVERGENCE_FIELDS",
    "DIVERGENCE_TTL_S",
    "DivergenceStore",
    "LeaseLost",
    "PlanConflict",
    "PlanStore",
    "PlanWrite",
    "RestoreResult",
    "RolloutStore",
    "StoreError",
    "StoreUnavailable",
    "VersionConflict",
    "audit_entry_from_dict",
    "gate_stats_of",
    "totals_of",
    "translate_errors",
]
