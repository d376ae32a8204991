"""What `restore` and `restore --from` (remote.py) share: where a tree may be written
(restore_target) and what writing it there takes (plan)."""

import os
import stat
from typing import cast

from ..inert import inert
from . import Usage


def restore_target(project, text: str, force: bool) -> str:
    """The target directory, absolute; refused inside the project (or holding it), or not
    empty without --force."""
    target = os.path.abspath(text)
    real, root = os.path.realpath(target), os.path.realpath(project.root)
    # Both as written and as resolved: a path through the project is refused even when it
    # resolves outside, since a step chose what its symlinks name (`out -> ~/.config/…`).
    if any(t == r or t.startswith(r.rstrip("/") + "/")
           for t in (target, real) for r in (os.path.abspath(project.root), root)):
        raise Usage(f"{text}: inside the project; restore writes elsewhere (`envgit rewind` brings "
                    "the project itself back)")
    if root.startswith(real.rstrip("/") + "/"):
        raise Usage(f"{text}: holds the project; pick a directory outside it")
    if os.path.lexists(target):
        if not os.path.isdir(target):
            raise Usage(f"{text}: not a directory")
        if os.listdir(target) and not force:
            raise Usage(f"{text}: not empty; pick a new or empty directory, or --force to write into it")
    return real


def plan(store, tree: str, target: str, paths: list[bytes], force: bool, n: int):
    """A RestorePlan that writes the tree (or PATHs of it) into `target`: parents first. With
    --force, what is in the way is replaced (a file or symlink where a directory goes is
    removed first; a directory where a file goes is refused)."""
    from ..snapshot import Item, RestorePlan
    from ..snapshot.diff import read_tree
    from ..snapshot.encoding import DIR, TYPE_NAMES
    objects = store.objects
    plan = RestorePlan(tree)
    found = set()

    def wanted(p):
        return not paths or any(p == w or p.startswith(w + b"/") or w.startswith(p + b"/") for w in paths)

    # Parents first, with an explicit stack (a step chooses how deep the tree is: no recursion).
    stack = [(b"", iter(read_tree(objects, bytes.fromhex(tree))))]
    while stack:
        prefix, it = stack[-1]
        e = next(it, None)
        if e is None:
            stack.pop()
            continue
        p = prefix + e.name
        if not wanted(p):
            continue
        found.add(p)
        plan.write.append(Item(p, TYPE_NAMES[e.type], e.mode, e.size, e.oid, e.chunked, e.target))
        if e.type == DIR:
            # (decode_tree gives every directory's entry its id: the cast only tells mypy so)
            stack.append((p + b"/", iter(read_tree(objects, cast(bytes, e.oid)))))
    missing = [p for p in paths if p and p not in found]
    if missing:
        raise Usage(f"{os.fsdecode(missing[0])}: not in the snapshot of step {n}; `envgit ls {n}` lists it")
    if force and os.path.isdir(target):
        plan.delete = _in_the_way(target, plan.write)
    return plan


def _in_the_way(target: str, items: list) -> list:
    """What must be removed before writing `items` into the existing `target`, found through
    directory fds opened without following links (a symlink in the target is an entry to
    replace, never a way out of it)."""
    from ..snapshot import Item
    from ..snapshot.restore import DirFds
    absent: set[bytes] = set()
    delete = []
    with DirFds(target) as dirs:     # holds the fds of one path, not one per directory
        for item in items:
            parent, _, name = item.path.rpartition(b"/")
            if parent in absent:
                absent.add(item.path)
                continue
            try:
                st = os.stat(name, dir_fd=dirs.open(parent), follow_symlinks=False)
            except FileNotFoundError:
                absent.add(item.path)
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if item.type == "dir" and not is_dir:
                delete.append(Item(item.path, "file", 0, 0))      # a file or symlink: unlinked
                absent.add(item.path)
            elif item.type != "dir" and is_dir:
                raise Usage(f"{inert(os.path.join(target, os.fsdecode(item.path)))}: a directory where the "
                            "snapshot has a file; move it away first")
    return delete
