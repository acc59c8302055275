"""Who may call what: named tokens with roles, checked before a request body is read.

Two ways to hold a token:

* ``SHADOWLIMIT_ADMIN_TOKEN`` -- one shared token with the ``admin`` role, named ``admin``
  (as before).
* ``SHADOWLIMIT_TOKENS_FILE`` -- one token per person or system, one line each::

      # name   role       sha256 of the token (hex)
      alice    operator   9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      grafana  viewer     2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae

  ``viewer`` reads (routes, divergence, buckets, audit, the stream, ...), ``operator``
  also changes modes, adjusts limits and resets clients, ``admin`` may do everything
  (reload the rules too). The file is re-read when it changes; a bad new version is
  refused (logged) and the last good one stays.

With a tokens file, the read endpoints need at least ``viewer`` (they show client
identifiers) unless ``SHADOWLIMIT_OPEN_READS=true``; with only the single admin token
they stay open as before. Liveness, readiness, ``/metrics`` and the API docs are always
open; the decide endpoints follow ``SHADOWLIMIT_CLIENT_TOKEN`` (client or admin token).

:class:`AuthGate` is an ASGI middleware: it finds the endpoint's access level from the
method and path, checks the ``Authorization: Bearer`` token and answers 401/403 before the
application (and so before the body is read). The identity it found is put in
``scope["state"]["identity"]`` for the audit trail.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import orjson
from starlette.convertors import PathConvertor, register_url_convertor

from .tls.spec import certificate_name_problem, normal_name

__all__ = [
    "ACCESS",
    "Access",
    "AuthGate",
    "Authenticator",
    "Denied",
    "Identity",
    "KeyConvertor",
    "Role",
    "TokensFile",
    "TokensFileError",
    "authorize",
    "check",
    "parse_tokens",
    "refuse",
]

log = logging.getLogger("shadowlimit.auth")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Role(str, Enum):
    CLIENT = "client"  # a client certificate's: the decide endpoints and Envoy's calls, nothing else
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Role.CLIENT: 0, Role.VIEWER: 1, Role.OPERATOR: 2, Role.ADMIN: 3}


class Access(str, Enum):
    """What an endpoint needs."""

    OPEN = "open"  # liveness, readiness, metrics, API docs
    DATA = "data"  # the decide endpoints: SHADOWLIMIT_CLIENT_TOKEN if set
    READ = "read"  # viewer, once a tokens file is configured (unless SHADOWLIMIT_OPEN_READS)
    OPERATOR = "operator"
    ADMIN = "admin"


class KeyConvertor(PathConvertor):
    """``{name:key}`` in a path: a rate-limit key, any characters (``/`` and line breaks
    included, which ``{name:path}`` stops at: the app would answer a bare 404), so the
    endpoint sees it and says what is wrong with it (``validate_key``). The routes and
    :class:`AuthGate` match such a path with the same pattern."""

    regex = "(?s:.*)"


register_url_convertor("key", KeyConvertor())

#: every endpoint of the control plane and what it needs; an app route missing here is a
#: startup error (see :meth:`AuthGate.bind`), so nothing new goes out unclassified
ACCESS: dict[tuple[str, str], Access] = {
    ("POST", "/v1/decide"): Access.DATA,
    ("POST", "/v1/decide/batch"): Access.DATA,
    ("POST", "/v1/charge"): Access.DATA,
    ("POST", "/v1/charge/batch"): Access.DATA,
    ("POST", "/v1/settle"): Access.DATA,
    ("POST", "/v1/settle/batch"): Access.DATA,
    ("GET", "/v1/reservations"): Access.READ,
    **{(m, "/v1/authz"): Access.DATA for m in ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")},
    ("GET", "/v1/routes"): Access.READ,
    ("POST", "/v1/whatif"): Access.READ,  # a replay changes nothing
    ("POST", "/v1/whatif/suggest"): Access.READ,
    ("PUT", "/v1/routes/{route}/mode"): Access.OPERATOR,  # as OpenAPI shows it
    ("PUT", "/v1/routes/{route:path}/mode"): Access.OPERATOR,  # as served: Envoy's route names hold "/"
    ("PUT", "/v1/routes/{route}/candidate"): Access.OPERATOR,
    ("PUT", "/v1/routes/{route:path}/candidate"): Access.OPERATOR,
    ("DELETE", "/v1/routes/{route}/candidate"): Access.OPERATOR,
    ("DELETE", "/v1/routes/{route:path}/candidate"): Access.OPERATOR,
    ("POST", "/v1/routes/{route}/candidate/promote"): Access.OPERATOR,
    ("POST", "/v1/routes/{route:path}/candidate/promote"): Access.OPERATOR,
    **{("GET", f"/v1/routes/{{{r}}}/plan"): Access.READ for r in ("route", "route:path")},
    **{(m, f"/v1/routes/{{{r}}}/plan"): Access.OPERATOR for m in ("PUT", "DELETE") for r in ("route", "route:path")},
    **{
        ("POST", f"/v1/routes/{{{r}}}/plan/{action}"): Access.OPERATOR
        for action in ("pause", "resume", "approve", "abort")
        for r in ("route", "route:path")
    },
    ("GET", "/v1/rollout/audit"): Access.READ,
    ("GET", "/v1/divergence"): Access.READ,
    ("GET", "/v1/buckets"): Access.READ,
    ("GET", "/v1/backend"): Access.READ,
    ("GET", "/v1/external"): Access.READ,
    ("GET", "/v1/stream"): Access.READ,
    ("GET", "/ratelimit/stats"): Access.READ,
    ("GET", "/ratelimit/clients"): Access.READ,
    ("POST", "/ratelimit/reset/{client_id}"): Access.OPERATOR,  # as OpenAPI shows it
    ("POST", "/ratelimit/reset/{client_id:key}"): Access.OPERATOR,  # as served: keys may hold "/"
    ("PUT", "/ratelimit/config"): Access.OPERATOR,
    ("POST", "/ratelimit/rules/reload"): Access.ADMIN,
    ("GET", "/healthz"): Access.OPEN,
    ("GET", "/readyz"): Access.OPEN,
    ("GET", "/metrics"): Access.OPEN,
    ("GET", "/openapi.json"): Access.OPEN,
    ("GET", "/docs"): Access.OPEN,
    ("GET", "/docs/oauth2-redirect"): Access.OPEN,
    ("GET", "/redoc"): Access.OPEN,
    ("GET", "/docs/assets/{name}"): Access.OPEN,  # the docs' JavaScript, CSS and icon (api/docs_ui.py)
}

_NEEDS = {Access.READ: Role.VIEWER, Access.OPERATOR: Role.OPERATOR, Access.ADMIN: Role.ADMIN}
_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_COMMENT = re.compile(r"(?:^|\s)#.*$")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a token (or a client certificate) belongs to."""

    name: str
    role: Role
    #: a client certificate's name when the identity came from one (recorded as such in the audit)
    certificate: str | None = None

    def may(self, role: Role) -> bool:
        return self.role.rank >= role.rank


