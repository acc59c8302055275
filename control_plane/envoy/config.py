"""envoyproxy/ratelimit's configuration files, read as they are, into routes and a lookup tree.

A file is what envoyproxy/ratelimit reads from its config directory::

    domain: edge_proxy
    descriptors:
      - key: remote_address            # no value: one bucket per address
        rate_limit: {unit: second, requests_per_unit: 10}
      - key: path
        value: "/login"
        shadow_mode: true              # the route starts in shadow
        rate_limit: {unit: minute, requests_per_unit: 5, name: login, replaces: [{name: general}]}
        descriptors:
          - key: user                  # nested: the request's descriptor is (path=/login, user=...)
            rate_limit: {unit: hour, requests_per_unit: 100}

Every descriptor with a ``rate_limit`` (not ``unlimited``) becomes a route of the rollout,
named ``<domain>/<key>[=<value>]/...`` (characters other than ``A-Za-z0-9_.-*~+@`` are
percent-encoded, so ``:`` and ``/`` never appear inside a part); its limit is a fixed
window of ``requests_per_unit`` per ``unit``, aligned on the epoch, as envoyproxy/ratelimit
counts. A ``value`` ending in (or holding) ``*`` is a wildcard. The bucket key is the
request's values for the entries matched by key only or by a wildcard (``share_threshold``
makes a wildcard's matches share one bucket), percent-encoded and joined by ``|``; a
descriptor matched by fixed values only has one bucket, ``all``.

The lookup (:meth:`EnvoyConfig.lookup`) is envoyproxy/ratelimit's ``GetLimit``: at each
level ``key_value`` first, then the wildcards in file order, then ``key`` alone; the limit
applies only when the request's descriptor ends at that level.

Errors are :class:`~control_plane.rules.RulesError` naming the file, the line and the
field (``edge.yaml:12: descriptors[1].rate_limit.unit: must be one of second, ...``).
Stricter than envoyproxy/ratelimit where it would accept a mistake silently: a key in the
wrong place, a non-string value, a ``rate_limit`` without ``requests_per_unit`` (which the
peer reads as 0). ``requests_per_unit: 0`` is the peer's way to ban a value:
the route's policy blocks every request (:meth:`limiter.Policy.blocking`), decided without
Redis, and in shadow it is compared and counted like any other limit.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from limiter.keys import DEFAULT_MAX_KEY_LENGTH, KeyExtractor, KeyStrategy
from limiter.policy import MAX_AVERAGE, Policy

from ..model.rollout import Mode
from ..rules.errors import FieldPath, RulesError, field_name
from ..rules.model import NAMED_ROUTE_NAME, ROUTE_NAME_MAX, FrozenOrigin, RouteRule, finish_steps
from ..rules.yaml_source import LineIndex, decode_file, gc_paused, load_yaml, read_file

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = [
    "UNITS",
    "EnvoyConfig",
    "EnvoyLimit",
    "EnvoyOrigin",
    "EnvoyPlan",
    "Match",
    "build_steps",
    "config_files",
    "load_envoy_config",
    "parse_envoy_files",
    "plan_envoy_files",
]

#: Envoy's ``RateLimitResponse.RateLimit.Unit`` names and their length in seconds
#: (envoyproxy/ratelimit's UnitToDivider: a month is 30 days, a year 365)
UNITS = {
    "SECOND": 1,
    "MINUTE": 60,
    "HOUR": 3_600,
    "DAY": 86_400,
    "WEEK": 604_800,
    "MONTH": 2_592_000,
    "YEAR": 31_536_000,
}
#: the most files read from a config directory
MAX_FILES = 1_000
#: the deepest descriptor nesting accepted
MAX_DEPTH = 16

_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-*~+@")
_DOC_KEYS = frozenset({"domain", "descriptors"})
_DESCRIPTOR_KEYS = frozenset(
    {"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric",
     "value_to_metric", "share_threshold", "metadata"}
)  # fmt: skip
_LIMIT_KEYS = frozenset({"unit", "requests_per_unit", "unlimited", "name", "replaces"})
_FLAGS = ("shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold")


def encode_part(text: str) -> str:
    """A route name part: ``A-Za-z0-9_.-*~+@`` kept, every other byte of its UTF-8 as ``%XX``."""
    if _SAFE_PART.fullmatch(text):
        return text
    return "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass")) for c in text)


def encode_value(text: str) -> str:
    """A request value in a bucket key: printable ASCII kept but for ``%`` and ``|``; the
    empty value is ``%`` (which no other value encodes to)."""
    if not text:
        return "%"
    if text.isascii() and text.isprintable() and " " not in text and "%" not in text and "|" not in text:
        return text
    out = []
    for c in text:
        if c.isascii() and c.isprintable() and c not in " %|":
            out.append(c)
        else:
            out.extend(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
    return "".join(out)


def bucket_key(parts: Sequence[str]) -> str:
    """The bucket of a request: its variable values joined by ``|``; ``all`` when there are
    none; a SHA-256 name when longer than a key may be."""
    if not parts:
        return "all"
    key = "|".join(parts)
    if len(key) > DEFAULT_MAX_KEY_LENGTH:
        return "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return key


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvoyLimit:
    """A descriptor's ``rate_limit`` and flags. ``route`` is None for ``unlimited``."""

    route: str | None
    requests_per_unit: int
    unit: str  # SECOND, MINUTE, ...; "" when unlimited
    name: str
    replaces: tuple[str, ...]
    unlimited: bool
    shadow_mode: bool
    quota_mode: bool


