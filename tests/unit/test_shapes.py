"""Meaning by name, not position: the check ``./dev lint`` runs (``.ci/check_sizes.py``) finds
what it is for in control_plane/ and limiter/, and nothing there today."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_sizes", ROOT / ".ci" / "check_sizes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def problems(check: ModuleType, tmp_path: Path, code: str) -> list[str]:
    path = tmp_path / "sample.py"
    path.write_text(textwrap.dedent(code))
    return [p.split(": ", 1)[1] for p in check.shape_problems(path, 6, 5)]


def test_the_repository_has_none(check: ModuleType) -> None:
    cfg = check.limits()
    files = [p for d in cfg["shape-paths"] for p in sorted((ROOT / d).rglob("*.py"))]
    assert files
    assert [m for f in files for m in check.shape_problems(f, cfg["max-positional"], cfg["max-tuple"])] == []


def test_positional_parameters(check: ModuleType, tmp_path: Path) -> None:
    found = problems(
        check,
        tmp_path,
        """
        def seven(a, b, c, d, e, f, g): ...
        def six_then_named(a, b, c, d, e, f, *, g, h): ...
        class C:
            def method(self, a, b, c, d, e, f): ...
            @staticmethod
            def static(a, b, c, d, e, f, g): ...
        """,
    )
    assert found == [
        "seven takes 7 positional parameters (max 6)",
        "static takes 7 positional parameters (max 6)",
    ]


def test_records_built_by_position(check: ModuleType, tmp_path: Path) -> None:
    found = problems(
        check,
        tmp_path,
        """
        from dataclasses import dataclass, field
        from typing import NamedTuple

        @dataclass
        class Wide:
            a: int; b: int; c: int; d: int; e: int; f: int; g: int

        @dataclass(kw_only=True)
        class Named:
            a: int; b: int; c: int; d: int; e: int; f: int; g: int

        @dataclass(frozen=True)
        class Computed:
            a: int; b: int; c: int; d: int; e: int; f: int
            g: int = field(init=False)

        class Row(NamedTuple):
            a: int; b: int; c: int; d: int; e: int; f: int; g: int
        """,
    )
    assert found == ["Wide has 7 fields built by position (max 6)", "Row has 7 fields built by position (max 6)"]


def test_tuples_unpacked_or_indexed(check: ModuleType, tmp_path: Path) -> None:
    found = problems(
        check,
        tmp_path,
        """
        i, p, key, local, request_id, now_s, dp, res, fp = entry
        for a, b, c, d, e, f in rows: ...
        (a, b, c), (d, e, f) = pair
        x = item[8]
        y = item[-6]
        z = item[4]
        DATA, HEADERS, PRIORITY, RST, SETTINGS, PUSH = range(6)
        OK, REFUSED, USAGE, GONE, AUTH, GATE = 0, 1, 2, 3, 4, 5
        body = responses[503]
        """,
    )
    assert found == [
        "9 values unpacked by position (max 5)",
        "6 values unpacked by position (max 5)",
        "[8] reads a value by position (max 4)",
        "[-6] reads a value by position (max 4)",
    ]
