"""Talking to a running control plane over HTTP, for the commands that do
(:func:`request`), and printing its answer as a table or JSON (:func:`show`)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from .output import EXIT_UNREACHABLE, EXIT_USAGE, CliError, error_for_response, print_json, print_table, wants_json

__all__ = ["request", "show", "tls_of"]


def tls_of(args: argparse.Namespace) -> Any:
    """What httpx verifies with (``verify=``): the system's CAs, or a context from
    ``--ca-file`` and the client certificate; a file that cannot be used is a usage error."""
    from pathlib import Path

    from ..tls.client import client_context

    def path(value: str | None) -> Path | None:
        return Path(value) if value else None

    try:
        return client_context(
            ca_file=path(args.ca_file), cert_file=path(args.client_cert), key_file=path(args.client_key)
        )
    except ValueError as exc:
        raise CliError(f"--ca-file / --client-cert / --client-key: {exc}", EXIT_USAGE) from None


def request(
    args: argparse.Namespace,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
) -> Any:
    import httpx

    headers = {"X-Shadowlimit-Actor": os.environ.get("USER", "cli")}
    if args.token:
        headers["Authorization"] = f"Bearer {args.token}"
    try:
        r = httpx.request(
            method,
            args.url.rstrip("/") + path,
            json=body,
            params=params,
            headers=headers,
            timeout=args.timeout,
            verify=tls_of(args),
        )
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach the control plane at {args.url}: {exc}", EXIT_UNREACHABLE) from None
    try:
        data = r.json()
    except ValueError:
        data = {"message": r.text}
    if r.status_code >= 400:
        raise error_for_response(r.status_code, data, has_token=bool(args.token))
    return data


def show(args: argparse.Namespace, data: Any, table: list[list[str]] | None = None) -> None:
    if wants_json(args) or table is None:
        print_json(data)
    else:
        print_table(table)
