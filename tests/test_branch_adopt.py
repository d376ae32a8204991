"""`envgit adopt ID` (issue 27): the main working tree becomes a branch's tree as one step
(argv ["envgit", "adopt", ID]), `.git` included, undone by `envgit rewind --undo`; a fork
branch's objects are copied from its store into the main store first; a kill -9 of the daemon
during an adopt leaves the tree as before or adopted, no half-written step, fsck clean."""

import json
import os
import subprocess
import time

import pytest

from conftest import ENVGIT, Env
from kit.trees import tree_of


def j(r):
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def steps(proj):
    return j(proj.envgit("log", "--json"))


def fsck_clean(e):
    r = e.envgit("fsck", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"], r.stdout + r.stderr


def git(root, *args):
    return subprocess.run(["git", "-C", str(root), "-c", "user.email=a@example.test", "-c", "user.name=a",
                           *args], capture_output=True, text=True)


# --- a rewound branch --------------------------------------------------------------------

def test_adopt_a_rewound_branch_then_undo_it(proj):
    for i in range(1, 10):
        assert proj.run(f"echo v{i} > f{i} && echo {i} > last").returncode == 0
    nine = tree_of(proj.root)
    R = j(proj.envgit("rewind", "5", "--yes", "--json"))["rewind_step"]
    five = tree_of(proj.root)
    assert five != nine

    plan = j(proj.envgit("adopt", f"r{R}", "--dry-run", "--json"))
    assert plan["adopt"] == {"branch": f"r{R}", "kind": "rewound", "rewind_step": R, "steps": [6, 9]}
    assert plan["counts"]["write"] == 5 and tree_of(proj.root) == five      # f6..f9, last

    r = proj.envgit("adopt", f"r{R}")               # not a terminal: it asks, so it refuses
    assert r.returncode != 0 and "--yes" in r.stderr and tree_of(proj.root) == five
    r = proj.envgit("adopt", f"r{R}", "--yes")
    assert r.returncode == 0, r.stderr
    assert f"adopted branch r{R}" in r.stdout and "envgit rewind --undo" in r.stdout
    assert tree_of(proj.root) == nine
    last = steps(proj)[-1]
    assert last["argv"] == ["envgit", "adopt", f"r{R}"] and {"rewind", "adopt"} <= set(last["marks"])

    r = proj.envgit("rewind", "--undo", "--yes")
    assert r.returncode == 0, r.stderr
    assert tree_of(proj.root) == five
    fsck_clean(proj)
    listed = j(proj.envgit("branches", "--json"))["branches"]
    assert f"r{R}" in [b["id"] for b in listed]      # the branch stays until branch rm


def test_a_rewound_branch_is_adoptable_after_later_steps_and_a_gc(proj):
    for i in range(1, 6):
        assert proj.run(f"echo v{i} > f{i}").returncode == 0
    five = tree_of(proj.root)
    R = j(proj.envgit("rewind", "2", "--yes", "--json"))["rewind_step"]
    for i in range(3):
        assert proj.run(f"echo other{i} > g").returncode == 0
    j(proj.envgit("gc", "--keep-last", "1", "--json"))
    assert j(proj.envgit("adopt", f"r{R}", "--yes", "--json"))["adopt"]["steps"] == [3, 5]
    assert tree_of(proj.root) == five
    fsck_clean(proj)


def test_adopt_refuses_what_names_no_branch(proj):
    for i in range(1, 4):
        assert proj.run(f"echo {i} > f").returncode == 0
    before = tree_of(proj.root)
    for bad, said in (("r2", "no branch r2"), ("7", "no branch 7"), ("x", "names no branch")):
        r = proj.envgit("adopt", bad, "--yes")
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (bad, r.stderr)
    R = j(proj.envgit("rewind", "1", "--yes", "--json"))["rewind_step"]
    assert proj.envgit("branch", "rm", f"r{R}").returncode == 0
    r = proj.envgit("adopt", f"r{R}", "--yes")
    assert r.returncode == 2 and "was removed" in r.stderr, r.stderr
    assert tree_of(proj.root) != before and len(steps(proj)) == 4


# --- a fork branch -----------------------------------------------------------------------

VENV = ("mkdir -p .venv/bin .venv/lib/site-packages && printf 'home = /usr/bin\\n' > .venv/pyvenv.cfg && "
        "ln -sf /usr/bin/python3 .venv/bin/python && echo 'x = 1' > .venv/lib/site-packages/mod.py")


def make_fork(proj) -> tuple[int, Env]:
    made = j(proj.envgit("fork", "1", "--json"))
    [b] = made["branches"]
    return b["id"], Env(proj.home, type(proj.root)(b["dir"]))


def test_adopt_a_fork_branch_with_git_ignored_files_and_a_venv_then_undo(proj):
    r = proj.run("echo '*.log' > .gitignore && echo one > a.txt && echo keep > same.txt && "
                 "git add -A && git -c user.email=a@example.test -c user.name=a commit -qm one")
    assert r.returncode == 0, r.stderr
    main_before = tree_of(proj.root)
    main_head = git(proj.root, "rev-parse", "HEAD").stdout.strip()
    n, branch = make_fork(proj)
    try:
        r = branch.run("echo two > a.txt && echo new > b.txt && git add -A && "
                       "git -c user.email=b@example.test -c user.name=b commit -qm two")
        assert r.returncode == 0, r.stderr
        r = branch.run("echo noise > build.log && " + VENV + " && rm same.txt")
        assert r.returncode == 0, r.stderr
        (branch.root / "by-hand.txt").write_text("an edit made in the branch outside envgit\n")
        branch_tree = tree_of(branch.root)
        branch_head = git(branch.root, "rev-parse", "HEAD").stdout.strip()
        assert branch_head != main_head

        plan = j(proj.envgit("adopt", str(n), "--dry-run", "--json"))
        assert plan["adopt"]["kind"] == "fork" and plan["adopt"]["dir"] == str(branch.root)
        assert plan["copied"]["copied_objects"] > 0         # b.txt, the commit, the venv … were not in the main store
        assert tree_of(proj.root) == main_before
        done = j(proj.envgit("adopt", str(n), "--yes", "--json"))
        assert tree_of(proj.root) == branch_tree
        assert git(proj.root, "rev-parse", "HEAD").stdout.strip() == branch_head
        assert git(proj.root, "log", "--format=%s").stdout.split() == ["two", "one"]
        assert (proj.root / "build.log").read_text() == "noise\n"
        assert os.readlink(proj.root / ".venv" / "bin" / "python") == "/usr/bin/python3"
        last = steps(proj)[-1]
        assert last["id"] == done["rewind_step"] and last["argv"] == ["envgit", "adopt", str(n)]
        fsck_clean(proj)

        r = proj.envgit("rewind", "--undo", "--yes")
        assert r.returncode == 0, r.stderr
        assert tree_of(proj.root) == main_before
        assert git(proj.root, "rev-parse", "HEAD").stdout.strip() == main_head
        r = proj.envgit("rewind", str(done["rewind_step"]), "--yes")       # and forward again
        assert r.returncode == 0, r.stderr
        assert tree_of(proj.root) == branch_tree
        fsck_clean(proj)
        assert j(branch.envgit("log", "--json"))                 # the branch's journal stays readable
        assert tree_of(branch.root) == branch_tree
    finally:
        branch.stop()


def test_adopt_refuses_a_directory_that_is_not_this_projects_branch(proj):
    assert proj.run("echo one > a.txt").returncode == 0
    n, branch = make_fork(proj)
    try:
        assert branch.run("echo two > a.txt").returncode == 0
        record = branch.root / ".envgit" / "branch.json"
        rec = json.loads(record.read_text())
        record.write_text(json.dumps({**rec, "parent": str(proj.home / "elsewhere")}))
        before = tree_of(proj.root)
        r = proj.envgit("adopt", str(n), "--yes")
        assert r.returncode == 2 and f"is not branch {n} of this project" in r.stderr, r.stderr
        assert tree_of(proj.root) == before
    finally:
        branch.stop()


def test_adopt_refuses_a_fork_branch_while_a_step_runs_there(proj):
    assert proj.run("echo one > a.txt").returncode == 0
    n, branch = make_fork(proj)
    try:
        p = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", "echo x > x && sleep 30"],
                             cwd=branch.root, env=branch.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                if j(branch.envgit("ps", "--json"))["steps"]:
                    break
                time.sleep(0.05)
            r = proj.envgit("adopt", str(n), "--yes")
            assert r.returncode == 1 and "is running in branch" in r.stderr, r.stderr
        finally:
            p.kill()
            p.wait()
    finally:
        branch.stop()


# --- kill -9 during an adopt ---------------------------------------------------------------

# The points an adopt reaches, in order: copying the fork's objects (the preview copies them),
# copied (@1 the preview's, @2 the adopt's own, before anything is journaled), the undo point
# recorded, the begin entry written, mid-restore, restored (no end entry yet).
POINTS = [("adopt-copying", 1), ("adopt-copied", 1), ("adopt-copied", 2), ("rewind-undo-recorded", 1),
          ("rewind-begun", 1),
          ("restore-wrote", 2), ("rewind-restored", 1)]


@pytest.mark.parametrize("point,nth", POINTS)
def test_a_kill_during_an_adopt_leaves_the_tree_as_before_or_adopted(proj, point, nth):
    r = proj.run("echo one > a.txt && mkdir d && echo 1 > d/1 && git add -A && "
                 "git -c user.email=a@example.test -c user.name=a commit -qm one")
    assert r.returncode == 0, r.stderr
    before = tree_of(proj.root)
    n, branch = make_fork(proj)
    try:
        r = branch.run("echo two > a.txt && rm -r d && echo new > b.txt && mkdir e && echo 2 > e/2 && "
                       "git add -A && git -c user.email=b@example.test -c user.name=b commit -qm two")
        assert r.returncode == 0, r.stderr
        adopted = tree_of(branch.root)
        count = len(steps(proj))
        proj.stop()                 # the next daemon is started by the adopt, armed
        r = proj.envgit("adopt", str(n), "--yes", env={"ENVGIT_FAULT": f"{point}@{nth}"})
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stdout + r.stderr    # the daemon died
        s = steps(proj)             # the next command's daemon finishes a begun adopt
        now = tree_of(proj.root)
        assert now in (before, adopted), point
        if point in ("adopt-copying", "adopt-copied", "rewind-undo-recorded"):
            assert now == before and len(s) == count
        else:
            assert now == adopted
            [a] = [x for x in s if x["argv"] == ["envgit", "adopt", str(n)]]
            assert a["status"] == "done" and "finished-after-crash" in a["marks"], a
            if point == "restore-wrote":    # the half-written tree the kill left is a step of its own
                assert a["id"] < s[-1]["id"] and "outside" in s[-1]["marks"]
        assert all(x["status"] != "running" for x in s)
        fsck_clean(proj)
        if now == adopted:
            r = proj.envgit("rewind", "--undo", "--yes")
            assert r.returncode == 0, r.stderr
            assert tree_of(proj.root) == before
        else:
            r = proj.envgit("adopt", str(n), "--yes")
            assert r.returncode == 0, r.stderr
            assert tree_of(proj.root) == adopted
        fsck_clean(proj)
    finally:
        branch.stop()


def test_a_gc_waits_for_an_adopt_whose_copied_objects_no_step_names_yet(proj, tmp_path):
    """Between copying a fork's objects into the main store and journaling the adopt, nothing
    names those objects: a gc run then must wait for the adopt, not delete them."""
    r = proj.run("echo one > a.txt && git add -A && git -c user.email=a@example.test -c user.name=a commit -qm one")
    assert r.returncode == 0, r.stderr
    n, branch = make_fork(proj)
    try:
        r = branch.run("echo two > a.txt && seq 1 20000 > new.txt && git add -A && "
                       "git -c user.email=b@example.test -c user.name=b commit -qm two")
        assert r.returncode == 0, r.stderr
        adopted = tree_of(branch.root)
        proj.stop()                 # the next daemon is started by the adopt, armed to pause
        flag = tmp_path / "adopt-copied.paused"
        env = {**proj.env, "ENVGIT_FAULT": "adopt-copied@2:pause", "ENVGIT_FAULT_DIR": str(tmp_path)}
        adopt = subprocess.Popen([ENVGIT, "adopt", str(n), "--yes"], cwd=proj.root, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        gc = None
        try:
            for _ in range(600):
                if flag.exists() or adopt.poll() is not None:
                    break
                time.sleep(0.1)
            assert flag.exists(), adopt.communicate(timeout=10)
            gc = subprocess.Popen([ENVGIT, "gc", "--keep-last", "1"], cwd=proj.root, env=proj.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(3)           # a gc of this small store is done well within this
            assert gc.poll() is None, gc.communicate()      # it waits for the adopt
        finally:
            flag.unlink(missing_ok=True)
        out, err = adopt.communicate(timeout=120)
        assert adopt.returncode == 0 and "Traceback" not in err, out + err
        out, err = gc.communicate(timeout=120)
        assert gc.returncode == 0, out + err
        assert tree_of(proj.root) == adopted
        fsck_clean(proj)
        r = proj.envgit("rewind", "--undo", "--yes")
        assert r.returncode == 0, r.stderr
        r = proj.envgit("adopt", str(n), "--yes")       # its objects still in the store after the gc
        assert r.returncode == 0, r.stderr
        assert tree_of(proj.root) == adopted
        fsck_clean(proj)
    finally:
        branch.stop()
