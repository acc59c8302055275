"""The rollout through the API and the ``shadowlimit`` command against a real control plane:
the runbook's next step and its gate per route, the minimum time in a step (min_dwell),
stale fleet figures and a Redis outage (their own exit codes), ``--json`` errors, and the
exit codes in ``--help``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from cp_server import ADMIN_TOKEN, RULES_YAML, ControlPlaneServer, free_port, wait_until, write_rules

from control_plane.cli import main
from control_plane.cli.output import EXIT_CODES
from control_plane.settings import Settings
from limiter.embedded import EmbeddedRedis

DEFAULT_DWELL = Settings.model_fields["gate_min_dwell_s"].default


@pytest.fixture(autouse=True)
def _cli_env(monkeypatch):
    # the CLI reads these as defaults: the tests decide what it gets
    for var in ("SHADOWLIMIT_ADMIN_TOKEN", "SHADOWLIMIT_TOKEN", "SHADOWLIMIT_URL"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def make_cp(redis_url, tmp_path) -> Iterator:
    servers: list[ControlPlaneServer] = []

    def make(rules: str = RULES_YAML, **overrides) -> ControlPlaneServer:
        overrides.setdefault("redis_url", redis_url)
        cp = ControlPlaneServer(rules_path=write_rules(tmp_path, rules), **overrides)
        servers.append(cp)
        return cp.start()

    yield make
    for s in reversed(servers):
        s.stop()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def remote(cp: ControlPlaneServer, *argv: str) -> list[str]:
    return [*argv, "--url", cp.url, "--token", ADMIN_TOKEN]


def route(cp: ControlPlaneServer, name: str) -> dict:
    return next(r for r in httpx.get(cp.url + "/v1/routes", timeout=10).json()["routes"] if r["name"] == name)


def row(out: str, name: str) -> str:
    """A route's row of ``shadowlimit routes`` with its wrapped continuation lines, spaces squeezed."""
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.split()[:1] == [name])
    end = next((j for j in range(i + 1, len(lines)) if not lines[j].startswith(" ")), len(lines))
    return " ".join(" ".join(lines[i:end]).split())


def force(capsys, cp: ControlPlaneServer, name: str, mode: str, *extra: str) -> None:
    code, _, err = run(capsys, *remote(cp, "mode", name, mode, *extra, "--reason", "test step", "--force"))
    assert code == 0, err


def test_next_step_and_its_gate_per_route(make_cp, capsys):
    cp = make_cp(gate_min_samples=1000)
    search = route(cp, "search")
    assert search["next_step"] == {"mode": "canary", "canary_percent": 10}
    gate = search["gate"]
    assert (gate["target"], gate["target_percent"], gate["required"], gate["passed"]) == ("canary", 10, True, False)
    code, out, err = run(capsys, *remote(cp, "routes"))
    assert code == 0, err
    assert "->canary 10%: only 0 compared decisions in the last 300s (need 1000)" in row(out, "search")

    force(capsys, cp, "search", "canary", "--percent", "10")
    search = route(cp, "search")
    assert search["next_step"] == {"mode": "canary", "canary_percent": 25}
    assert (search["gate"]["target"], search["gate"]["target_percent"]) == ("canary", 25)
    out = run(capsys, *remote(cp, "routes"))[1]
    assert row(out, "search").startswith("search canary 10% ") and "->canary 25%: only 0" in row(out, "search")

    force(capsys, cp, "search", "canary", "--percent", "50")
    assert route(cp, "search")["next_step"] == {"mode": "enforce", "canary_percent": 0}
    assert "->enforce: only 0" in row(run(capsys, *remote(cp, "routes"))[1], "search")

    # enforced: no next step, no gate, nothing in the column
    force(capsys, cp, "search", "enforce")
    search = route(cp, "search")
    assert search["next_step"] is None and search["gate"] is None
    out = run(capsys, *remote(cp, "routes"))[1]
    assert "->" not in row(out, "search") and row(out, "search").startswith("search enforce ")

    # off: the next step is shadow, which no gate holds back
    force(capsys, cp, "login", "off")
    login = route(cp, "login")
    assert login["next_step"] == {"mode": "shadow", "canary_percent": 0} and login["gate"] is None
    assert row(run(capsys, *remote(cp, "routes"))[1], "login").endswith("->shadow (not gated)")


