"""The image: the repository's Containerfile built with Podman on a local Debian base
(tests/podman.py) and run against a real Redis: a non-root user on a read-only root, the
health check, ``/healthz``, ``/v1/decide`` and a gRPC ``ShouldRateLimit`` answered from Redis,
startup errors as clear in ``podman logs`` as outside, a broken rules file (swapped in as the
kubelet swaps a mounted ConfigMap) that keeps the last good rules, and the dashboard, which
only the image built with the dashboard extra carries.

The containers share the host's network namespace (``--network host``) so they reach the
test Redis on loopback; they listen on ``127.0.0.1`` (``SHADOWLIMIT_HOST``) there, as nothing
may listen beyond loopback here. The compose test (test_compose.py) runs the image's own
default, every address inside a network of its own, published on loopback.
"""

from __future__ import annotations

import os
import pty
import re
import select
import ssl
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cp_server import clean_env, free_port, unique_namespace
from podman import REPO, Container, base_image, configmap_dir, image_size, inspect, podman, project_image
from rls_client import OK, OVER, Rls, clear_of_minute_edge, descriptor
from support import eventually

pytestmark = pytest.mark.timeout(600)

SHADOWLIMIT = Path(sys.executable).parent / "shadowlimit"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
MB = 1_000_000
#: the image's size budget (docs/deploy.md reports the measured size)
SIZE_BUDGET = 200 * MB
USER_ID = "10001"

RULES = """\
version: 1
routes:
  - name: {route}
    match: {{path: /api/**}}
    key: {{strategy: header, header: X-Client-Id}}
    local: {{average: 100, period: 1m, burst: 100}}
    distributed: {{average: {limit}, period: 1m, burst: {limit}}}
    mode: enforce
"""

ENVOY_CONFIG = """\
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 2}
"""


@pytest.fixture(scope="module")
def image() -> str:
    ref, _ = project_image()
    return ref


def _settings(redis_url: str, port: int, **extra: str) -> dict[str, str]:
    """A container's environment: loopback in the host's network, the test Redis, a fresh namespace."""
    return {
        "SHADOWLIMIT_HOST": "127.0.0.1",
        "SHADOWLIMIT_PORT": str(port),
        "RATE_LIMIT_REDIS_URL": redis_url,
        "SHADOWLIMIT_NAMESPACE": unique_namespace("img"),
        "ENABLE_DISTRIBUTED_RATE_LIMITING": "true",
        **extra,
    }


