"""Changes made outside envgit (the person's editor, their own `git commit`, a file copied in)
between two steps: recorded as a step of their own, one `outside` entry, before the next step
or rewind begins, so they are never charged to the step after them and a rewind's undo point
holds them.

How it is seen: the directory is snapshotted against the last tree the daemon knows (the newest
snapshot in time, steporder.py: with steps run at once that is not the highest step's). While
the daemon runs, the resident stat cache and inotify watcher make that a look at the
directories that had events (well under a millisecond when nothing changed); a daemon just
started walks the directory once with the stat cache read from disk, which the step's own
snapshot would otherwise have done after it. Nothing is checked while another step runs: a
change then cannot be told from that step's own (a long `envgit run`). While only agents'
session steps run (`envgit claude`'s, open until the agent exits), the escape routes alone are
(record_routes): what no sandbox could write there was written from outside, by the person.
"""

import os
import time
import weakref

from .. import steporder
from ..sandbox import routes
from ..snapshot.capture import Snapshot
from ..snapshot.diff import read_tree
from ..snapshot.encoding import DIR, SYMLINK, encode_tree
from ..snapshot.ids import TREE, CorruptObject
from ..snapshot.objects import StoreError
from . import special_bits
from .snapshots import SnapshotFailed, summarize


def record(sess, pol, before: str) -> int | None:
    """Snapshot the project; if it differs from the last tree, record the difference as an
    `outside` step and make its tree the last one. Returns that step's id, or None when nothing
    changed. Call with the session's tree lock held and no step running."""
    if sess.last_tree is None:
        return None                     # no tree yet: the first step's baseline covers it
    try:
        summary = sess.snapshotter.take(pol, sess.last_tree)
    except (SnapshotFailed, OSError) as e:     # the step goes on; its own snapshot says more
        print(f"envgit daemon: changes made outside envgit could not be looked for: {e}", flush=True)
        return None
    if summary["tree"] == sess.last_tree:
        return None
    return write(sess, summary, before)


def write(sess, summary, before: str, extra: dict | None = None) -> int:
    """The `outside` step for a snapshot already taken (its summary against sess.last_tree).
    `extra`: more of the entry's body (record_routes: its paths were found writable from no
    sandbox, so the sandboxes alive are not counted)."""
    last = steporder.newest_tree(sess.journal)     # newest in time: steps run at once
    since = last.step if last is not None and last.tree == sess.last_tree else None
    body = {"snapshot": summary, "session": sess.id, "user": _me(), "since_step": since, "before": before,
            **(extra or {})}
    alive = sandboxes_holding(sess.project.root) if extra is None else 0
    if alive:           # a sandbox outlived its step (the MCP REPL): not only the person could write
        body["sandboxes_alive"] = alive
    # No setuid/setgid bit stays in the project, however it got there (special_bits.py): one
    # that appeared between steps is stripped here, where it is first seen, and said after the
    # step that follows (it used to be that step's change, stripped at its end).
    stripped = special_bits.strip(sess.project.root, summary)
    if stripped:
        body["setuid_stripped"] = stripped
        sess.outside_notices.append(
            "setuid-stripped: a setuid or setgid bit on files changed outside envgit (outside step "
            "{step}) was removed (a program anyone could run as their owner): " + ", ".join(stripped))
    step = sess.journal.outside_step(body)
    if stripped:
        sess.outside_notices[-1] = sess.outside_notices[-1].replace("{step}", str(step))
    sess.last_tree, sess.tree_unknown = summary["tree"], False
    return step


# --- while an agent's session is open ---------------------------------------------------------

class RouteWatch:
    """What record_routes keeps between two looks, per session daemon."""

    def __init__(self):
        self.stamps: dict | None = None     # the routes' fingerprint at the last look
        self.mounts: dict | None = None     # mount namespace -> [(mount point, read-only)] then
        self.agents: frozenset = frozenset()  # the agents' session steps running then


_WATCH: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def agent_sessions_only(live) -> dict:
    """{step: LiveStep} when every running step is an agent's session step (record-only,
    marked agent-session): nothing but the agent's own sandbox, where the routes are read-only,
    is at work; else {}. Read on the event loop (the look runs in a thread)."""
    return dict(live) if live and all(info.agent_session for info in live.values()) else {}


