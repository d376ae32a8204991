"""A project with branches on a remote (issue 27, item 6), against the real S3 server of
tests/kit/s3.py: `envgit push` pushes the project and then each fork branch as a project of
its own, `<project>.envgit-<id>`, whose head names its parent; `log --remote` lists the
project's fork branches from the heads and its rewound branches from its journal; a branch's
steps restore on another machine; `--no-branches` pushes the project alone."""

import json
from pathlib import Path

from conftest import Env
from kit.s3 import s3_server  # noqa: F401  (the fixture `s3`)
from kit.trees import tree_of
from test_remote import add_remote, machine


def j(r):
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_push_and_restore_a_project_with_fork_and_rewound_branches(tmp_path, s3):
    m1 = machine(tmp_path, "m1", s3, project="app")
    for i in range(1, 4):
        m1.run(f"echo {i} > f{i}.txt", check=True)
    m1.envgit("rewind", "2", "--yes", check=True)            # step 4: branch r4 holds step 3
    made = j(m1.envgit("fork", "1", "--json"))
    [b] = made["branches"]
    branch = Env(m1.home, Path(b["dir"]), m1.env)
    try:
        branch.run("echo branch-only > b.txt && mkdir d && echo deep > d/x", check=True)
        branch_tree = tree_of(branch.root)
        add_remote(m1, s3)

        pushed = j(m1.envgit("push", "ci", "--json"))
        assert pushed["project"] == "app" and [x["project"] for x in pushed["branches"]] == [
            f"app.envgit-{b['id']}"]
        assert pushed["branches"][0]["branch"] == b["id"]

        got = j(m1.envgit("log", "--remote", "ci", "--json"))
        assert got["problems"] == [] and got["branch"] is None
        kinds = {(x["kind"], x["id"]) for x in got["branches"]}
        assert kinds == {("fork", b["id"]), ("rewound", "r4")}, got["branches"]
        [fork] = [x for x in got["branches"] if x["kind"] == "fork"]
        assert fork["from_step"] == made["step"] and fork["from_tree"] == made["tree"]
        [rw] = [x for x in got["branches"] if x["kind"] == "rewound"]
        assert rw["steps"] == [3, 3]
        text = m1.envgit("log", "--remote", "ci").stdout
        assert f"branch {b['id']}: app.envgit-{b['id']} (fork of step {made['step']}" in text
        assert "branch r4: steps 3-3" in text

        # the branch read and restored on another machine, as the branch's own project
        m2 = machine(tmp_path, "m2", s3, init=False)
        (tmp_path / "key").write_bytes((Path(m1.home) / ".config/envgit/remotes/ci.key").read_bytes())
        add_remote(m2, s3, key_file=tmp_path / "key")
        theirs = j(m2.envgit("log", "--remote", "ci", "--project", f"app.envgit-{b['id']}",
                             "--machine", "m1", "--json"))
        assert theirs["branch"]["parent"] == "app" and theirs["branch"]["id"] == b["id"]
        assert theirs["steps"] == j(branch.envgit("log", "--json"))
        out = tmp_path / "restored"
        m2.envgit("restore", "--from", "ci", "last", "--target", str(out), "--project",
                  f"app.envgit-{b['id']}", "--machine", "m1", check=True)
        assert tree_of(out) == branch_tree
        out3 = tmp_path / "restored-3"      # the step the rewind stepped over, from the main project
        m2.envgit("restore", "--from", "ci", "3", "--target", str(out3), "--project", "app",
                  "--machine", "m1", check=True)
        assert (out3 / "f3.txt").read_text() == "3\n"
        r = m2.envgit("fsck", "--remote", "ci", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["ok"], r.stdout + r.stderr

        # a step in the branch, then a push of the project alone leaves the branch's head as it was
        branch.run("echo more > c.txt", check=True)
        alone = j(m1.envgit("push", "ci", "--no-branches", "--json"))
        assert alone["branches"] == []
        again = j(m1.envgit("log", "--remote", "ci", "--json"))
        [fork2] = [x for x in again["branches"] if x["kind"] == "fork"]
        assert fork2["step"] == fork["step"]
        # pushed from inside the branch, under the same name, its head moves on
        j(branch.envgit("push", "ci", "--json"))
        [fork3] = [x for x in j(m1.envgit("log", "--remote", "ci", "--json"))["branches"]
                   if x["kind"] == "fork"]
        assert fork3["step"] > fork["step"]
    finally:
        branch.stop()
        m1.stop()


def test_a_branch_is_pushed_under_its_parents_given_name(tmp_path, s3):
    """ENVGIT_PROJECT names the parent on remotes: its branches are `<that>.envgit-<id>`, never
    the parent's own place (whose journal is not theirs)."""
    m1 = machine(tmp_path, "m1", s3, project="app", extra={"ENVGIT_PROJECT": "billing"})
    m1.run("echo 1 > f.txt", check=True)
    [b] = j(m1.envgit("fork", "1", "--json"))["branches"]
    branch = Env(m1.home, Path(b["dir"]), m1.env)
    try:
        add_remote(m1, s3)
        branch.run("echo 2 > g.txt", check=True)
        pushed = j(branch.envgit("push", "ci", "--json"))
        assert pushed["project"] == f"billing.envgit-{b['id']}"
        pushed = j(m1.envgit("push", "ci", "--json"))
        assert pushed["project"] == "billing"
        assert [x["project"] for x in pushed["branches"]] == [f"billing.envgit-{b['id']}"]
    finally:
        branch.stop()
        m1.stop()
