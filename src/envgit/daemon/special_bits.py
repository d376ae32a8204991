"""After a step: no file it made or changed keeps a setuid or setgid bit.

The seccomp filter (sandbox/seccomp.py) already refuses every call that would set one inside a
step; this is the second line, for what the filter does not see: a machine whose architecture
has no filter, a kernel call it does not know, a bit that reached the project between steps.
A setuid-root program in the project is a root shell for every user of the host (bwrap's
nosuid mounts hold only inside the sandbox), so the bit is removed, the file and its other mode
bits kept, and the step marked `setuid-stripped`.

The files looked at are the step's changed paths from its snapshot; when that list is not
whole (truncated, files left out by size or exclude, names shown escaped), the project is
searched with find(1) instead.
"""

import os
import stat
import subprocess

from ..changes import copy_to_own_inode, listed_whole

SPECIAL = stat.S_ISUID | stat.S_ISGID


async def after_step(root: str, summary: dict) -> list[str]:
    """strip(), on the daemon's loop when the step's list of changes is whole (a few µs a
    path: cheaper than a thread hop, ~80 µs), in a thread when the project must be searched."""
    if listed_whole(summary or {}):
        return strip(root, summary)
    import asyncio
    return await asyncio.to_thread(strip, root, summary)


def strip(root: str, summary: dict) -> list[str]:
    """Remove setuid/setgid from the regular files among the step's changes; the project-relative
    paths it removed them from."""
    summary = summary or {}
    listed = [p.get("path", "") for p in summary.get("paths", []) if p.get("status") != "deleted"]
    out, unsure = [], not listed_whole(summary)
    for rel in listed:
        done = _strip_one(os.path.join(root, rel))
        if done is None:
            unsure = True                   # not found as listed (an escaped name): search
        elif done:
            out.append(rel)
    if unsure:
        for path in _find_special(root):
            if _strip_one(path):
                out.append(os.path.relpath(path, root))
    return sorted(set(out))


def _strip_one(path) -> bool | None:
    """True if the bits were removed, False if there were none, None if `path` is not there.
    Through an O_PATH fd, never following a symlink (the daemon runs as the person: a file
    without read permission is still theirs to chmod)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & SPECIAL:
            return False
        if st.st_nlink > 1:
            # a hard link to a file elsewhere (a root step may link /usr/bin/passwd in): its
            # mode is that file's too, so the project's name gets a copy of its own instead
            return _unshare_without_bits(path, fd, st)
        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) & ~SPECIAL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _unshare_without_bits(path, fd, st) -> bool:
    """Replace the link `path` with a copy of the file, mode less the special bits."""
    try:
        copy_to_own_inode(path, st, stat.S_IMODE(st.st_mode) & ~SPECIAL, source=f"/proc/self/fd/{fd}",
                          tag="envgit-unshare")
        return True
    except OSError:
        return False


def _find_special(root):
    from ..sandbox.launch import LaunchError, trusted_binary
    try:
        find = trusted_binary("find")       # never from PATH: this runs outside the sandbox
    except LaunchError:
        return _walk_special(root)
    try:
        r = subprocess.run([find, root, "-type", "f", "-perm", "/6000", "-print0"],
                           capture_output=True, timeout=600, env={"LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return _walk_special(root)
    return [os.fsdecode(p) for p in r.stdout.split(b"\0") if p]


def _walk_special(root):
    out = []
    for d, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            try:
                m = os.lstat(p).st_mode
            except OSError:
                continue
            if stat.S_ISREG(m) and m & SPECIAL:
                out.append(p)
    return out
