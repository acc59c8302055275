"""Reading one field of the rules file: its shape, its value, and an error that names it.

A :class:`FieldReader` knows the line of every field (from
:func:`~control_plane.rules.yaml_source.load_yaml`) and turns each problem into a
:class:`~control_plane.rules.errors.RulesError` with the file, the line and the field's
dotted path. It reads the parts a route is made of that stand on their own: mappings with
known keys, strings, whole numbers, durations, policies, keys, failure policies and codes,
HTTP methods, allow/deny list entries and header names. :mod:`.schema` reads the document
and the routes with it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, get_args

from limiter.keys import ForwardedMode, KeyExtractor, KeyStrategy, api_key_id
from limiter.policy import MAX_AVERAGE, MAX_BURST, Algorithm, Policy
from limiter.rates import LIMIT_EXAMPLES
from limiter.resilience import FailurePolicy

from ..durations import parse_duration
from ..external import check_service_url
from .errors import API_KEY_ID, FieldPath, RulesError, field_name
from .lists import parse_list_entry
from .model import HTTP_TOKEN
from .spec import Block, Got, Key, choice, header_name, lenient, read_block, ref, whole

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["FAILURE_CODES", "KEY", "KEY_MAX_LENGTH", "POLICY", "FieldReader", "bare", "type_name"]

FAILURE_CODES = (400, 599)
"""The statuses a ``failure_code`` may be (inclusive)."""
KEY_MAX_LENGTH = (1, 65_536)
"""The range of a key's ``max_length`` (UTF-8 bytes, inclusive)."""
_FIELD_MESSAGE = re.compile(r"([A-Za-z_]+): (.*)", re.S)


def bare(exc: ValueError, prefix: str) -> str:
    """An error message without its ``"<prefix>: "`` (the field path already says it)."""
    msg = getattr(exc, "message", None) or str(exc)
    return msg[len(prefix) + 2 :] if msg.startswith(f"{prefix}: ") else msg


