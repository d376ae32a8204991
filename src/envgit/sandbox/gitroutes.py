"""What git reads as configuration or runs as a hook, found from the files themselves.

A repository is found by its `.git` (a directory, or a file `gitdir: PATH` as worktrees and
submodules have). Each gitdir holds files git obeys (GITDIR_ROUTES); `commondir` sends git to
another directory for its config and hooks, and a `.git` file to any directory at all, so both
are followed. The hooks directory named by `core.hooksPath` may come from any config source
(system, ~/.gitconfig, ~/.config/git/config, $XDG_CONFIG_HOME/git/config, the repository,
include/includeIf files), so all are read, once per change of the files read. Only with
`git config` (hostgit.py), never a git command that could run something a step configured; a
repository's files one by one, their includes followed here for core.hooksPath alone.
"""

import os

from . import hostgit
from .hostgit import person_env

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
    """core.hooksPath and the config files it may come from, per worktree top."""

    def __init__(self):
        self._cache: dict[str, tuple] = {}     # top -> (key, hooks dir or None, origin files)

    def get(self, top: str, home: str) -> tuple[str | None, list[str]]:
        """(the hooks directory git would use in `top`, the config files it read)."""
        env = person_env(home)
        c = self._cache.get(top)
        key = self._key(top, home, env, c[2] if c else ())
        if c and c[0] == key:
            return c[1], c[2]
        hooks, origins = _hooks_path(top, home)
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


def find_gitdir(top: str) -> tuple[str, str] | None:
    """(worktree top, gitdir) of the repository `top` is in: its own `.git`, else the nearest
    above it (the project may sit inside a repository)."""
    d = os.path.abspath(top)
    while True:
        dotgit = os.path.join(d, ".git")
        if os.path.lexists(dotgit):
            gd = gitdir_of(dotgit)
            if gd:
                return d, gd
        up = os.path.dirname(d)
        if up == d:
            return None
        d = up


def repo_config_files(gitdir: str) -> list[str]:
    """The repository config files git reads for `gitdir`, in its order."""
    common = commondir_of(gitdir) or gitdir
    return [os.path.join(common, "config"), os.path.join(gitdir, "config.worktree")]


MAX_INCLUDE_DEPTH = 10      # git's own limit


def _hooks_path(top, home):
    """core.hooksPath as git would resolve it in `top`, last one wins, in git's order:
    system and global (the person's, includes resolved by git: a step cannot write them),
    then the repository's files, each read alone by `git config --file --no-includes`
    (hostgit.py: nothing in them can run) with their includes followed here, for that one
    key: a step may point them anywhere, and nothing else of what they hold is used. Every
    file read, and every include named, present or not, is an origin (a route)."""
    hooks, origins = None, []
    found = find_gitdir(top)
    for scope in ("--system", "--global"):
        out = hostgit.person_config(scope, top, home, ["--show-origin"])
        for origin, key, value in hostgit.parse(out or b"", True):
            path = _origin_path(origin, top)
            if path and path not in origins:
                origins.append(path)
            if key.lower() == "core.hookspath" and value:
                hooks = _expand(value, home)
    worktree = found[0] if found else top
    if found:
        for cfg in repo_config_files(found[1]):
            h, wt = _repo_file(cfg, home, origins, 0)
            hooks = h or hooks
            worktree = wt or worktree
    if hooks:
        if not os.path.isabs(hooks):        # relative to the top of the worktree it runs in
            hooks = os.path.join(worktree, hooks)
        hooks = os.path.normpath(hooks)
    return hooks or None, origins


def _repo_file(path, home, origins, depth):
    """(core.hooksPath, core.worktree) set by the repository config file `path` or what it
    includes (the last of each), recording origins."""
    if path not in origins:
        origins.append(path)
    if depth > MAX_INCLUDE_DEPTH or not os.path.isfile(path):
        return None, None
    hooks = worktree = None
    for key, value in hostgit.file_entries(path, home) or []:
        k = key.lower()
        if k == "core.hookspath" and value:
            hooks = _expand(value, home)
        elif k == "core.worktree" and value:
            worktree = os.path.normpath(os.path.join(os.path.dirname(path), _expand(value, home)))
        elif value and (k == "include.path" or k.startswith("includeif.") and k.endswith(".path")):
            # conditions are not evaluated: a hooks directory that may apply is protected
            inc = os.path.normpath(os.path.join(os.path.dirname(path), _expand(value, home)))
            h, w = _repo_file(inc, home, origins, depth + 1)
            hooks, worktree = h or hooks, w or worktree
    return hooks, worktree


def _expand(value, home):
    return os.path.join(home, value[2:]) if value.startswith("~/") else value


def _origin_path(origin, top):
    if not origin or not origin.startswith("file:"):
        return None
    return os.path.normpath(os.path.join(top, origin[5:]))
