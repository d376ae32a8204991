"""Escape routes: the files in a writable place that a program outside the sandbox obeys later
(defaults.ESCAPE_ROUTES, the policy's `protect`, and what git reads: gitroutes.py).

Before a step (`find`, from the view): every existing one is bound read-only, after any other
name it has (a hard link) is broken away from it, since a second name would be a writable way
to the same file. Before and after a step (`fingerprint`): every one, present or not, is
lstat'ed, so a route the step created (where none could be bound) or changed (should the mounts
ever be got round) is marked `escape-route-written` on the step and told at its end, with
its path. `mark` routes are only fingerprinted, never bound: tools write them legitimately.
`quiet` ones too, and what package managers write there on every install (a venv's programs,
node_modules/.bin) is said quietly (`tools_own`: mark `tool-files-written`, one plain line).
"""

import os
import stat
from dataclasses import dataclass, field

from ..changes import copy_to_own_inode, listed_whole
from ..paths import inside as _inside
from ..policy import defaults
from ..policy.decide import _rx
from ..policy.globs import has_magic
from .gitroutes import HooksPaths, commondir_of, gitdir_of, gitdir_routes, looks_like_gitdir

MAX_WALK = 5000          # entries fingerprinted under one protected directory
_GIT_CONFIG_SUFFIXES = ("/.git/config", "/.git/config.worktree")
# Found inside node_modules these are a package's own files, which npm, yarn, pnpm, bun, cargo
# and git never read there; protecting them would pin node_modules (a step could no longer
# remove it), and marking them would mark every install.
_NOT_IN_PACKAGES = {".npmrc", ".yarnrc", ".yarnrc.yml", ".gitmodules", ".gitattributes",
                    ".pnpmfile.cjs", ".pnpmfile.mjs", "bunfig.toml"}


def _a_packages_copy(rel: str) -> bool:
    parts = rel.split("/")
    return "node_modules" in parts and (parts[-1] in _NOT_IN_PACKAGES or
                                        len(parts) > 1 and parts[-2] == ".cargo")


@dataclass
class RouteSet:
    protect: list[str] = field(default_factory=list)   # absolute paths, present, to bind read-only
    configs: set = field(default_factory=set)          # of those, git configs (bound sanitised)
    hook_dirs: set = field(default_factory=set)        # hooks directories (made when absent)
    watch: list[str] = field(default_factory=list)     # absolute paths whose change is marked
    deny_hits: list[str] = field(default_factory=list)  # project paths a glob deny names
    content_hits: list[str] = field(default_factory=list)  # paths to check by content


_BY_PROJECT: dict = {}


def for_project(project: str) -> "Routes":
    """The daemon's one Routes per project (git's answers are kept between steps)."""
    r = _BY_PROJECT.get(project)
    if r is None:
        r = _BY_PROJECT[project] = Routes()
    return r


