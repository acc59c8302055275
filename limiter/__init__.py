"""shadowlimit's decision engine: one model, in-process and in Redis.

>>> from limiter import Policy, LocalLimiter
>>> LocalLimiter().check("client-1", Policy(average=100, period=1.0, burst=20), now_us=0).allowed
True
"""

from .connection import RedisConnection
from .errors import (
    BackendAuthError,
    BackendError,
    BackendReplyError,
    BackendTimeout,
    BackendUnavailable,
    CircuitOpenError,
    LimiterError,
)
from .local import LocalLimiter, speedups_available
from .policy import Algorithm, BucketView, Decision, Policy
from .redis_limiter import RedisLimiter

__all__ = [
    "Algorithm",
    "BackendAuthError",
    "BackendError",
    "BackendReplyError",
    "BackendTimeout",
    "BackendUnavailable",
    "BucketView",
    "CircuitOpenError",
    "Decision",
    "LimiterError",
    "LocalLimiter",
    "Policy",
    "RedisConnection",
    "RedisLimiter",
    "speedups_available",
]
