"""``/v1/authz`` (forward-auth), directly and behind the real proxies from Debian: nginx
(``auth_request``) and Caddy (``forward_auth``) on loopback in front of a small upstream
app. Under enforce the client gets 429 + Retry-After from the proxy after the limit and the
upstream never sees the rejected requests; under shadow every request reaches it and the
divergence is counted."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cp_server import ControlPlaneServer, admin_headers, free_port, wait_until, write_rules
from support import installed_binary
from tls_served import TlsServed

from limiter.embedded.tls import TestPki

pytestmark = pytest.mark.timeout(90)

RULES = """\
version: 1
routes:
  - name: gw
    match: {path: /gw/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 100, period: 1s, burst: 100}
    distributed: {average: 3, period: 60s, burst: 3}
  - name: byip
    match: {path: /ip/**}
    local: {average: 1, period: 60s, burst: 1}
    distributed: {average: 1, period: 60s, burst: 1}
"""


def set_mode(cp: ControlPlaneServer, route: str, mode: str) -> None:
    r = httpx.put(
        f"{cp.url}/v1/routes/{route}/mode",
        json={"mode": mode, "reason": "authz test", "force": True},
        headers=admin_headers(),
        timeout=10,
    )
    assert r.status_code == 200, r.text


@pytest.fixture
def cp(redis_url, tmp_path) -> Iterator[ControlPlaneServer]:
    with ControlPlaneServer(redis_url=redis_url, rules_path=write_rules(tmp_path, RULES)) as server:
        yield server


def ask(cp: ControlPlaneServer, uri: str, client: str = "c1", **headers: str) -> httpx.Response:
    h = {"X-Forwarded-Method": "GET", "X-Forwarded-Uri": uri, "X-Client-Id": client, **headers}
    return httpx.get(f"{cp.url}/v1/authz", headers=h, timeout=10)


# --------------------------------------------------------------------------- #
# the endpoint itself
# --------------------------------------------------------------------------- #


def test_enforce_allows_then_rejects_with_retry_after_and_the_seed_body(cp):
    set_mode(cp, "gw", "enforce")
    answers = [ask(cp, "/gw/items?page=2") for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert answers[0].content == b"" and answers[0].headers["x-ratelimit-remaining"] == "2"
    last = answers[3]
    assert int(last.headers["retry-after"]) >= 1 and last.headers["x-ratelimit-remaining"] == "0"
    body = last.json()
    assert body["error"] == "rate limit exceeded" and body["route"] == "gw" and body["enforced_by"] == "distributed"
    # nginx: every rejection as 403
    assert (
        httpx.get(
            f"{cp.url}/v1/authz?deny_status=403",
            headers={"X-Original-Method": "GET", "X-Original-URI": "/gw/x", "X-Client-Id": "c1"},
            timeout=10,
        ).status_code
        == 403
    )
    assert ask(cp, "/gw/items", client="c2").status_code == 200  # another client has its own bucket


def test_shadow_always_allows(cp):
    set_mode(cp, "gw", "shadow")
    assert {ask(cp, "/gw/a").status_code for _ in range(6)} == {200}


def test_bad_descriptions_name_the_header(cp):
    r = httpx.get(f"{cp.url}/v1/authz", headers={"X-Forwarded-Uri": "/gw/a"}, timeout=10)
    assert r.status_code == 400 and r.json()["field"] == "header:X-Forwarded-Method"
    r = httpx.get(f"{cp.url}/v1/authz", headers={"X-Forwarded-Method": "GET"}, timeout=10)
    assert r.status_code == 400 and r.json()["field"] == "header:X-Forwarded-Uri"
    r = ask(cp, "not-a-path")
    assert r.status_code == 400 and r.json()["field"] == "header:X-Forwarded-Uri"
    r = httpx.get(f"{cp.url}/v1/authz", headers={"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/gw/a"}, timeout=10)
    assert r.status_code == 422 and r.json()["field"] == "header:X-Client-Id"  # the route's key header


def test_forwarded_for_counts_only_from_a_trusted_proxy(redis_url, tmp_path):
    rules = write_rules(tmp_path, RULES)
    for trusted, expected in (("", [200, 429]), ("127.0.0.1", [200, 200])):
        with ControlPlaneServer(redis_url=redis_url, rules_path=rules, trusted_proxies=trusted) as server:
            set_mode(server, "byip", "enforce")
            codes = [
                ask(server, "/ip/x", **{"X-Forwarded-For": addr}).status_code
                for addr in ("198.51.100.1", "198.51.100.2")
            ]
            assert codes == expected, trusted


# --------------------------------------------------------------------------- #
# behind real proxies
# --------------------------------------------------------------------------- #


class Upstream:
    """A tiny app behind the proxy that counts what reaches it."""

    def __init__(self) -> None:
        self.seen = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.seen += 1
                body = b"upstream ok"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Upstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def nginx_conf(port: int, cp_port: int, upstream: int, prefix: Path, tls: TestPki | None = None) -> str:
    """nginx's auth_request to the control plane; with ``tls``, over HTTPS with the test PKI's
    client certificate, the server's checked against its CA and name."""
    scheme, ssl = "http", ""
    if tls is not None:
        scheme = "https"
        ssl = f"""
      proxy_ssl_certificate {tls.client_cert};
      proxy_ssl_certificate_key {tls.client_key};
      proxy_ssl_trusted_certificate {tls.ca_cert};
      proxy_ssl_verify on;
      proxy_ssl_name localhost;
      proxy_ssl_server_name on;
      proxy_ssl_protocols TLSv1.2 TLSv1.3;"""
    return f"""
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/body; proxy_temp_path {prefix}/proxy; fastcgi_temp_path {prefix}/fcgi;
  uwsgi_temp_path {prefix}/uwsgi; scgi_temp_path {prefix}/scgi;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      auth_request /_shadowlimit;
      auth_request_set $retry_after $upstream_http_retry_after;
      error_page 403 = @rate_limited;
      proxy_pass http://127.0.0.1:{upstream};
    }}
    location = /_shadowlimit {{
      internal;
      proxy_pass {scheme}://127.0.0.1:{cp_port}/v1/authz?deny_status=403;{ssl}
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
      proxy_set_header X-Original-Method $request_method;
      proxy_set_header X-Original-URI $request_uri;
    }}
    location @rate_limited {{
      add_header Retry-After $retry_after always;
      return 429;
    }}
  }}
}}
"""


def caddyfile(port: int, cp_port: int, upstream: int, tls: TestPki | None = None) -> str:
    """Caddy's forward_auth to the control plane; with ``tls``, over HTTPS with the test PKI's
    client certificate, the server's checked against its CA and name."""
    transport = ""
    if tls is not None:
        transport = f"""
    transport http {{
      tls
      tls_client_auth {tls.client_cert} {tls.client_key}
      tls_trusted_ca_certs {tls.ca_cert}
      tls_server_name localhost
    }}"""
    return f"""{{
  admin off
  auto_https off
}}
http://127.0.0.1:{port} {{
  bind 127.0.0.1
  forward_auth 127.0.0.1:{cp_port} {{
    uri /v1/authz{transport}
  }}
  reverse_proxy 127.0.0.1:{upstream}
}}
"""


def start_proxy(
    kind: str, cp: Any, upstream: Upstream, tmp_path: Path, tls: TestPki | None = None
) -> tuple[subprocess.Popen, int]:
    port = free_port()
    if kind == "nginx":
        prefix = tmp_path / "nginx"
        prefix.mkdir()
        conf = prefix / "nginx.conf"
        conf.write_text(nginx_conf(port, cp.port, upstream.port, prefix, tls))
        argv = [installed_binary("nginx"), "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"]
        env = dict(os.environ)
    else:
        conf = tmp_path / "Caddyfile"
        conf.write_text(caddyfile(port, cp.port, upstream.port, tls))
        argv = [installed_binary("caddy"), "run", "--config", str(conf), "--adapter", "caddyfile"]
        env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def up() -> bool:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else kind
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz-probe", timeout=1)
            return True
        except httpx.HTTPError:
            return False

    assert wait_until(up, 20.0, 0.1, f"{kind} to listen")
    return proc, port


@pytest.mark.parametrize("kind", ["nginx", "caddy"])
def test_behind_a_real_proxy(cp, tmp_path, kind):
    with Upstream() as upstream:
        proc, port = start_proxy(kind, cp, upstream, tmp_path)
        try:
            base = f"http://127.0.0.1:{port}"
            upstream.seen = 0
            set_mode(cp, "gw", "enforce")
            codes = []
            for _ in range(5):
                r = httpx.get(f"{base}/gw/items", headers={"X-Client-Id": f"{kind}-enforce"}, timeout=10)
                codes.append(r.status_code)
            assert codes == [200, 200, 200, 429, 429], codes
            assert int(r.headers["retry-after"]) >= 1  # passed through by the proxy
            assert upstream.seen == 3  # the rejected requests never reached the app
            # shadow: everything reaches the app, the divergence is counted
            set_mode(cp, "gw", "shadow")
            upstream.seen = 0
            for _ in range(6):
                r = httpx.get(f"{base}/gw/items", headers={"X-Client-Id": f"{kind}-shadow"}, timeout=10)
                assert r.status_code == 200 and r.text == "upstream ok"
            assert upstream.seen == 6
            cp.settle()

            def new_rejections() -> int:
                r = httpx.get(f"{cp.url}/v1/divergence", headers=admin_headers(), timeout=10)
                return (
                    r.json()["routes"]["gw"]["totals"]["local_allow_distributed_deny"] if r.status_code == 200 else -1
                )

            # 2 compared under enforce (local allowed, Redis denied) + 3 of the 6 shadowed requests
            assert wait_until(lambda: new_rejections() >= 5, 15.0, 0.2, "the shadow divergence to be counted")
            assert new_rejections() == 5
        finally:
            proc.terminate()
            proc.wait(10)


@pytest.mark.parametrize("kind", ["nginx", "caddy"])
def test_behind_a_real_proxy_over_mutual_tls(redis_url, test_pki, tmp_path, kind):
    """The proxy's auth subrequest reaches ``serve``'s HTTPS API with a client certificate
    (mutual TLS required there): enforce limits through it as over cleartext."""
    env = {
        "SHADOWLIMIT_TLS_CLIENT_CA_FILE": test_pki.ca_cert,
        "RATE_LIMIT_RULES_PATH": str(write_rules(tmp_path, RULES)),
        "ENABLE_DISTRIBUTED_RATE_LIMITING": "true",
    }
    served = TlsServed(redis_url, test_pki, env=env)
    served.client = (test_pki.client_cert, test_pki.client_key)
    with served, Upstream() as upstream:
        with served.http(client=served.client) as api:
            r = api.put("/v1/routes/gw/mode", json={"mode": "enforce", "reason": "tls", "force": True},
                        headers=admin_headers())  # fmt: skip
            assert r.status_code == 200, r.text
        proc, port = start_proxy(kind, served, upstream, tmp_path, tls=test_pki)
        upstream.seen = 0  # the proxy's readiness probe reached it
        try:
            codes = [
                httpx.get(f"http://127.0.0.1:{port}/gw/items", headers={"X-Client-Id": kind}, timeout=10).status_code
                for _ in range(5)
            ]
            assert codes == [200, 200, 200, 429, 429], codes
            assert upstream.seen == 3
        finally:
            proc.terminate()
            proc.wait(10)
