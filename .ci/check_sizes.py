"""Room sizes and meaning by name (``[tool.shadowlimit.sizes]`` in pyproject.toml).

Sizes, in ``paths``: no Python module over ``max-module-lines``, no function over
``max-function-lines``.

Names, not positions, in ``shape-paths``: no function takes more than ``max-positional``
positional parameters (``self``/``cls`` not counted; put the rest after ``*``), no dataclass or
NamedTuple with more fields than that is built by position (``kw_only=True``), and no tuple of
more than ``max-tuple`` values is unpacked (``a, b, c, d, e, f = row``) or indexed past it
(``item[8]``): carry such values as a record with named fields. Unpacking ``range(n)`` or a
literal tuple (named constants) is not a record and is left alone; an integer index of 100 or
more is a key (an HTTP status), not a position.

``python .ci/check_sizes.py [FILES...]``; exit 1 listing what is found."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def limits() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["tool"]["shadowlimit"]["sizes"]


def problems(path: Path, max_module: int, max_function: int) -> list[str]:
    text = path.read_text(encoding="utf-8")
    out = []
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    if lines > max_module:
        out.append(f"{path}: {lines} lines (max {max_module})")
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            n = (node.end_lineno or node.lineno) - start + 1
            if n > max_function:
                out.append(f"{path}:{node.lineno}: function {node.name} is {n} lines (max {max_function})")
    return out


def _is_method(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    return isinstance(parents.get(node), ast.ClassDef) and not any(
        isinstance(d, ast.Name) and d.id == "staticmethod" for d in getattr(node, "decorator_list", ())
    )


def _record_fields(node: ast.ClassDef) -> int | None:
    """The fields of a dataclass built by position (None: not one, or keyword-only), or of a NamedTuple."""
    named = any(isinstance(b, ast.Name) and b.id == "NamedTuple" for b in node.bases)
    dataclass = None
    for d in node.decorator_list:
        call = d if isinstance(d, ast.Call) else None
        name = (call.func if call else d).id if isinstance(call.func if call else d, ast.Name) else None
        if name == "dataclass":
            kw_only = call is not None and any(
                k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value for k in call.keywords
            )
            dataclass = not kw_only
    if not named and not dataclass:
        return None
    fields = 0
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            ann = ast.unparse(stmt.annotation)
            if "KW_ONLY" in ann:
                break  # the fields after it are keyword-only
            value = stmt.value
            not_init = (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id == "field"
                and any(
                    k.arg == "init" and isinstance(k.value, ast.Constant) and not k.value.value for k in value.keywords
                )
            )
            if "ClassVar" not in ann and not not_init:
                fields += 1
    return fields


def _literal_constants(node: ast.AST) -> bool:
    """``A, B = range(2)`` or ``A, B = 0, 1``: named constants, not a record taken apart."""
    value = getattr(node, "value", None)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "range":
        return True
    return isinstance(value, ast.Tuple) and all(isinstance(e, ast.Constant) for e in value.elts)


def shape_problems(path: Path, max_positional: int, max_tuple: int) -> list[str]:
    """Meaning by position (see the module docstring)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out = []
    for node in ast.walk(tree):
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = [*node.args.posonlyargs, *node.args.args]
            if args and _is_method(node, parents):
                args = args[1:]
            if len(args) > max_positional:
                name = getattr(node, "name", "lambda")
                out.append(f"{where}: {name} takes {len(args)} positional parameters (max {max_positional})")
        elif isinstance(node, ast.ClassDef):
            n = _record_fields(node)
            if n is not None and n > max_positional:
                out.append(f"{where}: {node.name} has {n} fields built by position (max {max_positional})")
        elif isinstance(node, ast.Assign | ast.For | ast.AsyncFor | ast.comprehension | ast.withitem):
            targets = getattr(node, "targets", None) or [getattr(node, "target", None) or node.optional_vars]
            if _literal_constants(node):
                continue
            for target in targets:
                for t in ast.walk(target) if target is not None else ():
                    if isinstance(t, ast.Tuple | ast.List) and len(t.elts) > max_tuple:
                        out.append(f"{path}:{t.lineno}: {len(t.elts)} values unpacked by position (max {max_tuple})")
        elif isinstance(node, ast.Subscript):
            index = node.slice
            if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub):
                index = index.operand
            if isinstance(index, ast.Constant) and type(index.value) is int and max_tuple <= index.value < 100:
                out.append(f"{where}: [{ast.unparse(node.slice)}] reads a value by position (max {max_tuple - 1})")
    return out


def main(argv: list[str]) -> int:
    cfg = limits()
    files = [Path(a) for a in argv] or [p for d in cfg["paths"] for p in sorted((ROOT / d).rglob("*.py"))]
    found = [msg for f in files for msg in problems(f, cfg["max-module-lines"], cfg["max-function-lines"])]
    shaped = [(ROOT / d).resolve() for d in cfg["shape-paths"]]
    for f in files:
        if f.suffix == ".py" and any(f.resolve().is_relative_to(d) for d in shaped):
            found += shape_problems(f, cfg["max-positional"], cfg["max-tuple"])
    for msg in found:
        print(msg)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
