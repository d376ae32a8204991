"""The stat cache: which paths are unchanged since the last snapshot (docs/FORMAT.md, "Stat cache").

In memory it is one `DirMemo` per directory of the last snapshot: its tree id and, per child
name, the child's stat, content id and *encoded tree entry*, so a snapshot compares a fresh lstat
with the cached stamp and, when one child changed, re-encodes only that child and joins the
others' cached bytes. On disk it is the flat path -> (stat, id) table of the format; the memos
are rebuilt from it on load (their entries re-encoded on the first snapshot, as a cache file
does not say which filter it was made with).
"""

import os
import struct

from blake3 import blake3

from ..atomicfile import write_atomic
from .ids import ID_LEN

MAGIC = b"envgit-statcache-1\n"
_RECORD = struct.Struct(f"<QqqQIHBx{ID_LEN}s")   # size, mtime, ctime, ino, mode, path len, flags, id
_ZERO_ID = bytes(ID_LEN)
FLAG_CHUNKED, FLAG_RACY = 1, 2
# The file-system clock is coarse (a jiffy behind the precise clock): a file written during the
# snapshot can carry a timestamp up to that much older than the snapshot's start.
RACY_SLACK_NS = 100_000_000
_S_IFMT, _S_IFDIR = 0o170000, 0o040000

# A child ("kid") of a directory: a tuple, as a snapshot makes one per changed entry and a cache
# holds one per path.
FAST, STAT, ENC, OID, FLAGS, LEFT = range(6)
#   FAST   the stamp a fresh lstat must equal for the kid to be reused untouched, or None (a
#          directory, whose tree depends on its contents; a racy file; an entry not yet encoded)
#   STAT   (mode, size, mtime_ns, ctime_ns, ino) as last seen; None for envgit's own state dir
#   ENC    the entry's bytes in the tree (encoding.encode_entry), None when left out
#   OID    content id (files), tree id (directories), None otherwise
#   FLAGS  FLAG_CHUNKED | FLAG_RACY
#   LEFT   (relpath, size, reason) when left out of the snapshot, else None
IGNORED = (None, None, None, None, 0, None)    # .envgit at the root: never content, never reported


