""".git as git sees it, read from two snapshots: refs moved, commits added and lost, index changed.

    for repo in git_changes(store, tree_a, tree_b):
        print("\n".join(repo.lines()))        # or repo.to_json()
        repo.covers(path)                     # is this raw path summarised by `repo`?

A step that runs `git commit` or `git reset --hard HEAD~1` changes dozens of files under `.git`
(loose objects, packs, reflogs, the index); what a person wants to know is which branch moved
and which commits are no longer on any branch. This module reads that from the snapshots alone.

Why a reader of its own rather than `git` on a temporary restore of `.git`:
- it runs nothing. The `.git` in a snapshot is the step's: its config, alternates, a partial
  clone's promisor remote, a commit-graph or reftable written to mislead are all the step's
  choice, and git run by the person (the CLI) or the daemon (the rewind plan) on the host obeys
  some of them. Parsing bytes obeys nothing (the same reason as sandbox/tracked.py);
- it reads only what it needs: a pack is read at the offsets of the commits it wants, through
  the store's chunks (a 1 GiB pack is not restored to answer "which commits were lost");
- it needs no git binary, and no temporary directory to clean after a crash.
What it reads: loose objects (zlib), packs through their `.idx` (v1 and v2; OFS_DELTA and
REF_DELTA resolved), `HEAD`, loose refs, `packed-refs`, linked worktrees' `HEAD`, annotated
tags peeled, the index (versions 2-4; a split index's shared part merged in). SHA-1 and SHA-256
(told apart by the length of the ids the refs hold); a shallow clone's boundary (`shallow`)
ends the walk there, as in git. Not read, and said in `problems`: reftable refs, objects found
only through `objects/info/alternates`, a commit missing from the snapshot.

Everything is bounded, since a step chooses these bytes: at most MAX_REPOS repositories, a walk
visits at most MAX_WALK commits, and one call (every repository's refs, walks and indexes
together) spends at most BUDGET_SECONDS and reads at most BUDGET_BYTES of files (Budget): a
walk cut by it says "or more", and what is left unread once it is spent (an index, the
repositories after) is said as the problem "budget", so `envgit diff` and the rewind plan finish
in seconds whatever a step left. An index is read only when its file differs between the two
sides (compared by stored id first), and at most MAX_INDEX_ENTRIES entries of it. A delta chain
at most MAX_DELTA_DEPTH links (followed iteratively), an object at most MAX_OBJECT bytes
inflated, at most MAX_REFS refs per side; every object read is checked against its id as git
checks it; a malformed object or file is a problem said, never an exception out of git_changes.

The reading is in three modules under it: gitobjects.py (a snapshot's files, loose objects,
packs, deltas), gitrepo.py (one repository's refs, objects and index on one side) and
gitbudget.py (the one budget of a call).
"""

import heapq
import struct
import zlib
from dataclasses import dataclass, field

from .gitbudget import BUDGET_BYTES, BUDGET_PROBLEM, BUDGET_SECONDS, Budget, BudgetSpent, new_budget
from .gitobjects import Unreadable, _Snapshot
from .gitrepo import _is_hex, _Repo, _text
from .ids import CorruptObject
from .objects import StoreError

# the budget is part of this module's interface (diff and the UI make one per command)
__all__ = ["BUDGET_BYTES", "BUDGET_PROBLEM", "BUDGET_SECONDS", "Budget", "BudgetSpent", "Commit", "IndexChange",
           "RefMove", "RepoChange", "Unreadable", "covered", "git_changes", "new_budget"]

MAX_WALK = 20_000           # commits visited per repository before the counts say "at least"
MAX_LISTED = 200            # commits and index paths kept in a RepoChange (counts stay complete)
SLOP = 5                    # commits walked past "everything left is common" (git's clock-skew slop)
MAX_REPOS = 100             # repositories summarised in one call; the rest are listed as files

# What the summary of a gitdir stands for: the rest of `.git` (config, hooks, info/, a rebase's
# state) is still listed file by file, since those are the files a person needs to see changed.
_SUMMARISED = (b"objects", b"refs", b"logs", b"packed-refs", b"index", b"HEAD", b"ORIG_HEAD",
               b"FETCH_HEAD", b"shallow")


@dataclass(frozen=True)
class RefMove:
    name: str              # "HEAD", "refs/heads/main", "worktrees/w/HEAD"
    old: str | None        # an object id (hex), "ref: refs/heads/x" for a symbolic ref, None: absent
    new: str | None


@dataclass(frozen=True)
class Commit:
    id: str
    summary: str           # the first line of the message
    time: int              # committer time, seconds since the epoch
    gone: bool = False     # a lost commit whose object is not in the later snapshot at all


