"""Tests for limiter.keys: key strategies, trusted proxies, validation."""

from __future__ import annotations

import hashlib
import ipaddress
import pickle
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from limiter.keys import (
    InvalidKeyError,
    KeyExtractor,
    KeyStrategy,
    MissingKeyError,
    TrustedProxies,
    api_key_id,
    redis_key,
    validate_key,
)

TRUSTED = TrustedProxies(["10.0.0.0/8", "127.0.0.1", "fd00::/8"])


def _has_control(text: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cf") for c in text)


# -- validate_key --------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["a", "user:42", "tenant/acme:api", "café", "東京", "a b", "x" * 256, "é" * 128, "::1"],
)
def test_validate_key_accepts(key: str) -> None:
    assert validate_key(key) is key


@pytest.mark.parametrize(
    "key",
    [
        "",
        "a\nb",
        "a\rb",
        "a\tb",
        "a\x00b",
        "a\x7fb",
        "a\x85b",  # C1 control (NEL)
        "a\u200bb",  # zero-width space (Cf)
        "a\u202eb",  # right-to-left override (Cf)
        "a\ufeffb",  # BOM (Cf)
        "a\u2028b",  # line separator
        "a\ud800b",  # lone surrogate
        " a",
        "a ",
        "a\u00a0",  # trailing no-break space
        "x" * 257,
        "é" * 129,  # 258 bytes of UTF-8, 129 characters
    ],
)
def test_validate_key_rejects(key: str) -> None:
    with pytest.raises(InvalidKeyError) as exc:
        validate_key(key, field="header:X-Tenant-Id")
    assert exc.value.field == "header:X-Tenant-Id"
    assert isinstance(exc.value, ValueError)


def test_validate_key_default_field_and_message() -> None:
    with pytest.raises(InvalidKeyError) as exc:
        validate_key("bad\nkey")
    assert exc.value.field == "key"
    assert "U+000A" in str(exc.value)
    assert "bad" not in str(exc.value)  # the value itself is never echoed
    with pytest.raises(InvalidKeyError, match="empty"):
        validate_key("")
    with pytest.raises(InvalidKeyError, match="too long"):
        validate_key("abcd", max_length=3)
    with pytest.raises(InvalidKeyError):
        validate_key(b"bytes")  # type: ignore[arg-type]


def test_validate_key_counts_utf8_bytes() -> None:
    assert validate_key("é" * 2, max_length=4)
    with pytest.raises(InvalidKeyError, match="5 bytes"):
        validate_key("é" * 2 + "a", max_length=4)


def test_validate_key_bad_max_length() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_length"):
            validate_key("a", max_length=bad)  # type: ignore[arg-type]


def test_errors_pickle_with_field() -> None:
    err = pickle.loads(pickle.dumps(MissingKeyError("missing", field="header:X-A")))
    assert type(err) is MissingKeyError
    assert err.field == "header:X-A" and str(err) == "missing"


# -- KeyStrategy -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("clientIP", KeyStrategy.CLIENT_IP),
        ("client_ip", KeyStrategy.CLIENT_IP),
        ("clientip", KeyStrategy.CLIENT_IP),
        ("CLIENT-IP", KeyStrategy.CLIENT_IP),
        ("header", KeyStrategy.HEADER),
        ("Header", KeyStrategy.HEADER),
        ("composite", KeyStrategy.COMPOSITE),
        ("apiKey", KeyStrategy.API_KEY),
        ("api_key", KeyStrategy.API_KEY),
        ("apikey", KeyStrategy.API_KEY),
        (" API_KEY ", KeyStrategy.API_KEY),
        (KeyStrategy.HEADER, KeyStrategy.HEADER),
    ],
)
def test_strategy_parse(text: str, expected: KeyStrategy) -> None:
    assert KeyStrategy.parse(text) is expected


def test_strategy_parse_rejects_and_names_allowed() -> None:
    with pytest.raises(ValueError) as exc:
        KeyStrategy.parse("cookie")
    for allowed in ("clientIP", "header", "composite", "apiKey"):
        assert allowed in str(exc.value)


