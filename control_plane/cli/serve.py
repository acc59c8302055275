"""``shadowlimit serve``: the configuration checked before anything starts (every error
names its setting or file:line, exit 2), then one process or the supervisor of
``--workers N``; and the service's log setup."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .output import EXIT_OK, EXIT_USAGE, CliError

__all__ = ["serve"]


def serve(args: argparse.Namespace) -> int:
    """``shadowlimit serve``: check the configuration (errors name the setting or file:line), then run."""
    from limiter.errors import BackendAuthError

    from ..observe.logs import configure_logging
    from ..rules import RulesError, load_rules
    from ..settings import SettingsError, load_settings
    from ..tls import TlsFileError, check_tls
    from ..wiring import NO_REDIS_URL, check_redis

    overrides: dict[str, Any] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.embedded_redis:
        overrides["embedded_redis"] = True
    if args.grpc_port is not None:
        overrides["grpc_port"] = args.grpc_port
    if args.workers is not None:
        overrides["workers"] = args.workers
    try:
        settings = load_settings(**overrides)
        if settings.redis_url is None and not settings.embedded_redis:
            raise CliError(NO_REDIS_URL, EXIT_USAGE)
        if settings.redis_url is not None:
            problem = check_redis(settings.redis_connection(settings.redis_url))  # TLS files, the login
            if problem:
                print(f"warning: Redis is not reachable now ({problem}); starting anyway", file=sys.stderr)
        load_rules(settings.rules_path, settings)  # fail fast with file:line:field
        _check_envoy(settings)
        check_tls(settings)  # the ports' certificates, keys and client CAs (the setting and the file named)
    except SettingsError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    except TlsFileError as exc:  # before ValueError (it is one)
        raise CliError(f"invalid configuration:\n  {exc}", EXIT_USAGE) from None
    except RulesError as exc:
        raise CliError(f"invalid rules file: {exc}", EXIT_USAGE) from None
    except BackendAuthError as exc:
        raise CliError(f"RATE_LIMIT_REDIS_URL: {exc}", EXIT_USAGE) from None
    except ValueError as exc:  # after RulesError (a ValueError too): a TLS file that cannot be used
        raise CliError(
            f"invalid configuration:\n  RATE_LIMIT_REDIS_URL / RATE_LIMIT_REDIS_TLS_*: {exc}", EXIT_USAGE
        ) from None
    if settings.admin_token is None and settings.tokens_file is None:
        print(
            "warning: neither SHADOWLIMIT_ADMIN_TOKEN nor SHADOWLIMIT_TOKENS_FILE is set:"
            " mode changes and admin calls will be refused (403)",
            file=sys.stderr,
        )
    configure_logging(args.log_level, settings.log_format)
    return _run(settings, overrides, args.log_level)


def _run(settings: Any, overrides: dict[str, Any], log_level: str) -> int:
    """One process, or the supervisor of ``--workers N``."""
    from ..server.workers import run_server, serve_workers

    if settings.workers > 1:
        if settings.port == 0:
            raise CliError("SHADOWLIMIT_PORT / --port: 0 (any free port) would give each worker its own", EXIT_USAGE)
        _check_port(settings.host, settings.port, "SHADOWLIMIT_PORT / --port")  # the workers share it: nobody else
        return serve_workers(settings, overrides, settings.workers, log_level)
    run_server(settings, log_level)
    return EXIT_OK


def _check_envoy(settings: Any) -> None:
    """The gRPC port can be listened on and the Envoy configuration is valid (file:line)."""
    from ..rules import RulesError

    if settings.grpc_port:
        from ..extras import MissingExtra, require_extra

        try:
            require_extra("envoy", "SHADOWLIMIT_GRPC_PORT / --grpc-port (Envoy's rate limit service over gRPC)")
        except MissingExtra as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        _check_port(settings.host, settings.grpc_port, "SHADOWLIMIT_GRPC_PORT / --grpc-port")
    if settings.envoy_config is not None:
        from ..envoy import load_envoy_config

        try:
            load_envoy_config(settings.envoy_config, settings)
        except RulesError as exc:
            raise CliError(f"invalid Envoy configuration (SHADOWLIMIT_ENVOY_CONFIG): {exc}", EXIT_USAGE) from None


def _check_port(host: str, port: int, setting: str) -> None:
    """A port this process cannot listen on is a startup error naming the setting."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise CliError(f"{setting}: cannot listen on {host}:{port}: {exc.strerror or exc}", EXIT_USAGE) from None
