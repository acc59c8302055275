"""``python -m limiter.embedded``: run a private server, cluster or sentinel set until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from .cluster import EmbeddedCluster
from .process import EmbeddedRedisError
from .sentinel import EmbeddedSentinelSet
from .server import EmbeddedRedis
from .tls import make_test_pki

__all__ = ["main"]

Launched = EmbeddedRedis | EmbeddedCluster | EmbeddedSentinelSet


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m limiter.embedded",
        description="Run a private loopback-only redis-server (or cluster, or sentinel set) until Ctrl-C.",
    )
    parser.add_argument("--cluster", action="store_true", help="start a Redis Cluster instead")
    parser.add_argument("--sentinel", action="store_true", help="start a master, replicas and 3 sentinels instead")
    parser.add_argument("--masters", type=int, default=3, help="cluster masters (default 3)")
    parser.add_argument(
        "--replicas", type=int, default=None, help="replicas per master (cluster: default 0; sentinel: default 1)"
    )
    parser.add_argument("--unix-socket", action="store_true", help="listen on a unix socket (standalone only)")
    parser.add_argument("--port", type=int, default=None, help="fixed TCP port (standalone only)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    parser.add_argument("--tls", metavar="DIR", default=None, help="serve TLS with a test PKI made (or reused) in DIR")
    parser.add_argument("--password", default=None, help="require this password (requirepass)")
    return parser


def _build(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Launched:
    tls = make_test_pki(args.tls).server_config() if args.tls else None
    if args.cluster or args.sentinel:
        if args.unix_socket or args.port is not None:
            parser.error("--unix-socket/--port apply to a standalone server only")
        if args.cluster and args.sentinel:
            parser.error("--cluster and --sentinel exclude each other")
    if args.cluster:
        return EmbeddedCluster(
            masters=args.masters, replicas=args.replicas or 0, host=args.host, tls=tls, password=args.password
        )
    if args.sentinel:
        replicas = 1 if args.replicas is None else args.replicas
        return EmbeddedSentinelSet(replicas=replicas, host=args.host, tls=tls, password=args.password)
    if args.replicas:
        parser.error("--replicas applies to --cluster or --sentinel")
    return EmbeddedRedis(unix_socket=args.unix_socket, port=args.port, host=args.host, tls=tls, password=args.password)


def _describe(server: Launched) -> None:
    if isinstance(server, EmbeddedCluster):
        print(f"nodes: {' '.join(f'{h}:{p}' for h, p in server.nodes)}  pids: {server.pids}", file=sys.stderr)
    elif isinstance(server, EmbeddedSentinelSet):
        data = " ".join(f"{s.host}:{s.port}" for s in server.servers)
        print(f"data nodes: {data}  master: {server.master_address()}", file=sys.stderr)
    else:
        print(f"pid: {server.pid}  data dir: {server.data_dir}", file=sys.stderr)
    if server.access.tls is not None:
        print(f"TLS: CA {server.access.tls.ca_cert_file}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """``python -m limiter.embedded [--cluster [--replicas N] | --sentinel] [--tls DIR] ...``.

    Starts a server (or cluster, or sentinel set), prints its URL on stdout and runs
    until Ctrl-C / SIGTERM, then stops it cleanly. Returns the exit status.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        server = _build(args, parser)
    except EmbeddedRedisError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    stop_requested = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            server.start()
        except EmbeddedRedisError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(server.url, flush=True)
        _describe(server)
        print("Ctrl-C to stop.", file=sys.stderr, flush=True)
        if isinstance(server, EmbeddedSentinelSet):
            nodes: list[EmbeddedRedis] = [*server.servers, *server.sentinels]
        else:
            nodes = server.servers if isinstance(server, EmbeddedCluster) else [server]
        while not stop_requested.wait(0.5):
            dead = [n for n in nodes if not n.running]
            if dead:
                print(f"error: redis-server exited unexpectedly: {dead}", file=sys.stderr)
                return 1
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
