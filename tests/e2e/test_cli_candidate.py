"""``shadowlimit candidate`` and ``suggest --try-live`` against a real control plane (issue
25): set a candidate, see it under its route in ``shadowlimit routes`` with its figures and
its promotion's gate, promotion refused by the gate (exit 5) then forced, the limit in force
shown against the rules file's, drop; the replay's suggestion sent straight to a candidate;
an Envoy route (a name with "/") decided over gRPC has its candidate compared too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cp_server import ADMIN_TOKEN, ControlPlaneServer, write_rules
from rls_client import Rls, descriptor

from control_plane.cli import main
from control_plane.cli.output import EXIT_GATE, EXIT_OK, EXIT_REFUSED, EXIT_USAGE

pytestmark = pytest.mark.timeout(120)

RULES = """\
version: 1
routes:
  - name: search
    match: {path: /api/search/**}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 100, period: 1s, burst: 100}
    distributed: {average: 10, period: 1s, burst: 10}
"""
ENVOY = """\
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 6}
"""


@pytest.fixture(autouse=True)
def _cli_env(monkeypatch):
    for var in ("SHADOWLIMIT_ADMIN_TOKEN", "SHADOWLIMIT_TOKEN", "SHADOWLIMIT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COLUMNS", "1000")  # a row on one line (routes wraps its last column to the terminal)


@pytest.fixture
def cp(redis_url: str, tmp_path: Path) -> Iterator[ControlPlaneServer]:
    envoy = tmp_path / "envoy.yaml"
    envoy.write_text(ENVOY)
    server = ControlPlaneServer(
        redis_url=redis_url, rules_path=write_rules(tmp_path, RULES), envoy_config=envoy, grpc_port=0,
        gate_min_samples=5,
    ).start()  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


def run(capsys, cp: ControlPlaneServer, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--url", cp.url, "--token", ADMIN_TOKEN])
    out, err = capsys.readouterr()
    return code, out, err


def lines_of(out: str, start: str) -> list[str]:
    return [" ".join(line.split()) for line in out.splitlines() if line.strip().startswith(start)]


def test_a_candidate_from_the_command_line_set_shown_promoted_and_dropped(cp, capsys) -> None:
    assert run(capsys, cp, "mode", "search", "enforce", "--reason", "go", "--force")[0] == EXIT_OK
    code, out, err = run(capsys, cp, "candidate", "search", "--limit", "5/minute", "--reason", "tighter")
    assert code == EXIT_OK, err
    assert "search: candidate 5/60s burst 5 (token_bucket) in shadow beside the current limit" in out
    for _i in range(12):  # bob, 12 at once: the current limit admits 10 (more if the 12 take long), the candidate 5
        httpx.post(f"{cp.url}/v1/decide", json={"route": "search", "key": "bob"}, timeout=10)
    cp.settle()
    code, out, _ = run(capsys, cp, "routes")
    (line,) = lines_of(out, "↳ candidate")
    totals = next(r for r in httpx.get(f"{cp.url}/v1/routes", timeout=10).json()["routes"] if r["name"] == "search")[
        "candidate"
    ]["totals"]
    share = f"{totals['newly_rejected_share']:.2%}"
    assert totals["compared"] == 12 and 5 <= totals["newly_rejected"] <= 7  # a minute's limit: no refill meanwhile
    assert line.startswith(f"↳ candidate 12 {share} 100.0% 5/60s burst 5 (token_bucket); newly admitted 0 (0.00%)")
    assert f"promote: new rejections {share} exceed 1.00%" in line
    code, out, err = run(capsys, cp, "candidate", "search", "--promote", "--reason", "ship")
    assert code == EXIT_GATE and "refused by the gate" in err, (out, err)
    code, out, err = run(capsys, cp, "--json", "candidate", "search", "--promote", "--force", "--reason", "ship anyway")
    assert code == EXIT_OK, err
    assert json.loads(out)["limit"] == {"algorithm": "token_bucket", "average": 5.0, "period": 60.0, "burst": 5}
    code, out, _ = run(capsys, cp, "routes")
    assert lines_of(out, "↳ limit") == [
        "↳ limit 5/60s burst 5 (token_bucket) (rules file: 10/1s burst 10 (token_bucket))"
    ]
    assert lines_of(out, "↳ candidate") == []
    assert run(capsys, cp, "candidate", "search", "--limit", "3/second", "--reason", "tighter still")[0] == EXIT_OK
    code, out, _ = run(capsys, cp, "candidate", "search", "--drop", "--reason", "no")
    assert code == EXIT_OK and "search: dropped candidate 3/1s burst 3 (token_bucket)" in out
    code, _, err = run(capsys, cp, "candidate", "search", "--drop", "--reason", "again")
    assert code == EXIT_REFUSED and "no candidate" in err
    code, _, err = run(capsys, cp, "candidate", "search", "--limit", "5/minute", "--reason", "same as now")
    assert code == EXIT_REFUSED and "equal to the route's current limit" in err
    code, _, err = run(capsys, cp, "candidate", "search", "--drop", "--promote", "--reason", "both")
    assert code == EXIT_USAGE and "give one of --limit, --drop or --promote" in err


def test_suggest_try_live_sends_the_suggestion_to_a_candidate(cp, capsys) -> None:
    assert run(capsys, cp, "mode", "search", "shadow", "--reason", "measure")[0] == EXIT_OK
    for i in range(40):
        httpx.post(f"{cp.url}/v1/decide", json={"route": "search", "key": f"k{i % 4}"}, timeout=10)
    cp.settle()
    code, out, err = run(capsys, cp, "suggest", "search", "--max-reject", "1%", "--try-live", "--reason", "replayed")
    assert code == EXIT_OK, err
    assert "now in shadow beside the current limit" in out
    view = next(r for r in httpx.get(f"{cp.url}/v1/routes", timeout=10).json()["routes"] if r["name"] == "search")
    assert view["candidate"] is not None and view["candidate"]["reason"] == "replayed"
    audit = httpx.get(f"{cp.url}/v1/rollout/audit", params={"route": "search"}, timeout=10).json()["entries"]
    assert audit[0]["kind"] == "candidate" and audit[0]["reason"] == "replayed"


def test_an_envoy_routes_candidate_is_compared_over_grpc(cp, capsys) -> None:
    route = "edge/user"
    assert run(capsys, cp, "mode", route, "enforce", "--reason", "go", "--force")[0] == EXIT_OK
    code, _, err = run(capsys, cp, "candidate", route, "--limit", "3/minute", "--reason", "tighter")
    assert code == EXIT_OK, err
    rls = Rls(int(cp.app.state.grpc.port))
    try:
        for _ in range(6):
            rls.ask(descriptor(("user", "ann")))
    finally:
        rls.close()
    cp.settle()
    div = httpx.get(f"{cp.url}/v1/divergence", params={"minutes": 5}, timeout=10).json()["routes"][route]
    totals = div["candidate"]["totals"]
    assert (totals["agree"], totals["newly_rejected"], totals["newly_admitted"]) == (3, 3, 0), totals
    assert [(k["key"], k["count"]) for k in div["candidate"]["would_be_blocked"]] == [("ann", 3)]