class Routes:
    """Per project in a daemon (it keeps git's answers between steps)."""

    def __init__(self):
        self.hooks = HooksPaths()

    def patterns(self, rules):
        """(stop, find) for the project scan: glob denies, and every glob route."""
        stop = tuple(p for p, _ in rules.deny_rel)
        find = [_rel_glob(rules.project, e) for e, _ in rules.protect_abs]
        find += [m for m in defaults.MARK_IN_PROJECT if has_magic(m)]
        find += list(defaults.DENY_READ_IF_CONTAINS)
        find.append("**/HEAD")          # a directory shaped like a repository (gitroutes.looks_like_gitdir)
        return stop, tuple(sorted({f for f in find if f}))

    def find(self, rules, scan) -> RouteSet:
        project, home = rules.project, rules.home
        stop, find = self.patterns(rules)
        deny_hits, found = scan.scan(stop, find)
        rs = RouteSet(deny_hits=[os.path.join(project, h) for h in deny_hits])
        protect_rx = _alt([_rel_glob(project, e) for e, _ in rules.protect_abs])
        content_rx = _alt(list(defaults.DENY_READ_IF_CONTAINS))
        mark_rx = _alt([m for m in defaults.MARK_IN_PROJECT if has_magic(m)])
        protect, watch = [], []
        for e, _ in rules.protect_abs:          # literal entries: by path, present or not
            if not has_magic(e):
                protect.append(e)
            elif not _rel_glob(project, e):     # a glob elsewhere (another writable path)
                import glob
                protect += sorted(glob.glob(e))
        for m in defaults.MARK_IN_PROJECT:
            if not has_magic(m):
                watch.append(os.path.join(project, m))
        tops, gitdirs, repos = [], [], []
        for h in found:
            p = os.path.join(project, h)
            if _a_packages_copy(h):
                continue        # a published package's copy: no tool reads it there
            if os.path.basename(h) == "pyvenv.cfg":     # a virtualenv: what its tools run
                watch += [os.path.join(os.path.dirname(p), t) for t in defaults.MARK_IN_VENV
                          if not has_magic(t)]      # a glob's files: from the snapshot's paths
            if content_rx and content_rx(h):
                rs.content_hits.append(p)
            base = os.path.basename(h)
            if base == ".git" and os.path.isdir(p) and not os.path.islink(p):
                pass                            # a repository: what git obeys in it is below
            elif protect_rx and protect_rx(h):
                protect.append(p)
                if p.endswith(_GIT_CONFIG_SUFFIXES) or "/.git/modules/" in p and \
                        p.endswith(("/config", "/config.worktree")):
                    rs.configs.add(p)
            elif mark_rx and mark_rx(h):
                watch.append(p)
            if base == ".git":
                tops.append(os.path.dirname(p))
                gd = gitdir_of(p)
                if gd and gd != p:
                    gitdirs.append(gd)          # a .git file's target, anywhere
                elif gd:
                    repos.append(gd)
            elif base == "HEAD" and "/.git/" not in "/" + h and looks_like_gitdir(os.path.dirname(p)):
                gitdirs.append(os.path.dirname(p))      # git takes it for a repository: its config runs
            elif base == "commondir":
                cd = commondir_of(os.path.dirname(p))
                if cd:
                    gitdirs.append(cd)
        for w, _ in rules.write_abs:            # another writable place holding a repository
            dg = os.path.join(w, ".git")
            if w != project and not _inside(w, project) and os.path.lexists(dg):
                tops.append(w)
                gd = gitdir_of(dg)
                if gd:
                    gitdirs.append(gd)
                if not os.path.isdir(dg):
                    protect.append(dg)
                else:
                    repos.append(dg)
        for gd in repos + gitdirs:              # git's own state, present or not
            watch += _gitdir_marks(gd)
        for gd in gitdirs:
            for r in gitdir_routes(gd):
                protect.append(r)
                if r.endswith(("/config", "/config.worktree")):
                    rs.configs.add(r)
            cd = commondir_of(gd)
            if cd:
                protect += gitdir_routes(cd)
                rs.configs.add(os.path.join(cd, "config"))
                watch += _gitdir_marks(cd)
        writable = [project] + [w for w, _ in rules.write_abs]
        if project not in tops:
            tops.append(project)                # the project may sit inside a repository
        for top in tops:
            hooks, origins = self.hooks.get(top, home)
            if hooks:
                protect.append(hooks)
                rs.hook_dirs.add(os.path.normpath(hooks))
                if os.path.basename(hooks) == "_":
                    protect.append(os.path.dirname(hooks))   # husky: `_/h` runs ../<hook>
            # the config files read, what they include and the programs they name, in any
            # writable place (present or not: one a step creates is taken back at its end)
            protect += [o for o in origins if any(_inside(o, w) for w in writable)]
        rs.protect = _dedupe(protect)
        rs.watch = _dedupe(rs.protect + watch)
        return rs


def _gitdir_marks(gitdir):
    """The state git leaves in `gitdir` and in each of its linked worktrees' gitdirs (a rebase
    in a worktree keeps its todo list there), present or not: a step that leaves one behind
    is marked, one that creates and finishes it (a rebase inside the step) is not."""
    dirs = [gitdir]
    try:
        dirs += [e.path for e in os.scandir(os.path.join(gitdir, "worktrees"))
                 if e.is_dir(follow_symlinks=False)]
    except OSError:
        pass
    return [os.path.join(d, t) for d in dirs for t in defaults.MARK_IN_GITDIR]


class _VenvPaths:
    """Whether a project-relative path is a `<venv>/…` route: below a directory holding
    pyvenv.cfg (as it is after the step), under one of `patterns` (defaults.MARK_IN_VENV)."""

    def __init__(self, project, patterns=None):
        self.project, self.is_venv = project, {}
        self.rx = _alt(defaults.MARK_IN_VENV if patterns is None else patterns)

    def __call__(self, path):
        if self.rx is None:
            return False
        parts = path.split("/")
        for i in range(len(parts) - 1):
            d = "/".join(parts[:i])
            v = self.is_venv.get(d)
            if v is None:
                v = self.is_venv[d] = os.path.isfile(os.path.join(self.project, d, "pyvenv.cfg"))
            if v and any(self.rx("/".join(parts[i:n])) for n in range(i + 1, len(parts) + 1)):
                return True
        return False


