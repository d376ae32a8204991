"""What git reads as configuration or runs as a hook, found from the files themselves.

A repository is found by its `.git` (a directory, or a file `gitdir: PATH` as worktrees and
submodules have). Each gitdir holds files git obeys (GITDIR_ROUTES); `commondir` sends git to
another directory for its config and hooks, and a `.git` file to any directory at all, so both
are followed. The hooks directory named by `core.hooksPath` may come from any config source
(system, ~/.gitconfig, ~/.config/git/config, $XDG_CONFIG_HOME/git/config, the repository,
include/includeIf files), so git itself is asked, once per change of the files it read.
"""

import os
import subprocess

from .gitconfig import GIT_TIMEOUT_S, git_env

GITDIR_ROUTES = ("config", "config.worktree", "hooks", "commondir", "info/attributes", "branches",
                 "remotes")


def gitdir_of(dotgit: str) -> str | None:
    """The gitdir a `.git` entry names: itself (a directory) or the target of a `.git` file."""
    if os.path.isdir(dotgit) and not os.path.islink(dotgit):
        return dotgit
    try:
        with open(dotgit, "rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    for line in head.splitlines():
        if line.startswith("gitdir:"):
            target = line[len("gitdir:"):].strip()
            return os.path.normpath(os.path.join(os.path.dirname(dotgit), target))
    return None


def commondir_of(gitdir: str) -> str | None:
    try:
        with open(os.path.join(gitdir, "commondir"), "rb") as f:
            target = f.read(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    return os.path.normpath(os.path.join(gitdir, target)) if target else None


def gitdir_routes(gitdir: str) -> list[str]:
    """The paths in `gitdir` git obeys, present or not."""
    return [os.path.join(gitdir, r) for r in GITDIR_ROUTES]


class HooksPaths:
    """core.hooksPath and the config files git read, per worktree top, asked of git."""

    def __init__(self):
        self._cache: dict[str, tuple] = {}     # top -> (key, hooks dir or None, origin files)

    def get(self, top: str, home: str) -> tuple[str | None, list[str]]:
        """(the hooks directory git would use in `top`, the config files it read)."""
        env = git_env(home)
        c = self._cache.get(top)
        key = self._key(top, home, env, c[2] if c else ())
        if c and c[0] == key:
            return c[1], c[2]
        hooks, origins = _ask_git(top, home, env)
        self._cache[top] = (self._key(top, home, env, origins), hooks, origins)
        return hooks, origins

    @staticmethod
    def _key(top, home, env, origins):
        xdg = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
        files = [os.path.join(top, ".git"), os.path.join(top, ".git", "config"),
                 os.path.join(top, ".git", "commondir"), os.path.join(top, ".git", "config.worktree"),
                 "/etc/gitconfig", os.path.join(home, ".gitconfig"), os.path.join(xdg, "git", "config"),
                 env.get("GIT_CONFIG_GLOBAL", ""), env.get("GIT_CONFIG_SYSTEM", ""), *origins]
        out = []
        for p in files:
            try:
                st = os.stat(p) if p else None
            except OSError:
                st = None
            out.append(st and (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        return tuple(out)


def _ask_git(top, home, env):
    try:
        r = subprocess.run(["git", "-c", "safe.directory=*", "-C", top, "config", "--list",
                            "--show-origin", "-z"], env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None, []
    if r.returncode not in (0, 1):
        return None, []
    parts = r.stdout.split(b"\0")
    hooks, origins = None, []
    for origin, rec in zip(parts[0::2], parts[1::2]):
        o = origin.decode("utf-8", "surrogateescape")
        if o.startswith("file:"):
            path = os.path.normpath(os.path.join(top, o[5:]))
            if path not in origins:
                origins.append(path)
        key, _, value = rec.partition(b"\n")
        k = key.lower()
        if k == b"core.hookspath":
            hooks = value.decode("utf-8", "surrogateescape")
        elif (k == b"include.path" or k.startswith(b"includeif.") and k.endswith(b".path")) and \
                o.startswith("file:"):
            # an included file git skips while it is missing is read once it exists: it is a
            # route whether or not it is there yet
            inc = value.decode("utf-8", "surrogateescape")
            inc = os.path.join(home, inc[2:]) if inc.startswith("~/") else inc
            inc = os.path.normpath(os.path.join(os.path.dirname(path), inc))
            if inc not in origins:
                origins.append(inc)
    if hooks:
        hooks = os.path.join(home, hooks[2:]) if hooks.startswith("~/") else hooks
        if not os.path.isabs(hooks):        # relative to the top of the worktree it runs in
            hooks = os.path.join(_toplevel(top, env) or top, hooks)
        hooks = os.path.normpath(hooks)
    return hooks or None, origins


def _toplevel(top, env):
    try:
        r = subprocess.run(["git", "-c", "safe.directory=*", "-C", top, "rev-parse", "--show-toplevel"],
                           env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    out = r.stdout.decode("utf-8", "surrogateescape").strip()
    return out if r.returncode == 0 and out else None
