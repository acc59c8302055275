"""The bounds of an HTTP request as one value, built from the settings
(:attr:`Settings.request_limits <control_plane.settings.Settings.request_limits>`) and
enforced by :mod:`control_plane.server.limits` and :mod:`control_plane.server.serving`."""

from __future__ import annotations

import resource
from dataclasses import dataclass

__all__ = ["FD_RESERVE", "MAX_TARGET_BYTES", "REQUEST_LINE_ALLOWANCE", "RequestLimits", "connection_shares"]

#: The longest request target (path and query) ``serve`` takes: longer is 414
#: ``uri_too_long`` (a key in a path, ``/ratelimit/reset/{client_id}``, is 256 bytes at
#: most, 768 percent-encoded: a longer one reaches the endpoint, which names it).
MAX_TARGET_BYTES = 16384
#: Bytes a request head may use beyond its header fields while it arrives: the request
#: line (method, target, version) and the line breaks.
REQUEST_LINE_ALLOWANCE = MAX_TARGET_BYTES + 32


#: File descriptors kept for neither server: Redis connections, log and rules files.
FD_RESERVE = 128


def connection_shares() -> tuple[int, int]:
    """The connections each server may hold at most, (HTTP, gRPC), so that neither starves
    the other of file descriptors: the process's soft open-files limit is raised to its hard
    limit, then each gets half, HTTP less :data:`FD_RESERVE` (gRPC's own setting,
    ``SHADOWLIMIT_GRPC_MAX_CONNECTIONS``, may lower its share further)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):  # not allowed here: the soft limit as it is
            pass
    if soft == resource.RLIM_INFINITY or soft > 1 << 24:
        soft = 1 << 24
    return max(16, soft // 2 - FD_RESERVE), max(16, soft // 2)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """How large a request may be (``SHADOWLIMIT_MAX_BODY_BYTES``, ``SHADOWLIMIT_MAX_HEADERS``,
    ``SHADOWLIMIT_MAX_HEADER_BYTES``) and how long its head may take to arrive
    (``SHADOWLIMIT_HEADER_TIMEOUT_S``)."""

    max_body_bytes: int
    max_headers: int
    max_header_bytes: int
    header_timeout_s: float = 5.0

    @property
    def head_bytes(self) -> int:
        """The most a request head (request line, header fields and their framing) may
        take on the wire: the header bytes, 4 bytes of ``": "`` and CRLF per allowed
        field, and :data:`REQUEST_LINE_ALLOWANCE`."""
        return self.max_header_bytes + 4 * self.max_headers + REQUEST_LINE_ALLOWANCE