@pytest.fixture(scope="module")
def served(image, redis_server, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """One container serving HTTP and gRPC from a mounted rules folder and Envoy configuration."""
    conf = configmap_dir(
        tmp_path_factory.mktemp("conf") / "shadowlimit",
        {"rules.yaml": RULES.format(route="images", limit=3), "envoy.yaml": ENVOY_CONFIG},
    )
    port, grpc_port = free_port(), free_port()
    env = _settings(
        redis_server.url,
        port,
        RATE_LIMIT_RULES_PATH="/etc/shadowlimit/rules.yaml",
        SHADOWLIMIT_ENVOY_CONFIG="/etc/shadowlimit/envoy.yaml",
        SHADOWLIMIT_GRPC_PORT=str(grpc_port),
        SHADOWLIMIT_DEFAULT_MODE="enforce",
    )
    options = ["--network", "host", "--read-only", "-v", f"{conf}:/etc/shadowlimit:ro"]
    with Container(image, env=env, options=options) as c:
        c.wait_http(f"http://127.0.0.1:{port}/healthz")
        yield {"container": c, "url": f"http://127.0.0.1:{port}", "grpc_port": grpc_port}


def test_the_image_is_small_labelled_and_runs_serve_as_a_user(image):
    size = image_size(image)
    assert size < SIZE_BUDGET, f"the image is {size / MB:.1f} MB, over its {SIZE_BUDGET / MB:.0f} MB budget"
    assert size > image_size(base_image()), "the image adds nothing to its base?"
    info = inspect(image)
    config = info["Config"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == PROJECT["version"]
    assert labels["org.opencontainers.image.licenses"] == PROJECT["license"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert labels["org.opencontainers.image.revision"] == head
    origin = subprocess.run(["git", "config", "remote.origin.url"], cwd=REPO, capture_output=True, text=True)
    assert labels["org.opencontainers.image.source"] == (origin.stdout.strip() or REPO.as_uri())
    assert config["User"] == f"{USER_ID}:{USER_ID}"
    assert config["Entrypoint"] == ["shadowlimit"] and config["Cmd"] == ["serve"]
    assert "control_plane.server.healthcheck" in " ".join(info["Healthcheck"]["Test"])  # kept by --format docker


def test_it_runs_as_a_user_on_a_read_only_root(served):
    c = served["container"]
    assert c.exec("id", "-u", check=True).stdout.strip() == USER_ID
    assert inspect(c.name, "container")["HostConfig"]["ReadonlyRootfs"] is True
    for path in ("/opt/shadowlimit/x", "/etc/x", "/x"):
        proc = c.exec("touch", path)
        assert proc.returncode != 0 and "Read-only file system" in proc.stderr, (path, proc.stderr)
    status = c.exec("cat", "/proc/1/status", check=True).stdout  # the server itself
    assert re.search(rf"^Uid:\s+{USER_ID}\s+{USER_ID}", status, re.M), status


def test_healthz_the_health_check_and_metrics(served):
    url, c = served["url"], served["container"]
    r = httpx.get(url + "/healthz", timeout=5)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    check = podman("healthcheck", "run", c.name, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "shadowlimit_build_info" in httpx.get(url + "/metrics", timeout=5).text


def test_it_serves_tls_from_mounted_files_and_its_health_check_speaks_it(image, redis_server, test_pki, tmp_path):
    """The certificate and key mounted read-only as a Secret would be (readable by the image's
    user), the HTTPS API answering with them, and the image's own health check over HTTPS."""
    tls = configmap_dir(
        tmp_path / "tls",
        {"tls.crt": Path(test_pki.server_cert).read_text(), "tls.key": Path(test_pki.server_key).read_text()},
    )
    port = free_port()
    env = _settings(redis_server.url, port, SHADOWLIMIT_TLS_CERT_FILE="/etc/shadowlimit/tls/tls.crt",
                    SHADOWLIMIT_TLS_KEY_FILE="/etc/shadowlimit/tls/tls.key")  # fmt: skip
    with Container(
        image, env=env, options=["--network", "host", "--read-only", "-v", f"{tls}:/etc/shadowlimit/tls:ro"]
    ) as c:
        ctx = ssl.create_default_context(cafile=test_pki.ca_cert)
        url = f"https://localhost:{port}"
        eventually(lambda: httpx.get(url + "/healthz", verify=ctx, timeout=2).status_code == 200, timeout=60,
                   what="the HTTPS API")  # fmt: skip
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        check = podman("healthcheck", "run", c.name, check=False)
        assert check.returncode == 0, check.stdout + check.stderr


def test_decide_answers_from_redis(served):
    url = served["url"]
    body = {"method": "GET", "path": "/api/photos", "headers": {"X-Client-Id": "ann"}}
    answers = [httpx.post(url + "/v1/decide", json=body, timeout=5) for _ in range(4)]
    decisions = [r.json() for r in answers]
    assert [d["allowed"] for d in decisions] == [True, True, True, False], decisions
    assert {d["route"] for d in decisions} == {"images"}
    assert decisions[-1]["enforced_by"] == "distributed" and answers[-1].status_code == 429


def test_should_rate_limit_over_grpc(served):
    clear_of_minute_edge()
    rls = Rls(served["grpc_port"])
    try:
        codes = [rls.codes(descriptor(("tenant", "acme")))[0] for _ in range(3)]
    finally:
        rls.close()
    assert codes == [OK, OK, OVER]


def test_the_server_image_names_the_extra_the_dashboard_needs(image):
    proc = podman("run", "--rm", "--network", "none", image, "dash", "--url", "http://127.0.0.1:1", check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "pip install 'shadowlimit[dashboard]'" in proc.stderr
    proc = podman(
        "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", "import textual", check=False
    )
    assert proc.returncode == 1 and "No module named 'textual'" in proc.stderr


def _outside(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``shadowlimit serve`` outside a container with the same settings."""
    return subprocess.run([str(SHADOWLIMIT), "serve"], env=clean_env(**env), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({"SHADOWLIMIT_TLS_TERMINATED_ELSEWHERE": "true"}, id="no-redis-url"),
        pytest.param(
            {
                "RATE_LIMIT_REDIS_URL": "redis://127.0.0.1:1/0",
                "SHADOWLIMIT_TOKENS_FILE": "/run/secrets/shadowlimit/tokens",
                "SHADOWLIMIT_TLS_TERMINATED_ELSEWHERE": "true",
            },
            id="no-tokens-file",
        ),
        pytest.param(
            {
                "RATE_LIMIT_REDIS_URL": "redis://127.0.0.1:1/0",
                "SHADOWLIMIT_ADMIN_TOKEN_FILE": "/run/secrets/admin",
                "SHADOWLIMIT_TLS_TERMINATED_ELSEWHERE": "true",
            },
            id="no-admin-token-file",
        ),
        # the image listens on every address: without TLS (or a mesh said to terminate it), no start
        pytest.param({"RATE_LIMIT_REDIS_URL": "redis://127.0.0.1:1/0"}, id="no-tls"),
        pytest.param(
            {
                "RATE_LIMIT_REDIS_URL": "redis://127.0.0.1:1/0",
                "SHADOWLIMIT_TLS_CERT_FILE": "/run/tls/tls.crt",
                "SHADOWLIMIT_TLS_KEY_FILE": "/run/tls/tls.key",
            },
            id="no-certificate-file",
        ),
    ],
)
def test_a_missing_redis_url_or_token_file_is_the_same_startup_error_in_podman_logs(image, env):
    outside = _outside({"SHADOWLIMIT_HOST": "0.0.0.0", "SHADOWLIMIT_ALLOW_REMOTE": "true", **env})
    assert outside.returncode == 2 and outside.stderr.strip(), outside
    c = Container(image, env=env, options=["--network", "none", "--read-only"])
    with c:
        assert c.wait_exit() == 2
        logs = c.logs()
    assert outside.stderr.strip() in logs, f"outside:\n{outside.stderr}\nin the container:\n{logs}"
    assert "Traceback" not in logs


def _decide(url: str, client: str) -> dict[str, Any]:
    body = {"method": "GET", "path": "/api/photos", "headers": {"X-Client-Id": client}}
    return dict(httpx.post(url + "/v1/decide", json=body, timeout=5).json())


def test_a_broken_rules_file_keeps_the_last_good_rules(image, redis_server, tmp_path):
    conf = configmap_dir(tmp_path / "rules", {"rules.yaml": RULES.format(route="before", limit=5)})
    port = free_port()
    env = _settings(redis_server.url, port, RATE_LIMIT_RULES_PATH="/etc/shadowlimit/rules.yaml",
                    SHADOWLIMIT_RULES_POLL_INTERVAL_S="0.2")  # fmt: skip
    options = ["--network", "host", "--read-only", "-v", f"{conf}:/etc/shadowlimit:ro"]
    url = f"http://127.0.0.1:{port}"
    with Container(image, env=env, options=options) as c:
        c.wait_http(url + "/healthz")
        assert _decide(url, "a")["route"] == "before"

        configmap_dir(conf, {"rules.yaml": RULES.format(route="broken", limit=5).replace("enforce", "sometimes")})
        rules = eventually(
            lambda: (r := httpx.get(url + "/readyz", timeout=5).json()["rules"])["error"] and r,
            timeout=20,
            what="the broken rules reported by /readyz",
        )
        assert "rules.yaml:8" in rules["error"] and "sometimes" in rules["error"], rules
        assert _decide(url, "b")["route"] == "before"  # the last good rules still decide
        assert httpx.get(url + "/readyz", timeout=5).status_code == 200
        assert "sometimes" in c.logs()

        configmap_dir(conf, {"rules.yaml": RULES.format(route="after", limit=5)})
        eventually(lambda: _decide(url, "c")["route"] == "after", timeout=20, what="the fixed rules in force")
        assert httpx.get(url + "/readyz", timeout=5).json()["rules"]["error"] is None


def test_the_dashboard_from_the_image_built_with_its_extra(served):
    """``shadowlimit dash`` in a terminal: the image built with EXTRAS=envoy,dashboard shows the
    running control plane's route, and quits on q."""
    ref, _ = project_image("envoy,dashboard")
    assert image_size(ref) > image_size(project_image()[0])
    cmd = ["podman", "run", "--rm", "-it", "--network", "host", "--read-only", "-e", "TERM=xterm-256color",
           ref, "dash", "--url", served["url"]]  # fmt: skip
    screen = _run_in_terminal(cmd, until="global 3/60s burst 3", timeout=60)  # the served rules' limit
    assert "images" in screen and "Quit" in screen


ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>PX^_\\]|\x1b\][^\x07]*\x07")


def _run_in_terminal(cmd: list[str], *, until: str, timeout: float) -> str:
    """Run ``cmd`` on a pseudo-terminal (120x40) until its screen shows ``until``, then press q
    and wait for it to exit 0; returns the text it drew (escape sequences removed)."""
    import fcntl
    import struct
    import termios

    from podman import podman_env

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=podman_env(), start_new_session=True)
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + timeout
        while until not in ANSI.sub("", seen.decode(errors="replace")):
            assert time.monotonic() < deadline, f"{until!r} not on the screen in {timeout}s:\n{seen[-4000:]!r}"
            if select.select([master], [], [], 0.5)[0]:
                seen += os.read(master, 65536)
        os.write(master, b"q")
        end = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < end:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    break
        assert proc.wait(timeout=max(1.0, end - time.monotonic())) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
    return ANSI.sub("", seen.decode(errors="replace"))
