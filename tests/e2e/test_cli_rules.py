"""``shadowlimit rules check`` / ``rules schema`` (local, no control plane), and limits written
as text in ``adjust --limit`` and ``PUT /ratelimit/config`` against a live control plane
(real HTTP on loopback, real Redis)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from cp_server import ADMIN_TOKEN, RULES_YAML, ControlPlaneServer, admin_headers, free_port, write_rules

from control_plane.cli import main
from control_plane.rules.json_schema import render

SHADOWLIMIT = Path(sys.executable).parent / "shadowlimit"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"
BAD_BURST = RULES_YAML.replace(
    "local: {average: 10, period: 1s, burst: 10}", "local: {average: 10, period: 1s, burst: 0}"
)
BAD_TEXT = RULES_YAML.replace("local: {average: 100, period: 1s, burst: 100}", "local: 100/fortnight")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    # the built-in default route comes from the settings: the tests decide them
    for var in ("SHADOWLIMIT_ADMIN_TOKEN", "SHADOWLIMIT_URL", "RATE_LIMIT_GLOBAL_CAPACITY", "RATE_LIMIT_RULES_PATH"):
        monkeypatch.delenv(var, raising=False)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- rules check / rules schema ---------------------------------------------------------------


def test_rules_check_valid_file_exits_0(capsys):
    code, out, err = run(capsys, "rules", "check", str(EXAMPLE))
    assert code == 0, err
    assert out == f"{EXAMPLE}: ok, 6 routes (search, checkout, login, internal, tenants, chat)\n"
    assert err == ""


PEER_EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "envoyproxy-ratelimit" / "example.yaml"


def test_rules_check_reads_the_peers_envoy_config_and_says_what_a_zero_limit_does(capsys, tmp_path):
    """envoyproxy/ratelimit's own example file, unchanged: accepted, its banned value named."""
    code, out, err = run(capsys, "rules", "check", str(PEER_EXAMPLE))
    assert code == 0, err
    first, note = out.splitlines()
    assert first.startswith(f"{PEER_EXAMPLE}: ok, envoyproxy/ratelimit config (domain rl), 15 routes (")
    assert note == "  rl/foo/bar=banned: requests_per_unit 0 blocks every request (answered without Redis)"
    code, out, err = run(capsys, "rules", "check", "--json", str(PEER_EXAMPLE))
    result = json.loads(out)["files"][0]
    assert code == 0 and result["kind"] == "envoy" and result["domains"] == ["rl"] and len(result["notes"]) == 1
    # a directory of them (SHADOWLIMIT_ENVOY_CONFIG), and a bad one named by file and line
    (tmp_path / "a.yaml").write_text("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour}\n")
    code, out, err = run(capsys, "rules", "check", str(tmp_path))
    assert code == 2 and err.startswith(f"{tmp_path / 'a.yaml'}:4: descriptors[0].rate_limit.requests_per_unit")


def test_rules_check_invalid_file_exits_2_with_file_line_field(capsys, tmp_path):
    bad = write_rules(tmp_path, BAD_BURST, name="bad.yaml")
    code, out, err = run(capsys, "rules", "check", str(bad))
    assert code == 2
    assert out == ""
    assert err == f"{bad}:6: routes[0].local.burst: must be between 1 and 1000000000000, got 0\n"
    text = write_rules(tmp_path, BAD_TEXT, name="text.yaml")
    code, _, err = run(capsys, "rules", "check", str(text))
    assert code == 2
    assert err.startswith(f"{text}:16: routes[2].local: expected N/period or N per period like ")
    assert err.rstrip().endswith("got '100/fortnight'")


def test_rules_check_json(capsys, tmp_path):
    good = write_rules(tmp_path, RULES_YAML.replace("{average: 10, period: 1s, burst: 10}", "100/minute", 1))
    bad = write_rules(tmp_path, BAD_BURST, name="bad.yaml")
    code, out, err = run(capsys, "rules", "check", "--json", str(good), str(bad))
    assert code == 2  # one invalid file is enough
    assert err == f"{bad}:6: routes[0].local.burst: must be between 1 and 1000000000000, got 0\n"
    result = json.loads(out)  # stdout is the JSON alone
    assert result["ok"] is False
    first, second = result["files"]
    assert first["file"] == str(good) and first["ok"] is True and len(first["digest"]) == 64
    assert [r["name"] for r in first["routes"]] == ["search", "login", "export", "default"]
    assert first["routes"][0]["local"] == {"algorithm": "token_bucket", "average": 100.0, "period": 60.0, "burst": 100}
    assert second == {
        "file": str(bad),
        "ok": False,
        "error": {
            "path": str(bad),
            "line": 6,
            "field": "routes[0].local.burst",
            "message": "must be between 1 and 1000000000000, got 0",
            "error": f"{bad}:6: routes[0].local.burst: must be between 1 and 1000000000000, got 0",
        },
    }
    code, out, _ = run(capsys, "rules", "check", str(good), "--json")
    assert code == 0
    assert json.loads(out)["ok"] is True


def test_rules_check_missing_file_and_usage(capsys, tmp_path):
    missing = tmp_path / "nope.yaml"
    code, _, err = run(capsys, "rules", "check", str(missing))
    assert code == 2
    assert err.startswith(f"{missing}: cannot read the rules file")
    code, _, err = run(capsys, "rules", "check")  # a file is required
    assert code == 2 and err == "shadowlimit rules check: the following arguments are required: FILE\n"


