"""What the ``shadowlimit`` command accepts as a number, and the options every command that
talks to a control plane shares: one place for both.

Every numeric option is parsed by one of the types here: a value that is not a number, not
finite (``nan``, ``inf``) or out of its range is a usage error naming the option (exit 2,
one line; with ``--json`` a JSON error on stdout), found by the parser before anything is
sent or started. A timeout is a positive number of seconds: ``--timeout 0`` would wait for
nothing and report the control plane unreachable (exit 3).

The connection options (``--url``, ``--token``, ``--timeout``, and for an HTTPS URL ``--ca-file``,
``--client-cert``, ``--client-key``) go before the command or after
it (``shadowlimit --url URL routes`` or ``shadowlimit routes --url URL``; after wins), as
``--json`` does; :func:`connection_options` checks them once the command is known.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any

from .output import UsageError

__all__ = [
    "CONNECTION_OPTIONS",
    "MAX_SECONDS",
    "add_connection_options",
    "amount",
    "connection_options",
    "count",
    "duration",
    "period",
    "port",
    "seconds",
    "share",
]

#: the longest timeout or duration an option takes: a day
MAX_SECONDS = 86_400.0
#: the most tokens per period a limit may have (the API's bound)
MAX_AMOUNT = 1e9
#: the options every command that talks to a control plane takes, before or after its name
CONNECTION_OPTIONS = ("url", "token", "timeout", "ca_file", "client_cert", "client_key")
DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S = 10.0


def _number(text: str, what: str, number: str | None = None) -> float:
    """``number`` (default ``text``, the option's value as typed) as a finite float."""
    try:
        value = float(text if number is None else number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r} (not a finite number)")
    return value


def _between(value: float, low: float, high: float, text: str, what: str, *, open_low: bool = False) -> None:
    if value < low or (open_low and value == low) or value > high:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")


def seconds(text: str) -> float:
    """A timeout: more than 0 and at most :data:`MAX_SECONDS` seconds."""
    what = f"a number of seconds more than 0 and at most {MAX_SECONDS:g}"
    value = _number(text, what)
    _between(value, 0, MAX_SECONDS, text, what, open_low=True)
    return value


def duration(text: str) -> float:
    """A duration that may be 0 (``demo --duration``: until stopped; ``--stale-after``)."""
    what = f"a number of seconds from 0 to {MAX_SECONDS:g}"
    value = _number(text, what)
    _between(value, 0, MAX_SECONDS, text, what)
    return value


def period(text: str) -> float:
    """A limit's period: 0.001 s to a day, as ``PUT /ratelimit/config`` takes it."""
    what = f"a number of seconds from 0.001 to {MAX_SECONDS:g}"
    value = _number(text, what)
    _between(value, 0.001, MAX_SECONDS, text, what)
    return value


def amount(text: str) -> float:
    """Tokens per period: 0 (unlimited) to :data:`MAX_AMOUNT`."""
    what = f"a number from 0 to {MAX_AMOUNT:,.0f}"
    value = _number(text, what)
    _between(value, 0, MAX_AMOUNT, text, what)
    return value


def share(text: str) -> float:
    """A share of requests: ``0.5%`` or ``0.005``, 0 to 1."""
    what = "a share like 0.5% or 0.005 (0 to 1)"
    number = text.strip()
    percent = number.endswith("%")
    value = _number(text, what, number[:-1] if percent else number) / (100 if percent else 1)
    _between(value, 0, 1, text, what)
    return value


def count(low: int, high: int) -> Callable[[str], int]:
    """A whole number from ``low`` to ``high``."""
    what = f"a whole number from {low:,} to {high:,}"

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        _between(value, low, high, text, what)
        return value

    parse.__name__ = f"count({low}, {high})"
    return parse


def port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    return count(0, 65535)(text)


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """``--url``, ``--token``, ``--timeout`` and the TLS files on ``parser`` (the command's, or shadowlimit's
    own for the options typed before the command): nothing is set unless given, so the
    value typed after the command wins, and :func:`connection_options` fills the defaults."""
    parser.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help=f"control plane URL (env SHADOWLIMIT_URL, default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        help=(
            "your token (env SHADOWLIMIT_TOKEN or SHADOWLIMIT_ADMIN_TOKEN): viewer to read,"
            " operator to change modes, adjust and reset, admin for everything"
        ),
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help=f"seconds to wait for an answer, more than 0 (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--ca-file",
        default=argparse.SUPPRESS,
        metavar="PEM",
        help="the CA bundle an https:// URL's certificate is checked with (env SHADOWLIMIT_CA_FILE; default: system's)",
    )
    parser.add_argument(
        "--client-cert",
        default=argparse.SUPPRESS,
        metavar="PEM",
        help="your client certificate, for a control plane with mutual TLS (env SHADOWLIMIT_CLIENT_CERT_FILE)",
    )
    parser.add_argument(
        "--client-key",
        default=argparse.SUPPRESS,
        metavar="PEM",
        help="its key, unless in the certificate's file (env SHADOWLIMIT_CLIENT_KEY_FILE)",
    )


def connection_options(args: argparse.Namespace, command: str, takes_them: bool) -> None:
    """Give ``args`` the connection options' defaults (from the environment) when
    ``command`` takes them; when it does not, one typed before it is a usage error."""
    given = [name for name in CONNECTION_OPTIONS if hasattr(args, name)]
    if not takes_them:
        if given:
            raise UsageError(f"--{given[0]}: {command} does not talk to a control plane", command)
        return
    defaults: dict[str, Any] = {
        "url": os.environ.get("SHADOWLIMIT_URL", DEFAULT_URL),
        "token": os.environ.get("SHADOWLIMIT_TOKEN") or os.environ.get("SHADOWLIMIT_ADMIN_TOKEN"),
        "timeout": DEFAULT_TIMEOUT_S,
        "ca_file": os.environ.get("SHADOWLIMIT_CA_FILE") or None,
        "client_cert": os.environ.get("SHADOWLIMIT_CLIENT_CERT_FILE") or None,
        "client_key": os.environ.get("SHADOWLIMIT_CLIENT_KEY_FILE") or None,
    }
    for name, value in defaults.items():
        if not hasattr(args, name):
            setattr(args, name, value)
