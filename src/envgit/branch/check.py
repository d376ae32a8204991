"""What `envgit fsck` checks of a project's branches (docs/ARCHITECTURE.md, "Branches"): each
fork record names a directory that is that branch (its `.envgit/branch.json` names this project
and id), no fork was left half-made, and every step of a rewound branch not removed still has
its snapshot (gc keeps them until `envgit branch rm`). One line per problem, with the fix."""

import os

from . import registry, rewound


def problems(project, steps, live_trees) -> list[str]:
    """`steps`: the journal's steps; `live_trees`: the trees the journal still keeps."""
    out: list[str] = []
    root = os.path.realpath(project.root)
    try:
        forks = registry.forks(project)
    except registry.BadRecord as e:
        return [f"branches: {e}; fix or remove that file (`envgit branches` reads them)"]
    for rec in forks:
        bid, d = rec["id"], rec["dir"]
        try:
            parent = registry.parent_of(d)
        except (registry.BadRecord, OSError) as e:
            parent, why = None, str(e)
        else:
            why = "it has no .envgit/branch.json"
        if not os.path.isdir(d):
            out.append(f"branch {bid}: its directory {d} is gone; `envgit branch rm {bid}` drops the record")
        elif parent is None:
            out.append(f"branch {bid}: {d} is not a branch ({why}); `envgit branch rm {bid}` drops the record")
        elif os.path.realpath(parent.get("parent", "")) != root or parent.get("id") != bid:
            out.append(f"branch {bid}: {d}/.envgit/branch.json names another project or id "
                       f"({parent.get('parent')}, {parent.get('id')}); `envgit branch rm {bid}` drops the record")
    d = registry.branches_dir(project)
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else ():
        if name.endswith(".forking"):
            out.append(f"branches: {name}: a fork was interrupted; `envgit branches` finishes or removes it")
    kept = set(live_trees)
    by_id = {s.id: s for s in steps}
    gone = rewound.removed(project)
    for b in rewound.rewound(steps):
        if b["rewind_step"] in gone:
            continue
        first, last = b["steps"]
        lost = [i for i in range(first, last + 1) if i in by_id and (by_id[i].snapshot or {}).get("tree")
                and by_id[i].snapshot["tree"] not in kept]
        if lost:
            which = (f"step {lost[0]} is" if len(lost) == 1 else
                     f"steps {', '.join(map(str, lost[:10]))}{' …' if len(lost) > 10 else ''} are")
            out.append(f"branch {b['id']}: the snapshot of {which} no longer kept (gc keeps a branch's "
                       "steps until `envgit branch rm`)")
    return out
