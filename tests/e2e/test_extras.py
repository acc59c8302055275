"""``pip install shadowlimit`` without its extras: ``shadowlimit serve`` serves the HTTP API
without Textual or the gRPC packages, and a command that needs an extra that is missing names
it (exit 2, one line).

Each command runs in a subprocess whose import system refuses the extras' packages, as an
install without them would (the image without the dashboard extra is tested the same way in
test_image.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import httpx
import pytest
from cp_server import clean_env, free_port, unique_namespace, write_rules
from support import eventually

from control_plane.extras import EXTRAS, missing_modules

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]

#: the top-level packages each extra brings (pyproject.toml's optional dependencies, installed)
ABSENT = {
    "dashboard": ["textual", "rich"],
    "envoy": ["grpc", "grpc_health", "grpc_reflection", "google.protobuf", "envoy", "xds", "h2", "hpack"],
}

PRELUDE = textwrap.dedent(
    """\
    import importlib.abc, sys
    ABSENT = {absent!r}

    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == a or name.startswith(a + ".") for a in ABSENT):
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, Absent())
    for a in ABSENT:
        try:
            __import__(a)
        except ImportError:
            continue
        sys.exit(f"{{a}} could still be imported")
    """
)


def _without(*extras: str, code: str, argv: list[str], env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    absent = [name for extra in extras for name in ABSENT[extra]]
    script = PRELUDE.format(absent=absent) + code
    return subprocess.Popen(
        [sys.executable, "-c", script, *argv],
        env=clean_env(**(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


CLI = "from control_plane.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _cli_without(*extras: str, argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = _without(*extras, code=CLI, argv=argv, env=env)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_the_extras_are_pyproject_s_optional_dependencies():
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) == set(optional) - {"dev"}
    assert "shadowlimit[dashboard,envoy]" in optional["dev"]
    assert [d for d in optional["dashboard"] if d.startswith("textual")]
    for dist in ("h2", "hpack", "grpcio", "grpcio-health-checking", "grpcio-reflection", "xds-protos"):
        assert [d for d in optional["envoy"] if d.split(">")[0] == dist], dist
    core = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in core if d.split(">")[0].split("[")[0] in ("textual", "grpcio", "h2", "hpack", "xds-protos")]
    assert missing_modules("dashboard") == [] and missing_modules("envoy") == []  # the dev install has both


def test_serve_without_the_extras_serves_the_http_api(redis_url, tmp_path):
    port = free_port()
    rules = write_rules(tmp_path)
    env = {"RATE_LIMIT_REDIS_URL": redis_url, "RATE_LIMIT_RULES_PATH": str(rules), "SHADOWLIMIT_PORT": str(port),
           "SHADOWLIMIT_NAMESPACE": unique_namespace("extras")}  # fmt: skip
    proc = _without("dashboard", "envoy", code=CLI, argv=["serve"], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: proc.poll() is None and httpx.get(url + "/healthz", timeout=1).status_code == 200,
                   timeout=30, what="serve without the extras")  # fmt: skip
        body = {"method": "GET", "path": "/api/search/x", "headers": {"X-Client-Id": "ann"}}
        r = httpx.post(url + "/v1/decide", json=body, timeout=5)
        assert r.status_code == 200 and r.json()["route"] == "search", r.text
        assert httpx.get(url + "/readyz", timeout=5).status_code == 200
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert "Finished server process" in err and "Traceback" not in err, err  # stopped as SIGTERM stops it


def test_serve_with_a_grpc_port_names_the_envoy_extra(redis_url, tmp_path):
    config = tmp_path / "envoy.yaml"
    config.write_text("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 9}")
    env = {"RATE_LIMIT_REDIS_URL": redis_url, "SHADOWLIMIT_ENVOY_CONFIG": str(config),
           "ENABLE_DISTRIBUTED_RATE_LIMITING": "true"}  # fmt: skip
    code, _, err = _cli_without("envoy", argv=["serve", "--grpc-port", str(free_port())], env=env)
    assert code == 2, err
    assert err.strip().splitlines() == [
        "shadowlimit serve: SHADOWLIMIT_GRPC_PORT / --grpc-port (Envoy's rate limit service over gRPC) needs the"
        " envoy extra (h2, hpack, grpc, grpc_health.v1, grpc_reflection.v1alpha, google.protobuf,"
        " envoy.service.ratelimit.v3 are not installed): pip install 'shadowlimit[envoy]'"
    ]


def test_dash_names_the_dashboard_extra():
    code, out, err = _cli_without("dashboard", argv=["dash", "--url", "http://127.0.0.1:1"])
    assert code == 2 and out == ""
    assert err.strip() == (
        "shadowlimit dash: shadowlimit dash needs the dashboard extra (textual is not installed):"
        " pip install 'shadowlimit[dashboard]'"
    )
    code, out, err = _cli_without("dashboard", argv=["dash", "--url", "http://127.0.0.1:1", "--json"])
    assert code == 2 and "pip install 'shadowlimit[dashboard]'" in json.loads(out)["error"]["message"]


def test_python_m_dashboard_names_the_dashboard_extra():
    proc = _without("dashboard", code="import runpy\nrunpy.run_module('dashboard', run_name='__main__')\n", argv=[])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err.strip() == (
        "python -m dashboard needs the dashboard extra (textual is not installed): pip install 'shadowlimit[dashboard]'"
    )


def test_the_demo_without_the_dashboard_runs_headless_and_says_why():
    proc = _without("dashboard", code=CLI, argv=["demo", "--duration", "2"], cwd=REPO)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, out + err
    assert "the demo's dashboard needs the dashboard extra (textual is not installed)" in out + err
    assert "demo requests sent" in out
