"""TLS and mutual TLS on ``shadowlimit serve``'s own ports, run as a user runs it: the HTTPS
API, a client without a valid certificate refused in the handshake whatever its token, the
accepted names, a certificate standing for a role (recorded as such in the audit), gRPC over
mutual TLS with ALPN h2, and the protocol versions and ciphers offered. Certificates are the
test PKI's, made by openssl."""

from __future__ import annotations

import hashlib
import socket
import ssl
import warnings
from pathlib import Path

import grpc
import httpx
import pytest
from cp_server import ADMIN_TOKEN, admin_headers, metric_value, write_rules
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from tls_served import TlsServed, client_ssl, grpc_channel

from control_plane.tls.files import read_certificates

ENVOY_CONFIG = """\
domain: edge
descriptors:
  - key: generic
    rate_limit: {unit: minute, requests_per_unit: 100}
"""


def _handshake(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def _refused(s: TlsServed, client: tuple[str, str] | None, token: str | None = ADMIN_TOKEN) -> str:
    """What a client presenting ``client`` meets on a route change: the error's kind."""
    headers = admin_headers(token) if token else {}
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)) as info:
        with s.http(client=client) as h:
            h.put("/v1/routes/search/mode", json={"mode": "shadow", "reason": "x", "force": True}, headers=headers)
    return type(info.value).__name__


def test_the_https_api_speaks_tls_12_and_13_only_and_refuses_cleartext(redis_url, test_pki, tmp_path):
    with TlsServed(redis_url, test_pki) as s:
        assert s.get("/healthz").json()["status"] == "ok"
        # cleartext sent to the TLS port: no answer in cleartext, and the port goes on serving
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{s.port}/healthz", timeout=3)
        assert s.get("/healthz").status_code == 200
        # TLS 1.2 with an ECDHE AEAD cipher of Mozilla's intermediate profile, ALPN http/1.1
        ctx = client_ssl(test_pki.ca_cert)
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        with _handshake(s.port, ctx) as tls:
            assert tls.version() == "TLSv1.2" and tls.selected_alpn_protocol() == "http/1.1"
            cipher = tls.cipher()[0]
            assert cipher.startswith("ECDHE-ECDSA-") and ("GCM" in cipher or "CHACHA" in cipher), cipher
        with _handshake(s.port, client_ssl(test_pki.ca_cert)) as tls:
            assert tls.version() == "TLSv1.3"
        # TLS 1.1, and a TLS 1.2 cipher outside the profile (CBC), are refused
        old = client_ssl(test_pki.ca_cert)
        with warnings.catch_warnings():  # deprecated versions, offered on purpose
            warnings.simplefilter("ignore", DeprecationWarning)
            old.minimum_version, old.maximum_version = ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1
        old.set_ciphers("ALL:@SECLEVEL=0")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _handshake(s.port, old).close()
        cbc = client_ssl(test_pki.ca_cert)
        cbc.maximum_version = ssl.TLSVersion.TLSv1_2
        cbc.set_ciphers("ECDHE-ECDSA-AES128-SHA256")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _handshake(s.port, cbc).close()
        metrics = s.get("/metrics").text
        expiry = metric_value(metrics, "rate_limit_tls_certificate_expiry_timestamp_seconds", port="http")
        assert expiry == read_certificates("cert", Path(test_pki.server_cert))[0].not_after


def test_mutual_tls_refuses_a_client_without_a_valid_certificate_whatever_its_token(redis_url, test_pki, tmp_path):
    env = {"SHADOWLIMIT_TLS_CLIENT_CA_FILE": test_pki.ca_cert, "RATE_LIMIT_RULES_PATH": str(write_rules(tmp_path))}
    s = TlsServed(redis_url, test_pki, env=env)
    s.client = (test_pki.client_cert, test_pki.client_key)
    with s:
        _refused(s, None)  # no certificate, the admin token
        _refused(s, (test_pki.other_client_cert, test_pki.other_client_key))  # another CA's
        with s.http(client=(test_pki.client_cert, test_pki.client_key)) as h:
            body = {"mode": "shadow", "reason": "over mutual TLS", "force": True}
            r = h.put("/v1/routes/search/mode", json=body, headers=admin_headers())
            assert r.status_code == 200, r.text
            assert h.put("/v1/routes/search/mode", json=body).status_code == 401  # the certificate is no token


