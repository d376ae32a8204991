"""The resident change watcher: a snapshot that re-lists only what inotify saw equals a full walk."""

import os
import shutil

import pytest

from envgit.snapshot import ChangeWatcher, Filter, StatCache, Store


def build(root):
    for i in range(30):
        d = root / f"dir{i % 6}" / f"sub{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i}").write_text(f"content {i}")


def age(root):
    """Files written just now are racy (re-read until their timestamp is safely old): age them."""
    past = os.stat(root).st_mtime_ns - 10 * 10**9
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            os.utime(os.path.join(dirpath, name), ns=(past, past))


def age_one(path):
    past = os.stat(path).st_mtime_ns - 10 * 10**9
    os.utime(path, ns=(past, past), follow_symlinks=False)


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


# -- the per-name path: one big folder, each kind of change on its own ------------------------
BIG = 600     # enough entries for a directory the watcher re-checks by name, and remembered trees


def build_big(root):
    big = root / "node_modules" / ".pnpm"
    big.mkdir(parents=True)
    for i in range(BIG):
        (big / f"entry{i}.js").write_text(f"module.exports = {i};\n")
    (root / "node_modules" / "pkg" / "lib").mkdir(parents=True)
    (root / "node_modules" / "pkg" / "lib" / "m.js").write_text("export {}\n")
    (root / "node_modules" / "pkg" / "debug.log").write_text("left out")
    (root / "top.txt").write_text("top")
    age(root)


def check(store, root, flt, cache, watcher, *, hashed=None, max_statted=20, new_dirs=0):
    """A watcher snapshot: the per-name path was taken, and it equals a full walk exactly."""
    snap = store.snapshot(root, flt, cache, watcher=watcher)
    walk = store.snapshot(root, flt, StatCache())
    assert snap.stats["watcher"], snap.stats
    assert snap.tree_id == walk.tree_id
    assert snap.left_out == walk.left_out
    assert snap.stats["entries_statted"] <= max_statted, snap.stats      # never all 600
    # Only new directories are listed; the others are re-checked by name.
    assert snap.stats["dirs_listed"] - snap.stats["dirs_rechecked"] == new_dirs, snap.stats
    if hashed is not None:
        assert snap.stats["files_hashed"] == hashed, snap.stats
    return snap


@pytest.fixture
def big(tmp_path):
    root = tmp_path / "work"
    build_big(root)
    store, flt = Store(tmp_path / "store"), Filter(exclude=["*.log"])
    cache, watcher = StatCache(autosave=False), ChangeWatcher(root, flt)
    first = store.snapshot(root, flt, cache, watcher=watcher)
    assert first.stats["watcher"] is False
    assert first.left_out == [(b"node_modules/pkg/debug.log", 8, "excluded")]
    yield store, flt, cache, watcher, root, root / "node_modules" / ".pnpm"
    watcher.close()
    store.close()


def test_per_name_change(big):
    store, flt, cache, watcher, root, d = big
    (d / "entry7.js").write_text("changed\n")
    snap = check(store, root, flt, cache, watcher, hashed=1)
    assert store.read_file(snap.tree_id, b"node_modules/.pnpm/entry7.js") == b"changed\n"
    # The left-out file of an untouched directory is still reported.
    assert snap.left_out == [(b"node_modules/pkg/debug.log", 8, "excluded")]


def test_per_name_create_and_delete(big):
    store, flt, cache, watcher, root, d = big
    (d / "aaa-first.js").write_text("new\n")
    (d / "zzz-last.js").write_text("new\n")
    age_one(d / "aaa-first.js")
    age_one(d / "zzz-last.js")
    (d / "entry300.js").unlink()
    snap = check(store, root, flt, cache, watcher)
    names = {c.path for c in store.diff(None, snap.tree_id)}
    assert b"node_modules/.pnpm/aaa-first.js" in names and b"node_modules/.pnpm/entry300.js" not in names
    (d / "aaa-first.js").unlink()
    check(store, root, flt, cache, watcher, hashed=0)


def test_per_name_rename_within_the_big_folder(big):
    store, flt, cache, watcher, root, d = big
    before = store.snapshot(root, flt, cache, watcher=watcher).tree_id
    os.rename(d / "entry5.js", d / "renamed.js")
    snap = check(store, root, flt, cache, watcher)
    assert {(c.path, c.status) for c in store.diff(before, snap.tree_id)} == {
        (b"node_modules/.pnpm/entry5.js", "deleted"), (b"node_modules/.pnpm/renamed.js", "added")}
    os.rename(d / "entry6.js", d / "entry7.js")        # over an existing name
    check(store, root, flt, cache, watcher)


