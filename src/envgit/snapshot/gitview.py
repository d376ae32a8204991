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
"""

import bisect
import hashlib
import heapq
import struct
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field

from .diff import read_tree
from .encoding import DIR, EXEC, FILE, decode_chunks
from .ids import BLOB, CHUNKS, CorruptObject
from .objects import StoreError

MAX_WALK = 20_000           # commits visited per repository before the counts say "at least"
MAX_LISTED = 200            # commits and index paths kept in a RepoChange (counts stay complete)
MAX_DELTA_DEPTH = 5_000     # git packs at most 4095 deep
MAX_OBJECT = 64 << 20       # bytes an object may inflate to
MAX_REFS = 100_000
MAX_INDEX = 256 << 20        # bytes of an index file (git's, or a pack's .idx: ~9M objects)
SLOP = 5                    # commits walked past "everything left is common" (git's clock-skew slop)
BUDGET_SECONDS = 4.0        # one git_changes call, everything in it (diff and the rewind plan wait on it)
BUDGET_BYTES = 512 << 20    # of files read in one call (indexes, pack indexes, refs, objects' files)
MAX_INDEX_ENTRIES = 1_000_000   # entries read of one index (Chromium's has ~500k)
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


class BudgetSpent(Exception):
    """The call's time or bytes are spent: what is left is said as BUDGET_PROBLEM."""


BUDGET_PROBLEM = (f"budget (envgit's git view spends at most {BUDGET_SECONDS:g} s and "
                  f"{BUDGET_BYTES >> 20} MiB a call; the files are listed by --raw)")


def new_budget() -> "Budget":
    return Budget(BUDGET_SECONDS, BUDGET_BYTES)


class Budget:
    """One call's time and bytes, shared by both sides and every repository."""

    def __init__(self, seconds: float, nbytes: int):
        self.deadline = time.monotonic() + seconds
        self.left = nbytes

    def over(self) -> bool:
        return self.left <= 0 or time.monotonic() > self.deadline

    def check(self) -> None:
        if self.over():
            raise BudgetSpent()

    def take(self, n: int) -> None:
        """Before reading `n` bytes of a stored file."""
        self.check()
        if n > self.left:
            self.left = 0
            raise BudgetSpent()
        self.left -= n


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


# --- reading a snapshot ---------------------------------------------------------------------------

class _Snapshot:
    """Paths of one snapshot tree, its directories decoded once."""

    def __init__(self, store, tree_id: str | None):
        self.objects = store.objects
        self.root = bytes.fromhex(tree_id) if tree_id else None
        self._dirs: dict[bytes, dict] = {}
        self.budget = Budget(BUDGET_SECONDS, BUDGET_BYTES)   # git_changes gives both sides one

    def listdir(self, path: bytes) -> dict:
        """name -> Entry of the directory at `path` (b"": the root); {} if there is none."""
        got = self._dirs.get(path)
        if got is not None:
            return got
        if self.root is None:
            return {}
        # From the nearest directory listed before, down one level at a time: no recursion (a
        # step chooses how deep a `.git` lies).
        down = []
        while path and path not in self._dirs:
            down.append(path)
            path = path.rpartition(b"/")[0]
        got = self._dirs.get(path)
        if got is None:
            got = self._remember(b"", {e.name: e for e in read_tree(self.objects, self.root)})
        for path in reversed(down):
            e = got.get(path.rpartition(b"/")[2])
            got = {x.name: x for x in read_tree(self.objects, e.oid)} if e and e.type == DIR else {}
            self._remember(path, got)
        return got

    def _remember(self, path: bytes, listing: dict) -> dict:
        if len(self._dirs) > 4096:
            self._dirs.clear()
        self._dirs[path] = listing
        return listing

    def entry(self, path: bytes):
        parent, _, name = path.rpartition(b"/")
        return self.listdir(parent).get(name)

    def is_file(self, path: bytes) -> bool:
        e = self.entry(path)
        return e is not None and e.type in (FILE, EXEC)

    def is_dir(self, path: bytes) -> bool:
        e = self.entry(path)
        return e is not None and e.type == DIR

    def is_gitdir(self, path: bytes) -> bool:
        return self.is_file(path + b"/HEAD") and self.is_dir(path + b"/objects") and self.is_dir(path + b"/refs")

    def read(self, path: bytes, limit: int = MAX_OBJECT) -> bytes | None:
        """A regular file's bytes (None: no such file, or larger than `limit`)."""
        e = self.entry(path)
        if e is None or e.type not in (FILE, EXEC) or e.size > limit:
            return None
        self.budget.take(e.size)
        return _File(self.objects, e).read(0, e.size)

    def open(self, path: bytes):
        e = self.entry(path)
        return _File(self.objects, e, self.budget) if e is not None and e.type in (FILE, EXEC) else None