def test_strategy_values_and_str() -> None:
    assert [s.value for s in KeyStrategy] == ["clientIP", "header", "composite", "apiKey"]
    assert str(KeyStrategy.API_KEY) == "apiKey"
    assert KeyStrategy("client_ip") is KeyStrategy.CLIENT_IP


# -- TrustedProxies ----------------------------------------------------------------


def test_trusted_proxies_contains() -> None:
    tp = TrustedProxies(["10.0.0.0/8", "127.0.0.1", "2001:db8::/32"])
    assert tp.contains("10.255.1.2")
    assert tp.contains("127.0.0.1")
    assert not tp.contains("127.0.0.2")
    assert tp.contains("2001:db8::42")
    assert tp.contains("2001:DB8:0:0::42")
    assert not tp.contains("2001:db9::1")
    assert tp.contains("::ffff:10.1.1.1")  # IPv4-mapped, as dual-stack sockets report
    assert not tp.contains("not-an-ip")
    assert not tp.contains("")
    assert not tp.contains(None)
    assert not tp.contains("10.0.0.1.5")
    assert "10.1.1.1" in tp
    assert len(tp) == 3 and tp


def test_trusted_proxies_parse() -> None:
    tp = TrustedProxies.parse("10.0.0.0/8, 192.168.0.0/16 ,")
    assert tp.contains("192.168.3.4") and tp.contains("10.0.0.1")
    assert not tp.contains("172.16.0.1")
    assert tp == TrustedProxies(["192.168.0.0/16", "10.0.0.0/8"])
    assert hash(tp) == hash(TrustedProxies(["192.168.0.0/16", "10.0.0.0/8"]))
    assert not TrustedProxies.parse("")
    assert TrustedProxies("10.0.0.0/8") == TrustedProxies(["10.0.0.0/8"])
    assert TrustedProxies(["10.0.0.1/8"]).contains("10.9.9.9")  # host bits masked


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "banana", "10.0.0", "::1/129", ""])
def test_trusted_proxies_invalid_entry_named(bad: str) -> None:
    with pytest.raises(ValueError) as exc:
        TrustedProxies(["10.0.0.0/8", bad])
    assert repr(bad) in str(exc.value)


def test_trusted_proxies_parse_invalid_entry_named() -> None:
    with pytest.raises(ValueError, match="10.0.0.300"):
        TrustedProxies.parse("10.0.0.0/8, 10.0.0.300")


def test_empty_trusts_nobody() -> None:
    assert not TrustedProxies(()).contains("127.0.0.1")
    assert not TrustedProxies().contains("10.0.0.1")


# -- CLIENT_IP -----------------------------------------------------------------


def test_client_ip_defaults_to_peer() -> None:
    assert KeyExtractor().extract(client_ip="203.0.113.7", headers={}) == "203.0.113.7"


def test_spoofed_forwarded_for_from_untrusted_peer_is_ignored() -> None:
    headers = {"X-Forwarded-For": "1.2.3.4", "X-Real-IP": "5.6.7.8"}
    # default: trust nobody, not even loopback
    assert KeyExtractor().extract(client_ip="127.0.0.1", headers=headers) == "127.0.0.1"
    ext = KeyExtractor(trusted_proxies=TRUSTED)
    assert ext.extract(client_ip="203.0.113.7", headers=headers) == "203.0.113.7"


def test_trusted_proxy_forwarded_for_honoured() -> None:
    ext = KeyExtractor(trusted_proxies=TRUSTED)
    headers = {"X-Forwarded-For": "198.51.100.1, 10.0.0.2", "X-Real-IP": "5.6.7.8"}
    assert ext.extract(client_ip="10.0.0.1", headers=headers) == "198.51.100.1"


def test_trusted_proxy_forwarded_for_cleanup() -> None:
    ext = KeyExtractor(trusted_proxies=TRUSTED)
    cases = {
        "  198.51.100.1  ": "198.51.100.1",
        ", , garbage, 198.51.100.1": "198.51.100.1",
        "198.51.100.1:8080, 10.0.0.2": "198.51.100.1",
        "[2001:db8::1]:443": "2001:db8::1",
        "[2001:DB8:0:0:0:0:0:1]": "2001:db8::1",
        "unknown, 2001:0db8::0001": "2001:db8::1",
    }
    for xff, expected in cases.items():
        assert ext.extract(client_ip="10.0.0.1", headers={"x-forwarded-for": xff}) == expected


