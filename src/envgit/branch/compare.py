"""`envgit compare`: branches side by side, from what their journals and stores hold.

A side is the main tree (`main`), a fork branch (its id: its own project directory, journal
and store, registry.py) or a rewound branch (`r<R>`: the steps rewind R stepped over, in the
main journal, rewound.py). Each side has a fork point (a tree), a tree now (its newest
snapshot) and the steps between; what is compared:
- per side: its steps, how many failed, the requests its steps made (denied, asked), its
  marks, its files changed since the fork point;
- across sides: every path some side changed, with a letter per distinct content, so two
  branches that wrote the same file the same way show the same letter.

Content is compared by content id (the store's hash of a file's bytes), never by reading
files: a side's tree is read from its own store (a fork's store holds the fork point too: its
packs are the main store's, linked at the fork).
"""

import os
from dataclasses import dataclass, field

from ..paths import Project

# Marks worth a column: what a person weighs when choosing a branch (docs/FORMAT.md).
NOTABLE_MARKS = ("escape-route-written", "escape-route-taken-back", "denied-net", "irreversible",
                 "asked", "policy-file-written", "setuid-stripped", "interrupted-by-agent")


class CompareError(Exception):
    """A side that cannot be compared, worded for the person."""


@dataclass
class Side:
    name: str                        # "main", "1", "r12"
    kind: str                        # main | fork | rewound
    root: str | None                 # its working tree (None: a rewound branch has none)
    store_path: str
    from_step: int | None
    from_tree: str | None
    tree: str | None = None
    steps: list = field(default_factory=list)     # journal Steps, in order
    changes: list = field(default_factory=list)   # snapshot Changes from the fork point

    def summary(self) -> dict:
        ran = [s for s in self.steps if s.argv]
        requests = [r for s in ran for r in s.requests]
        marks: dict[str, int] = {}
        for s in ran:
            for m in s.marks:
                if m in NOTABLE_MARKS:
                    marks[m] = marks.get(m, 0) + 1
        return {"name": self.name, "kind": self.kind, "dir": self.root, "from_step": self.from_step,
                "from_tree": self.from_tree, "tree": self.tree,
                "steps": len(ran), "failed": sum(1 for s in ran if s.exit_code not in (0, None)),
                "commands": [{"step": s.id, "argv": s.argv, "exit_code": s.exit_code} for s in ran],
                "requests": len(requests),
                "denied": sum(1 for r in requests if r.get("decision") == "deny"),
                "asked": sum(len(s.approvals) for s in ran),
                "marks": marks, "files_changed": len([c for c in self.changes if c.new_type != "dir"])}


def file_matrix(sides: list[Side]) -> list[dict]:
    """Every path a side changed since its fork point: per side, its status letter (A, M, D, T
    or "" when unchanged) and a content letter shared by sides whose content is the same."""
    by_side = [{c.path: c for c in s.changes if (c.new_type or c.old_type) != "dir"} for s in sides]
    paths = sorted(set().union(*by_side)) if by_side else []
    rows = []
    for path in paths:
        letters: dict[str, str] = {}
        cells = []
        for changes in by_side:
            c = changes.get(path)
            if c is None:
                cells.append({"status": "", "content": ""})
                continue
            key = "deleted" if c.status == "deleted" else f"{c.new_type}:{c.new_id or c.new_target!r}"
            if key not in letters:
                letters[key] = "-" if c.status == "deleted" else "abcdefghijklmnopqrstuvwxyz"[len(letters) % 26]
            cells.append({"status": {"added": "A", "modified": "M", "deleted": "D"}.get(c.status, "T"),
                          "content": letters[key]})
        # the path as the journal shows it: undecodable bytes as \xNN
        rows.append({"path": path.decode("utf-8", "backslashreplace"), "sides": cells,
                     "same": len({(x["status"] != "", x["content"]) for x in cells}) == 1})
    return rows


def load_sides(project, ids) -> list[Side]:
    """The Side of each id, its changes since its fork point read from its own store (journals
    read as they are: the caller repairs one a killed daemon left, commands/compare.py)."""
    from ..snapshot import Store
    from ..steporder import newest_tree
    from . import registry
    j = _journal(project)
    steps = j.steps() if j else []
    by_id = {s.id: s for s in steps}
    forks = {str(r["id"]): r for r in registry.forks(project)}
    rewound = _rewound(project, steps)
    sides: list = []
    for name in ids:
        if name == "main":
            sides.append(None)             # once the others' fork point is known
        elif name in forks:
            rec = forks[name]
            if not os.path.isdir(rec["dir"]):
                raise CompareError(f"branch {name}: its directory {rec['dir']} is gone; "
                                   f"`envgit branch rm {name}` drops the record")
            bj = _journal(Project(rec["dir"]))        # None: no step has run there yet
            newest = newest_tree(bj) if bj is not None else None
            sides.append(Side(name, "fork", rec["dir"], Project(rec["dir"]).state_path("objects"),
                              rec["from_step"], rec["from_tree"], newest.tree if newest else rec["from_tree"],
                              [s for s in bj.steps() if s.argv] if bj is not None else []))
        elif name in rewound:
            b = rewound[name]
            first, last = b["steps"]
            rw = by_id.get(b["rewind_step"])
            target = (rw.rewind or {}).get("target_tree") if rw else None
            sides.append(Side(name, "rewound", None, project.state_path("objects"), first - 1, target,
                              b["tree"], [by_id[i] for i in range(first, last + 1) if i in by_id]))
        else:
            raise CompareError(f"{name!r} is not a branch: `envgit branches` lists them (`main` is this tree)")
    if None in sides:
        points = [s.from_step for s in sides if s is not None and s.from_step is not None]
        at = min(points) if points else None
        from_tree = by_id[at].snapshot.get("tree") if at in by_id and by_id[at].snapshot else None
        newest = newest_tree(j) if j else None
        main = Side("main", "main", project.root, project.state_path("objects"), at, from_tree,
                    newest.tree if newest else None,
                    [s for s in steps if s.argv and (at is None or s.id > at)])
        sides = [main if s is None else s for s in sides]
    for side in sides:
        try:
            store = Store(side.store_path)
            side.changes = store.diff(side.from_tree, side.tree) if side.tree else []
        except Exception as e:              # a damaged or missing store: said, not a traceback
            raise CompareError(f"branch {side.name}: its snapshots cannot be read ({type(e).__name__}: "
                               f"{e}); `envgit fsck` in {side.root or project.root} says what is wrong") from None
    return sides


def branch_list(project) -> list[dict]:
    """`main`, then every fork branch and rewound branch not removed: {"id", "kind", "from_step"}."""
    from . import registry
    j = _journal(project)
    steps = j.steps() if j else []
    out = [{"id": "main", "kind": "main", "from_step": None}]
    out += [{"id": str(r["id"]), "kind": "fork", "from_step": r["from_step"]} for r in registry.forks(project)]
    out += [{"id": b["id"], "kind": "rewound", "from_step": b["to_step"]} for b in _rewound(project, steps).values()]
    return out


def _journal(project):
    from ..journal import Journal
    try:
        return Journal(project.journal, readonly=True)
    except FileNotFoundError:
        return None


def _rewound(project, steps) -> dict:
    from . import rewound
    gone = rewound.removed(project)
    return {b["id"]: b for b in rewound.rewound(steps) if b["rewind_step"] not in gone}
