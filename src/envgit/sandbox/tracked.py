"""Denied files that git tracks: a limit said, not a hole closed.

A deny masks a file's name in the working tree, but a step needs git's object store to run git
at all, and every committed version of a file is in it: `git show HEAD:.env` prints a denied
.env that was ever committed. envgit cannot hide one object among the others, so it says so:
`envgit policy check` lists them, and the first step of a session tells its terminal. The fix
is the person's: untrack the file and rotate what it held (it is in the history too).

The index is read here, not by git: the daemon runs on the host, often as root, and any git
command that reads the index obeys a config a step can write or redirect (core.fsmonitor runs
a program on every index read; a partial clone's lazy fetch runs a remote helper). Parsing the
file runs nothing, whatever the repository holds (hostgit.py says which git the daemon runs).
Index versions 2, 3 and 4, SHA-1 and SHA-256, and a split index's shared part are read; a
sparse index's directory entries stand for the files under them; a file only in HEAD (untracked
but not yet committed so) is not listed.
"""

import os
import struct

from ..inert import some
from ..policy import is_denied, resolve
from . import hostgit
from .gitroutes import commondir_of, find_gitdir

MAX_INDEX_BYTES = 256 * 1024 * 1024


def tracked_denied(pol, project: str, home: str) -> list[str]:
    """Project paths denied by the policy that git tracks (in the index)."""
    rules = resolve(pol, project, home)
    found = find_gitdir(project)
    if not found:
        return []
    top, gitdir = found
    names = index_names(gitdir, home)
    prefix = "" if top == project else os.path.relpath(project, top) + "/"
    out = set()
    for n in names:
        if n.startswith(prefix):
            out.add(n[len(prefix):].rstrip("/"))
    return sorted(n for n in out if n and is_denied(rules, os.path.join(project, n)))


def index_names(gitdir: str, home: str = "") -> set[str]:
    """The paths git's index in `gitdir` lists (empty if there is none or it cannot be read)."""
    hash_len = 32 if _object_format(gitdir, home) == "sha256" else 20
    names, shared = _read_index(os.path.join(gitdir, "index"), hash_len)
    if shared:
        names |= _read_index(os.path.join(gitdir, f"sharedindex.{shared}"), hash_len)[0]
    return names


def _object_format(gitdir, home):
    cfg = os.path.join(commondir_of(gitdir) or gitdir, "config")
    for key, value in hostgit.file_entries(cfg, home) or []:
        if key.lower() == "extensions.objectformat" and value:
            return value.lower()
    return "sha1"


def _read_index(path, hash_len) -> tuple[set, str | None]:
    """(names, the shared index's hex id when this is a split index), read by the snapshot's git
    view's index parser (one reader of git's index format in envgit)."""
    from ..snapshot.gitrepo import Unreadable, _parse_index
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_INDEX_BYTES)
    except OSError:
        return set(), None
    try:
        entries, shared = _parse_index(data, hash_len)
    except (Unreadable, IndexError, ValueError, struct.error):
        return set(), None          # damaged or a format this does not know: nothing said
    return {n.decode("utf-8", "surrogateescape") for n in entries}, shared


def warning(paths: list[str]) -> str:
    shown = some(paths, 10)
    return (f"denied to steps but tracked by git, so readable from its object store "
            f"(git show HEAD:PATH): {shown}; untrack them (git rm --cached) and rotate what "
            f"they hold, which stays in the history")
