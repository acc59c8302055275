"""The command line's edges say the same thing everywhere: every numeric option of every
command is parsed by ``control_plane.cli.options`` (no plain ``int``/``float`` left), and a
value that is not a number, not finite or out of range is a usage error naming the option
(exit 2, one line on stderr; with ``--json`` a JSON error on stdout), found before anything is
sent (nothing listens at the URL: a request would be exit 3); the connection options go before
the command or after it; docs/cli.md's exit codes are the command's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cp_server import ADMIN_TOKEN, ControlPlaneServer, free_port, write_rules

from control_plane.cli import build_parser, main
from control_plane.cli import options as cli_options
from control_plane.cli.output import EXIT_CODES, EXIT_PIPE, CliParser

SHADOWLIMIT = Path(sys.executable).parent / "shadowlimit"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"

#: the least each command needs besides the option under test (a complete command line)
BASE: dict[str, list[str]] = {
    "serve": [],
    "demo": ["--no-dash"],
    "dash": [],
    "routes": [],
    "mode": ["search", "canary", "--reason", "r"],
    "audit": [],
    "stats": [],
    "top": [],
    "clients": [],
    "reset": ["someone"],
    "adjust": ["--route", "search"],
    "whatif": ["search", "--rate", "5/s"],
    "suggest": ["search", "--max-reject", "1%"],
    "candidate": ["search", "--limit", "5/s", "--reason", "r"],
    "divergence": ["search"],
    "plan": ["search"],
}
NUMERIC_TYPES = {
    cli_options.seconds,
    cli_options.duration,
    cli_options.period,
    cli_options.amount,
    cli_options.share,
    cli_options.port,
}
BAD = ["-1", "nan", "inf", "1e400", "ten", ""]


def _options(parser: CliParser, path: tuple[str, ...] = ()):
    """Every (command path, option action) in the parser, its subcommands' too."""
    for action in parser.arguments:
        if action.option_strings:
            yield path, action
    for name, sub in parser.subcommands.items():
        yield from _options(sub, (*path, name))


def _numeric(action: argparse.Action) -> bool:
    t = action.type
    return t in NUMERIC_TYPES or getattr(t, "__name__", "").startswith("count(")


NUMERIC = [(path, a.option_strings[-1]) for path, a in _options(build_parser()) if _numeric(a)]


@pytest.fixture(autouse=True)
def _no_defaults_from_the_environment(monkeypatch):
    for var in ("SHADOWLIMIT_URL", "SHADOWLIMIT_TOKEN", "SHADOWLIMIT_ADMIN_TOKEN"):
        monkeypatch.delenv(var, raising=False)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_numeric_option_is_parsed_in_one_place():
    plain = [(p, a.option_strings) for p, a in _options(build_parser()) if a.type in (int, float)]
    assert plain == [], "numeric options without a cli_options type"
    options = {opt for _, opt in NUMERIC}
    assert {"--timeout", "--percent", "--limit", "--port", "--workers", "--replicas", "--duration"} <= options
    assert {"--stale-after", "--rate", "--period", "--burst", "--minutes", "--max-reject"} <= options
    # every command that talks to a control plane takes a --timeout, and shadowlimit itself (before the command)
    assert {p for p, opt in NUMERIC if opt == "--timeout"} == {(), *((c,) for c in BASE if c not in ("serve", "demo"))}


