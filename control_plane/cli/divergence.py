"""``shadowlimit divergence ROUTE``: a route's divergence over the last minutes, fleet-wide:
how often the local and global limits disagreed, why (each cause's share, in words:
docs/rollout-runbook.md#why-they-disagree) and who would be blocked, each client with the
main cause of its new rejections (``WHY``). On a route with a budget, the same in its cost unit
("would have refused 14 requests worth 2.1M tokens") and what each client's refusals would cost."""

from __future__ import annotations

import argparse
from typing import Any

from ..model.units import amount
from .options import count
from .output import EXIT_OK, EXIT_REFUSED, CliError, print_json, print_table, wants_json
from .remote import request

__all__ = ["add_divergence_command", "cmd_divergence"]

MAX_MINUTES = 120  # GET /v1/divergence keeps two hours


def cmd_divergence(args: argparse.Namespace) -> int:
    data = request(args, "GET", "/v1/divergence", params={"minutes": args.minutes})
    route = (data.get("routes") or {}).get(args.route)
    if route is None:
        raise CliError(f"no route named {args.route!r}", EXIT_REFUSED)
    if wants_json(args):
        print_json({"route": args.route, "minutes": data["minutes"], "age_s": data.get("age_s"), **route})
        return EXIT_OK
    totals, causes = route["totals"], route["causes"]
    print(
        f"{args.route}: {totals['compared']:,} compared in the last {data['minutes']} min;"
        f" new rejections {totals['new_rejection_rate']:.2%} ({totals['local_allow_distributed_deny']:,}),"
        f" reverse {totals['reverse_rate']:.2%} ({totals['local_deny_distributed_allow']:,})"
    )
    units = route.get("units")
    if units:
        print(f"in {units['unit']}: {units['summary']}")
    if not causes["explain"]:
        print("not explained by cause: the route's rules say explain: false")
    rows = [["WHY", "DIRECTION", "COUNT", "SHARE", "MEANING"]]
    for direction in ("new_rejections", "reverse"):
        part = causes[direction]
        for cause, n in part["by_cause"].items():
            rows.append([cause, _words(direction), f"{n:,}", f"{part['shares'][cause]:.1%}", causes["meaning"][cause]])
        if part["unexplained"]:
            share = part["unexplained"] / part["total"]
            rows.append(["-", _words(direction), f"{part['unexplained']:,}", f"{share:.1%}", "not explained"])
    print()
    print_table(rows)
    for direction in ("new_rejections", "reverse"):
        if causes[direction]["summary"]:
            print(f"{_words(direction)}: {causes[direction]['summary']}")
    blocked = route["would_be_blocked"]
    print()
    if not blocked:
        print("who would be blocked: nobody in the current 5-minute window")
        return EXIT_OK
    cost = units["unit"].upper() if units else None
    table = [["KEY", "COUNT", *([cost] if cost else []), "WHY", "LAST REQUEST"]]
    for b in blocked:
        worth = [amount(b["units"]) if b.get("units") is not None else "-"] if cost else []
        table.append([b["key"], f"{b['count']:,}", *worth, b.get("cause") or "-", b.get("last_request_id") or "-"])
    print_table(table)
    return EXIT_OK


def _words(direction: str) -> str:
    return "new rejections" if direction == "new_rejections" else "reverse"


def add_divergence_command(sub: Any, remote: Any) -> None:
    """``divergence`` (``remote`` makes a command that talks to a control plane)."""
    d = remote(sub, "divergence", "a route's divergence, why (per cause) and who would be blocked")
    d.add_argument("route")
    d.add_argument(
        "--minutes", type=count(1, MAX_MINUTES), default=60, help=f"the last M minutes (1-{MAX_MINUTES}, default 60)"
    )
    d.set_defaults(func=cmd_divergence)