def type_name(value: object) -> str:
    """How errors name a value's type: ``null``, ``a mapping``, ``a list``, ``str``, ..."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


class FieldReader:
    """Reads fields of one document; every method raises :class:`RulesError` naming the field.

    ``lines`` maps each field's path to its line, ``source`` names the file in errors (None
    for text given directly); ``settings`` gives what the file does not set (trusted proxies).
    """

    def __init__(self, lines: Mapping[FieldPath, int], source: str | None, settings: Settings) -> None:
        self.lines = lines
        self.source = source
        self.settings = settings
        self.proxies = settings.proxies

    # -- errors --

    def line(self, path: FieldPath) -> int | None:
        """The line of a field, else of the closest enclosing field that has one."""
        p = path
        while True:
            if p in self.lines:
                return self.lines[p]
            if not p:
                return None
            p = p[:-1]

    def error(self, path: FieldPath, message: str) -> RulesError:
        """The error for a field."""
        return RulesError(message, path=self.source, line=self.line(path), field=field_name(path))

    def value_error(self, path: FieldPath, exc: ValueError, names: Iterable[str] = ()) -> RulesError:
        """A Policy/KeyExtractor message ``"burst: ..."`` becomes field ``path.burst``."""
        msg = getattr(exc, "message", None) or str(exc)
        m = _FIELD_MESSAGE.match(msg)
        if m and m.group(1) in names:
            return self.error((*path, m.group(1)), m.group(2))
        return self.error(path, msg)

    # -- shapes --

    def mapping(
        self,
        value: Any,
        path: FieldPath,
        allowed: tuple[str, ...],
        required: tuple[str, ...] = (),
        hints: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """A mapping with only ``allowed`` keys (a hint, else a close match, is suggested) and
        the ``required`` ones."""
        if not isinstance(value, dict):
            raise self.error(path, f"must be a mapping, got {type_name(value)}")
        for k in value:
            if k not in allowed:
                hint = hints.get(k) if hints else None
                close = difflib.get_close_matches(k, allowed, n=1)
                msg = f"unknown key {k!r}"
                if hint:
                    msg += f"; {hint}"
                elif close:
                    msg += f" (did you mean {close[0]!r}?)"
                raise self.error((*path, k), f"{msg}; allowed keys: {', '.join(allowed)}")
        for k in required:
            if k not in value:
                raise self.error(path, f"missing required key {k!r}")
        return value

    def string(self, value: Any, path: FieldPath) -> str:
        if not isinstance(value, str):
            raise self.error(path, f"must be a string, got {type_name(value)}")
        return value

    def boolean(self, value: Any, path: FieldPath) -> bool:
        """``true`` or ``false`` (nothing else is truthy here)."""
        if not isinstance(value, bool):
            raise self.error(path, f"must be true or false, got {type_name(value)} {value!r}")
        return value

    def integer(self, value: Any, path: FieldPath, lo: int, hi: int) -> int:
        """A whole number from ``lo`` to ``hi`` (``true`` is not a number)."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(path, f"must be a whole number from {lo} to {hi}, got {type_name(value)} {value!r}")
        if not lo <= value <= hi:
            raise self.error(path, f"must be from {lo} to {hi}, got {value}")
        return value

    # -- pieces --

    def policy(self, value: Any, path: FieldPath, inherit: Policy | None = None) -> Policy:
        """A policy: a limit text (``"100/minute"``) or a mapping of :data:`POLICY`'s keys with
        ``average`` (and ``period``) or ``limit``; ``algorithm`` and ``period`` come from
        ``inherit`` when not set (``burst`` never does)."""
        if isinstance(value, str):
            return self._limit_text(value, path, None, inherit.algorithm if inherit is not None else None)
        m = self.mapping(value, path, POLICY.names)
        if "algorithm" in m:
            algorithm: Any = self.string(m["algorithm"], (*path, "algorithm"))
        else:
            algorithm = inherit.algorithm if inherit is not None else Algorithm.TOKEN_BUCKET
        if "limit" in m:
            for other in ("average", "period"):
                if other in m:
                    raise self.error(
                        (*path, other),
                        f'give limit (like "100/minute") or average and period, not both; got limit and {other}',
                    )
            return self._limit_text(m["limit"], (*path, "limit"), m, algorithm)
        if "average" not in m:
            raise self.error(path, f"missing required key 'average' (or a limit text like {LIMIT_EXAMPLES})")
        if "period" in m:
            try:
                period = parse_duration(m["period"])
            except ValueError as exc:
                raise self.value_error(path, exc, POLICY.names) from None
        else:
            period = inherit.period if inherit is not None else 1.0
        try:
            return Policy(average=m["average"], period=period, burst=m.get("burst"), algorithm=algorithm)
        except ValueError as exc:
            raise self.value_error(path, exc, POLICY.names) from None

    def _limit_text(self, text: Any, path: FieldPath, m: dict[str, Any] | None, algorithm: Any) -> Policy:
        """``"100/minute"`` (at ``path``), with the mapping's ``burst`` if any (``path`` is
        then its ``limit`` field)."""
        try:
            return Policy.parse(
                text, burst=m.get("burst") if m else None, algorithm=algorithm or Algorithm.TOKEN_BUCKET
            )
        except ValueError as exc:
            if m is None:
                raise self.error(path, bare(exc, "limit")) from None
            name = str(exc).partition(": ")[0]
            if name == "limit":
                raise self.error(path, bare(exc, "limit")) from None
            raise self.value_error(path[:-1], exc, POLICY.names) from None

    def key(self, value: Any, path: FieldPath) -> KeyExtractor:
        """A ``key`` block (:data:`KEY`)."""
        return read_block(self, KEY, value, path)  # type: ignore[no-any-return]

    def failure_policy(self, value: Any, path: FieldPath) -> FailurePolicy:
        self.string(value, path)
        try:
            return FailurePolicy.parse(value)
        except ValueError as exc:
            raise self.value_error(path[:-1], exc, ("failure_policy",)) from None

    def failure_code(self, value: Any, path: FieldPath) -> int:
        return self.integer(value, path, *FAILURE_CODES)

    def duration(self, value: Any, path: FieldPath, lo: float, hi: float, *, allow_zero: bool) -> float:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise self.error(path, bare(exc, "period")) from None
        if not (lo <= seconds <= hi) or (seconds == 0 and not allow_zero):
            low = f"from {lo:g}s" if allow_zero else "more than 0s"
            raise self.error(path, f"must be {low} up to {hi:g}s, got {value!r}")
        return seconds

    def service_url(self, value: Any, path: FieldPath) -> str:
        """An ``http://`` or ``https://`` URL of a service shadowlimit calls (no credentials in it)."""
        url = self.string(value, path)
        try:
            check_service_url(url)
        except ValueError as exc:
            raise self.error(path, bare(exc, "url")) from None
        return url

    def header_list(self, value: Any, path: FieldPath) -> list[str]:
        if not isinstance(value, list):
            raise self.error(path, f"must be a list of header names, got {type_name(value)}")
        out: list[str] = []
        for i, item in enumerate(value):
            name = self.string(item, (*path, i))
            if HTTP_TOKEN.fullmatch(name) is None:
                raise self.error((*path, i), f"{name!r} is not an HTTP header name")
            out.append(name)
        return out

    def methods(self, value: Any, path: FieldPath) -> frozenset[str] | None:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise self.error(path, f'must be a list of HTTP methods (or "*"), got {type_name(value)}')
        if not items:
            raise self.error(path, 'must not be empty (omit it, or use "*", for any method)')
        out: set[str] = set()
        for i, item in enumerate(items):
            p = (*path, i) if isinstance(value, list) else path
            m = self.string(item, p)
            if m == "*":
                return None
            if HTTP_TOKEN.fullmatch(m) is None:
                raise self.error(p, f"{m!r} is not an HTTP method")
            if m != m.upper():
                raise self.error(
                    p, f"HTTP methods are case-sensitive and written in upper case: use {m.upper()!r}, not {m!r}"
                )
            out.add(m)
        return frozenset(out)

    def entries(self, value: Any, path: FieldPath, strategy: KeyStrategy) -> list[str]:
        if not isinstance(value, list):
            raise self.error(path, f"must be a list of IP addresses, CIDR blocks or keys, got {type_name(value)}")
        out: list[str] = []
        for i, item in enumerate(value):
            try:
                parsed = parse_list_entry(item)
            except ValueError as exc:
                raise self.error((*path, i), bare(exc, "entry")) from None
            if isinstance(parsed, str) and strategy is KeyStrategy.API_KEY and not API_KEY_ID.fullmatch(parsed):
                parsed = api_key_id(parsed)  # keys on apiKey routes are ids; hash raw keys like overrides
            out.append(parsed if isinstance(parsed, str) else str(parsed))
        return out


