"""h2spec's ``generic/`` cases (what any HTTP/2 server takes: each frame used as meant, each
HPACK representation) and its ``hpack/`` cases (RFC 7541's decoding errors: a connection
error COMPRESSION_ERROR, RFC 9113 4.3). See tests/h2spec.py."""

from __future__ import annotations

from h2_raw import DATA, INITIAL_WINDOW_SIZE, PREFACE, SETTINGS, ErrorCodes, raw_frame, rls_message, settings_payload
from h2_verdicts import (
    Failed,
    connection_error,
    event_type,
    headers_frame,
    ping_ack,
    ping_ack_or_close,
    settings_ack,
    stream_close,
)  # fmt: skip
from h2spec import Ctx, case

E = ErrorCodes
H2SPEC = b"h2spec\x00\x00"


@case("generic/1/1")
def _(c: Ctx) -> None:
    """RFC 9113 3.4: the client's preface is answered with a SETTINGS frame (no ACK) first."""
    c.conn.send(PREFACE + raw_frame(SETTINGS, 0, 0, settings_payload((INITIAL_WINDOW_SIZE, 65_535))))
    ev = c.conn.wait_event()
    if not (ev.is_(SETTINGS) and "ACK" not in ev.frame.flags):
        raise Failed(c.conn, ["SETTINGS Frame (flags:0x00)"], ev)


@case("generic/2/1")
def _(c: Ctx) -> None:
    """RFC 9113 5.1: a PRIORITY frame on an idle stream is taken (a PING after it is answered)."""
    c.conn.handshake()
    c.conn.priority(1)
    c.conn.ping(b"\x00" * 8)
    ping_ack(c.conn, b"\x00" * 8)


@case("generic/2/2")
def _(c: Ctx) -> None:
    """RFC 9113 5.1: WINDOW_UPDATE on a half-closed (remote) stream is taken (the answer's DATA comes)."""
    c.conn.handshake()
    c.conn.settings_frame((INITIAL_WINDOW_SIZE, 0))
    c.call(1)
    c.conn.window(1, 1)
    event_type(c.conn, DATA)


@case("generic/2/3")
def _(c: Ctx) -> None:
    """RFC 9113 5.1: PRIORITY on a half-closed (remote) stream is taken (the answer's DATA comes)."""
    c.conn.handshake()
    c.conn.settings_frame((INITIAL_WINDOW_SIZE, 0))
    c.call(1)
    c.conn.priority(1)
    c.conn.window(1, 1)
    event_type(c.conn, DATA)


@case("generic/2/4")
def _(c: Ctx) -> None:
    """RFC 9113 5.1: RST_STREAM on a half-closed (remote) stream is taken (PING answered, or closed)."""
    c.conn.handshake()
    c.call(1)
    c.conn.rst(1, E.CANCEL)
    c.conn.ping(b"\x00" * 8)
    ping_ack_or_close(c.conn, b"\x00" * 8)


@case("generic/2/5")
def _(c: Ctx) -> None:
    """RFC 9113 5.1: PRIORITY on a closed stream is taken (a PING after it is answered)."""
    c.conn.handshake()
    c.call(1)
    stream_close(c.conn)
    c.conn.priority(1)
    c.conn.ping(b"\x00" * 8)
    ping_ack(c.conn, b"\x00" * 8)


