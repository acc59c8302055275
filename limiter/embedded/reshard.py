"""Slots moved between the masters of a running :class:`~limiter.embedded.cluster.EmbeddedCluster`,
keys and all, as ``redis-cli --cluster reshard`` moves them: :func:`move_slots`.

For each slot: ``CLUSTER SETSLOT <slot> IMPORTING`` on the new owner, ``MIGRATING`` on the
old one, ``MIGRATE ... KEYS`` in batches until ``GETKEYSINSLOT`` is empty, then ``SETSLOT
<slot> NODE <new owner>`` on the new owner, the old one and every other master. Meanwhile a
client that asks the old owner for a key already moved is answered ``ASK``, and once the slot
is the new owner's, ``MOVED``: the redirections a cluster client must follow while a
cluster grows or shrinks under load.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis

from .cluster import CLUSTER_SLOTS, Address, EmbeddedCluster, _owners
from .probes import command
from .process import EmbeddedRedisError
from .server import no_retry, normalize_host

__all__ = ["move_slots", "slot_owners"]

#: keys per MIGRATE (redis-cli's default pipeline is 10; a larger batch moves a busy slot faster)
MIGRATE_BATCH = 100
MIGRATE_TIMEOUT_MS = 5000


def slot_owners(cluster: EmbeddedCluster) -> dict[int, Address]:
    """The master serving each slot, as the cluster's first node answers ``CLUSTER SLOTS``."""
    client = _client(cluster, cluster.nodes[0])
    try:
        table = _owners(command(client, "CLUSTER", "SLOTS"), cluster.host)
    finally:
        client.close()
    return {slot: owner for lo, hi, owner in table for slot in range(lo, hi + 1)}


def move_slots(cluster: EmbeddedCluster, slots: Iterable[int], to: Address) -> int:
    """Move every slot of ``slots`` (with its keys) to the master at ``to``; slots it
    already serves are left alone. Returns the number of keys moved.

    Raises:
        EmbeddedRedisError: a slot out of range, ``to`` not a node of the cluster, or a
            step refused by a node (the slot is left as that step left it, as redis-cli
            leaves it; ``redis-cli --cluster fix`` or a second call finishes it).
    """
    to = (normalize_host(to[0]), int(to[1]))
    if to not in cluster.nodes:
        raise EmbeddedRedisError(f"{to} is not a node of this cluster ({cluster.nodes})")
    wanted = sorted(set(slots))
    if any(not 0 <= s < CLUSTER_SLOTS for s in wanted):
        raise EmbeddedRedisError(f"slots must be in 0..{CLUSTER_SLOTS - 1}")
    owners = slot_owners(cluster)
    clients = {address: _client(cluster, address) for address in set(owners.values()) | {to}}
    moved = 0
    try:
        ids = {address: str(command(c, "CLUSTER", "MYID")) for address, c in clients.items()}
        for slot in wanted:
            src = owners[slot]
            if src != to:
                moved += _move_one(cluster, clients, ids, slot, src, to)
    except redis.RedisError as exc:
        raise EmbeddedRedisError(f"resharding to {to} failed: {exc}") from exc
    finally:
        for c in clients.values():
            c.close()
    return moved


def _move_one(
    cluster: EmbeddedCluster,
    clients: dict[Address, redis.Redis],
    ids: dict[Address, str],
    slot: int,
    src: Address,
    dst: Address,
) -> int:
    source, target = clients[src], clients[dst]
    command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src])
    command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst])
    moved = 0
    while True:
        keys = command(source, "CLUSTER", "GETKEYSINSLOT", slot, MIGRATE_BATCH)
        if not keys:
            break
        command(source, "MIGRATE", dst[0], dst[1], "", 0, MIGRATE_TIMEOUT_MS, *_auth(cluster), "KEYS", *keys)
        moved += len(keys)
    # the new owner first, then the old one (which stops answering ASK), then every other master
    for address in [dst, src, *(a for a in clients if a not in (src, dst))]:
        command(clients[address], "CLUSTER", "SETSLOT", slot, "NODE", ids[dst])
    return moved


def _auth(cluster: EmbeddedCluster) -> list[Any]:
    """MIGRATE's own login on the target (it opens its own connection there)."""
    user, password = cluster.access.login
    if password is None:
        return []
    return ["AUTH2", user, password] if user else ["AUTH", password]


def _client(cluster: EmbeddedCluster, address: Address) -> redis.Redis:
    host, port = address
    return redis.Redis(
        host=host,
        port=port,
        decode_responses=True,
        socket_connect_timeout=1,
        socket_timeout=5,
        retry=no_retry(),
        **cluster.connection_kwargs(),
    )
