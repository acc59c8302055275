"""How a process reaches Redis, described once, and both of its clients built from that one
description.

A replica talks to Redis through two clients: the lean RESP client of the decisions
(:mod:`limiter.resp`: one pipelined connection per node, stall detection) and redis-py for
everything off the hot path (the rollout store, counters, pub/sub). A :class:`RedisConnection`
is the parsed URL (:class:`~limiter.redis_url.RedisTarget`: the kind of deployment, the nodes
or the sentinels, the login, TLS, the database) and the timeouts; :meth:`RedisConnection.backend`
and :meth:`RedisConnection.redis_py` build the two clients from it, mapping each part in one
place each, so the two cannot disagree about TLS, the ACL user or the master Sentinel names::

    conn = RedisConnection.parse("rediss://app:secret@redis.internal:6380/0?ssl_ca_certs=/ca.pem")
    rl = RedisLimiter.from_connection(conn, namespace="shadowlimit")  # the RESP client
    client = conn.redis_py()  # redis-py, the same server, login and TLS

:meth:`RedisConnection.tls_settings` is each node's TLS as both clients apply it (what a test
compares with what each client ended up with).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .redis_url import Endpoint, RedisTarget, parse_redis_url

if TYPE_CHECKING:
    from .redis_limiter import Backend

__all__ = ["RedisConnection"]


@dataclass(frozen=True, kw_only=True)
class RedisConnection:
    """Where Redis is and how long to wait for it (see the module docstring).

    ``connect_timeout`` bounds a connection's setup for both clients; ``command_timeout`` is
    the RESP client's stall detection (no reply for that long while commands wait: every
    waiting command fails; None: never); ``socket_timeout`` bounds each redis-py command."""

    target: RedisTarget
    connect_timeout: float = 1.0
    command_timeout: float | None = 0.5
    socket_timeout: float = 1.0

    @classmethod
    def parse(cls, url: str | RedisTarget, **timeouts: Any) -> RedisConnection:
        """From a URL (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
        ``redis+sentinel://``: :func:`~limiter.redis_url.parse_redis_url`) or a parsed target
        (settings that add a password file or TLS options to the URL)."""
        target = parse_redis_url(url) if isinstance(url, str) else url
        return cls(target=target, **timeouts)

    def with_kind(self, cluster: bool | None) -> RedisConnection:
        """The same, as a cluster (or not) whatever the URL said (never for Sentinel)."""
        t = self.target
        if cluster is None or cluster == t.cluster or t.sentinel:
            return self
        return replace(self, target=replace(t, kind="cluster" if cluster else "standalone"))

    def backend(self) -> Backend:
        """The RESP client's backend: one server, a cluster's slot table, or the master a set
        of sentinels names. TLS files are read now (``ValueError`` naming the option when one
        cannot be used), not at the first connection."""
        from .redis_limiter import make_backend

        return make_backend(self.target, connect_timeout=self.connect_timeout, command_timeout=self.command_timeout)

    def redis_py(self) -> Any:
        """A redis-py asyncio client (standalone, cluster, or Sentinel's master) on the same
        server(s), with the same login and TLS."""
        from .redis_limiter import make_redis_py_client

        return make_redis_py_client(
            self.target, socket_timeout=self.socket_timeout, connect_timeout=self.connect_timeout
        )

    def nodes(self) -> tuple[Endpoint, ...]:
        """Every node named: the data node and the seeds (cluster nodes, or the sentinels)."""
        return (self.target.endpoint, *self.target.seeds)

    def tls_settings(self) -> dict[str, dict[str, Any] | None]:
        """Each node's TLS (by its label) as redis-py's keyword arguments, None without TLS:
        what both clients are built with."""
        return {e.label: None if e.tls is None else e.tls.redis_py_kwargs() for e in self.nodes()}

    def describe(self) -> dict[str, Any]:
        """The deployment, its nodes, TLS and login, without secrets."""
        return self.target.describe()

    def redacted(self) -> str:
        """The URL without its password."""
        return self.target.redacted()
