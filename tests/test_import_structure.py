"""envgit's import graph, drawn from the source with `ast` (every `import` and `from` naming an
envgit module, those inside functions and under TYPE_CHECKING too, relative ones resolved):
the parts (a subpackage of src/envgit/ or a top-level module) stack in floors with no circle,
no part has a circle between its own modules, only cli.py and commands/ import commands/, and
no module is over 600 lines. Pure: the files are read, nothing is imported.

`python tests/test_import_structure.py` prints the floors (each part's longest path down to a
part importing no other) and any circle."""

import ast
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PKG = SRC / "envgit"
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module under src/envgit, by dotted name (a package by its own name, for __init__)."""
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _target(name: str, mods) -> str | None:
    """The module `name` runs, or, for a name inside one (`envgit.journal.Journal`), that
    module: the longest dotted prefix that is a module."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(source: str, name: str, is_package: bool, mods) -> list[tuple[str, int]]:
    """(imported module, line) for each envgit module the source of module `name` imports,
    anywhere in it (in a function, under TYPE_CHECKING), relative imports resolved: `from . import
    x` is the submodule x when there is one, else the package's __init__ (a name defined there)."""
    package = name if is_package else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [_target(a.name, mods) for a in node.names if a.name.split(".")[0] == "envgit"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source_mod = ".".join(base + ([node.module] if node.module else []))
            else:
                source_mod = node.module or ""
            if source_mod.split(".")[0] != "envgit":
                continue
            targets = [f"{source_mod}.{a.name}" if f"{source_mod}.{a.name}" in mods
                       else _target(source_mod, mods) for a in node.names]
        out += [(t, node.lineno) for t in targets if t and t != name]
    return out


@cache
def module_edges() -> dict[tuple[str, str], int]:
    """(importer, imported) -> the line of its first import; envgit modules only."""
    mods = modules()
    edges: dict[tuple[str, str], int] = {}
    for name, path in mods.items():
        for target, line in imports_of(path.read_text(), name, path.name == "__init__.py", mods):
            edges.setdefault((name, target), line)
    return edges


def part_of(module: str) -> str:
    """The part a module belongs to: `daemon/` for envgit.daemon.*, `paths.py` for envgit.paths,
    `__init__.py` for envgit itself."""
    rest = module.split(".")[1:]
    if not rest:
        return "__init__.py"
    return f"{rest[0]}/" if (PKG / rest[0]).is_dir() else f"{rest[0]}.py"


def _file(module: str) -> str:
    return str(modules()[module].relative_to(PKG))


def part_edges() -> dict[tuple[str, str], list[str]]:
    """(importing part, imported part) -> the imports making it, as `file:line -> file`."""
    out: dict[tuple[str, str], list[str]] = {}
    for (a, b), line in sorted(module_edges().items()):
        pa, pb = part_of(a), part_of(b)
        if pa != pb:
            out.setdefault((pa, pb), []).append(f"{_file(a)}:{line} -> {_file(b)}")
    return out


def circles(edges) -> list[list[str]]:
    """The strongly connected sets of more than one node (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def _said(group: list[str], edges: dict, say) -> str:
    """The edges inside one circle, one a line."""
    members = set(group)
    lines = [say(a, b, where) for (a, b), where in sorted(edges.items())
             if a in members and b in members]
    return "\n  ".join(lines)


def floors() -> dict[str, int]:
    """Each part's floor: 0 for a part importing no other, else one above the highest part it
    imports (the longest path down to a leaf). Only meaningful with no circle between parts."""
    below: dict[str, set[str]] = {part_of(m): set() for m in modules()}
    for a, b in part_edges():
        below[a].add(b)
    floor: dict[str, int] = {}

    def of(p: str, seen: frozenset = frozenset()) -> int:
        if p not in floor:
            if p in seen:
                return 0            # a circle, reported by test_parts_have_no_circle
            floor[p] = 1 + max((of(q, seen | {p}) for q in below[p]), default=-1)
        return floor[p]

    for p in below:
        of(p)
    return dict(sorted(floor.items(), key=lambda kv: (kv[1], kv[0])))


def floors_table() -> str:
    by_floor: dict[int, list[str]] = {}
    for part, n in floors().items():
        by_floor.setdefault(n, []).append(part)
    return "\n".join(f"{n:2}  {' '.join(parts)}" for n, parts in sorted(by_floor.items(), reverse=True))


def test_imports_are_found_in_functions_and_resolved_when_relative():
    mods = {"envgit", "envgit.paths", "envgit.journal", "envgit.journal.log", "envgit.journal.head",
            "envgit.daemon", "envgit.daemon.server"}
    source = (
        "import os\n"
        "from ..journal import Journal\n"             # a name in the package: its __init__
        "from ..journal.log import Journal\n"
        "def later():\n"
        "    from .. import paths\n"                  # a module, inside a function
        "    import envgit.journal.head\n"
        "    from . import server\n"                  # itself: no edge
        "if False:\n"
        "    from envgit.daemon import nothing_here\n"  # a name in the package
    )
    found = sorted(imports_of(source, "envgit.daemon.server", False, mods), key=lambda t: t[1])
    assert found == [("envgit.journal", 2), ("envgit.journal.log", 3), ("envgit.paths", 5),
                     ("envgit.journal.head", 6), ("envgit.daemon", 9)]
    # a package's own `from . import x` resolves inside it
    assert imports_of("from . import head\nfrom .log import Journal\n", "envgit.journal", True, mods) == \
        [("envgit.journal.head", 1), ("envgit.journal.log", 2)]
    assert len(modules()) > 100 and len(module_edges()) > 300


def test_parts_have_no_circle():
    edges = part_edges()
    found = circles(edges)
    said = [f"{' '.join(g)}:\n  " + _said(g, edges, lambda a, b, w: f"{a} -> {b}  ({'; '.join(w)})")
            for g in found]
    assert not found, "circles between parts (each import below must run down a floor):\n" + "\n".join(said)


def test_no_circle_inside_a_part():
    edges = {(a, b): line for (a, b), line in module_edges().items() if part_of(a) == part_of(b)}
    found = circles(edges)
    said = [f"{' '.join(_file(m) for m in g)}:\n  "
            + _said(g, edges, lambda a, b, line: f"{_file(a)}:{line} -> {_file(b)}") for g in found]
    assert not found, "circles between the modules of a part:\n" + "\n".join(said)


def test_only_the_cli_imports_commands():
    wrong = [f"{_file(a)}:{line} -> {_file(b)}" for (a, b), line in sorted(module_edges().items())
             if part_of(b) == "commands/" and part_of(a) not in ("commands/", "cli.py")]
    assert not wrong, "commands/ is the top floor, imported by cli.py only:\n  " + "\n  ".join(wrong)


def test_no_module_over_600_lines():
    sizes = {_file(m): len(p.read_text().splitlines()) for m, p in modules().items()}
    over = sorted((n, f) for f, n in sizes.items() if n > MAX_LINES)
    assert not over, f"modules over {MAX_LINES} lines:\n  " + "\n  ".join(f"{f}: {n}" for n, f in over)


if __name__ == "__main__":
    print("floor  parts (each imports only parts on lower floors)")
    print(floors_table())
    for name, edges in (("parts", part_edges()),
                        ("inside a part", {k: [f"{_file(k[0])}:{v} -> {_file(k[1])}"]
                                           for k, v in module_edges().items() if part_of(k[0]) == part_of(k[1])})):
        for g in circles(edges):
            print(f"circle ({name}): {' '.join(g)}\n  " + _said(g, edges, lambda a, b, w: "; ".join(w)))