def test_rules_check_installed_command(tmp_path):
    bad = write_rules(tmp_path, BAD_BURST, name="bad.yaml")
    for path, code in ((EXAMPLE, 0), (bad, 2)):
        proc = subprocess.run(
            [str(SHADOWLIMIT), "rules", "check", str(path)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == code, proc.stderr
        assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"{bad}:6: routes[0].local.burst: ")


def test_rules_schema_prints_the_committed_schema(capsys):
    code, out, _ = run(capsys, "rules", "schema")
    assert code == 0
    assert out == render()
    assert out == (EXAMPLE.parents[1] / "docs" / "rules.schema.json").read_text(encoding="utf-8")


# -- limits as text in adjust and PUT /ratelimit/config ---------------------------------------


def test_adjust_limit_usage_errors_exit_2_before_any_request(capsys):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: a request would be exit 3
    cases = [
        (["--limit", "100/fortnight"], "--limit: expected N/period or N per period like"),
        (["--limit", "10/month"], "--limit: months and years have no fixed length"),
        (["--limit", "5/s", "--rate", "5"], "give --limit or --rate/--period, not both"),
        (["--limit", "5/s", "--period", "2"], "give --limit or --rate/--period, not both"),
        (["--limit", "5/s", "--burst", "0"], "--burst: expected a whole number from 1 to 1,000,000,000,000, got '0'"),
        (["--limit", "2000000/s", "--algorithm", "gcra"], "--limit: gcra needs at least 1 us per token"),
        ([], 'adjust needs --limit (like "100/minute") or --rate (or --clear)'),
    ]
    for extra, message in cases:
        code, _, err = run(capsys, "adjust", "--route", "search", *extra, "--url", url)
        assert code == 2, (extra, err)
        assert message in err, (extra, err)


@pytest.fixture
def cp(redis_url, tmp_path):
    server = ControlPlaneServer(redis_url=redis_url, rules_path=write_rules(tmp_path), gate_min_samples=1000)
    server.start()
    yield server
    server.stop()


def decide(cp: ControlPlaneServer, key: str) -> int:
    return httpx.post(cp.url + "/v1/decide", json={"route": "search", "key": key}, timeout=10).status_code


def test_adjust_with_a_limit_text(cp, capsys):
    remote = ["--url", cp.url, "--token", ADMIN_TOKEN]
    code, out, err = run(capsys, "adjust", "--route", "search", "--limit", "2 per 10 minutes", *remote)
    assert code == 0, err
    data = json.loads(out)
    # burst defaults to the quantity: 2 at once, then 2 every 10 minutes (slow: no refill within the test)
    policy = {"algorithm": "token_bucket", "average": 2.0, "period": 600.0, "burst": 2}
    assert data["adjustments"] == [{"route": "search", "key": None, "local": policy, "distributed": policy}]
    assert data["audit"]["to"] == "2/600s burst 2 (token_bucket)"
    assert [decide(cp, "text") for _ in range(3)] == [200, 200, 429]
    code, out, err = run(
        capsys, "adjust", "--route", "search", "--key", "vip", "--limit", "60 per hour", "--burst", "3", *remote
    )
    assert code == 0, err
    assert [decide(cp, "vip") for _ in range(4)] == [200, 200, 200, 429]
    code, _, err = run(capsys, "adjust", "--route", "search", "--clear", *remote)
    assert code == 0, err


def test_config_endpoint_takes_a_limit_text(cp):
    put = lambda body: httpx.put(  # noqa: E731
        cp.url + "/ratelimit/config", json={"route": "search", **body}, headers=admin_headers(), timeout=10
    )
    r = put({"limit": "100/5 minutes", "target": "distributed", "algorithm": "gcra", "burst": 7})
    assert r.status_code == 200, r.text
    assert r.json()["adjustments"][0]["distributed"] == {
        "algorithm": "gcra",
        "average": 100.0,
        "period": 300.0,
        "burst": 7,
    }
    bad = [
        ({"limit": "100/fortnight"}, "limit", "limit: expected N/period or N per period like"),
        ({"limit": "10/month"}, "limit", "limit: months and years have no fixed length"),
        ({"limit": "5/s", "average": 5}, "limit", 'limit: give limit (like "100/minute") or average and period'),
        ({"limit": "5/s", "period": 2}, "limit", "limit: give limit"),
        ({"limit": "1/2 days"}, "limit", "limit: a runtime adjustment's period is at most 86400 s"),
        ({"limit": "5/s", "burst": 0}, "burst", ""),
        ({"limit": 100}, "limit", ""),  # strict: a text, not a number
        ({"limit": ""}, "limit", ""),
        ({}, "average", 'average: required (or give limit, like "100/minute")'),
    ]
    for body, field, message in bad:
        r = put(body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["error"] == "invalid_request" and r.json()["field"] == field, (body, r.text)
        assert r.json()["message"].startswith(message), (body, r.text)
    # nothing was stored by the refused ones; clearing needs no average any more
    assert len(httpx.get(cp.url + "/ratelimit/stats", timeout=10).json()["adjustments"]) == 1
    assert put({"clear": True}).status_code == 200
    assert httpx.get(cp.url + "/ratelimit/stats", timeout=10).json()["adjustments"] == []


def test_whatif_rate_takes_the_same_texts():
    from control_plane.cli import CliError
    from control_plane.cli.rules import parse_rate_option

    assert parse_rate_option("100/minute") == (100.0, 60.0)
    assert parse_rate_option("1000 per hour") == (1000.0, 3600.0)
    assert parse_rate_option("3/2s") == (3.0, 2.0)
    with pytest.raises(CliError) as info:
        parse_rate_option("fast")
    assert info.value.code == 2
    assert str(info.value).startswith("--rate: expected N/period or N per period like") and "'fast'" in str(info.value)