def _rel_glob(project, entry):
    """A protect entry as a project-relative glob, or None (a literal path, outside, …)."""
    if not has_magic(entry) or not entry.startswith(project + "/"):
        return None
    return entry[len(project) + 1:]


def _alt(patterns):
    patterns = [p for p in patterns if p]
    if not patterns:
        return None
    import re
    return re.compile("|".join(f"(?:{_rx(p).pattern})" for p in patterns), re.DOTALL).match


def _dedupe(paths):
    seen, out = set(), []
    for p in paths:
        p = os.path.normpath(p)
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


# --- before and after a step -----------------------------------------------------------------

def fingerprint(paths) -> dict:
    """{path: (mode, size, mtime_ns, ctime_ns, ino) or None} for each path and, for a
    directory, every entry under it (not following symlinks)."""
    out: dict = {}
    for p in paths:
        try:
            st = os.lstat(p)
        except OSError:
            out[p] = None
            continue
        out[p] = _stamp(st)
        if stat.S_ISLNK(st.st_mode):
            # A link on a route is obeyed through: what it leads to (absent when it was made,
            # created by a later step) is the route's content too.
            try:
                out[p] += _stamp(os.stat(p))
            except OSError:
                pass
        if stat.S_ISDIR(st.st_mode):
            n = 0
            for d, dirs, files in os.walk(p):
                for name in dirs + files:
                    q = os.path.join(d, name)
                    try:
                        out[q] = _stamp(os.lstat(q))
                    except OSError:
                        pass
                    n += 1
                if n > MAX_WALK:
                    break
    return out


def changed(before: dict, after: dict) -> list[str]:
    """The paths whose stamp differs; a directory only when nothing under it is listed (its
    entries name the change better)."""
    out = sorted(p for p in before.keys() | after.keys()
                 if before.get(p) != after.get(p) and (before.get(p) or after.get(p)))
    return [p for p in out if not any(q.startswith(p + "/") for q in out)]


