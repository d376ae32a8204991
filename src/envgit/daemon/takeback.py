"""Taking back the escape routes a step wrote: a marked route is not a protected one.

An escape route that exists is bound read-only in the step's view (sandbox/routes.py); one
that does not exist cannot be bound without creating it, so a step can create it: a hook, a
`.git/commondir`, an embedded repository's config with `core.fsmonitor`, an `.npmrc` routing
the person's token, a file the person's git config includes. A mark after the fact protects
no one: the person's next `git status` or `npm view` obeys it. So at the end of the step,
after its snapshot (which keeps what it wrote, for `envgit diff N`), every such route the
policy does not let a step write is brought back to what it was before the step, by the
rewind's own restore (O_NOFOLLOW directory fds, nothing through a symlink), and that is
recorded as a step of its own, `envgit take-back N`, whose snapshot is the directory as it
stands; `envgit rewind N` lands on it (daemon/rewind.py), never on the routes.

What is kept, because git writes it for an ordinary `git init`, `git clone`, `git worktree
add` or `git submodule add` and it runs nothing: a new repository config holding only the keys
such commands write (SAFE_CONFIG), the `*.sample` hooks, empty `branches`/`remotes`
directories, a worktree's `commondir` naming its own repository, a `.git` file naming a
worktree's or submodule's gitdir inside the project. `mark` routes (a venv's scripts, a .pth
file, rebase state) are tools' own writes: marked, never taken back. The policy's
`escape_routes.allow` globs keep today's behaviour for the paths they name: marked and told,
left in place. A route outside the project (another allow_write place) has no tree to come
back from: it is marked and told.
"""

import os
import re

from ..inert import some
from ..journal.rows import listed
from ..sandbox import hostgit
from ..sandbox.gitroutes import commondir_of, gitdir_of, looks_like_gitdir
from ..sandbox.routes import _alt, _inside, route_matcher
from .livestep import LiveStep

# What git writes into a new repository's config (init, clone, worktree add, submodule add,
# a partial clone, LFS): nothing here runs a program or sends git elsewhere.
SAFE_CONFIG = re.compile(r"""(
      core\.(repositoryformatversion|filemode|bare|logallrefupdates|ignorecase|precomposeunicode
             |symlinks|autocrlf|eol|safecrlf|quotepath|sharedrepository|longpaths|checkstat
             |trustctime|untrackedcache|splitindex|commitgraph|multipackindex|compression|abbrev
             |sparsecheckout|sparsecheckoutcone|bigfilethreshold|worktree)
    | extensions\.(objectformat|partialclone|preciousobjects|refstorage|noop)
    | remote\.[^.]+(\..+)?\.(url|pushurl|fetch|tagopt|mirror|prune|promisor|partialclonefilter)
    | branch\..+\.(remote|merge|rebase|pushremote|description)
    | submodule\..+\.(url|active|branch)
    | user\.(name|email) | init\.defaultbranch | pull\.(rebase|ff) | push\.(default|autosetupremote)
    | lfs\.repositoryformatversion | lfs\..+\.access | index\.(version|skiphash)
    | gc\.(auto|autodetach) | maintenance\.(auto|strategy)
)\Z""", re.X | re.I)