def record_routes(sess, pol, before: str, agents: dict, ending: int | None = None) -> int | None:
    """While only agents' session steps run: the escape routes (sandbox/routes.py, the list the
    last view bound) changed since the last snapshot by no sandbox, recorded as an `outside`
    step of those paths alone. The directory as a whole cannot be recorded then: the agent's
    own edits not yet recorded (a Claude Write before its PostToolUse step) are in it, and are
    a step's. The look is a stat of each route (~the fingerprint a step takes); only when one
    moved is the directory snapshotted (the resident cache makes it a look at what changed)
    and each changed route checked in every sandbox holding the project (/proc/PID/mountinfo):
    read-only there, or its read-only mount gone (only a rename or removal from outside detaches
    one: since the last look, or, in a sandbox not seen before, a protected route the agents'
    sessions began with, which their sandboxes bound), it was written from outside. `ending`:
    the agent's session step that is ending, its sandbox gone: the sandboxes seen at the last
    look answer as they were then, and, if none was seen during this session, its own as one
    with no mount left. Returns the step's id, or None. Call with the session's tree lock held."""
    rs = getattr(sess.scan, "routes", None)
    if rs is None or sess.last_tree is None or sess.tree_unknown:
        return None
    watch = _WATCH.setdefault(sess, RouteWatch())
    now = routes.fingerprint(rs.watch)
    if now == watch.stamps:
        return None
    root = sess.project.root
    unseen = ending is not None and ending not in watch.agents     # its sandbox, gone unseen
    known, watch.stamps = watch.mounts, now
    mounts = watch.mounts = sandbox_mounts(root)
    watch.agents = frozenset(agents)
    last = sess.last_tree
    try:
        whole = sess.snapshotter.take(pol, last)
    except (SnapshotFailed, OSError) as e:
        print(f"envgit daemon: escape routes changed outside could not be looked for: {e}", flush=True)
        return None
    if whole["tree"] == last:
        return None
    tops = [os.fsencode(os.path.relpath(w, root)) for w in rs.watch if w.startswith(root + "/")]
    snapshotter = sess.snapshotter
    with snapshotter.lock:              # against the tree the snapshot was compared with, still
        if sess.last_tree != last:
            return None
        objects = snapshotter.store.objects
        try:
            changed = [c.path for c in snapshotter.store.diff(last, whole["tree"])
                       if any(c.path == t or c.path.startswith(t + b"/") for t in tops)]
            picked = sorted({p for p in changed if not any(p.startswith(q + b"/") for q in changed)})
            began = _BoundAtStart(objects, root, rs.protect, [info.tree_before for info in agents.values()])
            picked = [p for p in picked if not _writable(os.path.join(root, os.fsdecode(p)),
                                                         {**mounts, None: []} if unseen else mounts,
                                                         known, began)]
            if not picked:
                return None
            tree = _graft(objects, bytes.fromhex(last), bytes.fromhex(whole["tree"]),
                          [tuple(p.split(b"/")) for p in picked])
            objects.flush()
            summary = summarize(Snapshot(tree.hex(), [], whole["ms"], whole["stats"]),
                                snapshotter.store.diff(last, tree.hex()))
        except (StoreError, CorruptObject, OSError) as e:   # the next step carries them, as before
            print(f"envgit daemon: escape routes changed outside could not be recorded: {e}", flush=True)
            return None
        summary["taken_at"] = time.time_ns()
        step = write(sess, summary, before, {"agent_session": sorted(agents)})
    _known_to_agents(agents.values(), now, [os.path.join(root, os.fsdecode(p)) for p in picked])
    return step


def _known_to_agents(infos, now: dict, paths: list[str]):
    """The routes recorded as changed outside are no longer the agents' session steps' to
    answer for at their end: in the fingerprint each took as it began, those paths, the
    directories above them and what is now below them take today's stamps. A path it did not
    fingerprint (nor a directory above it) stays out of it: its end would walk a directory
    that was never compared."""
    def related(k):
        return any(k == p or k.startswith(p + "/") or p.startswith(k + "/") for p in paths)
    for info in infos:
        before = info.routes
        if not before:
            continue
        for k in [k for k in before.keys() | now.keys() if related(k)]:
            if k in before or any(a in before for a in _parents(k)):
                before[k] = now.get(k)


