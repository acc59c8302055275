"""``shadowlimit completion bash|zsh|fish``: scripts written from the parser. The bash one is
checked by bash itself (syntax) and really completes when bash calls it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from control_plane.cli import build_parser, main
from control_plane.cli.completion import completion_script

SHADOWLIMIT = Path(sys.executable).parent / "shadowlimit"
BASH = shutil.which("bash")


def bash_script(tmp_path: Path) -> Path:
    """The script as the installed command prints it."""
    proc = subprocess.run([str(SHADOWLIMIT), "completion", "bash"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "shadowlimit.bash"
    path.write_text(proc.stdout)
    return path


def complete(script: Path, *words: str) -> list[str]:
    """What bash offers for the last of ``words`` (after ``shadowlimit``), by calling the
    function the script registered for the command, as bash's completion does."""
    assert BASH is not None, "bash is needed to test the bash completion script"
    array = " ".join(f"'{w}'" for w in ("shadowlimit", *words))
    program = (
        f"source {script}\n"
        'fn=$(complete -p shadowlimit | sed -E "s/.*-F ([^ ]+).*/\\1/")\n'
        f"COMP_WORDS=({array}); COMP_CWORD={len(words)}\n"
        '"$fn" shadowlimit "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    proc = subprocess.run([BASH, "--norc", "--noprofile", "-c", program], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_bash_script_is_valid_bash(tmp_path):
    assert BASH is not None, "bash is needed to test the bash completion script"
    script = bash_script(tmp_path)
    proc = subprocess.run([BASH, "-n", str(script)], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr


def test_bash_completes_commands_options_and_choices(tmp_path):
    script = bash_script(tmp_path)
    assert complete(script, "ro") == ["routes"]
    assert set(complete(script, "")) >= {"routes", "mode", "audit", "completion", "serve", "--version", "--json"}
    assert complete(script, "mode", "search", "can") == ["canary"]
    assert complete(script, "routes", "--st") == ["--stale-after"]
    assert complete(script, "adjust", "--algorithm", "g") == ["gcra"]
    assert complete(script, "completion", "") == ["bash", "zsh", "fish", "-h", "--help", "--json"]
    # an option's value is not completed with commands or options
    assert complete(script, "routes", "--url", "") == []


def test_every_command_is_in_every_script():
    parser = build_parser()
    names = list(parser.subcommands)
    assert {"routes", "mode", "completion"} <= set(names)
    # each command has its own case (bash, zsh: its options) and is offered (zsh, fish: with its help)
    marks = {"bash": "        ' {}')", "zsh": "        ' {}')", "fish": "-a '{}' -d "}
    for shell, mark in marks.items():
        script = completion_script(parser, shell)
        for name in names:
            assert mark.format(name) in script, (shell, name)
    assert "'routes:list routes, modes, divergence and the gate" in completion_script(parser, "zsh")
    assert completion_script(parser, "zsh").startswith("#compdef shadowlimit\n")
    assert "complete -c shadowlimit -n '__fish_seen_subcommand_from mode' -l percent -r" in completion_script(
        parser, "fish"
    )


def test_completion_json_and_bad_shell(capsys):
    assert main(["completion", "fish", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["shell"] == "fish" and body["script"].startswith("# fish completion for shadowlimit")
    assert main(["completion", "tcsh"]) == 2
    assert capsys.readouterr().err.startswith("shadowlimit completion: shell: invalid choice: 'tcsh'")
