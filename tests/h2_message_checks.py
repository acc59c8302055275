"""The HTTP message checks of RFC 9113 section 8: h2spec's ``http2/8.1`` and ``http2/8.1.2.*``
cases (RFC 7540's numbering), then the field checks of RFC 9113 8.2.1 and 8.2.2 that h2spec
lacks (``rfc9113/...``). A malformed request is a stream error PROTOCOL_ERROR (8.1.1); run
once with h2spec's verdict, and once more requiring a RST_STREAM on that very stream with the
connection answering the next call (:meth:`h2spec.Ctx.malformed`). See tests/h2spec.py."""

from __future__ import annotations

from h2_raw import rls_message
from h2spec import Ctx, case


def _send(c: Ctx, headers: list[tuple[str, str]]) -> None:
    """A call with these request headers, as h2spec's GET becomes here: HEADERS, then the message."""
    c.conn.handshake()
    c.call(1, headers)


def _without(c: Ctx, name: str) -> list[tuple[str, str]]:
    return [(k, v) for k, v in c.headers if k != name]


def _with(c: Ctx, name: str, value: str) -> list[tuple[str, str]]:
    return [(k, value if k == name else v) for k, v in c.headers]


@case("http2/8.1/1", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.1: a second HEADERS frame (trailers) without END_STREAM: stream error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.data(1, rls_message())
    c.conn.headers(1, c.conn.encode([("x-test", "ok")]))
    c.malformed()


@case("http2/8.1.2/1", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.2: a field name in uppercase letters: stream error PROTOCOL_ERROR."""
    _send(c, [*c.headers, ("X-TEST", "ok")])
    c.malformed()


@case("http2/8.1.2.1/1", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.3: an unknown pseudo-header field (``:test``): stream error PROTOCOL_ERROR."""
    _send(c, [*c.headers[:4], (":test", "ok"), *c.headers[4:]])
    c.malformed()


@case("http2/8.1.2.1/2", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.3: a response pseudo-header field (``:status``) in a request: stream error PROTOCOL_ERROR."""
    _send(c, [*c.headers[:4], (":status", "200"), *c.headers[4:]])
    c.malformed()


@case("http2/8.1.2.1/3", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.1: a pseudo-header field in trailers: stream error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.data(1, rls_message())
    c.conn.headers(1, c.conn.encode([(":method", "POST")]))
    c.malformed()


@case("http2/8.1.2.1/4", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.3: a pseudo-header field after a regular one: stream error PROTOCOL_ERROR."""
    _send(c, [("x-test", "ok"), *c.headers])
    c.malformed()


@case("http2/8.1.2.2/1", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.2.2: a connection-specific field (``connection: keep-alive``): stream error PROTOCOL_ERROR."""
    _send(c, [*c.headers, ("connection", "keep-alive")])
    c.malformed()


@case("http2/8.1.2.2/2", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.2.2: ``te`` with a value other than ``trailers``: stream error PROTOCOL_ERROR."""
    _send(c, [*_without(c, "te"), ("trailers", "test"), ("te", "trailers, deflate")])
    c.malformed()


@case("http2/8.1.2.3/1", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.3.1: an empty ``:path``: stream error PROTOCOL_ERROR."""
    _send(c, _with(c, ":path", ""))
    c.malformed()


@case("http2/8.1.2.3/2", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.3.1: no ``:method``: stream error PROTOCOL_ERROR. (h2spec's Go code drops
    ``:scheme`` too, by slicing twice; only ``:method`` is missing here, the stricter case.)"""
    _send(c, _without(c, ":method"))
    c.malformed()


@case("http2/8.1.2.3/3", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.3.1: no ``:scheme``: stream error PROTOCOL_ERROR."""
    _send(c, _without(c, ":scheme"))
    c.malformed()


@case("http2/8.1.2.3/4", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.3.1: no ``:path``: stream error PROTOCOL_ERROR."""
    _send(c, _without(c, ":path"))
    c.malformed()


@case("http2/8.1.2.3/5", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.3.1: ``:method`` twice: stream error PROTOCOL_ERROR."""
    _send(c, [*c.headers[:4], (":method", "POST"), *c.headers[4:]])
    c.malformed()


@case("http2/8.1.2.3/6", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.3.1: ``:scheme`` twice: stream error PROTOCOL_ERROR."""
    _send(c, [*c.headers[:4], (":scheme", "http"), *c.headers[4:]])
    c.malformed()


@case("http2/8.1.2.3/7", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.3.1: ``:path`` twice: stream error PROTOCOL_ERROR."""
    _send(c, [*c.headers[:4], (":path", c.headers[2][1]), *c.headers[4:]])
    c.malformed()


@case("http2/8.1.2.6/1", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.1.1: ``content-length`` unlike the DATA frame's length: stream error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode([*c.headers, ("content-length", "1")]))
    c.conn.data(1, rls_message(), end_stream=True)
    c.malformed()


@case("http2/8.1.2.6/2", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.1.1: ``content-length`` unlike the sum of the DATA frames' lengths: stream error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode([*c.headers, ("content-length", "1")]))
    message = rls_message()
    c.conn.data(1, message[:4])
    c.conn.data(1, message[4:], end_stream=True)
    c.malformed()


# -- RFC 9113's field checks that h2spec lacks ----------------------------------------------------


BAD_NAMES = {
    "1": ("", "x"),  # an empty name (HPACK carries it; no HTTP field has it)
    "2": ("x test", "ok"),  # a space
    "3": ("x:test", "ok"),  # a colon past the first character
    "4": ("x-t\x00st", "ok"),  # NUL
    "5": ("x-tést", "ok"),  # above 0x7f
}
BAD_VALUES = {
    "6": ("x-test", "a\x00b"),  # NUL
    "7": ("x-test", "a\r\nx-injected: 1"),  # CR LF
    "8": ("x-test", "a\nb"),  # LF alone
    "9": ("x-test", " leading"),  # whitespace first
    "10": ("x-test", "trailing\t"),  # whitespace last
}


def _field_case(number: str, name: str, value: str) -> None:
    def run(c: Ctx) -> None:
        _send(c, [*c.headers, (name, value)])
        c.malformed()

    what = "name" if int(number) <= 5 else "value"
    run.__doc__ = f"RFC 9113 8.2.1: a field {what} it forbids ({name!r}: {value!r}): stream error PROTOCOL_ERROR."
    case(f"rfc9113/8.2.1/{number}", message_check=True)(run)


for _number, (_name, _value) in {**BAD_NAMES, **BAD_VALUES}.items():
    _field_case(_number, _name, _value)

CONNECTION_SPECIFIC = {"1": ("keep-alive", "timeout=5"), "2": ("proxy-connection", "keep-alive"),
                       "3": ("transfer-encoding", "chunked"), "4": ("upgrade", "h2c")}  # fmt: skip


def _connection_case(number: str, name: str, value: str) -> None:
    def run(c: Ctx) -> None:
        _send(c, [*c.headers, (name, value)])
        c.malformed()

    run.__doc__ = f"RFC 9113 8.2.2: a connection-specific field ({name}: {value}): stream error PROTOCOL_ERROR."
    case(f"rfc9113/8.2.2/{number}", message_check=True)(run)


for _number, (_name, _value) in CONNECTION_SPECIFIC.items():
    _connection_case(_number, _name, _value)


@case("rfc9113/8.3/1", message_check=True)
def _(c: Ctx) -> None:
    """RFC 9113 8.3: a pseudo-header field in trailers after a whole message (``:path``, with
    END_STREAM): stream error PROTOCOL_ERROR."""
    c.conn.handshake()
    c.conn.headers(1, c.conn.encode(c.headers))
    c.conn.data(1, rls_message())
    c.conn.headers(1, c.conn.encode([(":path", "/x")]), end_stream=True)
    c.malformed()
