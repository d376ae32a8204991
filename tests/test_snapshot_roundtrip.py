"""Snapshot and restore round trips on real files: every file type, odd names, large chunked
files, dedup, racy timestamps, and what the filter leaves out."""

import os
import shutil
import stat
import time

import pytest

from envgit.snapshot import Filter, StatCache, Store


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store")
    yield s
    s.close()


@pytest.fixture
def work(tmp_path):
    w = tmp_path / "work"
    w.mkdir()
    return w


def describe(root) -> dict:
    """Everything a snapshot promises to keep, read back from the file system."""
    out = {}
    root = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            if rel == b".envgit" or rel.startswith(b".envgit/"):
                continue
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                with open(p, "rb") as f:
                    out[rel] = ("file", stat.S_IMODE(st.st_mode), f.read())
    return out


def make_every_kind(w):
    (w / "regular.txt").write_text("hello\n")
    (w / "empty").write_bytes(b"")
    (w / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (w / "run.sh").chmod(0o755)
    (w / "binary.bin").write_bytes(bytes(range(256)) * 40)
    (w / "emptydir").mkdir()
    (w / "a" / "b" / "c").mkdir(parents=True)
    (w / "a" / "b" / "c" / "deep.txt").write_text("deep")
    (w / "private").mkdir(mode=0o700)
    os.symlink("regular.txt", w / "rel-link")
    os.symlink("/etc/hostname", w / "abs-link")
    os.symlink("does/not/exist", w / "dangling")
    os.symlink("../../../../../../etc", w / "a" / "outside")
    os.mkdir(os.fsencode(w) + b"/odd\nname")
    with open(os.fsencode(w) + b"/odd\nname/\xff\xfe-invalid-utf8", "wb") as f:
        f.write(b"bytes \xff")
    (w / "large.bin").write_bytes(os.urandom(3 << 20))


def test_every_kind_round_trips_after_deleting_the_whole_tree(store, work):
    make_every_kind(work)
    before = describe(work)
    snap = store.snapshot(work, Filter())
    shutil.rmtree(work)
    work.mkdir()
    assert store.snapshot(work, Filter()).tree_id != snap.tree_id
    store.restore(work, store.plan_restore(work, snap.tree_id, Filter()))
    assert describe(work) == before
    assert store.snapshot(work, Filter()).tree_id == snap.tree_id
    assert os.readlink(work / "a" / "outside") == "../../../../../../etc"   # a link, not /etc's files
    assert store.fsck([snap.tree_id]) == []


def test_symlink_out_of_root_is_never_followed(store, work, tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("do not capture")
    os.symlink(secret, work / "link-to-dir")
    snap = store.snapshot(work, Filter())
    assert [c.path for c in store.diff(None, snap.tree_id)] == [b"link-to-dir"]
    assert store.read_file(snap.tree_id, b"link-to-dir") == os.fsencode(secret)
    # Restoring over a worktree where the link now is a real directory: replaced by the link,
    # and the outside directory is untouched.
    os.unlink(work / "link-to-dir")
    (work / "link-to-dir").mkdir()
    (work / "link-to-dir" / "x").write_text("inside")
    store.restore(work, store.plan_restore(work, snap.tree_id, Filter()))
    assert os.path.islink(work / "link-to-dir")
    assert (secret / "key").read_text() == "do not capture"


def test_restore_writes_only_what_differs(store, work):
    for i in range(20):
        (work / f"f{i}").write_text(f"content {i}")
    snap = store.snapshot(work, Filter())
    (work / "f3").write_text("changed")
    (work / "f4").unlink()
    (work / "new").write_text("new")
    os.chmod(work / "f5", 0o755)
    inode_f6 = os.stat(work / "f6").st_ino
    plan = store.plan_restore(work, snap.tree_id, Filter())
    assert sorted(i.path for i in plan.write) == [b"f3", b"f4", b"f5"]
    assert [i.path for i in plan.delete] == [b"new"]
    store.restore(work, plan)
    store.restore(work, plan)        # idempotent: a second run changes nothing more
    assert os.stat(work / "f6").st_ino == inode_f6
    assert (work / "f3").read_text() == "content 3" and not (work / "new").exists()
    assert not os.stat(work / "f5").st_mode & 0o111
    assert store.snapshot(work, Filter()).tree_id == snap.tree_id


def test_restore_of_chosen_paths_only(store, work):
    (work / "keep").mkdir()
    (work / "keep" / "a").write_text("1")
    (work / "other").write_text("1")
    snap = store.snapshot(work, Filter())
    (work / "keep" / "a").write_text("2")
    (work / "other").write_text("2")
    store.restore(work, store.plan_restore(work, snap.tree_id, Filter(), paths=[b"keep"]))
    assert (work / "keep" / "a").read_text() == "1" and (work / "other").read_text() == "2"


def test_dedup_and_unchanged_tree_adds_nothing(store, work, tmp_path):
    data = os.urandom(100_000)
    (work / "one").write_bytes(data)
    (work / "two").write_bytes(data)
    cache = StatCache(tmp_path / "cache")
    first = store.snapshot(work, Filter(), cache)
    blobs = [c.new_id for c in store.diff(None, first.tree_id)]
    assert blobs[0] == blobs[1]
    assert first.stats["objects_written"] == 2            # one blob, one tree
    again = store.snapshot(work, Filter(), StatCache(tmp_path / "cache"))   # reloaded from disk
    assert again.tree_id == first.tree_id
    assert again.stats["objects_written"] == 0


def test_one_byte_change_in_a_chunked_file_stores_about_one_chunk(store, work):
    data = bytearray(os.urandom(24 << 20))
    (work / "big").write_bytes(data)
    cache = StatCache()
    store.snapshot(work, Filter(), cache)
    data[13 << 20] ^= 1
    (work / "big").write_bytes(data)
    second = store.snapshot(work, Filter(), cache)
    # A chunk (<= 8 MiB, ~1 MiB on average), the chunk index, and the root tree.
    assert second.stats["objects_written"] == 3
    assert second.stats["bytes_written"] < 8.5 * 2**20
    assert store.read_file(second.tree_id, b"big") == data
    # An insertion shifts the data: content-defined boundaries re-align after it.
    data[5 << 20:5 << 20] = b"inserted"
    (work / "big").write_bytes(data)
    third = store.snapshot(work, Filter(), cache)
    assert third.stats["bytes_written"] < 9 * 2**20
    assert store.read_file(third.tree_id, b"big") == data


def test_racy_rewrite_within_the_same_timestamp_is_detected(store, work, tmp_path):
    f = work / "racy.txt"
    f.write_text("version 1")
    cache = StatCache(tmp_path / "cache")
    first = store.snapshot(work, Filter(), cache)
    st = os.stat(f)
    f.write_text("version 2")                          # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))   # same mtime
    second = store.snapshot(work, Filter(), StatCache(tmp_path / "cache"))
    assert second.tree_id != first.tree_id
    assert store.read_file(second.tree_id, b"racy.txt") == b"version 2"


def test_racy_entry_is_rehashed_even_with_identical_stat(store, work):
    """The racy rule itself: an entry recorded in the same granule it was written is not trusted."""
    f = work / "fresh"
    f.write_text("x")
    # an mtime not older than the snapshot's fence (its start less 100 ms); set ahead, not
    # left to the write's own, so that a stall of the machine between the write and the
    # snapshot cannot make it old enough to be trusted
    soon = time.time_ns() + 60 * 10**9
    os.utime(f, ns=(soon, soon))
    cache = StatCache()
    store.snapshot(work, Filter(), cache)            # f's mtime is newer than the fence: racy
    again = store.snapshot(work, Filter(), cache)
    assert again.stats["files_hashed"] == 1
    old = time.time_ns() - 10 * 10**9                # well before any fence: trusted once read
    os.utime(f, ns=(old, old))
    store.snapshot(work, Filter(), cache)
    assert store.snapshot(work, Filter(), cache).stats["files_hashed"] == 0


def test_left_out_paths_are_reported_and_left_alone_by_restore(store, work, tmp_path):
    flt = Filter(exclude=["node_modules/.cache/**", "*.log"], max_file_size=1000)
    (work / "node_modules" / ".cache").mkdir(parents=True)
    (work / "node_modules" / ".cache" / "blob").write_text("cached")
    (work / "node_modules" / "pkg.js").write_text("js")
    (work / "debug.log").write_text("log")
    (work / "huge.bin").write_bytes(b"x" * 5000)
    (work / ".envgit").mkdir()
    (work / ".envgit" / "state").write_text("never in a snapshot")
    os.mkfifo(work / "fifo")
    snap = store.snapshot(work, flt)
    assert sorted(snap.left_out) == [
        (b"debug.log", 3, "excluded"), (b"fifo", 0, "not a regular file"),
        (b"huge.bin", 5000, "too large"), (b"node_modules/.cache/blob", 6, "excluded")]
    assert b".envgit" not in [c.path for c in store.diff(None, snap.tree_id)]
    (work / "debug.log").write_text("newer log")
    (work / "node_modules" / "pkg.js").unlink()
    plan = store.plan_restore(work, snap.tree_id, flt)
    assert [i.path for i in plan.write] == [b"node_modules/pkg.js"] and plan.delete == []
    store.restore(work, plan)
    assert (work / "debug.log").read_text() == "newer log"
    assert (work / "huge.bin").stat().st_size == 5000
    assert (work / ".envgit" / "state").exists() and (work / "node_modules" / ".cache" / "blob").exists()
    # A tree without them: restore still keeps them (capture left them out, so rewind must too).
    (tmp_path / "nothing").mkdir()
    empty = store.snapshot(tmp_path / "nothing", Filter())
    store.restore(work, store.plan_restore(work, empty.tree_id, flt))
    assert (work / "debug.log").exists() and (work / "huge.bin").exists() and (work / ".envgit" / "state").exists()


def test_diff_statuses_and_read_file(store, work):
    (work / "same").write_text("same")
    (work / "mod").write_text("old")
    (work / "gone").write_text("bye")
    (work / "flip").write_text("file")
    a = store.snapshot(work, Filter())
    (work / "mod").write_text("new!")
    (work / "gone").unlink()
    (work / "flip").unlink()
    (work / "flip").mkdir()
    (work / "flip" / "inner").write_text("x")
    (work / "added").write_text("hi")
    b = store.snapshot(work, Filter())
    got = {(c.path, c.status) for c in store.diff(a.tree_id, b.tree_id)}
    assert got == {(b"mod", "modified"), (b"gone", "deleted"), (b"flip", "type-changed"),
                   (b"flip/inner", "added"), (b"added", "added")}
    assert {(c.path, c.status) for c in store.diff_worktree(a.tree_id, work, Filter())} == got
    mod = next(c for c in store.diff(a.tree_id, b.tree_id) if c.path == b"mod")
    assert (mod.old_size, mod.new_size) == (3, 4)
    assert store.cat(mod.old_id) == b"old" and store.read_file(b.tree_id, b"mod") == b"new!"
    with pytest.raises(FileNotFoundError):
        store.read_file(b.tree_id, b"gone")


def test_stat_cache_saved_and_loaded_reuses_every_kind(store, work, tmp_path):
    make_every_kind(work)
    old = os.stat(work).st_mtime_ns - 10**10
    for dirpath, _dirnames, filenames in os.walk(work):
        for name in filenames:
            os.utime(os.path.join(dirpath, name), ns=(old, old), follow_symlinks=False)
    cache = StatCache(tmp_path / "cache")
    first = store.snapshot(work, Filter(), cache)
    again = store.snapshot(work, Filter(), StatCache(tmp_path / "cache"))    # reloaded
    assert again.tree_id == first.tree_id and again.stats["files_hashed"] == 0
    (work / "a" / "b" / "c" / "deep.txt").write_text("changed")
    (work / "regular.txt").unlink()
    third = store.snapshot(work, Filter(), StatCache(tmp_path / "cache"))
    assert third.tree_id == store.snapshot(work, Filter(), StatCache()).tree_id
    assert third.stats["files_hashed"] == 1
