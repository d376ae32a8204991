"""Finding the project files a glob names (a deny like `**/.env`, an escape route like
`**/.git/config` or `**/.npmrc`), before and after every step, cheaply.

A directory's mtime changes whenever an entry is added, removed or renamed in it, so a
directory whose (inode, mtime) is unchanged since the last scan still holds the same names:
only one lstat per directory is paid, never one per file (git's untracked cache works the
same way). A directory modified less than RACY_NS before it was listed is listed again next
time: the kernel stamps mtimes from a clock that may lag by a jiffy (at most 10 ms), so a
change just after the listing could carry the same mtime. 50 ms covers that with margin.

Two kinds of pattern: a `stop` hit (a denied path) is not descended, it is masked whole; a
`find` hit (an escape route) is, so that `.git` is found and `.git/config` inside it too. A
repository's object store is never descended (`objects` under a `.git`): it is large and
holds nothing git runs.
"""

import os
import re
import time
from typing import TYPE_CHECKING

from ..policy.decide import _rx

if TYPE_CHECKING:
    from .routes import RouteSet

RACY_NS = 50_000_000
SKIP = {".envgit"}


class ProjectScan:
    def __init__(self, root: str):
        self.root = root
        # rel dir -> (ino, mtime_ns, key, subdirs, stop hits, find hits)
        self._dirs: dict[str, tuple] = {}
        self.routes: RouteSet | None = None   # the escape routes seen by the last view built

    def matches(self, rules) -> list[str]:
        """Absolute paths in the project that a project-glob deny names (dirs not descended)."""
        stop, _ = self.scan(tuple(p for p, _ in rules.deny_rel), ())
        return [os.path.join(self.root, h) for h in stop]

    def scan(self, stop: tuple, find: tuple) -> tuple[list[str], list[str]]:
        """(relative paths a `stop` pattern names, relative paths a `find` pattern names)."""
        if not stop and not find:
            return [], []
        key = (stop, find)
        stop_rx, find_rx = _alternation(stop), _alternation(find)
        out_stop, out_find, stack, now = [], [], [""], time.time_ns()
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
            if c and c[0] == st.st_ino and c[1] == st.st_mtime_ns and c[2] == key:
                subdirs, hits, found = c[3], c[4], c[5]
            else:
                subdirs, hits, found = self._list(path, rel, stop_rx, find_rx)
                if now - st.st_mtime_ns > RACY_NS:
                    self._dirs[rel] = (st.st_ino, st.st_mtime_ns, key, subdirs, hits, found)
                else:
                    self._dirs.pop(rel, None)
            out_stop += hits
            out_find += found
            stack += subdirs
        for gone in self._dirs.keys() - seen:
            del self._dirs[gone]
        return out_stop, out_find

    @staticmethod
    def _list(path, rel, stop_rx, find_rx):
        subdirs, hits, found = [], [], []
        try:
            entries = list(os.scandir(path))
        except OSError:
            return (), (), ()
        in_git = rel == ".git" or rel.startswith(".git/") or "/.git/" in f"/{rel}/"
        for e in entries:
            r = f"{rel}/{e.name}" if rel else e.name
            if stop_rx and stop_rx(r):
                hits.append(r)
                continue
            if find_rx and find_rx(r):
                found.append(r)
            if e.is_dir(follow_symlinks=False) and r not in SKIP and not (in_git and e.name == "objects"):
                subdirs.append(r)
        return tuple(subdirs), tuple(hits), tuple(found)


def _alternation(patterns):
    """One regex for many globs: a single C-level match per name instead of one per pattern."""
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{_rx(p).pattern})" for p in patterns), re.DOTALL).match
