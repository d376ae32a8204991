"""gc killed (kill -9, the ENVGIT_FAULT hook) at every point where it deletes, then run again,
in any order: nothing a kept step reaches is ever deleted, a rerun finishes the killed one,
and every kept step's rewind writes exactly its tree.

The fault this reproduces (issue 11, item 1): a rerun wrote a pack byte-identical to one the
killed gc had left, under the same name, and its delete loop removed it with the old ones; and
gc's journal row came after the deletions, so a kill left kept steps without their objects."""

import os
import subprocess
import sys
import textwrap

import pytest

from faultlib import assert_rewinds_exactly, dropped, no_traceback, rows, tree_of

POINTS = ["gc-journaled", "gc-sealed", "gc-deleted-idx", "gc-deleted-pack", "gc-deleted-tmp",
          "gc-deleted-orphan-pack"]
SCRIPTS = [
    "head -c 30000 /dev/urandom > a.bin && echo v1 > shared.txt",
    "head -c 30000 /dev/urandom > b.bin && echo v2 > shared.txt && mkdir -p d && echo x > d/x",
    "rm a.bin && head -c 30000 /dev/urandom > c.bin && ln -s c.bin link",
    "head -c 30000 /dev/urandom > d/y.bin && chmod 755 d/x && echo v4 > shared.txt",
    "rm -r b.bin d && head -c 30000 /dev/urandom > e.bin",
    "echo v6 > shared.txt && head -c 30000 /dev/urandom > f.bin",
]


def make_steps(proj) -> dict:
    after = {}
    for n, script in enumerate(SCRIPTS, 1):
        assert proj.run(script).returncode == 0
        after[n] = tree_of(proj.root)
    proj.stop()
    objects = proj.root / ".envgit" / "objects"
    (objects / "tmp" / "left-by-a-crash.tmp").write_bytes(b"x" * 100)   # for gc-deleted-tmp
    orphan = objects / "packs" / "ff" / ("ff" * 32 + ".pack")          # a pack with no index
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"envgit-pack-1\n")
    return after


def gc(proj, fault=None):
    return no_traceback(proj.envgit("gc", "--keep-last", "3",
                                    env={"ENVGIT_FAULT": fault} if fault else None))


@pytest.mark.parametrize("point", POINTS)
def test_gc_killed_at_each_deletion_point_and_rerun(bare_proj, point):
    proj = bare_proj
    after = make_steps(proj)
    kills = 0
    while kills < 4:
        proj.stop()                        # the next command starts a daemon armed with the fault
        r = gc(proj, f"{point}@1")
        if r.returncode == 0:
            break                          # this run did not reach the point: it finished
        kills += 1
        assert "daemon" in r.stderr        # said in one line, no traceback
        proj.stop()
        f = no_traceback(proj.envgit("fsck"))
        assert f.returncode == 0, f"after kill {kills} at {point}: {f.stdout}"
    assert kills >= 1, f"gc never reached {point}"
    proj.stop()
    r = gc(proj)
    assert r.returncode == 0, r.stderr
    assert dropped(proj) == {1, 2, 3}                       # as the first, killed, run decided
    assert [k for _, _, k, _ in rows(proj, "WHERE step = 0")].count("gc") == 1
    packs = proj.root / ".envgit" / "objects" / "packs"
    assert not list(packs.rglob("ff" * 32 + ".pack"))       # the orphan went
    assert os.listdir(proj.root / ".envgit" / "objects" / "tmp") == []
    assert proj.envgit("fsck").returncode == 0
    assert_rewinds_exactly(proj, {n: after[n] for n in (4, 5, 6)})
    r = proj.envgit("rewind", "2", "--yes")
    assert r.returncode == 2 and "dropped by `envgit gc`" in r.stderr


RERUN_AFTER_KILL = textwrap.dedent("""
    import sys
    from envgit.snapshot import Store
    store = Store(sys.argv[1])
    store.gc(sys.argv[2:])
""")


def test_rerun_never_deletes_the_pack_the_killed_run_wrote(tmp_path):
    """The store alone, the exact state of the report: a gc killed after sealing the survivors'
    pack N, the old pack still holding a copy of N's objects, and the index naming the old
    copy (it depends on the order the indexes load in). The rerun must keep N: it used to
    write N again byte for byte, under the same name, and delete it with the old pack."""
    from envgit.snapshot import Filter, Store
    work = tmp_path / "work"
    work.mkdir()
    (work / "kept").write_bytes(os.urandom(40_000))
    (work / "gone").write_bytes(os.urandom(40_000))
    store_path = tmp_path / "store"
    store = Store(store_path)
    store.snapshot(work, Filter())
    (work / "gone").unlink()
    kept = store.snapshot(work, Filter()).tree_id
    store.close()
    r = subprocess.run([sys.executable, "-c", RERUN_AFTER_KILL, str(store_path), kept],
                       env={**os.environ, "ENVGIT_FAULT": "gc-sealed"})
    assert r.returncode == -9
    s = Store(store_path)
    copies = {}
    for pack_id, entries in s.objects.pack_entries.items():
        for e in entries:
            copies.setdefault(e[0], []).append((pack_id, e[4], e[1], e[2], e[5], e[6]))
    doubled = {oid: locs for oid, locs in copies.items() if len(locs) > 1}
    assert doubled, "the killed gc left no second copy: not the reported state"
    for oid, locs in doubled.items():           # the index names the old (doomed) copy
        old = next(loc for loc in locs if any(e[0] not in doubled for e in s.objects.pack_entries[loc[0]]))
        s.objects.index[oid] = old
    s.gc([kept])
    s.close()
    s = Store(store_path)
    assert s.fsck([kept]) == []
    (work / "kept").write_bytes(b"changed")
    s.restore(work, s.plan_restore(work, kept, Filter()))
    assert len((work / "kept").read_bytes()) == 40_000
