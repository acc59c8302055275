"""Client addresses and the proxies whose forwarding headers are believed. Pure, no IO.

:func:`parse_ip` reads one address as found in a peer field or a forwarding header
(port and brackets stripped, IPv4-mapped IPv6 as IPv4); :class:`TrustedProxies` is
the set of networks :class:`~limiter.keys.KeyExtractor` trusts with
``X-Forwarded-For`` / ``X-Real-IP``.

>>> TrustedProxies("10.0.0.0/8, ::1").contains("10.1.2.3:8080")
True
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator

__all__ = ["IPAddress", "IPNetwork", "TrustedProxies", "parse_ip"]

_MAX_IP_TOKEN_CHARS = 128  # anything longer is not an address; skip the parser

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_ip(token: object) -> IPAddress | None:
    """Parse one address as found in a header or peer field; None if unusable.

    Accepts ``1.2.3.4``, ``1.2.3.4:8080``, ``2001:db8::1``, ``[2001:db8::1]`` and
    ``[2001:db8::1]:8080``. IPv6 zone ids are dropped and IPv4-mapped IPv6
    addresses (``::ffff:1.2.3.4``, what dual-stack sockets report) become plain
    IPv4, so one client always gets one key.
    """
    if isinstance(token, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        ip: IPAddress = token
    else:
        if not isinstance(token, str):
            return None
        text = token.strip()
        if not text or len(text) > _MAX_IP_TOKEN_CHARS:
            return None
        v4_with_port = False
        if text.startswith("["):
            end = text.find("]")
            if end == -1:
                return None
            rest = text[end + 1 :]
            if rest and not (rest[0] == ":" and rest[1:].isascii() and rest[1:].isdigit()):
                return None
            text = text[1:end]
        elif text.count(":") == 1:
            text, _, port = text.partition(":")
            if not (port.isascii() and port.isdigit()):
                return None
            v4_with_port = True
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            return None
        if v4_with_port and ip.version != 4:
            return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.scope_id is not None:
            return ipaddress.IPv6Address(ip.packed)
    return ip


class TrustedProxies:
    """The set of proxy addresses whose forwarding headers are believed.

    Built from IPs and CIDR blocks, IPv4 or IPv6::

        TrustedProxies(["10.0.0.0/8", "127.0.0.1", "::1"])
        TrustedProxies.parse("10.0.0.0/8, 192.168.0.0/16")

    An invalid entry raises :class:`ValueError` naming it. Host bits in a CIDR
    are masked off (``10.0.0.1/8`` means ``10.0.0.0/8``). A plain string given
    to the constructor is read as a comma-separated list. Empty (the default)
    trusts nobody: forwarding headers are then always ignored. Immutable and
    hashable.
    """

    __slots__ = ("_networks",)

    def __init__(
        self,
        entries: Iterable[str | IPAddress | IPNetwork] | str = (),
    ) -> None:
        if isinstance(entries, str):
            entries = _split_csv(entries)
        networks: list[IPNetwork] = []
        for entry in entries:
            net = _parse_network(entry)
            if net not in networks:
                networks.append(net)
        self._networks: tuple[IPNetwork, ...] = tuple(networks)

    @classmethod
    def parse(cls, value: str) -> TrustedProxies:
        """From a comma-separated string (empty items are skipped; ``""`` = nobody)."""
        if not isinstance(value, str):
            raise ValueError(f"trusted proxies: expected a comma-separated string, got {value!r}")
        return cls(_split_csv(value))

    @property
    def networks(self) -> tuple[IPNetwork, ...]:
        return self._networks

    def contains(self, ip: str | IPAddress | None) -> bool:
        """True if ``ip`` lies in one of the networks; False for invalid input."""
        if not self._networks:
            return False
        addr = parse_ip(ip)
        return addr is not None and self.contains_address(addr)

    def contains_address(self, addr: IPAddress) -> bool:
        """:meth:`contains` for an address already normalised by :func:`parse_ip`."""
        return any(addr.version == net.version and addr in net for net in self._networks)

    def __contains__(self, ip: object) -> bool:
        return self.contains(ip)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[IPNetwork]:
        return iter(self._networks)

    def __len__(self) -> int:
        return len(self._networks)

    def __bool__(self) -> bool:
        return bool(self._networks)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TrustedProxies):
            return NotImplemented
        return set(self._networks) == set(other._networks)

    def __hash__(self) -> int:
        return hash(frozenset(self._networks))

    def __repr__(self) -> str:
        return f"TrustedProxies({[str(n) for n in self._networks]!r})"


def _split_csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _parse_network(entry: object) -> IPNetwork:
    if isinstance(entry, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
        return entry
    if isinstance(entry, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return ipaddress.ip_network(entry)
    if isinstance(entry, str):
        text = entry.strip()
        if text:
            try:
                return ipaddress.ip_network(text, strict=False)
            except ValueError:
                pass
    raise ValueError(f"trusted proxies: invalid entry {entry!r}: not an IP address or CIDR block")
