"""Allow and deny lists: IP addresses and CIDR blocks matched against the client, keys matched exactly.

>>> deny = ListMatcher(["203.0.113.0/24", "bad-tenant"])
>>> deny.matches("bad-tenant"), deny.matches("good", client_ip="203.0.113.9"), deny.matches("good", "10.0.0.1")
(True, True, False)
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Iterator

from limiter.keys import validate_key

__all__ = ["IPNetwork", "ListMatcher", "parse_list_entry"]

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
"""An IP entry of a list (host bits masked)."""
_LOOKS_LIKE_V4 = re.compile(r"[0-9.]+(/[0-9]*)?")
_LOOKS_LIKE_V6 = re.compile(r"\[?[0-9A-Fa-f:.]*::?[0-9A-Fa-f:.]*\]?(/[0-9]*)?")


def parse_list_entry(entry: object) -> IPNetwork | str:
    """An IP address or CIDR block (host bits masked), else an exact key."""
    if not isinstance(entry, str):
        raise ValueError(f"must be a string (an IP address, a CIDR block or a key), got {type(entry).__name__}")
    text = entry.strip()
    if text != entry or not text:
        raise ValueError("must not be empty or start or end with whitespace")
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        pass
    if _LOOKS_LIKE_V4.fullmatch(text) or (text.count(":") >= 2 and _LOOKS_LIKE_V6.fullmatch(text)):
        raise ValueError(f"{text!r} looks like an IP address or CIDR block but is not a valid one")
    validate_key(text, field="entry")
    return text


def _client_address(client_ip: object) -> _IPAddress | None:
    if isinstance(client_ip, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        ip: _IPAddress = client_ip
    elif isinstance(client_ip, str) and 0 < len(client_ip) <= 64:
        text = client_ip.strip()
        if text.startswith("[") and "]" in text:
            text = text[1 : text.index("]")]
        elif text.count(":") == 1:  # IPv4 with a port
            text = text.partition(":")[0]
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            return None
    else:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.scope_id is not None:
            return ipaddress.IPv6Address(ip.packed)
    return ip


class ListMatcher:
    """An allow or deny list: IP/CIDR entries match the client IP, others the key exactly.

    ``ListMatcher(["10.0.0.0/8", "127.0.0.1", "internal-job"])``. With ``composite=True``
    (routes whose key strategy is ``composite``, keys ``"<tenant>:<segment>"``) a key
    entry also matches the key's tenant part, i.e. everything before the last ``:``.
    Pass the resolved client address as ``client_ip`` if the service sits behind proxies
    (an IP entry is never compared with the key, so a header value cannot pose as an
    address). Invalid entries raise :class:`ValueError`. Immutable.
    """

    __slots__ = ("_entries", "_keys", "_networks", "_composite")

    def __init__(self, entries: Iterable[str] = (), *, composite: bool = False) -> None:
        if isinstance(entries, str):
            raise ValueError("entries: expected a list of strings, got a single string")
        ordered: list[str] = []
        keys: set[str] = set()
        networks: list[IPNetwork] = []
        for entry in entries:
            parsed = parse_list_entry(entry)
            if isinstance(parsed, str):
                if parsed in keys:
                    continue
                keys.add(parsed)
                ordered.append(parsed)
            else:
                if parsed in networks:
                    continue
                networks.append(parsed)
                ordered.append(str(parsed))
        self._entries: tuple[str, ...] = tuple(ordered)
        self._keys = frozenset(keys)
        self._networks: tuple[IPNetwork, ...] = tuple(networks)
        self._composite = composite

    @property
    def entries(self) -> tuple[str, ...]:
        """The distinct entries in order (CIDR blocks normalised, e.g. ``10.0.0.0/8``)."""
        return self._entries

    @property
    def networks(self) -> tuple[IPNetwork, ...]:
        return self._networks

    @property
    def keys(self) -> frozenset[str]:
        return self._keys

    def matches(self, key: str | None, client_ip: str | None = None) -> bool:
        if key is not None and self._keys:
            if key in self._keys:
                return True
            if self._composite and ":" in key and key.rpartition(":")[0] in self._keys:
                return True
        if client_ip is not None and self._networks:
            addr = _client_address(client_ip)
            if addr is not None:
                return any(addr.version == net.version and addr in net for net in self._networks)
        return False

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ListMatcher):
            return NotImplemented
        return (
            self._keys == other._keys
            and set(self._networks) == set(other._networks)
            and self._composite == other._composite
        )

    def __hash__(self) -> int:
        return hash((self._keys, frozenset(self._networks), self._composite))

    def __repr__(self) -> str:
        return f"ListMatcher({list(self._entries)!r})"
