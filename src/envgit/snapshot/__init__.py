"""envgit's snapshot store: content-addressed, deduplicated snapshots of a directory.

    store = Store(Path(".envgit/objects"))
    snap = store.snapshot(root, Filter(exclude=[...]), StatCache(Path(".envgit/statcache")))
    store.diff(snap_a.tree_id, snap_b.tree_id)
    store.restore(root, store.plan_restore(root, snap_a.tree_id, flt))

It takes and returns tree ids (hex strings) and knows nothing about steps. Format: docs/FORMAT.md.
"""

from .capture import Snapshot
from .diff import Change
from .filter import Filter
from .ids import CorruptObject
from .objects import MissingObject, StoreError
from .packs import StoreFull
from .restore import Item, RestorePlan, RestoreRefused
from .statcache import StatCache
from .store import Store
from .watcher import ChangeWatcher

__all__ = ["Store", "Filter", "StatCache", "ChangeWatcher", "Snapshot", "Change", "RestorePlan",
           "Item", "StoreError", "StoreFull", "CorruptObject", "MissingObject", "RestoreRefused"]
