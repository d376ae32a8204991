"""No Python from the project: the import path of every Python process envgit starts on the host.

The session daemon (and an agent's hook or exec server) runs outside any sandbox, often as
root, and a step can write anywhere in the project. `python -m envgit.daemon` with the project
as working directory would put the project first on sys.path: a planted `envgit/__init__.py`
(or a file named like a standard-library module) would run as the daemon. So envgit starts
them with `-P` (no working directory or script directory on sys.path) from "/" (PYTHON_ARGS),
and, as a second wall, the daemon refuses to run when any sys.path entry is inside the project
(an envgit installed into the project's own virtualenv, a PYTHONPATH naming the project): a
step could rewrite the daemon's code there. Standard library only (the client imports it).
"""

import os
import sys

from .paths import inside

PYTHON_ARGS = ("-P",)       # argv after sys.executable for `-m envgit.…`
SPAWN_CWD = "/"


def project_entries(root: str, path=None) -> list[str]:
    """The entries of sys.path (or `path`) that are the project or inside it, or would be
    ("" and "." are the working directory)."""
    roots = {os.path.realpath(root), os.path.abspath(root)}
    out = []
    for entry in sys.path if path is None else path:
        # the name as given too: a symlink in the project (a venv's bin/python) is replaceable
        names = {os.path.abspath(entry or "."), os.path.realpath(entry or ".")}
        if any(inside(n, r) for n in names for r in roots):
            out.append(entry or "(the working directory)")
    return out


def refusal(root: str, entries: list[str]) -> str:
    return (f"envgit's Python imports code from inside the project {root} ({', '.join(entries)}), "
            "which any step can rewrite, and the session daemon runs outside the sandbox; "
            "install envgit outside the project (pipx, a virtualenv elsewhere) and clear "
            "PYTHONPATH of project directories")


def envgit_dir() -> str:
    """The directory envgit is imported from (the parent of the `envgit` package)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spawn_path() -> list[str]:
    """What a spawned envgit Python runs and is told to import from beyond its site
    directories: the interpreter itself (a project venv's python a step can replace), envgit's
    own directory, PYTHONPATH."""
    return [sys.executable, envgit_dir(),
            *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]


def spawn_env() -> dict:
    """The environment for a spawned envgit Python: the caller's, with the directory envgit was
    imported from named on PYTHONPATH when only the working directory made it importable
    (running from a source tree), since the child starts in "/" with -P."""
    env = dict(os.environ)
    pkg_parent = envgit_dir()
    if os.path.realpath(pkg_parent) not in {os.path.realpath(p) for p in sys.path if p}:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    return env
