"""Certificate, key and CA files read and checked, each error naming its setting and file.

:func:`server_context` builds the ``ssl.SSLContext`` one port serves with: TLS 1.2 and 1.3,
TLS 1.2 limited to the ciphers of Mozilla's intermediate profile (TLS 1.3's suites are all
AEAD), no renegotiation, no compression, ALPN as the port speaks, and, with a client CA, a
client certificate required in the handshake. Before OpenSSL sees the files they are
checked here, so a bad one is said plainly: a missing or unreadable file, a key that is not
the certificate's, a certificate already expired, a client CA that is not a CA.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .der import decode_certificate, pem_certificates
from .spec import normal_name

__all__ = [
    "INTERMEDIATE_CIPHERS",
    "CertificateInfo",
    "TlsFileError",
    "certificate_names",
    "read_certificates",
    "server_context",
]

#: Mozilla's intermediate profile (server side, TLS 1.2): ECDHE with AES-GCM or ChaCha20-Poly1305
#: (its DHE suites need DH parameters this server does not load, so they are left out)
INTERMEDIATE_CIPHERS = ":".join(
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
    )
)

_SAN_KINDS = {"DNS": "DNS", "IP Address": "IP", "URI": "URI", "email": "email"}


class TlsFileError(ValueError):
    """A TLS file that cannot be used; the message names the setting and the file."""

    def __init__(self, setting: str, path: Path, problem: str) -> None:
        super().__init__(f"{setting}: {path}: {problem}")
        self.setting, self.path, self.problem = setting, path, problem


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificateInfo:
    """What a certificate says that matters here."""

    subject: str  # its common names (CN=x), or its first other name
    names: tuple[str, ...]  # CN=x and its subject alternative names (DNS:x, IP:x, URI:x, email:x)
    not_before: float  # Unix seconds
    not_after: float
    is_ca: bool


def _read(setting: str, path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TlsFileError(setting, path, "no such file") from None
    except OSError as exc:
        raise TlsFileError(setting, path, f"cannot read it: {exc.strerror or exc}") from None
    if not data.strip():
        raise TlsFileError(setting, path, "is empty")
    return data


def read_certificates(setting: str, path: Path) -> list[CertificateInfo]:
    """Every PEM certificate in ``path`` (at least one)."""
    data = _read(setting, path)
    try:
        decoded = [decode_certificate(der) for der in pem_certificates(data)]
    except (ValueError, UnicodeDecodeError) as exc:
        raise TlsFileError(setting, path, f"a certificate in it cannot be read ({exc})") from None
    if not decoded:
        raise TlsFileError(setting, path, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    return [
        CertificateInfo(
            subject=", ".join(f"CN={cn}" for cn in d.common_names) or (d.alt_names[0] if d.alt_names else "?"),
            names=tuple(f"CN={cn}" for cn in d.common_names) + d.alt_names,
            not_before=d.not_before,
            not_after=d.not_after,
            is_ca=d.is_ca,
        )
        for d in decoded
    ]


class _Encrypted(Exception):
    """OpenSSL asked for the key's password."""


def _no_password() -> str:
    raise _Encrypted  # never a prompt on the terminal (OpenSSL's default) in a server


def _load_pair(ctx: ssl.SSLContext, cert: tuple[str, Path], key: tuple[str, Path]) -> None:
    """The certificate chain and its key into ``ctx``; each way it fails said plainly."""
    _read(*key)
    try:
        ctx.load_cert_chain(str(cert[1]), str(key[1]), password=_no_password)
    except _Encrypted:
        raise TlsFileError(key[0], key[1], "is encrypted; give the key unencrypted (a mounted Secret)") from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise TlsFileError(key[0], key[1], f"is not the key of the certificate in {cert[0]} ({cert[1]})") from None
        if "PEM" in str(exc) or "NO_START_LINE" in str(exc):
            raise TlsFileError(key[0], key[1], "holds no PEM private key (-----BEGIN PRIVATE KEY-----)") from None
        raise TlsFileError(key[0], key[1], f"OpenSSL refused it with {cert[0]}: {exc}") from None
    except OSError as exc:
        raise TlsFileError(key[0], key[1], f"cannot read it: {exc.strerror or exc}") from None


def certificate_names(peer: dict[str, Any]) -> tuple[str, ...]:
    """A verified peer certificate's names, from ``SSLObject.getpeercert()``: ``CN=x`` and
    its subject alternative names as ``DNS:x``, ``IP:x``, ``URI:x``, ``email:x``."""
    names = [f"CN={value}" for rdn in peer.get("subject", ()) for key, value in rdn if key == "commonName"]
    for kind, value in peer.get("subjectAltName", ()):
        prefix = _SAN_KINDS.get(kind)
        if prefix is not None:
            names.append(normal_name(f"{prefix}:{value}"))  # OpenSSL writes IPv6 long: 2001:DB8:0:...
    return tuple(names)


def server_context(
    *,
    cert: tuple[str, Path],
    key: tuple[str, Path],
    client_ca: tuple[str, Path] | None,
    alpn: tuple[str, ...],
    now: float | None = None,
) -> tuple[ssl.SSLContext, CertificateInfo]:
    """A server context from ``(setting, path)`` pairs, and the leaf certificate it serves;
    :class:`TlsFileError` naming the setting and file of the first problem found."""
    now = time.time() if now is None else now
    leaf = read_certificates(*cert)[0]
    if leaf.not_after <= now:
        expired = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(leaf.not_after))
        raise TlsFileError(cert[0], cert[1], f"the certificate ({leaf.subject}) expired at {expired}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(INTERMEDIATE_CIPHERS)
    ctx.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_NO_COMPRESSION
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    _load_pair(ctx, cert, key)
    if client_ca is not None:
        cas = read_certificates(*client_ca)
        not_ca = [c.subject for c in cas if not c.is_ca]
        if not_ca:
            raise TlsFileError(
                client_ca[0], client_ca[1], f"{not_ca[0]} is not a CA certificate (basicConstraints CA:TRUE)"
            )
        if all(c.not_after <= now for c in cas):
            raise TlsFileError(client_ca[0], client_ca[1], "every CA certificate in it has expired")
        try:
            ctx.load_verify_locations(cafile=str(client_ca[1]))
        except (ssl.SSLError, OSError) as exc:
            raise TlsFileError(client_ca[0], client_ca[1], f"OpenSSL refused it: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
        # an intermediate alone in the file is a trust anchor too (a Vault or cert-manager issuer's ca.crt)
        ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        # no session tickets: a resumed TLS 1.3 session skips the client certificate's check, so a
        # CA rotated out, or a client certificate expired, would still be let in for a ticket's life
        ctx.options |= ssl.OP_NO_TICKET
        ctx.num_tickets = 0
    return ctx, leaf
