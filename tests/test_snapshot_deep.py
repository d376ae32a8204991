"""A step shapes the tree: snapshot, diff and restore of a tree deeper than PATH_MAX (and than
Python's recursion limit), and of thousands of directories, under a low open-file limit. The
walks have no recursion and hold fds for one path, at most ~2 x 64 of them (capture._OPEN_DIRS,
restore._OPEN_DIRS), so all of it works with 200 fds. Real files, the store as envgit uses it
(the end-to-end attacks are in tests/adversarial/test_snapshot_deep_wide_trees.py)."""

import os
import resource

import pytest

from envgit.snapshot import StatCache, Store
from envgit.snapshot.capture import Capture

DEPTH = 2500           # names of 2 bytes: paths of 7500 bytes, past PATH_MAX (4096)
_FLAGS = os.O_RDONLY | os.O_DIRECTORY


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store")
    yield s
    s.close()


@pytest.fixture
def few_fds():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def make_deep(root, depth=DEPTH) -> None:
    """root/deep/dd/dd/… `depth` levels, a file every 500 levels and at the bottom (dirfd-relative:
    the paths are too long for the file system's path calls)."""
    fd = os.open(root, _FLAGS)
    os.mkdir("deep", dir_fd=fd)
    cur = os.open("deep", _FLAGS, dir_fd=fd)
    os.close(fd)
    for i in range(depth):
        if i % 500 == 0 or i == depth - 1:
            write_at(cur, f"f{i}", b"level %d\n" % i)
        os.mkdir("dd", dir_fd=cur)
        nxt = os.open("dd", _FLAGS, dir_fd=cur)
        os.close(cur)
        cur = nxt
    os.close(cur)


def write_at(dfd, name, data):
    f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dfd)
    os.write(f, data)
    os.close(f)


def bottom_fd(root, depth=DEPTH):
    fd = os.open(os.path.join(root, "deep"), _FLAGS)
    for _ in range(depth - 1):
        nxt = os.open("dd", _FLAGS, dir_fd=fd)
        os.close(fd)
        fd = nxt
    return fd


def test_a_tree_deeper_than_path_max_snapshots_diffs_and_restores_with_few_fds(store, tmp_path, few_fds):
    work, empty = tmp_path / "work", tmp_path / "empty"
    work.mkdir()
    empty.mkdir()
    make_deep(work)
    cache = StatCache()
    first = store.snapshot(work, cache=cache)
    assert store.snapshot(work, cache=cache).tree_id == first.tree_id      # the memos, climbed back
    assert store.snapshot(work).tree_id == first.tree_id                   # no memos: walked afresh
    fd = bottom_fd(work)
    write_at(fd, f"f{DEPTH - 1}", b"changed\n")
    os.close(fd)
    changed = store.snapshot(work, cache=cache)
    paths = [c.path for c in store.diff(first.tree_id, changed.tree_id)]
    assert paths == [b"deep/" + b"dd/" * (DEPTH - 1) + b"f%d" % (DEPTH - 1)]
    added = store.diff(None, first.tree_id)
    assert len(added) == 1 + DEPTH + DEPTH // 500 + 1
    assert max(c.path.count(b"/") for c in added) == DEPTH
    nothing = store.snapshot(empty)
    store.restore(empty, store.plan_restore(empty, first.tree_id))
    assert store.snapshot(empty).tree_id == first.tree_id
    store.restore(empty, store.plan_restore(empty, nothing.tree_id))
    assert os.listdir(empty) == []


def test_thousands_of_directories_restore_with_few_fds(store, tmp_path, few_fds):
    work, empty = tmp_path / "work", tmp_path / "empty"
    for i in range(1500):
        (work / "wide" / f"d{i}" / "sub").mkdir(parents=True)
        (work / "wide" / f"d{i}" / "sub" / "f").write_text(str(i))
    empty.mkdir()
    snap = store.snapshot(work)
    store.restore(empty, store.plan_restore(empty, snap.tree_id))
    assert store.snapshot(empty).tree_id == snap.tree_id
    assert (empty / "wide" / "d1499" / "sub" / "f").read_text() == "1499"


def test_a_directory_swapped_while_the_walk_is_below_it_fails_the_snapshot(store, tmp_path, monkeypatch):
    """When the walk climbs back to a directory whose fd it closed (to bound the fds held), it
    reopens it by name: a directory put in its place meanwhile is refused, not mixed in."""
    work = tmp_path / "work"
    work.mkdir()
    make_deep(work, 300)
    depth100 = b"deep/" + b"/".join([b"dd"] * 99)           # its fd is closed while below it
    bottom = b"deep/" + b"/".join([b"dd"] * 300)
    listed = Capture._list

    def swap_at_the_bottom(self, dfd, rel, memo):
        if rel == bottom:
            p = os.path.join(os.fsencode(work), depth100)
            os.rename(p, p + b".old")
            os.mkdir(p)
            os.symlink(b"../dd.old/dd", p + b"/dd")              # a way back that is a link
        return (yield from listed(self, dfd, rel, memo))

    monkeypatch.setattr(Capture, "_list", swap_at_the_bottom)
    with pytest.raises(OSError):
        store.snapshot(work)


def test_a_git_directory_deep_down_is_summarised_without_recursion(store, tmp_path):
    """The git summary of a step lists the directories down to a changed `.git`."""
    from envgit.snapshot.gitview import git_changes
    work = tmp_path / "work"
    work.mkdir()
    make_deep(work, 1500)
    fd = bottom_fd(work, 1500)
    os.mkdir(".git", dir_fd=fd)
    git = os.open(".git", _FLAGS, dir_fd=fd)
    write_at(git, "HEAD", b"ref: refs/heads/main\n")
    os.close(git)
    os.close(fd)
    snap = store.snapshot(work)
    repos = git_changes(store, None, snap.tree_id)
    assert [r.gitdir.count("/") for r in repos] == [1500], repos


def test_a_path_longer_than_the_stat_cache_records_hold_is_not_saved_and_nothing_fails(store, tmp_path):
    """Stat cache records hold a path length in 16 bits; a step can nest 260 names of 255 bytes."""
    work = tmp_path / "work"
    work.mkdir()
    fd = os.open(work, _FLAGS)
    for _ in range(260):
        os.mkdir("n" * 255, dir_fd=fd)
        nxt = os.open("n" * 255, _FLAGS, dir_fd=fd)
        os.close(fd)
        fd = nxt
    write_at(fd, "f", b"deepest\n")
    os.close(fd)
    cache = StatCache(tmp_path / "statcache")
    first = store.snapshot(work, cache=cache)                       # saves the cache
    again = StatCache(tmp_path / "statcache")
    assert again.entries and max(len(p) for p in again.entries) <= 0xFFFF
    assert store.snapshot(work, cache=again).tree_id == first.tree_id
