"""A client certificate standing for a role: the tokens file's ``name role cert:<name>`` lines
and the access check given a verified certificate's names (what the TLS ports hand on)."""

from __future__ import annotations

import hashlib

import pytest

from control_plane.auth import Access, Authenticator, Denied, Identity, Role, TokensFile, check, parse_tokens


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


TOKENS = (
    "ops    operator  cert:CN=team#1          # a # inside a name is part of it\n"
    "edge   client    cert:DNS:envoy.internal\n"
    "six    viewer    cert:IP:2001:db8:0:0::1\n"
    f"vera   viewer    {_sha('vera-token')}\n"
)


def test_certificate_lines_parse_by_name_with_the_rest_of_the_line():
    ids = parse_tokens(TOKENS + "alice admin cert:CN=alice smith\n")
    assert ids["cert:CN=team#1"] == Identity("ops", Role.OPERATOR, certificate="CN=team#1")
    assert ids["cert:DNS:envoy.internal"].role is Role.CLIENT
    assert ids["cert:IP:2001:db8::1"].name == "six"  # one spelling of the address
    assert ids["cert:CN=alice smith"].name == "alice"


def _auth(tmp_path, **kw: object) -> Authenticator:
    path = tmp_path / "tokens"
    path.write_text(TOKENS)
    return Authenticator(tokens_file=TokensFile(path), **kw)  # type: ignore[arg-type]


def test_a_certificate_stands_for_its_role_and_no_more(tmp_path):
    auth = _auth(tmp_path, client_token="client-token")
    ops = check(auth, Access.OPERATOR, None, ("CN=team#1",))
    assert ops is not None and ops.name == "ops" and ops.certificate == "CN=team#1"
    edge = ("CN=envoy", "DNS:envoy.internal")
    assert check(auth, Access.DATA, None, edge).role is Role.CLIENT  # type: ignore[union-attr]
    with pytest.raises(Denied) as refused:
        check(auth, Access.READ, None, edge)  # a client certificate reads nothing
    assert refused.value.status == 403 and "the certificate 'DNS:envoy.internal' (edge)" in refused.value.message
    with pytest.raises(Denied) as nobody:  # verified, but named in no line: no role at all
        check(auth, Access.DATA, None, ("CN=stranger",))
    assert nobody.value.status == 401


def test_a_token_sent_counts_before_the_certificate(tmp_path):
    auth = _auth(tmp_path)
    assert check(auth, Access.READ, "vera-token", ("CN=team#1",)).name == "vera"  # type: ignore[union-attr]
    with pytest.raises(Denied) as bad:  # an invalid token is not rescued by the certificate
        check(auth, Access.OPERATOR, "wrong", ("CN=team#1",))
    assert bad.value.status == 401
