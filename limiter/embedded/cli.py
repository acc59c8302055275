"""``python -m limiter.embedded``: run a private server (or cluster) until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from .cluster import EmbeddedCluster
from .process import EmbeddedRedisError
from .server import EmbeddedRedis

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``python -m limiter.embedded [--cluster] [--unix-socket] [--port N]``.

    Starts a server (or cluster), prints its URL on stdout and runs until
    Ctrl-C / SIGTERM, then stops it cleanly. Returns the exit status.
    """
    parser = argparse.ArgumentParser(
        prog="python -m limiter.embedded",
        description="Run a private loopback-only redis-server (or 3-master cluster) until Ctrl-C.",
    )
    parser.add_argument("--cluster", action="store_true", help="start a Redis Cluster instead")
    parser.add_argument("--masters", type=int, default=3, help="cluster masters (default 3)")
    parser.add_argument("--unix-socket", action="store_true", help="listen on a unix socket (standalone only)")
    parser.add_argument("--port", type=int, default=None, help="fixed TCP port (standalone only)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    args = parser.parse_args(argv)

    server: EmbeddedRedis | EmbeddedCluster
    try:
        if args.cluster:
            if args.unix_socket or args.port is not None:
                parser.error("--unix-socket/--port apply to a standalone server only")
            server = EmbeddedCluster(masters=args.masters, host=args.host)
        else:
            server = EmbeddedRedis(unix_socket=args.unix_socket, port=args.port, host=args.host)
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
        if isinstance(server, EmbeddedCluster):
            print(f"nodes: {' '.join(f'{h}:{p}' for h, p in server.nodes)}  pids: {server.pids}", file=sys.stderr)
        else:
            print(f"pid: {server.pid}  data dir: {server.data_dir}", file=sys.stderr)
        print("Ctrl-C to stop.", file=sys.stderr, flush=True)
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
