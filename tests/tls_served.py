"""``shadowlimit serve`` in a subprocess with TLS on its ports, as a user runs it, and the
clients that speak to it: httpx with an ``ssl.SSLContext`` (given as ``cert=`` httpx 0.28
presents no client certificate) and grpcio with channel credentials.

Usage::

    with TlsServed(redis_url, pki, env={"SHADOWLIMIT_TLS_CLIENT_CA_FILE": pki.ca_cert}) as s:
        s.get("/healthz", client=(pki.client_cert, pki.client_key))
"""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from cp_server import ADMIN_TOKEN, clean_env, free_port

from control_plane.tls.client import client_context
from limiter.embedded.tls import TestPki

__all__ = ["SHADOWLIMIT", "TlsServed", "client_ssl", "grpc_channel"]

SHADOWLIMIT = Path(sys.executable).parent / "shadowlimit"


def client_ssl(ca: str, client: tuple[str, str] | None = None) -> ssl.SSLContext:
    """A client context trusting ``ca`` and presenting ``client`` (cert, key) if given: the one
    shadowlimit's own clients build (control_plane.tls.client_context)."""
    cert, key = (Path(client[0]), Path(client[1])) if client is not None else (None, None)
    ctx = client_context(ca_file=Path(ca), cert_file=cert, key_file=key)
    assert isinstance(ctx, ssl.SSLContext)
    return ctx


def grpc_channel(port: int, ca: str, client: tuple[str, str] | None = None) -> Any:
    """A grpcio channel over TLS to ``localhost:port`` (the server certificate's name)."""
    import grpc

    key = chain = None
    if client is not None:
        chain, key = Path(client[0]).read_bytes(), Path(client[1]).read_bytes()
    creds = grpc.ssl_channel_credentials(Path(ca).read_bytes(), key, chain)
    return grpc.secure_channel(f"localhost:{port}", creds)


class TlsServed:
    """A ``shadowlimit serve`` process with the test PKI's server certificate on its HTTP
    port (and its gRPC port with ``grpc=True``), ``env`` added to its environment."""

    def __init__(
        self,
        redis_url: str,
        pki: TestPki,
        *,
        env: dict[str, str] | None = None,
        grpc_config: Path | None = None,
        cert: tuple[str, str] | None = None,
    ) -> None:
        self.pki = pki
        self.port = free_port()
        self.grpc_port = free_port() if grpc_config is not None else None
        cert_file, key_file = cert or (pki.server_cert, pki.server_key)
        self.env = clean_env(
            RATE_LIMIT_REDIS_URL=redis_url,
            SHADOWLIMIT_PORT=str(self.port),
            SHADOWLIMIT_NAMESPACE=f"tls-{self.port}",
            SHADOWLIMIT_ADMIN_TOKEN=ADMIN_TOKEN,
            SHADOWLIMIT_TLS_CERT_FILE=cert_file,
            SHADOWLIMIT_TLS_KEY_FILE=key_file,
            SHADOWLIMIT_TLS_RELOAD_S="0.2",
        )
        if grpc_config is not None:
            self.env.update(
                SHADOWLIMIT_GRPC_PORT=str(self.grpc_port),
                SHADOWLIMIT_ENVOY_CONFIG=str(grpc_config),
                ENABLE_DISTRIBUTED_RATE_LIMITING="true",
            )
        self.env.update(env or {})
        self.url = f"https://localhost:{self.port}"
        self.proc: subprocess.Popen[str] | None = None
        self.client: tuple[str, str] | None = None  # what the readiness probe presents

    def __enter__(self) -> TlsServed:
        self.proc = subprocess.Popen(
            [str(SHADOWLIMIT), "serve", "--log-level", "warning"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}:\n{self.stderr()}")
            try:
                if self.get("/readyz", client=self.client).status_code == 200:
                    return self
            except (httpx.HTTPError, ssl.SSLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"serve not ready over TLS within 30 s:\n{self.stderr()}")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def stderr(self) -> str:
        if self.proc is None or self.proc.stderr is None:
            return ""
        if self.proc.poll() is None:
            self.stop()
        return self.proc.stderr.read()

    def http(self, *, ca: str | None = None, client: tuple[str, str] | None = None, **kw: Any) -> httpx.Client:
        """An httpx client of this server's HTTPS API (a new connection per client)."""
        return httpx.Client(base_url=self.url, verify=client_ssl(ca or self.pki.ca_cert, client), timeout=5, **kw)

    def get(self, path: str, *, client: tuple[str, str] | None = None, **kw: Any) -> httpx.Response:
        with self.http(client=client) as h:
            return h.get(path, **kw)
