"""envgit fork / branches / branch rm (issue 27): a branch is a working tree of the project at
a step, a project of its own sharing the store; a kill anywhere in a fork leaves nothing
half-made; steps in several branches at once each land in their own journal."""

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import ENVGIT, Env


def fork(proj, *args):
    r = proj.envgit("fork", *args, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def branch_env(proj, d) -> Env:
    return Env(proj.home, Path(d))


def steps(env):
    r = env.envgit("log", "--json", check=True)
    data = json.loads(r.stdout)
    return data.get("steps", data) if isinstance(data, dict) else data


def listing(proj):
    return json.loads(proj.envgit("branches", "--json", check=True).stdout)["branches"]


def fsck_ok(env):
    r = env.envgit("fsck")
    assert r.returncode == 0 and "ok" in r.stdout, (env.root, r.stdout, r.stderr)


def tree_of(root: Path) -> dict:
    """path -> content (or link target, or None for a directory), .envgit left out."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d != ".envgit"]
        for d in dirnames:
            p = os.path.join(dirpath, d)
            out[os.path.relpath(p, root)] = os.readlink(p) if os.path.islink(p) else None
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = os.readlink(p) if os.path.islink(p) else Path(p).read_bytes()
    return out


@pytest.fixture
def forked(proj):
    """A project with a few kinds of files (ignored, executable, a symlink, a commit), one step."""
    (proj.root / ".gitignore").write_text(".envgit/\nbuild/\n")
    assert proj.run("mkdir -p src build && echo 'print(1)' > src/app.py && echo art > build/out.o "
                    "&& printf '#!/bin/sh\\n' > run.sh && chmod +x run.sh && ln -s src/app.py link "
                    "&& git add -A && git -c user.email=a@b -c user.name=a commit -qm one").returncode == 0
    yield proj
    for b in listing(proj):
        if b["kind"] == "fork" and b["exists"]:
            branch_env(proj, b["dir"]).stop()


def test_fork_makes_working_trees_that_are_projects_of_their_own(forked):
    proj = forked
    made = fork(proj, "2")
    assert made["step"] == 1 and [b["id"] for b in made["branches"]] == [1, 2]
    main_tree = tree_of(proj.root)
    for b in made["branches"]:
        d = Path(b["dir"])
        assert d == proj.root.parent / f"proj.envgit-{b['id']}"
        assert tree_of(d) == main_tree                    # ignored files, .git, the policy: all of it
        assert os.access(d / "run.sh", os.X_OK)
        parent = json.loads((d / ".envgit" / "branch.json").read_text())
        assert parent == {"version": 1, "parent": str(proj.root), "id": b["id"], "from_step": 1,
                          "from_tree": made["tree"]}
        rec = json.loads((proj.root / ".envgit" / "branches" / f"{b['id']}.json").read_text())
        assert rec["dir"] == str(d) and rec["kind"] == "fork" and rec["from_tree"] == made["tree"]
        assert (proj.root / ".envgit" / "branches" / f"{b['id']}.json").stat().st_mode & 0o777 == 0o600
        # the store is shared: the branch's packs are the main store's files
        packs = list((d / ".envgit" / "objects" / "packs").rglob("*.pack"))
        assert packs and all(p.stat().st_ino == (proj.root / ".envgit" / "objects" / "packs" / p.parent.name
                                                 / p.name).stat().st_ino for p in packs)
    one = branch_env(proj, made["branches"][0]["dir"])
    r = one.run("echo branch > src/app.py && git -c user.email=a@b -c user.name=a commit -qam two")
    assert r.returncode == 0, r.stderr
    s = steps(one)
    assert len(s) == 1 and s[0]["baseline"]["tree"] == made["tree"]    # the journal starts at the fork point
    assert [p["path"] for p in s[0]["snapshot"]["paths"] if not p["path"].startswith(".git/")] == ["src/app.py"]
    # the main tree and the other branch are untouched, and their git histories are their own
    assert (proj.root / "src" / "app.py").read_text() == "print(1)\n"
    assert (Path(made["branches"][1]["dir"]) / "src" / "app.py").read_text() == "print(1)\n"
    log = subprocess.run(["git", "-C", str(proj.root), "log", "--oneline"], capture_output=True, text=True).stdout
    assert len(log.splitlines()) == 1
    fsck_ok(proj)
    fsck_ok(one)
    seen = json.loads(one.envgit("branches", "--json", check=True).stdout)
    assert seen == {"branches": [], "parent": parent | {"id": 1}}
    rows = {b["id"]: b for b in listing(proj)}
    assert rows[1]["steps"] == 1 and rows[1]["last_step"] == 1 and rows[1]["running"] == []
    assert rows[2]["steps"] == 0 and rows[2]["tree"] == made["tree"]


def test_fork_at_a_step_into_a_directory(forked, tmp_path):
    proj = forked
    assert proj.run("echo two > second.txt").returncode == 0           # step 2
    made = fork(proj, "1", "--at", "1", "--into", str(tmp_path / "tries"))
    d = Path(made["branches"][0]["dir"])
    assert made["step"] == 1 and d == tmp_path / "tries" / "proj.envgit-1"
    assert (d / "src" / "app.py").exists() and not (d / "second.txt").exists()
    r = proj.envgit("fork", "1", "--into", str(proj.root / "inside"))
    assert r.returncode != 0 and "inside the project" in r.stderr
    # ids are never reused, even after a removal
    assert proj.envgit("branch", "rm", "1", check=True).returncode == 0
    assert not d.exists()
    assert fork(proj, "1", "--into", str(tmp_path / "tries"))["branches"][0]["id"] == 2


def test_branch_rm_refuses_changes_since_the_last_step_unless_forced(forked):
    proj = forked
    assert proj.run("mkdir -p ro/deeper && echo x > ro/deeper/f && chmod 555 ro/deeper ro").returncode == 0
    made = fork(proj, "1")
    assert (Path(made["branches"][0]["dir"]) / "ro").stat().st_mode & 0o777 == 0o555
    d = Path(made["branches"][0]["dir"])
    (d / "unsaved.txt").write_text("work\n")
    r = proj.envgit("branch", "rm", "1")
    assert r.returncode != 0 and "changes since" in r.stderr and "--force" in r.stderr, r.stderr
    assert d.exists() and listing(proj)[0]["id"] == 1
    r = proj.envgit("branch", "rm", "1", "--force", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"id": 1, "kind": "fork", "dir": str(d), "removed": True}
    assert not d.exists() and listing(proj) == []
    r = proj.envgit("branch", "rm", "7")
    assert r.returncode != 0 and "no fork branch 7" in r.stderr
    # a branch directory the person removed themselves: listed as missing, its record dropped by rm
    d = Path(fork(proj, "1")["branches"][0]["dir"])
    subprocess.run(["rm", "-rf", str(d)], check=True)
    assert [(b["id"], b["exists"]) for b in listing(proj)] == [(2, False)]
    assert "directory missing" in proj.envgit("branches", check=True).stdout
    r = proj.envgit("branch", "rm", "2")
    assert r.returncode == 0 and "its directory was gone" in r.stdout, r.stderr
    assert listing(proj) == []


def test_branch_rm_refuses_while_a_step_runs_there(forked):
    proj = forked
    d = Path(fork(proj, "1")["branches"][0]["dir"])
    one = branch_env(proj, d)
    p = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", "touch started; sleep 30"], cwd=d, env=one.env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):                # the branch's first step: seconds, on a loaded machine
            if (d / "started").exists():
                break
            threading.Event().wait(0.05)
        rows = listing(proj)
        assert rows[0]["running"], rows
        r = proj.envgit("branch", "rm", "1", "--force")
        assert r.returncode != 0 and "a step runs in branch 1" in r.stderr, r.stderr
        assert d.exists()
    finally:
        p.kill()
        p.wait()


def test_branch_rm_of_a_rewound_branch(forked):
    proj = forked
    assert proj.run("echo 2 > two").returncode == 0
    assert proj.run("echo 3 > three").returncode == 0
    r = proj.envgit("rewind", "1", "--yes")
    assert r.returncode == 0, r.stderr
    rows = listing(proj)
    rw = [b for b in rows if b["kind"] == "rewound"]
    assert len(rw) == 1 and rw[0]["step_range"] == [2, 3] and rw[0]["from_step"] == 1, rows
    r = proj.envgit("branch", "rm", rw[0]["id"])
    assert r.returncode == 0, r.stderr
    assert [b for b in listing(proj) if b["kind"] == "rewound"] == []
    assert proj.envgit("branch", "rm", "r99").returncode != 0


@pytest.mark.parametrize("point", ["fork-linked", "restore-wrote@3", "fork-restored", "fork-renamed",
                                   "fork-recorded"])
def test_a_fork_killed_anywhere_leaves_nothing_half_made(forked, point):
    proj = forked
    r = proj.envgit("fork", "2", env={"ENVGIT_FAULT": point})
    assert r.returncode == -9, (r.returncode, r.stderr)
    parent = proj.root.parent

    def state():
        finals = sorted(p.name for p in parent.iterdir() if p.name.startswith("proj.envgit-"))
        temps = sorted(p.name for p in parent.iterdir() if ".forking-" in p.name)
        recs = sorted(p.name for p in (proj.root / ".envgit" / "branches").glob("*.json"))
        return finals, temps, recs

    finals, temps, recs = state()
    # under its final name a branch is whole (renamed in last), and a record never names nothing
    for name in finals:
        assert (parent / name / ".envgit" / "branch.json").exists()
        assert tree_of(parent / name) == tree_of(proj.root)
    for rec in recs:
        assert Path(json.loads((proj.root / ".envgit" / "branches" / rec).read_text())["dir"]).exists()
    rows = listing(proj)                 # finishes or undoes the killed fork
    finals, temps, recs = state()
    assert temps == [] and not list((proj.root / ".envgit" / "branches").glob("*.forking"))
    assert finals == [f"proj.envgit-{b['id']}" for b in rows if b["kind"] == "fork"]
    assert recs == [f"{b['id']}.json" for b in rows if b["kind"] == "fork"]
    fsck_ok(proj)
    for b in rows:
        fsck_ok(branch_env(proj, b["dir"]))
    again = fork(proj, "1")                          # and the next fork works, with a new id
    assert again["branches"][0]["id"] == 3
    one = branch_env(proj, again["branches"][0]["dir"])
    assert one.run("echo x > x").returncode == 0
    fsck_ok(one)


def test_steps_in_four_branches_at_once_each_land_in_their_own_journal(forked):
    proj = forked
    made = fork(proj, "4")
    envs = [branch_env(proj, b["dir"]) for b in made["branches"]]
    failures = []

    def work(i, env):
        for k in range(20):
            r = env.run(f"echo {i}-{k} > f{k}.txt")
            if r.returncode != 0:
                failures.append((i, k, r.stderr))

    threads = [threading.Thread(target=work, args=(i, e)) for i, e in enumerate(envs)]
    for t in threads:
        t.start()
    main = [proj.run(f"echo main-{k} > m{k}.txt") for k in range(5)]       # and the main tree meanwhile
    for t in threads:
        t.join()
    assert not failures, failures
    assert all(r.returncode == 0 for r in main)
    for i, env in enumerate(envs):
        s = steps(env)
        assert [x["id"] for x in s] == list(range(1, 21))
        assert [x["argv"][-1] for x in s] == [f"echo {i}-{k} > f{k}.txt" for k in range(20)]
        assert all(x["status"] == "done" and x["exit_code"] == 0 for x in s)
        assert [[p["path"] for p in x["snapshot"]["paths"]] for x in s] == [[f"f{k}.txt"] for k in range(20)]
        assert s[0]["baseline"]["tree"] == made["tree"]
        assert sorted(p.name for p in env.root.glob("m*.txt")) == []
        fsck_ok(env)
    assert len(steps(proj)) == 6 and not list(proj.root.glob("f*.txt"))
    fsck_ok(proj)
    rows = listing(proj)
    assert [(b["steps"], b["last_step"]) for b in rows] == [(20, 20)] * 4
