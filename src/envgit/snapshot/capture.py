"""Taking a snapshot: walk the directory, store what changed, return the root tree id.

The walk goes through directory file descriptors opened with O_NOFOLLOW, never through paths,
so a symlink (even one swapped in during the walk) is recorded as a link and never followed.

Per directory the stat cache holds a memo (statcache.DirMemo): each child's stamp and encoded
tree entry. A listing compares each child's fresh lstat with its stamp; only the children that
differ are classified, read and encoded again, and the tree is re-encoded by joining the cached
entry bytes. With a change map from the watcher, a directory is not even listed: only the names
inotify reported are lstat'ed, and a directory without events reuses its tree id.

A step chooses the shape of the tree, so the walk has no recursion (a directory thousands of
levels deep would raise RecursionError and fail every later snapshot): each directory being
listed is a generator on an explicit stack (Capture._walk), which yields when it meets a
subdirectory. Only the deepest _OPEN_DIRS directories on the path keep their fd; a shallower
one is reopened from the root, component by component with O_NOFOLLOW, when the walk climbs
back to it, and must still be the same directory (device and inode), so the fds held are
bounded by neither the depth nor the number of directories.
"""

import bisect
import errno
import os
import stat
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from . import chunker
from .encoding import DIR, EXEC, FILE, SYMLINK, TREE_MAGIC, encode_chunks, encode_entry
from .filter import STATE_DIR, Filter
from .ids import BLOB, CHUNKS, TREE
from .lend import give_back, open_lending
from .statcache import (
    ENC,
    FLAG_CHUNKED,
    FLAG_RACY,
    FLAGS,
    IGNORED,
    LEFT,
    OID,
    RACY_SLACK_NS,
    STAT,
    DirMemo,
    StatCache,
)

SMALL_FILE = 1 << 20          # files up to this size are one blob; larger ones are chunked
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


ALL = "all"          # in a change map: the directory's names are unknown, list it
_BIG_TREE = 512      # trees with this many entries are remembered for diffing (ObjectStore)
_OPEN_DIRS = 64      # directory fds the walk holds at most (besides the root's)
_S_IFMT, _S_IFDIR, _S_IFREG, _S_IFLNK = 0o170000, stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK

# A directory's lister (see Capture._walk): it yields (its fd, prefix, name, lstat, old kid) for
# each subdirectory, is sent back (that subdirectory's kid, its own fd), and returns its tree id:
# its memo's `tree_id`, typed `bytes | None` there but set on every memo it returns it from (a
# trusted one, or one it has just encoded).
_Lister = Generator[tuple, tuple, bytes | None]


@dataclass
class Snapshot:
    tree_id: str                                   # hex id of the root tree
    left_out: list = field(default_factory=list)   # (relpath bytes, size, reason), sorted by path
    ms: float = 0.0
    stats: dict = field(default_factory=dict)


def close_changes(changes: dict, cache: StatCache) -> dict:
    """A watcher's {directory: names (bytes) or ALL} as the capture wants it: names as str, racy
    children added (they are re-read until their timestamps are safely old), and every ancestor
    holding the name of the child on the way down."""
    out = {}
    for rel, names in changes.items():
        out[rel] = ALL if names is ALL else {os.fsdecode(n) for n in names}
    for rel in cache.racy_dirs | cache.linked_dirs:
        memo = cache.dirs.get(rel)
        if memo is not None and (memo.racy or memo.linked) and out.get(rel) is not ALL:
            out[rel] = out.get(rel, set()) | memo.racy | memo.linked
    for rel in list(out):
        while rel:
            parent, _, name = rel.rpartition(b"/")
            names = out.get(parent)
            if names is None:
                out[parent] = {os.fsdecode(name)}
            elif names is not ALL:
                names.add(os.fsdecode(name))
            rel = parent
    return out