@dataclass(frozen=True)
class IndexChange:
    path: str
    status: str            # "added" | "deleted" | "modified" (mode or staged content)


@dataclass
class RepoChange:
    gitdir: str                                   # project-relative: ".git", "lib/.git", ".git/modules/m"
    refs: list = field(default_factory=list)      # [RefMove]
    added: list = field(default_factory=list)     # [Commit], newest first, at most MAX_LISTED
    lost: list = field(default_factory=list)
    added_count: int = 0
    lost_count: int = 0
    complete: bool = True                         # False: the walk stopped at MAX_WALK
    index: list = field(default_factory=list)     # [IndexChange], at most MAX_LISTED
    index_count: int = 0
    files: int = 0                                # raw paths under the gitdir this summary stands for
    problems: list = field(default_factory=list)  # what could not be read

    def covers(self, path: bytes) -> bool:
        """Is the raw path (project-relative bytes) one this summary stands for?"""
        prefix = self.gitdir.encode("utf-8", "surrogateescape") + b"/"
        if not path.startswith(prefix):
            return False
        return path[len(prefix):].split(b"/", 1)[0] in _SUMMARISED

    def to_json(self) -> dict:
        return {
            "gitdir": self.gitdir,
            "refs": [{"name": r.name, "old": r.old, "new": r.new} for r in self.refs],
            "commits_added": [_commit_json(c) for c in self.added],
            "commits_lost": [_commit_json(c) for c in self.lost],
            "added_count": self.added_count, "lost_count": self.lost_count, "complete": self.complete,
            "index": [{"path": i.path, "status": i.status} for i in self.index],
            "index_count": self.index_count,
            "files": self.files, "problems": list(self.problems),
        }

    def lines(self, limit: int = 10) -> list[str]:
        """A short text rendering (not yet made inert: the caller does, as for every path)."""
        more = "" if self.complete else " or more"
        out = [f"git {self.gitdir}:"]
        for r in self.refs:
            out.append(f"  {r.name}: {_short(r.old)} -> {_short(r.new)}")
        for title, commits, count in (("commits added", self.added, self.added_count),
                                      ("commits lost (on no ref now)", self.lost, self.lost_count)):
            if not count:
                continue
            out.append(f"  {title}: {count}{more}")
            for c in commits[:limit]:
                out.append(f"    {c.id[:12]} {c.summary}" + ("  (its object is gone too)" if c.gone else ""))
            if count > min(limit, len(commits)):
                out.append(f"    … and {count - min(limit, len(commits))}{more} more")
        if self.index_count:
            out.append(f"  index: {self.index_count} path(s) staged differently")
            mark = {"added": "A", "deleted": "D", "modified": "M"}
            for i in self.index[:limit]:
                out.append(f"    {mark[i.status]} {i.path}")
            if self.index_count > min(limit, len(self.index)):
                out.append(f"    … and {self.index_count - min(limit, len(self.index))} more")
        if not (self.refs or self.added_count or self.lost_count or self.index_count):
            out.append("  refs, commits and index unchanged (objects or logs rewritten: a gc, a repack, "
                       "a fetch of nothing new)")
        for p in self.problems:
            out.append(f"  not read: {p}")
        if self.files:
            out.append(f"  ({self.files} file(s) under {self.gitdir}/: objects, refs, logs, index; --raw lists them)")
        return out


def git_changes(store, tree_a: str | None, tree_b: str | None, changes=None,
                budget: "Budget | None" = None) -> list[RepoChange]:
    """One RepoChange per repository whose git state differs between the two snapshots (root
    tree ids, hex; None: nothing), in gitdir order. `changes` is `store.diff(tree_a, tree_b)`
    when the caller has it already; `budget` is shared by the calls of one command (diff's
    parts), else the call has its own (new_budget())."""
    if changes is None:
        changes = store.diff(tree_a, tree_b)
    side_a = _Snapshot(store, tree_a)
    side_b = _Snapshot(store, tree_b)
    found: dict[bytes, int] = {}
    for c in changes:
        gitdir = _gitdir_of(c.path, side_a, side_b)
        if gitdir is not None:
            found.setdefault(gitdir, 0)
    repos = []
    budget = side_a.budget = side_b.budget = budget or new_budget()
    for gitdir in sorted(found)[:MAX_REPOS]:
        repo = RepoChange(gitdir.decode("utf-8", "surrogateescape"))
        repo.files = sum(1 for c in changes if repo.covers(c.path)
                         and (c.new_type or c.old_type) != "dir")
        try:
            budget.check()
            _compare(repo, _Repo(side_a, gitdir), _Repo(side_b, gitdir), budget)
        except BudgetSpent:
            repo.problems.append(BUDGET_PROBLEM)
        except _READ_ERRORS as e:     # a damaged store object met on the way: said, not raised
            repo.problems.append(f"{repo.gitdir}: {_why(e)}")
        repos.append(repo)
    return repos