def test_trusted_proxy_falls_back_to_real_ip_then_peer() -> None:
    ext = KeyExtractor(trusted_proxies=TRUSTED)
    assert ext.extract(client_ip="10.0.0.1", headers={"X-Real-IP": " 198.51.100.9 "}) == ("198.51.100.9")
    assert (
        ext.extract(client_ip="10.0.0.1", headers={"X-Forwarded-For": "junk, ", "X-Real-IP": "198.51.100.9"})
        == "198.51.100.9"
    )
    assert ext.extract(client_ip="10.0.0.1", headers={"X-Real-IP": "junk"}) == "10.0.0.1"
    assert ext.extract(client_ip="10.0.0.1", headers={}) == "10.0.0.1"


def test_client_ip_ipv6_normalised() -> None:
    ext = KeyExtractor(trusted_proxies=TRUSTED)
    assert ext.extract(client_ip="2001:0DB8:0000::0001", headers={}) == "2001:db8::1"
    assert ext.extract(client_ip="fe80::1%eth0", headers={}) == "fe80::1"  # zone id dropped
    assert ext.extract(client_ip="::ffff:198.51.100.1", headers={}) == "198.51.100.1"
    # IPv6 trusted proxy forwarding an IPv6 client
    assert (
        ext.extract(client_ip="fd00::5", headers={"X-Forwarded-For": "2001:db8:0:0:1::1, fd00::6"})
        == "2001:db8::1:0:0:1"
    )
    # IPv6 untrusted peer: header ignored
    assert ext.extract(client_ip="2001:db8::99", headers={"X-Forwarded-For": "1.1.1.1"}) == ("2001:db8::99")


@pytest.mark.parametrize("peer", [None, "", "testclient", "999.1.1.1", "a\nb"])
def test_client_ip_unusable_raises(peer: str | None) -> None:
    with pytest.raises(InvalidKeyError) as exc:
        KeyExtractor().extract(client_ip=peer, headers={"X-Forwarded-For": "1.2.3.4"})
    assert exc.value.field == "client_ip"


def test_rightmost_untrusted() -> None:
    ext = KeyExtractor(trusted_proxies=TRUSTED, forwarded_mode="rightmost_untrusted")
    # The client forged "6.6.6.6"; the edge proxy 10.0.0.2 appended what it saw.
    headers = {"X-Forwarded-For": "6.6.6.6, 198.51.100.1, 10.0.0.2"}
    assert ext.extract(client_ip="10.0.0.1", headers=headers) == "198.51.100.1"
    # "first" mode would have believed the forgery
    first = KeyExtractor(trusted_proxies=TRUSTED)
    assert first.extract(client_ip="10.0.0.1", headers=headers) == "6.6.6.6"
    # all hops trusted: the left-most (an internal client)
    assert ext.extract(client_ip="10.0.0.1", headers={"X-Forwarded-For": "10.9.9.9, 10.0.0.2"}) == "10.9.9.9"
    # an unparsable hop stops the walk at the last trusted hop
    assert ext.extract(client_ip="10.0.0.1", headers={"X-Forwarded-For": "6.6.6.6, unknown, 10.0.0.2"}) == "10.0.0.2"
    # no usable X-Forwarded-For: X-Real-IP, then the peer
    assert ext.extract(client_ip="10.0.0.1", headers={"X-Real-IP": "198.51.100.3"}) == ("198.51.100.3")
    assert ext.extract(client_ip="10.0.0.1", headers={"X-Forwarded-For": " , "}) == "10.0.0.1"
    # untrusted peer: still ignored
    assert ext.extract(client_ip="203.0.113.1", headers=headers) == "203.0.113.1"


def test_repeated_forwarded_for_headers_are_joined() -> None:
    raw = [(b"x-forwarded-for", b"6.6.6.6"), (b"x-forwarded-for", b"198.51.100.1, 10.0.0.2")]
    headers = Headers(raw=raw)
    ext = KeyExtractor(trusted_proxies=TRUSTED, forwarded_mode="rightmost_untrusted")
    assert ext.extract(client_ip="10.0.0.1", headers=headers) == "198.51.100.1"
    first = KeyExtractor(trusted_proxies=TRUSTED)
    assert first.extract(client_ip="10.0.0.1", headers=headers) == "6.6.6.6"


