"""What one port's TLS is made of, as the settings say it (:class:`PortTls`), and the
certificate names clients are matched by (``DNS:x``, ``URI:x``, ``IP:x``, ``email:x``, ``CN=x``)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["Port", "PortTls", "certificate_name_problem", "normal_name", "split_names"]

Port = Literal["http", "grpc"]
_HOST = re.compile(r"[A-Za-z0-9*]([A-Za-z0-9*.-]{0,252})")


def certificate_name_problem(name: str) -> str | None:
    """Why ``name`` is not a certificate name (``DNS:x``, ``URI:x``, ``IP:x``, ``email:x``,
    ``CN=x``), or None."""
    kind, sep, rest = name.partition(":")
    if (name.startswith("CN=") and len(name) > 3) or (sep and rest and kind in {"DNS", "URI", "IP", "email"}):
        return None
    return f"{name!r} is not a certificate name: DNS:x, URI:x, IP:x, email:x or CN=x"


def normal_name(name: str) -> str:
    """``name`` as certificates are matched: an IP address in one spelling (``IP:2001:db8::1``,
    however written), a bare host name as a DNS name (envoyproxy/ratelimit's
    ``GRPC_CLIENT_TLS_SAN`` is one), anything else as it is."""
    kind, sep, rest = name.partition(":")
    if kind == "IP" and sep:
        try:
            return f"IP:{ipaddress.ip_address(rest)}"
        except ValueError:
            return name
    if not sep and not name.startswith("CN=") and _HOST.fullmatch(name):
        return f"DNS:{name}"
    return name


def split_names(text: str) -> tuple[str, ...]:
    """``"DNS:envoy.internal, CN=alice smith"`` as its names (commas between them), each
    :func:`normal_name`."""
    return tuple(normal_name(n.strip()) for n in text.split(",") if n.strip())


@dataclass(frozen=True, slots=True, kw_only=True)
class PortTls:
    """What one port's TLS reads: its files, the setting each came from (named in errors),
    the certificate names a client must have one of (empty: any from the CA)."""

    port: Port
    cert_file: Path
    key_file: Path
    cert_setting: str
    key_setting: str
    client_ca_file: Path | None = None
    client_ca_setting: str | None = None
    client_names: tuple[str, ...] = ()

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None
