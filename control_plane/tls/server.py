"""One port's TLS while it serves: the context it listens with, its files' rotation, the
names a client certificate must carry, and what it counted.

Rotation without a restart: the listening context's SNI callback (OpenSSL calls it for every
ClientHello, with a server name or without) hands each new connection the newest context.
The files are looked at, at most once per ``SHADOWLIMIT_TLS_RELOAD_S``, by that callback and
by every ``/metrics`` scrape: their real paths (a kubelet swaps a Secret's ``..data`` symlink),
sizes, modification times and inodes. A changed set is loaded and checked as at startup; a
pair that cannot be used (unreadable, a key that is not the certificate's, expired) keeps the
old context, logged once per version of the files and counted. Connections already open keep
the context they were made with.

Whether a client certificate is required is fixed at startup (OpenSSL takes it from the
listening context); its CA and the certificate served follow the files.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .files import CertificateInfo, TlsFileError, certificate_names, server_context
from .spec import PortTls

__all__ = ["ALPN", "ServerTls"]

log = logging.getLogger("shadowlimit.tls")

#: what each port says in ALPN: the HTTP API speaks HTTP/1.1 (uvicorn), the gRPC port HTTP/2
ALPN = {"http": ("http/1.1",), "grpc": ("h2",)}


class ServerTls:
    """The TLS of one port (see the module docstring). :attr:`context` is the one to listen
    with; :meth:`admit` is asked about each new connection once its handshake is done."""

    def __init__(
        self,
        spec: PortTls,
        *,
        reload_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec
        self.reload_s = reload_s
        self._clock = clock
        self._wall = wall
        self.reloads = {"ok": 0, "error": 0}
        self.failing = False  # the files on disk now are ones that could not be used
        self._reloading = threading.Lock()
        self.refused_names = 0  # connections closed after the handshake: no accepted name
        self._seen = self._fingerprint()
        self._checked = clock()
        self._failed_seen: object = None
        self.context, self.certificate = self._build()  # a TlsFileError at startup
        self._current = self.context
        self.context.sni_callback = self._select
        self.accepted = frozenset(spec.client_names)

    @property
    def port(self) -> str:
        return self.spec.port

    def _files(self) -> list[tuple[str, Path]]:
        s = self.spec
        files = [(s.cert_setting, s.cert_file), (s.key_setting, s.key_file)]
        if s.client_ca_file is not None and s.client_ca_setting is not None:
            files.append((s.client_ca_setting, s.client_ca_file))
        return files

    def _fingerprint(self) -> tuple[object, ...]:
        out: list[object] = []
        for _, path in self._files():
            try:
                real = os.path.realpath(path)
                st = os.stat(real)
                out.append((real, st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError as exc:
                out.append((str(path), type(exc).__name__))
        return tuple(out)

    def _build(self) -> tuple[ssl.SSLContext, CertificateInfo]:
        s = self.spec
        ca = (s.client_ca_setting, s.client_ca_file) if s.client_ca_file and s.client_ca_setting else None
        return server_context(
            cert=(s.cert_setting, s.cert_file),
            key=(s.key_setting, s.key_file),
            client_ca=ca,
            alpn=ALPN[s.port],
            now=self._wall(),
        )

    def maybe_reload(self) -> bool:
        """Load the files again if they changed (at most once per ``reload_s``, by one caller
        at a time: the handshakes on the event loop, a ``/metrics`` scrape in a thread): True
        when a new context now serves new connections."""
        if self._clock() - self._checked < self.reload_s or not self._reloading.acquire(blocking=False):
            return False
        try:
            self._checked = self._clock()
            return self._reload()
        finally:
            self._reloading.release()

    def _reload(self) -> bool:
        seen = self._fingerprint()
        if seen == self._seen:  # the files in use (again, after a refused version, say)
            self.failing = False
            return False
        if seen == self._failed_seen:  # the version refused already
            return False
        try:
            ctx, leaf = self._build()
        except (TlsFileError, ssl.SSLError, OSError, ValueError) as exc:
            self._failed_seen = seen  # logged and counted once per version of the files
            self.reloads["error"] += 1
            self.failing = True
            log.error("TLS (%s port): new files not used, the old certificate stays: %s", self.port, exc)
            return False
        self._seen, self._current, self.certificate = seen, ctx, leaf
        self.reloads["ok"] += 1
        self.failing = False
        log.info("TLS (%s port): new certificate %s, valid until %s", self.port, leaf.subject, _utc(leaf.not_after))
        return True

    def _select(self, sslobj: Any, server_name: str | None, ctx: ssl.SSLContext) -> None:
        """The SNI callback: the newest context for this connection."""
        try:
            self.maybe_reload()
            if self._current is not self.context:  # the listening context's own files are the first
                sslobj.context = self._current
        except Exception:  # never break a handshake over a reload; the old context serves it
            log.exception("TLS (%s port): choosing the certificate failed", self.port)

    def admit(self, ssl_object: Any) -> tuple[str, ...] | None:
        """A connection whose handshake is done: its client certificate's names (empty
        without mutual TLS), or None when mutual TLS names the accepted clients and this
        one is none of them (the caller closes it; counted here)."""
        if ssl_object is None or not self.spec.mutual:
            return ()
        peer = ssl_object.getpeercert()
        names = certificate_names(peer) if peer else ()
        if self.accepted and not self.accepted.intersection(names):
            self.refused_names += 1
            return None
        return names


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
