"""``shadowlimit candidate ROUTE``: a candidate limit in shadow beside the route's current one
(``--limit``), promoted behind its gate (``--promote``, ``--force``) or dropped (``--drop``);
and ``suggest --try-live``, which sends what the what-if replay suggests straight to a
candidate. Every change needs ``--reason`` and the operator's token, and is audited."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from .options import count
from .output import EXIT_OK, EXIT_USAGE, CliError, print_json, wants_json
from .remote import request

__all__ = ["ALGORITHMS", "add_candidate_command", "cmd_candidate", "limit_text", "set_candidate"]

ALGORITHMS = ["token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log"]
MAX_BURST = 1_000_000_000


def limit_text(policy: dict[str, Any]) -> str:
    """A policy's ``average``/``period`` as the limit text the API reads: ``13/1s``."""
    return f"{float(policy['average']):g}/{float(policy['period']):g}s"


def set_candidate(args: argparse.Namespace, route: str, body: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = request(args, "PUT", f"/v1/routes/{quote(route, safe='')}/candidate", body)
    return data


def cmd_candidate(args: argparse.Namespace) -> int:
    chosen = [name for name in ("limit", "drop", "promote") if getattr(args, name)]
    if len(chosen) != 1:
        raise CliError("give one of --limit, --drop or --promote", EXIT_USAGE)
    if args.force and not args.promote:
        raise CliError("--force goes with --promote", EXIT_USAGE)
    path = f"/v1/routes/{quote(args.route, safe='')}/candidate"
    if args.limit:
        body = {"limit": args.limit, "burst": args.burst, "algorithm": args.algorithm, "reason": args.reason}
        data = set_candidate(args, args.route, body)
        said = f"{args.route}: candidate {data['candidate']['describe']} in shadow beside the current limit"
    elif args.drop:
        data = request(args, "DELETE", path, {"reason": args.reason})
        said = f"{args.route}: {data['audit']['to']}"
    else:
        data = request(args, "POST", path + "/promote", {"reason": args.reason, "force": args.force})
        forced = " (forced past the gate)" if data["audit"].get("forced") else ""
        said = f"{args.route}: {data['audit']['to']}{forced}; the global limit is now a runtime adjustment"
    if wants_json(args):
        print_json(data)
    else:
        print(f"{said} (audit {data['audit']['id']})")
    return EXIT_OK


def add_candidate_command(sub: Any, remote: Any) -> None:
    """``candidate`` (``remote`` makes a command that talks to a control plane)."""
    c = remote(sub, "candidate", "set, promote or drop a route's candidate limit (evaluated in shadow beside it)")
    c.add_argument("route")
    c.add_argument("--limit", help='the candidate limit: "20/second", "100/minute", "1000 per hour"')
    c.add_argument("--burst", type=count(1, MAX_BURST), help="bucket size (default: the limit's quantity)")
    c.add_argument("--algorithm", choices=ALGORITHMS, help="default: the route's current algorithm")
    c.add_argument("--promote", action="store_true", help="make the candidate the route's limit (gated)")
    c.add_argument("--force", action="store_true", help="with --promote: past a failing gate (audited)")
    c.add_argument("--drop", action="store_true", help="drop the candidate")
    c.add_argument("--reason", required=True)
    c.set_defaults(func=cmd_candidate)


def try_live(args: argparse.Namespace, suggested: dict[str, Any]) -> dict[str, Any]:
    """``suggest --try-live``: the suggested policy as the route's candidate."""
    policy = suggested["policy"]
    body = {
        "limit": limit_text(policy),
        "burst": policy.get("burst"),
        "algorithm": policy.get("algorithm"),
        "reason": args.reason or f"whatif suggest: at most {args.max_reject:.2%} rejected in the replay",
    }
    return set_candidate(args, args.route, body)
