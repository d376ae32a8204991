"""Bringing a directory back to a tree: plan (what differs), then apply (only that).

Applying goes through directory file descriptors opened with O_NOFOLLOW from the root, so a
symlink in the worktree is never followed out of it. Every object the plan needs is read and
re-hashed before the first change: a corrupted store refuses the whole restore (a restore into
another directory may instead write every other path and name the damaged ones: `partial`).
"""

import errno
import os
from dataclasses import dataclass, field
from typing import cast

from .. import faults
from .diff import walk_changes
from .encoding import DIR, TYPE_NAMES, Entry, decode_chunks
from .ids import BLOB, CHUNKS, CorruptObject
from .lend import give_back, open_lending
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


class PartlyRestored(StoreError):
    """A restore with `partial` wrote every path but those whose objects are missing or corrupt."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(f"restored every path but {len(problems)}, whose stored content is damaged "
                         "or missing: " + "; ".join(problems[:5])
                         + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""))


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
    if not dirs:
        return False          # (the common case; a join per ancestor was cubic in the depth)
    i = path.find(b"/")
    while i != -1:
        if path[:i] in dirs:
            return True
        i = path.find(b"/", i + 1)
    return False


def _item(path: bytes, e: Entry) -> Item:
    return Item(path, TYPE_NAMES[e.type], e.mode, e.size, e.oid, e.chunked, e.target)


class ChangedMeanwhile(OSError):
    """A path changed after the plan's snapshot (a person saved a file while the rewind wrote):
    the restore stops before touching it, so that edit is not overwritten."""


def apply_plan(objects, root, plan: RestorePlan, progress=None, seen=None, partial=False) -> None:
    """Apply the plan; `progress(done, total)` after each path deleted or written. `seen(path)`
    (optional): the (mode, size, mtime_ns, ctime_ns, ino) the plan's snapshot saw at a path, or
    None where it saw nothing; a non-directory path found otherwise right before it is replaced
    or deleted stops the restore there (ChangedMeanwhile). `partial` (a restore into another
    directory, never a rewind): a file whose objects are damaged is skipped, every other path
    written, and PartlyRestored names the skipped ones at the end."""
    contents, problems = _verify(objects, plan, partial)
    writes = [i for i in plan.write if i.path not in problems] if problems else plan.write
    total, done = len(plan.delete) + len(writes), 0
    deleted = set()
    with DirFds(root) as dirs:
        for item in plan.delete:
            if seen is not None and item.type != "dir":
                _unchanged(dirs, item.path, seen)
            _delete(dirs, item)
            deleted.add(item.path)
            done += 1
            if progress:
                progress(done, total)
        for item in writes:
            if seen is not None and item.type != "dir" and item.path not in deleted:
                _unchanged(dirs, item.path, seen)
            _write(objects, dirs, item, contents)
            faults.point("restore-wrote")       # a kill here leaves the directory half written
            done += 1
            if progress:
                progress(done, total)
        for item in reversed(writes):             # last, so read-only dirs were writable above
            if item.type == "dir":
                dirs.set_mode(item.path, restored_mode(item.mode))
    if problems:
        raise PartlyRestored(list(problems.values()))


def _verify(objects, plan: RestorePlan, partial=False) -> tuple[dict, dict]:
    """Read and re-hash every object the plan writes; keep small contents for the write phase.
    Returns (contents, {path: problem} of the files skipped; only with `partial`)."""
    problems, contents, kept = {}, {}, 0
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
            problems[item.path] = f"{os.fsdecode(item.path)}: {e}"
    if problems and not partial:
        raise RestoreRefused(list(problems.values()))
    return contents, problems


_OPEN_DIRS = 64      # directory fds DirFds holds at most on its path (besides the root's)


class DirFds:
    """Directory fds under the root, opened component by component without following links.

    Only the directories on the path last opened are held (the plan goes parents first, so
    siblings share them): the fds held grow with the depth, never with the number of
    directories (a snapshot with thousands would fail with EMFILE halfway). Of a deep path only
    the deepest _OPEN_DIRS are held, plus one every _OPEN_DIRS levels; one closed is reopened
    from the nearest held ancestor, again without following links."""

    def __init__(self, root):
        self.root = os.open(os.fspath(root), _DIR_FLAGS)
        self.chain: list[list] = []     # [[name, fd or None]] from the root's child down
        self.path = b""                 # the chain's path
        self.lent = []                  # directories of ours shut to us, lent rwx (lend.py)
        self.moded = set()              # (dev, ino) of those whose own mode was then written

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._cut(0)
        os.close(self.root)
        give_back(self.lent, keep=lambda pinned: _dev_ino(os.fstat(pinned)) in self.moded)

    def set_mode(self, path: bytes, mode: int) -> None:
        """Give the directory at `path` the snapshot's mode (kept, not undone by give_back)."""
        fd = self.open(path)
        os.fchmod(fd, mode)
        self.moded.add(_dev_ino(os.fstat(fd)))

    def open(self, path: bytes) -> int:
        if not path:
            return self.root
        names = path.split(b"/")
        chain = self.chain
        held = self.path
        if path == held:                                  # (the common cases in O(1) compares)
            same = len(names)
        elif not held or path.startswith(held + b"/"):
            same = len(chain)
        elif held.startswith(path + b"/"):
            same = len(names)
        else:
            same = 0
            while same < len(chain) and same < len(names) and chain[same][0] == names[same]:
                same += 1
        self._cut(same)
        try:
            for depth in range(same, len(names)):
                fd = self._open_at(self._fd(depth - 1), names[:depth + 1])
                chain.append([names[depth], fd])
                shallow = len(chain) - _OPEN_DIRS - 1
                if shallow >= 0 and not _checkpoint(shallow) and chain[shallow][1] is not None:
                    os.close(chain[shallow][1])
                    chain[shallow][1] = None
            fd = self._fd(len(names) - 1)
        except BaseException:
            self.path = b"/".join(names[:len(chain)])
            raise
        self.path = path
        return fd

    def _fd(self, i: int) -> int:
        """The fd of chain[i] (-1: the root), reopened from the nearest held ancestor if closed."""
        if i < 0:
            return self.root
        chain = self.chain
        if chain[i][1] is None:
            start = i - 1
            while start >= 0 and chain[start][1] is None:
                start -= 1
            fd = self._fd(start)       # held: no further recursion
            for j in range(start + 1, i + 1):
                sub = self._open_at(fd, [e[0] for e in chain[:j + 1]])
                if start < j - 1 and j - 1 < i - _OPEN_DIRS + 1:
                    os.close(fd)
                    chain[j - 1][1] = None
                chain[j][1] = sub
                fd = sub
        return chain[i][1]

    def _open_at(self, dfd: int, names: list) -> int:
        try:
            return open_lending(names[-1], _DIR_FLAGS, dfd, self.lent, 0o700)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise StoreError(f"{os.fsdecode(b'/'.join(names))}: not a directory (a symlink or file "
                                 "is in the way; the worktree changed since the plan was made)") from None
            raise

    def _cut(self, keep: int) -> None:
        """Close the fds of the chain below its first `keep` directories."""
        for entry in self.chain[keep:]:
            if entry[1] is not None:
                os.close(entry[1])
        del self.chain[keep:]

    def forget(self, path: bytes) -> None:
        """`path` is about to be removed: close its fd and those under it."""
        if self.path == path or self.path.startswith(path + b"/"):
            self._cut(path.count(b"/"))
            self.path = path.rpartition(b"/")[0]

    def parent(self, path: bytes) -> tuple[int, bytes]:
        parent, _, name = path.rpartition(b"/")
        return self.open(parent), name


