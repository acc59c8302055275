"""Who may talk to an embedded server and how: TLS, ``requirepass``, ACL users (:class:`Access`).

One :class:`Access` describes a server's security settings and derives everything
from them: the ``redis.conf`` directives, the credentials the launcher itself uses
(the first ACL user, else the default user with ``password``), the userinfo part of
its URLs and the redis-py keyword arguments of its clients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from .process import EmbeddedRedisError
from .tls import TlsServerConfig

__all__ = ["Access", "quote_value"]


def _check_secret(what: str, value: str) -> None:
    if not value or any(c in value for c in "\r\n\0"):
        raise EmbeddedRedisError(f"{what} must be non-empty and free of line breaks / NUL")


@dataclass(frozen=True)
class Access:
    """TLS and authentication settings of one embedded server.

    Args:
        tls: serve TLS only (``port 0`` + ``tls-port``) with these certificates.
        password: the default user's password (``requirepass``).
        acl_users: ``(name, password)`` pairs, each becoming ``user NAME on >PASSWORD
            ~* &* +@all``. Without ``password`` the default user is switched off, so
            every connection must log in as one of them.
    """

    tls: TlsServerConfig | None = None
    password: str | None = None
    acl_users: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(
        cls, tls: TlsServerConfig | None, password: str | None, acl_users: Sequence[tuple[str, str]] | None
    ) -> Access:
        """Validate and build (``acl_users`` may be any sequence of pairs)."""
        users = tuple((str(name), str(secret)) for name, secret in (acl_users or ()))
        if password is not None:
            _check_secret("password", password)
        for name, secret in users:
            if not name or name == "default" or any(c.isspace() or c in "\"'\\" for c in name):
                raise EmbeddedRedisError(f"invalid ACL user name {name!r} (no spaces/quotes; not 'default')")
            _check_secret(f"password of ACL user {name!r}", secret)
        if len({name for name, _ in users}) != len(users):
            raise EmbeddedRedisError("ACL user names must be distinct")
        return cls(tls=tls, password=password, acl_users=users)

    @property
    def login(self) -> tuple[str | None, str | None]:
        """``(username, password)`` the launcher logs in with: the first ACL user, else
        the default user with ``password``; ``(None, None)`` without authentication."""
        if self.acl_users:
            return self.acl_users[0]
        return None, self.password

    @property
    def authenticated(self) -> bool:
        """Whether connections must log in."""
        return bool(self.acl_users) or self.password is not None

    @property
    def scheme(self) -> str:
        """``rediss`` with TLS, else ``redis``."""
        return "rediss" if self.tls is not None else "redis"

    def userinfo(self) -> str:
        """``user:pass@``, ``:pass@`` or ``""`` (URL-quoted) for :attr:`login`."""
        user, password = self.login
        if password is None:
            return ""
        return f"{quote(user or '', safe='')}:{quote(password, safe='')}@"

    def client_kwargs(self) -> dict[str, Any]:
        """redis-py keyword arguments: credentials and, with TLS, the verified-TLS options."""
        user, password = self.login
        kwargs: dict[str, Any] = {}
        if user is not None:
            kwargs["username"] = user
        if password is not None:
            kwargs["password"] = password
        if self.tls is not None:
            kwargs.update(self.tls.client_kwargs())
        return kwargs

    def auth_lines(self) -> list[tuple[str, str]]:
        """``requirepass`` / ``user`` directives (values already quoted for redis.conf)."""
        lines: list[tuple[str, str]] = []
        if self.password is not None:
            lines.append(("requirepass", quote_value(self.password)))
        elif self.acl_users:
            lines.append(("user", "default off"))
        for name, secret in self.acl_users:
            lines.append(("user", f"{name} on {quote_value('>' + secret)} ~* &* +@all"))
        return lines

    def replication_lines(self) -> list[tuple[str, str]]:
        """``masteruser`` / ``masterauth`` so a replica can log in to a master configured alike,
        plus ``tls-replication yes`` with TLS."""
        user, password = self.login
        lines: list[tuple[str, str]] = []
        if user is not None:
            lines.append(("masteruser", quote_value(user)))
        if password is not None:
            lines.append(("masterauth", quote_value(password)))
        if self.tls is not None:
            lines.append(("tls-replication", "yes"))
        return lines

    def listen_lines(self, port: int) -> list[tuple[str, str]]:
        """Where to listen: ``port N``, or ``port 0`` + ``tls-port N`` + the certificates."""
        if self.tls is None:
            return [("port", str(port))]
        lines = [("port", "0"), ("tls-port", str(port))]
        lines += [(key, quote_value(value)) for key, value in self.tls.server_lines()]
        return lines


def quote_value(value: str) -> str:
    """Quote for redis.conf (sdssplitargs syntax)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
