"""``python -m dashboard --url URL [--token T]`` (defaults: SHADOWLIMIT_URL, SHADOWLIMIT_ADMIN_TOKEN)."""

from __future__ import annotations

import argparse
import os
import sys

from .app import run_dashboard


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dashboard",
        description="The shadowlimit terminal dashboard (talks to the control plane over HTTP only).",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("SHADOWLIMIT_URL", "http://127.0.0.1:8080"),
        help="control plane URL (env SHADOWLIMIT_URL; default %(default)s)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("SHADOWLIMIT_ADMIN_TOKEN") or None,
        help=(
            "token (env SHADOWLIMIT_ADMIN_TOKEN): a viewer token to watch a control plane that has a tokens file,"
            " an operator or admin token to change modes; without one the dashboard is read-only"
        ),
    )
    parser.add_argument(
        "--replica", action="append", default=[], metavar="URL", help="another replica to switch to with n (repeatable)"
    )
    args = parser.parse_args(argv)
    return run_dashboard(args.url, args.token, replicas=[args.url, *args.replica] if args.replica else None)


if __name__ == "__main__":
    sys.exit(main())
