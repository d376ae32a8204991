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
import re

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


def looks_like_gitdir(d: str) -> bool:
    """Whether git would take directory `d` for a repository of its own when run in or below
    it with no `.git` in the way (or a `.git` whose HEAD does not parse): a HEAD file beside
    `objects`/`refs` (or a `commondir`), git's own test (setup.c is_git_directory), loosely.
    A step can make one anywhere (`src/HEAD`, `src/refs`, `src/config`), and then the person's
    `git status` under it obeys that `config`."""
    head = os.path.join(d, "HEAD")
    if not (os.path.isfile(head) or os.path.islink(head)):     # git takes a link into refs/ too
        return False
    return os.path.isdir(os.path.join(d, "refs")) or os.path.isdir(os.path.join(d, "objects")) \
        or os.path.isfile(os.path.join(d, "commondir"))


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
    """(core.hooksPath as git would resolve it in `top`, the routes git's configuration
    names). Last one wins, in git's order: system and global (the person's, includes resolved
    by git: a step cannot write them), then the repository's files, each read alone by `git
    config --file --no-includes` (hostgit.py: nothing in them can run) with their includes
    followed here, then the command scope (GIT_CONFIG_COUNT/…, GIT_CONFIG_PARAMETERS of the
    `envgit run` that started the daemon). Every file read and every include named, present
    or not, is a route; so is every path a key that runs a program names (program_paths): a
    fsmonitor script, a filter, a pager, a credential helper the config points into the
    project is what the person's next git runs."""
    hooks, origins = None, []
    found = find_gitdir(top)
    worktree = found[0] if found else top
    person = person_entries(top, home)
    for scope, origin, key, value in person:
        if scope == "command":
            continue
        _note(origin, key, value, top, home, origins, worktree)
        if key.lower() == "core.hookspath" and value:
            hooks = _expand(value, home)
    if found:
        for cfg in repo_config_files(found[1]):
            h, wt = _repo_file(cfg, home, origins, 0, worktree)
            hooks = h or hooks
            worktree = wt or worktree
    for scope, origin, key, value in person:
        if scope == "command":
            _note(origin, key, value, top, home, origins, worktree)
            if key.lower() == "core.hookspath" and value:
                hooks = _expand(value, home)
    if hooks:
        if not os.path.isabs(hooks):        # relative to the top of the worktree it runs in
            hooks = os.path.join(worktree, hooks)
        hooks = os.path.normpath(hooks)
    return hooks or None, origins


def person_entries(top, home) -> list:
    """[(scope, origin, key, value)] of the person's configuration as git reads it: system,
    global (~/.gitconfig, the XDG file, $GIT_CONFIG_GLOBAL), command, each with what it
    includes. Asked of git itself with the person's HOME and environment (hostgit.person_env),
    from nowhere (GIT_DIR=/dev/null): the repository's own files are read one by one below,
    never with their includes resolved on the host. `includeIf` conditions then fail (no
    repository), so the files they name are read here, unconditionally, as the repository's
    are: a route that may apply is protected."""
    env = {**hostgit.person_env(home), "GIT_DIR": os.devnull}
    out = hostgit.config_list(["--show-scope", "--show-origin", "--includes"], "/", env)
    res = []
    for scope, origin, key, value in hostgit.parse_scoped(out or b""):
        res.append((scope, origin, key, value))
        k = key.lower()
        if value and k.startswith("includeif.") and k.endswith(".path"):
            base = os.path.dirname(_origin_path(origin, top) or "/")
            inc = os.path.normpath(os.path.join(base, _expand(value, home)))
            for key2, value2 in _conditional(inc, home, 0):
                res.append((scope, "file:" + inc, key2, value2))
    return res


def _conditional(path, home, depth) -> list:
    """A file an includeIf names: its entries and those of what it includes, read alone."""
    if depth > MAX_INCLUDE_DEPTH or not os.path.isfile(path):
        return []
    out = []
    for key, value in hostgit.file_entries(path, home) or []:
        out.append((key, value))
        k = key.lower()
        if value and (k == "include.path" or k.startswith("includeif.") and k.endswith(".path")):
            inc = os.path.normpath(os.path.join(os.path.dirname(path), _expand(value, home)))
            out += _conditional(inc, home, depth + 1)
    return out


