"""TLS and mutual TLS on shadowlimit's own ports (docs/tls.md): the files checked
(:mod:`.files`), a port's TLS while it serves, rotation included (:mod:`.server`), the loop
that bounds each handshake (:mod:`.loop`), their metrics (:mod:`.metrics`),
and the context of shadowlimit's own clients (:mod:`.client`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .client import client_context
from .files import CertificateInfo, TlsFileError, certificate_names, server_context
from .loop import handshake_bounded_loop
from .server import ALPN, ServerTls

if TYPE_CHECKING:
    from ..settings import Settings
    from .spec import Port

__all__ = [
    "ALPN",
    "CertificateInfo",
    "ServerTls",
    "TlsFileError",
    "certificate_names",
    "check_tls",
    "client_context",
    "handshake_bounded_loop",
    "port_tls",
    "server_context",
]


def port_tls(settings: Settings, port: Port) -> ServerTls | None:
    """The TLS ``port`` serves with under ``settings`` (None: cleartext); a
    :class:`TlsFileError` naming the setting and the file when one cannot be used."""
    spec = settings.port_tls(port)
    if spec is None:
        return None
    return ServerTls(spec, reload_s=settings.tls_reload_s)


def check_tls(settings: Settings) -> None:
    """Each port's certificate, key and client CA can serve (``serve`` asks before it starts,
    so that a bad file is a startup error): a :class:`TlsFileError` naming the setting and
    the file. The settings themselves read no file (the CLI's other commands, the middleware)."""
    port_tls(settings, "http")
    if settings.grpc_port is not None:
        port_tls(settings, "grpc")