def _dev_ino(st) -> tuple:
    return st.st_dev, st.st_ino


def _checkpoint(i: int) -> bool:
    """A chain index whose fd is held while below it (see DirFds): every _OPEN_DIRS levels, the
    first _OPEN_DIRS such, so the fds held stay under 2 × _OPEN_DIRS + 1 at any depth."""
    return (i + 1) % _OPEN_DIRS == 0 and (i + 1) // _OPEN_DIRS <= _OPEN_DIRS


def _unchanged(dirs: DirFds, path: bytes, seen) -> None:
    want = seen(path)
    try:
        pfd, name = dirs.parent(path)
        st = os.lstat(name, dir_fd=pfd)
        now = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        if want is not None and now[:3] + now[4:] == want[:3] + want[4:]:
            # ctime is left out: the rewind's own unlink of another name of this file (a hard
            # link) changes it (nlink is in the inode), not what the file holds; a person's save
            # changes mtime or size or inode
            now = want
    except FileNotFoundError:
        now = None
    if now != want and not (want is not None and now is not None and _is_dir(want[0]) and _is_dir(now[0])):
        raise ChangedMeanwhile(f"{os.fsdecode(path)} changed while the rewind was writing; it was left "
                               "as it is and the rewind stopped there (rewind again to finish)")


def _is_dir(mode) -> bool:
    return mode & 0o170000 == 0o040000


def _delete(dirs: DirFds, item: Item) -> None:
    try:
        pfd, name = dirs.parent(item.path)
        if item.type == "dir":
            dirs.forget(item.path)
            os.rmdir(name, dir_fd=pfd)
        else:
            os.unlink(name, dir_fd=pfd)
    except FileNotFoundError:
        pass      # already gone: a re-run after a crash


def _write(objects, dirs: DirFds, item: Item, contents: dict) -> None:
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
            # (a symlink's Item has the target its tree entry always has: see _item)
            os.symlink(cast(bytes, item.target), tmp, dir_fd=pfd)
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