_LEAF: dict[str, _Node] = {}  # shared by the nodes without children (most of them): never changed
_NO_WILDCARDS: list[tuple[str, list[str]]] = []  # likewise


@dataclass(slots=True)
class _Node:
    """One level of a domain's descriptor tree."""

    children: dict[str, _Node] = field(default_factory=lambda: _LEAF)  # "key" or "key_value"
    wildcards: list[tuple[str, list[str]]] = field(default_factory=lambda: _NO_WILDCARDS)  # (final key, split on "*")
    limit: EnvoyLimit | None = None
    share: bool = False

    def add(self, final: str, node: _Node) -> None:
        if self.children is _LEAF:
            self.children = {}
        if "*" in final:
            if self.wildcards is _NO_WILDCARDS:
                self.wildcards = []
            self.wildcards.append((final, final.split("*")))
        self.children[final] = node


@dataclass(frozen=True, slots=True)
class Match:
    """What the configuration says of one request descriptor: its limit, and the bucket
    key (for a limited one)."""

    limit: EnvoyLimit
    key: str


def _wildcard_match(parts: list[str], value: str) -> bool:
    """envoyproxy/ratelimit's wildcardMatch: each ``*`` matches any run of characters."""
    if len(parts) == 1:
        return parts[0] == value
    first, last = parts[0], parts[-1]
    if not value.startswith(first) or not value.endswith(last) or len(value) < sum(map(len, parts)):
        return False
    rest = value[len(first) : len(value) - len(last)]
    for part in parts[1:-1]:
        idx = rest.find(part)
        if idx < 0:
            return False
        rest = rest[idx + len(part) :]
    return True


@dataclass(frozen=True)
class EnvoyConfig:
    """The loaded configuration: a tree per domain and the routes it makes."""

    domains: dict[str, _Node]
    routes: tuple[RouteRule, ...]
    sources: tuple[str, ...]
    digest: str
    loaded_at: float  # wall-clock seconds (the loader's clock)

    def lookup(self, domain: str, entries: Sequence[tuple[str, str]]) -> Match | None:
        """The limit of a request descriptor (``[(key, value), ...]``), or None."""
        node = self.domains.get(domain)
        if node is None:
            return None
        parts: list[str] = []
        last = len(entries) - 1
        for i, (key, value) in enumerate(entries):
            final = f"{key}_{value}"
            nxt = node.children.get(final)
            # a value written with a '*' matched as it is still keys its own bucket
            variable = nxt is not None and "*" in final and not nxt.share
            if nxt is None and node.wildcards:
                for wkey, wparts in node.wildcards:
                    if _wildcard_match(wparts, final):
                        nxt = node.children[wkey]
                        variable = not nxt.share
                        break
            if nxt is None:
                nxt = node.children.get(key)
                variable = True
            if nxt is None:
                return None
            if variable:
                parts.append(encode_value(value))
            if i == last:
                return None if nxt.limit is None else Match(nxt.limit, bucket_key(parts))
            if not nxt.children:
                return None  # the request goes deeper than the configuration
            node = nxt
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "sources": list(self.sources),
            "digest": self.digest,
            "loaded_at": self.loaded_at,
            "domains": sorted(self.domains),
            "routes": [r.name for r in self.routes],
        }