@pytest.mark.parametrize(
    ("path", "option"), [n for n in NUMERIC if n[0]], ids=[" ".join(n[0]) + n[1] for n in NUMERIC if n[0]]
)
def test_a_bad_number_is_a_usage_error_naming_the_option(capsys, path, option):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: a request would be exit 3
    command = " ".join(path)
    connection = ["--url", url] if build_parser().subcommands[path[0]].connection else []
    for bad in BAD + (["0"] if option == "--timeout" else []):
        argv = [*path, *BASE[path[0]], *connection, option, bad]
        code, out, err = run(capsys, *argv)
        assert (code, out) == (2, ""), (argv, out, err)
        assert err.startswith(f"shadowlimit {command}: {option}: expected ") and err.count("\n") == 1, err
        assert repr(bad) in err
        code, out, err = run(capsys, *argv, "--json")
        error = json.loads(out)["error"]
        assert (code, err) == (2, ""), (argv, err)
        assert (error["kind"], error["exit_code"], error["command"]) == ("usage", 2, command)
        assert error["message"].startswith(f"{option}: expected ")
    # and a good value parses (the command is not run here)
    good = next(v for v in ("2", "1", "0.5%", "0") if _parses([*path, *BASE[path[0]], option, v]))
    assert good


def _parses(argv: list[str]) -> bool:
    try:
        build_parser().parse_args(argv)
    except Exception:  # noqa: BLE001 - UsageError: not this value
        return False
    return True


def test_timeout_zero_is_bad_usage_not_an_unreachable_control_plane(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code, _, err = run(capsys, "routes", "--url", url, "--timeout", "0")
    assert code == 2 and "--timeout" in err
    code, _, err = run(capsys, "routes", "--url", url, "--timeout", "0.5")
    assert code == 3 and "cannot reach the control plane" in err


@pytest.fixture
def cp(redis_url, tmp_path):
    with ControlPlaneServer(redis_url=redis_url, rules_path=write_rules(tmp_path)) as server:
        yield server


def test_connection_options_go_before_or_after_the_command(cp, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, "--url", cp.url, "--token", ADMIN_TOKEN, "--timeout", "5", "routes")
    assert code == 0 and out.startswith("ROUTE") and err == "", err
    code, out, _ = run(capsys, "--json", "--url", cp.url, "stats")
    assert code == 0 and "routes" in json.loads(out)
    # typed on both sides, the one after the command wins
    assert run(capsys, "--url", url, "routes", "--url", cp.url)[0] == 0
    assert run(capsys, "--url", cp.url, "routes", "--url", url)[0] == 3
    # the token typed first is sent: a mode change needs it
    code, out, _ = run(capsys, "--token", ADMIN_TOKEN, "mode", "search", "off", "--reason", "r", "--url", cp.url)
    assert code == 0 and out.startswith("search: ")
    # a command that talks to no control plane refuses them
    for argv in (["--url", url, "serve"], ["--token", "t", "completion", "bash"], ["--timeout", "3", "demo"]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and err.endswith("does not talk to a control plane\n"), (argv, err)


def test_the_installed_command_says_it_in_one_line(tmp_path):
    """``shadowlimit`` itself (the console script, this checkout's control_plane): no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHADOWLIMIT_")}
    url = f"http://127.0.0.1:{free_port()}"
    for value in ("-1", "nan", "inf", "0"):
        proc = subprocess.run(
            [str(SHADOWLIMIT), "routes", "--url", url, "--timeout", value],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.startswith("shadowlimit routes: --timeout: expected ") and proc.stderr.count("\n") == 1
        assert "Traceback" not in proc.stderr
    proc = subprocess.run(
        [str(SHADOWLIMIT), "--url", url, "--json", "routes", "--timeout", "-1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr == ""
    assert json.loads(proc.stdout)["error"]["message"].startswith("--timeout: expected ")


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """``shadowlimit ... | head``: the pipe's reader closes its end before the output is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        proc = subprocess.run(
            [str(SHADOWLIMIT), "completion", "bash"], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(write_end)
    assert proc.stderr == ""  # no traceback, no "Exception ignored" from the flush at exit
    assert proc.returncode == EXIT_PIPE


def test_the_documented_exit_codes_are_the_commands():
    text = DOCS.read_text(encoding="utf-8")
    table = text[text.index("## Exit codes") :].split("\n\n")[1]
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", table, re.M)
    assert [(int(code), kind) for code, kind in rows] == [(code, kind) for code, (kind, _) in EXIT_CODES.items()]
    assert "--timeout 0" in table  # bad numbers are usage errors, said where exit 2 is
