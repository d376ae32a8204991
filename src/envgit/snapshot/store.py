"""The public face of the snapshot store: snapshot, diff, read, restore, fsck, gc.

Everything here speaks tree ids as hex strings; the store knows nothing about steps.
"""

import gc
import os
import time
from typing import cast, overload

from . import maintenance
from .capture import ALL, Capture, Snapshot, close_changes
from .diff import Change, diff_trees, read_tree
from .encoding import DIR, SYMLINK, Entry, decode_chunks
from .filter import Filter
from .ids import BLOB, CHUNKS, CorruptObject
from .objects import ObjectStore, StoreError
from .restore import RestorePlan, apply_plan, make_plan
from .statcache import StatCache


class Store:
    def __init__(self, path):
        """Open (creating the layout if missing) the store at `path`, e.g. `.envgit/objects`."""
        self.objects = ObjectStore(path)

    def close(self) -> None:
        self.objects.close()

    # -- capture --------------------------------------------------------------------------
    def snapshot(self, root, flt: Filter | None = None, cache: StatCache | None = None,
                 watcher=None, counters: dict | None = None) -> Snapshot:
        """Store the directory `root` as it is now; returns its tree id and what was left out.
        With `cache`, unchanged files are not re-read (and the cache is saved if it has a path
        and `cache.autosave`); with `watcher`, only directories with events are re-listed.
        `counters`: a dict kept current while the walk runs (files_hashed, bytes_hashed, …),
        which another thread may read to show progress."""
        started = time.perf_counter()
        flt = flt or Filter()
        cache = cache if cache is not None else StatCache()
        changes = watcher.changes() if watcher is not None else None
        if cache.filter_key != flt.key():    # memos classify children by another filter
            cache.untrust()
            cache.filter_key = flt.key()
            changes = None
        objects = self.objects
        # Damage found since the last snapshot (by any process: one stat when there is none):
        # the files and directories holding it are read again, so their content is stored
        # afresh instead of reused by id.
        objects.refresh_damaged()
        damaged = objects.take_news() if objects.news else None
        if damaged:
            for rel in cache.forget_objects(damaged, lambda oid: _holds(objects, oid)):
                if changes is not None:
                    changes[rel] = ALL
        if changes is not None:
            changes = close_changes(changes, cache)
        written = objects.written_objects, objects.written_bytes
        capture = Capture(objects, flt, cache, changes)
        if counters is not None:
            capture.stats = counters
            counters.update(dirs_listed=0, dirs_rechecked=0, entries_statted=0, files_hashed=0,
                            bytes_hashed=0, trees_encoded=0)
        # The walk allocates a tuple per entry but builds no cycles; with a large cache in the
        # heap, the cyclic collector's full passes would cost more than the walk itself.
        collecting = gc.isenabled()
        gc.disable()
        try:
            tree_id = capture.root_tree(root)
            objects.flush()
        except BaseException:
            objects.abort()
            if watcher is not None:
                watcher.full = True          # the events it drained were not all applied
            raise
        finally:
            if collecting:
                gc.enable()
        if cache.autosave:
            cache.save()
        stats = dict(capture.stats, objects_written=objects.written_objects - written[0],
                     bytes_written=objects.written_bytes - written[1], watcher=changes is not None)
        return Snapshot(tree_id.hex(), cache.left_out(), (time.perf_counter() - started) * 1000, stats)

    # -- reading --------------------------------------------------------------------------
    def diff(self, tree_a: str | None, tree_b: str | None) -> list[Change]:
        """Changes from tree_a to tree_b (None: the empty directory)."""
        return diff_trees(self.objects, _raw(tree_a), _raw(tree_b))

    def diff_worktree(self, tree_a: str | None, root, flt: Filter | None = None,
                      cache: StatCache | None = None, watcher=None) -> list[Change]:
        """Changes from tree_a to the directory as it is now (by snapshotting it)."""
        return self.diff(tree_a, self.snapshot(root, flt, cache, watcher).tree_id)

    def read_file(self, tree_id: str, path: bytes) -> bytes:
        """The content of the file at `path` ("/"-separated bytes) in the tree; for a symlink,
        its target. FileNotFoundError / IsADirectoryError like the file system would say."""
        # decode_tree gives a symlink's entry its target and every other entry its oid: the
        # casts below only tell mypy which of the two an entry of a known type has.
        entries = read_tree(self.objects, _raw(tree_id))
        *dirs, last = path.strip(b"/").split(b"/")
        for name in dirs:
            entry = _named(entries, name)
            if entry is None or entry.type != DIR:
                raise FileNotFoundError(f"{os.fsdecode(path)}: not in tree {tree_id}")
            entries = read_tree(self.objects, cast(bytes, entry.oid))
        entry = _named(entries, last)
        if entry is None:
            raise FileNotFoundError(f"{os.fsdecode(path)}: not in tree {tree_id}")
        if entry.type == DIR:
            raise IsADirectoryError(f"{os.fsdecode(path)}: a directory in tree {tree_id}")
        if entry.type == SYMLINK:
            return cast(bytes, entry.target)
        oid = cast(bytes, entry.oid)
        if entry.chunked:
            return b"".join(self.objects.get(cid, BLOB) for cid, _ in
                            decode_chunks(self.objects.get(oid, CHUNKS)))
        return self.objects.get(oid, BLOB)

    def cat(self, object_id: str) -> bytes:
        """One object's bytes (a blob's content; a tree's or chunk index's encoding), verified."""
        return self.objects.get(bytes.fromhex(object_id))

    # -- restore --------------------------------------------------------------------------
    def plan_restore(self, root, tree_id: str, flt: Filter | None = None,
                     paths: list[bytes] | None = None, cache: StatCache | None = None,
                     watcher=None) -> RestorePlan:
        """What restoring `tree_id` into `root` would write, delete and keep. It snapshots the
        directory first (that snapshot's id is `plan.current_tree_id`: the undo point)."""
        flt = flt or Filter()
        current = self.snapshot(root, flt, cache, watcher)
        plan = make_plan(self.objects, bytes.fromhex(current.tree_id), current.left_out,
                         bytes.fromhex(tree_id), flt, paths)
        plan.current_tree_id = current.tree_id
        return plan

    def restore(self, root, plan: RestorePlan) -> None:
        """Apply a plan. Refuses (RestoreRefused, nothing changed) if an object it needs is
        missing or corrupt. Idempotent: after a crash, running it again finishes the job."""
        apply_plan(self.objects, root, plan)

    # -- maintenance ----------------------------------------------------------------------
    def fsck(self, root_ids: list[str], progress=None) -> list[str]:
        """Every object re-hashed; every tree and chunk index reachable from the roots present
        and well-formed. Returns the problems found (empty: all good). `progress(done, total)`
        counts packs."""
        from .heal import note_damage, recheck_listed
        recheck_listed(self.objects)      # a listed copy that reads back sound is used again
        problems = maintenance.fsck(self.objects, [bytes.fromhex(r) for r in root_ids], progress)
        if problems:          # remember the damaged copies, so the next snapshot stores them again
            note_damage(self.objects)
        return problems

    def check_tree(self, tree_id: str) -> list[str]:
        """What is wrong under the tree (empty: every tree and chunk index under it reads back
        sound and every blob it names is in the store). It goes on past the first problem, so
        every damaged object it meets is quarantined in one pass (see ObjectStore.get)."""
        problems: list[str] = []
        maintenance.mark(self.objects, [_raw(tree_id)], problems)
        return problems

    def gc(self, keep_root_ids: list[str], progress=None) -> int:
        """Drop what no kept root reaches; `progress(done_packs, total_packs)`. Returns bytes
        freed. Needs the store to itself (no snapshot running)."""
        return maintenance.gc(self.objects, [bytes.fromhex(r) for r in keep_root_ids], progress)


def _holds(objects: ObjectStore, chunks_id: bytes) -> bool:
    """Does the chunk index name a chunk found damaged (unreadable: it counts as doing so)?"""
    if chunks_id in objects.damaged:
        return True
    try:
        return any(cid in objects.damaged and cid not in objects.index
                   for cid, _ in decode_chunks(objects.get(chunks_id, CHUNKS)))
    except (StoreError, CorruptObject):
        return True


def _named(entries: list[Entry], name: bytes) -> Entry | None:
    return next((e for e in entries if e.name == name), None)


@overload
def _raw(tree_id: str) -> bytes: ...


@overload
def _raw(tree_id: None) -> None: ...


@overload
def _raw(tree_id: str | None) -> bytes | None: ...


def _raw(tree_id: str | None) -> bytes | None:
    if tree_id is None:
        return None
    try:
        return bytes.fromhex(tree_id)
    except ValueError:
        raise StoreError(f"{tree_id!r} is not a tree id") from None
