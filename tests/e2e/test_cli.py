"""The ``shadowlimit`` command against a live control plane (real HTTP on loopback), its
exit codes, and ``shadowlimit serve`` refusing bad configuration cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from cp_server import ADMIN_TOKEN, RULES_YAML, ControlPlaneServer, free_port, wait_until, write_rules

from control_plane.cli import main

SHADOWLIMIT = Path(sys.executable).parent / "shadowlimit"


@pytest.fixture
def cp(redis_url, tmp_path, monkeypatch):
    # the CLI reads these as defaults: make sure the tests decide what it gets
    for var in ("SHADOWLIMIT_ADMIN_TOKEN", "SHADOWLIMIT_URL"):
        monkeypatch.delenv(var, raising=False)
    server = ControlPlaneServer(redis_url=redis_url, rules_path=write_rules(tmp_path), gate_min_samples=1000)
    server.start()
    yield server
    server.stop()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def remote(cp: ControlPlaneServer, *argv: str, token: bool = True) -> list[str]:
    return [*argv, "--url", cp.url, *(["--token", ADMIN_TOKEN] if token else [])]


def decide(cp: ControlPlaneServer, route: str, key: str, cost: int = 1) -> httpx.Response:
    return httpx.post(cp.url + "/v1/decide", json={"route": route, "key": key, "cost": cost}, timeout=10)


def test_routes(cp, capsys):
    code, out, err = run(capsys, *remote(cp, "routes", token=False))
    assert code == 0, err
    lines = out.splitlines()
    header = ["ROUTE", "MODE", "DEC/S", "COMPARED(5m)", "NEW", "REJ", "SAMPLED", "GATE", "(next", "step)"]
    assert lines[0].split() == header
    rows = [line for line in lines[1:] if line and not line.startswith(" ")]
    names = [line.split()[0] for line in rows[:-1]]
    assert names == ["search", "login", "export", "default"]
    assert "shadow" in rows[0]
    # the next step of a route in shadow is canary 10%, with every reason its gate fails, whole
    gate = out[out.index("->canary 10%: ") : out.index("login")]
    assert " ".join(gate.split()) == "->canary 10%: only 0 compared decisions in the last 300s (need 1000)"
    assert rows[-1].startswith("fleet figures: ") and rows[-1].endswith("s old"), rows[-1]
    code, out, _ = run(capsys, *remote(cp, "routes", "--json", token=False))
    assert code == 0
    assert [r["name"] for r in json.loads(out)["routes"]] == names


def test_mode_gate_force_and_auth(cp, capsys):
    # without a token: exit 4, and the message says how to pass one
    code, out, err = run(capsys, *remote(cp, "mode", "search", "off", "--reason", "x", token=False))
    assert code == 4
    assert "not authorised (401)" in err and "--token" in err
    code, _, err = run(capsys, "mode", "search", "off", "--reason", "x", "--url", cp.url, "--token", "wrong")
    assert code == 4
    # the gate refuses (1000 samples needed): exit 5 with the gate figures
    code, out, err = run(capsys, *remote(cp, "mode", "search", "canary", "--percent", "10", "--reason", "try"))
    assert code == 5, err
    assert err.count("refused by the gate") == 1, err  # said once
    figures = json.loads(err.split("gate figures:", 1)[1])
    assert figures["min_samples"] == 1000 and figures["passed"] is False
    # --force with a reason: exit 0
    code, out, err = run(
        capsys, *remote(cp, "mode", "search", "canary", "--percent", "10", "--reason", "incident 7", "--force")
    )
    assert code == 0, err
    assert out.startswith("search: shadow -> canary 10% (audit ")
    state = httpx.get(cp.url + "/v1/routes").json()["routes"][0]
    assert state["mode"] == "canary" and state["canary_percent"] == 10
    # a refusal that is neither auth nor gate: exit 1
    code, _, err = run(capsys, *remote(cp, "mode", "nope", "off", "--reason", "x"))
    assert code == 1 and "404" in err


def test_audit(cp, capsys):
    assert run(capsys, *remote(cp, "mode", "search", "enforce", "--reason", "big bang", "--force"))[0] == 0
    assert run(capsys, *remote(cp, "mode", "login", "off", "--reason", "quiet"))[0] == 0
    code, out, err = run(capsys, *remote(cp, "audit", token=False))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["AT", "KIND", "ROUTE", "FROM"]
    assert "login" in lines[1] and "quiet" in lines[1]
    assert "search" in lines[2] and "big bang [forced]" in lines[2]
    code, out, _ = run(capsys, *remote(cp, "audit", "--route", "search", "--json", token=False))
    assert code == 0
    entries = json.loads(out)["entries"]
    assert [e["route"] for e in entries] == ["search"]
    assert entries[0]["forced"] is True


def test_stats_and_top(cp, capsys):
    for _ in range(4):
        decide(cp, "search", "heavy")
    decide(cp, "search", "light")
    code, out, err = run(capsys, *remote(cp, "stats", token=False))
    assert code == 0, err
    stats = json.loads(out)
    assert stats["requests"]["local"]["allowed"] >= 5
    assert stats["routes"]["search"] == "shadow"
    code, out, err = run(capsys, *remote(cp, "top", "--route", "search", token=False))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["ROUTE", "KEY", "RECENT"]
    assert lines[1].split()[:3] == ["search", "heavy", "4"]
    local_tokens, limit = lines[1].split()[3].split("/")
    assert limit == "10" and 6.0 <= float(local_tokens) <= 10.0
    assert lines[2].split()[:3] == ["search", "light", "1"]


def test_reset(cp, capsys):
    # login: 5 per 10 s
    codes = [decide(cp, "login", "alice", cost=c).status_code for c in (5, 1)]
    assert codes == [200, 429]
    code, _, err = run(capsys, *remote(cp, "reset", "alice", "--route", "login", token=False))
    assert code == 4
    code, out, err = run(capsys, *remote(cp, "reset", "alice", "--route", "login"))
    assert code == 0, err
    assert out.startswith("reset alice: 1 local and ")
    assert decide(cp, "login", "alice").status_code == 200


def test_adjust(cp, capsys):
    code, _, err = run(capsys, *remote(cp, "adjust", "--route", "search"))
    assert code == 2 and "--rate" in err
    code, _, err = run(capsys, *remote(cp, "adjust", "--route", "search", "--rate", "2", "--burst", "2", token=False))
    assert code == 4
    code, out, err = run(
        capsys,
        *remote(
            cp,
            "adjust",
            "--route",
            "search",
            "--rate",
            "1",
            "--period",
            "10",
            "--burst",
            "2",
            "--reason",
            "cli tighten",
        ),
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["audit"]["kind"] == "config_change"
    codes = [decide(cp, "search", "adj").status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    code, _, err = run(capsys, *remote(cp, "adjust", "--route", "search", "--clear"))
    assert code == 0, err
    assert decide(cp, "search", "adj2").headers["X-RateLimit-Limit"] == "10"


def test_unreachable_control_plane_exits_3(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, "routes", "--url", url, "--timeout", "2")
    assert code == 3
    assert f"cannot reach the control plane at {url}" in err
    assert "Traceback" not in err
    # the installed command behaves the same
    proc = subprocess.run(
        [str(SHADOWLIMIT), "stats", "--url", url, "--timeout", "2"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3
    assert "cannot reach the control plane" in proc.stderr
    assert "Traceback" not in proc.stderr


def _serve_env(redis_url: str, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SHADOWLIMIT_", "RATE_LIMIT_", "ENABLE_DISTRIBUTED"))
    }
    env.update({"RATE_LIMIT_REDIS_URL": redis_url, "SHADOWLIMIT_PORT": str(free_port())}, **extra)
    return env


def _serve(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # if validation wrongly passed, the server would run: the timeout bounds that
    return subprocess.run(
        [str(SHADOWLIMIT), "serve", "--log-level", "warning"], env=env, capture_output=True, text=True, timeout=60
    )


def test_serve_invalid_env_var_exits_2(redis_url):
    proc = _serve(_serve_env(redis_url, RATE_LIMIT_GLOBAL_CAPACITY="abc"))
    assert proc.returncode == 2, proc.stderr
    assert "RATE_LIMIT_GLOBAL_CAPACITY" in proc.stderr
    assert "abc" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_bad_rules_file_exits_2(redis_url, tmp_path):
    bad = write_rules(
        tmp_path,
        RULES_YAML.replace("local: {average: 10, period: 1s, burst: 10}", "local: {average: 10, period: 1s, burst: 0}"),
        name="bad.yaml",
    )
    proc = _serve(_serve_env(redis_url, RATE_LIMIT_RULES_PATH=str(bad)))
    assert proc.returncode == 2, proc.stderr
    assert f"{bad}:6:" in proc.stderr
    assert "routes[0].local.burst" in proc.stderr
    assert "Traceback" not in proc.stderr
    # a rules file that does not exist is named too
    missing = tmp_path / "missing.yaml"
    proc = _serve(_serve_env(redis_url, RATE_LIMIT_RULES_PATH=str(missing)))
    assert proc.returncode == 2, proc.stderr
    assert "RATE_LIMIT_RULES_PATH" in proc.stderr and str(missing) in proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_without_a_redis_url_refuses_to_start():
    """No silent single-replica "global" limit: a missing RATE_LIMIT_REDIS_URL is an error."""
    env = _serve_env("")
    del env["RATE_LIMIT_REDIS_URL"]
    proc = _serve(env)
    assert proc.returncode == 2, proc.stderr
    assert "RATE_LIMIT_REDIS_URL" in proc.stderr and "--embedded-redis" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_with_embedded_redis_flag_serves_and_says_it_is_for_development():
    env = _serve_env("")
    del env["RATE_LIMIT_REDIS_URL"]
    port = env["SHADOWLIMIT_PORT"]
    proc = subprocess.Popen(
        [str(SHADOWLIMIT), "serve", "--embedded-redis", "--log-level", "warning"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200,
            30.0,
            0.1,
            "serve --embedded-redis to be ready",
        )
        assert ready
        backend = httpx.get(f"http://127.0.0.1:{port}/v1/backend", timeout=5).json()
        assert backend["redis"].startswith("127.0.0.1:")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "development mode (--embedded-redis)" in err
    assert "Traceback" not in err  # uvicorn re-raises SIGTERM after its clean shutdown


def test_app_without_a_redis_url_does_not_start(tmp_path):
    """The same rule for create_app / the middleware: the lifespan fails, naming the setting."""
    import asyncio

    from control_plane.settings import SettingsError, load_settings
    from control_plane.wiring import open_engine

    with pytest.raises(SettingsError, match="RATE_LIMIT_REDIS_URL"):
        asyncio.run(open_engine(load_settings(redis_url=None, rules_path=None)))


def test_usage_errors_exit_2_before_any_request(capsys):
    import pytest as _pytest

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: a request would be exit 3
    code, _, err = run(capsys, "mode", "search", "canary", "--reason", "x", "--url", url)
    assert code == 2 and "canary needs --percent" in err
    code, _, err = run(capsys, "adjust", "--rate", "5", "--url", url)  # --route is required, not "default"
    assert code == 2 and err == "shadowlimit adjust: the following arguments are required: --route\n"
    with _pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("shadowlimit ")