# -- HEADER ----------------------------------------------------------------------


def test_header_strategy() -> None:
    ext = KeyExtractor(strategy=KeyStrategy.HEADER, header="X-Tenant-Id")
    assert ext.extract(client_ip="1.2.3.4", headers={"X-Tenant-Id": " acme-corp "}) == "acme-corp"


@pytest.mark.parametrize("name", ["x-tenant-id", "X-TENANT-ID", "X-Tenant-Id", "x-TeNaNt-iD"])
def test_header_lookup_is_case_insensitive(name: str) -> None:
    ext = KeyExtractor(strategy="header", header="X-Tenant-Id")
    assert ext.extract(client_ip=None, headers={name: "acme"}) == "acme"


def test_header_lookup_starlette_headers() -> None:
    ext = KeyExtractor(strategy="header", header="X-Tenant-Id")
    headers = Headers(headers={"X-Tenant-Id": "acme"})
    assert ext.extract(client_ip=None, headers=headers) == "acme"
    raw = Headers(raw=[(b"X-TENANT-ID", b"globex")])  # raw headers not lower-cased
    assert ext.extract(client_ip=None, headers=raw) == "globex"


@pytest.mark.parametrize("headers", [{}, {"X-Tenant-Id": ""}, {"x-tenant-id": "   "}, {"X-Other": "a"}])
def test_header_missing(headers: dict[str, str]) -> None:
    ext = KeyExtractor(strategy="header", header="X-Tenant-Id")
    with pytest.raises(MissingKeyError) as exc:
        ext.extract(client_ip="1.2.3.4", headers=headers)
    assert exc.value.field == "header:X-Tenant-Id"
    assert "header X-Tenant-Id is required by this route's key strategy" in str(exc.value)


@pytest.mark.parametrize("value", ["a\x00b", "a\nb", "x" * 300, "a\u200bb"])
def test_header_invalid_value(value: str) -> None:
    ext = KeyExtractor(strategy="header", header="X-Tenant-Id")
    with pytest.raises(InvalidKeyError) as exc:
        ext.extract(client_ip=None, headers={"X-Tenant-Id": value})
    assert not isinstance(exc.value, MissingKeyError)
    assert exc.value.field == "header:X-Tenant-Id"


def test_header_respects_max_length() -> None:
    ext = KeyExtractor(strategy="header", header="X-Tenant-Id", max_length=8)
    assert ext.extract(client_ip=None, headers={"X-Tenant-Id": "12345678"}) == "12345678"
    with pytest.raises(InvalidKeyError):
        ext.extract(client_ip=None, headers={"X-Tenant-Id": "123456789"})


# -- COMPOSITE -------------------------------------------------------------------


def test_composite_strategy() -> None:
    ext = KeyExtractor(strategy="composite", header="X-Tenant-Id")
    h = {"x-tenant-id": "acme-corp"}
    assert ext.extract(client_ip=None, headers=h, path="/api/v1/users") == "acme-corp:api"
    assert ext.extract(client_ip=None, headers=h, path="/") == "acme-corp"
    assert ext.extract(client_ip=None, headers=h, path="") == "acme-corp"
    assert ext.extract(client_ip=None, headers=h, path="/api") == "acme-corp:api"
    assert ext.extract(client_ip=None, headers=h, path="//api//x") == "acme-corp:api"
    assert ext.extract(client_ip=None, headers=h, path="/api?x=1") == "acme-corp:api"
    assert ext.extract(client_ip=None, headers=h) == "acme-corp"


def test_composite_segment_is_escaped() -> None:
    ext = KeyExtractor(strategy="composite", header="X-Tenant-Id")
    h = {"X-Tenant-Id": "acme"}
    assert ext.extract(client_ip=None, headers=h, path="/a:b/c") == "acme:a%3Ab"
    assert ext.extract(client_ip=None, headers=h, path="/a\nb") == "acme:a%0Ab"
    assert ext.extract(client_ip=None, headers=h, path="/caf\u00e9") == "acme:caf%C3%A9"
    # unambiguous: tenant "a:b" on /c differs from tenant "a" on /b:c
    one = ext.extract(client_ip=None, headers={"X-Tenant-Id": "a:b"}, path="/c")
    two = ext.extract(client_ip=None, headers={"X-Tenant-Id": "a"}, path="/b:c")
    assert one != two


