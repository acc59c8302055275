"""Reading the rules file: bytes from disk, UTF-8 text, then YAML data with the line of every field.

The YAML is read strictly: only ``true``/``false`` are booleans (YAML 1.1's ``off``/``on``/
``yes``/``no`` stay strings, so ``mode: off`` means the mode ``"off"``), duplicate keys are
errors, only plain mappings, lists and scalars are accepted, and a document may hold at most
:data:`MAX_NODES` values (aliases included, so an alias bomb is refused). Every problem is a
:class:`~control_plane.rules.errors.RulesError` with the file and the line.

The data is built straight from the parser's events (libyaml's when PyYAML has it, its
pure-Python parser otherwise), never as a node tree: a 4 MiB file is read in about a second
and a few tens of MB. Mappings and lists are :class:`YamlMap` and :class:`YamlList` (a
``dict`` and a ``list``) that carry the lines of their keys and items; :class:`LineIndex`
finds the line of a field path from them.

>>> data, lines = load_yaml("routes:\\n  - name: a\\n", "rules.yaml")
>>> data, lines[("routes", 0, "name")]
({'routes': [{'name': 'a'}]}, 2)
"""

from __future__ import annotations

import contextlib
import gc
import re
import threading
from array import array
from collections.abc import Callable, Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from yaml.events import (
    AliasEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import MappingNode, ScalarNode

from .errors import FieldPath, RulesError, display_path, field_name

_CParser: Any
try:  # libyaml's parser, ten times faster than the pure-Python one
    from yaml import _yaml

    _CParser = _yaml.CParser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _CParser = None

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_NESTING",
    "MAX_NODES",
    "LineIndex",
    "YamlList",
    "YamlMap",
    "decode_file",
    "gc_paused",
    "load_yaml",
    "read_file",
]

MAX_FILE_BYTES = 4 * 1024 * 1024
"""The largest rules file read (bytes)."""

MAX_NODES = 1_000_000
"""The most values a document may hold, aliases included (a 4 MiB file of descriptors
holds about 400,000)."""

MAX_NESTING = 512
"""The deepest nesting of mappings and lists in a document."""

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

    :func:`load_yaml` builds the data itself from the parser's events (so it can record
    lines) and uses this class for its resolvers and scalar constructors;
    :meth:`construct_mapping` also refuses duplicates for anyone using this loader with
    ``yaml.load``.
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


class YamlMap(dict[str, Any]):
    """A mapping read by :func:`load_yaml`: a ``dict`` whose keys' lines are in its
    document's :class:`LineIndex` from position ``at``, in the dict's order."""

    __slots__ = ("at",)
    at: int


class YamlList(list[Any]):
    """A list read by :func:`load_yaml`: a ``list`` whose items' lines are in its
    document's :class:`LineIndex` from position ``at``."""

    __slots__ = ("at",)
    at: int


class LineIndex(Mapping[FieldPath, int]):
    """``{path: line}`` of a document read by :func:`load_yaml`, looked up in the data
    (the line of a key for a mapping's field, of the item for a list's); ``()`` is the
    document's first line. ``table`` holds every key's and item's line, 4 bytes each."""

    def __init__(self, data: Any, first_line: int, table: array[int]) -> None:
        self.data = data
        self.first_line = first_line
        self.table = table
        self._keys: dict[int, dict[str, int]] = {}  # id(mapping) -> {key: position}

    def key_line(self, node: YamlMap, key: str) -> int | None:
        """The line of a mapping's key (None if it has no such key)."""
        pos = self._keys.get(id(node))
        if pos is None:
            pos = self._keys[id(node)] = {k: i for i, k in enumerate(node)}
        i = pos.get(key)
        return None if i is None else self.table[node.at + i]

    def item_line(self, node: Any, index: int) -> int | None:
        """The line of a list's item (None for a list not read by :func:`load_yaml`)."""
        return self.table[node.at + index] if isinstance(node, YamlList) and 0 <= index < len(node) else None

    def get(self, path: FieldPath, default: Any = None) -> Any:
        if not path:
            return self.first_line
        node, line = self.data, None
        for part in path:
            if isinstance(node, YamlMap) and isinstance(part, str):
                line = self.key_line(node, part)
            elif isinstance(node, YamlList) and isinstance(part, int):
                line = self.item_line(node, part)
            else:
                line = None
            if line is None:
                return default
            node = node[part]
        return line

    def __getitem__(self, path: FieldPath) -> int:
        line = self.get(path)
        if line is None:
            raise KeyError(path)
        return int(line)

    def __contains__(self, path: object) -> bool:
        return isinstance(path, tuple) and self.get(path) is not None

    def __iter__(self) -> Iterator[FieldPath]:
        yield ()
        todo: list[tuple[FieldPath, Any]] = [((), self.data)]
        while todo:
            path, node = todo.pop()
            items = node.items() if isinstance(node, YamlMap) else enumerate(node) if isinstance(node, YamlList) else ()
            for k, v in items:
                yield (*path, k)
                todo.append(((*path, k), v))

    def __len__(self) -> int:
        return sum(1 for _ in self)


