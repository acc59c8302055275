"""RedisLimiter over managed-Redis connections, against real servers: TLS verified with a
CA made at run time, mutual TLS, a certificate for another host or from another CA
refused (never a fall back to plain text), ACL users and passwords (a wrong one is a
:class:`BackendAuthError` that does not carry the password)."""

from __future__ import annotations

import asyncio
from urllib.parse import quote

import pytest

from limiter import BackendAuthError, BackendUnavailable, Policy, RedisLimiter
from limiter.embedded import EmbeddedRedis, TestPki, TlsServerConfig

pytestmark = pytest.mark.timeout(60)

PASSWORD = "Tr1cky pa$$:word/@"  # every character a URL must quote
POLICY = Policy(average=5, period=60, burst=5)


def tls_url(server: EmbeddedRedis, pki: TestPki, *, user: str | None = None, client_cert: bool = False) -> str:
    """The server's rediss URL for shadowlimit's client, trusting the test CA."""
    login = f"{quote(user, safe='')}:{quote(PASSWORD, safe='')}@" if user else ""
    query = f"ssl_ca_certs={quote(pki.ca_cert)}"
    if client_cert:
        query += f"&ssl_certfile={quote(pki.client_cert)}&ssl_keyfile={quote(pki.client_key)}"
    return f"rediss://{login}127.0.0.1:{server.port}/0?{query}"


async def five_then_denied(url: str, key: str) -> list[bool]:
    rl = RedisLimiter.from_url(url, namespace="tls", connect_timeout=3, command_timeout=3)
    try:
        return [(await rl.check(key, POLICY)).allowed for _ in range(6)]
    finally:
        await rl.aclose()


async def refusal(url: str) -> str:
    rl = RedisLimiter.from_url(url, namespace="tls", connect_timeout=3, command_timeout=3)
    try:
        with pytest.raises(BackendUnavailable) as exc:
            await rl.check("k", POLICY)
        return str(exc.value)
    finally:
        await rl.aclose()


@pytest.fixture(scope="module")
def tls_acl_server(test_pki: TestPki):
    """TLS (client certificates optional) with an ACL user ``app``."""
    server = EmbeddedRedis(tls=test_pki.server_config(client_auth="optional"), acl_users=[("app", PASSWORD)])
    server.start()
    yield server
    server.stop()


def test_tls_with_the_right_ca_and_an_acl_user(tls_acl_server, test_pki):
    assert asyncio.run(five_then_denied(tls_url(tls_acl_server, test_pki, user="app"), "ok")) == [True] * 5 + [False]


def test_a_wrong_password_is_a_login_error_without_the_password(tls_acl_server, test_pki):
    url = tls_url(tls_acl_server, test_pki, user="app").replace(quote(PASSWORD, safe=""), "not-it")

    async def go() -> str:
        rl = RedisLimiter.from_url(url, namespace="tls", connect_timeout=3)
        try:
            with pytest.raises(BackendAuthError) as exc:
                await rl.ping()
            return str(exc.value)
        finally:
            await rl.aclose()

    msg = asyncio.run(go())
    assert "refused the login" in msg and "WRONGPASS" in msg
    assert "not-it" not in msg and PASSWORD not in msg


def test_no_login_is_a_login_error_too(tls_acl_server, test_pki):
    async def go() -> str:
        rl = RedisLimiter.from_url(tls_url(tls_acl_server, test_pki), namespace="tls", connect_timeout=3)
        try:
            with pytest.raises(BackendAuthError) as exc:
                await rl.check("k", POLICY)
            return str(exc.value)
        finally:
            await rl.aclose()

    assert "needs a login (NOAUTH" in asyncio.run(go())


