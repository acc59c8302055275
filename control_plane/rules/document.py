"""The rules file as a whole: its ``version``, its ``defaults`` and its list of ``routes`` (each
read by :data:`~.schema.ROUTE`), as :class:`~.spec.Block` tables like every other part of it.

:func:`read_document` turns the data and lines of
:func:`~control_plane.rules.yaml_source.load_yaml` into compiled
:class:`~control_plane.rules.model.RouteRule` objects, or raises the
:class:`~control_plane.rules.errors.RulesError` of the first problem (file, line, field).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from limiter.keys import KeyExtractor
from limiter.resilience import FailurePolicy

from .errors import FieldPath
from .fields import FieldReader, type_name
from .model import DEFAULT_ROUTE, RouteRule
from .schema import ROUTE, failure_code, failure_policy
from .spec import Block, Got, Key, read_block, ref

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["DEFAULTS", "DOCUMENT", "RouteDefaults", "read_document"]


@dataclass(frozen=True)
class RouteDefaults:
    """What the file's ``defaults`` block gives the routes that do not set these fields."""

    key: KeyExtractor | None = None
    failure_policy: FailurePolicy | None = None
    failure_code: int | None = None


def read_document(
    data: Any, lines: Mapping[FieldPath, int], source: str | None, settings: Settings
) -> tuple[list[RouteRule], RouteRule | None]:
    """The user routes in file order and the redefined ``default`` route (None if the file has none)."""
    return read_block(FieldReader(lines, source, settings), DOCUMENT, data, ())  # type: ignore[no-any-return]


DEFAULTS = Block(
    name="defaults",
    keys=(
        Key(name="key", read=ROUTE.key("key").read, into="key", schema=ref("key"), doc="As a route's `key`."),
        Key(
            name="failure_policy",
            read=failure_policy,
            into="failure_policy",
            schema=ref("failure_policy"),
            doc="As a route's `failure_policy`.",
        ),
        Key(
            name="failure_code",
            read=failure_code,
            into="failure_code",
            schema=ref("failure_code"),
            doc="As a route's `failure_code`.",
        ),
    ),
    build=lambda r, got, path: _defaults(got),
)


def _defaults(got: Got) -> RouteDefaults:
    return RouteDefaults(**DEFAULTS.fields(got))


def _version(r: FieldReader, value: Any, path: FieldPath, got: Got) -> int:
    if isinstance(value, bool) or value != 1:
        raise r.error(path, f"must be 1, got {value!r}")
    return 1


def _routes(r: FieldReader, value: Any, path: FieldPath, got: Got) -> tuple[list[RouteRule], RouteRule | None]:
    """The user routes in file order and the redefined ``default`` route: unique names, none
    after a route that matches every request."""
    if value is None:
        value = []
    if not isinstance(value, list):
        raise r.error(path, f"must be a list of routes, got {type_name(value)}")
    routes: list[RouteRule] = []
    redefined_default: RouteRule | None = None
    seen: dict[str, int | None] = {}
    catch_all: RouteRule | None = None
    for i, rv in enumerate(value):
        if not isinstance(rv, dict):
            raise r.error((*path, i), f"each route must be a mapping (name, match, local, ...), got {type_name(rv)}")
        rule: RouteRule = read_block(r, ROUTE, rv, (*path, i), got)
        if rule.name in seen:
            first = seen[rule.name]
            where = f" (first defined on line {first})" if first else ""
            raise r.error((*path, i, "name"), f"duplicate route name {rule.name!r}{where}")
        seen[rule.name] = rule.line
        if rule.name == DEFAULT_ROUTE:
            redefined_default = rule
            continue
        if catch_all is not None:
            raise r.error(
                (*path, i),
                f"route {rule.name!r} can never match: route {catch_all.name!r} (line {catch_all.line}) before it "
                f"matches every request; move it down or name it {DEFAULT_ROUTE!r} to make it the fallback",
            )
        if rule.is_catch_all:
            catch_all = rule
        routes.append(rule)
    return routes, redefined_default


DOCUMENT = Block(
    name="document",
    keys=(
        Key(name="version", read=_version, schema={"const": 1}, default_doc="`1`", doc="Must be `1`."),
        Key(
            name="defaults",
            block=DEFAULTS,
            absent=lambda r, got: RouteDefaults(),
            own_table=True,
            doc="`key`, `failure_policy`, `failure_code` used by every route that does not set its own (not by the "
            "built-in `default` route).",
        ),
        Key(
            name="routes",
            read=_routes,
            required=True,
            schema={"type": ["array", "null"], "items": ref("route")},
            doc="A list (may be empty). Tried top to bottom; **the first match wins**; the `default` route is always "
            "tried last.",
        ),
    ),
    build=lambda r, got, path: got["routes"],
)
"""The whole rules file."""
