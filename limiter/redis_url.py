"""Redis addresses: the URLs shadowlimit accepts, parsed into endpoints. Pure, no IO.

Accepted forms: ``redis://[user:pass@]host:port/db``, ``rediss://`` (TLS),
``unix:///path/to.sock?db=N``; a cluster with ``redis+cluster://host:port`` (several
seeds as ``redis+cluster://h1:p1,h2:p2``) or ``?cluster=true`` on a redis URL.

>>> parse_redis_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").cluster
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import ParseResult, parse_qs, unquote, urlparse

__all__ = ["Endpoint", "RedisTarget", "parse_redis_url"]

_SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster")


@dataclass(frozen=True)
class Endpoint:
    """Where one Redis node listens and how to log in."""

    host: str | None = "127.0.0.1"
    port: int | None = 6379
    unix_path: str | None = None
    use_ssl: bool = False
    username: str | None = None
    password: str | None = None
    db: int = 0

    @property
    def label(self) -> str:
        return f"unix:{self.unix_path}" if self.unix_path else f"{self.host}:{self.port}"

    def with_address(self, host: str, port: int) -> Endpoint:
        return Endpoint(
            host=host, port=port, use_ssl=self.use_ssl, username=self.username, password=self.password, db=0
        )


@dataclass(frozen=True)
class RedisTarget:
    """A parsed Redis URL: the first node, whether it is a cluster, the extra seeds."""

    endpoint: Endpoint
    cluster: bool = False
    seeds: tuple[Endpoint, ...] = field(default=())

    def redacted(self) -> str:
        e = self.endpoint
        scheme = "redis+cluster" if self.cluster else ("rediss" if e.use_ssl else "redis")
        if e.unix_path:
            return f"unix://{e.unix_path}?db={e.db}"
        auth = "***@" if e.password else ""
        return f"{scheme}://{auth}{e.host}:{e.port}/{e.db}"


def parse_redis_url(url: str) -> RedisTarget:
    """Parse a Redis URL; raises ``ValueError`` naming what is wrong."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("redis url: must not be empty")
    u = urlparse(url.strip())
    query = parse_qs(u.query)
    username = unquote(u.username) if u.username else None
    password = unquote(u.password) if u.password else None
    if u.scheme == "unix":
        return _unix_target(url, u, query, username, password)
    if u.scheme not in _SCHEMES:
        raise ValueError(f"redis url: scheme must be redis, rediss, unix or redis+cluster, got {u.scheme!r}")
    cluster = query.get("cluster", ["false"])[0].lower() in ("1", "true", "yes") or u.scheme.endswith("+cluster")
    use_ssl = u.scheme.startswith("rediss")
    seeds = [
        Endpoint(host=host, port=port, use_ssl=use_ssl, username=username, password=password)
        for host, port in _host_ports(u.netloc.rsplit("@", 1)[-1])
    ]
    if not seeds:
        raise ValueError(f"redis url: no host in {url!r}")
    db = _database(u.path.lstrip("/") or "0", u.path.lstrip("/"))
    if cluster and db != 0:
        raise ValueError("redis url: Redis Cluster only has database 0")
    first = Endpoint(
        host=seeds[0].host, port=seeds[0].port, use_ssl=use_ssl, username=username, password=password, db=db
    )
    return RedisTarget(first, cluster=cluster, seeds=tuple(seeds))


def _unix_target(
    url: str, u: ParseResult, query: dict[str, list[str]], username: str | None, password: str | None
) -> RedisTarget:
    if not u.path:
        raise ValueError(f"redis url: unix socket URL needs a path, got {url!r}")
    db = _database(query.get("db", ["0"])[0], query.get("db"))
    return RedisTarget(Endpoint(host=None, port=None, unix_path=u.path, username=username, password=password, db=db))


def _database(text: str, shown: object) -> int:
    """The database number in ``text``; ``shown`` is what the error message quotes."""
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"redis url: database must be a number, got {shown!r}") from None


def _host_ports(hosts: str) -> list[tuple[str, int]]:
    """``h1:p1,[::1]:p2,h3`` -> ``[(h1, p1), ("::1", p2), (h3, 6379)]``; empty items skipped."""
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
            port = int(port_s) if port_s else 6379
        except ValueError:
            raise ValueError(f"redis url: bad port in {part!r}") from None
        if not 1 <= port <= 65535:
            raise ValueError(f"redis url: port must be 1-65535, got {port} in {part!r}")
        out.append((host, port))
    return out