def to_take_back(pol, project: str, escapes: list[str], scan) -> list[str]:
    """The project-relative routes of `escapes` (routes.written) to bring back."""
    allow = _alt(list(getattr(pol, "escape_routes_allow", None) or []))     # any prefix, as globs
    protect = route_matcher([p for p in (pol.protect or []) if not p.startswith(("/", "~"))])
    found = list(getattr(getattr(scan, "routes", None), "protect", ()) or ())
    out = []
    for rel in escapes:
        if rel.startswith("/") or rel.startswith("("):     # outside the project; a check's error
            continue
        parts = rel.split("/")
        if allow and any(allow("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            continue
        path = os.path.join(project, rel)
        protected = protect(rel) or any(_inside(path, f) for f in found) \
            or (os.path.basename(rel) == "HEAD" and looks_like_gitdir(os.path.dirname(path)))
        if protected and not harmless(project, rel):
            out.append(rel)
    return out


def harmless(project: str, rel: str) -> bool:
    """What git itself writes for an ordinary command, and which runs nothing (see above)."""
    path = os.path.join(project, rel)
    base = os.path.basename(rel)
    parent = os.path.basename(os.path.dirname(rel))
    if parent == "hooks" and base.endswith(".sample"):
        return True
    if base == "hooks" and os.path.isdir(path) and not os.path.islink(path):
        try:        # as `git init` makes it: only the samples git never runs
            return all(n.endswith(".sample") for n in os.listdir(path))
        except OSError:
            return False
    if base in ("branches", "remotes") and os.path.isdir(path) and not os.path.islink(path):
        try:
            return not os.listdir(path)
        except OSError:
            return False
    if base in ("config", "config.worktree") and ("/.git/" in "/" + rel or looks_like_gitdir(os.path.dirname(path))):
        return _safe_config(path, project)
    if base == ".gitmodules":       # `git submodule add`: paths and plain URLs run nothing
        return _safe_gitmodules(path)
    if base == "HEAD":      # a directory made a repository (a bare clone): kept if it runs nothing
        return _runs_nothing(os.path.dirname(path), project)
    if base == "commondir" and parent and os.path.basename(os.path.dirname(os.path.dirname(rel))) == "worktrees":
        return _own_worktree(os.path.dirname(path))
    if base == ".git" and os.path.isfile(path) and not os.path.islink(path):
        t = gitdir_of(path)
        return t is not None and _plain_gitdir(t, project)
    return False


def _runs_nothing(gitdir: str, project: str) -> bool:
    """A gitdir of its own (no commondir) whose config, if any, holds only SAFE_CONFIG keys and
    whose hooks, if any, are only samples."""
    cfg = os.path.join(gitdir, "config")
    return not os.path.lexists(os.path.join(gitdir, "commondir")) and \
        (not os.path.lexists(cfg) or _safe_config(cfg, project)) and \
        (not os.path.isdir(os.path.join(gitdir, "hooks"))
         or harmless(project, os.path.join(os.path.relpath(gitdir, project), "hooks")))


def _own_worktree(wt: str) -> bool:
    """`wt` (…/.git/worktrees/NAME) is what `git worktree add` makes: its commondir names the
    repository it is in, and it has no config or hooks of its own (a worktree gitdir without
    a commondir would be a repository of its own, whose config git obeys)."""
    common = os.path.realpath(os.path.dirname(os.path.dirname(wt)))
    cd = os.path.join(wt, "commondir")
    return not os.path.islink(cd) and os.path.isfile(cd) and \
        os.path.realpath(commondir_of(wt) or "") == common and \
        not any(os.path.lexists(os.path.join(wt, n)) for n in ("config", "hooks", "config.worktree"))


def _plain_gitdir(target: str, project: str) -> bool:
    """A `.git` file's target is a linked worktree's or a submodule's gitdir in the project,
    reached without a symlink, that runs nothing."""
    if os.path.realpath(target) != os.path.normpath(target) or not _inside(target, project):
        return False
    if "/.git/worktrees/" in target:
        return _own_worktree(target)
    if "/.git/modules/" in target:
        return _runs_nothing(target, project)
    return False


def _entries(path: str) -> list | None:
    """A git-format file's entries, read alone (hostgit.py), or None: a link, not a regular
    file, or nothing git can read (such a file is never judged harmless)."""
    if os.path.islink(path) or not os.path.isfile(path):
        return None
    return hostgit.file_entries(path, "/nonexistent")


def _safe_config(path: str, project: str) -> bool:
    entries = _entries(path)
    if entries is None:
        return False
    for key, value in entries:
        if not SAFE_CONFIG.match(key):
            return False
        if key.lower() == "core.worktree" and not _inside(
                os.path.normpath(os.path.join(os.path.dirname(path), value or "")), project):
            return False
    return True


# What `git submodule add` writes; `update = !cmd` is refused by git from .gitmodules, and is
# not here anyway. A URL naming a transport helper (`ext::`, `fd::`) or looking like an option
# is not plain.
SAFE_GITMODULES = re.compile(r"submodule\..+\.(path|url|branch|shallow|ignore|fetchrecursesubmodules)\Z", re.I)


def _safe_gitmodules(path: str) -> bool:
    entries = _entries(path)
    if entries is None:
        return False
    return all(SAFE_GITMODULES.match(k) and not (k.lower().endswith(".url") and (
        "::" in (v or "") or (v or "").startswith("-"))) for k, v in entries)


async def take_back(sess, step: int, info: LiveStep, paths: list[str]) -> tuple[list[str], list[str]]:
    """Bring `paths` back to the tree before `step` (info.tree_before) and record it as the
    step `envgit take-back STEP`. Returns (paths taken back, notices)."""
    import asyncio

    from ..snapshot import StoreError
    from .snapshots import SnapshotFailed, display
    before = info.tree_before
    pol = info.policy
    if not before:
        return [], ["escape routes were not taken back (no snapshot before the step to take them "
                    "back to): remove them yourself: " + some(paths)]
    try:
        plan, _ = await asyncio.to_thread(sess.snapshotter.plan_restore, pol, before, paths, sess.last_tree)
    except (StoreError, SnapshotFailed, OSError) as e:
        return [], [f"escape routes were not taken back ({e}): remove them yourself: " + ", ".join(paths)]
    # Exactly these paths and what is below them: the plan's walk also lists their new parent
    # directories (a new repository's `sub` for `sub/.git/config`), which are the step's work.
    want = [p.encode("utf-8", "surrogateescape") for p in paths]

    def mine(i):
        return any(i.path == q or i.path.startswith(q + b"/") for q in want)
    plan.write, plan.delete = [i for i in plan.write if mine(i)], [i for i in plan.delete if mine(i)]
    if not plan.write and not plan.delete:
        return [], []
    done = sorted({display(i.path) for i in plan.write + plan.delete})
    of = sess.journal.step(step)            # the take-back is of the step's session (an agent's)
    back = sess.journal.begin_step({
        "argv": ["envgit", "take-back", str(step)], "cwd": sess.project.root,
        "session": (of.session if of is not None else None) or sess.id,
        "user": "envgit", "policy_sha256": pol.sha256, "marks": ["escape-route-taken-back"]})
    err = None
    try:
        await asyncio.to_thread(sess.snapshotter.restore, plan)
    except (StoreError, OSError) as e:
        err = str(e)
    summary = await sess.take_after(pol)
    sess.journal.append(back, "end", {
        "exit_code": 1 if err else 0, "signal": None, "duration_ms": 0,
        "marks": ["escape-route-taken-back"] + (["refused"] if err else []),
        **listed("escape_routes", [p for p in paths if p in done or any(d.startswith(p + "/") for d in done)]),
        "snapshot": summary, **({"error": err} if err else {})})
    if err:
        return [], [f"escape routes were not all taken back ({err}): remove them yourself: " + ", ".join(paths)]
    return paths, []
