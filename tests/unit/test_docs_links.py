"""The documentation can be followed from the repository alone.

- Every relative Markdown link points at a file inside the repository that exists, and its
  ``#fragment`` (when the target is a Markdown file) at one of that file's headings.
- A path of this repository named in a code span (```tests/unit/test_rules.py```) exists.
- No code or document refers to a design note or a tracker entry by number: a reader of the
  repository has neither, so a thing is named for itself ("the admin API (docs/api.md#the-admin-api)").
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: directories that are not the project's own text (tools' output, environments, caches)
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "node_modules", "__pycache__", "__snapshots__"}
#: the files whose words are read: code, documents, configuration, scripts
TEXT_SUFFIXES = {".py", ".md", ".lua", ".c", ".toml", ".yaml", ".yml", ".json", ".tcss", ".cfg", ".sh", ".txt"}
#: top-level directories of this repository; a code span starting with one of them is a path here.
#: ``examples/`` is left out: the documents also name the peer project's ``examples/...`` files.
OWN_DIRS = ("tests/", "control_plane/", "limiter/", "dashboard/", "bench/", "docs/", "deploy/", "lua/", ".ci/")

LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
#: "seed" or "issue" followed by a number: references a reader cannot follow
NUMBERED_REFERENCE = re.compile(r"\b(?:seeds?\s+0\d\d|issues?\s+#?\d+)\b", re.I)


def _walk(suffixes: set[str]) -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT).parts
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel[:-1]):
            continue
        if path.suffix in suffixes and path.is_file():
            out.append(path)
    return sorted(out)


def _markdown() -> list[Path]:
    return _walk({".md"})


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(FENCE.sub("", path.read_text(encoding="utf-8"))):
        slug = _slug(m.group(1))
        n = seen.get(slug, -1) + 1
        seen[slug] = n
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _prose(path: Path) -> str:
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def link_problems(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with the relative links of one Markdown file of the tree at ``root``."""
    problems = []
    for m in LINK.finditer(CODE_SPAN.sub("", _prose(path))):
        target = m.group(1)
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue  # https:, mailto:, ...
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.is_relative_to(root):
            problems.append(f"{target}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved):
            problems.append(f"{target}: no heading #{fragment} in {resolved.relative_to(root)}")
    return problems


def test_markdown_links_point_at_files_and_headings_in_the_repository() -> None:
    problems = {str(p.relative_to(ROOT)): link_problems(p) for p in _markdown()}
    assert {k: v for k, v in problems.items() if v} == {}


def test_paths_named_in_code_spans_exist() -> None:
    missing = []
    for path in _markdown():
        for m in CODE_SPAN.finditer(_prose(path)):
            name = m.group(1).split(":")[0].split("#")[0]
            if name.startswith(OWN_DIRS) and not any(c in name for c in "*<{ ") and not (ROOT / name).exists():
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert missing == []


def test_no_numbered_seed_or_issue_references() -> None:
    found = []
    for path in _walk(TEXT_SUFFIXES):
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if NUMBERED_REFERENCE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert found == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """A link outside the tree, to a missing file and to a missing heading are each reported; a
    link to a real file and heading is not; the wording check tells a reference from a word."""
    docs = tmp_path / "repo" / "docs"
    docs.mkdir(parents=True)
    (docs / "api.md").write_text("# API\n\n## The admin API\n\n```\n# not a heading\n```\n")
    (tmp_path / "elsewhere.md").write_text("# Elsewhere\n")
    probe = docs / "probe.md"
    probe.write_text(
        "[a](../../elsewhere.md) [b](api.md#no-such-heading) [c](nope.md) [d](api.md#the-admin-api)\n"
        "[e](api.md#not-a-heading) `[f](nope.md)` [g](https://example.com/x.md)\n"
    )
    problems = link_problems(probe, root=tmp_path / "repo")
    assert [p.split(":")[0] for p in problems] == [
        "../../elsewhere.md",
        "api.md#no-such-heading",
        "nope.md",
        "api.md#not-a-heading",
    ]
    assert NUMBERED_REFERENCE.search("see " + "seed" + " 002's admin API")
    assert NUMBERED_REFERENCE.search("Issue" + " 23's criteria")
    assert not NUMBERED_REFERENCE.search("several seeds: h1:p1,h2:p2; random.Random(seed=12); the issue is")
