"""Damage, crashes and a full disk: the store stays valid and says exactly what is wrong."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from envgit.snapshot import Filter, RestoreRefused, StatCache, Store, StoreFull
from envgit.snapshot.packs import RECORD, pack_path


def test_flipped_byte_is_found_by_fsck_and_refused_by_restore(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "precious.txt").write_bytes(os.urandom(5000))
    (work / "other.txt").write_text("other")
    store = Store(tmp_path / "store")
    snap = store.snapshot(work, Filter())
    blob = bytes.fromhex(next(c.new_id for c in store.diff(None, snap.tree_id) if c.path == b"precious.txt"))
    pack_id, offset = store.objects.index[blob][:2]
    store.close()
    with open(pack_path(str(tmp_path / "store" / "packs"), pack_id, ".pack"), "r+b") as f:
        f.seek(offset + RECORD.size + 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))

    store = Store(tmp_path / "store")
    problems = store.fsck([snap.tree_id])
    assert any(blob.hex() in p and "corrupt" in p for p in problems), problems
    assert any("does not match its name" in p for p in problems)

    (work / "precious.txt").write_text("overwritten by the agent")
    (work / "other.txt").write_text("changed too")
    plan = store.plan_restore(work, snap.tree_id, Filter())
    with pytest.raises(RestoreRefused, match="precious.txt"):
        store.restore(work, plan)
    assert (work / "precious.txt").read_text() == "overwritten by the agent"   # nothing touched
    assert (work / "other.txt").read_text() == "changed too"


SNAPSHOT_FOREVER = textwrap.dedent("""
    import os, sys
    from envgit.snapshot import Filter, StatCache, Store
    work, store_path = sys.argv[1], sys.argv[2]
    store = Store(store_path)
    cache = StatCache(os.path.join(store_path, "..", "cache"))
    n = 0
    print("ready", flush=True)
    while True:
        n += 1
        with open(os.path.join(work, "big.bin"), "r+b") as f:   # new content every round
            f.seek(n * 4096)
            f.write(os.urandom(64))
        for i in range(0, 2000, 7):
            with open(os.path.join(work, "d%d" % (i % 20), "f%d" % i), "w") as f:
                f.write("round %d" % n)
        store.snapshot(work, Filter(), cache)
""")


def test_kill_9_during_snapshot_leaves_a_valid_store(tmp_path):
    work = tmp_path / "work"
    for i in range(2000):
        d = work / f"d{i % 20}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}").write_text(f"file {i}")
    (work / "big.bin").write_bytes(os.urandom(40 << 20))
    store_path = tmp_path / "store"
    for delay in (0.3, 0.7, 1.2):
        child = subprocess.Popen([sys.executable, "-c", SNAPSHOT_FOREVER, str(work), str(store_path)],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "ready\n"
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        store = Store(store_path)
        assert store.fsck([]) == []            # every sealed pack and object is sound
        store.close()
    store = Store(store_path)
    snap = store.snapshot(work, Filter(), StatCache(tmp_path / "cache"))
    assert store.fsck([snap.tree_id]) == []
    assert store.read_file(snap.tree_id, b"big.bin") == (work / "big.bin").read_bytes()
    store.gc([snap.tree_id])
    assert os.listdir(store_path / "tmp") == []
    assert store.fsck([snap.tree_id]) == []


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_disk_full_while_snapshotting_is_a_clear_error_and_the_store_stays_valid(tmp_path, small_disk):
    work = tmp_path / "work"
    work.mkdir()
    (work / "small.txt").write_text("fits")
    store = Store(small_disk / "objects")
    first = store.snapshot(work, Filter())
    (work / "noise.bin").write_bytes(os.urandom(6 << 20))      # incompressible, twice the disk
    with pytest.raises(StoreFull, match="disk is full"):
        store.snapshot(work, Filter())
    store.close()
    store = Store(small_disk / "objects")
    assert store.fsck([first.tree_id]) == []
    assert os.listdir(small_disk / "objects" / "tmp") == []    # the partial pack was removed
    (work / "noise.bin").unlink()
    (work / "small.txt").write_text("fits again")
    again = store.snapshot(work, Filter())
    assert store.read_file(again.tree_id, b"small.txt") == b"fits again"
    assert store.fsck([first.tree_id, again.tree_id]) == []


def test_gc_drops_only_what_no_kept_root_reaches(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "shared").write_bytes(os.urandom(50_000))
    (work / "old").write_bytes(os.urandom(200_000))
    old = Store(tmp_path / "store").snapshot(work, Filter())
    (work / "old").unlink()
    (work / "new").write_bytes(os.urandom(100_000))
    store = Store(tmp_path / "store")
    new = store.snapshot(work, Filter())
    calls = []
    freed = store.gc([new.tree_id], progress=lambda done, total: calls.append((done, total)))
    assert 200_000 <= freed < 260_000
    assert calls[-1][0] == calls[-1][1]
    reopened = Store(tmp_path / "store")
    assert reopened.fsck([new.tree_id]) == []
    assert reopened.fsck([old.tree_id]) != []          # its own file is gone, reported as missing
    (work / "shared").write_text("damaged by the agent")
    reopened.restore(work, reopened.plan_restore(work, new.tree_id, Filter()))
    assert len((work / "shared").read_bytes()) == 50_000
    reopened.gc([new.tree_id])       # drops the damaged state plan_restore captured
    assert reopened.fsck([new.tree_id]) == []