def test_composite_missing_header() -> None:
    ext = KeyExtractor(strategy="composite", header="X-Tenant-Id")
    with pytest.raises(MissingKeyError) as exc:
        ext.extract(client_ip="1.2.3.4", headers={}, path="/api/v1")
    assert exc.value.field == "header:X-Tenant-Id"


def test_composite_too_long_result_field_key() -> None:
    ext = KeyExtractor(strategy="composite", header="X-Tenant-Id", max_length=10)
    with pytest.raises(InvalidKeyError) as exc:
        ext.extract(client_ip=None, headers={"X-Tenant-Id": "12345678"}, path="/api")
    assert exc.value.field == "key"


# -- API_KEY -----------------------------------------------------------------------

RAW_KEY = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"


def test_api_key_id() -> None:
    expected = "apikey:" + hashlib.sha256(RAW_KEY.encode()).hexdigest()[:32]
    assert api_key_id(RAW_KEY) == expected
    assert len(api_key_id(RAW_KEY)) == len("apikey:") + 32
    assert api_key_id("a") != api_key_id("b")
    with pytest.raises(InvalidKeyError):
        api_key_id("")


def test_api_key_from_header() -> None:
    ext = KeyExtractor(strategy="apiKey")
    key = ext.extract(client_ip="1.2.3.4", headers={"x-api-key": f" {RAW_KEY} "})
    assert key == api_key_id(RAW_KEY)
    assert RAW_KEY not in key
    assert "sk_live" not in key


def test_api_key_from_bearer() -> None:
    ext = KeyExtractor(strategy="api_key")
    for auth in (f"Bearer {RAW_KEY}", f"bearer   {RAW_KEY}", f"BEARER {RAW_KEY} "):
        key = ext.extract(client_ip=None, headers={"Authorization": auth})
        assert key == api_key_id(RAW_KEY)
        assert RAW_KEY not in key


def test_api_key_header_wins_over_bearer() -> None:
    ext = KeyExtractor(strategy="apiKey")
    key = ext.extract(client_ip=None, headers={"X-API-Key": "one", "Authorization": "Bearer two"})
    assert key == api_key_id("one")


def test_api_key_custom_header() -> None:
    ext = KeyExtractor(strategy="apiKey", api_key_header="X-Client-Token")
    key = ext.extract(client_ip=None, headers=Headers(headers={"x-client-token": RAW_KEY}))
    assert key == api_key_id(RAW_KEY)


@pytest.mark.parametrize(
    "headers",
    [{}, {"X-API-Key": " "}, {"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Bearer "}],
)
def test_api_key_missing(headers: dict[str, str]) -> None:
    ext = KeyExtractor(strategy="apiKey")
    with pytest.raises(MissingKeyError) as exc:
        ext.extract(client_ip="1.2.3.4", headers=headers)
    assert exc.value.field == "header:X-API-Key"


def test_api_key_invalid_never_leaks() -> None:
    ext = KeyExtractor(strategy="apiKey")
    secret = "sk_secret\x00value"
    with pytest.raises(InvalidKeyError) as exc:
        ext.extract(client_ip=None, headers={"X-API-Key": secret})
    assert exc.value.field == "header:X-API-Key"
    assert "sk_secret" not in str(exc.value)


def test_api_key_long_bearer_token_is_fine() -> None:
    jwt = "eyJ" + "a" * 1200
    ext = KeyExtractor(strategy="apiKey")
    assert ext.extract(client_ip=None, headers={"authorization": f"Bearer {jwt}"}) == (api_key_id(jwt))


# -- KeyExtractor construction ---------------------------------------------------


def test_extractor_defaults() -> None:
    ext = KeyExtractor()
    assert ext.strategy is KeyStrategy.CLIENT_IP
    assert ext.header is None
    assert ext.api_key_header == "X-API-Key"
    assert not ext.trusted_proxies
    assert ext.max_length == 256
    assert ext.forwarded_mode == "first"
    assert hash(ext) == hash(KeyExtractor())


