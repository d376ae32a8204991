"""A damaged object does not wedge the project: the step still ends, with the cause recorded
when its snapshot cannot be taken; the damaged copy is quarantined and the next snapshot is
taken afresh; rewind and gc say what is damaged in one line; and every rewind to a sound step
writes exactly its tree.

The fault this reproduces (issue 11, item 4): with the latest tree corrupt, no later step ever
ended (the exception escaped before the step left `live`), `envgit run` exited 0 saying
nothing, rewind and gc refused, and a daemon restart did not help."""

import json
import os

from faultlib import assert_rewinds_exactly, no_traceback, tree_of


def flip(proj, oid_hex):
    """Flip a byte of the object's stored bytes in its pack (the daemon must be stopped)."""
    from envgit.snapshot import Store
    from envgit.snapshot.packs import RECORD, pack_path
    objects = proj.root / ".envgit" / "objects"
    store = Store(objects)
    pack_id, offset, _, _, _, stored_len = store.objects.index[bytes.fromhex(oid_hex)]
    store.close()
    with open(pack_path(str(objects / "packs"), pack_id, ".pack"), "r+b") as f:
        f.seek(offset + RECORD.size + stored_len // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x40]))


def subtree(proj, tree_hex, name):
    from envgit.snapshot import Store
    from envgit.snapshot.diff import read_tree
    store = Store(proj.root / ".envgit" / "objects")
    try:
        return next(e.oid.hex() for e in read_tree(store.objects, bytes.fromhex(tree_hex)) if e.name == name)
    finally:
        store.close()


def show(proj, n):
    return json.loads(proj.envgit("show", str(n), "--json", check=True).stdout)


def test_corrupt_latest_tree_and_subtrees_do_not_wedge_the_project(bare_proj):
    proj = bare_proj
    after = {}
    assert proj.run("mkdir d e && echo x > d/x && echo y > e/y && echo 1 > a").returncode == 0
    after[1] = tree_of(proj.root)
    assert proj.run("echo 2 > a").returncode == 0
    tree2 = show(proj, 2)["snapshot"]["tree"]
    proj.stop()
    subtrees = [subtree(proj, tree2, name) for name in (b"d", b"e")]
    flip(proj, tree2)                       # the latest tree: read by the next step's diff
    for oid in subtrees:                    # unchanged subtrees: the stat cache reuses their ids
        flip(proj, oid)

    # The step ends; its snapshot is taken afresh (every damaged copy quarantined and stored
    # again), and what cannot be known (the changes against the damaged step 2) is said.
    r = no_traceback(proj.run("echo 3 > a"))
    assert r.returncode == 0
    s3 = show(proj, 3)
    assert s3["status"] == "done" and s3["exit_code"] == 0 and len(s3["snapshot"]["tree"]) == 64
    assert tree2 in s3["snapshot"]["diff_error"] and "damaged" in s3["snapshot"]["diff_error"]
    after[3] = tree_of(proj.root)
    assert proj.run("echo 4 > a").returncode == 0
    s4 = show(proj, 4)
    assert s4["snapshot"]["modified"] == 1 and s4["snapshot"]["diff_error"] is None
    after[4] = tree_of(proj.root)

    f = no_traceback(proj.envgit("fsck"))
    assert f.returncode == 1 and tree2 in f.stdout                  # named, not hidden
    r = no_traceback(proj.envgit("rewind", "2", "--yes"))
    assert r.returncode == 4 and tree2 in r.stderr and tree_of(proj.root) == after[4]
    r = no_traceback(proj.envgit("gc"))
    assert r.returncode == 4 and "gc deleted nothing" in r.stderr and tree2 in r.stderr
    assert_rewinds_exactly(proj, {1: after[1], 3: after[3], 4: after[4]})
    proj.stop()                                      # and after a restart, nothing is wedged
    assert proj.run("echo 5 > a").returncode == 0
    # dropping the damaged steps makes the store whole again, once the branches the rewinds
    # left (each keeps the steps it stepped over, step 2 among them) are let go
    r = no_traceback(proj.envgit("gc", "--keep-last", "3"))
    assert r.returncode == 4 and "envgit branch rm" in r.stderr
    for b in json.loads(proj.envgit("branches", "--json", check=True).stdout)["branches"]:
        proj.envgit("branch", "rm", str(b["id"]), check=True)
    assert no_traceback(proj.envgit("gc", "--keep-last", "3")).returncode == 0
    assert proj.envgit("fsck").returncode == 0, proj.envgit("fsck").stdout


def test_a_snapshot_that_cannot_be_taken_is_recorded_on_its_step(bare_proj):
    proj = bare_proj
    assert proj.run("echo 1 > a").returncode == 0
    after1 = tree_of(proj.root)
    tmp = proj.root / ".envgit" / "objects" / "tmp"
    tmp.rmdir()
    tmp.write_text("in the way")            # the store can write no pack now
    r = no_traceback(proj.run("echo 2 > a && echo new > b"))
    assert r.returncode == 0 and "snapshot failed" in r.stderr      # said on the terminal
    s2 = show(proj, 2)
    assert s2["status"] == "done" and "snapshot-failed" in s2["marks"]
    assert s2["snapshot"]["tree"] is None and "Not a directory" in s2["snapshot"]["error"]
    tmp.unlink()
    tmp.mkdir()
    r = no_traceback(proj.run("echo 3 > a"))
    assert r.returncode == 0 and "snapshot failed" not in r.stderr
    s3 = show(proj, 3)
    assert s3["snapshot"]["added"] == 1 and s3["snapshot"]["modified"] == 1  # against step 1
    after3 = tree_of(proj.root)
    assert no_traceback(proj.envgit("rewind", "2", "--yes")).returncode != 0  # no snapshot: said
    assert_rewinds_exactly(proj, {1: after1, 3: after3})
    assert proj.envgit("fsck").returncode == 0


def test_gc_heals_what_the_directory_still_holds(bare_proj):
    """A damaged subtree of an unchanged directory: the stat cache would reuse its id for ever
    without reading it. gc finds it, stores it again from the directory, and finishes; the
    damaged copy goes with its pack."""
    proj = bare_proj
    assert proj.run("mkdir d && echo x > d/x && echo 1 > a").returncode == 0
    assert proj.run("echo 2 > a").returncode == 0
    after2 = tree_of(proj.root)
    tree2 = show(proj, 2)["snapshot"]["tree"]
    d_tree = subtree(proj, tree2, b"d")
    proj.stop()
    flip(proj, d_tree)
    assert proj.run("echo 3 > a").returncode == 0         # reuses d's id: nothing reads it
    after3 = tree_of(proj.root)
    f = no_traceback(proj.envgit("fsck"))
    assert f.returncode == 1 and d_tree in f.stdout
    r = no_traceback(proj.envgit("gc"))
    assert r.returncode == 0, r.stderr
    assert no_traceback(proj.envgit("fsck")).returncode == 0
    assert_rewinds_exactly(proj, {2: after2, 3: after3})
