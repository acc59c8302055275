"""shadowlimit's own clients against a control plane with mutual TLS on its HTTP port: the
CLI and the dashboard with a CA bundle and a client certificate (options and environment),
and what each says without them: nothing is sent in cleartext, and nothing trusts a server
its CA bundle does not vouch for."""

from __future__ import annotations

import ssl
import subprocess
import time
from typing import Any

import pytest
from cp_server import ADMIN_TOKEN, write_rules
from tls_served import SHADOWLIMIT, TlsServed

from dashboard.app import ShadowlimitDashboard
from dashboard.screen import DashboardScreen


@pytest.fixture
def served(redis_url, test_pki, tmp_path):
    env = {"SHADOWLIMIT_TLS_CLIENT_CA_FILE": test_pki.ca_cert, "RATE_LIMIT_RULES_PATH": str(write_rules(tmp_path))}
    s = TlsServed(redis_url, test_pki, env=env)
    s.client = (test_pki.client_cert, test_pki.client_key)
    with s:
        yield s


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith("SHADOWLIMIT_")}
    return subprocess.run(
        [str(SHADOWLIMIT), *args], capture_output=True, text=True, timeout=60, env={**base, **(env or {})}
    )


def test_the_cli_speaks_mutual_tls_with_its_options_or_environment(served, test_pki):
    tls = ["--ca-file", test_pki.ca_cert, "--client-cert", test_pki.client_cert, "--client-key", test_pki.client_key]
    done = _cli("--url", served.url, "--token", ADMIN_TOKEN, "routes", "--json", *tls)
    assert done.returncode == 0, done.stderr
    assert "search" in done.stdout
    env = {
        "SHADOWLIMIT_URL": served.url,
        "SHADOWLIMIT_TOKEN": ADMIN_TOKEN,
        "SHADOWLIMIT_CA_FILE": test_pki.ca_cert,
        "SHADOWLIMIT_CLIENT_CERT_FILE": test_pki.client_cert,
        "SHADOWLIMIT_CLIENT_KEY_FILE": test_pki.client_key,
    }
    assert _cli("routes", "--json", env=env).returncode == 0
    # the server's certificate from a CA the bundle does not hold: unreachable, and why
    other = _cli("--url", served.url, "routes", "--ca-file", test_pki.other_ca_cert, *tls[2:])
    assert other.returncode == 3 and "CERTIFICATE_VERIFY_FAILED" in other.stderr, other.stderr
    # no client certificate: the server refuses the handshake, whatever the token
    bare = _cli("--url", served.url, "--token", ADMIN_TOKEN, "routes", "--ca-file", test_pki.ca_cert)
    assert bare.returncode == 3 and "cannot reach the control plane" in bare.stderr, bare.stderr
    missing = _cli("--url", served.url, "routes", "--ca-file", "/nonexistent/ca.pem")
    assert missing.returncode == 2 and "--ca-file" in missing.stderr and "Traceback" not in missing.stderr


async def _live(app: ShadowlimitDashboard, pilot: Any, timeout: float = 20.0) -> DashboardScreen:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        screen = app.dashboard
        if screen is not None and screen.conn.status == "live" and screen.snapshot is not None:
            return screen
        await pilot.pause(0.1)
    raise AssertionError(f"the dashboard did not go live: {app.dashboard and app.dashboard.conn}")


async def test_the_dashboard_connects_with_a_ca_bundle_and_a_client_certificate(served, test_pki):
    tls = ssl.create_default_context(cafile=test_pki.ca_cert)
    tls.load_cert_chain(test_pki.client_cert, test_pki.client_key)
    app = ShadowlimitDashboard(served.url, ADMIN_TOKEN, tls=tls)
    async with app.run_test(size=(160, 50)) as pilot:
        screen = await _live(app, pilot)
        assert {r.name for r in screen.snapshot.routes} >= {"search"}  # type: ignore[union-attr]
    bare = ShadowlimitDashboard(served.url, ADMIN_TOKEN, tls=ssl.create_default_context(cafile=test_pki.ca_cert))
    async with bare.run_test(size=(160, 50)) as pilot:
        await pilot.pause(2.0)
        screen = bare.dashboard
        assert screen is not None and screen.conn.status != "live" and screen.snapshot is None
