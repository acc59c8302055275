"""What the ``shadowlimit`` command says and how it ends: its exit codes, its errors (text on
stderr, or one JSON object on stdout with ``--json``), tables, and the argument parser
every command is built with (which keeps what was added to it, for the completion scripts).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap
from typing import Any, NoReturn

__all__ = [
    "EXIT_AUTH",
    "EXIT_CODES",
    "EXIT_CODES_EPILOG",
    "EXIT_GATE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PIPE",
    "EXIT_REFUSED",
    "EXIT_STALE",
    "EXIT_UNAVAILABLE",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "CliError",
    "CliParser",
    "UsageError",
    "error_for_response",
    "print_error",
    "print_json",
    "print_table",
    "wants_json",
    "wrap",
]

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_AUTH, EXIT_GATE = 0, 1, 2, 3, 4, 5
EXIT_UNAVAILABLE, EXIT_STALE, EXIT_INTERRUPTED = 6, 7, 130
EXIT_PIPE = 141  # as a shell reports a command ended by SIGPIPE

#: exit code -> (kind, meaning); the kind is what ``--json`` errors carry
EXIT_CODES: dict[int, tuple[str, str]] = {
    EXIT_OK: ("ok", "done"),
    EXIT_REFUSED: ("refused", "the control plane refused the request (unknown route, invalid value, conflict, ...)"),
    EXIT_USAGE: ("usage", "bad usage or configuration (nothing was sent)"),
    EXIT_UNREACHABLE: ("unreachable", "cannot reach the control plane"),
    EXIT_AUTH: ("auth", "not authorised (no token, a wrong one, or a role too low)"),
    EXIT_GATE: ("gate", "refused by a promotion gate (--force with a reason overrides it)"),
    EXIT_UNAVAILABLE: (
        "unavailable",
        "the control plane is unavailable (503: Redis unreachable, or busy): nothing was written, retry later",
    ),
    EXIT_STALE: ("stale", "routes: the fleet figures are stale (Redis unreachable); the last ones read are shown"),
    EXIT_INTERRUPTED: ("interrupted", "interrupted (Ctrl-C)"),
    EXIT_PIPE: ("pipe", "the reader of the output went away (`| head`): the rest was not printed"),
}

EXIT_CODES_EPILOG = "exit codes:\n" + "\n".join(f"  {code:<4}{meaning}" for code, (_, meaning) in EXIT_CODES.items())


class CliError(Exception):
    """A failure the command reports and exits with: ``code`` is one of :data:`EXIT_CODES`;
    ``status`` and ``response`` are the HTTP answer that caused it, if any."""

    def __init__(
        self, message: str, code: int, *, status: int | None = None, response: Any = None, detail: str = ""
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.response = response
        self.detail = detail  # more lines for people (``--json`` has them in ``response``)


class UsageError(CliError):
    """Bad usage (exit 2), found before anything was sent or started; ``command`` is the
    command it concerns (``""`` for none, ``"rules check"``)."""

    def __init__(self, message: str, command: str = "") -> None:
        super().__init__(message, EXIT_USAGE)
        self.command = command


class CliParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` with the exit codes in every ``--help``, a
    ``--json`` option on every command, errors raised as :class:`UsageError` (one line,
    printed as every other error is, not argparse's usage text and exit), and what was
    added to it kept in public attributes (``arguments``, ``subcommands``) for
    :mod:`control_plane.cli.completion`; ``connection`` says whether the command talks to
    a control plane (``--url``, ``--token``, ``--timeout``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.arguments: list[argparse.Action] = []
        self._options: set[int] = set()
        self.subcommands: dict[str, CliParser] = {}
        self.connection = False
        kwargs.setdefault("epilog", EXIT_CODES_EPILOG)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        kwargs.setdefault("conflict_handler", "resolve")  # a command may define its own --json
        super().__init__(*args, **kwargs)
        # SUPPRESS: ``shadowlimit --json routes`` and ``shadowlimit routes --json`` both work
        self.add_argument(
            "--json",
            action="store_true",
            default=argparse.SUPPRESS,
            help="machine-readable output: JSON on stdout, errors too ({error: {kind, exit_code, message}})",
        )

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        # conflict_handler="resolve" takes a redefined option's strings from the older
        # action: an option left with none is gone
        self.arguments = [a for a in self.arguments if a.option_strings or id(a) not in self._options]
        self.arguments.append(action)
        if action.option_strings:
            self._options.add(id(action))
        return action

    def add_subparsers(self, **kwargs: Any) -> Any:
        action = super().add_subparsers(**kwargs)
        self.subcommands = action.choices  # name -> parser, filled by add_parser
        return action

    def error(self, message: str) -> NoReturn:
        """argparse's errors (a missing argument, a bad value, an unknown option) as a
        :class:`UsageError` naming the option: ``--timeout: expected ...``."""
        command = self.prog.partition(" ")[2]
        raise UsageError(message.removeprefix("argument "), command)


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def print_table(table: list[list[str]]) -> None:
    widths = [max(len(str(row[i])) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())


def wrap(text: str, width: int | None = None, indent: str = "") -> list[str]:
    """``text`` in lines of at most ``width`` (default: the terminal's; at least 40), the
    lines after the first indented by ``indent``; words are never cut."""
    if width is None:
        width = shutil.get_terminal_size((120, 24)).columns
    lines = textwrap.wrap(
        text, max(40, width), subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )
    return lines or [""]


def print_error(command: str, exc: CliError, as_json: bool) -> None:
    """The error: one JSON object on stdout with ``--json``, else text on stderr."""
    if as_json:
        kind = EXIT_CODES.get(exc.code, ("error", ""))[0]
        error: dict[str, Any] = {"kind": kind, "exit_code": exc.code, "message": str(exc), "command": command}
        if exc.status is not None:
            error["status"] = exc.status
        if exc.response is not None:
            error["response"] = exc.response
        print_json({"error": error})
        return
    print(f"shadowlimit {command}: {exc}" if command else f"shadowlimit: {exc}", file=sys.stderr)
    if exc.detail:
        print(exc.detail, file=sys.stderr)


def error_for_response(status: int, data: Any, *, has_token: bool) -> CliError:
    """The :class:`CliError` (and so the exit code) of a control plane's error answer."""
    body = data if isinstance(data, dict) else {"message": str(data)}
    message = body.get("message", body)
    if status in (401, 403):
        hint = "" if has_token else " (pass --token or set SHADOWLIMIT_TOKEN)"
        return CliError(f"not authorised ({status}): {message}{hint}", EXIT_AUTH, status=status, response=data)
    if status == 409 and body.get("error") == "gate_failed":
        detail = f"  gate figures: {json.dumps(body.get('gate') or {})}"
        return CliError(str(message), EXIT_GATE, status=status, response=data, detail=detail)
    if status == 503:
        return CliError(
            f"the control plane is unavailable (503 {body.get('error', '')}): {message}; nothing was written,"
            " retry later",
            EXIT_UNAVAILABLE,
            status=status,
            response=data,
        )
    return CliError(f"the control plane refused ({status}): {message}", EXIT_REFUSED, status=status, response=data)