class _File:
    """Random access into a stored file: only the chunks a read touches are fetched."""

    def __init__(self, objects, entry, budget=None):
        self.objects, self.size, self.budget = objects, entry.size, budget
        if entry.chunked:
            self.chunks = decode_chunks(objects.get(entry.oid, CHUNKS))
            self.starts, pos = [], 0
            for _, n in self.chunks:
                self.starts.append(pos)
                pos += n
        else:
            self.chunks, self.whole = None, objects.get(entry.oid, BLOB)
        self._cache: OrderedDict = OrderedDict()

    def read(self, offset: int, n: int) -> bytes:
        if self.chunks is None:
            return self.whole[offset:offset + n]
        out, end = [], min(offset + n, self.size)
        i = bisect.bisect_right(self.starts, offset) - 1
        while offset < end and 0 <= i < len(self.chunks):
            data = self._chunk(i)
            piece = data[offset - self.starts[i]:end - self.starts[i]]
            out.append(piece)
            offset += len(piece)
            i += 1
        return b"".join(out)

    def _chunk(self, i: int) -> bytes:
        data = self._cache.get(i)
        if data is None:
            if self.budget is not None:
                self.budget.take(self.chunks[i][1])      # a pack's chunks, fetched as needed
            data = self.objects.get(self.chunks[i][0], BLOB)
            self._cache[i] = data
            if len(self._cache) > 8:
                self._cache.popitem(last=False)
        return data


# --- one repository on one side -------------------------------------------------------------------

class Unreadable(Exception):
    """A git object or file that cannot be read as git would (the message says what)."""


