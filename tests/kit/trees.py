"""A directory as everything a rewind, a restore or an adopt must give back, for tests to
compare."""

import os
import stat


def tree_of(root, skip=(".envgit",)) -> dict:
    """Every path under `root` -> what a rewind must give back: a file's mode and bytes, a
    symlink's target, a directory's mode."""
    out = {}
    root = os.fspath(root)
    for d, dirs, files in os.walk(root):
        rel_d = os.path.relpath(d, root)
        dirs[:] = [x for x in dirs if not (rel_d == "." and x in skip)]
        for name in dirs + files:
            p = os.path.join(d, name)
            rel = os.path.normpath(os.path.join(rel_d, name))
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", st.st_mode & 0o7777)
            else:
                with open(p, "rb") as f:
                    out[rel] = ("file", st.st_mode & 0o7777, f.read())
    return out
