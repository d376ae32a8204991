"""What a step of a project can write on the host: a host command's program or PATH entry there
would be the step's choice (run.py), and so would an approvals file there (trust.py)."""

import os

from ..paths import inside as _inside


def project_root(policy) -> str:
    return os.path.realpath(os.path.dirname(os.path.abspath(policy.path)))


def step_writable(policy, path: str, environ) -> bool:
    """Could a step of this policy's project write `path` (or what it resolves to) on the
    host: the project, an allow_write, the project's package cache? (The sandbox's /tmp is
    the session's own, inside .envgit/: the host's /tmp is not a step's to write.)"""
    from ..policy import decide_path
    root = project_root(policy)
    home = environ.get("HOME") or os.path.expanduser("~")
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    for p in {os.path.normpath(path), os.path.realpath(path)}:
        d = decide_path(policy, p, root, home)
        if _inside(p, root) or _inside(p, os.path.join(os.path.normpath(cache), "envgit")) or \
                (d.access == "write" and d.rule != "the per-session /tmp"):
            return True
    return False
