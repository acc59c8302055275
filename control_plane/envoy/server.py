"""The gRPC server beside the HTTP one: Envoy's rate limit service, gRPC health checking
(``grpc.health.v1.Health``: SERVING while the engine runs) and server reflection, on
``SHADOWLIMIT_HOST:SHADOWLIMIT_GRPC_PORT``, in the app's event loop."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from envoy.service.ratelimit.v3 import rls_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import SERVICE_NAME as HEALTH_SERVICE
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from .service import RateLimitService, method_handlers

if TYPE_CHECKING:
    from ..auth import Authenticator
    from ..engine import Engine

__all__ = ["MAX_CONCURRENT_RPCS", "MAX_MESSAGE_BYTES", "RLS_SERVICE", "GrpcServer", "start_grpc_server"]

log = logging.getLogger("shadowlimit.envoy")

#: the full name of Envoy's rate limit service
RLS_SERVICE = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"].full_name
#: the largest request message accepted (Envoy's are a few hundred bytes)
MAX_MESSAGE_BYTES = 64 * 1024
#: calls in progress at once (SHADOWLIMIT_GRPC_MAX_CALLS' default); more are refused at once
#: with RESOURCE_EXHAUSTED, counted as rate_limit_envoy_requests_total{code="overloaded"}
MAX_CONCURRENT_RPCS = 4096
#: calls gRPC core holds before the event loop takes them; past it core cancels them uncounted,
#: so it is far above any number the servicer answers (itself or with RESOURCE_EXHAUSTED)
MAX_PENDING_CALLS = 32_768


@dataclass
class GrpcServer:
    """A started server and the port it listens on."""

    server: Any
    health: Any
    port: int

    async def stop(self, grace_s: float = 2.0) -> None:
        """Say NOT_SERVING, then stop (calls in flight get ``grace_s`` to finish)."""
        for name in ("", RLS_SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace_s)


def _listen_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_grpc_server(
    engine: Engine, host: str, port: int, auth: Authenticator | None = None, *, reuse_port: bool = False
) -> GrpcServer:
    """Start serving (``port`` 0: a free port, see :attr:`GrpcServer.port`); a port that
    cannot be bound raises ``OSError`` naming it. With ``auth`` requiring a client token
    (``SHADOWLIMIT_CLIENT_TOKEN``), every call must carry ``authorization: Bearer <token>``
    metadata (Envoy: ``grpc_service.initial_metadata``)."""
    # no maximum_concurrent_rpcs: the servicer refuses past SHADOWLIMIT_GRPC_MAX_CALLS itself, counted
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            # calls that arrived but that the event loop has not taken yet: gRPC core cancels those
            # past 1,000 (its default), so a burst of 2,000 ended 3-9% CANCELLED, uncounted
            ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
            ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
            # a port in use is an error, not a second listener -- but for the workers of
            # `serve --workers`, which share it (serve checked that it was free)
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ],
    )
    service = RateLimitService(
        engine.live_rules, engine.decider, engine.metrics, auth, headers=engine.settings.envoy_headers
    )
    server.add_generic_rpc_handlers((method_handlers(service),))
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((RLS_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME), server)
    address = _listen_address(host, port)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"SHADOWLIMIT_GRPC_PORT: cannot listen on {address}: {exc}") from None
    if not bound:
        raise OSError(f"SHADOWLIMIT_GRPC_PORT: cannot listen on {address}")
    await server.start()
    for name in ("", RLS_SERVICE):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("Envoy rate limit service (gRPC) on %s", _listen_address(host, bound))
    return GrpcServer(server, health, bound)
