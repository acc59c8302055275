"""The Redis URL and the settings that complete it: a password from a file (a mounted
Kubernetes secret) and TLS files given as settings instead of URL options. Both ways of
saying a thing must agree: a contradiction stops startup naming both, and the password
never appears in the message."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from limiter.connection import RedisConnection
from limiter.redis_url import RedisTarget, TlsConfig, parse_redis_url

if TYPE_CHECKING:
    from .base import Settings

__all__ = ["apply_redis_settings", "connection_of"]


def _error(message: str) -> ValueError:
    from .errors import SettingsError

    return SettingsError(f"invalid configuration:\n  {message}")


def apply_redis_settings(settings: Settings, url: str) -> RedisTarget:
    """``url`` parsed (see :mod:`limiter.redis_url`), then the settings applied."""
    try:
        target = parse_redis_url(url)
    except ValueError as exc:
        raise _error(f"RATE_LIMIT_REDIS_URL: {exc}") from None
    if settings.redis_password_file is not None:
        if target.endpoint.password:
            raise _error("RATE_LIMIT_REDIS_PASSWORD_FILE: the URL already has a password; give it in one place only")
        password = settings.redis_password_file.read_text().rstrip("\r\n")
        if not password:
            raise _error(f"RATE_LIMIT_REDIS_PASSWORD_FILE: {settings.redis_password_file} is empty")
        target = target.with_password(password)
    return _apply_tls(settings, target)


def _apply_tls(settings: Settings, target: RedisTarget) -> RedisTarget:
    given = {
        "ca_certs": (settings.redis_tls_ca_certs, "RATE_LIMIT_REDIS_TLS_CA_CERTS", "ssl_ca_certs"),
        "certfile": (settings.redis_tls_certfile, "RATE_LIMIT_REDIS_TLS_CERTFILE", "ssl_certfile"),
        "keyfile": (settings.redis_tls_keyfile, "RATE_LIMIT_REDIS_TLS_KEYFILE", "ssl_keyfile"),
        "cert_reqs": (settings.redis_tls_cert_reqs, "RATE_LIMIT_REDIS_TLS_CERT_REQS", "ssl_cert_reqs"),
        "check_hostname": (
            settings.redis_tls_check_hostname,
            "RATE_LIMIT_REDIS_TLS_CHECK_HOSTNAME",
            "ssl_check_hostname",
        ),
    }
    present = {k: v for k, v in given.items() if v[0] is not None}
    if not present:
        return target
    tls = target.endpoint.tls
    if tls is None:
        env = next(iter(present.values()))[1]
        raise _error(f"{env}: TLS settings need a rediss:// URL (rediss+cluster://, rediss+sentinel://)")
    defaults = TlsConfig()
    changes: dict[str, object] = {}
    for attr, (value, env, option) in present.items():
        value = str(value) if attr in ("ca_certs", "certfile", "keyfile") else value
        in_url = getattr(tls, attr)
        if in_url != getattr(defaults, attr) and in_url != value:
            raise _error(f"{env}: the URL's {option} says otherwise; give it in one place only")
        changes[attr] = value
    if "cert_reqs" in changes and "check_hostname" not in changes:
        changes["check_hostname"] = changes["cert_reqs"] == "required"
    try:
        merged = replace(tls, **changes)  # type: ignore[arg-type]
    except ValueError as exc:
        raise _error(f"RATE_LIMIT_REDIS_TLS_*: {exc}") from None
    return target.with_tls(merged)


def connection_of(settings: Settings, url: str) -> RedisConnection:
    """How the replica reaches Redis at ``url``: the target (the URL completed by the password
    file and the TLS settings) and the timeouts, the one description both of its clients
    (the decisions' RESP client and redis-py) are built from."""
    return RedisConnection(
        target=apply_redis_settings(settings, url),
        connect_timeout=settings.redis_connect_timeout_s,
        command_timeout=settings.redis_command_timeout_s,
        socket_timeout=max(1.0, settings.redis_command_timeout_s * 4),
    )