_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a large file is read: the collector would walk
    the growing data again and again (it quadruples the time of a 4 MiB file); the data
    holds no cycles to collect. Pauses nest (across threads and tasks): the collector is
    enabled again when the last one ends, if it was enabled when the first began."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


class _Fail(Exception):
    def __init__(self, path: FieldPath, line: int | None, message: str) -> None:
        self.path, self.line, self.message = path, line, message


class _Syntax(Exception):
    """A problem of the YAML itself (no field): ``YAML syntax error: ...``."""

    def __init__(self, line: int | None, message: str) -> None:
        self.line, self.message = line, message


_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
_NO_KEY = object()  # a mapping waiting for its next key
_MERGE = object()  # a mapping's "<<" key: its value is merged in


class _Frame:
    """A mapping or list being read."""

    __slots__ = ("anchor", "count0", "is_map", "key", "key_line", "line", "lines", "merges", "obj")

    def __init__(self, obj: Any, line: int, anchor: str | None, count0: int) -> None:
        self.obj = obj
        self.is_map = isinstance(obj, YamlMap)
        self.line = line
        self.lines: list[int] = []  # of its keys or items, into the table when it ends
        self.anchor = anchor
        self.count0 = count0
        self.key: Any = _NO_KEY
        self.key_line = 0
        self.merges: list[YamlMap] | None = None