def _note(origin, key, value, top, home, origins, worktree):
    """Record the origin file of one person's entry and the routes its value names."""
    path = _origin_path(origin, top)
    if path and path not in origins:
        origins.append(path)
    base = os.path.dirname(path) if path else top
    for p in program_paths(key, value, home, worktree, base):
        if p not in origins:
            origins.append(p)


# Keys whose value is a program git runs (or a file naming one: the attributes and excludes
# files, an include), beyond core.hooksPath. A path such a value names inside a writable place
# is a route: git runs it for the person later. Broad on purpose: protecting a file the
# person's config merely names costs nothing.
_PROGRAM_KEY = re.compile(r"""(
      core\.(fsmonitor|pager|editor|sshcommand|askpass|gitproxy|attributesfile|excludesfile)
    | sequence\.editor | diff\.external | diff\..+\.(command|textconv) | .+\.textconv
    | (difftool|mergetool|browser|man)\..+\.(cmd|path) | merge\..+\.driver
    | filter\..+\.(clean|smudge|process) | credential\.(.+\.)?helper | gpg\.(.+\.)?program
    | pager\..+ | alias\..+ | interactive\.difffilter | uploadpack\.packobjectshook
    | remote\..+\.(uploadpack|receivepack|proxy) | web\.browser | guitool\..+\.cmd
    | sendemail\.(.+\.)?(smtpserver|sendmailcmd|tocmd|cccmd|headercmd)
    | include\.path | includeif\..+\.path
)\Z""", re.X | re.I)


def program_paths(key, value, home, worktree, config_dir) -> list[str]:
    """The paths a program-running key's value names: every word that reads as a path
    ('/…', './…', '~/…', 'a/b'), relative ones from the worktree's top (where git runs
    them; an include from the file's own directory). A bare name is found on PATH: not a
    path a step writes unless the person's PATH runs through the project (THREATS.md)."""
    if not value or not _PROGRAM_KEY.match(key):
        return []
    import shlex
    try:
        words = shlex.split(value.lstrip("!"))
    except ValueError:
        words = value.lstrip("!").split()
    k = key.lower()
    base = config_dir if k == "include.path" or k.startswith("includeif.") else worktree
    out = []
    for w in words:
        w = w.split("=", 1)[1] if w.startswith("--") and "=" in w else w
        if not (w.startswith(("/", "./", "../", "~/")) or "/" in w) or "://" in w:
            continue
        w = _expand(w, home)
        out.append(os.path.normpath(w if os.path.isabs(w) else os.path.join(base, w)))
    return out


def _repo_file(path, home, origins, depth, worktree):
    """(core.hooksPath, core.worktree) set by the repository config file `path` or what it
    includes (the last of each), recording origins and the routes its values name."""
    if path not in origins:
        origins.append(path)
    if depth > MAX_INCLUDE_DEPTH or not os.path.isfile(path):
        return None, None
    hooks = wt = None
    for key, value in hostgit.file_entries(path, home) or []:
        k = key.lower()
        for p in program_paths(key, value, home, worktree, os.path.dirname(path)):
            if p not in origins and not (k == "include.path" or k.startswith("includeif.")):
                origins.append(p)
        if k == "core.hookspath" and value:
            hooks = _expand(value, home)
        elif k == "core.worktree" and value:
            wt = os.path.normpath(os.path.join(os.path.dirname(path), _expand(value, home)))
        elif value and (k == "include.path" or k.startswith("includeif.") and k.endswith(".path")):
            # conditions are not evaluated: a hooks directory that may apply is protected
            inc = os.path.normpath(os.path.join(os.path.dirname(path), _expand(value, home)))
            h, w = _repo_file(inc, home, origins, depth + 1, worktree)
            hooks, wt = h or hooks, w or wt
    return hooks, wt


def _expand(value, home):
    return os.path.join(home, value[2:]) if value.startswith("~/") else value


def _origin_path(origin, top):
    if not origin or not origin.startswith("file:"):
        return None
    return os.path.normpath(os.path.join(top, origin[5:]))
