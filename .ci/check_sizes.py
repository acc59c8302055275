"""Room sizes: no Python module over ``max-module-lines`` and no function over
``max-function-lines`` in the configured packages (``[tool.shadowlimit.sizes]`` in
pyproject.toml). ``python .ci/check_sizes.py [FILES...]``; exit 1 listing what is too big."""

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


def main(argv: list[str]) -> int:
    cfg = limits()
    files = [Path(a) for a in argv] or [p for d in cfg["paths"] for p in sorted((ROOT / d).rglob("*.py"))]
    found = [msg for f in files for msg in problems(f, cfg["max-module-lines"], cfg["max-function-lines"])]
    for msg in found:
        print(msg)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
