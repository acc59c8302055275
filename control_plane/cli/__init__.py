"""The ``shadowlimit`` command: serve, demo, dash, and admin commands against a running
control plane (the admin commands: stats, reset, adjust, top, clients; the rollout's: routes,
mode, audit, divergence, whatif, suggest, candidate), and its shell completion.

Every command takes ``--json`` (JSON on stdout, errors too). Exit codes scripts can use
(:data:`control_plane.cli.output.EXIT_CODES`, listed in every ``--help``): 0 ok, 1 refused
by the server, 2 bad usage or configuration, 3 cannot reach the control plane, 4 not
authorised, 5 refused by a promotion gate, 6 the control plane cannot reach Redis (503,
nothing written: retry later), 7 ``routes``: the fleet figures are stale.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any
from urllib.parse import quote

from .. import package_version
from .candidate import add_candidate_command
from .divergence import add_divergence_command
from .options import (
    add_connection_options,
    amount,
    connection_options,
    count,
    duration,
    period,
    port,
    share,
)
from .output import (
    EXIT_AUTH,
    EXIT_GATE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_REFUSED,
    EXIT_STALE,
    EXIT_UNAVAILABLE,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
    CliParser,
    UsageError,
    print_error,
    print_json,
    wants_json,
)
from .plan import add_plan_command
from .remote import request, show
from .routes import cmd_routes

__all__ = [
    "EXIT_AUTH",
    "EXIT_GATE",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_STALE",
    "EXIT_UNAVAILABLE",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "CliError",
    "build_parser",
    "main",
]


# -- talking to a control plane: remote.request / remote.show ---------------------------


def cmd_mode(args: argparse.Namespace) -> int:
    if args.mode == "canary" and args.percent is None:
        raise CliError("canary needs --percent (1-100)", EXIT_USAGE)
    body = {"mode": args.mode, "canary_percent": args.percent or 0, "reason": args.reason, "force": args.force}
    data = request(args, "PUT", f"/v1/routes/{quote(args.route, safe='')}/mode", body)
    if wants_json(args):
        print_json(data)
        return EXIT_OK
    st = data["state"]
    print(
        f"{args.route}: {data['audit']['from']} -> {st['mode']}"
        + (f" {st['canary_percent']}%" if st["mode"] == "canary" else "")
        + f" (audit {data['audit']['id']})"
    )
    return EXIT_OK


def cmd_audit(args: argparse.Namespace) -> int:
    data = request(
        args, "GET", "/v1/rollout/audit", params={"limit": args.limit, **({"route": args.route} if args.route else {})}
    )
    rows = [["AT", "KIND", "ROUTE", "FROM", "TO", "ACTOR", "REASON"]]
    import datetime as dt

    for e in data["entries"]:
        at = dt.datetime.fromtimestamp(e["at"]).strftime("%Y-%m-%d %H:%M:%S")
        to = e["to"] + (f" {e['to_percent']}%" if e["to"] == "canary" else "")
        flags = (" [forced]" if e.get("forced") else "") + (" [auto]" if e.get("automatic") else "")
        rows.append([at, e["kind"], e["route"], e["from"], to, e["actor"], e["reason"] + flags])
    show(args, data, rows)
    return EXIT_OK


def cmd_stats(args: argparse.Namespace) -> int:
    show(args, request(args, "GET", "/ratelimit/stats"))
    return EXIT_OK


def cmd_top(args: argparse.Namespace) -> int:
    data = request(
        args, "GET", "/v1/buckets", params={"limit": args.limit, **({"route": args.route} if args.route else {})}
    )
    rows = [["ROUTE", "KEY", "RECENT", "LOCAL TOKENS", "DISTRIBUTED TOKENS"]]
    for b in data["buckets"]:
        d = b.get("distributed")
        rows.append(
            [
                b["route"],
                b["key"],
                str(b["recent_requests"]),
                f"{b['local']['tokens']:.1f}/{b['local']['limit']}",
                f"{d['tokens']:.1f}/{d['limit']}" if d else "-",
            ]
        )
    show(args, data, rows)
    return EXIT_OK


def cmd_clients(args: argparse.Namespace) -> int:
    show(
        args,
        request(
            args,
            "GET",
            "/ratelimit/clients",
            params={"limit": args.limit, **({"route": args.route} if args.route else {})},
        ),
    )
    return EXIT_OK


def cmd_reset(args: argparse.Namespace) -> int:
    data = request(
        args,
        "POST",
        f"/ratelimit/reset/{quote(args.id, safe='')}",
        params={"route": args.route} if args.route else None,
    )
    if wants_json(args):
        print_json(data)
        return EXIT_OK
    print(f"reset {args.id}: {data['local_reset']} local and {data['distributed_reset']} distributed buckets")
    return EXIT_OK


def cmd_adjust(args: argparse.Namespace) -> int:
    from .rules import adjust_limit_fields

    body: dict[str, Any] = {
        "route": args.route,
        "key": args.key,
        "target": args.target,
        **adjust_limit_fields(args),
        "burst": args.burst,
        "algorithm": args.algorithm,
        "reason": args.reason,
        "clear": args.clear,
    }
    show(args, request(args, "PUT", "/ratelimit/config", body))
    return EXIT_OK


def _rate(text: str) -> tuple[float, float]:
    """``50/1s``, ``100/minute``, ``1000 per hour``: (average, period in seconds)."""
    from .rules import parse_rate_option

    return parse_rate_option(text, "--rate")


def _replay_row(name: str, r: dict[str, Any]) -> list[str]:
    return [name, r["policy_describe"], f"{r['requests']:,.0f}", f"{r['rejections']:,.0f}", f"{r['reject_share']:.2%}"]


def _replay_table(data: dict[str, Any], rows: list[list[str]]) -> list[list[str]]:
    """The replay rows, then the top keys of the first replay."""
    first = data.get("candidate") or data.get("replay") or {}
    rows.append(["", "", "", "", ""])
    rows.append(["TOP KEY", "", "REQUESTS", "REJECTED", ""])
    rows += [["  " + k["key"], "", f"{k['requests']:,.0f}", f"{k['rejections']:,.0f}", ""] for k in first["top_keys"]]
    rows.append([f"recorded share {data['recorded_share']:.1%} over {data['minutes_recorded']} min", "", "", "", ""])
    return rows


def cmd_whatif(args: argparse.Namespace) -> int:
    average, period = _rate(args.rate)
    policy = {"algorithm": args.algorithm, "average": average, "period": period, "burst": args.burst}
    body = {"route": args.route, "policy": policy, "minutes": args.minutes}
    data = request(args, "POST", "/v1/whatif", body)
    rows = [["REPLAY", "POLICY", "REQUESTS", "REJECTED", "SHARE"]]
    rows += [_replay_row("candidate", data["candidate"]), _replay_row("current", data["current"])]
    show(args, data, _replay_table(data, rows))
    return EXIT_OK


def cmd_suggest(args: argparse.Namespace) -> int:
    body = {
        "route": args.route,
        "algorithm": args.algorithm,
        "max_reject_share": args.max_reject,
        "minutes": args.minutes,
    }
    data = request(args, "POST", "/v1/whatif/suggest", body)
    if args.try_live:  # the suggestion, straight to a candidate evaluated live beside the route's limit
        from .candidate import try_live

        data = {**data, "try_live": try_live(args, data)}
    rows = [["SUGGESTED", "POLICY", "REQUESTS", "REJECTED", "SHARE"], _replay_row(args.route, data["replay"])]
    show(args, data, _replay_table(data, rows))
    if args.try_live and not wants_json(args):
        cand = data["try_live"]["candidate"]
        print(f"\n{args.route}: candidate {cand['describe']} now in shadow beside the current limit"
              f" (audit {data['try_live']['audit']['id']}); watch it with `shadowlimit routes`")  # fmt: skip
    return EXIT_OK


# -- local processes ----------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve import serve

    return serve(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    if args.base_port and args.base_port + args.replicas - 1 > 65535:
        raise CliError(f"--base-port: {args.replicas} replicas from port {args.base_port} pass 65535", EXIT_USAGE)

    return run_demo(args)


def cmd_dash(args: argparse.Namespace) -> int:
    from ..extras import MissingExtra, require_extra

    try:
        require_extra("dashboard", "shadowlimit dash")
    except MissingExtra as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    from dashboard.app import run_dashboard

    if args.theme is not None:
        from textual.theme import BUILTIN_THEMES

        if args.theme not in BUILTIN_THEMES:
            known = ", ".join(sorted(BUILTIN_THEMES))
            raise CliError(f"--theme: unknown theme {args.theme!r} (known: {known})", EXIT_USAGE)
    from .remote import tls_of

    verify = tls_of(args)
    return run_dashboard(args.url, args.token, theme=args.theme, tls=verify if verify is not True else None)


def cmd_completion(args: argparse.Namespace) -> int:
    from .completion import completion_script

    script = completion_script(build_parser(), args.shell)
    if wants_json(args):
        print_json({"shell": args.shell, "script": script})
    else:
        sys.stdout.write(script)
    return EXIT_OK


#: the bounds of numeric options that are the control plane's own bounds
MAX_WORKERS = 64  # SHADOWLIMIT_WORKERS
MAX_DEMO_REPLICAS = 16
MAX_BURST = 1_000_000_000_000
MAX_MINUTES = 24 * 60  # POST /v1/whatif


def build_parser() -> CliParser:
    p = CliParser(
        prog="shadowlimit",
        description="Move a fleet from per-replica rate limits to one global Redis-backed limit, safely.",
    )
    p.add_argument("--version", action="version", version=f"shadowlimit {package_version()}")
    add_connection_options(p)  # also before the command: shadowlimit --url URL routes
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_local_commands(sub)
    _add_remote_commands(sub)
    from .rules import add_rules_commands

    add_rules_commands(sub)
    comp = _command(sub, "completion", "print a shell completion script (bash, zsh or fish)")
    comp.add_argument("shell", choices=["bash", "zsh", "fish"])
    comp.set_defaults(func=cmd_completion)
    return p


def _command(sub: Any, name: str, help_: str) -> CliParser:
    """A subcommand whose ``--help`` starts with what it does."""
    parser: CliParser = sub.add_parser(name, help=help_, description=help_)
    return parser


def _add_local_commands(sub: Any) -> None:
    """``serve`` and ``demo``: the commands that run a control plane here."""
    s = _command(sub, "serve", "run the control plane (production entry)")
    s.add_argument("--host", default=None, help="listen address (default SHADOWLIMIT_HOST or 127.0.0.1)")
    s.add_argument("--port", type=port, default=None, help="listen port (default SHADOWLIMIT_PORT or 8080)")
    s.add_argument(
        "--grpc-port",
        type=port,
        default=None,
        help="also serve Envoy's rate limit service (gRPC) on this port (default SHADOWLIMIT_GRPC_PORT: off)",
    )
    s.add_argument(
        "--workers",
        type=count(1, MAX_WORKERS),
        default=None,
        help="worker processes on the one port, each a fleet instance (default SHADOWLIMIT_WORKERS or 1)",
    )
    s.add_argument("--log-level", default="info")
    s.add_argument(
        "--embedded-redis",
        action="store_true",
        help="development only: with no RATE_LIMIT_REDIS_URL, start a private redis-server for this process",
    )
    s.set_defaults(func=cmd_serve)

    d = _command(sub, "demo", "the main job: embedded Redis, 3 replicas, demo traffic, dashboard")
    d.add_argument("--no-dash", action="store_true", help="run headless; print where it listens and the admin token")
    d.add_argument("--replicas", type=count(1, MAX_DEMO_REPLICAS), default=3, help="replicas to start (1-16)")
    d.add_argument("--keep-logs", action="store_true", help="keep the demo's logs and rules after it stops")
    d.add_argument(
        "--no-restart", action="store_true", help="never restart a replica (by default the last restarts once)"
    )
    d.add_argument(
        "--tls",
        action="store_true",
        help="the replicas' ports over mutual TLS, with a CA and certificates made for the demo (openssl)",
    )
    d.add_argument("--base-port", type=port, default=0, help="first replica port (default: free ports)")
    d.add_argument(
        "--duration",
        type=duration,
        default=0,
        help="stop after this many seconds (0 = until Ctrl-C / quitting the dashboard)",
    )
    d.set_defaults(func=cmd_demo)


def _remote(sub: Any, name: str, help_: str) -> CliParser:
    """A command that talks to a control plane over HTTP: ``--url``, ``--token``, ``--timeout``
    (:mod:`control_plane.cli.options`)."""
    sp = _command(sub, name, help_)
    add_connection_options(sp)
    sp.connection = True
    return sp


def _add_remote_commands(sub: Any) -> None:
    """The dashboard and the commands that read or change a running control plane."""
    dash = _remote(sub, "dash", "the terminal dashboard")
    dash.add_argument(
        "--theme", default=None, help="a Textual theme, e.g. textual-light (default: $SHADOWLIMIT_DASHBOARD_THEME)"
    )
    dash.set_defaults(func=cmd_dash)

    rt = _remote(sub, "routes", "list routes, modes, divergence and the gate of each route's next step")
    rt.add_argument(
        "--stale-after",
        type=duration,
        default=10.0,
        metavar="SECONDS",
        help="fleet figures older than this (or whose last refresh failed) are stale: exit 7 (default 10)",
    )
    rt.set_defaults(func=cmd_routes)
    m = _remote(sub, "mode", "move a route to off, shadow, canary or enforce")
    m.add_argument("route")
    m.add_argument("mode", choices=["off", "shadow", "canary", "enforce"])
    m.add_argument("--percent", type=count(1, 100), help="canary percentage (1-100)")
    m.add_argument("--reason", required=True)
    m.add_argument("--force", action="store_true", help="override a failing gate (audited)")
    m.set_defaults(func=cmd_mode)
    a = _remote(sub, "audit", "the rollout audit trail")
    a.add_argument("--route")
    a.add_argument("--limit", type=count(1, 1000), default=50, help="entries, newest first (1-1000)")
    a.set_defaults(func=cmd_audit)
    _remote(sub, "stats", "rate limiting statistics").set_defaults(func=cmd_stats)
    t = _remote(sub, "top", "most active clients with local and distributed tokens")
    t.add_argument("--route")
    t.add_argument("--limit", type=count(1, 200), default=20, help="keys (1-200)")
    t.set_defaults(func=cmd_top)
    c = _remote(sub, "clients", "active rate-limited clients")
    c.add_argument("--route")
    c.add_argument("--limit", type=count(1, 1000), default=50, help="clients (1-1000)")
    c.set_defaults(func=cmd_clients)
    r = _remote(sub, "reset", "reset a client's buckets")
    r.add_argument("id")
    r.add_argument("--route")
    r.set_defaults(func=cmd_reset)
    adj = _remote(sub, "adjust", "adjust a route's or a client's limit at runtime")
    adj.add_argument("--route", required=True)
    adj.add_argument("--key", help="one client's key (default: the whole route)")
    adj.add_argument("--limit", help='the limit as text: "100/minute", "5/1s", "1000 per hour" (burst: the quantity)')
    adj.add_argument("--rate", type=amount, help="tokens per period (0 = unlimited); or use --limit")
    adj.add_argument("--period", type=period, default=None, help="seconds, with --rate (default 1)")
    adj.add_argument("--burst", type=count(1, MAX_BURST))
    adj.add_argument(
        "--algorithm",
        choices=["token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log"],
        help="default token_bucket",
    )
    adj.add_argument("--target", choices=["local", "distributed", "both"], default="both")
    adj.add_argument("--reason", default="adjusted via CLI")
    adj.add_argument("--clear", action="store_true")
    adj.set_defaults(func=cmd_adjust)
    algorithms = ["token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log"]
    w = _remote(sub, "whatif", "replay a route's recorded traffic against a candidate limit")
    w.add_argument("route")
    w.add_argument("--rate", required=True, help="the candidate limit: 50/1s, 100/minute, 1000 per hour")
    w.add_argument("--burst", type=count(1, MAX_BURST), help="bucket size (default: the rate's N)")
    w.add_argument("--algorithm", choices=algorithms, default="token_bucket")
    w.add_argument(
        "--minutes", type=count(1, MAX_MINUTES), default=15, help="the last M minutes of recording (default 15)"
    )
    w.set_defaults(func=cmd_whatif)
    sg = _remote(sub, "suggest", "the smallest limit whose replay rejects at most a share of requests")
    sg.add_argument("route")
    sg.add_argument("--max-reject", type=share, required=True, help="a share: 0.5%% or 0.005")
    sg.add_argument("--algorithm", choices=algorithms, default="token_bucket")
    sg.add_argument("--minutes", type=count(1, MAX_MINUTES), default=15, help="the last M minutes of recording")
    sg.add_argument("--try-live", action="store_true", help="set the suggestion as the route's candidate limit")
    sg.add_argument("--reason", help="with --try-live: the audit trail's reason (default: what was asked)")
    sg.set_defaults(func=cmd_suggest)
    add_candidate_command(sub, _remote)
    add_divergence_command(sub, _remote)
    add_plan_command(sub, _remote)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        connection_options(args, args.command, parser.subcommands[args.command].connection)
    except UsageError as exc:  # one line, or a JSON object on stdout with --json
        command = exc.command or next((a for a in argv if a in parser.subcommands), "")
        print_error(command, exc, "--json" in argv)
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print_error(args.command, exc, wants_json(args))
        return exc.code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The output's reader closed its end (``| head``): end quietly, as ``cat`` would, and keep
    the interpreter's own flush at exit from printing a traceback about the same pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_PIPE
