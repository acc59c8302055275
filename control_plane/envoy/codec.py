"""HPACK for the gRPC transport's ``h2`` connections: the ``hpack`` package's decoder with
the header blocks Envoy repeats kept, and an encoder of constant answers that never uses
the dynamic table. Both stand in for h2's own ``decoder`` and ``encoder`` (same methods).

* :class:`KeptDecoder`: a block that leaves the dynamic table as it was (indexed fields and
  literals not indexed: what Envoy sends for every call once its table holds the constant
  ones) decodes the same while the table does not change, so it is decoded once and kept.
  A block HPACK cannot read raises :class:`HeaderBlockError` (COMPRESSION_ERROR, RFC 7541
  section 2.3 says a decoding error is a connection error of that type; a block over the
  header list bound is ENHANCE_YOUR_CALM), which h2 lets through untranslated.
* :class:`StaticEncoder`: a header list is encoded as static-table references and literals
  never indexed (RFC 7541 6.1, 6.2.2), so the peer's dynamic table is never touched and no
  size update is needed; the answers' few lists are kept encoded.
"""

from __future__ import annotations

from typing import Any

from h2.errors import ErrorCodes
from hpack import Decoder, HPACKError, OversizedHeaderListError
from hpack.table import HeaderTable

__all__ = ["CONTENT_LENGTH", "HeaderBlockError", "KeptDecoder", "StaticEncoder"]

#: what ``content-length`` is renamed to for h2 (which would end the whole connection when a
#: stream's DATA do not add up to it); the transport checks it per stream instead (RFC 9113
#: 8.1.1: a stream error). A NUL is never valid in a name, so no client can send this one: a
#: name of a client's beginning with NUL is given a second one (still refused as malformed).
CONTENT_LENGTH = b"\x00content-length"

KEPT_BLOCKS = 64  # decoded header blocks kept per connection
KEPT_BLOCK_BYTES = 1024  # the largest block kept


class HeaderBlockError(Exception):
    """A header block that cannot be decoded: the connection ends with ``code``."""

    def __init__(self, code: ErrorCodes, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class KeptDecoder:
    """h2's HPACK decoder, with repeated blocks kept (see the module docstring)."""

    def __init__(self, max_header_list_bytes: int) -> None:
        self.hpack = Decoder(max_header_list_size=max_header_list_bytes)
        self.hpack.max_allowed_table_size = 4096
        self.blocks: dict[bytes, tuple[int, list[Any]]] = {}
        self.table_version = 0

    # h2 sets these from the settings it sends (the header list bound stays ours)
    @property
    def max_header_list_size(self) -> int:
        return int(self.hpack.max_header_list_size)

    @max_header_list_size.setter
    def max_header_list_size(self, value: int) -> None:
        self.hpack.max_header_list_size = min(value, self.hpack.max_header_list_size)

    @property
    def max_allowed_table_size(self) -> int:
        return int(self.hpack.max_allowed_table_size)

    @max_allowed_table_size.setter
    def max_allowed_table_size(self, value: int) -> None:
        self.hpack.max_allowed_table_size = value

    def kept(self, data: bytes) -> list[Any] | None:
        """The block's fields when it is kept and the table has not changed since (decoding
        it again would change nothing), else None."""
        kept = self.blocks.get(data)
        return kept[1] if kept is not None and kept[0] == self.table_version else None

    def decode(self, data: bytes, raw: bool = False) -> list[Any]:
        """The block's fields as (name, value) bytes (``raw`` is always true here)."""
        data = bytes(data)
        kept = self.blocks.get(data)
        if kept is not None and kept[0] == self.table_version:
            return kept[1]
        table = self.hpack.header_table
        entries = table.dynamic_entries
        before = (len(entries), entries[0] if entries else None, table.maxsize)
        try:
            headers: list[Any] = _renamed(self.hpack.decode(data, raw=True))
        except OversizedHeaderListError as exc:
            raise HeaderBlockError(ErrorCodes.ENHANCE_YOUR_CALM, f"a header list over the bound: {exc}") from None
        except (HPACKError, IndexError, TypeError, ValueError) as exc:
            raise HeaderBlockError(ErrorCodes.COMPRESSION_ERROR, f"a header block HPACK cannot read: {exc}") from None
        entries = table.dynamic_entries
        if (
            len(entries) != before[0]
            or (entries[0] if entries else None) is not before[1]
            or table.maxsize != before[2]
        ):
            self.table_version += 1  # the table changed: what was kept no longer holds
        elif len(data) <= KEPT_BLOCK_BYTES:
            if len(self.blocks) >= KEPT_BLOCKS:
                self.blocks.clear()
            self.blocks[data] = (self.table_version, headers)
        return headers


def _renamed(headers: Any) -> list[Any]:
    """The fields with ``content-length`` renamed :data:`CONTENT_LENGTH` (see there)."""
    out = list(headers)
    for i, (name, value) in enumerate(out):
        if name == b"content-length":
            out[i] = (CONTENT_LENGTH, value)
        elif name[:1] == b"\x00":
            out[i] = (b"\x00" + name, value)
    return out


_STATIC_FIELDS = {(n, v): i + 1 for i, (n, v) in reversed(list(enumerate(HeaderTable.STATIC_TABLE)))}
_STATIC_NAMES = {n: i + 1 for i, (n, _) in reversed(list(enumerate(HeaderTable.STATIC_TABLE)))}


def _integer(n: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with ``first``'s high bits above the prefix."""
    top = (1 << prefix_bits) - 1
    if n < top:
        return bytes((first | n,))
    out, n = bytearray((first | top,)), n - top
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_static(headers: list[Any]) -> bytes:
    """``headers`` without the dynamic table: indexed when the static table holds the
    field, else a literal never indexed (with the static name's index when it has one)."""
    out = bytearray()
    for name, value in headers:
        index = _STATIC_FIELDS.get((name, value))
        if index is not None:
            out += _integer(index, 7, 0x80)
            continue
        name_index = _STATIC_NAMES.get(name)
        if name_index is not None:
            out += _integer(name_index, 4, 0x10)
        else:
            out += b"\x10" + _integer(len(name), 7, 0) + name
        out += _integer(len(value), 7, 0) + value
    return bytes(out)


class StaticEncoder:
    """h2's HPACK encoder for the answers (see the module docstring)."""

    def __init__(self) -> None:
        self.kept: dict[tuple[Any, ...], bytes] = {}

    @property
    def header_table_size(self) -> int:
        return 0

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        """The peer's table size: nothing to do, the table is never used."""

    def encode(self, headers: list[Any], huffman: bool = True) -> bytes:
        key = tuple(headers)
        block = self.kept.get(key)
        if block is None:
            block = encode_static(headers)
            if len(self.kept) >= KEPT_BLOCKS:
                self.kept.clear()
            self.kept[key] = block
        return block
