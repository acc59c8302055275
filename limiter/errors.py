"""Errors raised by the limiter package.

Third-party exceptions (redis-py, hiredis, OSError, asyncio timeouts) are translated
here at the IO edge, so callers catch one tree::

    LimiterError
    ├── BackendError            the distributed store failed (counts toward the breaker)
    │   ├── BackendUnavailable  could not connect, connection lost, cluster down
    │   │   └── BackendAuthError   the server refused the login (a configuration error)
    │   ├── BackendTimeout      no answer within the command timeout
    │   └── BackendReplyError   Redis answered with an error (script error, OOM, ...)
    └── CircuitOpenError        the breaker is open; the backend was not called
"""

from __future__ import annotations

__all__ = [
    "BackendAuthError",
    "BackendError",
    "BackendReplyError",
    "BackendTimeout",
    "BackendUnavailable",
    "CircuitOpenError",
    "DeadlineExceeded",
    "LimiterError",
]


class LimiterError(Exception):
    """Base of every error the limiter raises on purpose."""


class BackendError(LimiterError):
    """The Redis backend failed to give a decision."""


class BackendUnavailable(BackendError):
    """Connecting to Redis failed or the connection was lost."""


class BackendAuthError(BackendUnavailable):
    """The server refused the login (wrong user or password, or none given): waiting
    will not help. The message never holds the password."""


class BackendTimeout(BackendError):
    """Redis did not answer within the command timeout."""


class DeadlineExceeded(BackendTimeout):
    """Redis did not answer within what was left of the caller's deadline (gRPC's
    ``grpc-timeout``): the failure policy answered instead."""


class BackendReplyError(BackendError):
    """Redis answered with an error reply."""


class CircuitOpenError(LimiterError):
    """The circuit breaker is open, so the backend was not asked."""
