"""Taking a snapshot: walk the directory, store what changed, return the root tree id.

The walk goes through directory file descriptors opened with O_NOFOLLOW, never through paths,
so a symlink (even one swapped in during the walk) is recorded as a link and never followed.
"""

import os
import stat
import time
from dataclasses import dataclass, field

from . import chunker
from .encoding import DIR, EXEC, FILE, SYMLINK, Entry, encode_chunks, encode_tree
from .filter import STATE_DIR, Filter
from .ids import BLOB, CHUNKS, TREE
from .statcache import FLAG_CHUNKED, FLAG_RACY, RACY_SLACK_NS, DirMemo, StatCache

SMALL_FILE = 1 << 20          # files up to this size are one blob; larger ones are chunked
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass
class Snapshot:
    tree_id: str                                   # hex id of the root tree
    left_out: list = field(default_factory=list)   # (relpath bytes, size, reason)
    ms: float = 0.0
    stats: dict = field(default_factory=dict)


class Capture:
    """One snapshot run. `must_list` is None (list every directory) or the set of directories a
    watcher saw change, plus their ancestors; every other directory reuses its cached tree."""

    def __init__(self, objects, flt: Filter, cache: StatCache, must_list: set | None):
        self.objects, self.flt, self.cache, self.must_list = objects, flt, cache, must_list
        self.left_out: list = []
        self.fence = time.time_ns() - RACY_SLACK_NS
        self.stats = dict(dirs_listed=0, entries_statted=0, files_hashed=0, bytes_hashed=0)

    def root_tree(self, root) -> bytes:
        fd = os.open(os.fspath(root), _DIR_FLAGS)
        try:
            st = os.fstat(fd)
            tree_id = self._tree(fd, b"")
        finally:
            os.close(fd)
        self.cache.entries[b""] = (st.st_mode, 0, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, tree_id, 0)
        return tree_id

    def _tree(self, dfd: int, rel: bytes) -> bytes:
        memo = self.cache.trees.get(rel)
        if (memo is not None and memo.reusable and self.must_list is not None
                and rel not in self.must_list and self.objects.has(memo.tree_id)):
            self.left_out.extend(memo.left_out)
            return memo.tree_id
        listing = self._list(dfd, rel)
        key = tuple(stamp for stamp, _ in listing)
        if memo is not None:
            if memo.reusable and memo.key == key and self.objects.has(memo.tree_id):
                self.left_out.extend(memo.left_out)
                return memo.tree_id
            self._forget_vanished(rel, memo, listing)
        return self._encode(dfd, rel, listing, key)

    def _list(self, dfd: int, rel: bytes) -> list:
        """[(stamp, stat)] sorted by name. A directory's stamp holds its tree id (recursing first),
        any other entry's stamp its stat fields."""
        self.stats["dirs_listed"] += 1
        listing = []
        prefix = rel + b"/" if rel else b""
        with os.scandir(dfd) as it:
            for e in it:
                name = os.fsencode(e.name)
                st = e.stat(follow_symlinks=False)
                mode = st.st_mode
                if stat.S_ISDIR(mode) and not self.flt.excluded(prefix + name):
                    sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                    try:
                        sub_id = self._tree(sub, prefix + name)
                    finally:
                        os.close(sub)
                    listing.append(((name, mode, sub_id), st))
                else:
                    listing.append(((name, mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino), st))
        self.stats["entries_statted"] += len(listing)
        listing.sort(key=_first)
        return listing

    def _forget_vanished(self, rel: bytes, memo: DirMemo, listing: list) -> None:
        now = {stamp[0] for stamp, _ in listing}
        prefix = rel + b"/" if rel else b""
        for old in memo.key:
            if old[0] not in now:
                self.cache.forget(prefix + old[0], was_dir=len(old) == 3)

    def _encode(self, dfd: int, rel: bytes, listing: list, key: tuple) -> bytes:
        prefix = rel + b"/" if rel else b""
        entries, left_out, racy = [], [], False
        cache_entries = self.cache.entries
        for stamp, st in listing:
            name = stamp[0]
            path = prefix + name
            if path == STATE_DIR:
                continue           # envgit's own state: never content, not worth reporting
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                if len(stamp) == 3:
                    entries.append(Entry(name, DIR, mode & 0o7777, 0, stamp[2]))
                    cache_entries[path] = (mode, 0, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, stamp[2], 0)
                else:
                    left_out.append((path + b"/", 0, "excluded"))
                continue
            if self.flt.excluded(path):
                left_out.append((path, st.st_size, "excluded"))
            elif stat.S_ISLNK(mode):
                target = os.readlink(name, dir_fd=dfd)
                entries.append(Entry(name, SYMLINK, mode & 0o7777, len(target), target=target))
                cache_entries[path] = (mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, None, 0)
            elif not stat.S_ISREG(mode):
                left_out.append((path, st.st_size, "not a regular file"))
            elif self.flt.too_large(st.st_size):
                left_out.append((path, st.st_size, "too large"))
            else:
                found = self._file(dfd, path, name, st)
                if found is None:      # replaced by something else since the listing
                    left_out.append((path, st.st_size, "not a regular file"))
                    continue
                entry, flags = found
                if st.st_mtime_ns >= self.fence:
                    flags |= FLAG_RACY
                    racy = True
                cache_entries[path] = (mode, entry.size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, entry.oid, flags)
                entries.append(entry)
        tree_id = self.objects.put(TREE, encode_tree(entries))
        self.cache.changed = True
        self.cache.trees[rel] = DirMemo(key, tree_id, left_out, not racy)
        self.left_out.extend(left_out)
        return tree_id

    def _file(self, dfd: int, path: bytes, name: bytes, st) -> tuple[Entry, int] | None:
        typ = EXEC if st.st_mode & stat.S_IXUSR else FILE
        perm = st.st_mode & 0o7777
        cached = self.cache.lookup(path, (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
        if cached is not None and self.objects.has(cached[5]):
            chunked = bool(cached[6] & FLAG_CHUNKED)
            return Entry(name, typ, perm, cached[1], cached[5], chunked), cached[6] & FLAG_CHUNKED
        fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
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
        return Entry(name, typ, perm, size, oid, chunked), FLAG_CHUNKED if chunked else 0

    def _chunked(self, fd: int) -> tuple[bytes, int]:
        """-> (chunk index id, file size)."""
        parts = [(self.objects.put(BLOB, chunk), len(chunk)) for chunk in chunker.chunks(fd)]
        return self.objects.put(CHUNKS, encode_chunks(parts)), sum(n for _, n in parts)


def _first(item):
    return item[0][0]


def _read_upto(fd: int, limit: int) -> bytes:
    parts, have = [], 0
    while have < limit:
        got = os.read(fd, limit - have)
        if not got:
            break
        parts.append(got)
        have += len(got)
    return b"".join(parts)
