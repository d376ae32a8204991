"""Denied files that git tracks: a limit said, not a hole closed.

A deny masks a file's name in the working tree, but a step needs git's object store to run git
at all, and every committed version of a file is in it: `git show HEAD:.env` prints a denied
.env that was ever committed. envgit cannot hide one object among the others, so it says so:
`envgit policy check` lists them, and the first step of a session tells its terminal. The fix
is the person's: untrack the file and rotate what it held (it is in the history too).
"""

import os
import subprocess

from ..policy import is_denied, resolve


def tracked_denied(pol, project: str, home: str) -> list[str]:
    """Project paths denied by the policy that git tracks (the index or HEAD)."""
    rules = resolve(pol, project, home)
    names = set()
    for args in (["ls-files", "-z", "--cached"], ["ls-tree", "-r", "-z", "--name-only", "HEAD"]):
        try:
            r = subprocess.run(["git", "-c", "safe.directory=*", "-C", project, *args],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            names.update(n.decode("utf-8", "surrogateescape") for n in r.stdout.split(b"\0") if n)
    return sorted(n for n in names if is_denied(rules, os.path.join(project, n)))


def warning(paths: list[str]) -> str:
    shown = ", ".join(paths[:10]) + (f" and {len(paths) - 10} more" if len(paths) > 10 else "")
    return (f"denied to steps but tracked by git, so readable from its object store "
            f"(git show HEAD:PATH): {shown}; untrack them (git rm --cached) and rotate what "
            f"they hold, which stays in the history")
