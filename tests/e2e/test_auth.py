"""Named tokens with roles: who may call what, checked before a body is read, and the
audit trail naming who really acted."""

from __future__ import annotations

import hashlib
import json
import socket

import httpx
import pytest
from cp_server import ADMIN_TOKEN, ControlPlaneServer, wait_until, write_rules

from control_plane.auth import (
    ACCESS,
    Access,
    Authenticator,
    Denied,
    Identity,
    Role,
    TokensFile,
    TokensFileError,
    check,
    parse_tokens,
)
from control_plane.cli import main
from control_plane.settings import SettingsError, load_settings

TOKENS = {
    "vera": ("viewer", "vera-token-0123456789"),
    "otto": ("operator", "otto-token-0123456789"),
    "ada": ("admin", "ada-token-0123456789"),
}


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tokens_text(tokens: dict[str, tuple[str, str]] = TOKENS) -> str:
    lines = ["# name role sha256-of-token"]
    lines += [f"{name}  {role}  {_sha(tok)}" for name, (role, tok) in tokens.items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- #
# pure parts
# --------------------------------------------------------------------------- #


def test_parse_tokens_file():
    ids = parse_tokens(tokens_text())
    assert ids[_sha("otto-token-0123456789")] == Identity("otto", Role.OPERATOR)
    assert {i.role for i in ids.values()} == {Role.VIEWER, Role.OPERATOR, Role.ADMIN}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("alice viewer\n", "tokens:1: expected 'name role sha256-of-token' (or 'name role cert:<certificate"),
        ("alice client cert:\n", "tokens:1: '' is not a certificate name"),
        (f"alice client {_sha('x')}\n", "tokens:1: role must be viewer, operator or admin, got 'client'"),
        ("a viewer cert:DNS:x\nb admin cert:DNS:x\n", "tokens:2: the same certificate name is already given to 'a'"),
        (f"alice root {_sha('x')}\n", "tokens:1: role must be viewer, operator or admin, got 'root'"),
        ("\n\nalice viewer plain-token\n", "tokens:3: the third field must be the token's SHA-256"),
        (f"a viewer {_sha('x')}\na operator {_sha('y')}\n", "tokens:2: name 'a' appears twice"),
        (f"a viewer {_sha('x')}\nb operator {_sha('x')}\n", "tokens:2: the same token is already given to 'a'"),
        (f"bad/name viewer {_sha('x')}\n", "tokens:1: name must be"),
    ],
)
def test_bad_tokens_file_names_the_line(text, message):
    with pytest.raises(TokensFileError) as err:
        parse_tokens(text, "tokens")
    assert str(err.value).startswith(message)


