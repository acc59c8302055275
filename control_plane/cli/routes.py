"""``shadowlimit routes``: every route with its mode, divergence, the gate of its next step,
its global limit when it differs from the rules file's, its candidate limit and its rollout
plan on lines of their own under it."""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Any

from .output import EXIT_OK, EXIT_STALE, print_json, print_table, wants_json, wrap
from .remote import request

__all__ = ["candidate_line", "cmd_routes", "late_cell"]


def cmd_routes(args: argparse.Namespace) -> int:
    data = request(args, "GET", "/v1/routes")
    stale = _stale(data, args.stale_after)
    if wants_json(args):
        print_json(data)
        return EXIT_STALE if stale else EXIT_OK
    # LATE (answers by the failure policy for want of time) only once a route has some
    late = any(late_cell(r) != "-" for r in data["routes"])
    rows = [
        [
            "ROUTE",
            "MODE",
            "DEC/S",
            "COMPARED(5m)",
            "NEW REJ",
            "SAMPLED",
            *(["LATE"] if late else []),
            "GATE (next step)",
        ]
    ]
    for r in data["routes"]:
        rows.append(_route_row(r, late))
        rows += _under(r, late)
    offset = sum(max(len(row[i]) for row in rows) + 2 for i in range(len(rows[0]) - 1))
    table: list[list[str]] = []
    for row in rows:
        lines = wrap(row[-1], shutil.get_terminal_size((120, 24)).columns - offset, indent="  ")
        table.append([*row[:-1], lines[0]])
        table += [[""] * (len(row) - 1) + [line] for line in lines[1:]]
    print_table(table)
    age = data.get("figures_age_s")
    print(f"\nfleet figures: STALE, {stale}" if stale else f"\nfleet figures: {age:.1f}s old")
    if stale:
        print(f"shadowlimit routes: the fleet figures are stale: {stale}", file=sys.stderr)
        return EXIT_STALE
    return EXIT_OK


def _under(r: dict[str, Any], late: bool) -> list[list[str]]:
    """The lines under a route's row: its global limit when it is not the rules file's
    (a runtime adjustment, a promoted candidate), its candidate limit and its plan."""
    out = []
    limit = r.get("limit") or {}
    if limit.get("adjusted"):
        note = f"{limit.get('describe')} (rules file: {_describe(limit['rules'])})"
        out.append(["  ↳ limit", "", "", "", "", "", *([""] if late else []), note])
    cand = r.get("candidate")
    if cand:
        out.append(candidate_line(cand, late))
    if r.get("plan"):
        from .plan import plan_line

        out.append(plan_line(r["plan"], late))
    return out


def candidate_line(cand: dict[str, Any], late: bool = False) -> list[str]:
    """A candidate limit's row: its comparisons with the current limit since it was set and
    the gate of its promotion."""
    totals = cand.get("totals") or {}
    share = totals.get("sampled_share")
    gate = cand.get("gate")
    if gate is None:
        verdict = "promote: no figures yet"
    elif gate.get("passed"):
        verdict = "promote: pass"
    else:
        verdict = "promote: " + "; ".join(gate.get("reasons") or ["refused"])
    text = (
        f"{cand.get('describe')}; newly admitted {totals.get('newly_admitted', 0):,}"
        f" ({totals.get('newly_admitted_share', 0):.2%}); {verdict}"
    )
    return [
        "  ↳ candidate",
        "",
        "",
        str(totals.get("compared", "-")),
        f"{totals.get('newly_rejected_share', 0):.2%}" if totals else "-",
        "-" if share is None else f"{share:.1%}",
        *([""] if late else []),
        text,
    ]


def _describe(p: dict[str, Any]) -> str:
    """A policy as the control plane describes it: ``10/1s burst 10 (token_bucket)``."""
    return f"{p.get('average', 0):g}/{p.get('period', 1):g}s burst {p.get('burst')} ({p.get('algorithm')})"


def _stale(data: dict[str, Any], max_age_s: float) -> str | None:
    """Why the fleet figures ``GET /v1/routes`` gave are stale, or None when they are fresh."""
    age, error = data.get("figures_age_s"), data.get("figures_error")
    if age is None:
        return "no fleet figures read yet" + (f" (last refresh failed: {error})" if error else "")
    if error:
        return f"{age:.0f}s old, the last refresh failed: {error}"
    if age > max_age_s:
        return f"{age:.0f}s old (more than --stale-after {max_age_s:g}s)"
    return None


def _route_row(r: dict[str, Any], late: bool = False) -> list[str]:
    div = r.get("divergence_5m") or {}
    mode = f"canary {r['canary_percent']}%" if r["mode"] == "canary" else r["mode"]
    share = div.get("sampled_share")
    sampled = (
        "-" if share is None else f"{share:.1%}" + (f" ({div.get('shadow_dropped', 0):,} dropped)" if share < 1 else "")
    )
    return [
        r["name"],
        mode,
        str(r["decisions_per_s"]),
        str(div.get("compared", "-")),
        f"{div.get('new_rejection_rate', 0):.2%}" if div else "-",
        sampled,
        *([late_cell(r)] if late else []),
        _gate_cell(r),
    ]


def late_cell(r: dict[str, Any]) -> str:
    """This replica's answers by the failure policy for want of time (a caller's deadline):
    ``redis_timeout/no_time`` (Redis too slow / too little time left), ``-`` for none."""
    late = r.get("deadline_answers") or {}
    slow, none = int(late.get("redis_timeout", 0)), int(late.get("no_time", 0))
    return f"{slow}/{none}" if slow or none else "-"


def _gate_cell(r: dict[str, Any]) -> str:
    """The runbook's next step and whether its gate passes now, with every reason it
    does not (empty for an enforced route: there is no next step)."""
    gate = r.get("gate")
    if "next_step" in r:
        step = r["next_step"]
    else:  # a control plane from before next_step: its gate's target
        step = {"mode": gate.get("target"), "canary_percent": 10} if gate else None
    if not step:
        return ""
    label = f"->{step['mode']}" + (f" {step['canary_percent']}%" if step["mode"] == "canary" else "")
    if gate is None or not gate.get("required", True):
        return f"{label} (not gated)"
    if gate.get("passed"):
        return f"{label}: pass"
    return f"{label}: " + "; ".join(gate.get("reasons") or ["refused"])