class _Repo:
    def __init__(self, snap: _Snapshot, gitdir: bytes):
        self.snap, self.gitdir = snap, gitdir
        self.problems: list[str] = []
        self.hash_len = 20
        self._packs: list | None = None
        self._cache: OrderedDict = OrderedDict()     # (pack, offset) -> (type, data)
        self._cached_bytes = 0

    def path(self, rel: bytes) -> bytes:
        return self.gitdir + b"/" + rel

    # refs
    def refs(self) -> dict[str, str]:
        """name -> value (hex id or "ref: target") of HEAD, loose refs, packed-refs and linked
        worktrees' HEAD."""
        out: dict[str, str] = {}
        packed = self.snap.read(self.path(b"packed-refs"))
        for line in (packed or b"").splitlines():
            if line[:1] in (b"#", b"^") or b" " not in line:
                continue
            oid, _, name = line.partition(b" ")
            out[_text(name.strip())] = _text(oid.strip())
        self._loose_refs(b"refs", out)
        head = self.snap.read(self.path(b"HEAD"), 4096)
        if head is not None:
            out["HEAD"] = _text(head.strip())
        for name, e in self.snap.listdir(self.path(b"worktrees")).items():
            if e.type == DIR:
                h = self.snap.read(self.path(b"worktrees/" + name + b"/HEAD"), 4096)
                if h is not None:
                    out[f"worktrees/{_text(name)}/HEAD"] = _text(h.strip())
        if self.snap.entry(self.path(b"reftable")) is not None:
            self.problems.append(f"{_text(self.gitdir)}: reftable refs are not read")
        if len(out) > MAX_REFS:
            self.problems.append(f"{_text(self.gitdir)}: over {MAX_REFS} refs; only the first read")
            out = dict(sorted(out.items())[:MAX_REFS])
        for v in out.values():
            if _is_hex(v) and len(v) in (40, 64):
                self.hash_len = len(v) // 2
                break
        return out

    def _loose_refs(self, rel: bytes, out: dict) -> None:
        stack = [rel]
        while stack and len(out) <= MAX_REFS:
            d = stack.pop()
            for name, e in self.snap.listdir(self.path(d)).items():
                sub = d + b"/" + name
                if e.type == DIR:
                    stack.append(sub)
                elif e.type in (FILE, EXEC) and not name.endswith(b".lock") and e.size <= 4096:
                    value = self.snap.read(self.path(sub), 4096)
                    if value is not None and value.strip():
                        out[_text(sub)] = _text(value.strip().splitlines()[0])

    def resolve(self, refs: dict, name: str) -> str | None:
        value = refs.get(name)
        for _ in range(5):
            if value is None or not value.startswith("ref: "):
                break
            value = refs.get(value[5:].strip())
        return value if value is not None and _is_hex(value) else None

    # objects
    def has(self, oid: str) -> bool:
        if self.snap.is_file(self.path(b"objects/" + oid[:2].encode() + b"/" + oid[2:].encode())):
            return True
        raw = bytes.fromhex(oid)
        return any(p.find(raw) is not None for p in self.packs())

    def get(self, oid: str) -> tuple[int, bytes]:
        """(git type code: 1 commit, 2 tree, 3 blob, 4 tag; the object's bytes)."""
        where = self._locate(oid)
        if where is None:
            raise KeyError(oid)
        typ, data = where if isinstance(where[0], int) else self.at(*where)
        # git's own check: an object is the one its id names (a step could write a pack or
        # a loose file that says otherwise, and diff would show another commit's message)
        h = hashlib.sha256() if len(oid) == 64 else hashlib.sha1()
        h.update(_TYPE_NAMES[typ] + b" %d\0" % len(data))
        h.update(data)
        if h.hexdigest() != oid:
            raise Unreadable(f"object {oid[:12]}: its content does not match its id")
        return typ, data

    def _locate(self, oid: str):
        """A loose object's (type, bytes), or (pack, offset), or None."""
        f = self.snap.open(self.path(b"objects/" + oid[:2].encode() + b"/" + oid[2:].encode()))
        if f is not None:
            return _loose(f.read(0, min(f.size, MAX_OBJECT)))
        raw = bytes.fromhex(oid)
        for p in self.packs():
            off = p.find(raw)
            if off is not None:
                return p, off
        return None

    def packs(self) -> list:
        if self._packs is None:
            self._packs = []
            d = self.path(b"objects/pack")
            for name in sorted(self.snap.listdir(d)):
                if not name.endswith(b".idx"):
                    continue
                pack = self.snap.open(d + b"/" + name[:-4] + b".pack")
                idx = self.snap.read(d + b"/" + name, MAX_INDEX)
                if pack is None:
                    continue
                if idx is None:
                    self.problems.append(f"{_text(self.path(b'objects/pack/' + name))}: over {MAX_INDEX} bytes")
                    continue
                try:
                    self._packs.append(_Pack(_text(name), idx, pack, self.hash_len))
                except (Unreadable, struct.error, IndexError) as e:
                    self.problems.append(f"{_text(self.path(b'objects/pack/' + name))}: {e}")
            if self.snap.entry(self.path(b"objects/info/alternates")) is not None:
                self.problems.append(f"{_text(self.gitdir)}: objects in alternates are not read")
        return self._packs

    def at(self, pack: "_Pack", offset: int) -> tuple[int, bytes]:
        """The object at `offset` in `pack`, its delta chain followed iteratively (a chain may
        be thousands deep, and a REF_DELTA may name its own id: bounded, never recursive)."""
        chain, spent = [], 0           # [(cache key, delta bytes)] from the object to its base
        while True:
            key = (pack.name, offset)
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
                break
            if len(chain) > MAX_DELTA_DEPTH:
                raise Unreadable(f"a delta chain deeper than {MAX_DELTA_DEPTH} in {pack.name}")
            typ, size, base, data_at = pack.header(offset, self.hash_len)
            spent += size
            if spent > 4 * MAX_OBJECT:
                raise Unreadable(f"a delta chain inflating past {4 * MAX_OBJECT} bytes in {pack.name}")
            data = pack.inflate(data_at, size)
            if typ in (1, 2, 3, 4):
                got = (typ, data)
                self._keep(key, got)
                break
            if typ not in (6, 7):
                raise Unreadable(f"object type {typ} at {offset} in {pack.name}")
            chain.append((key, data))
            if typ == 6:
                offset = base
                continue
            where = self._locate(base.hex())
            if where is None:
                raise KeyError(base.hex())
            if isinstance(where[0], int):
                got = where
                break
            pack, offset = where
        for key, delta in reversed(chain):
            got = (got[0], _apply_delta(got[1], delta))
            self._keep(key, got)
        return got

    def _keep(self, key, got) -> None:
        self._cache[key] = got
        self._cached_bytes += len(got[1])
        while self._cached_bytes > (32 << 20) and len(self._cache) > 1:
            _, (_, old) = self._cache.popitem(last=False)
            self._cached_bytes -= len(old)

    def shallow(self) -> set[str]:
        data = self.snap.read(self.path(b"shallow"), MAX_OBJECT)
        return {_text(line.strip()) for line in (data or b"").splitlines() if line.strip()}

    # index
    def index_differs(self, other: "_Repo") -> bool:
        """Do the two sides' index files differ? By stored id, nothing read: an index of 200k
        entries takes seconds to parse, and a step can leave a hundred repositories. (A split
        index's shared part is named by its own hash: the same index names the same one.)"""
        a, b = self.snap.entry(self.path(b"index")), other.snap.entry(other.path(b"index"))
        return not ((a is None) == (b is None) and (a is None or (a.type, a.oid) == (b.type, b.oid)))

    def index(self) -> dict:
        data = self.snap.read(self.path(b"index"), MAX_INDEX)
        if data is None:
            return {}
        budget = self.snap.budget
        entries, shared = _parse_index(data, self.hash_len, budget)
        if shared:
            base = self.snap.read(self.path(b"sharedindex." + shared.encode()), MAX_INDEX)
            if base is not None:
                entries = {**_parse_index(base, self.hash_len, budget)[0], **entries}
        return entries


