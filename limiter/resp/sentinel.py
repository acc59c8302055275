"""Redis Sentinel: the master of a service, as the sentinels name it.

:class:`SentinelBackend` is a :class:`~.backends.StandaloneBackend` whose address comes
from the sentinels (``SENTINEL GET-MASTER-ADDR-BY-NAME``) and is checked with ``ROLE``
before any command goes there. After a failover the old master's connections break (it
is dead, or Sentinel demotes it and drops its clients); the first command that fails
asks the sentinels again (at most every ``rediscover_interval_s``, one question shared
by every waiting command), and traffic moves to the promoted replica. Until then the
commands fail as :class:`~limiter.errors.BackendUnavailable`, which the caller's
failure policy answers. A ``READONLY`` reply (a demoted master still reachable) leads
to the same re-discovery (see :meth:`SentinelBackend.lost_master`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..errors import BackendAuthError, BackendError, BackendUnavailable
from ..redis_url import Endpoint
from .backends import StandaloneBackend
from .connection import NodeClient, ReplyError, encode_command

__all__ = ["SentinelBackend"]


class SentinelBackend(StandaloneBackend):
    """The master of ``service_name`` (see the module docstring). ``data`` carries the
    data nodes' login, TLS and database; ``sentinels`` their own."""

    def __init__(
        self,
        sentinels: tuple[Endpoint, ...],
        service_name: str,
        data: Endpoint,
        *,
        connect_timeout: float = 1.0,
        command_timeout: float | None = 0.5,
        connections: int = 2,
        rediscover_interval_s: float = 0.1,
    ) -> None:
        if not sentinels:
            raise ValueError("sentinel: at least one sentinel address is required")
        if not service_name:
            raise ValueError("sentinel: the service name must not be empty")
        super().__init__(
            data, connect_timeout=connect_timeout, command_timeout=command_timeout, connections=connections
        )
        self.sentinels = sentinels
        self.service_name = service_name
        self._data = data
        self._sentinel_nodes = [NodeClient(s, connect_timeout, command_timeout) for s in sentinels]
        self._master: tuple[str, int] | None = None
        self._stale = False  # the master answered as a replica: ask the sentinels first
        self._discovering: asyncio.Task[None] | None = None
        self._last_discovery = float("-inf")
        self._interval = rediscover_interval_s
        self.switches = 0  # times the master changed after the first discovery

    @property
    def master(self) -> tuple[str, int] | None:
        """The master's address, once discovered."""
        return self._master

    def send_now(self, key: bytes, payload: bytes) -> asyncio.Future[Any] | None:
        if self._master is None:
            return None  # through call(), which discovers it first
        return self._pick().send_now(payload)

    def send_many(
        self, keys: list[bytes], payloads: list[bytes]
    ) -> list[tuple[asyncio.Future[list[Any]] | None, list[int]]]:
        if self._master is None:
            return [(None, list(range(len(payloads))))]
        return super().send_many(keys, payloads)

    async def call(self, key: bytes | None, payload: bytes) -> Any:
        if self._master is None or self._stale:
            await self.discover()
        try:
            reply = await self._pick().call(payload)
        except BackendUnavailable:
            if not await self._rediscover():
                raise
            reply = await self._pick().call(payload)  # once more, on the master the sentinels name now
        return reply

    async def call_all(self, payload: bytes) -> list[Any]:
        return [await self.call(None, payload)]

    def lost_master(self) -> None:
        """The master answered as a replica (or lost its link): ask the sentinels on the
        next command."""
        self._stale = True
        for n in self._nodes:
            n.close()

    async def _rediscover(self) -> bool:
        """Ask the sentinels again unless that was done moments ago; True when the
        master's address changed."""
        if time.monotonic() - self._last_discovery < self._interval:
            return False
        before = self._master
        try:
            await self.discover()
        except BackendError:
            return False
        return self._master != before

    async def discover(self) -> None:
        """Ask the sentinels for the master (one question at a time, shared)."""
        if self._discovering is None or self._discovering.done():
            self._discovering = asyncio.ensure_future(self._discover())
        await asyncio.shield(self._discovering)

    async def _discover(self) -> None:
        self._last_discovery = time.monotonic()
        errors: list[str] = []
        refused = 0  # sentinels that refused the login: a configuration error, not an outage
        for node in list(self._sentinel_nodes):
            try:
                reply = await node.call(encode_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name))
            except BackendError as exc:
                refused += isinstance(exc, BackendAuthError)
                errors.append(str(exc))
                continue
            if isinstance(reply, ReplyError) or not reply:
                errors.append(f"sentinel {node.endpoint.label}: {reply or f'does not know {self.service_name!r}'}")
                continue
            address = (reply[0].decode(), int(reply[1]))
            try:
                await self._use(address)
            except BackendError as exc:
                errors.append(str(exc))
                continue
            self._stale = False
            # the sentinel that answered is asked first next time
            self._sentinel_nodes.remove(node)
            self._sentinel_nodes.insert(0, node)
            return
        cls = BackendAuthError if refused == len(self._sentinel_nodes) else BackendUnavailable
        raise cls(f"no sentinel named a master for {self.service_name!r}: " + "; ".join(errors[-3:] or ["no answer"]))

    async def _use(self, address: tuple[str, int]) -> None:
        """Point at ``address`` after checking with ROLE that it is a master."""
        if address == self._master and not self._stale and not all(n.closed for n in self._nodes):
            return
        endpoint = self._data.with_address(address[0], address[1], self._data.db)
        probe = NodeClient(endpoint, self._connect_timeout, self._command_timeout)
        try:
            role = await probe.call(encode_command("ROLE"))
        finally:
            probe.close()
        if isinstance(role, ReplyError) or not role or role[0] != b"master":
            shown = role if isinstance(role, ReplyError) else (role[0].decode() if role else "nothing")
            raise BackendUnavailable(f"{endpoint.label}, named master by the sentinels, answers ROLE with {shown}")
        if address != self._master:
            if self._master is not None:
                self.switches += 1
            self._master = address
            self._point_at(endpoint)

    def describe(self) -> str:
        where = f"{self._master[0]}:{self._master[1]}" if self._master else "not discovered yet"
        return f"sentinel {self.service_name} (master {where})"

    def topology(self) -> dict[str, Any]:
        return {
            "kind": "sentinel",
            "service_name": self.service_name,
            "master": f"{self._master[0]}:{self._master[1]}" if self._master else None,
            "sentinels": [s.label for s in self.sentinels],
            "master_changes": self.switches,
        }

    async def aclose(self) -> None:
        if self._discovering is not None and not self._discovering.done():
            self._discovering.cancel()
        for n in self._sentinel_nodes:
            n.close()
        await super().aclose()