def test_a_certificate_from_another_ca_is_refused(test_pki):
    other = TlsServerConfig(
        cert_file=test_pki.other_server_cert, key_file=test_pki.other_server_key, ca_cert_file=test_pki.other_ca_cert
    )
    with EmbeddedRedis(tls=other) as server:
        msg = asyncio.run(refusal(tls_url(server, test_pki)))
        assert f"127.0.0.1:{server.port}" in msg
    assert "certificate verify failed" in msg


def test_a_certificate_for_another_host_is_refused(test_pki):
    wrong = TlsServerConfig(
        cert_file=test_pki.wrong_host_cert,
        key_file=test_pki.wrong_host_key,
        ca_cert_file=test_pki.ca_cert,
        check_hostname=False,  # the launcher's own readiness probe only
    )
    with EmbeddedRedis(tls=wrong) as server:
        msg = asyncio.run(refusal(tls_url(server, test_pki)))
        assert "certificate verify failed" in msg and "127.0.0.1" in msg
        # explicitly turning the name check off is the only way to use it
        loose = tls_url(server, test_pki) + "&ssl_check_hostname=false"
        assert asyncio.run(five_then_denied(loose, "loose")) == [True] * 5 + [False]


def test_plain_text_to_a_tls_port_fails_and_tls_to_a_plain_port_fails(tls_acl_server, test_pki, redis_server):
    plain = f"redis://app:{quote(PASSWORD, safe='')}@127.0.0.1:{tls_acl_server.port}/0"
    assert "127.0.0.1" in asyncio.run(refusal(plain))
    # TLS to a plain-text server: the handshake fails; nothing is sent in clear
    assert "127.0.0.1" in asyncio.run(
        refusal(f"rediss://127.0.0.1:{redis_server.port}/0?ssl_ca_certs={test_pki.ca_cert}")
    )


def test_mutual_tls_needs_the_client_certificate(test_pki):
    with EmbeddedRedis(tls=test_pki.server_config(client_auth="yes")) as server:
        asyncio.run(refusal(tls_url(server, test_pki)))  # no client certificate: the handshake is refused
        assert asyncio.run(five_then_denied(tls_url(server, test_pki, client_cert=True), "mtls")) == [True] * 5 + [
            False
        ]


def test_a_missing_ca_file_is_an_error_naming_the_option(tmp_path):
    with pytest.raises(ValueError, match="ssl_ca_certs: cannot use"):
        RedisLimiter.from_url(f"rediss://127.0.0.1:1/0?ssl_ca_certs={tmp_path / 'nope.pem'}")


def test_sentinel_over_tls_with_logins_on_both_sides(test_pki):
    """rediss+sentinel: TLS to the sentinels and to the data nodes, an ACL user on the data
    nodes and the sentinels' own password."""
    from limiter.embedded import EmbeddedSentinelSet

    with EmbeddedSentinelSet(
        replicas=1,
        tls=test_pki.server_config(client_auth="optional"),
        acl_users=[("app", PASSWORD)],
        sentinel_password="sentinel-pw",
    ) as sentinels:
        hosts = ",".join(f"{h}:{p}" for h, p in sentinels.sentinel_addresses)
        url = (
            f"rediss+sentinel://app:{quote(PASSWORD, safe='')}@{hosts}/{sentinels.master_name}"
            f"?ssl_ca_certs={quote(test_pki.ca_cert)}&sentinel_password=sentinel-pw"
        )
        assert asyncio.run(five_then_denied(url, "sentinel-tls")) == [True] * 5 + [False]
        # the sentinels' password is checked too
        wrong = url.replace("sentinel_password=sentinel-pw", "sentinel_password=nope")

        async def login_error() -> str:
            rl = RedisLimiter.from_url(wrong, namespace="tls", connect_timeout=3)
            try:
                with pytest.raises(BackendAuthError) as exc:  # serve stops at startup on it
                    await rl.ping()
                return str(exc.value)
            finally:
                await rl.aclose()

        msg = asyncio.run(login_error())
        assert "no sentinel named a master" in msg and "WRONGPASS" in msg and "nope" not in msg