class _Pack:
    def __init__(self, name: str, idx: bytes, pack: _File, hash_len: int):
        self.name, self.pack, self.hash_len = name, pack, hash_len
        mv = memoryview(idx)
        if idx[:4] == b"\377tOc":
            if struct.unpack(">I", idx[4:8])[0] != 2:
                raise Unreadable("pack index version is not 2")
            self.v2, base = True, 8
        else:
            self.v2, base = False, 0
        self.fanout = struct.unpack(">256I", mv[base:base + 1024])
        self.count = self.fanout[255]
        self.names_at = base + 1024
        need = self.names_at + self.count * (hash_len + (8 if self.v2 else 4))
        if len(idx) < need:
            raise Unreadable("pack index shorter than its fan-out says")
        self.idx = idx

    def _name(self, i: int) -> bytes:
        h = self.hash_len
        if self.v2:
            return self.idx[self.names_at + i * h:self.names_at + (i + 1) * h]
        at = self.names_at + i * (h + 4) + 4
        return self.idx[at:at + h]

    def find(self, oid: bytes) -> int | None:
        lo = self.fanout[oid[0] - 1] if oid[0] else 0
        hi = self.fanout[oid[0]]
        while lo < hi:
            mid = (lo + hi) // 2
            name = self._name(mid)
            if name == oid:
                return self._offset(mid)
            if name < oid:
                lo = mid + 1
            else:
                hi = mid
        return None

    def _offset(self, i: int) -> int:
        h, n = self.hash_len, self.count
        if not self.v2:
            at = self.names_at + i * (h + 4)
            return struct.unpack(">I", self.idx[at:at + 4])[0]
        at = self.names_at + n * h + n * 4 + i * 4
        off = struct.unpack(">I", self.idx[at:at + 4])[0]
        if off & 0x80000000:
            big = self.names_at + n * h + n * 8 + (off & 0x7FFFFFFF) * 8
            off = struct.unpack(">Q", self.idx[big:big + 8])[0]
        return off

    def header(self, offset: int, hash_len: int):
        """(type, inflated size, base: offset or id for deltas, where the zlib data starts)."""
        head = self.pack.read(offset, 32 + hash_len)
        if not head:
            raise Unreadable(f"offset {offset} past the end of {self.name}")
        c = head[0]
        typ, size, shift, i = (c >> 4) & 7, c & 15, 4, 1
        while c & 0x80:
            c = head[i]
            size |= (c & 0x7F) << shift
            shift += 7
            i += 1
        base = None
        if typ == 6:
            c = head[i]
            i += 1
            rel = c & 0x7F
            while c & 0x80:
                c = head[i]
                i += 1
                rel = ((rel + 1) << 7) | (c & 0x7F)
            base = offset - rel
            if rel <= 0 or base < 0:
                raise Unreadable(f"a delta base outside {self.name}")
        elif typ == 7:
            base = head[i:i + hash_len]
            i += hash_len
        if size > MAX_OBJECT:
            raise Unreadable(f"an object of {size} bytes in {self.name}")
        return typ, size, base, offset + i

    def inflate(self, at: int, size: int) -> bytes:
        d = zlib.decompressobj()
        out, got = [], 0
        step = max(4096, min(size + 64, 1 << 20))
        while not d.eof:
            chunk = self.pack.read(at, step)
            if not chunk:
                raise Unreadable(f"truncated object in {self.name}")
            at += len(chunk)
            piece = d.decompress(chunk, size + 1 - got)
            out.append(piece)
            got += len(piece)
            if got > size:
                raise Unreadable(f"an object larger than its header says in {self.name}")
            while d.unconsumed_tail and not d.eof:
                piece = d.decompress(d.unconsumed_tail, size + 1 - got)
                if not piece:
                    break
                out.append(piece)
                got += len(piece)
                if got > size:
                    raise Unreadable(f"an object larger than its header says in {self.name}")
        if got != size:
            raise Unreadable(f"an object shorter than its header says in {self.name}")
        return b"".join(out)