class _Builder:
    """Python data from the parser's events, each mapping and list with its lines."""

    def __init__(self, loader: _StrictLoader) -> None:
        self.loader = loader
        self.stack: list[_Frame] = []
        self.anchors: dict[str, tuple[Any, int, str | None]] = {}  # name -> (value, values, key text)
        self.open: set[str] = set()
        self.count = 0
        self.docs = 0
        self.root: Any = None
        self.root_line = 1
        self.table: array[int] = array("i")
        self.strings: dict[str, str] = {}  # one object per distinct text (keys repeat in every item)
        resolvers = type(loader).yaml_implicit_resolvers
        self.resolved_firsts = frozenset(k for k in resolvers if k is not None)
        self.wildcards = None in resolvers
        self.memo: dict[Any, Any] = {}

    def path(self, frames: list[_Frame] | None = None) -> FieldPath:
        """The path of the value being read (each frame's current key or index)."""
        out: list[str | int] = []
        for f in self.stack if frames is None else frames:
            if not f.is_map:
                out.append(len(f.obj))
            elif f.key is not _NO_KEY and f.key is not _MERGE:
                out.append(f.key)
        return tuple(out)

    def run(self, get_event: Callable[[], Any]) -> None:
        stack, plain, strings = self.stack, self.plain, self.strings
        while True:
            ev = get_event()
            t = type(ev)
            if t is ScalarEvent:
                # the common case inline: an untagged, unanchored key or plain text in a mapping
                f = stack[-1] if stack else None
                if f is None or not f.is_map or ev.anchor is not None or ev.tag is not None:
                    self.scalar(ev)
                    continue
                text = ev.value
                if f.key is _NO_KEY:
                    if text == "<<" or text in f.obj:
                        self.scalar(ev)
                    else:
                        f.key, f.key_line = strings.setdefault(text, text), ev.start_mark.line + 1
                elif f.key is _MERGE or not plain(text, ev.implicit[0]) or self.count >= MAX_NODES:
                    self.scalar(ev)
                else:
                    self.count += 1
                    f.obj[f.key] = strings.setdefault(text, text)
                    f.lines.append(f.key_line)
                    f.key = _NO_KEY
            elif t is MappingEndEvent or t is SequenceEndEvent:
                self.end()
            elif t is MappingStartEvent or t is SequenceStartEvent:
                self.start(ev, t is MappingStartEvent)
            elif t is AliasEvent:
                self.alias(ev)
            elif t is DocumentStartEvent:
                self.docs += 1
                if self.docs > 1:
                    raise _Syntax(
                        ev.start_mark.line + 1, "but found another document (expected a single document in the stream)"
                    )
            elif t is StreamEndEvent:
                return

    def drain(self, get_event: Callable[[], Any]) -> None:
        """Read the rest of the stream after a problem with a value: a syntax error
        anywhere in the file is the one reported (the file is not YAML at all)."""
        names = set(self.anchors) | self.open
        while True:
            ev = get_event()
            t = type(ev)
            if t is StreamEndEvent:
                return
            line = ev.start_mark.line + 1
            if t is DocumentStartEvent:
                raise _Syntax(line, "but found another document (expected a single document in the stream)")
            name = getattr(ev, "anchor", None)
            if t is AliasEvent and name not in names:
                raise _Syntax(line, f"found undefined alias {name!r}")
            if t is not AliasEvent and name is not None:
                self.anchor(name, line)
                names.add(name)
                self.anchors[name] = (None, 0, None)

    def count_in(self, n: int, line: int) -> None:
        self.count += n
        if self.count > MAX_NODES:
            too_large = f"the document is too large (more than {MAX_NODES} values, aliases included)"
            raise _Fail(self.path(), line, too_large)

    def anchor(self, name: str | None, line: int) -> None:
        if name is not None and (name in self.anchors or name in self.open):
            raise _Syntax(line, f"second occurrence (found duplicate anchor {name!r}; first occurrence)")

    def plain(self, text: str, implicit: bool) -> bool:
        """Whether an untagged scalar is its text: quoted, or plain text no resolver looks at."""
        return not implicit or (not self.wildcards and text[:1] not in self.resolved_firsts and text != "")

    def value_of(self, ev: Any, line: int) -> Any:
        """A scalar's value: plain text not starting like a number, null or boolean is the
        text itself; anything else goes through the loader's resolver and constructor once
        per distinct (tag, text)."""
        value, tag = ev.value, ev.tag
        if tag is None or tag == "!":
            if not ev.implicit[0]:
                return self.strings.setdefault(value, value)  # quoted: a string
            if not self.wildcards and value[:1] not in self.resolved_firsts and value:
                return self.strings.setdefault(value, value)
            memo_key: Any = value
        else:
            memo_key = (tag, value)
        try:
            return self.memo[memo_key]
        except KeyError:
            pass
        if tag is None or tag == "!":
            tag = self.loader.resolve(ScalarNode, value, ev.implicit)  # type: ignore[no-untyped-call]
        node = ScalarNode(tag, value, ev.start_mark, ev.end_mark, style=ev.style)
        try:
            result = self.loader.construct_object(node, deep=True)
        finally:
            self.loader.constructed_objects.clear()
        self.memo[memo_key] = result
        return result

    def scalar(self, ev: Any) -> None:
        line = ev.start_mark.line + 1
        self.anchor(ev.anchor, line)
        f = self.stack[-1] if self.stack else None
        if f is not None and f.is_map and f.key is _NO_KEY:
            self.key(f, ev.value, ev.tag, ev.implicit[0], line)
            if ev.anchor is not None:
                self.anchors[ev.anchor] = (self.value_of(ev, line), 1, ev.value)
            return
        value = self.value_of(ev, line)
        self.count_in(1, line)
        if ev.anchor is not None:
            self.anchors[ev.anchor] = (value, 1, ev.value)
        self.add(value, line)

    def key(self, f: _Frame, text: str, tag: str | None, implicit: bool, line: int) -> None:
        if tag == _MERGE_TAG or (text == "<<" and implicit and tag in (None, "!")):
            f.key, f.key_line = _MERGE, line
            return
        if text in f.obj:
            first = f.lines[list(f.obj).index(text)]
            path = (*self.path(self.stack[:-1]), text)
            shown = display_path(path)[-1]
            raise _Fail(path, line, f"duplicate key {shown!r} (first defined on line {first})")
        f.key, f.key_line = self.strings.setdefault(text, text), line

    def add(self, value: Any, line: int) -> None:
        """A complete value into the mapping or list being read (or as the document)."""
        if not self.stack:
            self.root, self.root_line = value, line
            return
        f = self.stack[-1]
        obj = f.obj
        if not f.is_map:
            obj.append(value)
            f.lines.append(line)
            return
        if f.key is _MERGE:
            sources = value if isinstance(value, YamlList) else [value]
            if not all(isinstance(s, YamlMap) for s in sources):
                raise _Fail(self.path(), f.key_line, "a merge key (<<) needs a mapping or a list of mappings")
            if f.merges is None:
                f.merges = []
            f.merges.extend(sources)
        else:
            obj[f.key] = value
            f.lines.append(f.key_line)
        f.key = _NO_KEY

    def start(self, ev: Any, is_map: bool) -> None:
        line = ev.start_mark.line + 1
        f = self.stack[-1] if self.stack else None
        if f is not None and f.is_map and f.key is _NO_KEY:
            raise _Fail(self.path(), line, "mapping keys must be plain strings")
        tag = ev.tag
        if tag is not None and tag != "!" and tag != ("tag:yaml.org,2002:map" if is_map else "tag:yaml.org,2002:seq"):
            raise _Fail(self.path(), line, f"unsupported YAML tag {tag!r}")
        if len(self.stack) >= MAX_NESTING:
            raise RecursionError
        self.anchor(ev.anchor, line)
        count0 = self.count
        self.count_in(1, line)
        if ev.anchor is not None:
            self.open.add(ev.anchor)
        self.stack.append(_Frame(YamlMap() if is_map else YamlList(), line, ev.anchor, count0))

    def end(self) -> None:
        f = self.stack.pop()
        value, lines = f.obj, f.lines
        if f.merges is not None:
            value, lines = self.merged(f.merges, f.obj, lines)
        value.at = len(self.table)
        self.table.extend(lines)
        if f.anchor is not None:
            self.open.discard(f.anchor)
            self.anchors[f.anchor] = (value, self.count - f.count0, None)
        self.add(value, f.line)

    def merged(self, merges: list[YamlMap], explicit: YamlMap, lines: list[int]) -> tuple[YamlMap, list[int]]:
        """A mapping with merge keys: the merged mappings' keys (the first one's value
        wins), then the mapping's own, which override them; and the keys' lines."""
        out, out_lines = YamlMap(), list[int]()
        pos: dict[str, int] = {}
        for m in merges:
            for i, (k, v) in enumerate(m.items()):
                if k not in out:
                    pos[k] = len(out_lines)
                    out[k] = v
                    out_lines.append(self.table[m.at + i])
        for (k, v), line in zip(explicit.items(), lines, strict=True):
            if k in out:
                out_lines[pos[k]] = line
            else:
                out_lines.append(line)
            out[k] = v
        return out, out_lines

    def alias(self, ev: Any) -> None:
        line = ev.start_mark.line + 1
        name = ev.anchor
        if name in self.open:
            raise _Fail(self.path(), line, "recursive alias")
        if name not in self.anchors:
            raise _Syntax(line, f"found undefined alias {name!r}")
        value, size, text = self.anchors[name]
        f = self.stack[-1] if self.stack else None
        if f is not None and f.is_map and f.key is _NO_KEY:
            if text is None:
                raise _Fail(self.path(), line, "mapping keys must be plain strings")
            self.key(f, text, _STR_TAG, False, line)
            return
        self.count_in(size, line)
        self.add(value, line)


