"""Which snapshot trees a journal still refers to: the one rule gc (daemon/gcop.py), fsck
(commands/fsck.py) and a remote's fsck (remote/read.py) keep objects by."""

from .rows import read_body


def dropped_by_gc(gc_bodies) -> set[int]:
    """Steps whose snapshot `envgit gc` dropped, from the text of the project's `gc` entries
    (step 0)."""
    out: set[int] = set()
    for text in gc_bodies:
        body, _ = read_body("gc", text)
        out.update((body or {}).get("dropped", []))
    return out


def live_trees(steps, gone) -> list[str]:
    """Every snapshot tree the steps refer to (a step's snapshot, the baseline, rewind undo
    points), leaving out the steps in `gone`; in step order, each once."""
    out = []
    for s in steps:
        if s.id in gone:
            continue
        for t in ((s.snapshot or {}).get("tree"), (s.baseline or {}).get("tree"),
                  (s.rewind or {}).get("undo_tree")):
            if t and t not in out:
                out.append(t)
    return out
