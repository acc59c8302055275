"""A grpcio client of Envoy's rate limit service (Envoy's generated messages) for the tests
that call a control plane's gRPC port directly, and the wait for a fixed window's edge."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf.wrappers_pb2 import UInt64Value

__all__ = ["MINUTE", "OK", "OVER", "Response", "Rls", "clear_of_minute_edge", "descriptor", "serve", "set_mode"]

Response = rls_pb2.RateLimitResponse
OK, OVER = Response.OK, Response.OVER_LIMIT
MINUTE = Response.RateLimit.MINUTE


def descriptor(*entries: tuple[str, str], hits: int | None = None) -> Any:
    """A request descriptor; ``hits`` sets its own ``hits_addend`` (0 included)."""
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(UInt64Value(value=hits))
    return d


class Rls:
    """A grpcio client of one control plane's gRPC port."""

    def __init__(self, port: int, channel: Any = None) -> None:
        """Over cleartext to ``127.0.0.1:port``, or over ``channel`` (a TLS one, say)."""
        self.channel = channel if channel is not None else grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)
        self.raw = self.channel.unary_unary(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            request_serializer=None,
            response_deserializer=None,
        )

    def ask(self, *descriptors: Any, domain: str = "edge", hits: int = 0) -> Any:
        req = rls_pb2.RateLimitRequest(domain=domain, descriptors=list(descriptors), hits_addend=hits)
        return self.stub.ShouldRateLimit(req, timeout=10)

    def codes(self, *descriptors: Any, **kw: Any) -> tuple[int, list[int]]:
        r = self.ask(*descriptors, **kw)
        return r.overall_code, [s.code for s in r.statuses]

    def close(self) -> None:
        self.channel.close()


def clear_of_minute_edge(margin_s: float = 8.0) -> None:
    """Fixed windows are aligned on the minute: a test counting within one waits out its end."""
    left = 60 - time.time() % 60
    if left < margin_s:
        time.sleep(left + 0.2)


def serve(redis_url: str, config: Path, **overrides: Any) -> Any:
    """A started control plane serving ``config`` (an Envoy config) on a free gRPC port."""
    from cp_server import ControlPlaneServer, free_port

    overrides.setdefault("rules_poll_interval_s", 0.2)
    return ControlPlaneServer(redis_url=redis_url, envoy_config=str(config), grpc_port=free_port(), **overrides).start()


def set_mode(cp: Any, route: str, mode: str, percent: int | None = None) -> None:
    """Move ``route`` to ``mode`` through the REST API (forced past the gates)."""
    import httpx
    from cp_server import admin_headers

    body: dict[str, Any] = {"mode": mode, "reason": "envoy test", "force": True}
    if percent is not None:
        body["canary_percent"] = percent
    r = httpx.put(f"{cp.url}/v1/routes/{quote(route, safe='')}/mode", json=body, headers=admin_headers(), timeout=10)
    assert r.status_code == 200, r.text
