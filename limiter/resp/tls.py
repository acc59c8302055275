"""TLS contexts for the RESP client, built once per :class:`~limiter.redis_url.TlsConfig`
(reading the CA and the client certificate is file IO: done when the client is built,
so a missing or unreadable file is a startup error naming the option)."""

from __future__ import annotations

import ssl

from ..redis_url import TlsConfig

__all__ = ["tls_context"]

_CONTEXTS: dict[TlsConfig, ssl.SSLContext] = {}
_VERIFY = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


def tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """The client context for ``tls`` (cached); ``ValueError`` naming the option whose
    file cannot be used."""
    ctx = _CONTEXTS.get(tls)
    if ctx is not None:
        return ctx
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.check_hostname = tls.check_hostname
    ctx.verify_mode = _VERIFY[tls.cert_reqs]
    if tls.ca_certs:
        try:
            ctx.load_verify_locations(cafile=tls.ca_certs)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"redis url: ssl_ca_certs: cannot use {tls.ca_certs!r}: {exc}") from None
    if tls.certfile:
        try:
            ctx.load_cert_chain(tls.certfile, tls.keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"redis url: ssl_certfile/ssl_keyfile: cannot use {tls.certfile!r}: {exc}") from None
    _CONTEXTS[tls] = ctx
    return ctx
