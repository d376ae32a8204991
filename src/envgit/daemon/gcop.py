"""`envgit gc` as the session daemon runs it: the retention rule chooses the steps whose
snapshots are dropped, the drop is journaled, then the store deletes every object nothing kept
reaches (snapshot/maintenance.py) and the VM's memory snapshots follow their steps. Branches
keep what they reach whatever the rule says (branch/rewound.py: a rewound branch's steps, a
fork branch's fork point) until `envgit branch rm` removes them."""

import asyncio
import time

from .. import faults
from ..branch.registry import BadRecord
from ..branch.rewound import kept_steps
from ..policy import PolicyError
from ..snapshot import CorruptObject, StoreError
from .snapshots import SnapshotFailed


async def collect(sess, msg, conn=None):
    """Drop the snapshots outside the retention rule, then every object nothing kept reaches.
    Under the tree lock, as a rewind and an adopt run: an adopt copies a fork's objects into
    the store before its step names them, and a gc in between would delete them."""
    async with sess.tree_lock:
        return await _collect(sess, msg, conn)


async def _collect(sess, msg, conn):
    if sess.live:
        return {"error": f"envgit: step {min(sess.live)} is running; gc when no step runs", "exit": 2}
    last, within = msg.get("keep_last"), msg.get("keep_within_s")
    bad = gc_arguments_problem(last, within)
    if bad:
        return {"error": f"envgit: {bad}", "exit": 2}
    steps = sess.journal.steps()
    dropped_before = sess.journal.dropped_snapshots()
    with_tree = [s for s in steps if s.snapshot and s.snapshot.get("tree") and s.id not in dropped_before]
    keep = retained(with_tree, last, within, time.time_ns())
    try:
        by_branches = {s.id for s in with_tree if s.id not in keep} & kept_steps(steps, sess.project)
    except (BadRecord, OSError) as e:       # what a branch reaches cannot be told: keep all
        return {"error": f"envgit: gc deleted nothing: a branch record cannot be read ({e}); "
                "fix or remove it (`envgit branches` lists them)", "exit": 2}
    keep |= by_branches
    drop = [s.id for s in with_tree if s.id not in keep]
    roots = set(sess.journal.live_trees(dropping=drop))
    if sess.last_tree:
        roots.add(sess.last_tree)
    loop = asyncio.get_running_loop()

    def progress(done, total):          # on the gc thread: hand the frame to the loop
        if conn is not None:
            loop.call_soon_threadsafe(sess.push_to, conn,
                                      {"push": "progress", "text": f"repacked {done}/{total} packs",
                                       "done": done, "total": total, "unit": "pack",
                                       "what": "gc: repacking"})

    # The drop is journaled before the store deletes anything: a gc killed midway has
    # dropped exactly what its row says, and the next gc finishes the store's part.
    if drop:
        sess.journal.append(0, "gc", {"dropped": drop, "kept": sorted(keep),
                                      **({"branches": sorted(by_branches)} if by_branches else {})})
    faults.point("gc-journaled")
    try:
        freed = await asyncio.to_thread(sess.snapshotter.gc, roots, progress)
    except (StoreError, CorruptObject):
        # What gc found damaged is quarantined now: a snapshot of the directory (recorded on
        # no step) stores again whatever of it the directory still holds; then gc once more.
        try:
            await asyncio.to_thread(sess.snapshotter.take, sess.policy(), None)
            freed = await asyncio.to_thread(sess.snapshotter.gc, roots, progress)
        except (StoreError, CorruptObject, SnapshotFailed, OSError, PolicyError) as e:
            return {"error": f"envgit: gc deleted nothing: {e}; `envgit fsck` lists what is "
                    "damaged (a kept snapshot must read back whole before gc can tell what it "
                    "reaches; `envgit gc --keep-last N` can drop the damaged steps, once no branch keeps "
                    "them: `envgit branches` lists those, `envgit branch rm ID` lets them go)", "exit": 4}
    sess.journal.append(0, "gc-done", {"freed": freed})
    from ..vm import memstore  # memory snapshots (backend: vm) follow their steps
    if sess.vm is not None:         # under the machine's lock, none being written meanwhile
        mem_freed, mem_dropped = await asyncio.to_thread(sess.vm.collect, keep)
    else:
        mem_freed, mem_dropped = await asyncio.to_thread(memstore.collect, sess.project, keep)
    return {"dropped": drop, "freed": freed, "kept": sorted(keep), "kept_by_branches": sorted(by_branches),
            "memory_freed": mem_freed, "memory_dropped": mem_dropped}


def retained(with_tree, last, within, now_ns):
    """The steps whose snapshots the retention rule keeps, of `with_tree` (steps with a
    snapshot, oldest first): all of them without a rule; else the newest always, the `last`
    newest, and those begun within `within` seconds of `now_ns`."""
    if last is None and within is None:
        return {s.id for s in with_tree}
    keep = {with_tree[-1].id} if with_tree else set()
    if last:
        keep |= {s.id for s in with_tree[-last:]}
    if within is not None:
        cutoff = now_ns - int(within * 1e9)
        keep |= {s.id for s in with_tree if s.started_ns >= cutoff}
    return keep


def gc_arguments_problem(last, within):
    """What is wrong with gc's retention arguments (None: nothing). Checked here, not only
    by the CLI: nonsense such as a negative count would otherwise select steps to drop."""
    if last is not None and (type(last) is not int or last < 1):
        return f"gc --keep-last {last!r}: give a whole number of steps, 1 or more"
    if within is not None and (type(within) not in (int, float) or not within > 0
                               or within == float("inf")):
        return f"gc --keep-within {within!r}: give a duration greater than zero, e.g. 7d, 12h, 30m"
    return None
