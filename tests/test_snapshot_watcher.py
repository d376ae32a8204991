"""The resident change watcher: a snapshot that re-lists only what inotify saw equals a full walk."""

import os
import shutil

from envgit.snapshot import ChangeWatcher, Filter, StatCache, Store


def build(root):
    for i in range(30):
        d = root / f"dir{i % 6}" / f"sub{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i}").write_text(f"content {i}")


def age(root):
    """Files written just now are racy (re-read until their timestamp is safely old): age them."""
    past = os.stat(root).st_mtime_ns - 10 * 10**9
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            os.utime(os.path.join(dirpath, name), ns=(past, past))


def full_walk(store, root, flt):
    return store.snapshot(root, flt, StatCache()).tree_id    # fresh cache: reads everything


def test_watcher_sees_changes_and_matches_a_full_walk(tmp_path):
    root = tmp_path / "work"
    build(root)
    age(root)
    store, flt = Store(tmp_path / "store"), Filter(exclude=["*.tmp"])
    cache, watcher = StatCache(autosave=False), ChangeWatcher(root, flt)
    try:
        first = store.snapshot(root, flt, cache, watcher=watcher)
        assert first.stats["watcher"] is False          # the first one walks everything
        idle = store.snapshot(root, flt, cache, watcher=watcher)
        assert idle.tree_id == first.tree_id and idle.stats["dirs_listed"] == 0

        (root / "dir2" / "sub2" / "file14").write_text("changed")
        one = store.snapshot(root, flt, cache, watcher=watcher)
        assert one.stats["watcher"] and one.stats["files_hashed"] == 1
        assert one.stats["dirs_listed"] == 3              # the directory and its two ancestors
        assert one.tree_id == full_walk(store, root, flt) != first.tree_id

        # Every other kind of change, in one step.
        (root / "dir0" / "sub0" / "file0").unlink()
        (root / "dir5" / "new" / "deeper").mkdir(parents=True)
        (root / "dir5" / "new" / "deeper" / "n.txt").write_text("new")
        os.chmod(root / "dir1" / "sub1" / "file1", 0o755)
        os.chmod(root / "dir3", 0o700)
        os.symlink("../dir1", root / "dir4" / "link")
        shutil.rmtree(root / "dir2" / "sub2")
        (root / "dir4" / "scratch.tmp").write_text("excluded")
        many = store.snapshot(root, flt, cache, watcher=watcher)
        assert many.stats["watcher"]
        assert many.tree_id == full_walk(store, root, flt)
        assert many.left_out == [(b"dir4/scratch.tmp", 8, "excluded")]

        # A directory renamed: the watcher cannot remap paths cheaply and asks for a full walk.
        os.rename(root / "dir1", root / "dir1-renamed")
        (root / "dir1-renamed" / "sub1" / "after.txt").write_text("after the move")
        moved = store.snapshot(root, flt, cache, watcher=watcher)
        assert moved.stats["watcher"] is False
        assert moved.tree_id == full_walk(store, root, flt)
        (root / "dir1-renamed" / "sub1" / "after.txt").write_text("watched again")
        again = store.snapshot(root, flt, cache, watcher=watcher)
        assert again.stats["watcher"] and again.tree_id == full_walk(store, root, flt)
    finally:
        watcher.close()
