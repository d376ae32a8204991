"""The daemon's snapshotter: the store, the stat cache and the change watcher kept resident,
so the snapshot after a step re-lists only the directories inotify saw change.

It turns a snapshot into the summary the journal keeps on a step: the root tree id, what was
added, modified and deleted since the previous step's tree, what was left out, and the cost.
"""

import os
import threading
import time

from ..snapshot import ChangeWatcher, CorruptObject, Filter, StatCache, Store, StoreError
from ..snapshot.restore import apply_plan, make_plan
from ..snapshot.scrub import STEP_BUDGET, Scrubber
from ..snapshot.statcache import STAT

MAX_PATHS = 200           # paths listed on a step; the counts are always complete
SAVE_CACHE_EVERY_S = 30   # the stat cache is also saved when the daemon exits


class SnapshotFailed(Exception):
    """A step's snapshot could not be taken (the cause is in the message); the step still ends."""


def display(path: bytes) -> str:
    """A path as text for the journal and the terminal: undecodable bytes shown as \\xNN."""
    return path.decode("utf-8", "backslashreplace")


class Snapshotter:
    def __init__(self, project):
        self.root = project.root
        self.store = Store(project.state_path("objects"))
        self.cache_path = project.state_path("statcache")
        self.cache = StatCache(self.cache_path, autosave=False)
        self.lock = threading.Lock()
        self._watcher = None
        self._watch_key = None
        self._saved_at = time.monotonic()
        self.counters = None            # the running take's counters (progress), if asked for
        self.scrubber = Scrubber(self.store.objects)

    def scrub(self, busy, budget=None):
        """Re-verify packs for a moment while no step runs (snapshot/scrub.py); `busy()` says
        a step or request began, and the work stops at once."""
        try:
            self.scrubber.run(self.lock, busy, budget=budget)
        except Exception as e:     # never the idle loop's end (the daemon would not idle out)
            print(f"envgit daemon: re-verifying packs stopped: {e!r}", flush=True)
            self.scrubber.current = None

    def filter(self, policy) -> Filter:
        return Filter(exclude=policy.snapshot_exclude, max_file_size=policy.max_file_size)

    def plan_restore(self, policy, tree: str, paths: list[str] | None, prev_tree: str | None = None):
        """(plan, summary): what bringing the project back to `tree` would change, from one
        snapshot of the directory as it is (`plan.current_tree_id`, the undo point), and that
        snapshot's summary against `prev_tree` (what changed since the last step: the changes
        made outside envgit that the undo point records). A damaged object met on the way is
        quarantined and the directory snapshotted afresh once (see take)."""
        flt = self.filter(policy)
        raw = [p.encode() for p in paths] if paths else None
        with self.lock:
            for attempt in (1, 2):
                snap, changes, problem = self._take_checked(flt, prev_tree)
                try:
                    plan = make_plan(self.store.objects, bytes.fromhex(snap.tree_id), snap.left_out,
                                     bytes.fromhex(tree), flt, raw)
                    break
                except (StoreError, CorruptObject):
                    if attempt == 2:
                        raise
                    self._start_afresh()    # the memos may name a damaged tree as unchanged
        plan.current_tree_id = snap.tree_id
        summary = summarize(snap, changes)
        if problem:
            summary["diff_error"] = problem
        return plan, summary

    def git_view(self, tree_a: str, tree_b: str) -> list:
        """The `.git` changes between two trees as git sees them (snapshot/gitview.py)."""
        from ..snapshot.gitview import git_changes
        with self.lock:
            return git_changes(self.store, tree_a, tree_b)

    def restore(self, plan, progress=None):
        """Apply a plan made by plan_restore: a path found changed since that snapshot (a
        person's save while the rewind writes) stops it before that path is touched."""
        with self.lock:
            apply_plan(self.store.objects, self.root, plan, progress, self._seen)

    def _seen(self, path: bytes):
        """The stamp the last snapshot saw at `path` (statcache STAT), None where it saw none."""
        parent, _, name = path.rpartition(b"/")
        memo = self.cache.dirs.get(parent)
        kid = memo.kids.get(os.fsdecode(name)) if memo is not None else None
        return kid[STAT] if kid is not None else None

    def gc(self, keep_trees, progress) -> int:
        with self.lock:
            return self.store.gc(sorted(keep_trees), progress)

    def _watcher_for(self, flt):
        if self._watch_key != flt.key():
            if self._watcher is not None:
                self._watcher.close()
            try:
                self._watcher = ChangeWatcher(self.root, flt)
            except OSError:                 # no inotify (or out of watches): walk instead
                self._watcher = None
            self._watch_key = flt.key()
        return self._watcher

    def take(self, policy, prev_tree: str | None, counters: dict | None = None, newest=None,
             diff: bool = True) -> dict:
        """Snapshot the project now; the summary of its changes since `prev_tree`, or with
        `newest` (the session) since `newest.last_tree`, read and replaced by the new tree
        under the lock: steps that end at once are snapshotted one after another, and each is
        compared with the one taken just before it, never with an older tree. `taken_at`
        in the summary orders trees in time (steporder.py: what `last` names).

        A damaged object (a flipped byte, a pack gone) must not stop every later step: the
        store quarantines what it found damaged, the stat cache and watcher are dropped, and
        the directory is snapshotted afresh (every file re-read, every tree re-encoded, the
        quarantined objects stored again). If the fresh tree is sound but the previous one is
        not, the summary says the changes cannot be listed (`diff_error`). If the fresh
        snapshot fails too, SnapshotFailed says why; the caller records it on the step.
        `counters`: kept current during the walk (Store.snapshot), for progress. `diff=False`:
        the changes are not listed (a baseline's would be every file of the project)."""
        flt = self.filter(policy)
        with self.lock:
            self.counters = counters
            try:
                snap, changes, problem = self._take_checked(flt, newest.last_tree if newest else prev_tree,
                                                            diff)
            finally:
                self.counters = None
            taken_at = time.time_ns()
            if newest is not None:
                newest.last_tree = snap.tree_id
        # A step's share of re-verifying packs, off the lock and off the step's path (its
        # summary is built and sent meanwhile): back-to-back steps leave the idle loop no time.
        threading.Thread(target=self.scrub, args=(self.lock.locked, STEP_BUDGET), daemon=True,
                         name="envgit-scrub").start()
        summary = summarize(snap, changes)
        summary["taken_at"] = taken_at
        if problem:
            summary["diff_error"] = problem
        return summary

    def _take_checked(self, flt, prev_tree, diff=True):
        """_take, retried afresh once past a damaged object (see take); the lock is held."""
        try:
            snap, changes, problem = self._take(flt, prev_tree, diff)
        except OSError:                 # disk full, permissions: the next one starts afresh
            self._start_afresh()
            raise
        except (StoreError, CorruptObject):
            self._start_afresh()
            try:
                snap, changes, problem = self._take(flt, prev_tree, diff)
            except (StoreError, CorruptObject) as e:
                self._start_afresh()
                raise SnapshotFailed(f"the snapshot could not be taken: {e}") from None
        if time.monotonic() - self._saved_at > SAVE_CACHE_EVERY_S:
            self.save()
        return snap, changes, problem

    def _take(self, flt, prev_tree, diff=True):
        """(snapshot, changes since prev_tree, why the changes are unknown or None)."""
        snap = self._capture(flt)
        if prev_tree == snap.tree_id or not diff:
            return snap, [], None
        try:
            return snap, self.store.diff(prev_tree, snap.tree_id), None
        except (StoreError, CorruptObject) as e:
            damaged = self.store.check_tree(snap.tree_id)   # is it the new tree that is damaged?
            if damaged:
                raise StoreError("; ".join(damaged[:3])) from None
            return snap, [], (f"the previous snapshot ({prev_tree}) is damaged, so this step's "
                              f"changes cannot be listed: {e}")

    def _capture(self, flt):
        try:
            return self.store.snapshot(self.root, flt, self.cache, self._watcher_for(flt), self.counters)
        except OSError:
            if self._watcher is None:
                raise
            self._watcher.close()       # a watcher gone wrong: fall back to a full walk
            self._watcher, self._watch_key = None, None
            return self.store.snapshot(self.root, flt, self.cache, None, self.counters)

    def _start_afresh(self):
        """Forget every memo (the cache may name damaged trees as unchanged) and the watcher:
        the next snapshot walks and reads the whole directory."""
        self.cache = StatCache(None, autosave=False)
        self.cache.path = self.cache_path
        self.cache.changed = True
        if self._watcher is not None:
            self._watcher.close()
        self._watcher, self._watch_key = None, None

    def save(self):
        self.cache.save()
        self._saved_at = time.monotonic()

    def close(self):
        with self.lock:
            self.save()
            if self._watcher is not None:
                self._watcher.close()
            self.store.close()


def summarize(snap, changes) -> dict:
    counts = {"added": 0, "modified": 0, "deleted": 0}
    size_added = 0
    files = [c for c in changes if (c.new_type or c.old_type) != "dir"]
    for c in files:
        status = "modified" if c.status == "type-changed" else c.status
        counts[status] += 1
        if c.new_size is not None and status != "deleted":
            size_added += c.new_size
    left = [{"path": display(p), "size": size, "reason": reason} for p, size, reason in snap.left_out]
    return {
        "tree": snap.tree_id,
        **counts,
        "bytes": size_added,
        "paths": [{"path": display(c.path), "status": c.status} for c in files[:MAX_PATHS]],
        "paths_truncated": len(files) > MAX_PATHS,
        "dirs_changed": len(changes) - len(files),
        "left_out": {"count": len(left), "bytes": sum(x["size"] for x in left), "paths": left[:MAX_PATHS]},
        "ms": round(snap.ms, 3),
        "stats": snap.stats,
    }
