"""Bringing a directory back to a tree: plan (what differs), then apply (only that).

Applying goes through directory file descriptors opened with O_NOFOLLOW from the root, so a
symlink in the worktree is never followed out of it. Every object the plan needs is read and
re-hashed before the first change: a corrupted store refuses the whole restore.
"""

import errno
import os
from dataclasses import dataclass, field

from .. import faults
from .diff import walk_changes
from .encoding import DIR, TYPE_NAMES, Entry, decode_chunks
from .ids import BLOB, CHUNKS, CorruptObject
from .objects import MissingObject, StoreError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KEEP_IN_MEMORY = 64 << 20     # verified file contents kept between the check and the write
# Restore never re-creates setuid or setgid bits (files and directories alike): a step could
# otherwise plant a setuid file that a rewind run as root writes back owned by root. The
# snapshot keeps the bits as they were (the tree records st_mode & 0o7777); only restore
# drops them (docs/FORMAT.md, "Tree").
_NEVER_RESTORED = 0o6000


def restored_mode(mode: int) -> int:
    return mode & 0o7777 & ~_NEVER_RESTORED


class RestoreRefused(StoreError):
    """The plan needs objects that are missing or corrupt; nothing was changed."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("restore refused, nothing was changed: " + "; ".join(problems[:5])
                         + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""))


@dataclass(frozen=True)
class Item:
    path: bytes
    type: str               # "file" | "exec" | "symlink" | "dir"
    mode: int
    size: int
    oid: bytes | None = None
    chunked: bool = False
    target: bytes | None = None


@dataclass
class RestorePlan:
    tree_id: str
    write: list[Item] = field(default_factory=list)    # parents before children
    delete: list[Item] = field(default_factory=list)   # children before parents
    keep: list[tuple] = field(default_factory=list)    # (relpath, size, reason): left out, untouched
    current_tree_id: str | None = None   # the directory as it was when planned (the undo point)


def make_plan(objects, current_tree: bytes, current_left_out: list, target_tree: bytes, flt,
              paths: list[bytes] | None) -> RestorePlan:
    plan = RestorePlan(target_tree.hex(), keep=list(current_left_out))
    left_out = [p.rstrip(b"/") for p, _, _ in current_left_out]
    left_out_set = set(left_out)
    for path, status, old, new in walk_changes(objects, current_tree, target_tree):
        if paths is not None and not _wanted(path, paths):
            continue
        if status in ("deleted", "type-changed"):
            if old.type == DIR and _holds_any(path, left_out):
                plan.keep.append((path + b"/", 0, "holds left-out files"))
                continue
            plan.delete.append(_item(path, old))
        if status != "deleted":
            if path in left_out_set or _under_any(path, left_out_set) or flt.excluded(path):
                continue     # never overwrite what capture left out
            plan.write.append(_item(path, new))
    plan.delete.sort(key=lambda i: i.path, reverse=True)
    plan.write.sort(key=lambda i: i.path)
    return plan


def _wanted(path: bytes, paths: list[bytes]) -> bool:
    for p in paths:
        p = p.rstrip(b"/")
        if path == p or path.startswith(p + b"/") or p.startswith(path + b"/"):
            return True
    return False


def _holds_any(dirpath: bytes, paths: list[bytes]) -> bool:
    prefix = dirpath + b"/"
    return any(p.startswith(prefix) for p in paths)


def _under_any(path: bytes, dirs: set[bytes]) -> bool:
    parts = path.split(b"/")
    return any(b"/".join(parts[:n]) in dirs for n in range(1, len(parts)))


def _item(path: bytes, e: Entry) -> Item:
    return Item(path, TYPE_NAMES[e.type], e.mode, e.size, e.oid, e.chunked, e.target)


class ChangedMeanwhile(OSError):
    """A path changed after the plan's snapshot (a person saved a file while the rewind wrote):
    the restore stops before touching it, so that edit is not overwritten."""


def apply_plan(objects, root, plan: RestorePlan, progress=None, seen=None) -> None:
    """Apply the plan; `progress(done, total)` after each path deleted or written. `seen(path)`
    (optional): the (mode, size, mtime_ns, ctime_ns, ino) the plan's snapshot saw at a path, or
    None where it saw nothing; a non-directory path found otherwise right before it is replaced
    or deleted stops the restore there (ChangedMeanwhile)."""
    contents = _verify(objects, plan)
    total, done = len(plan.delete) + len(plan.write), 0
    deleted = set()
    with _Dirs(root) as dirs:
        for item in plan.delete:
            if seen is not None and item.type != "dir":
                _unchanged(dirs, item.path, seen)
            _delete(dirs, item)
            deleted.add(item.path)
            done += 1
            if progress:
                progress(done, total)
        for item in plan.write:
            if seen is not None and item.type != "dir" and item.path not in deleted:
                _unchanged(dirs, item.path, seen)
            _write(objects, dirs, item, contents)
            faults.point("restore-wrote")       # a kill here leaves the directory half written
            done += 1
            if progress:
                progress(done, total)
        for item in reversed(plan.write):         # last, so read-only dirs were writable above
            if item.type == "dir":
                fd = dirs.open(item.path)
                os.fchmod(fd, restored_mode(item.mode))


def _verify(objects, plan: RestorePlan) -> dict:
    """Read and re-hash every object the plan writes; keep small contents for the write phase."""
    problems, contents, kept = [], {}, 0
    for item in plan.write:
        if item.type not in ("file", "exec"):
            continue
        try:
            if item.chunked:
                for chunk_id, _ in decode_chunks(objects.get(item.oid, CHUNKS)):
                    objects.get(chunk_id, BLOB)
            else:
                data = objects.get(item.oid, BLOB)
                if kept + len(data) <= _KEEP_IN_MEMORY:
                    contents[item.oid] = data
                    kept += len(data)
        except (CorruptObject, MissingObject) as e:
            problems.append(f"{os.fsdecode(item.path)}: {e}")
    if problems:
        raise RestoreRefused(problems)
    return contents


class _Dirs:
    """Directory fds under the root, opened component by component without following links."""

    def __init__(self, root):
        self.fds = {b"": os.open(os.fspath(root), _DIR_FLAGS)}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for fd in self.fds.values():
            os.close(fd)

    def open(self, path: bytes) -> int:
        fd = self.fds.get(path)
        if fd is None:
            parent, _, name = path.rpartition(b"/")
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=self.open(parent))
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise StoreError(f"{os.fsdecode(path)}: not a directory (a symlink or file is in "
                                     "the way; the worktree changed since the plan was made)") from None
                raise
            self.fds[path] = fd
        return fd

    def forget(self, path: bytes) -> None:
        for p in [p for p in self.fds if p == path or p.startswith(path + b"/")]:
            os.close(self.fds.pop(p))

    def parent(self, path: bytes) -> tuple[int, bytes]:
        parent, _, name = path.rpartition(b"/")
        return self.open(parent), name


def _unchanged(dirs: _Dirs, path: bytes, seen) -> None:
    want = seen(path)
    try:
        pfd, name = dirs.parent(path)
        st = os.lstat(name, dir_fd=pfd)
        now = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    except FileNotFoundError:
        now = None
    if now != want and not (want is not None and now is not None and _is_dir(want[0]) and _is_dir(now[0])):
        raise ChangedMeanwhile(f"{os.fsdecode(path)} changed while the rewind was writing; it was left "
                               "as it is and the rewind stopped there (rewind again to finish)")


def _is_dir(mode) -> bool:
    return mode & 0o170000 == 0o040000


def _delete(dirs: _Dirs, item: Item) -> None:
    try:
        pfd, name = dirs.parent(item.path)
        if item.type == "dir":
            dirs.forget(item.path)
            os.rmdir(name, dir_fd=pfd)
        else:
            os.unlink(name, dir_fd=pfd)
    except FileNotFoundError:
        pass      # already gone: a re-run after a crash


def _write(objects, dirs: _Dirs, item: Item, contents: dict) -> None:
    pfd, name = dirs.parent(item.path)
    if item.type == "dir":
        try:
            os.mkdir(name, 0o700, dir_fd=pfd)
        except FileExistsError:
            pass
        return
    tmp = b".envgit-restore." + os.urandom(6).hex().encode() + b".tmp"
    try:
        if item.type == "symlink":
            os.symlink(item.target, tmp, dir_fd=pfd)
        else:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=pfd)
            try:
                for piece in _file_pieces(objects, item, contents):
                    view = memoryview(piece)
                    while view:
                        view = view[os.write(fd, view):]
                os.fchmod(fd, restored_mode(item.mode))
            finally:
                os.close(fd)
        os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=pfd)
        except FileNotFoundError:
            pass
        raise


def _file_pieces(objects, item: Item, contents: dict):
    if not item.chunked:
        data = contents.get(item.oid)
        yield data if data is not None else objects.get(item.oid, BLOB)
        return
    for chunk_id, _ in decode_chunks(objects.get(item.oid, CHUNKS)):
        yield objects.get(chunk_id, BLOB)