_NO_FLAGS = dict.fromkeys(_FLAGS, False)
_SAFE_PART = re.compile(r"[A-Za-z0-9_.\-*~+@]*")

Record = tuple[int, str, bool, int | None, tuple[Any, ...] | None]
"""One descriptor of a file, checked (see :class:`EnvoyPlan`): ``(parent, final key,
share_threshold, line, limit)``; ``parent`` is the index of the parent descriptor's record
(-1 at the top); ``limit`` None (no ``rate_limit``) or ``(route, requests_per_unit, unit,
name, replaces, unlimited, shadow_mode, quota_mode, detailed_metric, value_to_metric)``."""


@dataclass(slots=True)
class EnvoyPlan:
    """A configuration read and checked, as plain data: ``files`` is ``[(source, domain,
    records), ...]`` with the descriptors in file order (a parent before its children).
    Cheap to pickle; :func:`build_steps` makes the :class:`EnvoyConfig` of it."""

    files: list[tuple[str, str, list[Record]]]
    digest: str


class _Reader:
    """One file's document, read field by field into the descriptors' records."""

    def __init__(self, source: str, lines: LineIndex) -> None:
        self.source = source
        self.lines = lines
        self.records: list[Record] = []
        self.finals: dict[int, set[str]] = {}  # record (-1: the top) -> its children's final keys
        self.routes: set[str] = set()
        self.domain = ""
        self.domain_part = ""

    def line_of(self, path: FieldPath) -> int | None:
        """The line of a field, or of the nearest field holding it."""
        for n in range(len(path), -1, -1):
            line = self.lines.get(path[:n])
            if line is not None:
                return int(line)
        return None

    def fail(self, path: FieldPath, message: str) -> RulesError:
        return RulesError(message, path=self.source, line=self.line_of(path), field=field_name(path))

    def mapping(self, data: Any, path: FieldPath, allowed: frozenset[str]) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.fail(path, f"must be a mapping, got {_kind(data)}")
        if not allowed.issuperset(data):
            k = next(k for k in data if k not in allowed)
            raise self.fail((*path, k), f"unknown key {k!r} here; expected one of {', '.join(sorted(allowed))}")
        return data

    def string(self, data: dict[str, Any], path: FieldPath, name: str, *, required: bool = False) -> str:
        v = data.get(name)
        if v is None:
            if required:
                raise self.fail((*path, name), "is required and must not be empty")
            return ""
        if type(v) is not str:
            if isinstance(v, bool) or not isinstance(v, (str, int)):
                raise self.fail((*path, name), f"must be a string, got {_kind(v)}")
            v = str(v)  # unquoted numbers are read as the text written (load_yaml numbers=False)
        if required and not v:
            raise self.fail((*path, name), "must not be empty")
        return v

    def whole(self, data: dict[str, Any], path: FieldPath, name: str) -> int:
        """A whole number written as digits (0 when absent)."""
        v = data.get(name)
        if v is None:
            return 0
        if isinstance(v, bool) or not isinstance(v, str) or not v.isascii() or not v.isdigit():
            raise self.fail((*path, name), f"must be a whole number, got {v!r}")
        return int(v)

    def flag(self, data: dict[str, Any], path: FieldPath, name: str) -> bool:
        v = data.get(name, False)
        if not isinstance(v, bool):
            raise self.fail((*path, name), f"must be true or false, got {v!r}")
        return v

    def document(self, data: Any) -> list[Record]:
        doc = self.mapping(data, (), _DOC_KEYS)
        self.domain = self.string(doc, (), "domain", required=True)
        self.domain_part = encode_part(self.domain)
        self.level(-1, doc.get("descriptors"), ("descriptors",), [], 0)
        return self.records

    def level(self, parent: int, items: Any, path: FieldPath, names: list[str], depth: int) -> None:
        if items is None:
            return
        if not isinstance(items, list):
            raise self.fail(path, f"must be a list of descriptors, got {_kind(items)}")
        if depth >= MAX_DEPTH:
            raise self.fail(path, f"descriptors nest deeper than {MAX_DEPTH} levels")
        for i, item in enumerate(items):
            line = self.lines.item_line(items, i)
            self.descriptor(parent, item, (*path, i), names, depth, self.line_of((*path, i)) if line is None else line)

    def descriptor(
        self, parent: int, item: Any, path: FieldPath, names: list[str], depth: int, line: int | None
    ) -> None:
        d = self.mapping(item, path, _DESCRIPTOR_KEYS)
        key = self.string(d, path, "key", required=True)
        value = self.string(d, path, "value")
        final = f"{key}_{value}" if value else key
        siblings = self.finals.get(parent)
        if siblings is None:
            siblings = self.finals[parent] = set()
        if final in siblings:
            shown = "/".join([*names, f"{key}={value}" if value else key])
            raise self.fail(path, f"duplicate descriptor {shown!r} in domain {self.domain!r}")
        siblings.add(final)
        flags = _NO_FLAGS if d.keys().isdisjoint(_FLAGS) else {name: self.flag(d, path, name) for name in _FLAGS}
        if flags["share_threshold"] and "*" not in final:
            raise self.fail((*path, "share_threshold"), "share_threshold needs a wildcard value (holding '*')")
        if "metadata" in d and not isinstance(d["metadata"], dict):
            raise self.fail((*path, "metadata"), f"must be a mapping, got {_kind(d['metadata'])}")
        part = encode_part(key) + (f"={encode_part(value)}" if value else "")
        limit = None
        if "rate_limit" in d:
            limit = self.limit(d["rate_limit"], (*path, "rate_limit"), [*names, part], flags)
        index = len(self.records)
        self.records.append((parent, final, flags["share_threshold"], line, limit))
        self.level(index, d.get("descriptors"), (*path, "descriptors"), [*names, part], depth + 1)

    def limit(self, data: Any, path: FieldPath, names: list[str], flags: dict[str, bool]) -> tuple[Any, ...]:
        rl = self.mapping(data, path, _LIMIT_KEYS)
        unlimited = self.flag(rl, path, "unlimited")
        unit = self.string(rl, path, "unit").upper()
        if unlimited and unit:
            raise self.fail((*path, "unit"), "should not specify a unit when unlimited")
        if not unlimited and unit not in UNITS:
            raise self.fail((*path, "unit"), f"must be one of {', '.join(u.lower() for u in UNITS)}, got {unit!r}")
        rpu = self.whole(rl, path, "requests_per_unit")
        if not unlimited and rl.get("requests_per_unit") is None:  # the peer would read 0: a ban by omission
            raise self.fail(
                (*path, "requests_per_unit"), "is required (write 0 to block every request, as a banned value)"
            )
        if not unlimited and rpu > MAX_AVERAGE:
            raise self.fail((*path, "requests_per_unit"), f"must be between 0 and {MAX_AVERAGE}, got {rpu}")
        name = self.string(rl, path, "name")
        replaces = self.replaces(rl.get("replaces"), (*path, "replaces"), name)
        route = None
        if not unlimited:
            route = f"{self.domain_part}/{'/'.join(names)}"
            if len(route) > ROUTE_NAME_MAX or NAMED_ROUTE_NAME.fullmatch(route) is None:
                raise self.fail(path, f"the route name {route[:80]!r}... is longer than {ROUTE_NAME_MAX} characters")
        f = flags  # a plain tuple of what the limit is and one of its flags: cheap to send from the child
        return (route, rpu, unit, name, replaces), (
            unlimited,
            f["shadow_mode"],
            f["quota_mode"],
            f["detailed_metric"],
            f["value_to_metric"],
        )

    def replaces(self, items: Any, path: FieldPath, own: str) -> tuple[str, ...]:
        if items is None:
            return ()
        if not isinstance(items, list):
            raise self.fail(path, f"must be a list of {{name: ...}}, got {_kind(items)}")
        out = []
        for i, item in enumerate(items):
            r = self.mapping(item, (*path, i), frozenset({"name"}))
            name = self.string(r, (*path, i), "name", required=True)
            if name == own:
                raise self.fail((*path, i, "name"), "a limit cannot replace itself")
            out.append(name)
        return tuple(out)


