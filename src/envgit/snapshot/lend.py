"""Opening what the user owns but has shut themselves out of.

A step may `chmod 000` a file or directory of its own (a build tool, a test of permissions, an
agent). Root reads and writes it whatever its mode; an unprivileged user does not, and without
help one such entry would fail every later snapshot, and a rewind could not write under it. Both
lend the owner the bits they need (read, search, write) for the open and put the exact mode back:
a file's at once, a directory's when the snapshot or rewind ends (`give_back`), since entries
are opened through it until then. Each entry is pinned first by an O_PATH descriptor and checked
(ours, a regular file or directory), so the mode lent is that of the inode checked, never of
whatever a racing rename put at the name. The snapshot records the mode it found (the lstat of
the listing), not the one lent. A kill -9 in between leaves the lent bits on a directory: more
open than the step left it, never less, and the next snapshot records what it then finds.
"""

import errno
import os
import stat


def open_lending(name, flags: int, dir_fd: int, lent: list, need: int) -> int:
    """os.open(name, flags, dir_fd=dir_fd); on EACCES, for an entry we own, with the owner
    bits `need` (e.g. 0o500) lent. A directory lent is appended to `lent` (see give_back)."""
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except PermissionError:
        if os.geteuid() == 0:
            raise
    pinned = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    keep = False
    try:
        st = os.fstat(pinned)
        is_dir = stat.S_ISDIR(st.st_mode)
        if st.st_uid != os.geteuid() or not (is_dir or stat.S_ISREG(st.st_mode)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)
        via = f"/proc/self/fd/{pinned}"
        mode = stat.S_IMODE(st.st_mode)
        os.chmod(via, mode | need)
        if is_dir:
            lent.append((pinned, mode))
            keep = True
            return os.open(via, flags & ~os.O_NOFOLLOW)
        try:
            return os.open(via, flags & ~os.O_NOFOLLOW)
        finally:
            os.chmod(via, mode)
    finally:
        if not keep:
            os.close(pinned)


def give_back(lent: list, keep=lambda pinned: False) -> None:
    """Put back the modes lent to directories, deepest first. `keep(pinned)`: true for one whose
    mode was since set on purpose (a rewind writing the directory's own mode)."""
    while lent:
        pinned, mode = lent.pop()
        try:
            if not keep(pinned):
                os.chmod(f"/proc/self/fd/{pinned}", mode)
        except OSError:
            pass                    # removed meanwhile: nothing to put back
        finally:
            os.close(pinned)
