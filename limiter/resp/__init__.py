"""A lean RESP2 client for the decision hot path: auto-pipelining, hiredis parsing.

Why not redis-py here: a rate-limit check is one EVALSHA whose arguments are mostly
the same bytes every time. redis-py encodes every argument on every call and, in
async mode, pays one write and one awaited read per command. This package keeps
pipelined connections (two to a standalone server, one per cluster master), appends
each command's pre-encoded bytes to a buffer, flushes the buffer once per event-loop
iteration (so 100 concurrent checks become one write and one read), and matches
replies to futures in order with hiredis, the same C parser redis-py uses. redis-py
still does everything that is not the hot path (see
:attr:`limiter.redis_limiter.RedisLimiter.client`).

Modules: :mod:`~limiter.resp.connection` (encoding, one pipelined connection per
node; TLS in :mod:`~limiter.resp.tls`), :mod:`~limiter.resp.backends` (standalone
server, cluster slot table), :mod:`~limiter.resp.sentinel` (the master Sentinel names).
Addresses are parsed by :mod:`limiter.redis_url` (re-exported here).
"""

from ..redis_url import Endpoint, RedisTarget, parse_redis_url
from .backends import ClusterBackend, StandaloneBackend
from .connection import NodeClient, NodeConnection, ReplyError, bulk, encode_command
from .sentinel import SentinelBackend

__all__ = [
    "ClusterBackend",
    "Endpoint",
    "NodeClient",
    "NodeConnection",
    "RedisTarget",
    "ReplyError",
    "SentinelBackend",
    "StandaloneBackend",
    "bulk",
    "encode_command",
    "parse_redis_url",
]
