"""Other names of denied files, remembered: judged by identity, not by the name a deny matches.

A deny matches names. A step can arrange, while a denied name is still empty, for the
person's secret to land at a second name no deny matches: a hard link made to the file
(`ln secrets/token.txt notes.txt`), or a symlinked directory in front of it (`ln -s stash
config`, so `config/master.key` is written as `stash/master.key`). The view (view.py) finds
such names when it masks the denied one and records each here with the file's (dev, inode);
from then on:
  - every later step masks it while the same file is there (even once the symlink in front
    is gone and no deny names it any more), and pins its parents like any masked path;
  - `envgit diff`, `show` and the ui withhold its content in every snapshot (view/
    secrets.py Secrets), since a snapshot taken meanwhile holds the secret under that name.

The record is `.envgit/sandbox/denied-aliases`: NUL-separated `dev:ino:absolute path`
entries, only ever added to (a name once a way to a secret stays withheld in history)."""

import os
import stat

from ..atomicfile import write_atomic

NAME = "denied-aliases"


def _path(state_dir: str) -> str:
    return os.path.join(state_dir, "sandbox", NAME)


def load(state_dir: str) -> dict[str, tuple[int, int]]:
    """{absolute path: (dev, ino) of the denied file it was found to be}."""
    try:
        with open(_path(state_dir), "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        dev, _, rest = item.partition(b":")
        ino, _, path = rest.partition(b":")
        if dev.isdigit() and ino.isdigit() and path:
            out[os.fsdecode(path)] = (int(dev), int(ino))
    return out


def record(state_dir: str, known: dict, found: dict) -> None:
    """Add `found` ({path: (dev, ino)}) to the record `known` (as load gave it)."""
    new = {p: i for p, i in found.items() if known.get(p) != i}
    if not new:
        return
    merged = {**known, **new}
    data = b"\0".join(b"%d:%d:%s" % (d, i, os.fsencode(p)) for p, (d, i) in sorted(merged.items()))
    os.makedirs(os.path.dirname(_path(state_dir)), exist_ok=True)
    write_atomic(_path(state_dir), data, 0o600)
    known.update(new)


def still_there(path: str, ident: tuple[int, int]) -> bool:
    """Is the file recorded at `path` still the one there (not a symlink, same inode)?"""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == ident and not stat.S_ISLNK(st.st_mode)
