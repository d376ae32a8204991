"""`envgit fsck` knows branches (branch/check.py): a fork record whose directory is gone or is
not that branch, and a rewound branch whose steps' snapshots are no longer kept, are each one
problem line with the fix; a project with sound branches checks clean."""

import json
import os
import shutil

from envgit.branch import registry
from envgit.paths import Project


def fsck(proj):
    r = proj.envgit("fsck", "--json")
    return r.returncode, json.loads(r.stdout)


def test_fsck_names_a_fork_whose_directory_is_gone_or_is_not_the_branch(proj):
    (proj.root / "a.txt").write_text("x\n")
    proj.run("true", check=True)
    proj.envgit("fork", "2", check=True)
    forks = {r["id"]: r["dir"] for r in registry.forks(Project(str(proj.root)))}
    try:
        assert fsck(proj) == (0, fsck(proj)[1]) and fsck(proj)[1]["ok"]
        for d in forks.values():
            proj.envgit("daemon", "stop", cwd=d)
        shutil.rmtree(forks[1])
        bj = f"{forks[2]}/.envgit/branch.json"
        rec = json.load(open(bj))
        rec["parent"] = "/elsewhere"
        open(bj, "w").write(json.dumps(rec))
        code, got = fsck(proj)
        assert code == 1 and not got["ok"]
        said = " | ".join(got["problems"])
        assert "branch 1: its directory" in said and "is gone" in said and "envgit branch rm 1" in said
        assert "branch 2:" in said and "names another project" in said
    finally:
        for d in forks.values():
            if os.path.isdir(d):
                proj.envgit("daemon", "stop", cwd=d)


def test_fsck_names_a_rewound_branch_whose_snapshots_were_dropped(proj):
    proj.run("echo 1 > a.txt", check=True)
    proj.run("echo 2 > a.txt", check=True)
    proj.run("echo 3 > a.txt", check=True)
    proj.envgit("rewind", "1", "--yes", check=True)
    assert fsck(proj)[1]["ok"]
    # a journal that dropped them anyway (a gc of an older envgit, or by hand): said by fsck
    from envgit.journal import Journal
    j = Journal(str(proj.root / ".envgit" / "journal.sqlite"))
    proj.stop()
    j.append(0, "gc", {"dropped": [2, 3], "kept": [1]})
    j.close()
    code, got = fsck(proj)
    # step 3's tree is the rewind's undo tree, kept by the rewind step itself
    assert code == 1 and any("r4: the snapshot of step 2 is no longer kept" in p for p in got["problems"]), got