def _parents(path: str):
    while (up := os.path.dirname(path)) != path:
        yield up
        path = up


def _writable(path: str, mounts: dict, known: dict | None, began) -> bool:
    """Whether a sandbox could have written `path`: in a mount namespace holding the project,
    the mount it lies on is not read-only, unless a read-only one it lay on is gone (a mount
    point renamed over or removed from outside): one seen at the last look, or, in a namespace
    not seen then, a protected route the agents' sessions began with (`began`). A namespace
    gone since the last look answers as it was then."""
    known = known or {}
    for ns in mounts.keys() | known.keys():
        if ns in mounts:
            point, ro = _mount_of(path, mounts[ns])
            if ro:
                continue
            points = {m for m, _ in mounts[ns]}
            if ns in known:
                was, was_ro = _mount_of(path, known[ns])
                if was_ro and was != point and was not in points:
                    continue
            elif began.detached(path, points):
                continue
            return True
        if not _mount_of(path, known[ns])[1]:
            return True
    return False


class _BoundAtStart:
    """Which protected routes the agents' sandboxes bound read-only: those present, not as a
    symlink (never bound at the link), in the tree each agent's session step began from (its
    sandbox's view is built right after). Read under the snapshot lock."""

    def __init__(self, objects, root: str, protect, trees: list):
        self.objects, self.root, self.protect, self.trees = objects, root, set(protect), trees

    def detached(self, path: str, points: set) -> bool:
        """`path`, or a directory above it, is such a route and no mount point now."""
        for a in [path, *_parents(path)]:
            if not a.startswith(self.root + "/"):
                return False
            if a in self.protect and a not in points and all(self._held(t, a) for t in self.trees):
                return True
        return False

    def _held(self, tree: str | None, path: str) -> bool:
        if tree is None:
            return False
        entries = read_tree(self.objects, bytes.fromhex(tree))
        *dirs, last = os.fsencode(os.path.relpath(path, self.root)).split(b"/")
        for name in dirs:
            e = next((e for e in entries if e.name == name), None)
            if e is None or e.type != DIR or e.oid is None:
                return False
            entries = read_tree(self.objects, e.oid)
        e = next((e for e in entries if e.name == last), None)
        return e is not None and e.type != SYMLINK


def _mount_of(path: str, mounts: list) -> tuple[str | None, bool]:
    """(mount point, read-only) of the mount `path` lies on; the last one mounted at the
    longest point above it is the one seen."""
    best, ro = None, False
    for point, is_ro in mounts:
        if (path == point or path.startswith(point.rstrip("/") + "/")) and \
                (best is None or len(point) >= len(best)):
            best, ro = point, is_ro
    return best, ro


def sandbox_mounts(root: str) -> dict:
    """{mount namespace: [(mount point, read-only)]} for each other mount namespace that has
    the project (or a path in it) mounted: a sandbox. One /proc walk (~1-2 ms)."""
    try:
        mine = os.readlink("/proc/self/ns/mnt")
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return {}
    out: dict = {}
    for pid in pids:
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
            if ns == mine or ns in out:
                continue
            with open(f"/proc/{pid}/mountinfo", "rb") as f:
                fields = [line.split(b" ", 6) for line in f]
            mounts = [(_unescape(x[4]), b"ro" in x[5].split(b",")) for x in fields]
        except (OSError, IndexError):
            continue
        if any(p == root or p.startswith(root.rstrip("/") + "/") for p, _ in mounts):
            out[ns] = mounts
    return out


