"""Redis addresses: the URLs shadowlimit accepts, parsed into endpoints. Pure, no IO.

Accepted forms (spelled as redis-py and the ``limits`` library spell them):

* ``redis://[user:pass@]host:port/db`` and ``rediss://...`` (TLS);
* ``unix:///path/to.sock?db=N``;
* a cluster: ``redis+cluster://host:port`` (several seeds as ``h1:p1,h2:p2``),
  ``rediss+cluster://`` with TLS, or ``?cluster=true`` on a redis URL;
* Sentinel: ``redis+sentinel://[user:pass@]h1:p1[,h2:p2]/service_name[/db]``,
  ``rediss+sentinel://`` with TLS on the sentinels and the data nodes.

TLS options as query parameters: ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
``ssl_cert_reqs`` (``required``, the default; ``optional``; ``none`` only when asked
for) and ``ssl_check_hostname`` (``true`` unless ``ssl_cert_reqs`` is not
``required``). On Sentinel URLs the credentials are used for the sentinels too, unless
``sentinel_password`` (with ``sentinel_username`` when the sentinels have ACL users) says
otherwise; an empty ``sentinel_password=`` means the sentinels take no login. Any other query
parameter is an error: a misspelt option is never silently ignored.

>>> parse_redis_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").cluster
True
>>> parse_redis_url("redis+sentinel://:pw@10.0.0.1:26379/mymaster/2").redacted()
'redis+sentinel://***@10.0.0.1:26379/mymaster/2'
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal
from urllib.parse import ParseResult, parse_qs, unquote, urlparse

__all__ = ["CERT_REQS", "Endpoint", "RedisTarget", "TargetKind", "TlsConfig", "parse_redis_url"]

_SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel")
#: ``ssl_cert_reqs`` values, as redis-py names them
CERT_REQS = ("required", "optional", "none")
_TLS_PARAMS = frozenset({"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname"})
_KNOWN_PARAMS = _TLS_PARAMS | {"cluster", "db", "sentinel_username", "sentinel_password"}
_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}

TargetKind = Literal["standalone", "cluster", "sentinel"]


@dataclass(frozen=True)
class TlsConfig:
    """How to talk TLS to a node: which CA to trust (``None``: the system's), the
    client certificate for mutual TLS, whether to verify the server's certificate and
    its name."""

    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    cert_reqs: str = "required"
    check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.cert_reqs not in CERT_REQS:
            raise ValueError(f"redis url: ssl_cert_reqs must be one of {', '.join(CERT_REQS)}, got {self.cert_reqs!r}")
        if self.check_hostname and self.cert_reqs != "required":
            raise ValueError("redis url: ssl_check_hostname=true needs ssl_cert_reqs=required")
        if self.keyfile and not self.certfile:
            raise ValueError("redis url: ssl_keyfile needs ssl_certfile (the client certificate)")

    def describe(self) -> dict[str, Any]:
        """What an operator may see (paths, never key material)."""
        return {
            "verify": self.cert_reqs,
            "check_hostname": self.check_hostname,
            "ca_certs": self.ca_certs or "system",
            "client_certificate": self.certfile is not None,
        }

    def redis_py_kwargs(self) -> dict[str, Any]:
        """The same settings as redis-py's connection keyword arguments."""
        return {
            "ssl": True,
            "ssl_ca_certs": self.ca_certs,
            "ssl_certfile": self.certfile,
            "ssl_keyfile": self.keyfile,
            "ssl_cert_reqs": self.cert_reqs,
            "ssl_check_hostname": self.check_hostname,
        }


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """Where one Redis node listens and how to log in."""

    host: str | None = "127.0.0.1"
    port: int | None = 6379
    unix_path: str | None = None
    tls: TlsConfig | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    db: int = 0

    @property
    def use_ssl(self) -> bool:
        return self.tls is not None

    @property
    def label(self) -> str:
        return f"unix:{self.unix_path}" if self.unix_path else f"{self.host}:{self.port}"

    def with_address(self, host: str, port: int, db: int = 0) -> Endpoint:
        """The same login and TLS at another address (a cluster node, a new master)."""
        return replace(self, host=host, port=port, unix_path=None, db=db)


@dataclass(frozen=True)
class RedisTarget:
    """A parsed Redis URL: what kind of deployment, the first node (for Sentinel: the
    data nodes' login, TLS and database, without an address), the seeds (cluster nodes
    or sentinels) and Sentinel's service name."""

    endpoint: Endpoint
    kind: TargetKind = "standalone"
    seeds: tuple[Endpoint, ...] = field(default=())
    service_name: str | None = None

    @property
    def cluster(self) -> bool:
        return self.kind == "cluster"

    @property
    def sentinel(self) -> bool:
        return self.kind == "sentinel"

    def with_password(self, password: str) -> RedisTarget:
        """The data nodes' password replaced (from a secret file); a Sentinel URL's
        sentinels keep theirs."""
        seeds = self.seeds if self.sentinel else tuple(replace(s, password=password) for s in self.seeds)
        return replace(self, endpoint=replace(self.endpoint, password=password), seeds=seeds)

    def with_tls(self, tls: TlsConfig) -> RedisTarget:
        """TLS settings applied to every node (the seeds included)."""
        return replace(
            self, endpoint=replace(self.endpoint, tls=tls), seeds=tuple(replace(s, tls=tls) for s in self.seeds)
        )

    def redacted(self) -> str:
        """The URL without secrets (what logs, ``/v1/backend`` and the dashboard show)."""
        e = self.endpoint
        if e.unix_path:
            return f"unix://{e.unix_path}?db={e.db}"
        tls = "s" if e.use_ssl else ""
        auth = "***@" if e.password else ""
        hosts = ",".join(s.label for s in self.seeds) if self.seeds else e.label
        if self.sentinel:
            db = f"/{e.db}" if e.db else ""
            return f"redis{tls}+sentinel://{auth}{hosts}/{self.service_name}{db}"
        if self.cluster:
            return f"redis{tls}+cluster://{auth}{hosts}"
        return f"redis{tls}://{auth}{e.label}/{e.db}"

    def describe(self) -> dict[str, Any]:
        """Kind, addresses, TLS and login, without secrets."""
        e = self.endpoint
        return {
            "kind": self.kind,
            "url": self.redacted(),
            "tls": e.tls.describe() if e.tls is not None else None,
            "username": e.username,
            "password": "set" if e.password else None,
            "service_name": self.service_name,
        }


def parse_redis_url(url: str) -> RedisTarget:
    """Parse a Redis URL; raises ``ValueError`` naming what is wrong (never the password)."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("redis url: must not be empty")
    u = urlparse(url.strip())
    query = parse_qs(u.query, keep_blank_values=True)
    unknown = sorted(set(query) - _KNOWN_PARAMS)
    if unknown:
        raise ValueError(f"redis url: unknown option {unknown[0]!r} (known: {', '.join(sorted(_KNOWN_PARAMS))})")
    username = unquote(u.username) if u.username else None
    password = unquote(u.password) if u.password else None
    if u.scheme == "unix":
        return _unix_target(url, u, query, username, password)
    if u.scheme not in _SCHEMES:
        raise ValueError(f"redis url: scheme must be one of {', '.join(_SCHEMES)} or unix, got {u.scheme!r}")
    tls = _tls(query, u.scheme.startswith("rediss"))
    hosts = _host_ports(u.netloc.rsplit("@", 1)[-1], 26379 if u.scheme.endswith("+sentinel") else 6379)
    if not hosts:
        raise ValueError("redis url: no host given")
    if u.scheme.endswith("+sentinel"):
        return _sentinel_target(u, query, hosts, tls, username, password)
    cluster = _flag(query, "cluster") or u.scheme.endswith("+cluster")
    seeds = [Endpoint(host=h, port=p, tls=tls, username=username, password=password) for h, p in hosts]
    db = _database(u.path.lstrip("/") or "0", u.path.lstrip("/"))
    if cluster and db != 0:
        raise ValueError("redis url: Redis Cluster only has database 0")
    first = replace(seeds[0], db=db)
    return RedisTarget(first, kind="cluster" if cluster else "standalone", seeds=tuple(seeds))


def _sentinel_target(
    u: ParseResult,
    query: dict[str, list[str]],
    hosts: list[tuple[str, int]],
    tls: TlsConfig | None,
    username: str | None,
    password: str | None,
) -> RedisTarget:
    parts = [p for p in u.path.split("/") if p]
    if not parts:
        raise ValueError("redis url: a Sentinel URL needs the service name: redis+sentinel://host:port/service_name")
    if len(parts) > 2:
        raise ValueError("redis url: a Sentinel URL's path is /service_name[/db]")
    db = _database(parts[1], parts[1]) if len(parts) == 2 else 0
    if "sentinel_password" in query:  # the sentinels' own login (empty: none)
        s_user, s_pass = _one(query, "sentinel_username", None), _one(query, "sentinel_password", None)
    else:
        s_user, s_pass = _one(query, "sentinel_username", username), password
    sentinels = tuple(
        Endpoint(host=h, port=p, tls=tls, username=s_user or None, password=s_pass or None) for h, p in hosts
    )
    data = Endpoint(host=None, port=None, tls=tls, username=username, password=password, db=db)
    return RedisTarget(data, kind="sentinel", seeds=sentinels, service_name=unquote(parts[0]))


def _unix_target(
    url: str, u: ParseResult, query: dict[str, list[str]], username: str | None, password: str | None
) -> RedisTarget:
    if not u.path:
        raise ValueError(f"redis url: unix socket URL needs a path, got {url!r}")
    if set(query) & _TLS_PARAMS:
        raise ValueError("redis url: ssl_* options do not apply to a unix socket")
    db = _database(query.get("db", ["0"])[0], query.get("db"))
    return RedisTarget(Endpoint(host=None, port=None, unix_path=u.path, username=username, password=password, db=db))


def _one(query: dict[str, list[str]], name: str, default: str | None) -> str | None:
    values = query.get(name)
    if not values:
        return default
    if len(values) > 1:
        raise ValueError(f"redis url: {name} given more than once")
    return values[0]


def _flag(query: dict[str, list[str]], name: str) -> bool:
    text = _one(query, name, None)
    if text is None:
        return False
    value = _BOOLS.get(text.lower())
    if value is None:
        raise ValueError(f"redis url: {name} must be true or false, got {text!r}")
    return value


def _tls(query: dict[str, list[str]], scheme_tls: bool) -> TlsConfig | None:
    """The TLS settings of a ``rediss`` URL (``ssl_*`` options on a plain URL are an error)."""
    given = set(query) & _TLS_PARAMS
    if not scheme_tls:
        if given:
            raise ValueError(f"redis url: {sorted(given)[0]} needs TLS: use rediss:// (or rediss+cluster/+sentinel)")
        return None
    reqs = (_one(query, "ssl_cert_reqs", "required") or "required").lower()
    check = _flag(query, "ssl_check_hostname") if "ssl_check_hostname" in query else reqs == "required"
    return TlsConfig(
        ca_certs=_one(query, "ssl_ca_certs", None) or None,
        certfile=_one(query, "ssl_certfile", None) or None,
        keyfile=_one(query, "ssl_keyfile", None) or None,
        cert_reqs=reqs,
        check_hostname=check,
    )


def _database(text: str, shown: object) -> int:
    """The database number in ``text``; ``shown`` is what the error message quotes."""
    try:
        db = int(text)
    except ValueError:
        raise ValueError(f"redis url: database must be a number, got {shown!r}") from None
    if db < 0:
        raise ValueError(f"redis url: database must be 0 or more, got {db}")
    return db


def _host_ports(hosts: str, default_port: int) -> list[tuple[str, int]]:
    """``h1:p1,[::1]:p2,h3`` -> ``[(h1, p1), ("::1", p2), (h3, default_port)]``; empty items skipped."""
    out: list[tuple[str, int]] = []
    for part in hosts.split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith("["):  # [::1]:6379
            host, _, rest = part[1:].partition("]")
            port_s = rest.lstrip(":")
        elif part.count(":") == 1:
            host, _, port_s = part.partition(":")
        else:
            host, port_s = part, ""
        try:
            port = int(port_s) if port_s else default_port
        except ValueError:
            raise ValueError(f"redis url: bad port in {part!r}") from None
        if not 1 <= port <= 65535:
            raise ValueError(f"redis url: port must be 1-65535, got {port} in {part!r}")
        out.append((host, port))
    return out
