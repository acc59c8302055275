"""``shadowlimit serve`` on every kind of Redis URL (TLS + ACL, a password file, Sentinel,
a cluster with replicas over TLS): it starts, decides through Redis, and ``/v1/backend``
says which kind, where the master is and whether TLS is on, never the password. A wrong
password, a missing CA file or a TLS option on a plain URL stop it at startup (exit 2),
naming the setting and not the password."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from conftest import MANAGED_PASSWORD
from cp_server import ADMIN_TOKEN, admin_headers, clean_env, free_port, wait_until, write_rules

SHADOWLIMIT = Path(sys.executable).parent / "shadowlimit"
RULES = """\
version: 1
routes:
  - name: api
    match: {path: /api/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 100, period: 1s, burst: 100}
    distributed: {average: 3, period: 60s, burst: 3}
"""

pytestmark = pytest.mark.timeout(120)


def env_for(url: str, **extra: str) -> dict[str, str]:
    env = clean_env()
    env.update(
        RATE_LIMIT_REDIS_URL=url,
        SHADOWLIMIT_PORT=str(free_port()),
        SHADOWLIMIT_ADMIN_TOKEN=ADMIN_TOKEN,
        ENABLE_DISTRIBUTED_RATE_LIMITING="true",
        **extra,
    )
    return env


def serve_and_check(env: dict[str, str], tmp_path: Path, kind: str) -> dict:
    """Start serve, put the route in enforce, decide 4 times (3 allowed by Redis, then
    denied), return /v1/backend's topology."""
    env["RATE_LIMIT_RULES_PATH"] = str(write_rules(tmp_path, RULES))
    base = f"http://127.0.0.1:{env['SHADOWLIMIT_PORT']}"
    proc = subprocess.Popen(
        [str(SHADOWLIMIT), "serve", "--log-level", "info"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert wait_until(
            lambda: proc.poll() is None and httpx.get(base + "/readyz", timeout=1).status_code == 200,
            40.0,
            0.2,
            f"serve on {kind} to be ready",
        )
        r = httpx.put(
            base + "/v1/routes/api/mode",
            json={"mode": "enforce", "reason": kind, "force": True},
            headers=admin_headers(),
            timeout=10,
        )
        assert r.status_code == 200, r.text
        answers = [
            httpx.post(base + "/v1/decide", json={"route": "api", "key": "one"}, timeout=10).json() for _ in range(4)
        ]
        assert [(a["allowed"], a["enforced_by"]) for a in answers] == [(True, "distributed")] * 3 + [
            (False, "distributed")
        ]
        backend = httpx.get(base + "/v1/backend", headers=admin_headers(), timeout=10)
        assert MANAGED_PASSWORD not in backend.text and quote(MANAGED_PASSWORD, safe="") not in backend.text
        return backend.json()["redis_topology"]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        text = err.decode()
        assert MANAGED_PASSWORD not in text and quote(MANAGED_PASSWORD, safe="") not in text
        assert "Traceback" not in text


def test_serve_tls_acl_with_a_password_file(redis_tls_acl, test_pki, tmp_path):
    secret = tmp_path / "redis-password"
    secret.write_text(MANAGED_PASSWORD + "\n")
    env = env_for(
        f"rediss://app@127.0.0.1:{redis_tls_acl.port}/0",
        RATE_LIMIT_REDIS_PASSWORD_FILE=str(secret),
        RATE_LIMIT_REDIS_TLS_CA_CERTS=test_pki.ca_cert,
    )
    topo = serve_and_check(env, tmp_path, "tls+acl")
    assert topo["kind"] == "standalone" and topo["master"] == f"127.0.0.1:{redis_tls_acl.port}"
    assert topo["tls"] == {
        "verify": "required",
        "check_hostname": True,
        "ca_certs": test_pki.ca_cert,
        "client_certificate": False,
    }
    assert topo["username"] == "app" and topo["password"] == "set"


def test_serve_sentinel(redis_sentinels, tmp_path):
    hosts = ",".join(f"{h}:{p}" for h, p in redis_sentinels.sentinel_addresses)
    url = f"redis+sentinel://app:{quote(MANAGED_PASSWORD, safe='')}@{hosts}/{redis_sentinels.master_name}"
    topo = serve_and_check(env_for(url + "?sentinel_password="), tmp_path, "sentinel")
    host, port = redis_sentinels.master_address()
    assert topo["kind"] == "sentinel" and topo["master"] == f"{host}:{port}" and topo["tls"] is None
    assert topo["service_name"] == redis_sentinels.master_name and len(topo["sentinels"]) == 3


def test_serve_cluster_over_tls(redis_cluster_tls_acl, test_pki, tmp_path):
    hosts = ",".join(f"{h}:{p}" for h, p in redis_cluster_tls_acl.nodes)
    url = f"rediss+cluster://app:{quote(MANAGED_PASSWORD, safe='')}@{hosts}?ssl_ca_certs={quote(test_pki.ca_cert)}"
    topo = serve_and_check(env_for(url), tmp_path, "cluster")
    assert topo["kind"] == "cluster" and topo["tls"]["verify"] == "required"
    assert len(topo["masters"]) == 3 and sum(m["slots"] for m in topo["masters"]) == 16384


def refused(env: dict[str, str]) -> str:
    proc = subprocess.run([str(SHADOWLIMIT), "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr


def test_a_wrong_password_stops_serve_without_printing_it(redis_tls_acl, test_pki):
    url = f"rediss://app:not-the-password@127.0.0.1:{redis_tls_acl.port}/0?ssl_ca_certs={quote(test_pki.ca_cert)}"
    err = refused(env_for(url))
    assert "RATE_LIMIT_REDIS_URL" in err and "refused the login" in err and "WRONGPASS" in err
    assert "not-the-password" not in err


def test_bad_tls_settings_stop_serve(tmp_path, redis_server):
    err = refused(env_for("rediss://127.0.0.1:1/0", RATE_LIMIT_REDIS_TLS_CA_CERTS=str(tmp_path / "nope.pem")))
    assert "RATE_LIMIT_REDIS_TLS_CA_CERTS" in err and "does not exist" in err
    err = refused(env_for(redis_server.url, RATE_LIMIT_REDIS_TLS_CERT_REQS="none"))
    assert "RATE_LIMIT_REDIS_TLS_CERT_REQS: TLS settings need a rediss:// URL" in err
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    err = refused(env_for("rediss://127.0.0.1:1/0", RATE_LIMIT_REDIS_TLS_CA_CERTS=str(garbage)))
    assert "ssl_ca_certs: cannot use" in err
    err = refused(env_for("redis://:hunter2@127.0.0.1:1/0?ssl_ca_cert=/x"))
    assert "unknown option 'ssl_ca_cert'" in err and "hunter2" not in err
