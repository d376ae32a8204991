"""Comparing two trees, path by path. Identical subtrees (same id) are skipped without reading."""

from dataclasses import dataclass

from .encoding import DIR, SYMLINK, TREE_MAGIC, TYPE_NAMES, Entry, decode_tree
from .ids import TREE

_BIG_TREE = 64 << 10     # trees this large (bytes) are remembered once decoded


@dataclass(frozen=True)
class Change:
    path: bytes
    status: str                  # "added" | "modified" | "deleted" | "type-changed"
    old_size: int | None
    new_size: int | None
    old_id: str | None           # content id (hex) of files and directories; None for symlinks
    new_id: str | None
    old_type: str | None = None  # "file" | "exec" | "symlink" | "dir"
    new_type: str | None = None
    old_target: bytes | None = None   # symlink targets
    new_target: bytes | None = None
    old_mode: int | None = None       # permission bits
    new_mode: int | None = None


def diff_trees(objects, old_id: bytes | None, new_id: bytes | None) -> list[Change]:
    """Every path that differs. A directory present on one side only is listed itself, then
    everything in it; a directory on both sides is listed only if its mode changed."""
    return [_change(path, status, a, b) for path, status, a, b in walk_changes(objects, old_id, new_id)]


def walk_changes(objects, old_id: bytes | None, new_id: bytes | None) -> list[tuple]:
    """[(path, status, old Entry or None, new Entry or None)] in path order. Depth-first with
    an explicit stack, not recursion: a step chooses how deep the trees are."""
    out: list[tuple] = []
    if old_id == new_id:
        return out
    old, new = _sides(objects, old_id, new_id)
    stack = [(b"", old, new, iter(sorted(old.keys() | new.keys())))]
    while stack:
        prefix, old, new, names = stack[-1]
        name = next(names, None)
        if name is None:
            stack.pop()
            continue
        a, b = old.get(name), new.get(name)
        path = prefix + name
        if a is not None and b is not None and _same(a, b):
            continue
        a_dir = a is not None and a.type == DIR
        b_dir = b is not None and b.type == DIR
        if a is None or b is None:
            out.append((path, "added" if a is None else "deleted", a, b))
        elif a_dir and b_dir:
            if a.mode != b.mode:
                out.append((path, "modified", a, b))
        elif a_dir != b_dir or (a.type == SYMLINK) != (b.type == SYMLINK):
            out.append((path, "type-changed", a, b))
        else:
            out.append((path, "modified", a, b))
        sub_old = a.oid if a is not None and a_dir else None
        sub_new = b.oid if b is not None and b_dir else None
        if sub_old != sub_new:
            o, n = _sides(objects, sub_old, sub_new)
            stack.append((path + b"/", o, n, iter(sorted(o.keys() | n.keys()))))
    return out


def read_tree(objects, tree_id: bytes) -> list[Entry]:
    data = objects.get(tree_id, TREE)
    if len(data) < _BIG_TREE:
        return decode_tree(data)
    parts: list[bytes] = []
    entries = decode_tree(data, parts)
    objects.remember_tree(tree_id, parts)
    return entries


def _sides(objects, old_id, new_id) -> tuple[dict, dict]:
    """name -> Entry on each side; for two remembered big trees, only the entries that differ
    (identical entries are skipped by the caller anyway)."""
    if old_id and new_id:
        a, b = objects.tree_entry_set(old_id), objects.tree_entry_set(new_id)
        if a is None and b is not None:
            read_tree(objects, old_id)
            a = objects.tree_entry_set(old_id)
        elif b is None and a is not None:
            read_tree(objects, new_id)
            b = objects.tree_entry_set(new_id)
        if a is not None and b is not None:
            return _decode_parts(a - b), _decode_parts(b - a)
    old = {e.name: e for e in read_tree(objects, old_id)} if old_id else {}
    new = {e.name: e for e in read_tree(objects, new_id)} if new_id else {}
    return old, new


def _decode_parts(parts) -> dict:
    return {e.name: e for part in parts for e in decode_tree(TREE_MAGIC + part)}


def _same(a: Entry, b: Entry) -> bool:
    return (a.type, a.mode, a.oid, a.target) == (b.type, b.mode, b.oid, b.target)


def _change(path: bytes, status: str, a: Entry | None, b: Entry | None) -> Change:
    return Change(
        path, status,
        a.size if a else None, b.size if b else None,
        a.oid.hex() if a and a.oid else None, b.oid.hex() if b and b.oid else None,
        TYPE_NAMES[a.type] if a else None, TYPE_NAMES[b.type] if b else None,
        a.target if a else None, b.target if b else None,
        a.mode if a else None, b.mode if b else None,
    )