def _stamp(st):
    return (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class LinkedProtectedPath(OSError):
    pass


def unshare_links(paths) -> list[str]:
    """Give every protected regular file with another name (st_nlink > 1) an inode of its own:
    copied, then renamed over the protected name. The other names keep the old inode, so a
    write through them no longer reaches the protected path. Returns the paths unshared; one
    that cannot be unshared (no permission to its directory) refuses the step."""
    out: list[str] = []
    try:
        return _unshare_all(paths, out)
    except OSError as e:
        raise LinkedProtectedPath(
            f"{e.filename} is protected but has another name (a hard link) through which a step "
            f"could change it, and envgit could not give it an inode of its own ({e.strerror}); "
            f"remove the other name or copy the file over itself (cp -p F F.new && mv F.new F)") from None


def _unshare_all(paths, out):
    for p in paths:
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            n = 0
            for d, _, files in os.walk(p):
                for name in files:
                    q = os.path.join(d, name)
                    if _unshare(q):
                        out.append(q)
                    n += 1
                if n > MAX_WALK:
                    break
        elif _unshare(p, st):
            out.append(p)
    return out


def _unshare(path, st=None) -> bool:
    try:
        st = st or os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
        return False
    try:
        copy_to_own_inode(path, st, st.st_mode & 0o7777, tag="envgit-unlink")
        return True
    except OSError as e:
        e.filename = path
        raise


def has_private_key(path: str, marker: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return marker in f.read(1 << 16)
    except OSError:
        return False


def before_step(scan) -> dict:
    """The fingerprint of the routes the view just bound (ProjectScan.routes), taken before the
    step's command runs."""
    rs = getattr(scan, "routes", None)
    return fingerprint(rs.watch) if rs is not None else {}


def written(pol, project: str, home: str, scan, before: dict, summary) -> list[str]:
    """The escape routes a step created or changed, project-relative (absolute outside it):
    from the fingerprints before and after the step (whatever the snapshot leaves out or
    truncates), and from the snapshot's changed paths."""
    from ..policy import resolve
    rules = resolve(pol, project, home or os.path.expanduser("~"))
    summary = summary or {}
    # The snapshot lists every path the step changed unless it says it did not (too many to
    # list, left out by size or an exclude, failed): then the routes are looked for again.
    complete = listed_whole(summary) and \
        all(_inside(w, project) for w, _ in rules.write_abs)     # no snapshot of other places
    if complete:
        after = fingerprint([p for p in before if os.path.dirname(p) not in before])
    else:
        after = fingerprint(for_project(project).find(rules, scan).watch)
    for p in before:
        if p not in after:
            try:
                after[p] = _stamp(os.lstat(p))
            except OSError:
                after[p] = None
    # A mark route the step removed runs nothing (a rebase the step finished, a venv removed);
    # a protected one it removed got round its mount and is told.
    bound = getattr(getattr(scan, "routes", None), "protect", ())
    out = {p for p in changed(before, after)
           if after.get(p) is not None or os.path.lexists(p) or any(_inside(p, b) for b in bound)}
    # The snapshot's view: a route pattern naming a changed path.
    pats = [_rel_glob(project, e) or (e[len(project) + 1:] if e.startswith(project + "/") else None)
            for e, _ in rules.protect_abs] + list(defaults.MARK_IN_PROJECT)
    names = route_matcher([p for p in pats if p])
    in_venv = _VenvPaths(project)
    for c in summary.get("paths", []):
        path = c.get("path", "")
        if _a_packages_copy(path) or not os.path.lexists(os.path.join(project, path)):
            continue            # a package's own copy; a route removed runs nothing
        if os.path.basename(path) == "HEAD" and "/.git/" not in "/" + path and \
                looks_like_gitdir(os.path.dirname(os.path.join(project, path))):
            out.add(os.path.join(project, path))    # a directory the step made a repository
            continue
        if names(path) or in_venv(path):
            out.add(os.path.join(project, path))
    out = {p for p in out if _holds(p, defaults.MARK_IF_CONTAINS.get(os.path.basename(p)))}
    return sorted({p[len(project) + 1:] if p.startswith(project + "/") else p for p in out})


def tools_own(pol, project: str, home: str, scan, escapes: list[str]) -> list[str]:
    """Of the routes a step wrote (`written`), the ones said quietly: what package managers
    write as a matter of course (defaults.QUIET: a virtualenv's pyvenv.cfg, programs and .pth
    files, node_modules/.bin), or a mark route the step left a byte-for-byte copy of its
    example (defaults.QUIET_IF_COPY_OF: `cp .env.example .env`). Never one a protected route
    names (a core.hooksPath pointed into a venv's bin/ is git's hooks, and loud): the
    classification is by what obeys the file, not by its name alone."""
    from ..policy import resolve
    rules = resolve(pol, project, home or os.path.expanduser("~"))
    protected = route_matcher([_rel_glob(project, e) or e[len(project) + 1:]
                               for e, _ in rules.protect_abs if e.startswith(project + "/")])
    bound = list(getattr(getattr(scan, "routes", None), "protect", ()) or ())
    quiet = route_matcher([q for q in defaults.QUIET if not q.startswith(defaults.VENV)])
    in_venv = _VenvPaths(project, defaults.QUIET_IN_VENV)
    out = []
    for rel in escapes:
        if rel.startswith(("/", "(")):          # outside the project; a check's error: loud
            continue
        path = os.path.join(project, rel)
        if protected(rel) or any(_inside(path, b) for b in bound):
            continue
        if quiet(rel) or in_venv(rel) or _a_copy_of_its_example(path):
            out.append(rel)
    return out


def _a_copy_of_its_example(path: str) -> bool:
    """`path` is a regular file with the same bytes as one of its examples beside it (neither
    read through a symlink: a link would make the daemon compare what the step may not read)."""
    examples = defaults.QUIET_IF_COPY_OF.get(os.path.basename(path))
    if not examples:
        return False
    mine = _small_file(path)
    return mine is not None and any(
        _small_file(os.path.join(os.path.dirname(path), e)) == mine for e in examples)


def _small_file(path: str, limit: int = 1 << 20) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        return os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def route_matcher(patterns):
    """Whether a project-relative path is named by one of the route `patterns` (project
    globs and literal paths): the path itself or a directory above it; `**/.git` names a .git
    *file* only (a repository directory's routes have patterns of their own)."""
    lit = [p for p in patterns if not has_magic(p)]
    exact = _alt([p for p in patterns if has_magic(p) and p.endswith("/.git")])
    rx = _alt([p for p in patterns if has_magic(p) and not p.endswith("/.git")])

    def names(path: str) -> bool:
        if any(path == e or path.startswith(e + "/") for e in lit) or (exact and exact(path)):
            return True
        return bool(rx) and any(rx("/".join(path.split("/")[:n])) for n in range(1, path.count("/") + 2))
    return names


def _holds(path, marker) -> bool:
    """True without a marker; else whether the file holds it (read whole: packed-refs)."""
    if marker is None:
        return True
    try:
        with open(path, "rb") as f:
            return marker in f.read()
    except OSError:
        return False