def test_tokens_file_is_a_startup_error_naming_the_setting_and_line(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(tokens_text() + "broken line\n")
    with pytest.raises(SettingsError) as err:
        load_settings(tokens_file=path)
    assert "SHADOWLIMIT_TOKENS_FILE" in str(err.value) and f"{path}:5:" in str(err.value)


def test_tokens_file_is_reread_on_change_and_a_bad_version_keeps_the_last_good(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(tokens_text({"vera": TOKENS["vera"]}))
    now = [0.0]
    tf = TokensFile(path, check_every_s=1.0, clock=lambda: now[0])
    auth = Authenticator(tokens_file=tf)
    assert auth.identify("otto-token-0123456789") is None
    path.write_text(tokens_text())
    assert auth.identify("otto-token-0123456789") is None  # not yet looked again
    now[0] = 1.0
    assert auth.identify("otto-token-0123456789") == Identity("otto", Role.OPERATOR)
    path.write_text("nonsense\n")
    now[0] = 2.0
    assert auth.identify("otto-token-0123456789") == Identity("otto", Role.OPERATOR)
    assert tf.last_error is not None and "expected 'name role sha256-of-token'" in tf.last_error


def test_check_table(tmp_path):
    files = Authenticator(admin_token="single", tokens_file=None)
    (tmp_path / "tokens").write_text(tokens_text())
    with_file = Authenticator(admin_token="single", tokens_file=TokensFile(tmp_path / "tokens"))
    # single admin token only: reads stay open, mutations need it
    assert check(files, Access.READ, None) is None
    assert check(files, Access.OPERATOR, "single") == Identity("admin", Role.ADMIN)
    with pytest.raises(Denied) as d:
        check(files, Access.OPERATOR, None)
    assert d.value.status == 401
    # tokens file: reads need a viewer, roles are ranked
    with pytest.raises(Denied) as d:
        check(with_file, Access.READ, None)
    assert d.value.status == 401
    assert check(with_file, Access.READ, "vera-token-0123456789") == Identity("vera", Role.VIEWER)
    with pytest.raises(Denied) as d:
        check(with_file, Access.OPERATOR, "vera-token-0123456789")
    assert (d.value.status, d.value.error, d.value.details["needs"]) == (403, "forbidden", "operator")
    assert check(with_file, Access.ADMIN, "ada-token-0123456789").name == "ada"
    # nothing configured: mutations are disabled, not open
    with pytest.raises(Denied) as d:
        check(Authenticator(), Access.OPERATOR, "anything")
    assert (d.value.status, d.value.error) == (403, "admin_disabled")


# --------------------------------------------------------------------------- #
# every role on every endpoint, over real HTTP
# --------------------------------------------------------------------------- #

PATH_PARAMS = {"route": "search", "client_id": "someone", "name": "swagger-ui.css"}
BODIES = {
    ("POST", "/v1/decide"): {"route": "search", "key": "k"},
    ("POST", "/v1/decide/batch"): {"requests": [{"route": "search", "key": "k"}]},
    ("PUT", "/v1/routes/{route}/mode"): {"mode": "shadow", "reason": "role test"},
    ("PUT", "/ratelimit/config"): {"route": "search", "average": 10, "reason": "role test", "clear": True},
}
CALLERS = {
    "nobody": None,
    "wrong": "not-a-token",
    "viewer": TOKENS["vera"][1],
    "operator": TOKENS["otto"][1],
    "admin": TOKENS["ada"][1],
    "single-admin": ADMIN_TOKEN,
}
RANK = {"viewer": 1, "operator": 2, "admin": 3, "single-admin": 3}


def _expected(access: Access, caller: str, *, open_reads: bool) -> int | None:
    """401/403 when the caller must be refused, None when the call must go through."""
    if access in (Access.OPEN, Access.DATA) or (access is Access.READ and open_reads):
        return None
    needed = {Access.READ: 1, Access.OPERATOR: 2, Access.ADMIN: 3}[access]
    if caller in ("nobody", "wrong"):
        return 401
    return None if RANK[caller] >= needed else 403


@pytest.fixture(scope="module")
def role_servers(redis_server, tmp_path_factory):
    d = tmp_path_factory.mktemp("roles")
    tokens = d / "tokens"
    tokens.write_text(tokens_text())
    rules = write_rules(d)
    strict = ControlPlaneServer(
        redis_url=redis_server.url, rules_path=rules, tokens_file=str(tokens), gate_min_samples=0
    ).start()
    open_ = ControlPlaneServer(
        redis_url=redis_server.url, rules_path=rules, tokens_file=str(tokens), open_reads=True, gate_min_samples=0
    ).start()
    yield {"strict": strict, "open_reads": open_}
    strict.stop()
    open_.stop()


def _operations(cp: ControlPlaneServer) -> list[tuple[str, str]]:
    spec = httpx.get(cp.url + "/openapi.json", timeout=5).json()
    ops = [(m.upper(), path) for path, item in spec["paths"].items() for m in item]
    docs = [("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc"), ("GET", "/docs/assets/{name}")]
    return ops + docs


def test_every_endpoint_is_classified(role_servers):
    ops = _operations(role_servers["strict"])
    assert len(ops) >= 20
    assert set(ops) <= set(ACCESS), set(ops) - set(ACCESS)


@pytest.mark.parametrize("server", ["strict", "open_reads"])
@pytest.mark.parametrize("caller", list(CALLERS))
def test_every_role_on_every_endpoint(role_servers, server, caller):
    cp = role_servers[server]
    token = CALLERS[caller]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    checked = 0
    with httpx.Client(base_url=cp.url, timeout=10) as c:
        for method, path in _operations(cp):
            url = path.format(**PATH_PARAMS)
            if path == "/v1/stream":
                with c.stream("GET", url, headers=headers) as r:
                    status = r.status_code
            else:
                status = c.request(method, url, headers=headers, json=BODIES.get((method, path))).status_code
            want = _expected(ACCESS[(method, path)], caller, open_reads=server == "open_reads")
            if want is None:
                assert status not in (401, 403), f"{caller} {method} {path}: {status}"
                assert status < 500, f"{caller} {method} {path}: {status}"
            else:
                assert status == want, f"{caller} {method} {path}: {status}, expected {want}"
            checked += 1
    assert checked >= 20


def test_forbidden_names_the_role_needed(role_servers):
    cp = role_servers["strict"]
    r = httpx.put(
        cp.url + "/v1/routes/search/mode",
        json={"mode": "off", "reason": "x"},
        headers={"Authorization": f"Bearer {TOKENS['vera'][1]}"},
        timeout=5,
    )
    assert r.status_code == 403
    assert r.json() == {
        "error": "forbidden",
        "message": "this needs the operator role; the token 'vera' has the viewer role",
        "needs": "operator",
        "role": "viewer",
        "token": "vera",
    }


def test_the_audit_actor_is_the_token_name_and_the_header_only_adds_a_note(role_servers):
    cp = role_servers["strict"]
    h = {"Authorization": f"Bearer {TOKENS['otto'][1]}", "X-Shadowlimit-Actor": "ada"}
    r = httpx.put(cp.url + "/v1/routes/export/mode", json={"mode": "off", "reason": "who am i"}, headers=h, timeout=5)
    assert r.status_code == 200, r.text
    actor = r.json()["audit"]["actor"]
    assert actor.startswith("otto@127.0.0.1") and "(note: ada)" in actor
    assert not actor.startswith("ada")


def test_token_is_checked_before_the_body_is_read(role_servers):
    """A 20 MB body (within the body limit) without a token is refused from its headers:
    the answer comes while the client has sent almost none of it."""
    cp = role_servers["strict"]
    with socket.create_connection(("127.0.0.1", cp.port), timeout=10) as s:
        s.sendall(
            b"PUT /v1/routes/search/mode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 20000000\r\n\r\n{"mode":'
        )
        reply = s.recv(65536).decode("latin-1")
    assert reply.startswith("HTTP/1.1 401"), reply[:200]
    assert '"error":"unauthorized"' in reply


def test_malformed_body_without_a_token_is_401_not_422(role_servers):
    cp = role_servers["strict"]
    r = httpx.put(
        cp.url + "/v1/routes/search/mode", content=b"{not json", headers={"Content-Type": "application/json"}, timeout=5
    )
    assert r.status_code == 401
    r = httpx.put(
        cp.url + "/ratelimit/config",
        content=b"[1,2",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKENS['vera'][1]}"},
        timeout=5,
    )
    assert r.status_code == 403


def test_without_a_tokens_file_reads_stay_open_and_the_single_token_is_admin(redis_server, tmp_path):
    with ControlPlaneServer(redis_url=redis_server.url, rules_path=write_rules(tmp_path)) as cp:
        assert httpx.get(cp.url + "/v1/buckets", timeout=5).status_code == 200
        r = httpx.post(
            cp.url + "/ratelimit/rules/reload", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5
        )
        assert r.status_code == 200
        assert httpx.post(cp.url + "/ratelimit/rules/reload", timeout=5).status_code == 401


def test_a_token_added_to_the_file_works_without_a_restart(redis_server, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(tokens_text({"vera": TOKENS["vera"]}))
    with ControlPlaneServer(
        redis_url=redis_server.url, rules_path=write_rules(tmp_path), tokens_file=str(tokens)
    ) as cp:
        h = {"Authorization": f"Bearer {TOKENS['otto'][1]}"}
        assert httpx.get(cp.url + "/v1/routes", headers=h, timeout=5).status_code == 401
        tokens.write_text(tokens_text())
        wait_until(
            lambda: httpx.get(cp.url + "/v1/routes", headers=h, timeout=5).status_code == 200,
            5.0,
            0.1,
            "the new token to be accepted",
        )


def test_cli_with_a_viewer_token_reads_and_is_told_what_a_change_needs(role_servers, capsys):
    cp = role_servers["strict"]
    viewer = TOKENS["vera"][1]
    assert main(["routes", "--url", cp.url, "--token", viewer, "--json"]) == 0
    routes = json.loads(capsys.readouterr().out)["routes"]
    assert {r["name"] for r in routes} >= {"search", "login"}
    code = main(["mode", "search", "off", "--reason", "x", "--url", cp.url, "--token", viewer])
    err = capsys.readouterr().err
    assert code == 4
    assert "this needs the operator role; the token 'vera' has the viewer role" in err
    assert main(["routes", "--url", cp.url]) == 4
    assert "pass --token or set SHADOWLIMIT_TOKEN" in capsys.readouterr().err
