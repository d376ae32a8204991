"""The store's list of damaged object copies (docs/FORMAT.md, "Damaged copies").

`objects/damaged` holds one "<object id hex> <pack id hex>" line per copy found damaged (a read
that failed to decompress or verify, fsck, fsck --repair). Any process may find damage while
the daemon keeps the store open, so the daemon reads the file again when its stamp changes
(one stat per snapshot). Writers merge under an flock on the objects directory and replace the
file atomically; lines naming a pack whose file and index are both gone (gc, repair moved it
aside) are dropped then. A reader that finds an object missing (its pack's index does not read,
or the pack is gone) lists every object of that pack the same way (missing.py). The list is
not trusted for ever: fsck re-reads each listed copy and drops the lines of those that verify
(heal.recheck_listed), so a wrong line costs nothing after it. The list only ever keeps a copy
from being used: losing it costs a re-read.
"""

import fcntl
import os

from . import packs

NAME = "damaged"


def read_if_changed(objects) -> set[tuple[bytes, str]]:
    """The copies listed, if the file changed since this store last read it; else empty."""
    path = os.path.join(objects.path, NAME)
    try:
        st = os.stat(path)
    except OSError:
        return set()
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    if stamp == objects._damaged_stamp:
        return set()
    try:
        copies = _read(path)
    except OSError:
        return set()
    objects._damaged_stamp = stamp
    return copies


def record(objects, copies: set[tuple[bytes, str]]) -> None:
    """Add `copies` to the file. Best effort: a store that cannot be written (a reader's
    permissions, a full disk) still keeps them out of its own index."""
    _rewrite(objects, lambda listed: {(oid, p) for oid, p in listed | copies if _kept(objects, p)})


def forget(objects, copies: set[tuple[bytes, str]]) -> None:
    """Drop `copies` from the file (fsck found they read back sound). Best effort."""
    _rewrite(objects, lambda listed: listed - copies)


def _rewrite(objects, change) -> None:
    """The file's lines replaced by change(its lines), under a flock on the objects directory
    (two processes never lose each other's lines); written only when they changed."""
    path = os.path.join(objects.path, NAME)
    try:
        fd = os.open(objects.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            listed = _read(path)
        except FileNotFoundError:
            listed = set()
        keep = change(listed)
        if keep == listed:
            return
        text = "".join(f"{oid.hex()} {p}\n" for oid, p in sorted(keep))
        packs.write_file_atomically(objects.tmp_dir, path, text.encode())
    except OSError:
        return
    finally:
        os.close(fd)        # (closing releases the lock)


def _kept(objects, pack_id: str) -> bool:
    """A line stays while its pack or its index exists (a pack gone under its index still
    has readers to warn: missing.py)."""
    return any(os.path.exists(packs.pack_path(objects.packs_dir, pack_id, ext)) for ext in (".pack", ".idx"))


def _read(path: str) -> set[tuple[bytes, str]]:
    copies = set()
    with open(path, "rb") as f:
        for line in f.read().decode("ascii", "replace").splitlines():
            parts = line.split()
            if len(parts) == 2 and len(parts[0]) == 64 and len(parts[1]) == 64:
                try:
                    copies.add((bytes.fromhex(parts[0]), parts[1]))
                except ValueError:
                    continue           # a torn or edited line: the rest still count
    return copies
