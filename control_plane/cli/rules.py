"""``shadowlimit rules check FILE...`` and ``shadowlimit rules schema``, and the limit texts
the admin commands accept (``adjust --limit "100/minute"``, ``whatif --rate 50/1s``).

``rules check`` loads each file exactly as ``serve`` does (the same loader, the settings
from the environment for the built-in ``default`` route) without starting anything; an
envoyproxy/ratelimit configuration (a file whose top level has a ``domain``, or a directory
of them: ``SHADOWLIMIT_ENVOY_CONFIG``) is loaded as ``serve`` loads that, and what differs
from an ordinary limit is said (``requests_per_unit: 0`` blocks every request):
exit 0 when every file is valid, else 2 with one ``file:line: field: message`` line per
invalid file on stderr (an ``ok`` line names the first :data:`SHOWN_ROUTES` routes). A file
at the 4 MiB limit (50,000 Envoy descriptors) is checked in about two seconds. ``--json``
prints the result as JSON on stdout (and nothing else there; the error lines still go to
stderr). ``rules schema`` prints the rules file's JSON Schema (``docs/rules.schema.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .output import EXIT_OK, EXIT_USAGE, CliError

__all__ = ["SHOWN_ROUTES", "add_rules_commands", "adjust_limit_fields", "parse_rate_option"]


def _is_envoy_config(path: str) -> bool:
    """A directory, or a YAML file whose top level has ``domain`` and no ``routes``."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        return True
    try:
        with p.open("rb") as f:
            head = f.read(64 * 1024)
    except OSError:
        return False
    lines = [ln for ln in head.decode("utf-8", "replace").splitlines() if ln and not ln.startswith(("#", " ", "-"))]
    keys = {ln.split(":", 1)[0].strip().strip("'\"") for ln in lines if ":" in ln}
    return "domain" in keys and "routes" not in keys


#: the most route names an ``ok`` line lists (a 4 MiB Envoy configuration has 50,000)
SHOWN_ROUTES = 20


def _names(names: list[str]) -> str:
    """``a, b, c`` (the first :data:`SHOWN_ROUTES`, then how many more)."""
    shown = ", ".join(names[:SHOWN_ROUTES])
    return shown if len(names) <= SHOWN_ROUTES else f"{shown}, ... and {len(names) - SHOWN_ROUTES} more"


def _check_envoy(path: str, settings: Any, detail: bool) -> tuple[dict[str, Any], str]:
    """An envoyproxy/ratelimit configuration's JSON result (the routes with ``detail``)
    and the lines to print."""
    from ..envoy import load_envoy_config
    from ..rules import RulesError

    try:
        config = load_envoy_config(path, settings)
    except RulesError as exc:
        return {"file": path, "ok": False, "error": exc.to_dict()}, str(exc)
    names = [r.name for r in config.routes]
    banned = [r.name for r in config.routes if r.local.blocked]
    notes = [f"{name}: requests_per_unit 0 blocks every request (answered without Redis)" for name in banned]
    domains = ", ".join(sorted(config.domains))
    line = f"{path}: ok, envoyproxy/ratelimit config (domain {domains}), {len(names)} route" + (
        f"{'s' if len(names) != 1 else ''} ({_names(names)})" if names else "s"
    )
    result = {
        "file": path,
        "ok": True,
        "kind": "envoy",
        "digest": config.digest,
        "domains": sorted(config.domains),
        "routes": [r.to_dict() for r in config.routes] if detail else [],
        "notes": notes,
    }
    return result, "\n".join([line, *(f"  {n}" for n in notes)])


def _check_one(path: str, settings: Any, detail: bool) -> tuple[dict[str, Any], str]:
    """One file's JSON result (the routes with ``detail``) and the line to print."""
    from ..rules import RulesError, load_rules

    if _is_envoy_config(path):
        return _check_envoy(path, settings, detail)
    try:
        rules = load_rules(path, settings)
    except RulesError as exc:
        return {"file": path, "ok": False, "error": exc.to_dict()}, str(exc)
    names = [r.name for r in rules.routes]
    routes = [r.to_dict() for r in rules.all_routes] if detail else []
    line = f"{path}: ok, {len(names)} route{'s' if len(names) != 1 else ''}" + (f" ({_names(names)})" if names else "")
    return {"file": path, "ok": True, "digest": rules.digest, "routes": routes}, line


def cmd_rules_check(args: argparse.Namespace) -> int:
    from ..settings import SettingsError, load_settings

    try:
        settings = load_settings()
    except SettingsError as exc:  # the built-in default route comes from the settings
        raise CliError(str(exc), EXIT_USAGE) from None
    results = []
    for path in args.files:
        result, line = _check_one(path, settings, detail=args.json)
        results.append(result)
        if not result["ok"]:
            print(line, file=sys.stderr)
        elif not args.json:  # with --json, stdout is the JSON alone
            print(line)
    ok = all(r["ok"] for r in results)
    if args.json:
        print(json.dumps({"ok": ok, "files": results}, indent=2, default=str))
    return EXIT_OK if ok else EXIT_USAGE


def cmd_rules_schema(args: argparse.Namespace) -> int:
    from ..rules.json_schema import render

    print(render(), end="")
    return EXIT_OK


def add_rules_commands(sub: Any) -> None:
    """``rules check`` and ``rules schema`` (local: no control plane needed)."""
    rules = sub.add_parser("rules", help="check a rules file, print its JSON Schema")
    rsub = rules.add_subparsers(dest="rules_command", required=True, metavar="SUBCOMMAND")
    check = rsub.add_parser(
        "check",
        help="validate rules files (or envoyproxy/ratelimit configs) as serve would load them"
        " (exit 0 valid, 2 invalid: file:line: field)",
    )
    check.add_argument("files", nargs="+", metavar="FILE")
    check.add_argument(
        "--json", action="store_true", help="print the result as JSON on stdout (errors still on stderr)"
    )
    check.set_defaults(func=cmd_rules_check)
    schema = rsub.add_parser("schema", help="print the rules file's JSON Schema (docs/rules.schema.json)")
    schema.set_defaults(func=cmd_rules_schema)


# -- limit texts in the admin commands ------------------------------------------------------


def parse_rate_option(text: str, option: str = "--rate") -> tuple[float, float]:
    """``(quantity, period in seconds)`` from ``100/minute``, ``50/1s``, ``1000 per hour``;
    a usage error naming ``option`` otherwise."""
    from limiter.rates import parse_rate

    try:
        return parse_rate(text)
    except ValueError as exc:
        raise CliError(f"{option}: {str(exc).removeprefix('limit: ')}", EXIT_USAGE) from None


def adjust_limit_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The limit part of ``adjust``'s request: ``{"limit": text}`` for ``--limit`` (checked
    here first, so a typo is a usage error before any request), else ``average``/``period``
    from ``--rate``/``--period`` (nothing for ``--clear`` alone)."""
    from limiter import Policy

    if args.limit is None:
        if args.rate is None:
            if not args.clear:
                raise CliError('adjust needs --limit (like "100/minute") or --rate (or --clear)', EXIT_USAGE)
            return {}
        return {"average": args.rate, "period": args.period if args.period is not None else 1.0}
    if args.rate is not None or args.period is not None:
        raise CliError("give --limit or --rate/--period, not both", EXIT_USAGE)
    try:
        Policy.parse(args.limit, burst=args.burst, algorithm=args.algorithm or "token_bucket")
    except ValueError as exc:
        field, _, reason = str(exc).partition(": ")
        raise CliError(f"--{field}: {reason}", EXIT_USAGE) from None
    return {"limit": args.limit}
