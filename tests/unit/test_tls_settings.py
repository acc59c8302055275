"""TLS settings: every file that cannot serve is a startup error naming its setting and the
file (missing, a key that is not the certificate's, expired, a CA that is not a CA: ``serve``'s
check, ``check_tls``; the settings themselves read no file), pairs and client CAs go with a
port that has TLS, and listening beyond loopback needs TLS unless a mesh or proxy in front is
said to terminate it. Certificates from openssl (the test PKI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from control_plane.settings import SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[2]


def _load(**env: object) -> object:
    return load_settings(**{k.lower(): v for k, v in env.items()})


def _file_error(**env: object) -> str:
    """What ``serve``'s check says of these settings' files (they load: no file is read then)."""
    from control_plane.tls import TlsFileError, check_tls

    settings = _load(**env)
    with pytest.raises(TlsFileError) as info:
        check_tls(settings)  # type: ignore[arg-type]
    return str(info.value)


def _error(**env: object) -> str:
    with pytest.raises(SettingsError) as info:
        _load(**env)
    return str(info.value)


def test_a_port_serves_tls_with_a_good_pair(test_pki):
    s = _load(SHADOWLIMIT_TLS_CERT_FILE=test_pki.server_cert, SHADOWLIMIT_TLS_KEY_FILE=test_pki.server_key)
    http = s.port_tls("http")  # type: ignore[attr-defined]
    assert http is not None and http.cert_setting == "SHADOWLIMIT_TLS_CERT_FILE" and not http.mutual


def test_a_missing_file_names_the_setting_and_the_file(test_pki, tmp_path):
    missing = tmp_path / "nope.crt"
    msg = _file_error(SHADOWLIMIT_TLS_CERT_FILE=missing, SHADOWLIMIT_TLS_KEY_FILE=test_pki.server_key)
    assert f"SHADOWLIMIT_TLS_CERT_FILE: {missing}: no such file" in msg


def test_a_key_that_is_not_the_certificates(test_pki):
    msg = _file_error(SHADOWLIMIT_TLS_CERT_FILE=test_pki.server_cert, SHADOWLIMIT_TLS_KEY_FILE=test_pki.client_key)
    assert f"SHADOWLIMIT_TLS_KEY_FILE: {test_pki.client_key}: is not the key of the certificate" in msg
    assert test_pki.server_cert in msg


def test_an_expired_certificate(test_pki):
    msg = _file_error(
        SHADOWLIMIT_TLS_CERT_FILE=test_pki.expired_server_cert, SHADOWLIMIT_TLS_KEY_FILE=test_pki.expired_server_key
    )
    assert f"SHADOWLIMIT_TLS_CERT_FILE: {test_pki.expired_server_cert}: the certificate (CN=localhost) expired" in msg


def test_a_client_ca_that_is_not_a_ca(test_pki):
    msg = _file_error(
        SHADOWLIMIT_TLS_CERT_FILE=test_pki.server_cert,
        SHADOWLIMIT_TLS_KEY_FILE=test_pki.server_key,
        SHADOWLIMIT_TLS_CLIENT_CA_FILE=test_pki.client_cert,
    )
    assert f"SHADOWLIMIT_TLS_CLIENT_CA_FILE: {test_pki.client_cert}: CN=shadowlimit test client is not a CA" in msg


def test_a_file_that_is_not_pem(test_pki, tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    msg = _file_error(SHADOWLIMIT_TLS_CERT_FILE=test_pki.server_cert, SHADOWLIMIT_TLS_KEY_FILE=junk)
    assert f"SHADOWLIMIT_TLS_KEY_FILE: {junk}: holds no PEM private key" in msg


def test_half_a_pair_and_a_client_ca_without_tls(test_pki):
    assert "SHADOWLIMIT_TLS_KEY_FILE: needed with SHADOWLIMIT_TLS_CERT_FILE" in _error(
        SHADOWLIMIT_TLS_CERT_FILE=test_pki.server_cert
    )
    assert "SHADOWLIMIT_GRPC_TLS_CLIENT_CA_FILE: a client CA for a port without TLS" in _error(
        SHADOWLIMIT_GRPC_TLS_CLIENT_CA_FILE=test_pki.ca_cert
    )
    names = _error(
        SHADOWLIMIT_TLS_CERT_FILE=test_pki.server_cert,
        SHADOWLIMIT_TLS_KEY_FILE=test_pki.server_key,
        SHADOWLIMIT_TLS_CLIENT_NAMES="DNS:envoy.internal",
    )
    assert "SHADOWLIMIT_TLS_CLIENT_NAMES: names of client certificates for a port without mutual TLS" in names
    bad = _error(SHADOWLIMIT_TLS_CLIENT_NAMES="SPIFFE:envoy")
    assert "SHADOWLIMIT_TLS_CLIENT_NAMES: 'SPIFFE:envoy' is not a certificate name" in bad


def test_per_port_files_and_envoyproxy_ratelimits_names(test_pki):
    s = load_settings(
        tls_cert_file=test_pki.server_cert,
        tls_key_file=test_pki.server_key,
        GRPC_SERVER_TLS_CERT=test_pki.other_server_cert,
        GRPC_SERVER_TLS_KEY=test_pki.other_server_key,
        GRPC_CLIENT_TLS_CACERT=test_pki.ca_cert,
        GRPC_CLIENT_TLS_SAN="DNS:envoy.internal",
    )
    grpc, http = s.port_tls("grpc"), s.port_tls("http")
    assert grpc is not None and http is not None
    assert str(grpc.cert_file) == test_pki.other_server_cert and grpc.mutual
    assert grpc.client_names == ("DNS:envoy.internal",)
    assert str(http.cert_file) == test_pki.server_cert and not http.mutual


def test_beyond_loopback_without_tls_names_the_setting_that_allows_it(test_pki):
    remote = {"SHADOWLIMIT_HOST": "0.0.0.0", "SHADOWLIMIT_ALLOW_REMOTE": "true"}
    msg = _error(**remote)
    assert "the HTTP port has no TLS" in msg and "SHADOWLIMIT_TLS_TERMINATED_ELSEWHERE=true" in msg
    behind_a_mesh = _load(**remote, SHADOWLIMIT_TLS_TERMINATED_ELSEWHERE="true")
    assert behind_a_mesh.port_tls("http") is None  # type: ignore[attr-defined]
    own = _load(**remote, SHADOWLIMIT_TLS_CERT_FILE=test_pki.server_cert, SHADOWLIMIT_TLS_KEY_FILE=test_pki.server_key)
    assert own.port_tls("http") is not None  # type: ignore[attr-defined]


def test_the_grpc_port_in_cleartext_beside_an_https_api(test_pki):
    pair = {"SHADOWLIMIT_TLS_CERT_FILE": test_pki.server_cert, "SHADOWLIMIT_TLS_KEY_FILE": test_pki.server_key}
    s = _load(**pair, GRPC_SERVER_USE_TLS="false")
    assert s.port_tls("grpc") is None and s.port_tls("http") is not None  # type: ignore[attr-defined]
    remote = {"SHADOWLIMIT_HOST": "0.0.0.0", "SHADOWLIMIT_ALLOW_REMOTE": "true", "SHADOWLIMIT_GRPC_PORT": "9091"}
    grpc = {
        "SHADOWLIMIT_ENVOY_CONFIG": str(ROOT / "deploy/compose/config/envoy"),
        "ENABLE_DISTRIBUTED_RATE_LIMITING": "true",
    }
    msg = _error(**pair, **remote, **grpc, SHADOWLIMIT_GRPC_TLS="false")
    assert "the gRPC port has no TLS" in msg
    meshed = _load(**pair, **remote, **grpc, SHADOWLIMIT_GRPC_TLS="false", SHADOWLIMIT_TLS_TERMINATED_ELSEWHERE="true")
    assert meshed.port_tls("grpc") is None and meshed.port_tls("http") is not None  # type: ignore[attr-defined]


def test_names_as_certificates_are_matched(test_pki):
    """envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN is a bare host name; an IP address matches
    however it is written (OpenSSL writes IPv6 in full)."""
    from control_plane.tls.files import certificate_names
    from control_plane.tls.spec import split_names

    s = load_settings(
        tls_cert_file=test_pki.server_cert,
        tls_key_file=test_pki.server_key,
        GRPC_CLIENT_TLS_CACERT=test_pki.ca_cert,
        GRPC_CLIENT_TLS_SAN="envoy.internal",
        tls_client_names="IP:2001:db8:0::1, CN=team#1",
    )
    grpc = s.port_tls("grpc")
    assert grpc is not None and grpc.client_names == ("DNS:envoy.internal",)
    assert split_names(s.tls_client_names) == ("IP:2001:db8::1", "CN=team#1")
    peer = {"subject": ((("commonName", "x"),),), "subjectAltName": (("IP Address", "2001:DB8:0:0:0:0:0:1"),)}
    assert certificate_names(peer) == ("CN=x", "IP:2001:db8::1")
