"""control_plane's imports point one way: no module imports one that imports it
back, lazy imports inside functions included, and no room (a top-level subpackage, or a
module of the top level) imports a room that imports it back.

An import is any ``import``/``from ... import`` the interpreter can run, at any depth of the
module; only ``if TYPE_CHECKING:`` blocks are left out (they never run: they say what a
signature means, not what the module needs). ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg`` (its ``__init__``).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = "control_plane"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / PKG).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _owner(name: str) -> str | None:
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in MODULES else None


def imports_of(name: str) -> set[str]:
    """The control_plane modules ``name`` imports at run time."""
    path = MODULES[name]
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module != PKG and not module.startswith(PKG + "."):
                continue
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name == PKG or a.name.startswith(PKG + ".")]
        for t in targets:
            owner = _owner(t)
            if owner is not None and owner != name:
                out.add(owner)
    return out


GRAPH = {name: imports_of(name) for name in MODULES}


def room_of(name: str) -> str | None:
    """The room of a module: ``control_plane.<room>[...]``; the package itself has none."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def room_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    rooms: dict[str, set[str]] = defaultdict(set)
    why: dict[tuple[str, str], list[str]] = defaultdict(list)
    for a, targets in GRAPH.items():
        ra = room_of(a)
        for b in targets:
            rb = room_of(b)
            if ra is None or rb is None or ra == rb:
                continue
            rooms[ra].add(rb)
            why[(ra, rb)].append(f"{a} -> {b}")
    return rooms, why


def test_the_checker_sees_lazy_imports_and_skips_type_checking_blocks(tmp_path: Path) -> None:
    code = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import X\n"
        "def f():\n    from .c import Y\n    return Y\n"
    )
    nodes = _runtime_nodes(ast.parse(code))
    found = {n.module for n in nodes if isinstance(n, ast.ImportFrom)}
    assert found == {"typing", "c"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back() -> None:
    found = cycles(GRAPH)
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_no_room_imports_a_room_that_imports_it_back() -> None:
    rooms, why = room_graph()
    found = cycles(rooms)
    details = []
    for comp in found:
        for a in comp:
            for b in comp:
                if b in rooms.get(a, ()):
                    details.append(f"{a} -> {b}: {', '.join(why[(a, b)][:4])}")
    assert not found, "\n".join(details)


@pytest.mark.parametrize("room", sorted({r for r in map(room_of, MODULES) if r and (ROOT / PKG / r).is_dir()}))
def test_every_room_says_what_it_owns(room: str) -> None:
    """A subpackage's ``__init__`` has a docstring and an ``__all__``."""
    tree = ast.parse((ROOT / PKG / room / "__init__.py").read_text())
    assert ast.get_docstring(tree), f"control_plane/{room}/__init__.py has no docstring"
    names = [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
    assert "__all__" in names, f"control_plane/{room}/__init__.py has no __all__"


def test_the_top_level_reads_like_a_table_of_contents() -> None:
    top = sorted(p.name for p in (ROOT / PKG).glob("*.py"))
    assert len(top) <= 12, top