def test_long_reasons_wrap_instead_of_being_cut(make_cp, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    cp = make_cp(gate_min_samples=1000, gate_min_dwell_s=DEFAULT_DWELL)
    force(capsys, cp, "search", "canary", "--percent", "10")
    out = run(capsys, *remote(cp, "routes"))[1]
    assert max(len(line) for line in out.splitlines()) <= 100, out
    text = row(out, "search")
    assert "->canary 25%: only 0 compared decisions in the last 300s (need 1000); in canary 10% for " in text
    assert "the minimum before the next step is 600s (min_dwell; " in text and text.endswith("s to go)"), text


def test_the_default_min_dwell_refuses_a_quick_promotion(make_cp, capsys):
    # export sets its own min_dwell of 0 in the rules; the others keep the default (10 minutes)
    rules = RULES_YAML.replace(
        "    distributed: {average: 1, period: 10s, burst: 3}\n",
        "    distributed: {average: 1, period: 10s, burst: 3}\n    min_dwell: 0s\n",
    )
    cp = make_cp(rules, gate_min_samples=0, gate_min_dwell_s=DEFAULT_DWELL)
    assert DEFAULT_DWELL == 600
    # shadow since the start (never changed): the first step passes without force
    code, out, err = run(capsys, *remote(cp, "mode", "search", "canary", "--percent", "10", "--reason", "go"))
    assert code == 0, err
    # at once to the next step: refused by the dwell, exit 5, nothing changed
    code, out, err = run(capsys, *remote(cp, "mode", "search", "canary", "--percent", "25", "--reason", "hurry"))
    assert code == 5, err
    assert "in canary 10% for " in err and "the minimum before the next step is 600s (min_dwell;" in err
    search = route(cp, "search")
    assert (search["mode"], search["canary_percent"]) == ("canary", 10)
    assert search["gate"]["passed"] is False and search["gate"]["min_dwell_s"] == 600
    assert 0 <= search["gate"]["in_step_s"] < 600
    # the API says the same
    r = httpx.put(
        cp.url + "/v1/routes/search/mode",
        json={"mode": "enforce", "reason": "hurry"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10,
    )
    assert r.status_code == 409 and r.json()["error"] == "gate_failed" and "min_dwell" in r.json()["message"]
    # force overrides it, audited as forced
    code, out, err = run(
        capsys, *remote(cp, "mode", "search", "canary", "--percent", "25", "--reason", "checked", "--force")
    )
    assert code == 0, err
    entry = httpx.get(cp.url + "/v1/rollout/audit", params={"route": "search", "limit": 1}, timeout=10).json()
    assert entry["entries"][0]["forced"] is True and entry["entries"][0]["gate"]["min_dwell_s"] == 600
    # the route's own min_dwell (0) lets it step at once
    for pct in ("10", "25"):
        code, _, err = run(capsys, *remote(cp, "mode", "export", "canary", "--percent", pct, "--reason", "quick"))
        assert code == 0, err
    assert route(cp, "export")["rule"]["min_dwell_s"] == 0.0


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    """A Redis of this test's own: the outage must never touch the session server."""
    server = EmbeddedRedis().start()
    yield server
    server.stop()


def test_a_redis_outage_stale_figures_exit_7_and_changes_exit_6(make_cp, own_redis, capsys):
    cp = make_cp(redis_url=own_redis.url, gate_min_samples=0)
    code, out, err = run(capsys, *remote(cp, "routes"))
    assert code == 0, err
    own_redis.kill()
    wait_until(
        lambda: httpx.get(cp.url + "/v1/routes", timeout=10).json()["figures_error"], 15.0, 0.2, "a failed refresh"
    )
    code, out, err = run(capsys, *remote(cp, "routes"))
    assert code == 7, (out, err)
    footer = out.splitlines()[-1]
    assert footer.startswith("fleet figures: STALE, ") and "s old, the last refresh failed: " in footer, footer
    assert "the fleet figures are stale: " in err and "the last refresh failed: " in err
    code, out, err = run(capsys, *remote(cp, "routes", "--json"))
    assert code == 7
    body = json.loads(out)
    assert body["figures_error"] and body["figures_age_s"] >= 0 and body["routes"]
    # a change while Redis is down: 503, nothing written, exit 6 (not a refusal)
    code, out, err = run(capsys, *remote(cp, "mode", "search", "enforce", "--reason", "outage", "--force"))
    assert code == 6, err
    assert "nothing was written" in err and "retry later" in err
    code, out, err = run(capsys, *remote(cp, "mode", "search", "enforce", "--reason", "outage", "--force", "--json"))
    assert code == 6 and err == ""
    error = json.loads(out)["error"]
    assert (error["kind"], error["exit_code"], error["status"]) == ("unavailable", 6, 503)
    assert error["response"]["error"] == "backend_unavailable"


def test_json_errors_carry_the_exit_code_kind(make_cp, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, "routes", "--url", url, "--timeout", "2", "--json")
    assert code == 3 and err == ""
    assert json.loads(out)["error"]["kind"] == "unreachable" and json.loads(out)["error"]["exit_code"] == 3
    # usage: found by the command, and by the parser (a missing argument); nothing is sent
    code, out, _ = run(capsys, "mode", "search", "canary", "--reason", "x", "--url", url, "--json")
    assert code == 2 and json.loads(out)["error"] == {
        "kind": "usage",
        "exit_code": 2,
        "message": "canary needs --percent (1-100)",
        "command": "mode",
    }
    code, out, _ = run(capsys, "--json", "mode", "search", "--url", url)
    error = json.loads(out)["error"]
    assert code == 2 and error["kind"] == "usage" and error["command"] == "mode"
    assert error["message"] == "the following arguments are required: mode, --reason"
    cp = make_cp(gate_min_samples=1000)
    code, out, _ = run(capsys, "mode", "search", "off", "--reason", "x", "--url", cp.url, "--json")
    assert code == 4 and json.loads(out)["error"]["kind"] == "auth"
    code, out, _ = run(capsys, *remote(cp, "mode", "search", "canary", "--percent", "10", "--reason", "r", "--json"))
    error = json.loads(out)["error"]
    assert code == 5 and (error["kind"], error["status"]) == ("gate", 409)
    assert error["response"]["gate"]["min_samples"] == 1000
    code, out, _ = run(capsys, *remote(cp, "mode", "nope", "off", "--reason", "r", "--json"))
    assert code == 1 and json.loads(out)["error"]["kind"] == "refused"
    # and success is JSON too, for the commands that print text otherwise
    code, out, _ = run(capsys, *remote(cp, "mode", "search", "off", "--reason", "r", "--json"))
    assert code == 0 and json.loads(out)["state"]["mode"] == "off"
    code, out, _ = run(capsys, *remote(cp, "reset", "nobody", "--json"))
    assert code == 0 and set(json.loads(out)) >= {"local_reset", "distributed_reset"}


@pytest.mark.parametrize("argv", [["--help"], ["routes", "--help"], ["mode", "--help"], ["completion", "--help"]])
def test_exit_codes_are_listed_in_every_help(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "exit codes:" in out
    for code, (_, meaning) in EXIT_CODES.items():
        assert f"  {code:<4}{meaning}" in out
    assert "6   the control plane is unavailable (503: Redis unreachable, or busy): nothing was written" in out
    assert "7   routes: the fleet figures are stale" in out