# -- the tables of a ``key`` block and a policy ------------------------------------------------


def _strategy(r: FieldReader, value: Any, path: FieldPath, got: Got) -> KeyStrategy:
    try:
        return KeyStrategy.parse(value)
    except ValueError as exc:
        raise r.error(path, str(exc)) from None


def _for(*strategies: KeyStrategy, message: str) -> Any:
    """A string that only applies to some strategies (``message``: how the others are told)."""

    def read(r: FieldReader, value: Any, path: FieldPath, got: Got) -> str:
        text = r.string(value, path)
        if got["strategy"] not in strategies:
            raise r.error(path, message.format(strategy=got["strategy"].value))
        return text

    return read


def _build_key(r: FieldReader, got: Got, path: FieldPath) -> KeyExtractor:
    try:
        return KeyExtractor(got["strategy"], trusted_proxies=r.proxies, **KEY.fields(got))
    except ValueError as exc:
        raise r.value_error(path, exc, KEY.names) from None


_STRATEGIES = [s.value for s in KeyStrategy]
_HTTP = (KeyStrategy.HEADER, KeyStrategy.COMPOSITE)
_STRATEGY_NEEDS_HEADER = {
    "required": ["strategy"],
    "properties": {"strategy": {"type": "string", "pattern": lenient([s.value for s in _HTTP], spaces=True)}},
}

