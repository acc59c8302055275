"""A bare Envoy rate limit service: a grpcio aio server answering every ``ShouldRateLimit``
``OK`` at once (no parsing, no work), the ceiling the ``envoy`` section measures shadowlimit
against.

It runs the way ``shadowlimit serve --grpc-port`` does: grpcio's aio server in a uvloop event
loop (uvicorn's ``loop="auto"`` picks uvloop when it is installed, and shadowlimit's gRPC
server runs in uvicorn's loop), a generic handler taking the request's bytes (as
``control_plane.envoy.service.method_handlers``), one process.

With ``--h2``, the same answer from shadowlimit's own transport
(:mod:`control_plane.envoy.transport`, what ``serve --grpc-port`` runs) instead of grpcio's server:
the transport's own ceiling, with no decision made.

Run: ``python -m bench.bare_rls PORT [--h2]`` (loopback only; ``-m``, not the file's path: the
``bench/`` directory on ``sys.path`` would hide the ``envoy`` protobuf package). Prints
``READY <port>`` once it serves, and stops on SIGTERM / SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import Any

__all__ = ["OK_RESPONSE", "serve"]


def _ok_response() -> bytes:
    from envoy.service.ratelimit.v3 import rls_pb2

    return bytes(rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK).SerializeToString())


OK_RESPONSE = _ok_response()


async def serve(port: int) -> None:
    import grpc

    async def should_rate_limit(data: bytes, context: Any) -> bytes:  # the request's bytes: not even parsed
        return OK_RESPONSE

    handler = grpc.unary_unary_rpc_method_handler(
        should_rate_limit, request_deserializer=None, response_serializer=None
    )
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "envoy.service.ratelimit.v3.RateLimitService", {"ShouldRateLimit": handler}
            ),
        )
    )
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    if not bound:
        raise SystemExit(f"bare_rls: cannot listen on 127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"READY {bound} {type(loop).__module__}", flush=True)
    await stop.wait()
    await server.stop(0.5)


async def serve_h2(port: int) -> None:
    from control_plane.envoy.server import GrpcServer, Health
    from control_plane.envoy.transport import Call, GrpcConnection, Method

    async def should_rate_limit(data: bytes, call: Call) -> bytes:
        return OK_RESPONSE

    table = {"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit": Method("unary", should_rate_limit)}
    owner = GrpcServer(health=Health(), port=0)  # no metrics, no token, the default bounds
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: GrpcConnection(table, owner.limits, owner), "127.0.0.1", port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"READY {server.sockets[0].getsockname()[1]} {type(loop).__module__}", flush=True)
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    h2 = "--h2" in argv
    argv = [a for a in argv if a != "--h2"]
    port = int(argv[0]) if argv else 0
    serve_fn = serve_h2 if h2 else serve
    try:
        import uvloop
    except ImportError:  # as uvicorn's "auto": the default loop without uvloop
        asyncio.run(serve_fn(port))
    else:
        with contextlib.suppress(KeyboardInterrupt):
            uvloop.run(serve_fn(port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