def _syntax_error(exc: yaml.YAMLError, text: str, source: str | None) -> RulesError:
    if "maximum nesting depth" in str(exc):  # libyaml's own limit (1,000 levels)
        return RulesError("the document nests too deeply", path=source)
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem:
            problem = f"{exc.problem} ({exc.context})"
        return RulesError(f"YAML syntax error: {problem}", path=source, line=mark.line + 1 if mark else None)
    position = getattr(exc, "position", None)
    line = None
    if isinstance(position, int):  # a ReaderError: libyaml counts bytes, the pure-Python reader characters
        line = text.encode("utf-8", "surrogatepass")[:position].count(b"\n") + 1 if _CParser is not None else None
        line = line or text[:position].count("\n") + 1
    reason = getattr(exc, "reason", None) or str(exc).split("\n", 1)[0]
    return RulesError(f"YAML syntax error: {reason}", path=source, line=line)


def load_yaml(text: str, source: str | None, *, numbers: bool = True) -> tuple[Any, LineIndex]:
    """The document's data and the 1-based line of every field (``()`` is the document).

    ``source`` names the file in errors (None for text given directly). ``numbers``
    False: unquoted numbers stay the text written (see :class:`_TextLoader`).
    """
    loader_class = _StrictLoader if numbers else _TextLoader
    try:
        with gc_paused():
            return _load(text, source, loader_class)
    except RecursionError:
        raise RulesError("the document nests too deeply", path=source) from None


def _load(text: str, source: str | None, loader_class: type[_StrictLoader]) -> tuple[Any, LineIndex]:
    loader = loader_class("")
    builder = _Builder(loader)
    try:
        parser = _CParser(text) if _CParser is not None else loader_class(text)
        try:
            builder.run(parser.get_event)
        except (_Fail, yaml.constructor.ConstructorError):
            builder.drain(parser.get_event)  # a syntax error further on comes first
            raise
    except _Fail as exc:
        raise RulesError(exc.message, path=source, line=exc.line, field=field_name(exc.path)) from None
    except _Syntax as exc:
        raise RulesError(f"YAML syntax error: {exc.message}", path=source, line=exc.line) from None
    except yaml.constructor.ConstructorError as exc:  # a scalar's tag or value
        mark = exc.problem_mark or exc.context_mark
        raise RulesError(f"{exc.problem or exc.context}", path=source, line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise _syntax_error(exc, text, source) from None
    finally:
        loader.dispose()
    if builder.docs == 0:
        raise RulesError("the file is empty; expected a mapping with a 'routes' list", path=source, line=1)
    return builder.root, LineIndex(builder.root, builder.root_line, builder.table)
