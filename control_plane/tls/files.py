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

    subject: str  # RFC 4514
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
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    data = _read(setting, path)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TlsFileError(setting, path, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)") from None
    out = []
    for cert in certs:
        names = [f"CN={a.value!s}" for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            san = None
        if san is not None:
            names += [f"DNS:{n}" for n in san.get_values_for_type(x509.DNSName)]
            names += [f"IP:{n}" for n in san.get_values_for_type(x509.IPAddress)]
            names += [f"URI:{n}" for n in san.get_values_for_type(x509.UniformResourceIdentifier)]
            names += [f"email:{n}" for n in san.get_values_for_type(x509.RFC822Name)]
        try:
            is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        out.append(
            CertificateInfo(
                subject=cert.subject.rfc4514_string(),
                names=tuple(names),
                not_before=cert.not_valid_before_utc.timestamp(),
                not_after=cert.not_valid_after_utc.timestamp(),
                is_ca=is_ca,
            )
        )
    return out


def _check_key(cert_setting: str, cert_path: Path, key_setting: str, key_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    data = _read(key_setting, key_path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise TlsFileError(key_setting, key_path, "is encrypted; give the key unencrypted (a mounted Secret)") from None
    except (ValueError, Exception):  # cryptography's UnsupportedAlgorithm is no ValueError
        raise TlsFileError(key_setting, key_path, "holds no PEM private key (-----BEGIN PRIVATE KEY-----)") from None
    cert = x509.load_pem_x509_certificates(_read(cert_setting, cert_path))[0]
    raw = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(*raw) != key.public_key().public_bytes(*raw):
        raise TlsFileError(key_setting, key_path, f"is not the key of the certificate in {cert_setting} ({cert_path})")


def certificate_names(peer: dict[str, Any]) -> tuple[str, ...]:
    """A verified peer certificate's names, from ``SSLObject.getpeercert()``: ``CN=x`` and
    its subject alternative names as ``DNS:x``, ``IP:x``, ``URI:x``, ``email:x``."""
    names = [f"CN={value}" for rdn in peer.get("subject", ()) for key, value in rdn if key == "commonName"]
    for kind, value in peer.get("subjectAltName", ()):
        prefix = _SAN_KINDS.get(kind)
        if prefix is not None:
            names.append(f"{prefix}:{value}")
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
    _check_key(cert[0], cert[1], key[0], key[1])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(INTERMEDIATE_CIPHERS)
    ctx.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_NO_COMPRESSION
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    try:
        ctx.load_cert_chain(str(cert[1]), str(key[1]))
    except (ssl.SSLError, OSError) as exc:
        raise TlsFileError(key[0], key[1], f"OpenSSL refused it with {cert[0]}: {exc}") from None
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
    return ctx, leaf
