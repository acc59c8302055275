"""The few fields of an X.509 certificate that the TLS checks read, from its DER bytes: the
subject's common name, the validity, whether it is a CA, its subject alternative names.

Python's ``ssl`` decodes a certificate only once a handshake has verified it; a whole X.509
library would be most of the image's size budget for five fields. This reader walks the
DER structure (RFC 5280 section 4.1) and nothing else: the operator's own files, which OpenSSL
then loads and checks again. Anything it cannot follow is a ``ValueError``.
"""

from __future__ import annotations

import calendar
import ipaddress
import re
import ssl
from dataclasses import dataclass

__all__ = ["DecodedCertificate", "decode_certificate", "pem_certificates"]

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s+(.*?)-----END CERTIFICATE-----", re.S)
_SEQUENCE, _BOOLEAN, _OCTETS, _OID, _UTCTIME, _GENTIME = 0x30, 0x01, 0x04, 0x06, 0x17, 0x18
_CN = bytes([0x55, 0x04, 0x03])  # 2.5.4.3
_SAN = bytes([0x55, 0x1D, 0x11])  # 2.5.29.17
_BASIC_CONSTRAINTS = bytes([0x55, 0x1D, 0x13])  # 2.5.29.19
#: GeneralName's context tags (RFC 5280 4.2.1.6) and the prefixes the names are given here
_NAME_KINDS = {0x81: "email", 0x82: "DNS", 0x86: "URI", 0x87: "IP"}


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodedCertificate:
    common_names: tuple[str, ...]
    alt_names: tuple[str, ...]  # DNS:x, IP:x, URI:x, email:x
    not_before: float  # Unix seconds
    not_after: float
    is_ca: bool


def pem_certificates(data: bytes) -> list[bytes]:
    """The DER bytes of every PEM certificate in ``data``."""
    out = []
    for block in _PEM.finditer(data):
        pem = b"-----BEGIN CERTIFICATE-----\n" + block.group(1) + b"-----END CERTIFICATE-----\n"
        out.append(ssl.PEM_cert_to_DER_cert(pem.decode("ascii")))
    return out


def _tlv(data: bytes, pos: int, end: int | None = None) -> tuple[int, int, int]:
    """(tag, start of the value, end of the value) of the element at ``pos``, inside
    ``data[:end]`` (the element that holds it)."""
    limit = len(data) if end is None else end
    if pos + 2 > limit:
        raise ValueError("truncated DER")
    tag, length = data[pos], data[pos + 1]
    pos += 2
    if length & 0x80:
        n = length & 0x7F
        if n == 0 or n > 4 or pos + n > len(data):
            raise ValueError("bad DER length")
        length = int.from_bytes(data[pos : pos + n], "big")
        pos += n
    if pos + length > limit:
        raise ValueError("truncated DER")
    return tag, pos, pos + length


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    out = []
    while start < end:
        tag, vs, ve = _tlv(data, start, end)
        out.append((tag, vs, ve))
        start = ve
    return out


def _time(data: bytes, tag: int, start: int, end: int) -> float:
    text = data[start:end].decode("ascii")
    if tag == _UTCTIME and len(text) == 13 and text.endswith("Z"):
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif tag != _GENTIME or len(text) != 15 or not text.endswith("Z"):
        raise ValueError(f"unsupported time {text!r}")
    if not text[:14].isdigit():
        raise ValueError(f"unsupported time {text!r}")
    parts = [int(text[:4])] + [int(text[i : i + 2]) for i in range(4, 14, 2)]  # year, month, day, h, m, s
    return float(calendar.timegm((*parts, 0, 0, 0)))


def _common_names(data: bytes, start: int, end: int) -> list[str]:
    names = []
    for _, rs, re_ in _children(data, start, end):  # RelativeDistinguishedName: a SET
        for _, as_, ae in _children(data, rs, re_):  # AttributeTypeAndValue
            kids = _children(data, as_, ae)
            if len(kids) == 2 and kids[0][0] == _OID and data[kids[0][1] : kids[0][2]] == _CN:
                names.append(data[kids[1][1] : kids[1][2]].decode("utf-8", "replace"))
    return names


def _alt_names(data: bytes, start: int, end: int) -> list[str]:
    names = []
    for tag, vs, ve in _children(data, start, end):
        kind = _NAME_KINDS.get(tag)
        if kind == "IP":
            names.append(f"IP:{ipaddress.ip_address(data[vs:ve])}")
        elif kind is not None:
            names.append(f"{kind}:{data[vs:ve].decode('ascii', 'replace')}")
    return names


def decode_certificate(der: bytes) -> DecodedCertificate:
    """The fields of one DER certificate (``ValueError`` when it is not one)."""
    tag, cs, ce = _tlv(der, 0)
    if tag != _SEQUENCE:
        raise ValueError("not a certificate")
    tag, ts, te = _tlv(der, cs, ce)
    if tag != _SEQUENCE:
        raise ValueError("not a certificate")
    fields = _children(der, ts, te)
    if fields and fields[0][0] == 0xA0:  # [0] version
        fields = fields[1:]
    if len(fields) < 6:
        raise ValueError("a certificate with too few fields")
    _, vs, ve = fields[3]  # after serial, signature algorithm, issuer
    times = _children(der, vs, ve)
    if len(times) != 2:
        raise ValueError("a certificate without its validity")
    alt: list[str] = []
    is_ca = False
    for tag, es, ee in fields[6:]:
        if tag != 0xA3:  # [3] extensions
            continue
        _, ls, le = _tlv(der, es, ee)
        for _, xs, xe in _children(der, ls, le):
            ext = _children(der, xs, xe)
            if len(ext) < 2 or ext[-1][0] != _OCTETS:
                raise ValueError("an extension without its value")
            oid, value = der[ext[0][1] : ext[0][2]], ext[-1]
            _, inner, inner_end = _tlv(der, value[1], value[2])
            if oid == _SAN:
                alt = _alt_names(der, inner, inner_end)
            elif oid == _BASIC_CONSTRAINTS:
                kids = _children(der, inner, inner_end)
                is_ca = bool(kids) and kids[0][0] == _BOOLEAN and der[kids[0][1] : kids[0][2]] not in (b"", b"\x00")
    return DecodedCertificate(
        common_names=tuple(_common_names(der, fields[4][1], fields[4][2])),
        alt_names=tuple(alt),
        not_before=_time(der, *times[0]),
        not_after=_time(der, *times[1]),
        is_ca=is_ca,
    )
