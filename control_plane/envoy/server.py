"""The gRPC server beside the HTTP one: Envoy's rate limit service, gRPC health checking
(``grpc.health.v1.Health``: SERVING while the engine runs) and server reflection, on
``SHADOWLIMIT_HOST:SHADOWLIMIT_GRPC_PORT``, in the app's event loop.

The transport is :mod:`.transport` (python-hyper's h2 state machine on an asyncio
protocol), not grpcio's server: the calls that arrive together are decoded together and
answered in one write, at a fraction of grpcio's CPU per call (see its docstring and
docs/benchmarks.md). Health is callable without the client token; reflection is off unless
``SHADOWLIMIT_GRPC_REFLECTION`` is true. The server bounds its connections
(``SHADOWLIMIT_GRPC_MAX_CONNECTIONS``, at most half the open-files limit) and sweeps their
timers once a second (idle, keepalive, held answers)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.reflection import SERVICE_NAME as REFLECTION_SERVICE
from grpc_reflection.v1alpha.reflection import ReflectionServicer

from ..auth import Access, Denied, check
from ..gctune import trim_heap
from ..settings.limits import connection_shares
from .service import RLS_SERVICE, RateLimitService, methods
from .transport import Call, GrpcConnection, Limits, Method, RpcError, StatusCode

if TYPE_CHECKING:
    from ..auth import Authenticator
    from ..engine import Engine
    from ..observe.metrics import Metrics
    from ..tls import ServerTls

__all__ = [
    "MAX_CONCURRENT_RPCS", "MAX_MESSAGE_BYTES", "RLS_SERVICE", "GrpcServer", "Health", "start_grpc_server",
]  # fmt: skip

log = logging.getLogger("shadowlimit.envoy")

#: the largest request message accepted (Envoy's are a few hundred bytes)
MAX_MESSAGE_BYTES = 64 * 1024
#: calls in progress at once (SHADOWLIMIT_GRPC_MAX_CALLS' default); more are refused at once
#: with RESOURCE_EXHAUSTED, counted as rate_limit_envoy_requests_total{code="overloaded"}
MAX_CONCURRENT_RPCS = 4096
RLS_METHOD = f"/{RLS_SERVICE}/ShouldRateLimit"
#: seconds between two sweeps of the connections' timers
SWEEP_S = 1.0
#: connections closed (refused ones included) after which the sweep trims the C heap
TRIM_AFTER_CLOSED = 256
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Health:
    """``grpc.health.v1.Health``: a status per service name ("" is the server's); ``Check``
    answers it (NOT_FOUND for a name it does not know), ``Watch`` streams it as it changes.
    Each waiting Watch holds a future of its own in a set (not one shared event, whose
    waiters leave it one linear search each: thousands of Watch calls ended at once would
    cost time quadratic in their number)."""

    def __init__(self) -> None:
        self.statuses: dict[str, int] = {}
        self.waiting: set[asyncio.Future[None]] = set()
        self.stopped = False

    def set(self, name: str, status: int) -> None:
        self.statuses[name] = status
        self._wake()

    def stop(self) -> None:
        """Every Watch ends (the server is stopping)."""
        self.stopped = True
        self._wake()

    def _wake(self) -> None:
        waiting, self.waiting = self.waiting, set()
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)

    async def check(self, data: bytes, call: Call) -> bytes:
        name = _health_request(data).service
        if name not in self.statuses:
            raise RpcError(StatusCode.NOT_FOUND, f"unknown service {name!r}")
        return health_pb2.HealthCheckResponse(status=self.statuses[name]).SerializeToString()  # type: ignore[no-any-return]

    async def watch(self, data: bytes, call: Call) -> AsyncIterator[bytes]:
        name = _health_request(data).service
        last = None
        loop = asyncio.get_running_loop()
        while not self.stopped:
            status = self.statuses.get(name, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status).SerializeToString()
            fut: asyncio.Future[None] = loop.create_future()
            self.waiting.add(fut)
            try:
                await fut
            finally:
                self.waiting.discard(fut)

    def methods(self) -> dict[str, Method]:
        return {
            f"/{HEALTH_SERVICE}/Check": Method("unary", self.check, public=True),
            f"/{HEALTH_SERVICE}/Watch": Method("stream", self.watch, public=True),
        }


def _health_request(data: bytes) -> Any:
    try:
        return health_pb2.HealthCheckRequest.FromString(data)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and its kin
        raise RpcError(StatusCode.INVALID_ARGUMENT, "not a HealthCheckRequest") from None


def reflection_methods(services: tuple[str, ...]) -> dict[str, Method]:
    """``grpc.reflection.v1alpha.ServerReflection``: grpcio-reflection's own servicer answers
    each request of the stream (``grpcurl list``, ``describe``)."""
    servicer = ReflectionServicer(services)

    def each(data: bytes, call: Call) -> bytes:
        try:
            request = reflection_pb2.ServerReflectionRequest.FromString(data)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and its kin
            raise RpcError(StatusCode.INVALID_ARGUMENT, "not a ServerReflectionRequest") from None
        answer = next(iter(servicer.ServerReflectionInfo(iter((request,)), None)))
        return answer.SerializeToString()  # type: ignore[no-any-return]

    return {f"/{REFLECTION_SERVICE}/ServerReflectionInfo": Method("each", each)}


@dataclass(kw_only=True)
class GrpcServer:
    """A started server: its listening socket's server, the open connections, its health,
    the bounds of a connection, and the sweep that keeps their timers (once a second)."""

    health: Health
    port: int
    limits: Limits = field(default_factory=Limits)
    metrics: Metrics | None = None
    auth: Authenticator | None = None
    tls: Any = None  # the port's ServerTls (control_plane.tls): the listener's context, the names accepted
    max_connections: int = 1024
    server: Any = None
    connections: dict[GrpcConnection, None] = field(default_factory=dict)  # oldest first
    sweeper: asyncio.Task[None] | None = None
    closed_since_trim: int = 0

    def admit(self, conn: GrpcConnection) -> bool:
        """A new connection: in, unless ``max_connections`` are open; then it takes the place
        of the oldest that has never made a call (open a second or more: a squatter, never a
        client such as Envoy that has called), or it is refused (counted)."""
        if len(self.connections) >= self.max_connections:
            now = asyncio.get_running_loop().time()
            squatter = next((c for c in self.connections if c.squatting_for(now) >= 1.0), None)
            if squatter is None:
                self.count("connection_refused")
                return False
            self.count("idle_close")
            squatter.shutdown(close_now=True)
            self.connections.pop(squatter, None)
        self.connections[conn] = None
        if self.metrics is not None:
            self.metrics.grpc_connections.labels().set(len(self.connections))
        return True

    def closed(self, conn: GrpcConnection) -> None:
        self.connections.pop(conn, None)
        self.closed_since_trim += 1
        if self.metrics is not None:
            self.metrics.grpc_connections.labels().set(len(self.connections))

    def count(self, kind: str) -> None:
        """A protocol event (rate_limit_grpc_protocol_errors_total{kind})."""
        if self.metrics is not None:
            self.metrics.grpc_protocol_errors.labels(kind).inc()

    def slow(self) -> None:
        """A connection closed for not sending HTTP/2's preface in time."""
        if self.metrics is not None:
            self.metrics.slow_clients.inc()

    def authorize(self, call: Call, names: tuple[str, ...] = ()) -> None:
        """With a client token required (``SHADOWLIMIT_CLIENT_TOKEN``), every method but
        health needs ``authorization: Bearer <token>`` metadata, or a client certificate
        (``names``) the tokens file gives the ``client`` role (UNAUTHENTICATED)."""
        auth = self.auth
        if auth is None or not auth.client_token_required:
            return
        try:
            check(auth, Access.DATA, _bearer_of(call.metadata), names)
        except Denied as exc:
            if self.metrics is not None and call.path == RLS_METHOD:
                self.metrics.envoy_requests.labels("invalid").inc()
            raise RpcError(StatusCode.UNAUTHENTICATED, exc.message) from None

    async def sweep(self) -> None:
        """Once a second: every connection's timers; the C heap trimmed after connections
        came and went by the hundred (see :func:`~control_plane.gctune.trim_heap`)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_S)
            now = loop.time()
            for conn in list(self.connections):
                conn.tick(now)
            if self.closed_since_trim >= TRIM_AFTER_CLOSED:
                self.closed_since_trim = 0
                trim_heap()

    async def stop(self, grace_s: float = 2.0) -> None:
        """Say NOT_SERVING, stop listening, tell every connection to take no more calls
        (GOAWAY), give the calls in flight ``grace_s`` to finish, then close."""
        for name in list(self.health.statuses):
            self.health.set(name, _NOT_SERVING)
        self.health.stop()
        if self.sweeper is not None:
            self.sweeper.cancel()
        if self.server is not None:
            self.server.close()
        for conn in list(self.connections):
            conn.shutdown()
        loop = asyncio.get_running_loop()
        end = loop.time() + grace_s
        while self.connections and loop.time() < end:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()


def _bearer_of(metadata: list[tuple[str, str]]) -> str | None:
    """The token of an ``authorization: Bearer <token>`` metadata entry."""
    for key, value in metadata:
        if key == "authorization":
            scheme, _, token = value.partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None


def _listen_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_grpc_server(
    engine: Engine,
    host: str,
    port: int,
    auth: Authenticator | None = None,
    *,
    reuse_port: bool = False,
    tls: ServerTls | None = None,
    handshake_timeout_s: float = 5.0,
) -> GrpcServer:
    """Start serving (``port`` 0: a free port, see :attr:`GrpcServer.port`); a port that
    cannot be bound raises ``OSError`` naming it. With ``auth`` requiring a client token
    (``SHADOWLIMIT_CLIENT_TOKEN``), every call but health must carry ``authorization: Bearer
    <token>`` metadata (Envoy: ``grpc_service.initial_metadata``). With ``reuse_port``, the
    workers of ``serve --workers`` share the port (``SO_REUSEPORT``; serve checked that it
    was free). With ``tls``, the port speaks TLS (ALPN ``h2``), each handshake done within
    ``handshake_timeout_s``."""
    settings = engine.settings
    service = RateLimitService(engine.live_rules, engine.decider, engine.metrics, headers=settings.envoy_headers)
    health = Health()
    table: dict[str, Method] = {**methods(service), **health.methods()}
    services = (RLS_SERVICE, HEALTH_SERVICE)
    if settings.grpc_reflection:
        table.update(reflection_methods((*services, REFLECTION_SERVICE)))
    # streams per connection: Limits' 1,024; the servicer's own bound (SHADOWLIMIT_GRPC_MAX_CALLS)
    # answers RESOURCE_EXHAUSTED past it, counted, across connections
    keepalive = settings.grpc_keepalive_s
    limits = Limits(
        max_message_bytes=MAX_MESSAGE_BYTES,
        preface_timeout_s=settings.header_timeout_s,
        idle_timeout_s=settings.grpc_idle_timeout_s,
        keepalive_s=keepalive,
        keepalive_timeout_s=min(20.0, max(1.0, keepalive / 3)),
    )
    cap = min(settings.grpc_max_connections, connection_shares()[1])
    grpc = GrpcServer(
        health=health, port=0, limits=limits, metrics=engine.metrics, auth=auth, tls=tls, max_connections=cap
    )
    loop = asyncio.get_running_loop()
    address = _listen_address(host, port)
    try:
        server = await loop.create_server(
            lambda: GrpcConnection(table, limits, grpc),
            host,
            port,
            reuse_port=reuse_port or None,
            reuse_address=True,
            backlog=1024,
            ssl=tls.context if tls is not None else None,
            ssl_handshake_timeout=handshake_timeout_s if tls is not None else None,
        )
    except OSError as exc:
        raise OSError(f"SHADOWLIMIT_GRPC_PORT: cannot listen on {address}: {exc.strerror or exc}") from None
    grpc.server = server
    grpc.port = server.sockets[0].getsockname()[1]
    grpc.sweeper = loop.create_task(grpc.sweep())
    for name in ("", RLS_SERVICE):
        health.set(name, _SERVING)
    log.info("Envoy rate limit service (gRPC%s) on %s", " over TLS" if tls else "", _listen_address(host, grpc.port))
    return grpc