def test_extractor_coerces() -> None:
    proxies = "10.0.0.0/8, ::1"
    ext = KeyExtractor(strategy="client_ip", trusted_proxies=proxies)  # type: ignore[arg-type]
    assert ext.strategy is KeyStrategy.CLIENT_IP
    assert isinstance(ext.trusted_proxies, TrustedProxies)
    assert ext.trusted_proxies.contains("::1")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"strategy": "header"},
        {"strategy": "composite"},
        {"strategy": "header", "header": "X Tenant"},
        {"strategy": "header", "header": ""},
        {"strategy": "header", "header": "X-Tenant:"},
        {"strategy": "header", "header": "X-Tenant\n"},
        {"strategy": "apiKey", "api_key_header": "bad header"},
        {"strategy": "cookie"},
        {"forwarded_mode": "last"},
        {"max_length": 0},
        {"trusted_proxies": ["nope"]},
        {"strategy": "apiKey", "max_length": 20},
    ],
)
def test_extractor_rejects_bad_config(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        KeyExtractor(**kwargs)  # type: ignore[arg-type]


# -- redis_key ---------------------------------------------------------------------


def test_redis_key() -> None:
    assert redis_key("api", "1.2.3.4") == "rl:api:1.2.3.4"
    assert redis_key("a.b-c_D9", "acme:api") == "rl:a.b-c_D9:acme:api"
    assert redis_key("n" * 64, "k") == f"rl:{'n' * 64}:k"


@pytest.mark.parametrize("ns", ["", "n" * 65, "{api}", "a b", "a:b", "ns\n", "é", None])
def test_redis_key_bad_namespace(ns: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        redis_key(ns, "key")


def test_redis_key_validates_key() -> None:
    with pytest.raises(InvalidKeyError):
        redis_key("api", "a\nb")


# -- properties --------------------------------------------------------------------

# Any code point at all, surrogates included.
any_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, categories=None))
controls = st.characters(categories=["Cc", "Cf"])


@given(st.text(), controls, st.text())
def test_validate_key_never_accepts_control_characters(prefix: str, ctrl: str, suffix: str) -> None:
    with pytest.raises(InvalidKeyError):
        validate_key(prefix + ctrl + suffix)


@given(any_text)
def test_validate_key_accepts_only_clean_keys(text: str) -> None:
    try:
        result = validate_key(text)
    except InvalidKeyError as exc:
        assert exc.field == "key"
        return
    assert result == text
    assert not _has_control(result)
    assert result == result.strip() and result
    assert len(result.encode("utf-8")) <= 256


header_values = st.one_of(
    any_text,
    st.text(alphabet="0123456789abcdef.:[], \t\r\n\x00", max_size=60),
    st.sampled_from(["1.2.3.4", "::1", "[::1]:80", "10.0.0.2", "2001:db8::1", "fe80::1%\n"]),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    strategy=st.sampled_from(list(KeyStrategy)),
    mode=st.sampled_from(["first", "rightmost_untrusted"]),
    client_ip=st.one_of(st.none(), header_values, st.sampled_from(["10.0.0.1", "127.0.0.1"])),
    headers=st.dictionaries(
        st.sampled_from(["X-Forwarded-For", "x-real-ip", "X-Tenant-Id", "x-api-key", "Authorization", "Other"]),
        header_values,
    ),
    path=any_text,
)
def test_extract_never_returns_control_characters(
    strategy: KeyStrategy, mode: str, client_ip: str | None, headers: dict[str, str], path: str
) -> None:
    ext = KeyExtractor(
        strategy=strategy,
        header="X-Tenant-Id",
        trusted_proxies=TRUSTED,
        forwarded_mode=mode,  # type: ignore[arg-type]
    )
    try:
        key = ext.extract(client_ip=client_ip, headers=headers, path="/" + path)
    except InvalidKeyError:
        return
    assert not _has_control(key)
    assert validate_key(key) == key
    if strategy is KeyStrategy.CLIENT_IP:
        assert str(ipaddress.ip_address(key)) == key
    if strategy is KeyStrategy.API_KEY:
        assert key.startswith("apikey:") and len(key) == 39