@case("generic/3.1/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.1: a DATA frame (the call's message) is taken: the call is answered."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.data(1, rls_message(), end_stream=True)
    headers_frame(c.conn, 1)


@case("generic/3.1/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.1: the message in two DATA frames is taken: the call is answered."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    message = rls_message()
    c.conn.data(1, message[:4])
    c.conn.data(1, message[4:], end_stream=True)
    headers_frame(c.conn, 1)


@case("generic/3.1/3")
def _(c: Ctx) -> None:
    """RFC 9113 6.1: a padded DATA frame is taken: the call is answered."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.data(1, rls_message(), end_stream=True, pad=5)
    headers_frame(c.conn, 1)


@case("generic/3.2/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.2: a HEADERS frame: the call is answered."""
    c.conn.handshake()
    c.call(1)
    headers_frame(c.conn, 1)


@case("generic/3.2/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.2: a padded HEADERS frame: the call is answered."""
    c.conn.handshake()
    c.call(1, pad=8)
    headers_frame(c.conn, 1)


@case("generic/3.2/3")
def _(c: Ctx) -> None:
    """RFC 9113 6.2: a HEADERS frame with priority: the call is answered."""
    c.conn.handshake()
    c.call(1, priority=(0, 255, False))
    headers_frame(c.conn, 1)


def _priority_then_call(c: Ctx, sid: int, depends_on: int, weight: int, exclusive: bool) -> None:
    c.conn.handshake()
    c.conn.priority(sid, depends_on=depends_on, weight=weight, exclusive=exclusive)
    c.call(1)
    headers_frame(c.conn, 1)


@case("generic/3.3/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.3: PRIORITY (weight 1) before the call: the call is answered."""
    _priority_then_call(c, 1, 0, 0, False)


@case("generic/3.3/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.3: PRIORITY (weight 256) before the call: the call is answered."""
    _priority_then_call(c, 1, 0, 255, False)


@case("generic/3.3/3")
def _(c: Ctx) -> None:
    """RFC 9113 6.3: PRIORITY of stream 3 depending on stream 1, then the call on 1: answered."""
    _priority_then_call(c, 3, 1, 0, False)


@case("generic/3.3/4")
def _(c: Ctx) -> None:
    """RFC 9113 6.3: an exclusive PRIORITY before the call: the call is answered."""
    _priority_then_call(c, 1, 0, 0, True)


@case("generic/3.3/5")
def _(c: Ctx) -> None:
    """RFC 9113 6.3: PRIORITY of idle stream 3, then a call on the lower stream 1: answered."""
    _priority_then_call(c, 3, 0, 255, False)


@case("generic/3.4/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.4: a RST_STREAM is taken (PING answered, or closed)."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.rst(1, E.CANCEL)
    c.conn.ping(b"\x00" * 8)
    ping_ack_or_close(c.conn, b"\x00" * 8)


@case("generic/3.5/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.5: a SETTINGS frame with every defined setting is acknowledged."""
    c.conn.handshake()
    c.conn.settings_frame((1, 4096), (2, 1), (3, 100), (4, 65_535), (5, 16_384), (6, 100))
    settings_ack(c.conn)


@case("generic/3.7/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.7: a PING is answered with the same payload."""
    c.conn.handshake()
    c.conn.ping(H2SPEC)
    ping_ack(c.conn, H2SPEC)


@case("generic/3.8/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.8: a GOAWAY is taken (PING answered, or closed)."""
    c.conn.handshake()
    c.conn.send_goaway(0, E.NO_ERROR, b"h2spec")
    c.conn.ping(H2SPEC)
    ping_ack_or_close(c.conn, H2SPEC)


@case("generic/3.9/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.9: WINDOW_UPDATE on the connection is taken (a PING after it is answered)."""
    c.conn.handshake()
    c.conn.window(0, 1)
    c.conn.ping(b"\x00" * 8)
    ping_ack(c.conn, b"\x00" * 8)


@case("generic/3.9/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.9: WINDOW_UPDATE on a stream is taken (the call is answered)."""
    c.conn.handshake()
    c.call(1)
    c.conn.window(1, 1)
    headers_frame(c.conn, 1)


@case("generic/3.10/1")
def _(c: Ctx) -> None:
    """RFC 9113 6.10: a header block split over HEADERS and CONTINUATION: the call is answered."""
    c.conn.handshake()
    block = c.conn.encode(c.headers)
    c.conn.headers(1, block[:5], end_headers=False)
    c.conn.continuation(1, block[5:], end_headers=True)
    c.finish(1)
    headers_frame(c.conn, 1)


@case("generic/3.10/2")
def _(c: Ctx) -> None:
    """RFC 9113 6.10: a header block split over HEADERS and two CONTINUATION frames: the call is answered."""
    c.conn.handshake()
    block = c.conn.encode(c.headers)
    c.conn.headers(1, block[:5], end_headers=False)
    c.conn.continuation(1, block[5:10], end_headers=False)
    c.conn.continuation(1, block[10:], end_headers=True)
    c.finish(1)
    headers_frame(c.conn, 1)


@case("generic/4/1")
def _(c: Ctx) -> None:
    """RFC 9113 8.1: a GET (to a gRPC method) is answered with HEADERS (an HTTP status)."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode([(":method", "GET"), *c.headers[1:]]), end_stream=True)
    headers_frame(c.conn, 1)


@case("generic/4/2")
def _(c: Ctx) -> None:
    """RFC 9113 8.1: a HEAD (to a gRPC method) is answered with HEADERS (an HTTP status)."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode([(":method", "HEAD"), *c.headers[1:]]), end_stream=True)
    headers_frame(c.conn, 1)


@case("generic/4/3")
def _(c: Ctx) -> None:
    """RFC 9113 8.1: a POST (the gRPC call) is answered with HEADERS."""
    c.conn.handshake()
    c.call(1)
    headers_frame(c.conn, 1)


@case("generic/4/4")
def _(c: Ctx) -> None:
    """RFC 9113 8.1: a POST with trailers is answered with HEADERS."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode([*c.headers, ("trailer", "x-test")]))
    c.conn.data(1, rls_message())
    c.conn.headers(1, c.conn.encode([("x-test", "ok")]), end_stream=True)
    headers_frame(c.conn, 1)


# -- HPACK representations a server must take (generic/5) --------------------------------------

REPRESENTATIONS = {
    "1": b"\xba",  # indexed: user-agent (static 58), empty value
    "2": b"\x40\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4",
    "3": b"\x40\x0a\x75\x73\x65\x72\x2d\x61\x67\x65\x6e\x74\x06\x68\x32\x73\x70\x65\x63",
    "4": b"\x40\x06\x78\x2d\x74\x65\x73\x74\x06\x68\x32\x73\x70\x65\x63",
    "5": b"\x40\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
    "6": b"\x00\x0a\x75\x73\x65\x72\x2d\x61\x67\x65\x6e\x74\x06\x68\x32\x73\x70\x65\x63",
    "7": b"\x00\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4",
    "8": b"\x00\x06\x78\x2d\x74\x65\x73\x74\x06\x68\x32\x73\x70\x65\x63",
    "9": b"\x00\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
    "10": b"\x10\x0a\x75\x73\x65\x72\x2d\x61\x67\x65\x6e\x74\x06\x68\x32\x73\x70\x65\x63",
    "11": b"\x10\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4",
    "12": b"\x10\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
    "13": b"\x10\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
}
KINDS = {"1": "indexed", "2": "literal with incremental indexing", "6": "literal without indexing",
         "10": "literal never indexed"}  # fmt: skip


def _appended(number: str, rep: bytes) -> None:
    def run(c: Ctx) -> None:
        c.conn.handshake()
        c.call(1, block=c.conn.encode(c.headers) + rep)
        headers_frame(c.conn, 1)

    kind = KINDS[max((k for k in KINDS if int(k) <= int(number)), key=int)]
    run.__doc__ = f"RFC 7541 6 (RFC 9113 4.3): a {kind} field ({rep.hex()}) is decoded: the call is answered."
    case(f"generic/5/{number}")(run)


for _number, _rep in REPRESENTATIONS.items():
    _appended(_number, _rep)


@case("generic/5/14")
def _(c: Ctx) -> None:
    """RFC 7541 6.3: a dynamic table size update (128) at the start of a block is taken: the call is answered."""
    c.conn.handshake()
    c.conn.encoder.header_table_size = 128
    c.call(1)
    headers_frame(c.conn, 1)


@case("generic/5/15")
def _(c: Ctx) -> None:
    """RFC 7541 4.2: two dynamic table size updates (128, 4096) at the start of a block are taken."""
    c.conn.handshake()
    c.call(1, block=b"\x3f\x61\x3f\xe1\x1f" + c.conn.encode(c.headers))
    headers_frame(c.conn, 1)


# -- HPACK decoding errors (hpack/) ------------------------------------------------------------

DECODING_ERRORS = {
    "hpack/2.3.3/1": ("RFC 7541 2.3.3", "an indexed field of an index past both tables", b"\xc6"),
    "hpack/2.3.3/2": ("RFC 7541 2.3.3", "a literal whose name index is past both tables", b"\x7f\x07\x00"),
    "hpack/4.2/1": ("RFC 7541 4.2", "a dynamic table size update at the end of a block", b"\x21"),
    "hpack/5.2/1": ("RFC 7541 5.2", "a Huffman string padded with more than 7 bits",
                    b"\x00\x85\xf2\xb2\x4a\x84\xff\x84\x49\x50\x9f\xff"),
    "hpack/5.2/2": ("RFC 7541 5.2", "a Huffman string padded with zeros",
                    b"\x00\x85\xf2\xb2\x4a\x84\xff\x83\x49\x50\x90"),
    "hpack/5.2/3": ("RFC 7541 5.2", "a Huffman string holding the EOS symbol",
                    b"\x00\x85\xf2\xb2\x4a\x84\xff\x87\x49\x51\xff\xff\xff\xfa\x7f"),
    "hpack/6.1/1": ("RFC 7541 6.1", "an indexed field of index 0", b"\x80"),
}  # fmt: skip


def _decoding_error(cid: str, section: str, what: str, rep: bytes) -> None:
    def run(c: Ctx) -> None:
        c.conn.handshake()
        c.call(1, block=c.conn.encode(c.headers) + rep)
        connection_error(c.conn, E.COMPRESSION_ERROR)

    run.__doc__ = f"{section} (RFC 9113 4.3): {what}: connection error COMPRESSION_ERROR."
    case(cid)(run)


for _cid, (_section, _what, _rep) in DECODING_ERRORS.items():
    _decoding_error(_cid, _section, _what, _rep)


@case("hpack/6.3/1")
def _(c: Ctx) -> None:
    """RFC 7541 6.3 (RFC 9113 4.3): a dynamic table size update above SETTINGS_HEADER_TABLE_SIZE:
    connection error COMPRESSION_ERROR."""
    c.conn.handshake()
    size = c.conn.settings.get(1, 4096) + 1
    rep = bytearray((0x3F,))  # a 5-bit prefix integer, 0x20 the update's pattern
    size -= 31
    while size >= 128:
        rep.append(0x80 | (size & 0x7F))
        size >>= 7
    rep.append(size)
    c.call(1, block=bytes(rep) + c.conn.encode(c.headers))
    connection_error(c.conn, E.COMPRESSION_ERROR)
