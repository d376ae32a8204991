"""Two things the after-step checks (setuid stripping, escape routes) and the before-step
link breaking share: whether a step's snapshot summary lists every path it changed, and
giving a file an inode of its own.
"""

import os


def listed_whole(summary) -> bool:
    """Whether a snapshot summary names every path the step changed: it has a tree, its list
    was not cut short, and nothing was left out by size or an exclude. When not, a check that
    relies on the list must look at the files themselves."""
    summary = summary or {}
    return bool(summary.get("tree")) and not summary.get("paths_truncated") and \
        not (summary.get("left_out") or {}).get("count")


def copy_to_own_inode(path, st, mode, source=None, tag="envgit-copy"):
    """Replace `path` with a copy of its bytes in a new inode (owner and times of `st`, `mode`):
    written beside it, then renamed over it, so the path is whole at every moment and other
    hard links keep the old inode. `source` (a path such as /proc/self/fd/N) is read instead of
    `path` when the caller holds the file open. Raises OSError (with nothing left behind)."""
    tmp = f"{path}.{tag}.{os.getpid()}"
    src = os.open(source or path, os.O_RDONLY | os.O_CLOEXEC | (0 if source else os.O_NOFOLLOW))
    try:
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            while chunk := os.read(src, 1 << 20):
                os.write(dst, chunk)
            if os.geteuid() == 0:
                os.fchown(dst, st.st_uid, st.st_gid)
            os.fchmod(dst, mode)
        finally:
            os.close(dst)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
        os.rename(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        os.close(src)
