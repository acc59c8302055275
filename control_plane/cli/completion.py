"""Shell completion for ``shadowlimit``: bash, zsh and fish scripts written from the
argument parser itself (its commands, their options and choices), so they follow every
command added to it.

Install (see docs/cli.md)::

    source <(shadowlimit completion bash)                                 # ~/.bashrc
    source <(shadowlimit completion zsh)                                  # ~/.zshrc, after compinit
    shadowlimit completion fish > ~/.config/fish/completions/shadowlimit.fish
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .output import CliParser

__all__ = ["completion_script", "SHELLS"]

SHELLS = ("bash", "zsh", "fish")


@dataclass(frozen=True)
class _Command:
    """One (sub)command: the words that lead to it, and what may follow them."""

    path: tuple[str, ...]  # () for shadowlimit itself, ("mode",), ("rules", "check"), ...
    help: str
    options: tuple[tuple[str, ...], ...]  # option strings per option
    value_options: dict[str, tuple[str, ...]]  # option string -> its choices (() = any value)
    words: tuple[str, ...]  # subcommands and positional choices
    subcommands: dict[str, str]  # name -> help


def _commands(parser: CliParser, path: tuple[str, ...] = ()) -> Iterator[_Command]:
    options: list[tuple[str, ...]] = []
    values: dict[str, tuple[str, ...]] = {}
    words: list[str] = []
    for action in parser.arguments:
        choices = tuple(str(c) for c in action.choices) if action.choices is not None else ()
        if action.option_strings:
            if action.help == argparse.SUPPRESS:
                continue
            options.append(tuple(action.option_strings))
            if action.nargs != 0:
                for opt in action.option_strings:
                    values[opt] = choices
        else:
            words += choices
    subs = {name: (sp.description or "").split("\n")[0] for name, sp in parser.subcommands.items()}
    yield _Command(path, parser.description or "", tuple(options), values, tuple(words), subs)
    for name, sp in parser.subcommands.items():
        yield from _commands(sp, (*path, name))


def _q(text: str) -> str:
    """A single-quoted shell word."""
    return "'" + text.replace("'", "'\\''") + "'"


def _path_cases(cmds: list[_Command], shell: str) -> str:
    """The loop that follows the command words already typed into ``cmdpath`` (" mode", ...)."""
    steps = [" ".join(("", *c.path)) for c in cmds if c.path]
    pattern = "|".join(_q(s) for s in steps)
    first = "1" if shell == "bash" else "2"
    words, cword = ("COMP_WORDS", "COMP_CWORD") if shell == "bash" else ("words", "CURRENT")
    return (
        f'    local cmdpath="" i w\n'
        f"    for ((i = {first}; i < {cword}; i++)); do\n"
        f'        w="${{{words}[i]}}"\n'
        f'        case "$cmdpath $w" in\n'
        f'            {pattern}) cmdpath="$cmdpath $w" ;;\n'
        f"        esac\n"
        f"    done\n"
    )


def _case_arm(c: _Command, reply: Callable[[tuple[str, ...]], str], ret: str, cands: str) -> list[str]:
    """One command's arm of the bash/zsh ``case "$cmdpath"``: an option's values after the
    option (``reply(choices)``, then ``ret``), else the command's candidates (``cands``)."""
    lines = [f"        {_q(' '.join(('', *c.path)))})"]
    if c.value_options:
        lines.append('            case "$prev" in')
        lines += [f"                {_q(opt)}) {reply(choices)}; {ret} ;;" for opt, choices in c.value_options.items()]
        lines.append("            esac")
    lines.append(f"            {cands} ;;")
    return lines


def _bash(cmds: list[_Command]) -> str:
    out = [
        "# bash completion for shadowlimit (shadowlimit completion bash)",
        "_shadowlimit() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" cands=""',
        "    COMPREPLY=()",
        _path_cases(cmds, "bash").rstrip("\n"),
        '    case "$cmdpath" in',
    ]
    for c in cmds:
        cands = " ".join([*c.subcommands, *c.words, *(o for opts in c.options for o in opts)])
        out += _case_arm(
            c,
            lambda choices: f'COMPREPLY=($(compgen -W {_q(" ".join(choices))} -- "$cur"))' if choices else ":",
            "return 0",
            f"cands={_q(cands)}",
        )
    out += [
        "    esac",
        '    COMPREPLY=($(compgen -W "$cands" -- "$cur"))',
        "}",
        "complete -F _shadowlimit shadowlimit",
        "",
    ]
    return "\n".join(out)


def _zsh(cmds: list[_Command]) -> str:
    out = [
        "#compdef shadowlimit",
        "# zsh completion for shadowlimit (shadowlimit completion zsh)",
        "_shadowlimit() {",
        '    local prev="${words[CURRENT-1]}"',
        "    local -a cands subs",
        _path_cases(cmds, "zsh").rstrip("\n"),
        '    case "$cmdpath" in',
    ]
    for c in cmds:
        subs = " ".join(_q(n.replace(":", r"\:") + ":" + h) for n, h in c.subcommands.items())
        words = " ".join(_q(w) for w in (*c.words, *(o for opts in c.options for o in opts)))
        out += _case_arm(
            c,
            lambda choices: f"compadd -- {' '.join(_q(x) for x in choices)}" if choices else "_default",
            "return",
            f"subs=({subs}); cands=({words})",
        )
    out += [
        "    esac",
        "    (( ${#subs} )) && _describe -t commands command subs",
        "    compadd -- $cands",
        "}",
        "# autoloaded from $fpath: complete now; sourced: register",
        'if [[ "${funcstack[1]}" == "_shadowlimit" ]]; then _shadowlimit "$@"',
        "else compdef _shadowlimit shadowlimit; fi",
        "",
    ]
    return "\n".join(out)


def _fish(cmds: list[_Command]) -> str:
    out = ["# fish completion for shadowlimit (shadowlimit completion fish)", "complete -c shadowlimit -f"]
    for c in cmds:
        if not c.path:
            cond = "__fish_use_subcommand"
        else:
            cond = f"__fish_seen_subcommand_from {c.path[-1]}"
            if c.subcommands:
                cond += f"; and not __fish_seen_subcommand_from {' '.join(c.subcommands)}"
        for name, help_ in c.subcommands.items():
            out.append(f"complete -c shadowlimit -n {_q(cond)} -a {_q(name)} -d {_q(help_)}")
        if c.words:
            out.append(f"complete -c shadowlimit -n {_q(cond)} -a {_q(' '.join(c.words))}")
        for opts in c.options:
            flags = " ".join(f"-l {o[2:]}" if o.startswith("--") else f"-s {o[1:]}" for o in opts)
            choices = c.value_options.get(opts[0])
            arg = "" if choices is None else (f" -x -a {_q(' '.join(choices))}" if choices else " -r")
            out.append(f"complete -c shadowlimit -n {_q(cond)} {flags}{arg}")
    return "\n".join(out) + "\n"


def completion_script(parser: CliParser, shell: str) -> str:
    """The completion script of ``parser``'s command for ``shell`` (bash, zsh, fish)."""
    cmds = list(_commands(parser))
    if shell == "bash":
        return _bash(cmds)
    if shell == "zsh":
        return _zsh(cmds)
    if shell == "fish":
        return _fish(cmds)
    raise ValueError(f"shell: one of {', '.join(SHELLS)}, got {shell!r}")
