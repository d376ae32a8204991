"""The stat cache: which paths are unchanged since the last snapshot (docs/FORMAT.md, "Stat cache").

`entries` maps a relative path to its stat and content id, like git's index, so an unchanged file
is never re-read. `trees` (in memory only, rebuilt from `entries` on load) maps a directory to
the listing it had and the tree id it produced, so an unchanged directory is not re-encoded.
"""

import os
import struct
from dataclasses import dataclass

from blake3 import blake3

from .ids import ID_LEN

MAGIC = b"envgit-statcache-1\n"
_RECORD = struct.Struct(f"<QqqQIHBx{ID_LEN}s")   # size, mtime, ctime, ino, mode, path len, flags, id
_ZERO_ID = bytes(ID_LEN)
FLAG_CHUNKED, FLAG_RACY = 1, 2
# The file-system clock is coarse (a jiffy behind the precise clock): a file written during the
# snapshot can carry a timestamp up to that much older than the snapshot's start.
RACY_SLACK_NS = 100_000_000


@dataclass(slots=True)
class DirMemo:
    key: tuple           # the sorted child stamps the directory had (names first)
    tree_id: bytes
    left_out: list       # (relpath, size, reason) of children left out
    reusable: bool       # False when a child was racy: re-encode next time


# A cached entry: (mode, size, mtime_ns, ctime_ns, ino, oid or None, flags). The first five are
# the "stamp" compared with a fresh lstat.
CacheEntry = tuple


def stamp(st: os.stat_result) -> tuple:
    return (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class StatCache:
    def __init__(self, path=None, autosave: bool = True):
        """`path`: where it persists (None: in memory only). `autosave`: saved after every
        snapshot; a long-lived process with a watcher may turn it off and save() when idle."""
        self.path = os.fspath(path) if path is not None else None
        self.autosave = autosave
        self.changed = False
        self.entries: dict[bytes, CacheEntry] = {}
        self.trees: dict[bytes, DirMemo] = {}
        self.filter_key = None       # the Filter the `trees` memo was built with
        if self.path is not None:
            self._load()

    def forget(self, relpath: bytes, was_dir: bool) -> None:
        """Drop a path that no longer exists (and, for a directory, everything under it)."""
        self.changed = True
        self.entries.pop(relpath, None)
        self.trees.pop(relpath, None)
        if was_dir:
            prefix = relpath + b"/"
            for table in (self.entries, self.trees):
                for p in [p for p in table if p.startswith(prefix)]:
                    del table[p]

    def lookup(self, relpath: bytes, st_stamp: tuple) -> CacheEntry | None:
        """The cached entry if the path's stat is unchanged and the entry is trustworthy."""
        e = self.entries.get(relpath)
        if e is None or e[:5] != st_stamp or e[6] & FLAG_RACY:
            return None
        return e

    # -- persistence ----------------------------------------------------------------------
    def save(self) -> None:
        """Write the cache next to itself and rename it into place (a torn write is detected)."""
        if self.path is None or not self.changed:
            return
        items = sorted(self.entries.items())
        records = [_RECORD.pack(size, mtime, ctime, ino, mode, len(p), flags, oid or _ZERO_ID)
                   for p, (mode, size, mtime, ctime, ino, oid, flags) in items]
        body = b"".join([MAGIC, struct.pack("<I", len(items))] + records + [p for p, _ in items])
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(body + blake3(body).digest())
        os.replace(tmp, self.path)
        self.changed = False

    def _load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
                written_ns = os.fstat(f.fileno()).st_mtime_ns
            self.entries = _decode(data, written_ns)
        except (OSError, ValueError, struct.error):
            self.entries = {}        # a cache: missing or damaged means "rehash"
            return
        self._rebuild_trees()

    def _rebuild_trees(self) -> None:
        """Directory memos from the entries: a directory's key is its children's stamps."""
        children: dict[bytes, list] = {}
        racy_dirs = set()
        for path, (mode, size, mtime, ctime, ino, oid, flags) in self.entries.items():
            if not path:
                continue
            parent, _, name = path.rpartition(b"/")
            if oid is not None and _is_dir(mode):
                children.setdefault(parent, []).append((name, mode, oid))
            else:
                children.setdefault(parent, []).append((name, mode, size, mtime, ctime, ino))
            if flags & FLAG_RACY:
                racy_dirs.add(parent)
        for path, (mode, *_rest, oid, flags) in self.entries.items():
            if oid is not None and _is_dir(mode):
                stamps = sorted(children.get(path, ()))
                # Left-out children are not in the cache: the first snapshot re-lists (and so
                # re-reports) them, as a memo without them would not match anyway.
                self.trees[path] = DirMemo(tuple(stamps), oid, [], path not in racy_dirs)


def _is_dir(mode: int) -> bool:
    return (mode & 0o170000) == 0o040000


def _decode(data: bytes, written_ns: int) -> dict:
    if not data.startswith(MAGIC) or blake3(data[:-ID_LEN]).digest() != data[-ID_LEN:]:
        raise ValueError("bad stat cache")
    (count,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    paths_at = start + count * _RECORD.size
    entries, pos = {}, paths_at
    for size, mtime, ctime, ino, mode, plen, flags, oid in _RECORD.iter_unpack(data[start:paths_at]):
        path = data[pos:pos + plen]
        pos += plen
        if mtime >= written_ns:          # git's racy rule: not older than the cache file itself
            flags |= FLAG_RACY
        entries[path] = (mode, size, mtime, ctime, ino, None if oid == _ZERO_ID else oid, flags)
    if pos != len(data) - ID_LEN:
        raise ValueError("bad stat cache length")
    return entries