class TokensFileError(ValueError):
    """A tokens file line is invalid (the message names the file and the line)."""


def parse_tokens(text: str, source: str = "tokens file") -> dict[str, Identity]:
    """``name role sha256`` lines, and ``name role cert:<name>`` ones for a client
    certificate's name (``#`` comments, blank lines) -> {sha256 or ``cert:<name>``: Identity}."""
    out: dict[str, Identity] = {}
    names: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _COMMENT.sub("", raw).strip()  # a # starting a word: CN=team#1 is a name, not a comment
        if not line:
            continue
        parts = line.split(None, 2)  # a certificate's name is the rest of the line (CN=a b)
        where = f"{source}:{lineno}"
        if len(parts) != 3 or (not parts[2].startswith("cert:") and len(line.split()) != 3):
            raise TokensFileError(
                f"{where}: expected 'name role sha256-of-token' (or 'name role cert:<certificate name>'),"
                f" got {len(line.split())} fields"
            )
        name, role, credential = parts
        if not _NAME.fullmatch(name):
            raise TokensFileError(f"{where}: name must be 1-64 letters, digits or _.@-, got {name!r}")
        cert = credential[5:].strip() if credential.startswith("cert:") else None
        try:
            r = Role(role)
        except ValueError:
            r = None
        if r is None or (r is Role.CLIENT and cert is None):
            roles = "client, viewer, operator or admin" if cert is not None else "viewer, operator or admin"
            raise TokensFileError(f"{where}: role must be {roles}, got {role!r}") from None
        if cert is not None:
            problem = certificate_name_problem(cert)
            if problem:
                raise TokensFileError(f"{where}: {problem}")
            cert = normal_name(cert)
            key, ident = f"cert:{cert}", Identity(name, r, certificate=cert)
        else:
            key, ident = credential.lower(), Identity(name, r)
            if not _SHA256.fullmatch(key):
                raise TokensFileError(
                    f"{where}: the third field must be the token's SHA-256 as 64 hex digits (sha256sum),"
                    " not the token itself, or cert:<certificate name>"
                )
        if name in names:
            raise TokensFileError(f"{where}: name {name!r} appears twice")
        if key in out:
            what = "certificate name" if cert is not None else "token"
            raise TokensFileError(f"{where}: the same {what} is already given to {out[key].name!r}")
        names.add(name)
        out[key] = ident
    return out


