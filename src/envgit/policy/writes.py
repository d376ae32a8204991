"""`filesystem.allow_write` entries a policy may not have: one that makes `/`, a system
directory (/usr, /etc, …) or the home directory (or a directory above it) writable would
break every step, or hand every step the whole machine or the person's whole home: refused
at load and by `envgit policy check`, each at its line with the fix. Entries are resolved as
decide.resolve does (`~` against the home, a relative one against the project)."""

import os

from .schema import PolicyError, where_line


def resolved_writes(data: dict, home: str, project_root: str):
    """(absolute target, entry, where key) of each allow_write entry, its symlinks followed
    too (both are yielded when they differ)."""
    for i, entry in enumerate((data.get("filesystem") or {}).get("allow_write") or []):
        if not isinstance(entry, str):
            continue                    # one that did not validate (policy check reads on)
        if entry == "~" or entry.startswith("~/"):
            target = home + entry[1:]
        elif entry.startswith("/"):
            target = entry
        else:
            target = os.path.join(project_root, entry)
        target = os.path.normpath(target)
        for t in dict.fromkeys((target, os.path.realpath(target))):
            yield t, entry, f"filesystem.allow_write[{i}]"


def column_of(path: str, line: int, text: str) -> int:
    """The column, from 1, where `text` is written on `line` of the file at `path` (1 when the
    file cannot be read again or the text is not there as written): validate's provenance keeps
    lines only."""
    try:
        with open(path, encoding="utf-8") as f:
            for n, ln in enumerate(f, 1):
                if n == line:           # after a key on the line ("allow_write: [...]")
                    i = ln.find(text, ln.find(": ") + 1)
                    if i > 0 and ln[i - 1] in "\"'":
                        i -= 1          # where YAML puts a quoted value: at its quote
                    return i + 1 if i >= 0 else 1
    except (OSError, ValueError):
        pass
    return 1


def breaking(data: dict, where: dict, home: str, project_root: str) -> list[PolicyError]:
    """Every allow_write entry that would make `/`, a system directory or the home directory
    (or one above it) writable to every step, as a PolicyError at its line."""
    from .decide import SYSTEM_DIRS
    home = os.path.normpath(home) if home else ""
    out: list[PolicyError] = []
    seen: set[str] = set()
    root = os.path.normpath(project_root)
    for t, entry, key in resolved_writes(data, home, project_root):
        if key in seen or t == root:    # the project itself is writable whatever it is
            continue
        what = None
        if t == "/":
            what = "/ (the whole machine)"
        elif t.count("/") == 1 and t[1:] in SYSTEM_DIRS:
            what = f"{t} (a system directory every program runs from)"
        elif home not in ("", "/") and (home == t or home.startswith(t.rstrip("/") + "/")):
            what = f"{t} (your home directory)" if home == t else f"{t} (it holds your home directory)"
        if what is None:
            continue
        seen.add(key)
        f, n = where_line(where.get(key, ""))
        shown = "" if entry == t else f" ({entry!r})"
        out.append(PolicyError(f, n, column_of(f, n, entry), f"filesystem.allow_write makes {what} writable to every "
                               f"step{shown}: that breaks every step, or hands it everything there; "
                               "remove it and name only the directories a step needs to write "
                               "(the project is writable already)"))
    return out
