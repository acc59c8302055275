"""Path patterns: which request paths a route's ``match.path`` covers.

A pattern is a list of segments: literals match exactly (case-sensitive), ``*`` and
``{name}`` exactly one segment, ``**`` any number of segments, including none.

>>> segments = compile_path_pattern("/api/{version}/search/**")
>>> match_segments(segments, path_segments("/api/v1/search/books/1"))
True
>>> match_segments(segments, path_segments("/api/v1/browse"))
False
"""

from __future__ import annotations

import re

__all__ = ["ANY", "ONE", "MAX_PATTERN_LENGTH", "Segment", "compile_path_pattern", "match_segments", "path_segments"]

MAX_PATTERN_LENGTH = 1024
"""The longest path pattern accepted (characters)."""

_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _Wild:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


ONE = _Wild("*")
"""A wildcard segment matching exactly one segment (``*`` or ``{name}``)."""
ANY = _Wild("**")
"""A wildcard segment matching zero or more segments (``**``)."""

Segment = str | _Wild
"""A compiled pattern segment: a literal, :data:`ONE` or :data:`ANY`."""


def _check_pattern_text(pattern: object) -> str:
    if not isinstance(pattern, str):
        raise ValueError(f"must be a string, got {type(pattern).__name__}")
    if not pattern.startswith("/"):
        raise ValueError(f"must start with '/', got {pattern!r}")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise ValueError(f"too long ({len(pattern)} characters, max {MAX_PATTERN_LENGTH})")
    if any(c.isspace() or not c.isprintable() for c in pattern):
        raise ValueError(f"must not contain whitespace or control characters, got {pattern!r}")
    if "?" in pattern or "#" in pattern:
        raise ValueError(f"a path pattern has no query string or fragment ('?', '#'), got {pattern!r}")
    return pattern


def _segment(part: str, pattern: str, params: set[str]) -> Segment:
    """One segment of ``pattern``; a ``{name}`` is added to ``params`` (a name may appear once)."""
    if part == "":
        raise ValueError(f"empty path segment ('//') in {pattern!r}")
    if part == "**":
        return ANY
    if part == "*":
        return ONE
    if (m := _PARAM.fullmatch(part)) is not None:
        if m.group(1) in params:
            raise ValueError(f"parameter {{{m.group(1)}}} appears twice in {pattern!r}")
        params.add(m.group(1))
        return ONE
    if any(c in part for c in "*{}"):
        raise ValueError(
            f"wildcards must be whole segments ('*', '**' or '{{name}}'), got segment {part!r} in {pattern!r}"
        )
    return part


def compile_path_pattern(pattern: object) -> tuple[Segment, ...]:
    """Validate a path pattern and return its segments (the same tuple for the same
    text: a file of 50,000 routes holds a few distinct patterns).

    Literal segments match exactly (case-sensitive); ``*`` and ``{name}`` match exactly
    one segment; ``**`` matches any number of segments, including none. Wildcards must
    be whole segments. A trailing ``/`` is ignored. Raises :class:`ValueError`.
    """
    if isinstance(pattern, str):
        cached = _compiled.get(pattern)
        if cached is not None:
            return cached
    text = _check_pattern_text(pattern)
    segments = _compile(text)
    if len(_compiled) >= _CACHE_MAX:
        _compiled.clear()
    _compiled[text] = segments
    return segments


_CACHE_MAX = 4096
_compiled: dict[str, tuple[Segment, ...]] = {}


def _compile(text: str) -> tuple[Segment, ...]:
    body = text[1:]
    if body.endswith("/"):
        body = body[:-1]
    if not body:
        return ()
    segments: list[Segment] = []
    params: set[str] = set()
    for part in body.split("/"):
        segment = _segment(part, text, params)
        if segment is ANY and segments and segments[-1] is ANY:
            continue  # '/**/**' is the same as '/**'
        segments.append(segment)
    return tuple(segments)


def match_segments(pattern: tuple[Segment, ...], segs: list[str]) -> bool:
    """Whether a request path's segments (:func:`path_segments`) match a compiled pattern."""
    n = len(segs)
    if ANY not in pattern:  # fast path: one segment per pattern element
        if len(pattern) != n:
            return False
        for p, s in zip(pattern, segs):
            if p is not ONE and p != s:
                return False
        return True
    # positions in ``segs`` reachable after each pattern element: O(len(pattern) * n)
    reach = [0]
    for p in pattern:
        if p is ANY:
            reach = list(range(reach[0], n + 1))
        elif p is ONE:
            reach = [i + 1 for i in reach if i < n]
        else:
            reach = [i + 1 for i in reach if i < n and segs[i] == p]
        if not reach:
            return False
    return reach[-1] == n


def path_segments(path: str) -> list[str]:
    """Request path to segments: empty segments (trailing or doubled '/') are dropped."""
    return [s for s in path.split("/") if s]