class Capture:
    """One snapshot run. `changes` is None (list every directory) or what a watcher saw (see
    close_changes): a directory absent from it reuses its memo's tree id."""

    # (prefix, name) of the child _replaced is looking at again; unset (getattr's None) otherwise
    _again: tuple[bytes, str] | None

    def __init__(self, objects, flt: Filter, cache: StatCache, changes: dict | None):
        self.objects, self.flt, self.cache, self.changes = objects, flt, cache, changes
        self.fence = time.time_ns() - RACY_SLACK_NS
        self.new_link = False       # a regular file was seen with a second name it lacked before
        self.lent: list = []        # directories whose owner was lent r-x for this run (lend.py)
        self.stats = dict(dirs_listed=0, dirs_rechecked=0, entries_statted=0, files_hashed=0,
                          bytes_hashed=0, trees_encoded=0)

    def root_tree(self, root) -> bytes:
        fd = os.open(os.fspath(root), _DIR_FLAGS)
        try:
            st = os.fstat(fd)
            st5 = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
            tree_id = self._walk(fd, st5)
            if self.new_link and self.changes is not None:
                # A file got a second name: its first name, elsewhere, had no event and may have
                # changed through the new one. One walk without the watcher's map finds it (and
                # from then on both names are re-checked at every snapshot: DirMemo.linked).
                self.changes = None
                tree_id = self._walk(fd, st5)
        finally:
            os.close(fd)
            give_back(self.lent)
        self.cache.root = ((st.st_mode, 0, st.st_mtime_ns, st.st_ctime_ns, st.st_ino), tree_id)
        return tree_id

    def _walk(self, root_fd: int, st5: tuple) -> bytes:
        """The root's tree id. Each frame is [generator of a directory's tree id (see _dir),
        its fd or None (closed, reopened when needed), name, lstat, old kid]; a generator yields
        (its fd, prefix, name, lstat, old kid) for a subdirectory and is sent back (the
        subdirectory's kid, its own fd, which may have been reopened)."""
        frames: list[list[Any]] = [[self._dir(root_fd, b"", st5), root_fd, None, None, None]]
        send = None
        try:
            while True:
                frame = frames[-1]
                try:
                    want = frame[0].send(send)
                except StopIteration as done:
                    frames.pop()
                    if not frames:
                        return done.value
                    if frame[1] is not None:
                        os.close(frame[1])
                    _, _, name, st, old = frame
                    parent = frames[-1]
                    if parent[1] is None:
                        self._reopen(frames)
                    send = (self._dir_kid(name, st, old, done.value), parent[1])
                    continue
                dfd, prefix, name, st, old = want
                sub, st = self._open_dir(dfd, prefix, name, st, old)
                if sub is None:                   # no longer a directory: `st` is its kid
                    send = (st, dfd)
                    continue
                path = prefix + os.fsencode(name)
                st5 = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                frames.append([self._dir(sub, path, st5), sub, name, st, old])
                send = None
                depth = len(frames) - _OPEN_DIRS - 1
                if depth > 0 and not _checkpoint(depth) and frames[depth][1] is not None:
                    os.close(frames[depth][1])
                    frames[depth][1] = None
        finally:
            for frame in frames[1:]:
                if frame[1] is not None:
                    os.close(frame[1])

    def _reopen(self, frames: list) -> None:
        """Reopen the top frame's directory (its fd was closed to bound the fds held) from the
        nearest open ancestor (a checkpoint: at most _OPEN_DIRS levels up), keeping the deepest
        _OPEN_DIRS of those on the way. Each kept one must be the directory it was (same device
        and inode): one renamed meanwhile fails the snapshot instead of mixing two directories
        into one tree."""
        top = len(frames) - 1
        start = top
        while frames[start][1] is None:
            start -= 1
        fd = frames[start][1]
        keep_from = max(start + 1, top - _OPEN_DIRS + 1)
        for i in range(start + 1, top + 1):
            frame = frames[i]
            try:
                sub = open_lending(frame[2], _DIR_FLAGS, fd, self.lent, 0o500)
            finally:
                if start < i - 1 < keep_from:     # a directory on the way, not kept
                    os.close(fd)
            if i >= keep_from:
                st = os.fstat(sub)
                if (st.st_dev, st.st_ino) != (frame[3].st_dev, frame[3].st_ino):
                    os.close(sub)
                    raise OSError(errno.ESTALE, f"{frame[2]}: a directory was moved while the "
                                                "snapshot was taken (take it again)")
                frame[1] = sub
            fd = sub

    def _open_dir(self, dfd: int, prefix: bytes, name: str, st, old) -> tuple:
        """(fd, lstat) of the child directory `name`; (None, its kid) if it is no longer one."""
        for again in (False, True):
            try:
                return open_lending(name, _DIR_FLAGS, dfd, self.lent, 0o500), st
            except OSError as e:
                if isinstance(e, FileNotFoundError):
                    return None, None
                if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EINVAL) or again:
                    raise
            try:
                st = os.lstat(name, dir_fd=dfd)
            except FileNotFoundError:
                return None, None
            kid = self._kid(dfd, prefix, name, st, old)
            if not isinstance(kid, _Descend):
                return None, kid
            st = kid.st
        raise AssertionError("unreachable")

    @staticmethod
    def _dir_kid(name: str, st, old, sub_id: bytes) -> tuple:
        """The kid of a listed subdirectory whose tree id is `sub_id`."""
        mode = st.st_mode
        st5 = (mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        if (old is not None and old[OID] == sub_id and old[ENC] is not None
                and old[STAT] is not None and old[STAT][0] == mode):
            return old if old[STAT] == st5 else (None, st5, old[ENC], sub_id, 0, None)
        enc = encode_entry(os.fsencode(name), DIR, mode & 0o7777, 0, sub_id)
        return (None, st5, enc, sub_id, 0, None)

    def _dir(self, dfd: int, rel: bytes, st5: tuple) -> _Lister:
        """Generator of the tree id of directory `rel` (open as `dfd`, its lstat stamp `st5`);
        it yields for each subdirectory to list (see _walk)."""
        memo = self.cache.dirs.get(rel)
        if memo is not None and memo.trusted and not self.objects.has(memo.tree_id):
            memo.trusted = False     # gc took it (or a failed snapshot never sealed it)
        if memo is not None and memo.trusted:
            if self.changes is not None:
                names = self.changes.get(rel)
                if names is None:
                    return memo.tree_id
                if names is not ALL:
                    return (yield from self._recheck(dfd, rel, memo, names))
            elif memo.stamp == st5:
                return (yield from self._restat(dfd, rel, memo))
        memo = memo if memo is not None else DirMemo()
        tree_id = yield from self._list(dfd, rel, memo)
        # Racy like a file: a child created later in the same timestamp granule would leave the
        # directory's stamp as it is now.
        memo.stamp = st5 if st5[2] < self.fence else None
        return tree_id

    def _restat(self, dfd: int, rel: bytes, memo: DirMemo) -> _Lister:
        """The directory's names are unchanged: lstat each known child, no listing needed."""
        stats = self.stats
        stats["dirs_listed"] += 1
        stats["entries_statted"] += len(memo.kids)
        lstat = os.lstat
        slow, missing = [], []
        for name, kid in memo.kids.items():
            try:
                st = lstat(name, dir_fd=dfd)
            except FileNotFoundError:             # deleted just now
                missing.append(name)
                continue
            if kid[0] != (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino):
                slow.append((name, st))
        if not slow and not missing:
            return memo.tree_id
        return (yield from self._apply(dfd, rel, memo, slow, missing))

    def _list(self, dfd: int, rel: bytes, memo: DirMemo) -> _Lister:
        """Every child lstat'ed; those whose stamp differs from the memo's go the slow way."""
        stats = self.stats
        stats["dirs_listed"] += 1
        kids = memo.kids
        get = kids.get
        trusted = memo.trusted
        slow, missing = [], []
        seen = n = 0
        with os.scandir(dfd) as it:
            for e in it:
                n += 1
                name = e.name
                kid = get(name)
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:         # deleted since the listing
                    if kid is not None:
                        missing.append(name)
                    continue
                if kid is not None:
                    seen += 1
                    if trusted and kid[0] == (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino):
                        continue
                slow.append((name, st))
        stats["entries_statted"] += n
        if seen + len(missing) != len(kids):      # some names are gone: which?
            present = set(os.listdir(dfd))
            missing += [name for name in kids if name not in present and name not in missing]
        if not slow and not missing and trusted:
            return memo.tree_id
        return (yield from self._apply(dfd, rel, memo, slow, missing))

    def _recheck(self, dfd: int, rel: bytes, memo: DirMemo, names: set) -> _Lister:
        """Only the names a watcher reported are lstat'ed."""
        stats = self.stats
        stats["dirs_listed"] += 1
        stats["dirs_rechecked"] += 1
        stats["entries_statted"] += len(names)
        kids = memo.kids
        slow, missing = [], []
        for name in names:
            kid = kids.get(name)
            try:
                st = os.lstat(name, dir_fd=dfd)
            except FileNotFoundError:
                if kid is not None:
                    missing.append(name)
                continue
            if kid is not None and kid[0] == (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino):
                continue
            slow.append((name, st))
        if not slow and not missing:
            return memo.tree_id
        return (yield from self._apply(dfd, rel, memo, slow, missing))

    def _apply(self, dfd: int, rel: bytes, memo: DirMemo, slow: list, missing: list) -> _Lister:
        """Update the memo for the children that changed; re-encode the tree if an entry did."""
        cache = self.cache
        prefix = rel + b"/" if rel else b""
        kids, left, racy = memo.kids, memo.left, memo.racy
        reorder = not memo.trusted or memo.order is None
        memo.trusted = False          # until the memo is consistent again (an error midway)
        encode = reorder
        touched = bool(missing) or reorder
        added, removed = [], set()
        linked = memo.linked
        for name in missing:
            gone = kids.pop(name)
            if gone[ENC] is not None:
                removed.add(name)
                encode = True
            left.pop(name, None)
            racy.discard(name)
            linked.discard(name)
            if _is_dir(gone):
                cache.forget_tree(prefix + os.fsencode(name))
        for name, st in slow:
            old = kids.get(name)
            if st.st_nlink > 1 and st.st_mode & _S_IFMT == _S_IFREG:
                if name not in linked:
                    linked.add(name)
                    self.new_link = True
            else:
                linked.discard(name)
            kid = self._kid(dfd, prefix, name, st, old)
            if isinstance(kid, _Descend):         # listed by _walk, which sends back its kid
                kid, dfd = yield (dfd, prefix, name, kid.st, old)
            if kid is None:                       # vanished since the listing
                if old is None:
                    continue
                kid = kids.pop(name)
                left.pop(name, None)
                racy.discard(name)
                if old[ENC] is not None:
                    removed.add(name)
                    encode = True
                if _is_dir(old):
                    cache.forget_tree(prefix + os.fsencode(name))
                continue
            if kid == old:
                continue                          # a directory whose tree did not change
            touched = True
            kids[name] = kid
            if old is not None and _is_dir(old) and not (_is_dir(kid) and kid[ENC] is not None):
                cache.forget_tree(prefix + os.fsencode(name))   # no longer a listed directory
            old_enc = old[ENC] if old is not None else None
            if old_enc != kid[ENC]:
                encode = True
                if old_enc is None:
                    added.append(name)
                elif kid[ENC] is None:
                    removed.add(name)
            if kid[LEFT] is not None:
                left[name] = kid[LEFT]
            else:
                left.pop(name, None)
            if kid[FLAGS] & FLAG_RACY:
                racy.add(name)
            else:
                racy.discard(name)
        if encode:
            order = memo.order
            if reorder or order is None:          # (None only when reorder: see above)
                order = sorted((n for n, k in kids.items() if k[ENC] is not None), key=os.fsencode)
            else:
                if removed:
                    order = [n for n in order if n not in removed]
                if len(added) > 16:
                    order = sorted(order + added, key=os.fsencode)
                else:
                    for name in added:
                        bisect.insort(order, name, key=os.fsencode)
            memo.order = order
            parts = [kids[n][ENC] for n in order]
            memo.tree_id = self.objects.put(TREE, TREE_MAGIC + b"".join(parts))
            if len(parts) >= _BIG_TREE:
                self.objects.remember_tree(memo.tree_id, parts)
            self.stats["trees_encoded"] += 1
        memo.trusted = True
        if linked:
            cache.linked_dirs.add(rel)
        else:
            cache.linked_dirs.discard(rel)
        if not touched:
            return memo.tree_id
        cache.dirs[rel] = memo
        cache.changed = True
        if left:
            cache.left_dirs.add(rel)
        else:
            cache.left_dirs.discard(rel)
        if racy:
            cache.racy_dirs.add(rel)
        else:
            cache.racy_dirs.discard(rel)
        return memo.tree_id

    def _kid(self, dfd: int, prefix: bytes, name: str, st, old: tuple | None) -> "tuple | _Descend | None":
        """Classify, read and encode one child (None: it vanished meanwhile; _Descend: a
        directory to list)."""
        bname = os.fsencode(name)
        path = prefix + bname
        if path == STATE_DIR:
            return IGNORED                        # envgit's own state: never content, not reported
        mode = st.st_mode
        st5 = (mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        fmt = mode & _S_IFMT
        flt = self.flt
        if fmt == _S_IFDIR:
            if flt.excluded(path):
                return (st5, st5, None, None, 0, (path + b"/", 0, "excluded"))
            return _Descend(st)
        if flt.excluded(path):
            return (st5, st5, None, None, 0, (path, st.st_size, "excluded"))
        if fmt == _S_IFLNK:
            try:
                target = os.readlink(bname, dir_fd=dfd)
            except OSError as e:
                return self._replaced(e, dfd, prefix, name, old)
            enc = encode_entry(bname, SYMLINK, mode & 0o7777, len(target), target=target)
            if old is not None and old[ENC] == enc:
                enc = old[ENC]
            return (st5, st5, enc, None, 0, None)
        if fmt != _S_IFREG:
            return (st5, st5, None, None, 0, (path, st.st_size, "not a regular file"))
        if flt.too_large(st.st_size):
            return (st5, st5, None, None, 0, (path, st.st_size, "too large"))
        if (old is not None and old[STAT] == st5 and old[OID] is not None and old[LEFT] is None
                and not old[FLAGS] & FLAG_RACY and self.objects.has(old[OID])):
            oid, size, chunked = old[OID], st.st_size, old[FLAGS] & FLAG_CHUNKED
        else:
            found = self._read(dfd, bname)
            if found is None:                     # replaced by something else since the listing
                return (st5, st5, None, None, 0, (path, st.st_size, "not a regular file"))
            oid, size, chunked = found
            if size != st.st_size:                # it changed while read: re-read next time
                st5 = (mode, size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        enc = encode_entry(bname, EXEC if mode & stat.S_IXUSR else FILE, mode & 0o7777, size, oid, chunked)
        if old is not None and old[ENC] == enc:
            enc = old[ENC]
        if st.st_mtime_ns >= self.fence:
            return (None, st5, enc, oid, (FLAG_CHUNKED if chunked else 0) | FLAG_RACY, None)
        return (st5, st5, enc, oid, FLAG_CHUNKED if chunked else 0, None)

    def _replaced(self, e: OSError, dfd: int, prefix: bytes, name: str, old) -> "tuple | _Descend | None":
        """The child changed type between its lstat and its open/readlink: look again (once)."""
        if isinstance(e, FileNotFoundError):
            return None
        if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EINVAL):
            raise e
        try:
            st = os.lstat(name, dir_fd=dfd)
        except FileNotFoundError:
            return None
        again = getattr(self, "_again", None)
        if again == (prefix, name):
            raise e
        self._again = (prefix, name)
        try:
            return self._kid(dfd, prefix, name, st, old)
        finally:
            self._again = None

    def _read(self, dfd: int, bname: bytes) -> tuple[bytes, int, bool] | None:
        """-> (content id, size, chunked), or None if it is no longer a regular file."""
        fd = open_lending(bname, _FILE_FLAGS, dfd, self.lent, 0o400)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = _read_upto(fd, SMALL_FILE + 1)
            if len(data) <= SMALL_FILE:
                oid, size, chunked = self.objects.put(BLOB, data), len(data), False
            else:
                os.lseek(fd, 0, os.SEEK_SET)
                (oid, size), chunked = self._chunked(fd), True
        finally:
            os.close(fd)
        self.stats["files_hashed"] += 1
        self.stats["bytes_hashed"] += size
        return oid, size, chunked

    def _chunked(self, fd: int) -> tuple[bytes, int]:
        """-> (chunk index id, file size)."""
        parts = [(self.objects.put(BLOB, chunk), len(chunk)) for chunk in chunker.chunks(fd)]
        return self.objects.put(CHUNKS, encode_chunks(parts)), sum(n for _, n in parts)


def _checkpoint(depth: int) -> bool:
    """A directory whose fd the walk keeps while below it: every _OPEN_DIRS levels, the first
    _OPEN_DIRS such (so a reopen walks at most _OPEN_DIRS levels down for trees up to
    _OPEN_DIRS² deep, and the fds held stay under 2 × _OPEN_DIRS + 1 at any depth)."""
    return depth % _OPEN_DIRS == 0 and depth // _OPEN_DIRS <= _OPEN_DIRS


class _Descend:
    """_kid's answer for a directory: _walk lists it (no recursion)."""
    __slots__ = ("st",)

    def __init__(self, st):
        self.st = st


def _is_dir(kid: tuple) -> bool:
    st = kid[STAT]
    return st is not None and st[0] & _S_IFMT == _S_IFDIR


def _read_upto(fd: int, limit: int) -> bytes:
    parts, have = [], 0
    while have < limit:
        got = os.read(fd, limit - have)
        if not got:
            break
        parts.append(got)
        have += len(got)
    return b"".join(parts)
