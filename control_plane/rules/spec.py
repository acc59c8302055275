"""The rules file described once: each block of it (the document, a route, its ``match``, a
``key``, a policy, ``external``, ...) is a :class:`Block`, a table of :class:`Key` rows in file
order. A row says everything about one key: how its value is read (and refused, with the field
named), what it is when absent, what it becomes in the compiled object, its JSON Schema and its
line in the documentation. The loader (:func:`read_block`), the JSON Schema
(``docs/rules.schema.json``, :mod:`.json_schema`) and the tables of docs/configuration.md are all
made from these tables, so a new key is one row.

A row with a ``block`` is a nested mapping read by that block's own rows: a key like
``rollout: {steps: [...], dwell: 10m}`` is a :class:`Block` of its own and one row that names it.
A reader sees what its block has read so far, and what enclosing blocks have (:meth:`Got.outer`),
so a row can depend on an earlier one (``distributed`` inherits from ``local``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from limiter.rates import any_case

from ..durations import DURATION_PATTERN
from .errors import FieldPath
from .model import HTTP_TOKEN

if TYPE_CHECKING:
    from .fields import FieldReader

__all__ = [
    "MISSING",
    "Block",
    "Got",
    "Key",
    "choice",
    "docs_table",
    "duration_schema",
    "header_name",
    "lenient",
    "plain_text",
    "read_block",
    "ref",
    "whole",
]

MISSING: Any = type("Missing", (), {"__repr__": lambda _: "MISSING", "__slots__": ()})()
"""An absent key's value that is not passed on: the compiled object keeps its own default."""

Reader = Callable[["FieldReader", Any, FieldPath, "Got"], Any]
"""How a key's value is read: ``(reader, value, its path, what the block has so far) -> value``;
a problem raises the reader's error for the path."""

_REF = "#/definitions/"


class Got(dict[str, Any]):
    """The values a block has read so far (by key name), and the enclosing block's (``up``)."""

    __slots__ = ("up",)

    def __init__(self, up: Got | None = None) -> None:
        super().__init__()
        self.up = up

    def outer(self, name: str) -> Any:
        """The value of ``name`` in the nearest enclosing block that has read it."""
        got = self.up
        while got is not None:
            if name in got:
                return got[name]
            got = got.up
        raise KeyError(name)


@dataclass(frozen=True, kw_only=True)
class Key:
    """One key of a block (see the module docstring).

    ``read`` reads a present value (``block`` instead, for a nested mapping; neither for a
    row that only documents a key of a block read as a whole, like a policy); ``absent`` gives
    the value when the key is not in the file (:data:`MISSING`: not passed on); ``into`` is the
    compiled object's field the value goes to (None: the block's ``build`` uses it itself).
    ``required`` may depend on the raw mapping (the ``default`` route needs no ``match``).
    ``schema`` is the value's JSON Schema (a nested block's own when None); ``doc`` its meaning,
    in Markdown, for the docs table and (as plain text) the schema's description;
    ``required_doc`` / ``default_doc`` what the table's columns say."""

    name: str
    doc: str
    read: Reader | None = None
    block: Block | None = None
    absent: Callable[[FieldReader, Got], Any] | None = None
    into: str | None = None
    required: bool | Callable[[Mapping[str, Any]], bool] = False
    schema: Mapping[str, Any] | None = None
    required_doc: str | None = None
    default_doc: str = "-"
    own_table: bool = False  # a nested block documented in a table of its own (one row here)

    def __post_init__(self) -> None:
        if self.read is not None and self.block is not None:
            raise ValueError(f"{self.name}: give read or block, not both")

    def value_schema(self) -> dict[str, Any]:
        """The value's JSON Schema, with the doc as its description."""
        if self.schema is not None:
            out = dict(self.schema)
        elif self.block is not None and self.block.definition:
            out = ref(self.block.name)
        elif self.block is not None:
            out = self.block.json_schema()
        else:
            raise ValueError(f"{self.name}: no schema")
        out.setdefault("description", plain_text(self.doc))
        return out