def covered(repos: list[RepoChange], path: bytes) -> bool:
    """Is the raw path summarised by one of the repositories?"""
    return any(r.covers(path) for r in repos)


# --- finding the repositories ----------------------------------------------------------------

def _gitdir_of(path: bytes, a: "_Snapshot", b: "_Snapshot") -> bytes | None:
    """The gitdir a changed path lies in (its first `.git` component, or a submodule's gitdir
    under `.git/modules/`), if the path is one a summary stands for."""
    parts = path.split(b"/")
    if b".git" not in parts:
        return None
    i = parts.index(b".git")
    if i == len(parts) - 1:
        return None                    # `.git` itself: a file (a worktree's) or a whole new dir
    gitdir = parts[:i + 1]
    rest = parts[i + 1:]
    if rest[0] == b"modules":
        # .git/modules/<name>/… where <name> may hold slashes (and a submodule's own submodules
        # are under its modules/): the deepest prefix that is a gitdir as git tells one, HEAD,
        # objects/ and refs/ (logs/ and refs/remotes/origin/ hold a HEAD too)
        for n in range(len(rest) - 1, 1, -1):
            cand = b"/".join(gitdir + rest[:n])
            if any(s.is_gitdir(cand) for s in (a, b)):
                if rest[n] in _SUMMARISED:
                    return cand
                return None
        return None
    if rest[0] not in _SUMMARISED:
        return None
    return b"/".join(gitdir)



# --- comparing two sides -------------------------------------------------------------------

_READ_ERRORS = (Unreadable, KeyError, ValueError, IndexError, struct.error, zlib.error,
                StoreError, CorruptObject)


def _compare(repo: RepoChange, a: _Repo, b: _Repo, budget: Budget) -> None:
    try:
        refs_a, refs_b = a.refs(), b.refs()
    except (StoreError, CorruptObject) as e:
        repo.problems.append(f"refs: {e}")
        return
    a.hash_len = b.hash_len = max(a.hash_len, b.hash_len)
    for name in sorted(refs_a.keys() | refs_b.keys(), key=lambda n: (n != "HEAD", n)):
        if refs_a.get(name) != refs_b.get(name):
            repo.refs.append(RefMove(name, refs_a.get(name), refs_b.get(name)))
    tips_a = _tips(a, refs_a, repo.problems)
    tips_b = _tips(b, refs_b, repo.problems)
    if tips_a != tips_b:
        _walk(repo, a, b, tips_a, tips_b, budget)
    try:
        if a.index_differs(b):
            _compare_index(repo, a.index(), b.index())
    except BudgetSpent:
        repo.problems.append(f"{repo.gitdir}/index: {BUDGET_PROBLEM}")
    except _READ_ERRORS as e:
        repo.problems.append(f"{repo.gitdir}/index: {e}")
    repo.problems.extend(dict.fromkeys(a.problems + b.problems))


def _tips(side: _Repo, refs: dict, problems: list) -> set[str]:
    """The commits the refs point at (annotated tags peeled; trees and blobs skipped)."""
    out = set()
    for name in refs:
        oid = side.resolve(refs, name)
        for _ in range(10):
            if oid is None:
                break
            try:
                typ, data = side.get(oid)
            except _READ_ERRORS as e:
                problems.append(f"{name} -> {oid[:12]}: {_why(e)}")
                break
            if typ == 1:
                out.add(oid)
                break
            if typ != 4:
                break
            oid = _header(data, b"object")
    return out


OLD, NEW = 1, 2