class EnvoyOrigin(FrozenOrigin):
    """A route's ``origin`` (its file, line, domain and descriptor), computed from the
    descriptor's limit when asked: 50,000 routes do not keep 50,000 dicts of 14 keys."""

    __slots__ = ("detailed_metric", "domain", "file", "limit", "line", "share_threshold", "value_to_metric")
    _KEYS = ("kind", "file", "line", "domain", "descriptor", "requests_per_unit", "unit", "name", "replaces",
             "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold")  # fmt: skip

    def __init__(self, limit: EnvoyLimit, file: str, line: int | None, domain: str, flags: tuple[bool, ...]) -> None:
        self.limit, self.file, self.line, self.domain = limit, file, line, domain
        self.detailed_metric, self.value_to_metric, self.share_threshold = flags

    def __getitem__(self, key: str) -> Any:
        if key == "kind":
            return "envoy"
        if key in ("file", "line", "domain", "detailed_metric", "value_to_metric", "share_threshold"):
            return getattr(self, key)
        lim = self.limit
        if key == "descriptor":
            return (lim.route or "").split("/", 1)[1]
        if key in ("requests_per_unit", "unit", "name", "shadow_mode", "quota_mode"):
            return getattr(lim, key)
        if key == "replaces":
            return list(lim.replaces)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)


