"""What `envgit adopt ID` brings into the main project, found without writing anything but the
main store: a rewound branch's tree (already in the main store), or a fork branch's tree, whose
objects are copied from the branch's store first (the daemon's side: daemon/adopt.py).

A fork branch's store shares the main store's packs by hard links up to the fork point; what
the branch's steps stored since is in packs of its own. Only the objects the tree reaches and
the main store lacks are copied: read (verified) with the branch's ObjectStore, written with
the main's, by the main daemon (one process writes the main store). A kill while copying leaves
whole packs of objects nothing refers to yet: the next gc drops them, the next adopt reuses them.
"""

import os

from .. import faults
from ..paths import STATE_DIR
from ..snapshot.maintenance import mark
from ..snapshot.objects import ObjectStore
from . import registry, rewound

TREE_HEX = 64       # a tree id: 32 bytes of BLAKE3, as hex


class AdoptError(Exception):
    pass


def parse(text: str) -> tuple[str, int]:
    """("rewound", R) for `r<R>`, ("fork", N) for `N`; AdoptError otherwise."""
    r = rewound.parse_id(text)
    if r is not None:
        return "rewound", r
    if text.isdigit() and int(text) > 0:
        return "fork", int(text)
    raise AdoptError(f"{text!r} names no branch: give a fork branch's number or a rewound "
                     "branch's r<STEP> (`envgit branches` lists them)")


def rewound_branch(project, journal, r: int) -> dict:
    """Branch r<R> of the journal, refused when it is not one or was removed."""
    step = journal.step(r)
    found = rewound.rewound([step]) if step is not None else []
    if not found:
        raise AdoptError(f"no branch r{r}: step {r} is not a rewind that stepped over steps "
                         "(`envgit branches` lists the branches)")
    if r in rewound.removed(project):
        raise AdoptError(f"branch r{r} was removed (`envgit branch rm r{r}`); `envgit rewind "
                         f"{found[0]['steps'][1]}` may still bring its last step back until gc drops it")
    b = found[0]
    if b["steps"][1] in journal.dropped_snapshots():
        raise AdoptError(f"the snapshot of step {b['steps'][1]}, branch r{r}'s last, was dropped by gc")
    return {**b, "last_seq": step.last_seq}


def fork_branch(project, n: int) -> dict:
    """Fork branch N's record, refused when there is none or its directory is gone."""
    try:
        rec = registry.fork(project, n)
    except registry.BadRecord as e:
        raise AdoptError(str(e)) from None
    if rec is None:
        raise AdoptError(f"no branch {n}; `envgit branches` lists them")
    if not os.path.isdir(store_path(rec["dir"])):
        raise AdoptError(f"branch {n}'s directory {rec['dir']} holds no envgit store (moved or "
                         f"deleted?); `envgit branch rm {n}` forgets it")
    try:
        parent = registry.parent_of(rec["dir"])
    except registry.BadRecord:
        parent = None
    root = os.path.realpath(getattr(project, "root", project))
    if parent is None or os.path.realpath(parent["parent"]) != root or parent["id"] != n:
        raise AdoptError(f"{rec['dir']} is not branch {n} of this project (its .envgit/branch.json "
                         f"names another, or none); nothing was changed: `envgit branch rm {n}` forgets it")
    return rec


def store_path(branch_dir: str) -> str:
    return os.path.join(branch_dir, STATE_DIR, "objects")


def check_tree_id(tree) -> str:
    if not isinstance(tree, str) or len(tree) != TREE_HEX or any(c not in "0123456789abcdef" for c in tree):
        raise AdoptError(f"{str(tree)[:80]!r} is not a tree id")
    return tree


def copy_tree(branch_dir: str, dst: ObjectStore, tree: str) -> dict:
    """Copy into `dst` every object `tree` reaches that `dst` lacks, from the branch's store;
    the caller holds the lock of `dst`'s writer. Raises StoreError (a missing or damaged
    object in the branch's store: nothing the main tree depends on is written then)."""
    src = ObjectStore(store_path(branch_dir))
    try:
        reached = mark(src, [bytes.fromhex(tree)])      # every tree of it read (verified)
        count = size = 0
        for oid in reached:
            if dst.has(oid):
                continue
            data = src.get(oid)                          # verified against its id
            dst.put(src.index[oid][2], data, oid)
            count, size = count + 1, size + len(data)
            faults.point("adopt-copying")
        dst.flush()
        return {"objects": len(reached), "copied_objects": count, "copied_bytes": size}
    finally:
        src.close()
