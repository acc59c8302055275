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
from typing import Any

from .redis_url import Endpoint, RedisTarget, parse_redis_url
from .resp import ClusterBackend, SentinelBackend, StandaloneBackend
from .resp.tls import tls_context

__all__ = ["Backend", "RedisConnection", "make_backend", "make_redis_py_client"]

Backend = StandaloneBackend | ClusterBackend | SentinelBackend


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
        return make_backend(self.target, connect_timeout=self.connect_timeout, command_timeout=self.command_timeout)

    def redis_py(self) -> Any:
        """A redis-py asyncio client (standalone, cluster, or Sentinel's master) on the same
        server(s), with the same login and TLS."""
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


def make_backend(target: RedisTarget, *, connect_timeout: float = 1.0, command_timeout: float | None = 0.5) -> Backend:
    """The RESP backend for a parsed URL: one server, a cluster's slot table, or the
    master a set of sentinels names. TLS files are read now (``ValueError`` naming the
    option when one cannot be used), not at the first connection."""
    for e in (target.endpoint, *target.seeds):
        if e.tls is not None:
            tls_context(e.tls)
    if target.sentinel:
        return SentinelBackend(
            target.seeds,
            target.service_name or "",
            target.endpoint,
            connect_timeout=connect_timeout,
            command_timeout=command_timeout,
        )
    if target.cluster:
        return ClusterBackend(
            target.seeds or (target.endpoint,), connect_timeout=connect_timeout, command_timeout=command_timeout
        )
    return StandaloneBackend(target.endpoint, connect_timeout=connect_timeout, command_timeout=command_timeout)


def _redis_py_login(e: Endpoint) -> dict[str, Any]:
    kw: dict[str, Any] = {"username": e.username, "password": e.password}
    if e.tls is not None:
        kw.update(e.tls.redis_py_kwargs())
    return kw


def make_redis_py_client(url: str | RedisTarget, *, socket_timeout: float = 1.0, connect_timeout: float = 1.0) -> Any:
    """A redis-py asyncio client (standalone, cluster, or Sentinel's master) from one
    of our URLs, with the same TLS and login."""
    import redis.asyncio as aredis
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.asyncio.sentinel import Sentinel
    from redis.backoff import NoBackoff

    # one quick retry, not redis-py's default of three with growing waits: callers
    # (admin endpoints, the rollout store) must learn that Redis is down in about a second
    retry = Retry(NoBackoff(), 1)
    timeouts: dict[str, Any] = {"socket_timeout": socket_timeout, "socket_connect_timeout": connect_timeout}

    target = parse_redis_url(url) if isinstance(url, str) else url
    e = target.endpoint
    if target.sentinel:
        sentinels = [(s.host or "127.0.0.1", s.port or 26379) for s in target.seeds]
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            sentinels,
            sentinel_kwargs={**_redis_py_login(target.seeds[0]), **timeouts, "retry": retry},
            db=e.db,
            retry=retry,
            **_redis_py_login(e),
            **timeouts,
        )
        return sentinel.master_for(target.service_name or "")
    if target.cluster:
        nodes = [ClusterNode(s.host or "127.0.0.1", s.port or 6379) for s in (target.seeds or (e,))]
        return RedisCluster(startup_nodes=nodes, retry=retry, **_redis_py_login(e), **timeouts)
    if e.unix_path:
        return aredis.Redis(unix_socket_path=e.unix_path, db=e.db, retry=retry, **_redis_py_login(e), **timeouts)
    return aredis.Redis(
        host=e.host or "127.0.0.1", port=e.port or 6379, db=e.db, retry=retry, **_redis_py_login(e), **timeouts
    )
