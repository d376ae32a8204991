"""Environment branches attacked from inside a step (issue 27): a step in one branch must not
read or write another branch's tree, the main tree or the main tree's `.git`, by absolute path,
`..`, a symlink, a hard link or a rename; nor the main store through the branch's store (its
packs are hard links of the main store's). The reverse too (a step in the main tree against the
branches). The oracles: marker files (their content, their presence), read back on the host,
and the markers never showing up in what a step printed or left in its own tree. A `git push`
from a branch is refused by that branch's gate and recorded in that branch's journal."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import Env, make_home
from kit.git_remote import git_remote  # noqa: F401  (the fixture `remote`)
from modelserver import clone_for_push

pytestmark = pytest.mark.both_uids(
    "as a non-root user bwrap builds the step's view in a user namespace, where the person's own "
    "sibling directories (the branches, the main tree) are writable to them on the host: the view "
    "alone must keep them out")

MARK = "BRANCH-ISOLATION-MARK-5c1e"


def attacks(me: Path, others: list[Path]) -> str:
    """One shell script: every way at the other trees from inside a step of `me`, each allowed
    to fail; whatever it reads lands in `loot` (in `me`, read back by the test)."""
    lines = ["exec 2>/dev/null", ": > loot"]
    for k, o in enumerate(others):
        rel = os.path.relpath(o, me)
        for p in (o, rel):
            lines += [f"cat {p}/mark.txt >> loot", f"cat {p}/.git/config >> loot",
                      f"ls -la {p} >> loot", f"git --git-dir={p}/.git log --format=%s >> loot",
                      f"echo PWNED > {p}/pwned-{k}", f"echo PWNED >> {p}/mark.txt",
                      f"echo '[core] fsmonitor = touch {o}/pwned-git' >> {p}/.git/config",
                      f"git -C {p} -c user.email=a@b -c user.name=a commit -qm pwned --allow-empty"]
        lines += [f"ln -s {o}/mark.txt sym-{k}", f"cat sym-{k} >> loot", f"echo PWNED > sym-{k}",
                  f"ln -s {rel} symdir-{k}", f"cat symdir-{k}/mark.txt >> loot", f"echo PWNED > symdir-{k}/pwned-s",
                  f"ln {o}/mark.txt hard-{k}", f"ln {rel}/mark.txt hard2-{k}", f"cat hard-{k} hard2-{k} >> loot",
                  f"echo PWNED >> hard-{k}", f"mv {o}/mark.txt stolen-{k}", f"mv {rel}/mark.txt stolen2-{k}",
                  f"mv {o} moved-{k}", f"cp -r {o} copy-{k}", f"cat copy-{k}/mark.txt >> loot",
                  f"cd {o} && cat mark.txt >> {me}/loot; cd {me}"]
    # the branch's own store shares the main store's pack files: never writable from a step
    lines += ["for p in .envgit/objects/packs/*/*; do echo PWNED >> $p; done",
              "cat .envgit/branch.json >> loot", "echo '{}' > .envgit/branch.json", "true"]
    return "\n".join(lines)


def marks_of(tree: Path) -> dict:
    return {"mark": (tree / "mark.txt").read_text(), "git": (tree / ".git" / "config").read_text(),
            "head": subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                                   text=True).stdout,
            "pwned": sorted(p.name for p in tree.iterdir() if "pwned" in p.name)}


@pytest.fixture
def three(attacker):
    """The main tree and two branches, each with its own mark.txt written after the fork."""
    a = attacker
    (a.root / "src.txt").write_text("shared\n")
    a.own(a.root / "src.txt")
    assert a.run("git -c user.email=a@b -c user.name=a commit -qm one --allow-empty").returncode == 0
    r = a.envgit("fork", "2", "--json")
    assert r.returncode == 0, r.stderr
    dirs = [Path(b["dir"]) for b in json.loads(r.stdout)["branches"]]
    trees = [a.root, *dirs]
    for i, t in enumerate(trees):
        (t / "mark.txt").write_text(f"{MARK}-{i}\n")
        a.own(t / "mark.txt")
    yield a, trees
    for d in dirs:
        if d.exists():
            a.envgit("daemon", "stop", cwd=d)


def _attack_from(a, trees, i):
    me, others = trees[i], [t for j, t in enumerate(trees) if j != i]
    before = {t: marks_of(t) for t in others}
    main_packs = {p: p.read_bytes() for p in (trees[0] / ".envgit" / "objects" / "packs").rglob("*")
                  if p.is_file()}
    r = a.envgit("run", "--", "sh", "-c", attacks(me, others), cwd=me)
    assert r.returncode == 0, r.stderr
    loot = (me / "loot").read_text()
    assert MARK not in loot.replace(f"{MARK}-{i}", ""), loot          # nothing of another tree read
    assert "[core]" not in loot and "parent" not in loot, loot
    for t in others:
        assert marks_of(t) == before[t], t                             # nothing of it written, moved, committed
    # what the step made in its own tree is its own: no second name of another tree's file
    assert all(p.lstat().st_nlink == 1 for p in me.iterdir() if p.name.startswith("hard"))
    assert not any(MARK in p.read_text(errors="replace") for p in me.iterdir() if p.is_file() and not p.is_symlink()
                   and p.name.startswith(("stolen", "hard", "sym", "copy")))
    assert all(p.read_bytes() == data for p, data in main_packs.items())
    for t in trees:
        assert a.envgit("fsck", cwd=t).returncode == 0, t
    # the person's own git later finds no planted fsmonitor
    for t in others:
        a.host("git status >/dev/null", cwd=t)
        assert not (t / "pwned-git").exists()


def test_a_step_in_a_branch_cannot_reach_the_main_tree_or_another_branch(three):
    a, trees = three
    _attack_from(a, trees, 1)


def test_a_step_in_the_main_tree_cannot_reach_a_branch(three):
    a, trees = three
    _attack_from(a, trees, 0)


@pytest.fixture
def netfork(tmp_path, remote):
    """A clone of a real git remote (HTTPS on 127.0.0.1) as a project, pushes denied by the
    default irreversible preset, forked once."""
    if shutil.which("socat") is None:
        pytest.skip("socat is not installed (the step's network bridge)")
    home = make_home(tmp_path)
    root = home / "app"
    env = Env(home, root, {"ENVGIT_RESOLVE": remote.resolve, "ENVGIT_UPSTREAM_CA": str(remote.ca.cert_path)})
    hostport = remote.url.split("/")[2]
    clone_for_push(env, remote)          # a clone of the remote, envgit init; its policy below
    env.write_policy(f"version: 1\nnetwork:\n  allow: [\"{hostport}\"]\nirreversible:\n  - preset: default\n"
                     "shell: []\n")
    assert env.run("true").returncode == 0
    r = env.envgit("fork", "1", "--json", check=True)
    branch = Env(home, Path(json.loads(r.stdout)["branches"][0]["dir"]), dict(env.env))
    yield env, branch
    branch.stop()
    env.stop()


def test_a_push_from_a_branch_is_refused_and_recorded_in_that_branch(netfork, remote):
    """As the test's uid only: the gate's decision does not depend on it."""
    main, branch = netfork
    before = remote.refs()
    r = branch.run("echo 'console.log(1)' > greet.js && git add greet.js && git commit -qm greet "
                   "&& git push -q origin main")
    assert r.returncode != 0
    assert "[remote rejected]" in r.stderr and "preset:default/git-push" in r.stderr, r.stderr
    assert remote.refs() == before
    assert not any(m == "POST" and "receive-pack" in p and s == 200 for m, p, s in remote.log)
    s = json.loads(branch.envgit("log", "--json", check=True).stdout)
    s = s.get("steps", s) if isinstance(s, dict) else s
    assert "denied-net" in s[-1]["marks"]
    assert ("POST", "deny") in {(q["method"], q["decision"]) for q in s[-1]["requests"]
                                if "receive-pack" in q["path"]}
    m = json.loads(main.envgit("log", "--json", check=True).stdout)
    m = m.get("steps", m) if isinstance(m, dict) else m
    assert len(m) == 1 and not m[0]["requests"]                  # the main journal saw none of it
    rows = json.loads(main.envgit("branches", "--json", check=True).stdout)["branches"]
    assert rows[0]["marks"] and "denied-net" in rows[0]["marks"]


def test_what_a_step_leaves_in_a_branch_cannot_make_branch_rm_reach_outside_it(three):
    """Symlinks to the main tree (a file, a directory), read-only and unreadable directories:
    `envgit branch rm --force` removes the branch and nothing it points at, and changes no mode
    outside it."""
    a, trees = three
    main, one = trees[0], trees[1]
    before = {p: (p.stat().st_mode, p.read_text()) for p in (main / "mark.txt", main / "src.txt")}
    main_mode = main.stat().st_mode
    script = (f"ln -s {main} tomain && ln -s {main}/mark.txt tomark && ln -s .. up && "
              "mkdir -p ro/deep/er && echo x > ro/deep/er/f && ln -s /etc ro/deep/etc && "
              "chmod 000 ro/deep/er && chmod 555 ro/deep ro")
    r = a.envgit("run", "--", "sh", "-c", script, cwd=one)
    assert r.returncode == 0, r.stderr
    r = a.envgit("branch", "rm", "1", "--force")
    assert r.returncode == 0, r.stderr
    assert not one.exists()
    assert {p: (p.stat().st_mode, p.read_text()) for p in before} == before
    assert main.stat().st_mode == main_mode and (main / ".git" / "config").exists()
    assert os.stat("/etc").st_mode & 0o777 == 0o755
    assert a.envgit("fsck").returncode == 0
