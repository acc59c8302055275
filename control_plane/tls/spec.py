"""What one port's TLS is made of, as the settings say it (:class:`PortTls`), and the
certificate names clients are matched by (``DNS:x``, ``URI:x``, ``IP:x``, ``email:x``, ``CN=x``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["Port", "PortTls", "certificate_name_problem", "split_names"]

Port = Literal["http", "grpc"]


def certificate_name_problem(name: str) -> str | None:
    """Why ``name`` is not a certificate name (``DNS:x``, ``URI:x``, ``IP:x``, ``email:x``,
    ``CN=x``), or None."""
    kind, sep, rest = name.partition(":")
    if (name.startswith("CN=") and len(name) > 3) or (sep and rest and kind in {"DNS", "URI", "IP", "email"}):
        return None
    return f"{name!r} is not a certificate name: DNS:x, URI:x, IP:x, email:x or CN=x"


def split_names(text: str) -> tuple[str, ...]:
    """``"DNS:envoy.internal, CN=alice smith"`` as its names (commas between them)."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


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