class TokensFile:
    """A tokens file, re-read when it changes (checked at most every ``check_every_s``).
    The constructor raises :class:`TokensFileError` for a bad file; later bad versions are
    logged and the last good tokens stay."""

    def __init__(self, path: Path, *, check_every_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self._every = check_every_s
        self._clock = clock
        self._checked = clock()
        self.last_error: str | None = None
        self._sig, self._tokens = self._read()

    def _read(self) -> tuple[tuple[int, int, int], dict[str, Identity]]:
        try:
            st = os.stat(self.path)
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokensFileError(f"{self.path}: cannot read: {exc}") from None
        return (st.st_mtime_ns, st.st_size, st.st_ino), parse_tokens(text, str(self.path))

    def tokens(self) -> dict[str, Identity]:
        now = self._clock()
        if now - self._checked >= self._every:
            self._checked = now
            self.reload_if_changed()
        return self._tokens

    def reload_if_changed(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            self._fail(f"{self.path}: cannot read: {exc.strerror}")
            return False
        if (st.st_mtime_ns, st.st_size, st.st_ino) == self._sig:
            return False
        try:
            self._sig, self._tokens = self._read()
        except TokensFileError as exc:
            self._fail(str(exc))
            return False
        self.last_error = None
        log.info("tokens file %s reloaded: %d tokens", self.path, len(self._tokens))
        return True

    def _fail(self, msg: str) -> None:
        if msg != self.last_error:
            log.error("tokens file refused, keeping the last good tokens: %s", msg)
        self.last_error = msg


class Authenticator:
    """Maps a bearer token to an :class:`Identity` (or None)."""

    def __init__(
        self,
        *,
        admin_token: str | None = None,
        client_token: str | None = None,
        tokens_file: TokensFile | None = None,
        open_reads: bool = False,
    ) -> None:
        self._admin = admin_token.encode() if admin_token else None
        self._client = client_token.encode() if client_token else None
        self.tokens_file = tokens_file
        self.open_reads = open_reads or tokens_file is None

    @property
    def client_token_required(self) -> bool:
        return self._client is not None

    @property
    def mutations_enabled(self) -> bool:
        return self._admin is not None or self.tokens_file is not None

    def from_certificate(self, names: tuple[str, ...]) -> Identity | None:
        """The identity a verified client certificate's names stand for in the tokens
        file (``name role cert:<certificate name>``), or None."""
        if not names or self.tokens_file is None:
            return None
        tokens = self.tokens_file.tokens()
        for n in names:
            ident = tokens.get(f"cert:{n}")
            if ident is not None:
                return ident
        return None

    def identify(self, token: str | None, names: tuple[str, ...] = ()) -> Identity | None:
        """A token's identity; without a token, the client certificate's (``names``)."""
        if not token:
            return self.from_certificate(names)
        raw = token.encode()
        if self._admin is not None and hmac.compare_digest(raw, self._admin):
            return Identity("admin", Role.ADMIN)
        if self.tokens_file is not None:
            return self.tokens_file.tokens().get(hashlib.sha256(raw).hexdigest())
        return None

    def is_client(self, token: str | None) -> bool:
        return token is not None and self._client is not None and hmac.compare_digest(token.encode(), self._client)


def bearer_token(scope: Scope) -> str | None:
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None


class Denied(Exception):
    """A call refused by :func:`check` (status 401 or 403, an error code, a message)."""

    def __init__(self, status: int, error: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status, self.error, self.message, self.details = status, error, message, details


def check(auth: Authenticator, access: Access, token: str | None, names: tuple[str, ...] = ()) -> Identity | None:
    """The identity allowed to make a call needing ``access`` with ``token`` (or, without
    one, the verified client certificate's ``names``), or :class:`Denied` (401 without a
    valid token or certificate, 403 with too small a role)."""
    if access is Access.OPEN:
        return auth.identify(token, names)
    if access is Access.DATA:
        if not auth.client_token_required:
            return None
        if auth.is_client(token):
            return Identity("client", Role.VIEWER)
        ident = auth.identify(token, names)
        if ident is not None and (ident.role is Role.CLIENT or ident.may(Role.ADMIN)):
            return ident
        raise Denied(401, "unauthorized", "the decide endpoints need Authorization: Bearer <client token>")
    if access is Access.READ and auth.open_reads:
        return auth.identify(token, names)
    needed = _NEEDS[access]
    if access is not Access.READ and not auth.mutations_enabled:
        raise Denied(
            403,
            "admin_disabled",
            "no admin token is configured (SHADOWLIMIT_ADMIN_TOKEN or SHADOWLIMIT_TOKENS_FILE),"
            " so changes through the API are refused",
        )
    ident = auth.identify(token, names)
    if token is None and ident is None:
        raise Denied(
            401,
            "unauthorized",
            f"this endpoint needs Authorization: Bearer <token> with the {needed.value} role",
            needs=needed.value,
        )
    if ident is None:
        raise Denied(401, "unauthorized", "the token is not valid", needs=needed.value)
    if not ident.may(needed):
        holder = f"the token {ident.name!r}"
        if ident.certificate:
            holder = f"the certificate {ident.certificate!r} ({ident.name})"
        raise Denied(
            403,
            "forbidden",
            f"this needs the {needed.value} role; {holder} has the {ident.role.value} role",
            needs=needed.value,
            role=ident.role.value,
            token=ident.name,
        )
    return ident


class AuthGate:
    """ASGI middleware: the access check of every HTTP request, before its body is read."""

    def __init__(self, app: ASGIApp, auth: Authenticator, endpoints: Iterable[tuple[str, str]] = ()) -> None:
        self.app = app
        self.auth = auth
        self._exact: dict[tuple[str, str], Access] = {}
        self._patterns: list[tuple[str, re.Pattern[str], Access]] = []
        self.bind(endpoints)

    def bind(self, endpoints: Iterable[tuple[str, str]]) -> None:
        """Learn the access level of each ``(method, path template)`` from :data:`ACCESS`
        (one missing there is a ``RuntimeError``: no endpoint goes out unclassified)."""
        from starlette.routing import compile_path

        missing = []
        for method, path in endpoints:
            method = method.upper()
            if method == "HEAD":
                continue
            access = ACCESS.get((method, path))
            if access is None:
                missing.append(f"{method} {path}")
                continue
            if "{" in path:
                regex, _, _ = compile_path(path)
                self._patterns.append((method, regex, access))
            else:
                self._exact[(method, path)] = access
                if method == "GET":
                    self._exact[("HEAD", path)] = access
        if missing:
            raise RuntimeError(
                "endpoints without an access level in control_plane.auth.ACCESS: " + ", ".join(sorted(missing))
            )

    def access_for(self, method: str, path: str) -> Access:
        access = self._exact.get((method, path))
        if access is not None:
            return access
        for m, regex, a in self._patterns:
            if (m == method or (method == "HEAD" and m == "GET")) and regex.match(path):
                return a
        # unknown paths and methods: the app answers 404/405 without reading anything,
        # but never tells a reader more than the strictest read endpoint would
        return Access.READ

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        denied = authorize(self.auth, self.access_for(scope["method"], scope["path"]), scope)
        if denied is not None:
            await refuse(send, denied)
            return
        await self.app(scope, receive, send)


def authorize(auth: Authenticator, access: Access, scope: Scope) -> Denied | None:
    """The access check of one request (the gate's, and the decision endpoints' in front of
    it): None when it may go on (its identity, if any, put in ``scope["state"]``), else why not."""
    if access is Access.OPEN or (access is Access.DATA and not auth.client_token_required):
        return None  # the usual case: nothing to check
    state = scope.get("state")
    names = state.get("tls_client", ()) if state else ()
    try:
        ident = check(auth, access, bearer_token(scope), names)
    except Denied as d:
        return d
    if ident is not None:
        scope.setdefault("state", {})["identity"] = ident
    return None


async def refuse(send: Send, d: Denied) -> None:
    """Answer a refused request (JSON; ``WWW-Authenticate`` on a 401)."""
    body = orjson.dumps({"error": d.error, "message": d.message, **d.details})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if d.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="shadowlimit"'))
    await send({"type": "http.response.start", "status": d.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
