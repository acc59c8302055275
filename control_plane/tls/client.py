"""The TLS of shadowlimit's own clients (the CLI, the dashboard, the demo's traffic): an
``ssl.SSLContext`` trusting a CA bundle, presenting a client certificate when given one.

httpx takes it as ``verify=``; given as ``cert=(crt, key)`` httpx 0.28 presents no
certificate, and a server requiring one cuts the connection after TLS 1.3's handshake.
"""

from __future__ import annotations

import ssl
from pathlib import Path

__all__ = ["client_context"]


def client_context(
    *, ca_file: Path | None = None, cert_file: Path | None = None, key_file: Path | None = None
) -> ssl.SSLContext | bool:
    """What to pass httpx as ``verify=``: True (the system's CAs) when nothing is given,
    else a context with the CA bundle and the client certificate; ``ValueError`` naming the
    file that cannot be used."""
    if key_file is not None and cert_file is None:
        raise ValueError(f"{key_file}: a client key needs its certificate")
    if ca_file is None and cert_file is None:
        return True
    try:
        ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"{ca_file}: not a CA bundle that can be read: {exc}") from None
    if cert_file is not None:
        try:
            ctx.load_cert_chain(str(cert_file), str(key_file) if key_file is not None else None)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"{cert_file}: the client certificate (and its key) cannot be used: {exc}") from None
    return ctx
