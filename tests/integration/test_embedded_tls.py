"""limiter.embedded with TLS, passwords and ACL users: real redis-server processes, loopback only.

Certificates come from ``make_test_pki`` (the ``openssl`` binary); a missing ``openssl`` or a
redis-server built without TLS makes these tests fail loudly, never skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from support import eventually

from limiter.embedded import (
    EmbeddedRedis,
    EmbeddedRedisError,
    TestPki,
    TlsServerConfig,
    make_test_pki,
)
from limiter.embedded import tls as tls_module

PROJECT_ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


def bare_client(server: EmbeddedRedis, **kwargs: Any) -> redis.Redis:
    """A client that knows only the address (no TLS options, no credentials) plus ``kwargs``."""
    return redis.Redis(
        host=server.host,
        port=server.port,
        socket_connect_timeout=2,
        socket_timeout=2,
        retry=Retry(NoBackoff(), 0),
        **kwargs,
    )


# --------------------------------------------------------------------------- #
# the test PKI
# --------------------------------------------------------------------------- #


def test_make_test_pki_is_idempotent(tmp_path: Path) -> None:
    first = make_test_pki(tmp_path)
    files = [Path(getattr(first, name)) for name in first.__dataclass_fields__ if name != "directory"]
    assert all(f.is_file() for f in files)
    assert all(os.stat(f).st_mode & 0o077 == 0 for f in files if f.suffix == ".key")
    stamps = {f: f.stat().st_mtime_ns for f in files}
    second = make_test_pki(str(tmp_path))
    assert second == first
    assert {f: f.stat().st_mtime_ns for f in files} == stamps
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", first.ca_cert, first.server_cert, first.client_cert, first.wrong_host_cert],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0, verify.stderr
    other = subprocess.run(
        ["openssl", "verify", "-CAfile", first.ca_cert, first.other_server_cert], capture_output=True
    )
    assert other.returncode != 0


def test_openssl_failures_carry_its_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tls_module, "_OPENSSL_CONFIG", "[req\nthis is not a config\n")
    with pytest.raises(EmbeddedRedisError, match="openssl req failed") as info:
        make_test_pki(tmp_path)
    _, _, stderr = str(info.value).partition("\n")
    assert stderr.strip(), "the error should carry openssl's own message"


def test_missing_openssl_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    with pytest.raises(EmbeddedRedisError, match="apt-get install openssl"):
        make_test_pki(tmp_path)


# --------------------------------------------------------------------------- #
# TLS
# --------------------------------------------------------------------------- #


def test_tls_server_answers_ping_with_the_test_ca(pki: TestPki) -> None:
    with EmbeddedRedis(tls=pki.server_config()) as srv:
        assert srv.url == f"rediss://127.0.0.1:{srv.port}/0"
        client = redis.Redis.from_url(srv.url, ssl_ca_certs=pki.ca_cert, socket_timeout=2)
        assert client.ping() is True
        assert client.config_get("port")["port"] == "0"
        assert client.config_get("tls-port")["tls-port"] == str(srv.port)
        client.close()
        own = srv.client(decode_responses=True)
        own.set("k", "over tls")
        assert own.get("k") == "over tls"
        own.close()
        # kill + start and restart keep the address and keep serving TLS
        port = srv.port
        srv.kill()
        srv.start()
        srv.restart()
        assert srv.port == port
        again = redis.Redis.from_url(srv.url, ssl_ca_certs=pki.ca_cert, socket_timeout=2)
        assert again.ping() is True
        again.close()


def test_tls_server_refuses_a_plain_text_client(pki: TestPki) -> None:
    with EmbeddedRedis(tls=pki.server_config()) as srv:
        plain = bare_client(srv)
        with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
            plain.ping()
        plain.close()


def test_client_refuses_a_server_certificate_from_another_ca(pki: TestPki) -> None:
    config = TlsServerConfig(
        cert_file=pki.other_server_cert, key_file=pki.other_server_key, ca_cert_file=pki.other_ca_cert
    )
    with EmbeddedRedis(tls=config) as srv:  # the launcher itself trusts the other CA
        trusting_ours = bare_client(srv, ssl=True, ssl_ca_certs=pki.ca_cert)
        with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            trusting_ours.ping()
        trusting_ours.close()


def test_client_refuses_a_certificate_for_another_host_name(pki: TestPki) -> None:
    config = TlsServerConfig(
        cert_file=pki.wrong_host_cert, key_file=pki.wrong_host_key, ca_cert_file=pki.ca_cert, check_hostname=False
    )
    with EmbeddedRedis(tls=config) as srv:
        checking = bare_client(srv, ssl=True, ssl_ca_certs=pki.ca_cert)
        with pytest.raises(redis.ConnectionError, match="match|mismatch"):
            checking.ping()
        checking.close()
        not_checking = bare_client(srv, ssl=True, ssl_ca_certs=pki.ca_cert, ssl_check_hostname=False)
        assert not_checking.ping() is True  # same chain, only the name differs
        not_checking.close()


def test_mutual_tls_requires_a_client_certificate_from_the_ca(pki: TestPki) -> None:
    with EmbeddedRedis(tls=pki.server_config(client_auth="yes")) as srv:
        assert srv.client().ping() is True  # the launcher presents the test client certificate
        no_cert = bare_client(srv, ssl=True, ssl_ca_certs=pki.ca_cert)
        with pytest.raises(redis.ConnectionError):
            no_cert.ping()
        no_cert.close()
        foreign_cert = bare_client(
            srv,
            ssl=True,
            ssl_ca_certs=pki.ca_cert,
            ssl_certfile=pki.other_server_cert,
            ssl_keyfile=pki.other_server_key,
        )
        with pytest.raises(redis.ConnectionError):
            foreign_cert.ping()
        foreign_cert.close()
        with_cert = bare_client(
            srv, ssl=True, ssl_ca_certs=pki.ca_cert, ssl_certfile=pki.client_cert, ssl_keyfile=pki.client_key
        )
        assert with_cert.ping() is True
        with_cert.close()


def test_optional_client_auth_accepts_clients_without_a_certificate(pki: TestPki) -> None:
    with EmbeddedRedis(tls=pki.server_config(client_auth="optional")) as srv:
        no_cert = bare_client(srv, ssl=True, ssl_ca_certs=pki.ca_cert)
        assert no_cert.ping() is True
        no_cert.close()


def test_tls_is_refused_on_a_unix_socket(pki: TestPki) -> None:
    with pytest.raises(EmbeddedRedisError, match="unix_socket"):
        EmbeddedRedis(unix_socket=True, tls=pki.server_config())


# --------------------------------------------------------------------------- #
# passwords and ACL users
# --------------------------------------------------------------------------- #


def test_password_protects_the_default_user() -> None:
    with EmbeddedRedis(password="pa ss:w@rd") as srv:
        assert srv.url == f"redis://:pa%20ss%3Aw%40rd@127.0.0.1:{srv.port}/0"
        client = redis.Redis.from_url(srv.url, decode_responses=True)
        assert client.ping() is True
        assert client.acl_whoami() == "default"
        client.close()
        with pytest.raises(redis.AuthenticationError):
            bare_client(srv).ping()
        with pytest.raises(redis.AuthenticationError):
            bare_client(srv, password="wrong").ping()


def test_acl_user_logs_in_and_a_wrong_password_is_refused() -> None:
    users = [("app", "s3cret/@:%"), ("reporter", "other")]
    with EmbeddedRedis(acl_users=users) as srv:
        assert srv.url == f"redis://app:s3cret%2F%40%3A%25@127.0.0.1:{srv.port}/0"
        client = redis.Redis.from_url(srv.url, decode_responses=True)
        assert client.acl_whoami() == "app"
        client.set("k", "v")
        client.close()
        reporter = bare_client(srv, username="reporter", password="other", decode_responses=True)
        assert reporter.get("k") == "v"
        reporter.close()
        with pytest.raises(redis.AuthenticationError):
            bare_client(srv, username="app", password="wrong").ping()
        with pytest.raises(redis.AuthenticationError):  # the default user is switched off
            bare_client(srv).ping()
        # the login survives an outage
        srv.kill()
        srv.start()
        again = srv.client()
        assert again.acl_whoami() == "app"
        again.close()


def test_acl_users_are_validated() -> None:
    with pytest.raises(EmbeddedRedisError, match="user name"):
        EmbeddedRedis(acl_users=[("has space", "pw")])
    with pytest.raises(EmbeddedRedisError, match="user name"):
        EmbeddedRedis(acl_users=[("default", "pw")])
    with pytest.raises(EmbeddedRedisError, match="line breaks"):
        EmbeddedRedis(acl_users=[("app", "two\nlines")])
    with pytest.raises(EmbeddedRedisError, match="managed"):
        EmbeddedRedis(extra_config={"requirepass": "sneaky"})


def test_replica_of_a_tls_acl_master_syncs(pki: TestPki) -> None:
    kwargs = {"tls": pki.server_config(client_auth="yes"), "acl_users": [("app", "s3cret")]}
    with EmbeddedRedis(**kwargs) as master:
        assert master.port is not None
        with EmbeddedRedis(replica_of=(master.host, master.port), **kwargs) as replica:
            writer = master.client(decode_responses=True)
            reader = replica.client(decode_responses=True)
            writer.set("replicated", "yes")
            assert eventually(lambda: reader.get("replicated") == "yes", 10, what="the replica to sync")
            info = reader.info("replication")
            assert info["role"] == "slave" and info["master_link_status"] == "up"
            assert int(info["master_port"]) == master.port
            writer.close()
            reader.close()


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #


def test_cli_serves_tls_with_a_password(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "limiter.embedded", "--tls", str(tmp_path / "pki"), "--password", "pw"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=PROJECT_ROOT,
        env=env,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("rediss://:pw@127.0.0.1:"), proc.stderr.read() if proc.stderr else url
        client = redis.Redis.from_url(url, ssl_ca_certs=str(tmp_path / "pki" / "ca.crt"), socket_timeout=2)
        assert client.ping() is True
        client.close()
        proc.terminate()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