def test_accepted_names_and_a_certificate_standing_for_a_role(redis_url, test_pki, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(
        "ops   operator cert:CN=shadowlimit test client   # a named operator's certificate\n"
        "edge  client   cert:DNS:envoy.internal\n"
        f"vera  viewer   {hashlib.sha256(b'vera-token').hexdigest()}\n"
    )
    env = {
        "SHADOWLIMIT_TLS_CLIENT_CA_FILE": test_pki.ca_cert,
        "SHADOWLIMIT_TLS_CLIENT_NAMES": "CN=shadowlimit test client, DNS:envoy.internal",
        "SHADOWLIMIT_TOKENS_FILE": str(tokens),
        "SHADOWLIMIT_ADMIN_TOKEN": "",
        "RATE_LIMIT_RULES_PATH": str(write_rules(tmp_path)),
    }
    ops = (test_pki.client_cert, test_pki.client_key)
    s = TlsServed(redis_url, test_pki, env=env)
    s.client = ops
    with s:
        body = {"mode": "shadow", "reason": "the operator's certificate", "force": True}
        with s.http(client=ops) as h:
            r = h.put("/v1/routes/search/mode", json=body)
            assert r.status_code == 200, r.text
        actor = r.json()["audit"]["actor"]
        assert actor == "ops@127.0.0.1 (certificate CN=shadowlimit test client)", actor
        with s.http(client=(test_pki.envoy_client_cert, test_pki.envoy_client_key)) as h:
            r = h.put("/v1/routes/search/mode", json=body)
            assert r.status_code == 403 and "the certificate 'DNS:envoy.internal' (edge)" in r.json()["message"]
            # a viewer's token still counts over a certificate that stands for nobody's role
            assert h.get("/v1/routes", headers={"Authorization": "Bearer vera-token"}).status_code == 200
        # a certificate from the CA with none of the accepted names: closed after its handshake
        _refused(s, (test_pki.wrong_host_cert, test_pki.wrong_host_key), token=None)
        with s.http(client=ops) as h:
            text = h.get("/metrics").text
        assert metric_value(text, "rate_limit_tls_clients_refused_total", port="http", reason="name") == 1


def test_grpc_over_mutual_tls_with_the_envoy_certificate_as_the_client(redis_url, test_pki, tmp_path):
    config = tmp_path / "envoy.yaml"
    config.write_text(ENVOY_CONFIG)
    tokens = tmp_path / "tokens"
    tokens.write_text("edge client cert:DNS:envoy.internal\n")
    env = {
        "SHADOWLIMIT_GRPC_TLS_CLIENT_CA_FILE": test_pki.ca_cert,  # mutual TLS on the gRPC port only
        "SHADOWLIMIT_CLIENT_TOKEN": "client-token-0123456789",
        "SHADOWLIMIT_TOKENS_FILE": str(tokens),
    }
    request = rls_pb2.RateLimitRequest(domain="edge")
    request.descriptors.add().entries.add(key="generic", value="a")

    def call(client: tuple[str, str] | None, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.StatusCode:
        with grpc_channel(s.grpc_port, test_pki.ca_cert, client) as channel:  # type: ignore[arg-type]
            try:
                rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=5, metadata=metadata)
            except grpc.RpcError as exc:
                return exc.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    with TlsServed(redis_url, test_pki, env=env, grpc_config=config) as s:
        assert call((test_pki.envoy_client_cert, test_pki.envoy_client_key)) is grpc.StatusCode.OK  # no token
        plain = (test_pki.client_cert, test_pki.client_key)
        assert call(plain) is grpc.StatusCode.UNAUTHENTICATED  # verified, but stands for no client
        assert call(plain, (("authorization", "Bearer client-token-0123456789"),)) is grpc.StatusCode.OK
        assert call((test_pki.other_client_cert, test_pki.other_client_key)) is grpc.StatusCode.UNAVAILABLE
        assert call(None) is grpc.StatusCode.UNAVAILABLE
        # ALPN h2 on the gRPC port; the HTTP port has no mutual TLS
        ctx = client_ssl(test_pki.ca_cert, (test_pki.envoy_client_cert, test_pki.envoy_client_key))
        ctx.set_alpn_protocols(["h2"])
        with _handshake(s.grpc_port, ctx) as tls:  # type: ignore[arg-type]
            assert tls.selected_alpn_protocol() == "h2"
        assert s.get("/healthz").status_code == 200


def test_serve_refuses_bad_tls_files_naming_the_setting_and_the_file(redis_url, test_pki):
    import subprocess

    from tls_served import SHADOWLIMIT

    s = TlsServed(redis_url, test_pki, cert=(test_pki.server_cert, test_pki.client_key))
    done = subprocess.run([str(SHADOWLIMIT), "serve"], env=s.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert f"SHADOWLIMIT_TLS_KEY_FILE: {test_pki.client_key}: is not the key of the certificate" in done.stderr
    assert "Traceback" not in done.stderr


def test_rotation_under_load_reaches_new_connections_and_fails_no_call(redis_url, test_pki, tmp_path):
    """The pair mounted as a kubelet mounts a Secret, swapped (one rename of ``..data``) while
    two clients open a new connection per call: new connections get the new certificate within
    seconds, a connection opened before keeps its own, a pair that does not match keeps the
    last good one (counted), and no call fails meanwhile."""
    import http.client
    import threading
    import time

    from podman import configmap_dir
    from support import eventually

    def pair(cert: str, key: str) -> dict[str, str]:
        return {"tls.crt": Path(cert).read_text(), "tls.key": Path(key).read_text()}

    tls = configmap_dir(tmp_path / "tls", pair(test_pki.server_cert, test_pki.server_key))
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(Path(test_pki.ca_cert).read_text() + Path(test_pki.other_ca_cert).read_text())
    ctx = client_ssl(str(bundle))

    def issuer(conn: http.client.HTTPSConnection) -> str:
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        return dict(rdn[0] for rdn in conn.sock.getpeercert()["issuer"])["commonName"]  # type: ignore[union-attr]

    seen: list[str] = []
    failures: list[str] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            conn = http.client.HTTPSConnection("localhost", s.port, context=ctx, timeout=5)
            try:
                seen.append(issuer(conn))
            except Exception as exc:  # noqa: BLE001 - every failure is the finding
                failures.append(repr(exc))
            finally:
                conn.close()

    s = TlsServed(redis_url, test_pki, cert=(str(tls / "tls.crt"), str(tls / "tls.key")))
    with s:
        kept = http.client.HTTPSConnection("localhost", s.port, context=ctx, timeout=5)
        assert issuer(kept) == "shadowlimit test CA"
        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            eventually(lambda: len(seen) > 20, 20, what="calls before the swap")
            configmap_dir(tls, pair(test_pki.other_server_cert, test_pki.other_server_key))
            swapped = time.monotonic()
            eventually(lambda: seen[-1] == "unrelated test CA", 10, what="the new certificate on new connections")
            took = time.monotonic() - swapped
            assert issuer(kept) == "shadowlimit test CA"  # open before the swap: still its own
            configmap_dir(tls, pair(test_pki.server_cert, test_pki.other_server_key))  # not a pair
            with s.http(ca=str(bundle)) as h:
                eventually(
                    lambda: metric_value(h.get("/metrics").text, "rate_limit_tls_reloads_total", port="http",
                                         result="error") == 1, 10, what="the bad pair refused")  # fmt: skip
                ok = metric_value(h.get("/metrics").text, "rate_limit_tls_reloads_total", port="http", result="ok")
            n = len(seen)
            eventually(lambda: len(seen) > n + 20, 20, what="calls after the bad pair")
        finally:
            stop.set()
            for t in threads:
                t.join(10)
            kept.close()
    assert failures == [] and ok == 1
    assert took < 3, took
    assert seen[-1] == "unrelated test CA"  # the last good pair serves on
    assert "new files not used, the old certificate stays" in s.stderr()
