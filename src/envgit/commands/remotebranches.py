"""Branches on a remote (docs/FORMAT.md, "Head"; docs/ARCHITECTURE.md, "Branches").

A fork branch is a project of its own (its own store and journal), so it is pushed as one,
under its parent's remote name and its id, `<parent>.envgit-<id>`, never under a name another
project could have (an `ENVGIT_PROJECT` set for the parent names its branches too), and its
head says whose branch it is: {"parent", "id", "from_step", "from_tree"}. `envgit push` in a
project pushes its fork branches after it; `log --remote` lists a project's branches on the
remote: its fork branches, from their heads, and its rewound branches, from its journal, as
`envgit branches` derives them locally."""

from ..branch import registry
from ..branch.rewound import rewound

SUFFIX = ".envgit-"


def identity(root: str) -> tuple[str, dict | None]:
    """(the project's name on remotes, its head's `branch` or None). A branch record that
    cannot be read is an error (registry.BadRecord): pushing it under a guessed name could
    write into another project's place."""
    from ..paths import Project
    from ..remote import layout
    rec = registry.parent_of(Project(root))
    if rec is None:
        return layout.project_name(root), None
    parent = layout.project_name(rec["parent"])
    tail = f"{SUFFIX}{int(rec['id'])}"
    branch = {"parent": parent, "id": int(rec["id"]), "from_step": int(rec["from_step"]),
              "from_tree": str(rec["from_tree"])}
    return parent[:64 - len(tail)] + tail, branch


def fork_roots(project) -> list[tuple[int, str]]:
    """(id, directory) of this project's fork branches whose directory is there and names this
    project as its parent (a directory that does not is not pushed as its branch)."""
    import os

    from ..paths import Project
    out = []
    here = os.path.realpath(project.root)
    for rec in registry.forks(project):
        d = rec.get("dir")
        if not isinstance(d, str) or not os.path.isdir(os.path.join(d, ".envgit")):
            continue
        try:
            parent = registry.parent_of(Project(d))
        except (registry.BadRecord, OSError):
            continue
        if parent and parent.get("parent") == here and parent.get("id") == rec.get("id"):
            out.append((rec["id"], d))
    return out


def on_remote(bucket, sealer, project: str, machine: str) -> list[dict]:
    """The fork branches of `project` that `machine` pushed: each head under `machine` whose
    `branch.parent` is `project`, as {"id", "project", "from_step", "from_tree", "step"}."""
    from ..remote.push import read_head
    from ..remote.read import machines
    cands = [(p, m) for p, m in machines(bucket) if m == machine and p != project and SUFFIX in p]

    def head(pm):
        try:
            return read_head(bucket, sealer, *pm)
        except Exception:       # a head that does not open is fsck's to name, not a branch
            return None
    out = []
    for (p, _), h in zip(cands, bucket.map(head, cands), strict=True):
        b = (h or {}).get("branch")
        if isinstance(b, dict) and b.get("parent") == project:
            out.append({"id": b["id"], "project": p, "from_step": b["from_step"],
                        "from_tree": b["from_tree"], "step": h["step"]})
    return sorted(out, key=lambda b: b["id"])


def listed(forks: list[dict], steps) -> list[dict]:
    """Every branch `log --remote` shows: the fork branches found on the remote, then the
    rewound branches of the steps read from it."""
    out = [{"kind": "fork", **b} for b in forks]
    for r in rewound(steps):
        out.append({"kind": "rewound", "id": r["id"], "rewind_step": r["rewind_step"],
                    "steps": r["steps"], "tree": r["tree"]})
    return out


def line(b: dict) -> str:
    if b["kind"] == "fork":
        return (f"branch {b['id']}: {b['project']} (fork of step {b['from_step']}; its steps "
                f"up to {b['step']} pushed)")
    first, last = b["steps"]
    return f"branch {b['id']}: steps {first}-{last}, stepped over by the rewind at step {b['rewind_step']}"