def _kind(v: Any) -> str:
    if v is None:
        return "nothing"
    for kind, name in ((bool, "a boolean"), (str, "a string"), (dict, "a mapping"), (list, "a list")):
        if isinstance(v, kind):
            return name
    return type(v).__name__


def config_files(path: Path) -> list[Path]:
    """The files of a configuration: the file itself, or the ``*.yaml`` and ``*.yml`` files
    under a directory, its subdirectories included, in path order. Hidden entries are
    skipped (a Kubernetes ConfigMap mount's ``..data`` holds the same files again); a
    directory with none is an error."""
    if not path.is_dir():
        return [path]
    found: list[Path] = []
    for root, dirs, files in os.walk(path, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            p = Path(root) / name
            if not name.startswith(".") and p.suffix in (".yaml", ".yml") and p.is_file():
                found.append(p)
        if len(found) > MAX_FILES:
            raise RulesError(f"more than {MAX_FILES} configuration files", path=str(path))
    if not found:
        raise RulesError("no .yaml or .yml files in this directory", path=str(path))
    return found


def plan_envoy_files(
    files: Sequence[tuple[str, bytes]], *, digest: str | None = None, on_file: Callable[[str], None] | None = None
) -> EnvoyPlan:
    """Read and check the configuration in ``[(source, bytes), ...]`` (a
    :class:`RulesError` on the first problem, naming the file and the line);
    ``on_file(source)`` is told each file before it is read."""
    out: list[tuple[str, str, list[Record]]] = []
    where: dict[str, str] = {}
    with gc_paused():
        for source, data in files:
            if on_file is not None:
                on_file(source)
            text = decode_file(data, source)
            if not text.strip():
                raise RulesError("the file is empty; expected a mapping with a 'domain'", path=source, line=1)
            doc, lines = load_yaml(text, source, numbers=False)
            reader = _Reader(source, lines)
            records = reader.document(doc)
            if reader.domain in where:
                raise reader.fail(("domain",), f"duplicate domain {reader.domain!r} (also in {where[reader.domain]})")
            where[reader.domain] = source
            out.append((source, reader.domain, records))
            del doc, lines, reader
    return EnvoyPlan(out, files_digest(files) if digest is None else digest)


def build_steps(
    plan: EnvoyPlan, settings: Settings, *, clock: Any = time.time, step: int = 50
) -> Generator[None, None, EnvoyConfig]:
    """The :class:`EnvoyConfig` of a plan, built ``step`` descriptors at a time (it yields
    between steps: an event loop answers calls while 50,000 routes are built)."""
    key = KeyExtractor(KeyStrategy.CLIENT_IP, trusted_proxies=settings.proxies)
    policies: dict[tuple[int, str], Policy] = {}
    domains: dict[str, _Node] = {}
    routes: list[RouteRule] = []
    done = 0
    for source, domain, records in plan.files:
        root = domains[domain] = _Node()
        nodes: list[_Node] = []
        for parent, final, share, line, lim in records:
            node = _Node(share=share)
            if lim is not None:
                (route, rpu, unit, name, replaces), (unlimited, shadow, quota, detailed, to_metric) = lim
                node.limit = limit = EnvoyLimit(
                    route=route, requests_per_unit=rpu, unit=unit, name=name, replaces=replaces, unlimited=unlimited,
                    shadow_mode=shadow, quota_mode=quota,
                )  # fmt: skip
                if limit.route is not None:
                    policy = policies.get((limit.requests_per_unit, limit.unit))
                    if policy is None:
                        policy = policies[(limit.requests_per_unit, limit.unit)] = _policy(limit)
                    origin = EnvoyOrigin(limit, source, line, domain, (detailed, to_metric, share))
                    routes.append(_route(limit, key, policy, line, origin))
            (root if parent < 0 else nodes[parent]).add(final, node)
            nodes.append(node)
            done += 1
            if done % step == 0:
                yield
    return EnvoyConfig(domains, tuple(routes), tuple(s for s, _, _ in plan.files), plan.digest, clock())


def _policy(limit: EnvoyLimit) -> Policy:
    rpu, period = limit.requests_per_unit, UNITS[limit.unit]
    # 0: over for every request, without asking Redis (the peer's way to ban a value)
    return Policy(average=rpu, period=period, burst=rpu, algorithm="fixed_window") if rpu else Policy.blocking(period)


def _route(limit: EnvoyLimit, key: KeyExtractor, policy: Policy, line: int | None, origin: EnvoyOrigin) -> RouteRule:
    return RouteRule(
        name=limit.route or "",
        methods=None,
        path_pattern="/**",
        key=key,
        local=policy,
        distributed=policy,
        initial_mode=Mode.SHADOW if limit.shadow_mode else Mode.ENFORCE,
        line=line,
        http=False,
        origin=origin,
    )


def parse_envoy_files(
    files: Sequence[tuple[str, bytes]], settings: Settings, *, digest: str | None = None, clock: Any = time.time
) -> EnvoyConfig:
    """The configuration in ``[(source, bytes), ...]`` (a :class:`RulesError` on the first problem)."""
    plan = plan_envoy_files(files, digest=digest)
    with gc_paused():
        config: EnvoyConfig = finish_steps(build_steps(plan, settings, clock=clock))
    return config


def files_digest(files: Sequence[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for source, data in files:
        h.update(Path(source).name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def read_config(path: Path) -> list[tuple[str, bytes]]:
    """``[(source, bytes), ...]`` of a file or directory (a :class:`RulesError` if unreadable)."""
    try:
        files = config_files(path)
    except OSError as exc:
        raise RulesError(f"cannot read the Envoy configuration: {exc.strerror or exc}", path=str(path)) from None
    return [(str(p), read_file(p)) for p in files]


def load_envoy_config(path: str | Path, settings: Settings, *, clock: Any = time.time) -> EnvoyConfig:
    """Load ``SHADOWLIMIT_ENVOY_CONFIG`` (a file, or a directory of ``.yaml`` files)."""
    return parse_envoy_files(read_config(Path(path)), settings, clock=clock)