def stamp(st: os.stat_result) -> tuple:
    return (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class DirMemo:
    __slots__ = ("tree_id", "kids", "order", "left", "racy", "linked", "trusted", "stamp")

    def __init__(self, tree_id: bytes | None = None, trusted: bool = False):
        self.tree_id = tree_id
        # The directory's own (mode, size, mtime_ns, ctime_ns, ino) when it was last listed (None:
        # list it next time). Creating, deleting or renaming a child changes its mtime and ctime,
        # so while it matches, the names are those of `kids` and need only be lstat'ed.
        self.stamp: tuple | None = None
        self.kids: dict[str, tuple] = {}      # name (as os.scandir gives it) -> kid
        self.order: list[str] | None = None   # names of included kids, in raw-byte order
        self.left: dict[str, tuple] = {}      # name -> (relpath, size, reason) of left-out kids
        self.racy: set[str] = set()           # names of racy kids (re-read every snapshot)
        # Names of regular files with other names (st_nlink > 1): a write through another name
        # (outside this directory, or outside the project) gives no event here, so they are
        # lstat'ed at every snapshot.
        self.linked: set[str] = set()
        # True when `kids` are exactly what produced `tree_id` under the current filter: only
        # then may a child be reused on its stamp alone.
        self.trusted = trusted


class StatCache:
    def __init__(self, path=None, autosave: bool = True):
        """`path`: where it persists (None: in memory only). `autosave`: saved after every
        snapshot; a long-lived process with a watcher may turn it off and save() when idle."""
        self.path = os.fspath(path) if path is not None else None
        self.autosave = autosave
        self.changed = False
        self.dirs: dict[bytes, DirMemo] = {}     # directory relpath ("" = root) -> memo
        self.root: tuple | None = None           # the root's (stamp, tree id)
        self.left_dirs: set[bytes] = set()       # directories with left-out children
        self.racy_dirs: set[bytes] = set()       # directories with racy children
        self.linked_dirs: set[bytes] = set()     # directories with hard-linked children
        self.filter_key: tuple | None = None     # the Filter's key() the memos were built with
        if self.path is not None:
            self._load(self.path)

    def untrust(self) -> None:
        """The filter changed: every child must be classified again (contents still reused)."""
        for memo in self.dirs.values():
            memo.trusted = False

    def forget_tree(self, rel: bytes) -> None:
        """Drop the memo of directory `rel` and of everything under it."""
        stack = [rel]
        while stack:
            rel = stack.pop()
            memo = self.dirs.pop(rel, None)
            self.left_dirs.discard(rel)
            self.racy_dirs.discard(rel)
            self.linked_dirs.discard(rel)
            if memo is None:
                continue
            prefix = rel + b"/" if rel else b""
            for name, kid in memo.kids.items():
                if kid[STAT] is not None and kid[STAT][0] & _S_IFMT == _S_IFDIR:
                    stack.append(prefix + os.fsencode(name))
        self.changed = True

    def forget_objects(self, ids: set, holds) -> list[bytes]:
        """Objects in `ids` were found damaged: the next snapshot reads again every file whose
        content id is one (or, chunked, whose chunk index `holds(id)` names one) and lists
        again every directory holding such a file or whose tree id is one, so what the
        directory still holds is stored afresh. Returns those directories (for a watcher's
        change map, which would otherwise let the walk skip them)."""
        touched = []
        for rel, memo in self.dirs.items():
            hit = memo.tree_id in ids
            for name, kid in memo.kids.items():
                st = kid[STAT]
                if st is None or st[0] & _S_IFMT == _S_IFDIR or kid[OID] is None:
                    continue
                if kid[OID] in ids or (kid[FLAGS] & FLAG_CHUNKED and holds(kid[OID])):
                    memo.kids[name] = (None, None) + kid[2:]     # no stamp matches: re-read
                    hit = True
            if hit:
                memo.trusted, memo.stamp = False, None
                touched.append(rel)
        if touched:
            self.changed = True
        return touched

    def left_out(self) -> list:
        """Everything the last snapshot left out, sorted by path."""
        out = [t for rel in self.left_dirs for t in self.dirs[rel].left.values()]
        out.sort()
        return out

    @property
    def entries(self) -> dict:
        """path -> (mode, size, mtime_ns, ctime_ns, ino, id or None, flags): the on-disk table."""
        out = {}
        if self.root is not None:
            (mode, _, mtime, ctime, ino), tree_id = self.root
            out[b""] = (mode, 0, mtime, ctime, ino, tree_id, 0)
        for rel, memo in self.dirs.items():
            prefix = rel + b"/" if rel else b""
            for name, kid in memo.kids.items():
                st = kid[STAT]
                if st is None or kid[LEFT] is not None:
                    continue
                mode, size, mtime, ctime, ino = st
                if mode & _S_IFMT == _S_IFDIR:
                    size = 0
                out[prefix + os.fsencode(name)] = (mode, size, mtime, ctime, ino, kid[OID], kid[FLAGS])
        return out

    # -- persistence ----------------------------------------------------------------------
    def save(self) -> None:
        """Write the cache next to itself and rename it into place (a torn write is detected)."""
        if self.path is None or not self.changed:
            return
        # A path longer than the record's u16 length (a step can nest directories that deep) is
        # not saved: a cache, so its file is re-read after a restart, instead of a struct.error
        # failing every save.
        items = sorted((p, e) for p, e in self.entries.items() if len(p) <= 0xFFFF)
        records = [_RECORD.pack(size, mtime, ctime, ino, mode, len(p), flags, oid or _ZERO_ID)
                   for p, (mode, size, mtime, ctime, ino, oid, flags) in items]
        body = b"".join([MAGIC, struct.pack("<I", len(items))] + records + [p for p, _ in items])
        # one way to write a file whole: nothing half-written or left beside it on a full disk
        write_atomic(self.path, body + blake3(body).digest(), sync=False)
        self.changed = False

    def _load(self, path: str | bytes) -> None:
        try:
            with open(path, "rb") as f:
                data = f.read()
                written_ns = os.fstat(f.fileno()).st_mtime_ns
            entries = _decode(data, written_ns)
        except (OSError, ValueError, struct.error):
            return                   # a cache: missing or damaged means "rehash"
        self._rebuild(entries)

    def _rebuild(self, entries: dict) -> None:
        """Memos from the flat table: untrusted (re-encoded next time), contents reusable."""
        dirs = self.dirs
        for path, (mode, size, mtime, ctime, ino, oid, flags) in entries.items():
            st = (mode, size, mtime, ctime, ino)
            is_dir = mode & _S_IFMT == _S_IFDIR
            if is_dir and oid is not None:
                memo = dirs.get(path)
                if memo is None:
                    dirs[path] = DirMemo(oid)
                else:
                    memo.tree_id = oid
            if not path:
                if oid is not None:
                    self.root = (st, oid)
                continue
            parent, _, name = path.rpartition(b"/")
            memo = dirs.get(parent)
            if memo is None:
                memo = dirs[parent] = DirMemo()
            if is_dir and oid is None:
                continue
            memo.kids[os.fsdecode(name)] = (None, st, None, oid, flags, None)


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
