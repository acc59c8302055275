"""``shadowlimit plan ROUTE``: a route's rollout plan -- every step with its status, every check
of the last analysis with its value, threshold and outcome, what it waits for -- and the
operator's word on it: ``--pause``, ``--resume``, ``--approve``, ``--abort`` (each needs
``--reason`` and the operator's token, and is audited)."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from .output import EXIT_OK, EXIT_USAGE, CliError, print_json, print_table, wants_json
from .remote import request

__all__ = ["ACTIONS", "add_plan_command", "cmd_plan", "plan_line"]

ACTIONS = ("pause", "resume", "approve", "abort")
_MARKS = {"passed": "✓", "current": "▶", "pending": "·"}


def cmd_plan(args: argparse.Namespace) -> int:
    chosen = [a for a in ACTIONS if getattr(args, a)]
    if len(chosen) > 1:
        raise CliError(f"give one of --{', --'.join(ACTIONS)}", EXIT_USAGE)
    if chosen and not args.reason:
        raise CliError(f"--{chosen[0]} needs --reason (it is audited)", EXIT_USAGE)
    path = f"/v1/routes/{quote(args.route, safe='')}/plan"
    if chosen:
        data = request(args, "POST", f"{path}/{chosen[0]}", {"reason": args.reason})
        if wants_json(args):
            print_json(data)
            return EXIT_OK
        plan = data.get("plan") or {}
        print(f"{args.route}: plan {plan.get('state')} at {plan.get('current')} (audit {data['audit']['id']})")
        return EXIT_OK
    data = request(args, "GET", path)
    if wants_json(args):
        print_json(data)
    else:
        show_plan(data)
    return EXIT_OK


def show_plan(p: dict[str, Any]) -> None:
    """The plan as a person reads it: where it stands, its steps, its checks, the last outcomes."""
    print(f"{p['route']}: {p['describe']} (from the {'rules file' if p['source'] == 'rules' else 'API'})")
    print(f"state: {p['state']} at step {p['step']} of {p['steps']} ({p['current']})" + _in_step(p))
    if p.get("waits_for"):
        print(f"waits for: {p['waits_for']}")
    if p.get("reason"):
        print(f"last change: {p['reason']}")
    rows = [["", "STEP", "FOR", "STATUS", "BEGAN (UTC)"]]
    for s in p.get("step_list") or []:
        held = "-" if s["step"] == "approve" or not s["for_s"] else f"{s['for_s']:g}s"
        rows.append([_MARKS.get(s["status"], " "), s["label"], held, s["status"], _since(s.get("started_at"))])
    print()
    print_table(rows)
    checks = p.get("checks") or []
    if checks:
        print(f"\nanalysis of step {p.get('analysed_step')}:")
        table = [["CHECK", "VALUE", "THRESHOLD", "OUTCOME"]]
        for c in checks:
            value = "-" if c["value"] is None else f"{c['value']:.2%}" if "%" in c["threshold"] else f"{c['value']:g}"
            table.append([c["name"], value, c["threshold"], c["outcome"] + (f": {c['reason']}" if c["reason"] else "")])
        print_table(table)
    recent = p.get("recent") or []
    if recent:
        print("\nlast outcomes: " + " ".join(r["verdict"] for r in recent))
    print(f"driver: {p.get('driver') or 'none'}")


def _in_step(p: dict[str, Any]) -> str:
    if p.get("in_step_s") is None:
        return ""
    left = p.get("time_left_s")
    return f", {p['in_step_s']:.0f}s in it" + (f" ({left:.0f}s to hold)" if left else "")


def _since(at: float | None) -> str:
    """When a step began, as a time of day (UTC)."""
    if at is None:
        return ""
    import time

    return time.strftime("%H:%M:%S", time.gmtime(at))


def plan_line(plan: dict[str, Any], late: bool = False) -> list[str]:
    """A route's plan under its row in ``shadowlimit routes``: its steps (the current one in
    brackets), its state and what it waits for."""
    steps = [f"[{label}]" if i + 1 == plan["step"] else label for i, label in enumerate(plan.get("labels") or [])]
    text = f"{' > '.join(steps)}: {plan['state']}"
    if plan["state"] == "paused" and plan.get("reason"):
        text += f" ({plan['reason']})"
    if plan.get("waits_for"):
        text += f"; waits for {plan['waits_for']}"
    return ["  ↳ plan", "", "", "", "", "", *([""] if late else []), text]


def add_plan_command(sub: Any, remote: Any) -> None:
    """``plan`` (``remote`` makes a command that talks to a control plane)."""
    c = remote(sub, "plan", "a route's rollout plan; pause, resume, approve or abort it")
    c.add_argument("route")
    for action, text in (
        ("pause", "stop the plan where it is"),
        ("resume", "go on from its step (a paused or aborted plan)"),
        ("approve", "approve the step it waits at: the next step is applied"),
        ("abort", "stop it and move the route back to the plan's first step"),
    ):
        c.add_argument(f"--{action}", action="store_true", help=text)
    c.add_argument("--reason", help="why (audited); needed with an action")
    c.set_defaults(func=cmd_plan)