def _walk(repo: RepoChange, a: _Repo, b: _Repo, tips_a: set, tips_b: set, budget: Budget) -> None:
    """Commits reachable from one side's tips and not the other's: walk newest first from
    both, painting each commit with the sides that reach it, until everything still queued
    is reached by both (then the rest is common history)."""
    flags: dict[str, int] = {}
    info: dict[str, tuple] = {}        # id -> (time, parents, summary)
    queue: list = []
    order: dict[str, int] = {}         # first painted: among equal times, children before parents
    missing = []
    shallow = a.shallow() | b.shallow()   # a shallow clone's boundary: no parents past it

    def commit(oid):
        got = info.get(oid)
        if got is None:
            for side in (b, a):
                try:
                    typ, data = side.get(oid)
                except BudgetSpent:     # the walk below stops at the budget's end
                    err = Unreadable(BUDGET_PROBLEM)
                    continue
                except _READ_ERRORS as e:
                    err = e
                    continue
                if typ == 1:
                    got = _parse_commit(data)
                    if oid in shallow:
                        got = (got[0], [], got[2])
                    break
                err = Unreadable("not a commit")
            else:
                missing.append(f"commit {oid[:12]}: {_why(err)}")
                got = (0, [], "")
            info[oid] = got
        return got

    def paint(oid, f):
        old = flags.get(oid, 0)
        if old | f != old:
            flags[oid] = old | f
            order.setdefault(oid, len(order))
            heapq.heappush(queue, (-commit(oid)[0], order[oid], oid))

    for oid in tips_a:
        paint(oid, OLD)
    for oid in tips_b:
        paint(oid, NEW)
    visited, slop = 0, SLOP
    while queue:
        if all(flags[o] == OLD | NEW for _, _, o in queue):
            slop -= 1
            if slop < 0:
                break
        else:
            slop = SLOP
        _, _, oid = heapq.heappop(queue)
        visited += 1
        if visited > MAX_WALK or budget.over():
            repo.complete = False
            missing.append(f"{repo.gitdir}: the walk stopped after {visited - 1} commits")
            break
        for parent in commit(oid)[1]:
            paint(parent, flags[oid])
    for oid, f in flags.items():
        if f == OLD | NEW:
            continue
        t, _, summary = info.get(oid) or commit(oid)
        if f == NEW:
            repo.added_count += 1
            repo.added.append(Commit(oid, summary, t))
        else:
            repo.lost_count += 1
            repo.lost.append(Commit(oid, summary, t))
    repo.added.sort(key=lambda c: (-c.time, order[c.id]))
    repo.lost.sort(key=lambda c: (-c.time, order[c.id]))
    del repo.added[MAX_LISTED:]
    del repo.lost[MAX_LISTED:]
    repo.lost = [Commit(c.id, c.summary, c.time, gone=not _has(b, c.id)) for c in repo.lost]
    repo.problems.extend(missing[:5])


def _has(side: _Repo, oid: str) -> bool:
    try:
        return side.has(oid)
    except _READ_ERRORS:
        return False
    except BudgetSpent:
        return True          # not known: "gone" is said only of what was looked for


def _parse_commit(data: bytes) -> tuple[int, list, str]:
    head, _, message = data.partition(b"\n\n")
    parents, when = [], 0
    for line in head.split(b"\n"):
        if line.startswith(b"parent "):
            p = line[7:].strip().decode("ascii", "replace")
            if _is_hex(p):
                parents.append(p)
        elif line.startswith(b"committer "):
            fields = line.rsplit(b" ", 2)
            if len(fields) == 3 and fields[1].isdigit():
                when = int(fields[1])
    summary = next((ln for ln in message.split(b"\n") if ln.strip()), b"")
    return when, parents, summary.decode("utf-8", "replace").strip()[:200]


def _header(data: bytes, key: bytes) -> str | None:
    for line in data.partition(b"\n\n")[0].split(b"\n"):
        if line.startswith(key + b" "):
            v = line[len(key) + 1:].strip().decode("ascii", "replace")
            return v if _is_hex(v) else None
    return None


def _compare_index(repo: RepoChange, old: dict, new: dict) -> None:
    differ = [p for p, v in old.items() if new.get(p) != v] + [p for p in new if p not in old]
    for path in sorted(differ):
        o, n = old.get(path), new.get(path)
        status = "added" if o is None else "deleted" if n is None else "modified"
        repo.index_count += 1
        if len(repo.index) < MAX_LISTED:
            repo.index.append(IndexChange(_text(path), status))



# --- small things ----------------------------------------------------------------------------

def _short(v: str | None) -> str:
    if v is None:
        return "(none)"
    return v[:12] if _is_hex(v) else v


def _why(e: Exception) -> str:
    if isinstance(e, KeyError):
        return "not in the snapshot's objects"
    return str(e) or type(e).__name__


def _commit_json(c: Commit) -> dict:
    return {"id": c.id, "summary": c.summary, "committed_at": _iso(c.time), "gone": c.gone}


def _iso(t: int) -> str:
    """ISO-8601 UTC, the CLI's one form for times (commands.iso_utc)."""
    from datetime import UTC, datetime
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except (OverflowError, OSError, ValueError):
        return "1970-01-01T00:00:00.000000Z"      # a commit's date is whatever its author wrote
