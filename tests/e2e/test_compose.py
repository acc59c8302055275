"""deploy/compose/ for real: ``podman-compose up`` (Debian's) of the shipped compose file with the
project's image and test stand-ins for the official images (deploy/compose/test-images/, built on
the local Debian base), then requests through Envoy that shadowlimit's three replicas limit as one,
Prometheus scraping every replica and Envoy with the shipped alert rules loaded, and ``down``
leaving no container, pod, network or volume of the project behind. The certificates come from
the stack's own ``make-certs.sh`` (openssl): Envoy reaches the replicas over mutual TLS,
Prometheus scrapes them over HTTPS with its client certificate, and so does this test.

Only loopback is published (``127.0.0.1:<free port>``); the services talk on the project's own
network, as the compose file says.
"""

from __future__ import annotations

import os
import secrets
import ssl
import subprocess
import time
from typing import Any

import httpx
import pytest
import yaml
from cp_server import free_port
from podman import REPO, base_image, build, podman, podman_env, project_image
from rls_client import clear_of_minute_edge
from support import eventually, installed_binary

pytestmark = pytest.mark.timeout(600)

COMPOSE = REPO / "deploy/compose"
TEST_IMAGES = ("redis", "prometheus", "envoy", "upstream")


def _test_images() -> dict[str, str]:
    """The stand-ins for the official images, built on the local base: variable -> reference."""
    base = base_image()
    out = {}
    for name in TEST_IMAGES:
        ref = f"localhost/shadowlimit-test-{name}:latest"
        build(COMPOSE / "test-images", ref, file=COMPOSE / f"test-images/{name}.Containerfile",
              build_args={"BASE_IMAGE": base})  # fmt: skip
        out[f"{name.upper()}_IMAGE"] = ref
    return out