def test_per_name_chmod_of_a_file_and_of_a_directory(big):
    store, flt, cache, watcher, root, d = big
    os.chmod(d / "entry9.js", 0o755)
    snap = check(store, root, flt, cache, watcher, hashed=1)     # its ctime changed: re-read
    entry = {c.path: c for c in store.diff(None, snap.tree_id)}[b"node_modules/.pnpm/entry9.js"]
    assert entry.new_type == "exec" and entry.new_mode == 0o755
    os.chmod(root / "node_modules" / "pkg" / "lib", 0o700)
    check(store, root, flt, cache, watcher, hashed=0)


def test_per_name_file_replaced_by_a_directory_and_back(big):
    store, flt, cache, watcher, root, d = big
    (d / "entry11.js").unlink()
    (d / "entry11.js").mkdir()
    (d / "entry11.js" / "inner.js").write_text("inner\n")
    (d / "entry11.js" / "deeper").mkdir()
    (d / "entry11.js" / "deeper" / "x.log").write_text("excluded")
    snap = check(store, root, flt, cache, watcher, new_dirs=2)
    assert (b"node_modules/.pnpm/entry11.js/deeper/x.log", 8, "excluded") in snap.left_out
    shutil.rmtree(d / "entry11.js")
    (d / "entry11.js").write_text("a file again\n")
    snap = check(store, root, flt, cache, watcher)
    assert snap.left_out == [(b"node_modules/pkg/debug.log", 8, "excluded")]
    (d / "entry12.js").unlink()
    os.symlink("entry13.js", d / "entry12.js")          # a file replaced by a symlink
    check(store, root, flt, cache, watcher)


def test_per_name_excluded_and_racy(big):
    store, flt, cache, watcher, root, d = big
    (d / "new.log").write_text("not content")
    snap = check(store, root, flt, cache, watcher)
    assert (b"node_modules/.pnpm/new.log", 11, "excluded") in snap.left_out
    # A file written just now is racy: re-read (by name) until its timestamp is safely old.
    (d / "entry20.js").write_text("fresh\n")
    check(store, root, flt, cache, watcher, hashed=1)
    check(store, root, flt, cache, watcher, hashed=1)   # no event, still re-read
    age_one(d / "entry20.js")
    check(store, root, flt, cache, watcher, hashed=1)   # its event: read once more, now trusted
    check(store, root, flt, cache, watcher, hashed=0)


def test_queue_overflow_falls_back_to_a_walk(big):
    store, flt, cache, watcher, root, d = big
    with open("/proc/sys/fs/inotify/max_queued_events") as f:
        limit = int(f.read())
    (d / "changed.js").write_text("before the overflow")
    for i in range(limit + 100):     # one event each (never two alike in a row, which merge)
        os.utime(d / f"entry{i % BIG}.js")
    (d / "entry1.js").write_text("changed before the overflow\n")
    snap = store.snapshot(root, flt, cache, watcher=watcher)
    assert snap.stats["watcher"] is False                # it walked
    assert snap.tree_id == full_walk(store, root, flt)
    (d / "entry2.js").write_text("after\n")
    # ... and re-checks by name again (all 600 names: utime made them racy, re-read till old)
    check(store, root, flt, cache, watcher, max_statted=BIG + 10)


def test_walk_without_listing_sees_creates_and_deletes(tmp_path):
    """Without a watcher, a directory whose stamp is unchanged is lstat'ed child by child, not
    listed: every kind of change must still be seen."""
    root = tmp_path / "work"
    build_big(root)
    store, flt = Store(tmp_path / "store"), Filter(exclude=["*.log"])
    cache = StatCache()
    store.snapshot(root, flt, cache)
    d = root / "node_modules" / ".pnpm"
    for change in (lambda: (d / "created.js").write_text("x"), lambda: (d / "entry3.js").unlink(),
                   lambda: os.rename(d / "entry4.js", d / "entry4.moved"),
                   lambda: os.chmod(d / "entry8.js", 0o700), lambda: (d / "entry9.js").write_text("y"),
                   lambda: shutil.rmtree(root / "node_modules" / "pkg" / "lib")):
        change()
        age(root)
        assert store.snapshot(root, flt, cache).tree_id == full_walk(store, root, flt)


def test_diff_of_remembered_big_trees_equals_a_decoded_diff(big, tmp_path):
    store, flt, cache, watcher, root, d = big
    a = store.snapshot(root, flt, cache, watcher=watcher).tree_id
    (d / "entry1.js").write_text("one\n")
    (d / "entry2.js").unlink()
    (d / "added.js").write_text("two\n")
    b = store.snapshot(root, flt, cache, watcher=watcher).tree_id
    fast = store.diff(a, b)
    cold = Store(tmp_path / "store")                     # nothing remembered: decodes both
    assert cold.diff(a, b) == fast
    assert {c.path for c in fast} == {b"node_modules/.pnpm/entry1.js", b"node_modules/.pnpm/entry2.js",
                                      b"node_modules/.pnpm/added.js"}
    plan = store.plan_restore(root, a, flt, cache=cache, watcher=watcher)
    store.restore(root, plan)
    assert store.snapshot(root, flt, StatCache()).tree_id == a
    cold.close()
