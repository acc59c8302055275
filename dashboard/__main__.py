"""``python -m dashboard --url URL [--token T] [--theme NAME] [--ca-file PEM] [--client-cert PEM]``
(defaults: SHADOWLIMIT_URL, SHADOWLIMIT_ADMIN_TOKEN, SHADOWLIMIT_DASHBOARD_THEME, SHADOWLIMIT_CA_FILE,
SHADOWLIMIT_CLIENT_CERT_FILE)."""

from __future__ import annotations

import argparse
import os
import ssl
import sys

try:
    from textual.theme import BUILTIN_THEMES
except ImportError:  # installed without the dashboard extra: say which to install
    sys.exit(
        "python -m dashboard needs the dashboard extra (textual is not installed): pip install 'shadowlimit[dashboard]'"
    )

from .app import THEME_ENV, run_dashboard


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
        "--ca-file",
        default=os.environ.get("SHADOWLIMIT_CA_FILE") or None,
        metavar="PEM",
        help="the CA bundle an https:// URL's certificate is checked with (env SHADOWLIMIT_CA_FILE)",
    )
    parser.add_argument(
        "--client-cert",
        default=os.environ.get("SHADOWLIMIT_CLIENT_CERT_FILE") or None,
        metavar="PEM",
        help="a client certificate, for a control plane with mutual TLS (env SHADOWLIMIT_CLIENT_CERT_FILE)",
    )
    parser.add_argument(
        "--client-key",
        default=os.environ.get("SHADOWLIMIT_CLIENT_KEY_FILE") or None,
        metavar="PEM",
        help="its key, unless in the certificate's file (env SHADOWLIMIT_CLIENT_KEY_FILE)",
    )
    parser.add_argument(
        "--replica", action="append", default=[], metavar="URL", help="another replica to switch to with n (repeatable)"
    )
    parser.add_argument(
        "--theme",
        metavar="NAME",
        help=(
            f"Textual theme to start with, e.g. textual-dark, textual-light, solarized-light (env {THEME_ENV});"
            " switch while running with ctrl+p, Theme"
        ),
    )
    args = parser.parse_args(argv)
    source, theme = ("--theme", args.theme) if args.theme is not None else (THEME_ENV, os.environ.get(THEME_ENV))
    theme = (theme or "").strip() or None
    if theme is not None and theme not in BUILTIN_THEMES:
        parser.error(f"{source}: unknown theme {theme!r} (known: {', '.join(sorted(BUILTIN_THEMES))})")
    replicas = [args.url, *args.replica] if args.replica else None
    tls = None
    if args.ca_file or args.client_cert:
        try:
            tls = ssl.create_default_context(cafile=args.ca_file)
            if args.client_cert:
                tls.load_cert_chain(args.client_cert, args.client_key)
        except (OSError, ssl.SSLError) as exc:
            parser.error(f"--ca-file / --client-cert / --client-key: {exc}")
    return run_dashboard(args.url, args.token, replicas=replicas, theme=theme, tls=tls)


if __name__ == "__main__":
    sys.exit(main())
