"""The docs against the repository. docs/ARCHITECTURE.md's "Parts" table: every subpackage of
src/envgit/ has a row, and no row names a folder, module or file that does not exist. Every doc
names only files the repository has (a path from its top: src/…, tests/…, docs/…). Pure and
fast: the docs are read as text, the repository as a directory listing."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "src" / "envgit"


def _rows():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("\n## Parts\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    assert len(rows) >= 10, "the Parts table was not found"
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def _parts(cell: str) -> list[str]:
    """The folders and modules a row's first cell names, relative to src/envgit/."""
    return [name.removeprefix("envgit/") for name in re.findall(r"`([^`]+)`", cell)]


def test_every_subpackage_has_a_row():
    named = {p.rstrip("/") for row in _rows() for p in _parts(row[0])}
    packages = sorted(d.name for d in PKG.iterdir() if (d / "__init__.py").is_file())
    assert len(packages) >= 10
    missing = [p for p in packages if p not in named]
    assert not missing, f"src/envgit/ has no row in docs/ARCHITECTURE.md's Parts table for {missing}"


def test_no_row_names_what_does_not_exist():
    for row in _rows():
        folders = []
        for part in _parts(row[0]):
            path = PKG / part
            assert path.exists() and (part.endswith("/") == path.is_dir()), \
                f"Parts names {part!r}, which is not src/envgit/{part}"
            folders.append(path if path.is_dir() else PKG)
        # the modules a row says it owns ("the seccomp filter (seccomp.py)") are in its folder
        owns = row[1] if len(row) > 1 else ""
        where = [f"src/envgit/{f.relative_to(PKG)}" for f in folders]
        for module in re.findall(r"\b([a-z_][a-z0-9_]*\.(?:py|js))\b", owns):
            assert any((f / module).is_file() for f in folders) or (PKG / module).is_file(), \
                f"Parts row {row[0]} names {module}, which is not in {where}"


def test_the_docs_name_only_files_in_the_repository():
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    top = r"(?:src|tests|docs|dev|bench|shared|\.ci)/"      # not bin/: a venv's bin/python too
    checked = 0
    for doc in docs:
        text = doc.read_text()
        for m in re.finditer(rf"(?<![\w/.~$-])({top}[\w./-]*)", text):
            path = m.group(1).rstrip(".").split("::")[0]
            if any(c in path for c in "*<>"):
                continue                # a pattern, not a file
            checked += 1
            line = text.count("\n", 0, m.start()) + 1
            assert (ROOT / path).exists(), f"{doc.relative_to(ROOT)}:{line} names {path}, not in the repository"
    assert checked >= 20
