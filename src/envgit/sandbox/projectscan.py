"""Finding the project files a glob deny (`**/.env`) closes, before every step, cheaply.

A directory's mtime changes whenever an entry is added, removed or renamed in it, so a
directory whose (inode, mtime) is unchanged since the last scan still holds the same names:
only one lstat per directory is paid, never one per file (git's untracked cache works the
same way). A directory modified less than RACY_NS before it was listed is listed again next
time: the kernel stamps mtimes from a clock that may lag by a jiffy (at most 10 ms), so a
change just after the listing could carry the same mtime. 50 ms covers that with margin.
"""

import os
import time

from ..policy.decide import _rx

RACY_NS = 50_000_000
SKIP = {".envgit", ".git/objects"}


class ProjectScan:
    def __init__(self, root: str):
        self.root = root
        self._dirs: dict[str, tuple] = {}      # rel dir -> (ino, mtime_ns, patterns, subdirs, hits)

    def matches(self, rules) -> list[str]:
        """Absolute paths in the project that a project-glob deny names (dirs not descended)."""
        patterns = tuple(p for p, _ in rules.deny_rel)
        if not patterns:
            return []
        out, stack, now = [], [""], time.time_ns()
        seen = set()
        while stack:
            rel = stack.pop()
            seen.add(rel)
            path = os.path.join(self.root, rel) if rel else self.root
            try:
                st = os.lstat(path)
            except OSError:
                continue
            c = self._dirs.get(rel)
            if c and c[0] == st.st_ino and c[1] == st.st_mtime_ns and c[2] == patterns:
                subdirs, hits = c[3], c[4]
            else:
                subdirs, hits = self._list(path, rel, patterns)
                if now - st.st_mtime_ns > RACY_NS:
                    self._dirs[rel] = (st.st_ino, st.st_mtime_ns, patterns, subdirs, hits)
                else:
                    self._dirs.pop(rel, None)
            out += [os.path.join(self.root, h) for h in hits]
            stack += subdirs
        for gone in self._dirs.keys() - seen:
            del self._dirs[gone]
        return out

    @staticmethod
    def _list(path, rel, patterns):
        subdirs, hits = [], []
        rxs = [_rx(p) for p in patterns]
        try:
            entries = list(os.scandir(path))
        except OSError:
            return (), ()
        for e in entries:
            r = f"{rel}/{e.name}" if rel else e.name
            if any(rx.match(r) for rx in rxs):
                hits.append(r)
            elif e.is_dir(follow_symlinks=False) and r not in SKIP:
                subdirs.append(r)
        return tuple(subdirs), tuple(hits)