def _compose(project: str, env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [installed_binary("podman-compose"), "-p", project, "-f", str(COMPOSE / "compose.yaml"), *args]
    proc = subprocess.run(cmd, env={**podman_env(), **env}, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


def _left(project: str) -> dict[str, list[str]]:
    """What the project still has: containers, pods, networks and volumes carrying its label or name."""
    label = f"label=io.podman.compose.project={project}"
    found = {
        "containers": podman("ps", "-a", "--filter", label, "--format", "{{.Names}}").stdout.split(),
        "pods": podman("pod", "ps", "--filter", label, "--format", "{{.Name}}").stdout.split(),
        "volumes": podman("volume", "ls", "--filter", label, "--format", "{{.Name}}").stdout.split(),
    }
    networks = podman("network", "ls", "--format", "{{.Name}}").stdout.split()
    found["networks"] = [n for n in networks if n.startswith(project)]
    return found


def _remove_networks(project: str) -> None:
    """podman-compose 1.0.3's down leaves the project's network behind: remove it as the docs say."""
    for network in _left(project)["networks"]:
        podman("network", "rm", "-f", network, check=False)


def test_the_compose_stack_answers_through_envoy_and_goes_down_leaving_nothing(tmp_path):
    """One stack (a test of its own: xdist would give each worker a module fixture's stack)."""
    image, _ = project_image()
    env = {**_test_images(), "SHADOWLIMIT_IMAGE": image}
    token = tmp_path / "admin-token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o644)  # read by the image's user through the bind mount
    tmp_path.chmod(0o755)
    tls = tmp_path / "tls"
    made = subprocess.run([str(COMPOSE / "make-certs.sh"), str(tls)], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    env["SHADOWLIMIT_TLS_DIR"] = str(tls)
    ports = {"SHADOWLIMIT_HTTP_PORT": free_port(), "ENVOY_PORT": free_port(), "PROMETHEUS_PORT": free_port()}
    env |= {"SHADOWLIMIT_ADMIN_TOKEN_PATH": str(token), **{k: str(v) for k, v in ports.items()}}
    project = f"sltest{os.getpid()}"
    stack = {"project": project, "token": token.read_text(), "tls": tls,
             **{k.lower(): f"http://127.0.0.1:{v}" for k, v in ports.items()}}  # fmt: skip
    stack["shadowlimit_http_port"] = f"https://127.0.0.1:{ports['SHADOWLIMIT_HTTP_PORT']}"
    t0 = time.monotonic()
    up = False
    try:
        _compose(project, env, "up", "-d", "--no-build")
        up = True
        eventually(lambda: _api(stack).get("/readyz").status_code == 200, timeout=60,
                   what="the first replica ready")  # fmt: skip
        for n in (1, 2, 3):  # the others through the image's own health check (Envoy fails open to one not up)
            name = f"{project}_shadowlimit-{n}_1"
            eventually(lambda c=name: podman("healthcheck", "run", c, check=False).returncode == 0, timeout=60,
                       interval=0.5, what=f"{name} healthy")  # fmt: skip
        up_s = time.monotonic() - t0
        _every_service_runs(stack)
        _limited_through_envoy_by_the_replicas_as_one(stack)
        _prometheus_scrapes_everything_with_the_shipped_alerts(stack)
        _the_admin_token_comes_from_the_secret_file(stack)
        _only_a_certificate_of_the_stack_reaches_a_replica(stack)
    finally:
        t1 = time.monotonic()
        if up:
            _compose(project, env, "down", "-v")
        _remove_networks(project)
        down_s = time.monotonic() - t1  # the test images stay: a later run reuses their layers
    assert _left(project) == {"containers": [], "pods": [], "volumes": [], "networks": []}
    print(f"compose stack: up and ready in {up_s:.1f}s, down in {down_s:.1f}s")
    assert down_s < 120, down_s


def _every_service_runs(stack: dict[str, Any]) -> None:
    services = yaml.safe_load(COMPOSE.joinpath("compose.yaml").read_text())["services"]
    assert set(services) == {"redis", "shadowlimit-1", "shadowlimit-2", "shadowlimit-3", "envoy", "prometheus",
                             "upstream"}  # fmt: skip
    label = f"label=io.podman.compose.project={stack['project']}"
    running = podman("ps", "--filter", label, "--format", "{{.Names}} {{.Status}}").stdout.splitlines()
    assert len(running) == len(services) and all(" Up " in f" {line} " for line in running), running


def _limited_through_envoy_by_the_replicas_as_one(stack: dict[str, Any]) -> None:
    envoy = stack["envoy_port"]
    eventually(lambda: httpx.get(envoy + "/hello", timeout=5).status_code == 200, timeout=60,
               what="Envoy answering from the upstream")  # fmt: skip
    r = httpx.get(envoy + "/hello", timeout=5)
    assert r.json() == {"upstream": "example", "uri": "/hello"}
    clear_of_minute_edge()
    codes = [httpx.get(envoy + "/limited", timeout=5).status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429], codes  # 3 a minute, whichever replica Envoy asked


def _prometheus(stack: dict[str, Any], path: str, **params: str) -> Any:
    r = httpx.get(stack["prometheus_port"] + path, params=params, timeout=5)
    r.raise_for_status()
    return r.json()["data"]


def _prometheus_scrapes_everything_with_the_shipped_alerts(stack: dict[str, Any]) -> None:
    def targets_up() -> list[str]:
        active = _prometheus(stack, "/api/v1/targets")["activeTargets"]
        up = sorted(t["labels"]["instance"] for t in active if t["health"] == "up")
        return up if len(up) == 4 else []

    up = eventually(targets_up, timeout=60, interval=1, what="4 targets up")
    assert up == ["envoy:9902", "shadowlimit-1:8080", "shadowlimit-2:8080", "shadowlimit-3:8080"]
    groups = _prometheus(stack, "/api/v1/rules")["groups"]
    loaded = sorted(r["name"] for g in groups for r in g["rules"])
    shipped = yaml.safe_load((REPO / "deploy/prometheus/alerts.yaml").read_text())["groups"]
    assert loaded == sorted(r["alert"] for g in shipped for r in g["rules"])
    calls = eventually(
        lambda: _prometheus(stack, "/api/v1/query", query="sum by (instance) (rate_limit_envoy_requests_total)")[
            "result"
        ],
        timeout=30,
        interval=1,
        what="the replicas' counts of Envoy's calls",
    )
    assert len(calls) == 3, calls  # every replica was scraped and counts Envoy's calls


def _api(stack: dict[str, Any], who: str | None = "operator") -> httpx.Client:
    """A client of the published replica's HTTPS API, presenting ``who``'s certificate."""
    ctx = ssl.create_default_context(cafile=str(stack["tls"] / "ca.crt"))
    if who is not None:
        ctx.load_cert_chain(stack["tls"] / f"{who}.crt", stack["tls"] / f"{who}.key")
    return httpx.Client(base_url=stack["shadowlimit_http_port"], verify=ctx, timeout=5)


def _the_admin_token_comes_from_the_secret_file(stack: dict[str, Any]) -> None:
    body = {"mode": "off", "reason": "compose test"}
    with _api(stack) as api:
        assert api.put("/v1/routes/api/mode", json=body).status_code == 401
        r = api.put("/v1/routes/api/mode", json=body, headers={"Authorization": f"Bearer {stack['token']}"})
    assert r.status_code == 200, r.text


def _only_a_certificate_of_the_stack_reaches_a_replica(stack: dict[str, Any]) -> None:
    with pytest.raises(httpx.HTTPError), _api(stack, who=None) as api:  # the token alone: refused
        api.get("/v1/routes", headers={"Authorization": f"Bearer {stack['token']}"})
    with pytest.raises(httpx.HTTPError):  # cleartext: no answer
        httpx.get(stack["shadowlimit_http_port"].replace("https:", "http:") + "/healthz", timeout=5)
    # Envoy's calls went over TLS: its own counters of the cluster's handshakes
    handshakes = _prometheus(
        stack, "/api/v1/query", query='sum(envoy_cluster_ssl_handshake{envoy_cluster_name="shadowlimit"})'
    )["result"]
    assert handshakes and float(handshakes[0]["value"][1]) > 0, handshakes