_TYPES = {b"commit": 1, b"tree": 2, b"blob": 3, b"tag": 4}
_TYPE_NAMES = {v: k for k, v in _TYPES.items()}


def _loose(stored: bytes) -> tuple[int, bytes]:
    d = zlib.decompressobj()
    data = d.decompress(stored, MAX_OBJECT + 64)
    head, nul, body = data.partition(b"\0")
    kind, _, size = head.partition(b" ")
    if not nul or kind not in _TYPES or not size.isdigit() or int(size) != len(body):
        raise Unreadable("a loose object that does not parse")
    return _TYPES[kind], body


def _varint(data: bytes, i: int) -> tuple[int, int]:
    val, shift = 0, 0
    while True:
        c = data[i]
        i += 1
        val |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return val, i


def _apply_delta(base: bytes, delta: bytes) -> bytes:
    try:
        src, i = _varint(delta, 0)
        dst, i = _varint(delta, i)
        if src != len(base) or dst > MAX_OBJECT:
            raise Unreadable("a delta for another base")
        out = bytearray()
        while i < len(delta):
            op = delta[i]
            i += 1
            if op & 0x80:
                off = size = 0
                for bit in range(4):
                    if op & (1 << bit):
                        off |= delta[i] << (8 * bit)
                        i += 1
                for bit in range(3):
                    if op & (0x10 << bit):
                        size |= delta[i] << (8 * bit)
                        i += 1
                size = size or 0x10000
                if off + size > len(base):
                    raise Unreadable("a delta copying past its base")
                out += base[off:off + size]
            elif op:
                out += delta[i:i + op]
                i += op
            else:
                raise Unreadable("a delta with a reserved opcode")
        if len(out) != dst:
            raise Unreadable("a delta of the wrong length")
        return bytes(out)
    except IndexError:
        raise Unreadable("a truncated delta") from None


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


def _parse_index(data: bytes, hash_len: int, budget: "Budget | None" = None) -> tuple[dict, str | None]:
    """path -> ((stage, mode, object id), …) of every entry; and a split index's shared id.
    At most MAX_INDEX_ENTRIES entries; the budget is checked as it goes."""
    if data[:4] != b"DIRC":
        raise Unreadable("not an index file")
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3, 4):
        raise Unreadable(f"index version {version}")
    if count > MAX_INDEX_ENTRIES:
        raise Unreadable(f"{count} entries, over the {MAX_INDEX_ENTRIES} read")
    pos, out, prev = 12, {}, b""
    fixed = 40 + hash_len
    for i in range(count):
        if budget is not None and not i & 4095:
            budget.check()
        start = pos
        mode = struct.unpack(">I", data[pos + 24:pos + 28])[0]
        oid = data[pos + 40:pos + 40 + hash_len].hex()
        flags = struct.unpack(">H", data[pos + fixed:pos + fixed + 2])[0]
        pos += fixed + 2
        if version >= 3 and flags & 0x4000:
            pos += 2
        if version == 4:
            strip, pos = _varint_offset(data, pos)
            end = data.index(b"\0", pos)
            name = prev[:len(prev) - strip] + data[pos:end]
            pos = end + 1
        else:
            end = data.index(b"\0", pos)
            name = data[pos:end]
            pos = start + ((end - start + 8) & ~7)
        if pos > len(data):
            raise Unreadable("a truncated index")
        out[name] = tuple(sorted(out.get(name, ()) + (((flags >> 12) & 3, mode, oid),)))
        prev = name
    shared = None
    while pos + 8 <= len(data) - hash_len:
        sig, size = data[pos:pos + 4], struct.unpack(">I", data[pos + 4:pos + 8])[0]
        if sig == b"link" and size >= hash_len:
            shared = data[pos + 8:pos + 8 + hash_len].hex()
        pos += 8 + size
    return out, shared


def _varint_offset(data: bytes, pos: int) -> tuple[int, int]:
    """git's offset varint (index v4's prefix length, a pack's OFS_DELTA)."""
    c = data[pos]
    pos += 1
    val = c & 0x7F
    while c & 0x80:
        c = data[pos]
        pos += 1
        val = ((val + 1) << 7) | (c & 0x7F)
    return val, pos


# --- small things ----------------------------------------------------------------------------

def _text(b: bytes) -> str:
    return b.decode("utf-8", "backslashreplace")


def _is_hex(s: str) -> bool:
    return len(s) in (40, 64) and all(c in "0123456789abcdef" for c in s)


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
