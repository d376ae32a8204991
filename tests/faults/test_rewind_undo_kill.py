"""kill -9 of the daemon at each named point of a rewind (the ENVGIT_FAULT hook), with edits
made outside envgit since the last step (a person's editor and their own `git commit`): the
undo point is recorded before anything is written, so whatever instant the kill hit,
`envgit rewind --undo` (or rewinding to the undo step the rewind recorded) afterwards writes
back the exact tree, outside edits included, and the rewind itself is finished or was never
begun.

Points, in the order a rewind reaches them (daemon/rewind.py):
  journal-inserted@1     the `outside` entry (the undo point) written but not committed
  rewind-undo-recorded   the undo point recorded, the rewind's own entry not yet written
  rewind-begun           the rewind's begin entry written, nothing restored yet
  restore-wrote@N        mid-write: N paths of the target written, the rest not
  rewind-restored        everything written, the rewind's end entry not yet
"""

import json
import os
import subprocess

import pytest

from faultlib import no_traceback, tree_of

POINTS = [("journal-inserted", 1), ("rewind-undo-recorded", 1), ("rewind-begun", 1),
          ("restore-wrote", 1), ("restore-wrote", 7), ("rewind-restored", 1)]


def git(proj, *args):
    return subprocess.run(["git", "-C", str(proj.root), "-c", "user.email=p@example.test",
                           "-c", "user.name=person", *args], capture_output=True, text=True)


def steps(proj):
    return json.loads(no_traceback(proj.envgit("log", "--json")).stdout)


def two_steps_then_outside_edits(proj):
    """(tree after step 1, tree as the person left it): step 1 commits, step 2 changes ten
    files and adds a directory; then, with no daemon running, the person edits, chmods, links,
    deletes and commits with their own git."""
    r = proj.run("mkdir -p src && for i in 0 1 2 3 4 5 6 7 8 9; do echo v1 > src/f$i; done && "
                 "printf '#!/bin/sh\\n' > tool.sh && chmod 755 tool.sh && ln -s src/f0 first && "
                 "git add -A && git -c user.email=a@b -c user.name=a commit -qm one")
    assert r.returncode == 0, r.stderr
    after1 = tree_of(proj.root)
    r = proj.run("for i in 0 1 2 3 4 5 6 7 8 9; do echo v2 > src/f$i; done && mkdir -p out && "
                 "echo o > out/o && rm first && chmod 644 tool.sh")
    assert r.returncode == 0, r.stderr
    proj.stop()
    (proj.root / "src" / "f3").write_text("the person's edit, saved in their editor\n")
    (proj.root / "notes.md").write_text("# mine\n")
    os.chmod(proj.root / "tool.sh", 0o700)
    os.symlink("notes.md", proj.root / "README")
    os.unlink(proj.root / "src" / "f9")
    assert git(proj, "add", "notes.md").returncode == 0
    assert git(proj, "commit", "-qm", "the person's commit").returncode == 0
    return after1, tree_of(proj.root)


@pytest.mark.parametrize("point,nth", POINTS)
def test_a_rewind_killed_at_each_point_loses_no_outside_edit(proj, point, nth):
    after1, before = two_steps_then_outside_edits(proj)
    head = git(proj, "rev-parse", "HEAD").stdout.strip()
    r = no_traceback(proj.envgit("rewind", "1", "--yes", env={"ENVGIT_FAULT": f"{point}@{nth}"}))
    assert r.returncode == 3, r.stdout + r.stderr            # the daemon died under it
    at_kill = tree_of(proj.root)
    if point == "restore-wrote":                             # really killed halfway
        assert at_kill not in (before, after1)
    elif point in ("journal-inserted", "rewind-undo-recorded", "rewind-begun"):
        assert at_kill == before                             # nothing written yet
    else:
        assert at_kill == after1

    s = steps(proj)             # the next command's daemon finishes a begun rewind
    rewinds = [x for x in s if "rewind" in x["marks"]]
    if point in ("journal-inserted", "rewind-undo-recorded"):
        assert rewinds == [] and tree_of(proj.root) == before
        if point == "rewind-undo-recorded":                  # the undo point is there already
            assert "outside" in s[-1]["marks"]
        else:                                                # its entry never committed
            assert [x["id"] for x in s] == [1, 2]
        r = no_traceback(proj.envgit("rewind", "--undo", "--yes"))
        assert r.returncode == 2 and "no rewind to undo" in r.stderr
        assert tree_of(proj.root) == before
        r = no_traceback(proj.envgit("rewind", "1", "--yes"))   # the same rewind again, whole
        assert r.returncode == 0, r.stderr
        assert tree_of(proj.root) == after1
        rewinds = [x for x in steps(proj) if "rewind" in x["marks"]]
    else:
        assert len(rewinds) == 1 and rewinds[0]["status"] == "done", rewinds
        assert "finished-after-crash" in rewinds[0]["marks"] or point == "rewind-restored"
        assert tree_of(proj.root) == after1
    undo_step = rewinds[-1]["rewind"]["undo_step"]
    outside = next(x for x in steps(proj) if x["id"] == undo_step)
    assert "outside" in outside["marks"]

    r = no_traceback(proj.envgit("rewind", "--undo", "--yes"))
    assert r.returncode == 0, r.stderr
    assert tree_of(proj.root) == before                      # byte for byte, .git included
    assert git(proj, "rev-parse", "HEAD").stdout.strip() == head
    # the undo step itself gives the same tree, after going back to step 1 again
    no_traceback(proj.envgit("rewind", "1", "--yes", check=True))
    assert tree_of(proj.root) == after1
    no_traceback(proj.envgit("rewind", str(undo_step), "--yes", check=True))
    assert tree_of(proj.root) == before
    assert no_traceback(proj.envgit("fsck")).returncode == 0


def test_finishing_a_killed_rewind_keeps_what_the_person_changed_since(proj):
    """The daemon dies halfway through a rewind; the person goes on editing before the next
    command (any command, `envgit log` here) starts a daemon that finishes the rewind. The
    directory as it then was, their edit included, is recorded as a step before the restore
    writes over it, and rewinding to that step gives it back byte for byte."""
    two_steps_then_outside_edits(proj)
    r = no_traceback(proj.envgit("rewind", "1", "--yes", env={"ENVGIT_FAULT": "restore-wrote@7"}))
    assert r.returncode == 3, r.stdout + r.stderr
    (proj.root / "notes.md").write_text("written after the crash, before the next command\n")
    edited = tree_of(proj.root)
    s = steps(proj)                                   # finishes the rewind
    rewind = next(x for x in s if "rewind" in x["marks"])
    assert rewind["status"] == "done" and "finished-after-crash" in rewind["marks"]
    found = [x for x in s if "outside" in x["marks"] and x["id"] > rewind["id"]]
    assert len(found) == 1, s
    assert not (proj.root / "notes.md").exists()      # the rewind's target (step 1) now
    r = no_traceback(proj.envgit("rewind", str(found[0]["id"]), "--yes"))
    assert r.returncode == 0, r.stderr
    assert tree_of(proj.root) == edited