KEY = Block(
    name="key",
    definition=True,
    keys=(
        Key(
            name="strategy",
            read=_strategy,
            absent=lambda r, got: KeyStrategy.CLIENT_IP,
            schema=choice(_STRATEGIES, lenient(_STRATEGIES, spaces=True)),
            default_doc="`clientIP`",
            doc="`clientIP`, `header`, `composite`, `apiKey` (case, `_`, `-` ignored).",
        ),
        Key(
            name="header",
            read=_for(*_HTTP, message="only applies to the header and composite strategies, not {strategy}"),
            into="header",
            schema=header_name(),
            doc="Required for `header` and `composite`: the header whose value is the key (`composite` keys are "
            "`<value>:<first path segment>`, e.g. `acme:checkout`).",
        ),
        Key(
            name="api_key_header",
            read=_for(KeyStrategy.API_KEY, message="only applies to the apiKey strategy, not {strategy}"),
            into="api_key_header",
            schema=header_name(),
            default_doc="`X-API-Key`",
            doc="`apiKey` only; `Authorization: Bearer <token>` is also accepted. The key is `apikey:` + the first "
            "32 hex digits of SHA-256 of the value.",
        ),
        Key(
            name="forwarded_mode",
            read=_for(KeyStrategy.CLIENT_IP, message="only applies to the clientIP strategy"),
            into="forwarded_mode",
            schema={"enum": list(get_args(ForwardedMode))},
            default_doc="`first`",
            doc="`clientIP` only. `first`: the first valid `X-Forwarded-For` entry (then `X-Real-IP`) when the peer "
            "is a trusted proxy; `rightmost_untrusted`: walk `X-Forwarded-For` from the right, skipping trusted "
            "proxies.",
        ),
        Key(
            name="max_length",
            read=lambda r, v, p, got: r.integer(v, p, *KEY_MAX_LENGTH),
            into="max_length",
            schema=whole(*KEY_MAX_LENGTH),
            default_doc="`256`",
            doc="Longest key in UTF-8 bytes (1-65536; at least 39 for `clientIP` and `apiKey`).",
        ),
    ),
    build=_build_key,
    hints={
        "trusted_proxies": "trusted proxies are not set in the rules file; they come from SHADOWLIMIT_TRUSTED_PROXIES"
    },
    schema_extra={
        "allOf": [
            {
                "if": {
                    "required": ["strategy"],
                    "properties": {
                        "strategy": {"type": "string", "pattern": lenient([s.value for s in _HTTP], spaces=True)}
                    },
                },
                "then": {"required": ["header"]},
            }
        ]
    },
)
"""A route's ``key`` (and ``defaults.key``): how a request maps to its bucket."""

POLICY = Block(
    name="policy",
    keys=(
        Key(
            name="algorithm",
            schema={"enum": [a.value for a in Algorithm]},
            required_doc="no",
            default_doc="`token_bucket` (or inherited)",
            doc="`token_bucket`, `gcra`, `fixed_window`, `sliding_window`, `sliding_log` "
            "([algorithms](algorithms.md)).",
        ),
        Key(
            name="average",
            schema={"type": "number", "maximum": MAX_AVERAGE},
            required_doc="yes (or `limit`)",
            doc="Tokens added (or requests allowed) per period. `<= 0` = unlimited. Windowed algorithms need `>= 1` "
            "and use `floor(average)`.",
        ),
        Key(
            name="period",
            schema=ref("period"),
            default_doc="`1s` (or inherited)",
            doc="Seconds (`1`, `0.5`) or a duration (`500ms`, `1s`, `1.5s`, `1m30s`, `1h`, `1d`), from 1 ms to "
            "366 days.",
        ),
        Key(
            name="burst",
            schema=whole(1, MAX_BURST),
            default_doc="`ceil(average)`",
            doc="Bucket size, a whole number from 1 to 10^12 (never inherited). Windowed algorithms use it only for "
            "the key TTL.",
        ),
        Key(
            name="limit",
            schema=ref("limit"),
            doc='The limit as text instead of `average` and `period`: `"100/minute"` ([below](#limits-as-text)). '
            "With `burst` and `algorithm` if wanted; not with `average` or `period`.",
        ),
    ),
    schema_extra={
        "anyOf": [{"required": ["average"]}, {"required": ["limit"]}],
        "dependencies": {"limit": {"properties": {"average": False, "period": False}}},
    },
)
"""A policy's keys (``local``, ``distributed``, an override), read as a whole by
:meth:`FieldReader.policy`; a policy may also be a limit text alone (``local: 100/minute``)."""
