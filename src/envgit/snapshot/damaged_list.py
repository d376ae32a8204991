"""The store's list of damaged object copies (docs/FORMAT.md, "Damaged copies").

`objects/damaged` holds one "<object id hex> <pack id hex>" line per copy found damaged (a read
that failed to decompress or verify, fsck, fsck --repair). Any process may find damage while
the daemon keeps the store open, so the daemon reads the file again when its stamp changes
(one stat per snapshot). Writers merge under an flock on the objects directory and replace the
file atomically; lines naming a pack that no longer exists (gc, repair moved it aside) are
dropped then. The list only ever keeps a copy from being used: losing it costs a re-read.
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
        keep = {(oid, p) for oid, p in listed | copies
                if os.path.exists(packs.pack_path(objects.packs_dir, p, ".pack"))}
        if keep == listed:
            return
        text = "".join(f"{oid.hex()} {p}\n" for oid, p in sorted(keep))
        packs.write_file_atomically(objects.tmp_dir, path, text.encode())
    except OSError:
        return
    finally:
        os.close(fd)        # (closing releases the lock)


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