def _graft(objects, old: bytes | None, new: bytes | None, paths: list[tuple]) -> bytes:
    """The tree `old` with each of `paths` (split into names) as it is in the tree `new`:
    taken from it whole, or removed where `new` has none. A directory on the way that `old`
    lacks is made as `new` has it, with the grafted paths alone."""
    olds = {e.name: e for e in read_tree(objects, old)} if old else {}
    news = {e.name: e for e in read_tree(objects, new)} if new else {}
    below: dict = {}
    for parts in paths:
        below.setdefault(parts[0], []).append(parts[1:])
    for name, rests in below.items():
        n, o = news.get(name), olds.get(name)
        if any(not r for r in rests):
            if n is None:
                olds.pop(name, None)
            else:
                olds[name] = n
            continue
        n_dir = n if n is not None and n.type == DIR else None
        if o is not None and o.type == DIR:
            olds[name] = o._replace(oid=_graft(objects, o.oid, n_dir and n_dir.oid, rests))
        elif o is None and n_dir is not None:
            olds[name] = n_dir._replace(oid=_graft(objects, None, n_dir.oid, rests))
        # else: a file of `old` on the way (its type changed too), not a route: left to a step
    return objects.put(TREE, encode_tree(sorted(olds.values(), key=lambda e: e.name)))


def sandboxes_holding(root: str) -> int:
    """How many processes of another mount namespace (a sandbox: bwrap makes one) have the
    project mounted, i.e. could have written it between steps. A long-lived sandboxed helper
    (the MCP REPL, kept across `execute` calls) is alive between steps; a timer in it could
    write then, and its change must not pass for the person's. Read only when a difference
    was found (a /proc walk: ~1-2 ms)."""
    try:
        mine = os.readlink("/proc/self/ns/mnt")
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0
    n = 0
    for pid in pids:
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") == mine:
                continue
            with open(f"/proc/{pid}/mountinfo", "rb") as f:
                points = [_unescape(line.split(b" ", 5)[4]) for line in f]
        except (OSError, IndexError):
            continue                    # gone, or not ours to read
        if any(p == root or p.startswith(root.rstrip("/") + "/") for p in points):
            n += 1
    return n


def _unescape(field: bytes) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    for esc, ch in ((b"\\040", b" "), (b"\\011", b"\t"), (b"\\012", b"\n"), (b"\\134", b"\\")):
        field = field.replace(esc, ch)
    return field.decode("utf-8", "surrogateescape")


def _me() -> str:
    import pwd
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def split_range(journal, a_step: int, a_tree: str, b_step: int | None, b_tree: str) -> list[dict]:
    """`envgit diff A B` cut where changes were made outside envgit, so that those are never
    shown as a step's: [{"from", "to" (names), "from_tree", "to_tree", "outside" (bool),
    "step" (the outside step, or None)}], in order, each with a different pair of trees.
    One part (the whole range) when no outside step lies in (A, B]; B None is the working
    tree."""
    ids = journal.outside_ids(a_step, b_step) if journal is not None else []
    if not ids:
        return [_part(f"step {a_step}", _name(b_step), a_tree, b_tree, None)]
    folded = {s.id: s for s in journal.steps_between(a_step, ids[-1])}
    parts, cur, cur_name = [], a_tree, f"step {a_step}"
    for o in ids:
        before = a_tree, f"step {a_step}"       # the last tree in [A, o): what o was compared with
        for n in range(o - 1, a_step, -1):
            tree = ((folded.get(n) and folded[n].snapshot) or {}).get("tree")
            if tree:
                before = tree, f"step {n}"
                break
        after = ((folded.get(o) and folded[o].snapshot) or {}).get("tree")
        if after is None:
            continue
        if before[0] != cur:
            parts.append(_part(cur_name, before[1], cur, before[0], None))
        parts.append(_part(before[1], f"step {o}", before[0], after, o))
        cur, cur_name = after, f"step {o}"
    if b_tree != cur:
        parts.append(_part(cur_name, _name(b_step), cur, b_tree, None))
    return parts or [_part(f"step {a_step}", _name(b_step), a_tree, b_tree, None)]


def _name(step):
    return "working tree" if step is None else f"step {step}"


def _part(a_name, b_name, a_tree, b_tree, outside_step):
    return {"from": a_name, "to": b_name, "from_tree": a_tree, "to_tree": b_tree,
            "outside": outside_step is not None, "step": outside_step}
