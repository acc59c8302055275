"""Reading the rules file: bytes from disk, UTF-8 text, then YAML data with the line of every field.

The YAML is read strictly: only ``true``/``false`` are booleans (YAML 1.1's ``off``/``on``/
``yes``/``no`` stay strings, so ``mode: off`` means the mode ``"off"``), duplicate keys are
errors, only plain mappings, lists and scalars are accepted, and a document may hold at most
:data:`MAX_NODES` values (aliases included, so an alias bomb is refused). Every problem is a
:class:`~control_plane.rules.errors.RulesError` with the file and the line.

>>> data, lines = load_yaml("routes:\\n  - name: a\\n", "rules.yaml")
>>> data, lines[("routes", 0, "name")]
({'routes': [{'name': 'a'}]}, 2)
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .errors import FieldPath, RulesError, display_path, field_name

__all__ = ["MAX_FILE_BYTES", "MAX_NODES", "decode_file", "load_yaml", "read_file"]

MAX_FILE_BYTES = 4 * 1024 * 1024
"""The largest rules file read (bytes)."""

MAX_NODES = 200_000
"""The most values a document may hold, aliases included."""

_MERGE_TAG = "tag:yaml.org,2002:merge"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"


def read_file(path: Path) -> bytes:
    """The file's bytes (at most ``MAX_FILE_BYTES + 1``, so that a larger file is noticed)."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise RulesError(f"cannot read the rules file: {exc.strerror or exc}", path=str(path)) from None


def decode_file(data: bytes, source: str) -> str:
    """The file's text: UTF-8 (a byte-order mark is dropped), at most :data:`MAX_FILE_BYTES`."""
    if len(data) > MAX_FILE_BYTES:
        raise RulesError(f"the file is too large ({len(data)} bytes, max {MAX_FILE_BYTES})", path=source)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise RulesError(f"not valid UTF-8 (byte {exc.start})", path=source, line=line) from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2-style booleans (only true/false) and duplicate-key errors.

    :func:`load_yaml` builds the data itself from the composed node tree (so it can
    record lines); :meth:`construct_mapping` also refuses duplicates for anyone using
    this loader with ``yaml.load``.
    """

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                k = self.construct_object(key_node, deep=deep)
                if k in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {k!r} (first on line {seen[k]})",
                        key_node.start_mark,
                    )
                seen[k] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


class _TextLoader(_StrictLoader):
    """:class:`_StrictLoader` reading every unquoted scalar but ``true``/``false``/``null``
    as the text written (``0123`` stays ``"0123"``, not the octal 83): for files whose
    values are strings, as Go's yaml.v2 decodes them into string fields."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
        for first, resolvers in _StrictLoader.yaml_implicit_resolvers.items()
    }


class _Fail(Exception):
    def __init__(self, path: FieldPath, line: int | None, message: str) -> None:
        self.path, self.line, self.message = path, line, message


class _Builder:
    """Python data from the node tree, recording ``{path: line}`` for every field."""

    def __init__(self, loader: _StrictLoader) -> None:
        self.loader = loader
        self.lines: dict[FieldPath, int] = {}
        self.count = 0
        self.active: set[int] = set()

    def build(self, node: Node, path: FieldPath) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise _Fail(
                path,
                node.start_mark.line + 1,
                f"the document is too large (more than {MAX_NODES} values, aliases included)",
            )
        if isinstance(node, ScalarNode):
            return self.loader.construct_object(node, deep=True)
        if id(node) in self.active:
            raise _Fail(path, node.start_mark.line + 1, "recursive alias")
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                if node.tag != _SEQ_TAG:
                    raise _Fail(path, node.start_mark.line + 1, f"unsupported YAML tag {node.tag!r}")
                items = []
                for i, item in enumerate(node.value):
                    p = (*path, i)
                    self.lines[p] = item.start_mark.line + 1
                    items.append(self.build(item, p))
                return items
            if isinstance(node, MappingNode):
                if node.tag != _MAP_TAG:
                    raise _Fail(path, node.start_mark.line + 1, f"unsupported YAML tag {node.tag!r}")
                return self._mapping(node, path)
            raise _Fail(path, node.start_mark.line + 1, f"unsupported YAML node {type(node).__name__}")
        finally:
            self.active.discard(id(node))

    def _mapping(self, node: MappingNode, path: FieldPath) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        explicit: list[tuple[str, Node, Node]] = []
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:
                sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
                for src in sources:
                    if not isinstance(src, MappingNode):
                        raise _Fail(path, line, "a merge key (<<) needs a mapping or a list of mappings")
                    for k, v in self.build(src, path).items():
                        merged.setdefault(k, v)
                continue
            if not isinstance(key_node, ScalarNode):
                raise _Fail(path, line, "mapping keys must be plain strings")
            key = key_node.value  # the text as written: `1:` is "1", `null:` is "null"
            if key in first_line:
                shown = display_path((*path, key))[-1]
                raise _Fail((*path, key), line, f"duplicate key {shown!r} (first defined on line {first_line[key]})")
            first_line[key] = line
            explicit.append((key, key_node, value_node))
        result = dict(merged)
        for key, key_node, value_node in explicit:
            p = (*path, key)
            self.lines[p] = key_node.start_mark.line + 1
            result[key] = self.build(value_node, p)
        return result


def load_yaml(text: str, source: str | None, *, numbers: bool = True) -> tuple[Any, dict[FieldPath, int]]:
    """The document's data and the 1-based line of every field (``()`` is the document).

    ``source`` names the file in errors (None for text given directly). ``numbers``
    False: unquoted numbers stay the text written (see :class:`_TextLoader`).
    """
    try:
        return _load(text, source, _StrictLoader if numbers else _TextLoader)
    except RecursionError:
        raise RulesError("the document nests too deeply", path=source) from None


def _load(text: str, source: str | None, loader_class: type[_StrictLoader]) -> tuple[Any, dict[FieldPath, int]]:
    loader = loader_class(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            problem = exc.problem or exc.context or "invalid YAML"
            if exc.context and exc.problem:
                problem = f"{exc.problem} ({exc.context})"
            raise RulesError(
                f"YAML syntax error: {problem}", path=source, line=mark.line + 1 if mark else None
            ) from None
        except yaml.YAMLError as exc:
            raise RulesError(f"YAML syntax error: {exc}", path=source) from None
        if node is None:
            raise RulesError("the file is empty; expected a mapping with a 'routes' list", path=source, line=1)
        builder = _Builder(loader)
        try:
            data = builder.build(node, ())
        except _Fail as exc:
            raise RulesError(exc.message, path=source, line=exc.line, field=field_name(exc.path)) from None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            raise RulesError(
                f"{exc.problem or exc.context}", path=source, line=mark.line + 1 if mark else None
            ) from None
        builder.lines.setdefault((), node.start_mark.line + 1)
        return data, builder.lines
    finally:
        loader.dispose()
