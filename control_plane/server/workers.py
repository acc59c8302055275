"""``shadowlimit serve``: one process, or ``--workers N`` processes on one port.

Each worker is a whole control plane -- its own engine, local limiter, heartbeat in the fleet
(its own instance id) and, with ``SHADOWLIMIT_GRPC_PORT``, its own gRPC server -- listening
on the same port with ``SO_REUSEPORT``, so the kernel spreads connections across them. The
parent only supervises: a worker that dies is started again (after a second), and SIGTERM or
SIGINT stops every worker cleanly (each finishes its requests in flight, as one process does)
within ``STOP_TIMEOUT_S``, then the parent exits.

With ``--embedded-redis`` (development) the parent starts the one private redis-server and
hands its URL to the workers: they share it as a fleet shares its Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from typing import Any

__all__ = ["STOP_TIMEOUT_S", "run_server", "serve_workers"]

log = logging.getLogger("shadowlimit.workers")

#: how long the workers get to finish their requests in flight after SIGTERM
STOP_TIMEOUT_S = 30.0


def run_server(settings: Any, log_level: str, *, reuse_port: bool = False) -> None:
    """One control plane under uvicorn in this process, until it is told to stop."""
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    from ..observe.logs import quiet_repeats
    from ..tls import handshake_bounded_loop
    from .app import create_app
    from .serving import http_protocol

    app = create_app(settings)
    tls = app.state.tls["http"]
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        # SHADOWLIMIT_LOG_FORMAT=json: uvicorn's loggers were given the JSON handler
        # (control_plane.observe.logs); its own logging config would put the text one back
        log_config=None if settings.log_format == "json" else LOGGING_CONFIG,
        access_log=False,
        # client addresses come from the TCP peer; forwarding headers are believed only by
        # the key extractor, from SHADOWLIMIT_TRUSTED_PROXIES (uvicorn's own default would
        # rewrite the peer from X-Forwarded-For for any request from 127.0.0.1)
        proxy_headers=False,
        http=http_protocol(settings.request_limits, tls=tls),
        # with TLS: the files (so that uvicorn says https), its context replaced below by the port's
        ssl_certfile=str(tls.spec.cert_file) if tls is not None else None,
        ssl_keyfile=str(tls.spec.key_file) if tls is not None else None,
    )
    quiet_repeats()  # a client's garbage is one line a minute (uvicorn's logging is set up by now)
    server = uvicorn.Server(config)
    sockets = [_shared_socket(settings.host, settings.port, config.backlog)] if reuse_port else None
    if tls is None:
        server.run(sockets=sockets)  # uvicorn's own loop (uvloop where installed)
        return
    config.load()
    config.ssl = tls.context  # the port's context, which rotates (control_plane.tls.server)
    # the loop uvicorn would choose, with each TLS handshake bounded (control_plane.tls.loop)
    with asyncio.Runner(loop_factory=handshake_bounded_loop(settings.tls_handshake_timeout_s)) as runner:
        runner.run(server.serve(sockets=sockets))


def _shared_socket(host: str, port: int, backlog: int) -> socket.socket:
    """The port the workers of ``--workers N`` share (``SO_REUSEPORT``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    return sock


def exit_with_parent(parent_pid: int) -> None:
    """Have the kernel send this process SIGTERM when its parent dies (Linux; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before that: nobody supervises us
        os._exit(1)


def _worker_main(overrides: dict[str, Any], log_level: str, parent_pid: int) -> None:
    """A worker process: the settings again (the environment is inherited), then serve."""
    from ..observe.logs import configure_logging
    from ..settings import load_settings

    exit_with_parent(parent_pid)  # a supervisor killed outright leaves no worker holding the port
    settings = load_settings(**overrides)
    configure_logging(log_level, settings.log_format)
    try:
        run_server(settings, log_level, reuse_port=True)
    except KeyboardInterrupt:  # Ctrl-C reaches every worker: the clean shutdown already ran
        pass


class _Supervisor:
    def __init__(self, n: int, overrides: dict[str, Any], log_level: str, instance_id: str | None) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.n = n
        self.overrides = overrides
        self.log_level = log_level
        self.instance_id = instance_id
        self.procs: list[Any] = [None] * n
        self.started_at = [0.0] * n
        self.quick_deaths: list[float] = []  # when workers died soon after starting
        self.stopping = False

    def start(self, i: int) -> None:
        overrides = dict(self.overrides)
        if self.instance_id:  # each worker is its own fleet instance
            overrides["instance_id"] = f"{self.instance_id}-{i}"
        p = self.ctx.Process(
            target=_worker_main,
            args=(overrides, self.log_level, os.getpid()),
            name=f"shadowlimit-worker-{i}",
            daemon=False,
        )
        p.start()
        self.procs[i] = p
        self.started_at[i] = time.monotonic()

    def stop(self, *_: Any) -> None:
        self.stopping = True

    def run(self) -> int:
        for i in range(self.n):
            self.start(i)
        log.info("serving with %d workers (pids %s)", self.n, ", ".join(str(p.pid) for p in self.procs))
        while not self.stopping:
            time.sleep(0.2)
            for i, p in enumerate(self.procs):
                if self.stopping or p.is_alive():
                    continue
                now = time.monotonic()
                if now - self.started_at[i] < 10:
                    self.quick_deaths = [t for t in self.quick_deaths if now - t < 60] + [now]
                if len(self.quick_deaths) > 3:  # 4 early deaths within a minute: restarting will not help
                    log.error("workers keep exiting at startup (last: %d, code %s); stopping", i, p.exitcode)
                    self.shutdown()
                    return 1
                log.warning("worker %d (pid %s) exited with %s; starting it again", i, p.pid, p.exitcode)
                time.sleep(1.0)
                if not self.stopping:
                    self.start(i)
        return self.shutdown()

    def shutdown(self) -> int:
        for p in self.procs:
            if p.is_alive():
                p.terminate()  # SIGTERM: uvicorn's graceful shutdown
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        stuck = [p for p in self.procs if p.is_alive()]
        for p in stuck:
            log.error("worker pid %s did not stop within %.0f s; killing it", p.pid, STOP_TIMEOUT_S)
            p.kill()
            p.join(5)
        return 1 if stuck else 0


def serve_workers(settings: Any, overrides: dict[str, Any], n: int, log_level: str) -> int:
    """Supervise ``n`` worker processes until SIGTERM / SIGINT; the exit code."""
    embedded = None
    overrides = dict(overrides, workers=n)
    if settings.redis_url is None:  # --embedded-redis: one private server for all workers
        from limiter.embedded import EmbeddedRedis

        embedded = EmbeddedRedis().start()
        overrides.update(redis_url=embedded.url, embedded_redis=False)
        log.warning(
            "development mode (--embedded-redis): started a private redis-server at %s for the %d workers",
            embedded.url,
            n,
        )
    sup = _Supervisor(n, overrides, log_level, settings.instance_id)
    signal.signal(signal.SIGTERM, sup.stop)
    signal.signal(signal.SIGINT, sup.stop)
    try:
        return sup.run()
    finally:
        if embedded is not None:
            embedded.stop()
        sys.stdout.flush()
