"""Rewinds keep what they stepped over (issue 27): the steps a rewind stepped over are branch
r<R>, and gc keeps their snapshots whatever its retention rule says, until the branch is
removed (`envgit branch rm r<R>`, which writes branch/rewound.py's removal marker)."""

import json

from envgit.branch import rewound
from envgit.journal import Journal


def branches_of(proj) -> list[dict]:
    j = Journal(str(proj.root / ".envgit" / "journal.sqlite"), readonly=True)
    try:
        return rewound.rewound(j.steps())
    finally:
        j.close()


def nine_steps_then_rewind_to_5(proj) -> int:
    for i in range(1, 10):
        r = proj.run(f"echo v{i} > f{i} && echo {i} > last")
        assert r.returncode == 0, r.stderr
    r = proj.envgit("rewind", "5", "--yes", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["rewind_step"]


def test_gc_keeps_the_steps_a_rewind_stepped_over_until_the_branch_is_removed(proj, tmp_path):
    R = nine_steps_then_rewind_to_5(proj)
    assert proj.run("echo after > g").returncode == 0        # a step after the rewind
    [b] = [b for b in branches_of(proj) if b["id"] == f"r{R}"]
    assert b["steps"] == [6, 9] and b["rewind_step"] == R and b["kind"] == "rewound"

    r = proj.envgit("gc", "--keep-last", "1", "--json")
    assert r.returncode == 0, r.stderr
    gc = json.loads(r.stdout)
    assert gc["kept_by_branches"] == [6, 7, 8, 9], gc
    assert not set(gc["dropped"]) & {6, 7, 8, 9} and {1, 2, 3, 4} <= set(gc["dropped"]), gc
    said = proj.envgit("gc", "--keep-last", "1")
    assert "kept the snapshots of 4 step(s) that branches reach" in said.stdout, said.stdout

    listed = json.loads(proj.envgit("branches", "--json", check=True).stdout)["branches"]
    assert [(x["id"], x["step_range"]) for x in listed] == [(f"r{R}", [6, 9])]     # still listed
    fsck = proj.envgit("fsck", "--json")
    assert fsck.returncode == 0 and json.loads(fsck.stdout)["ok"], fsck.stdout + fsck.stderr
    out = tmp_path / "nine"
    r = proj.envgit("restore", "9", "--target", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "f9").read_text() == "v9\n" and (out / "last").read_text() == "9\n"

    r = proj.envgit("branch", "rm", f"r{R}")
    assert r.returncode == 0, r.stderr
    assert rewound.removed(str(proj.root)) == {R} and not rewound.remove(str(proj.root), R)
    r = proj.envgit("gc", "--keep-last", "1", "--json")
    assert r.returncode == 0, r.stderr
    gc = json.loads(r.stdout)
    assert {6, 7, 8, 9} <= set(gc["dropped"]) and gc["kept_by_branches"] == [], gc
    fsck = proj.envgit("fsck", "--json")
    assert fsck.returncode == 0 and json.loads(fsck.stdout)["ok"], fsck.stdout
    r = proj.envgit("restore", "9", "--target", str(tmp_path / "gone"))
    assert r.returncode != 0 and "gc" in r.stderr, r.stderr


def test_an_undone_rewind_keeps_the_steps_made_after_the_rewind(proj):
    R = nine_steps_then_rewind_to_5(proj)
    assert proj.run("echo kept > after-rewind").returncode == 0     # step R+1, on top of step 5
    r = proj.envgit("rewind", "--undo", "--yes", "--json")
    assert r.returncode == 0, r.stderr
    U = json.loads(r.stdout)["rewind_step"]
    ids = {b["id"]: b for b in branches_of(proj)}
    assert ids[f"r{R}"]["steps"] == [6, 9]
    assert ids[f"r{U}"]["steps"] == [R, R + 1], ids                  # the rewind and the step after it
    r = proj.envgit("gc", "--keep-last", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert R + 1 in json.loads(r.stdout)["kept_by_branches"]
    assert not (proj.root / "after-rewind").exists()
    r = proj.envgit("rewind", str(R + 1), "--yes")
    assert r.returncode == 0, r.stderr
    assert (proj.root / "after-rewind").read_text() == "kept\n"


def test_gc_keeps_a_fork_branchs_fork_point_until_the_branch_is_removed(proj, tmp_path):
    for i in range(1, 4):
        assert proj.run(f"echo v{i} > f").returncode == 0
    made = json.loads(proj.envgit("fork", "1", "--at", "2", "--json", check=True).stdout)
    [b] = made["branches"]
    for i in range(4, 7):
        assert proj.run(f"echo v{i} > f").returncode == 0
    gc = json.loads(proj.envgit("gc", "--keep-last", "1", "--json", check=True).stdout)
    assert gc["kept_by_branches"] == [2] and 2 not in gc["dropped"], gc
    r = proj.envgit("restore", "2", "--target", str(tmp_path / "two"))
    assert r.returncode == 0 and (tmp_path / "two" / "f").read_text() == "v2\n", r.stderr
    r = proj.envgit("branch", "rm", str(b["id"]), "--force")
    assert r.returncode == 0, r.stderr
    gc = json.loads(proj.envgit("gc", "--keep-last", "1", "--json", check=True).stdout)
    assert 2 in gc["dropped"] and gc["kept_by_branches"] == [], gc
    fsck = proj.envgit("fsck", "--json")
    assert fsck.returncode == 0 and json.loads(fsck.stdout)["ok"], fsck.stdout