@dataclass(frozen=True, kw_only=True)
class Block:
    """A mapping of the rules file: its keys in file order (the order they are read, listed in
    errors and documented in), and what the values become.

    ``build(reader, got, path)`` makes the compiled value; without one the block's value is
    the dict of its ``into`` fields. ``before(reader, raw, path)`` checks what concerns several
    keys at once before any is read. ``hints`` explain an unknown key better than "did you mean".
    ``definition``: the schema keeps it under ``definitions`` (referenced where it is used);
    ``schema_extra`` adds what the keys alone do not say (``anyOf``, ``if``/``else``, ...)."""

    name: str
    keys: tuple[Key, ...]
    build: Callable[[FieldReader, Got, FieldPath], Any] | None = None
    before: Callable[[FieldReader, Mapping[str, Any], FieldPath], None] | None = None
    hints: Mapping[str, str] = field(default_factory=dict)
    definition: bool = False
    schema_extra: Mapping[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        """The keys, in order (as errors list them)."""
        return tuple(k.name for k in self.keys)

    @functools.cached_property
    def _into(self) -> tuple[tuple[str, str], ...]:
        return tuple((k.name, k.into) for k in self.keys if k.into is not None)

    @functools.cached_property
    def _required(self) -> tuple[tuple[str, bool | Callable[[Mapping[str, Any]], bool]], ...]:
        return tuple((k.name, k.required) for k in self.keys if k.required)

    def key(self, name: str) -> Key:
        for k in self.keys:
            if k.name == name:
                return k
        raise KeyError(name)

    def required_in(self, raw: Mapping[str, Any]) -> tuple[str, ...]:
        """The keys ``raw`` must have."""
        return tuple(name for name, req in self._required if req is True or (callable(req) and req(raw)))

    def fields(self, got: Got) -> dict[str, Any]:
        """The compiled object's fields: each ``into`` key's value (absent ones left out)."""
        return {into: v for name, into in self._into if (v := got[name]) is not MISSING}

    def json_schema(self) -> dict[str, Any]:
        """The block as a JSON Schema object: exactly its keys, the always-required ones."""
        out: dict[str, Any] = {
            "type": "object",
            "properties": {k.name: k.value_schema() for k in self.keys},
            "additionalProperties": False,
        }
        required = [k.name for k in self.keys if k.required is True]
        if required:
            out["required"] = required
        out.update(self.schema_extra)
        return out


def read_block(reader: FieldReader, block: Block, value: Any, path: FieldPath, up: Got | None = None) -> Any:
    """A block's value: the mapping checked (only its keys, the required ones), then each key
    read in order (or its ``absent`` value), then ``build``."""
    raw = reader.mapping(value, path, block.names, hints=block.hints)
    for name in block.required_in(raw):
        if name not in raw:
            raise reader.error(path, f"missing required key {name!r}")
    if block.before is not None:
        block.before(reader, raw, path)
    got = Got(up)
    for k in block.keys:
        name = k.name
        if name in raw:
            if k.read is not None:
                got[name] = k.read(reader, raw[name], (*path, name), got)
            elif k.block is not None:
                got[name] = read_block(reader, k.block, raw[name], (*path, name), got)
            else:  # a row that only documents a key of a block read as a whole
                raise TypeError(f"{block.name}.{name}: no reader")
        else:
            got[name] = MISSING if k.absent is None else k.absent(reader, got)
    if block.build is not None:
        return block.build(reader, got, path)
    return block.fields(got)


# -- the documentation ----------------------------------------------------------------------


def docs_table(block: Block) -> str:
    """The block's table for docs/configuration.md: key, required, default, meaning; a nested
    block's keys as ``outer.inner`` rows unless it has a table of its own."""
    lines = ["| key | required | default | meaning |", "|---|---|---|---|"]
    for name, key in _rows(block, ""):
        required = key.required_doc or ("yes" if key.required is True else "no")
        lines.append(f"| `{name}` | {required} | {key.default_doc} | {key.doc} |")
    return "\n".join(lines) + "\n"


def _rows(block: Block, prefix: str) -> Iterable[tuple[str, Key]]:
    for k in block.keys:
        if k.block is not None and not k.own_table:
            yield from _rows(k.block, f"{prefix}{k.name}.")
        else:
            yield prefix + k.name, k


_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def plain_text(markdown: str) -> str:
    """A doc line without its Markdown (links as their text, no backticks or emphasis)."""
    return _LINK.sub(r"\1", markdown).replace("`", "").replace("**", "")


# -- JSON Schema pieces the tables use --------------------------------------------------------


def ref(name: str) -> dict[str, Any]:
    """A reference to a definition of the schema."""
    return {"$ref": _REF + name}


def anchored(pattern: str) -> str:
    return f"^(?:{pattern})$"


def lenient(names: Iterable[str], *, spaces: bool) -> str:
    """A pattern for names parsed ignoring case, ``_`` and ``-`` (and surrounding spaces)."""
    alternatives = []
    for name in names:
        norm = name.lower().replace("_", "").replace("-", "")
        alternatives.append("[_-]*" + "[_-]*".join(any_case(c) for c in norm) + "[_-]*")
    edge = r"\s*" if spaces else ""
    return f"^{edge}(?:{'|'.join(alternatives)}){edge}$"


def choice(canonical: list[str], pattern: str) -> dict[str, Any]:
    """The canonical spellings (offered by editors) or any spelling the loader accepts."""
    return {"anyOf": [{"enum": canonical}, {"type": "string", "pattern": pattern}]}


def whole(lo: int, hi: int) -> dict[str, Any]:
    """A whole number from ``lo`` to ``hi``."""
    return {"type": "integer", "minimum": lo, "maximum": hi}


def duration_schema(hi: float, *, allow_zero: bool) -> dict[str, Any]:
    """Seconds up to ``hi`` or a duration text."""
    low = {"minimum": 0} if allow_zero else {"exclusiveMinimum": 0}
    return {"anyOf": [{"type": "number", **low, "maximum": hi}, {"type": "string", "pattern": DURATION_PATTERN}]}


def header_name() -> dict[str, Any]:
    """An HTTP header name."""
    return {"type": "string", "pattern": anchored(HTTP_TOKEN.pattern)}
