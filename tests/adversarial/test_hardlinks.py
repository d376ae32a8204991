"""Class 9: a file's second name (a hard link). A write through it must be seen by the
snapshot (diff, show, rewind), and a protected path must not be writable through one.
The oracles: the content of the first name, and a marker a planted git config would touch."""

import json

import pytest

pytestmark = pytest.mark.both_uids(
    "as a non-root user bwrap builds the view in a user namespace: the hard link must be refused "
    "there too (and seen across its mounts), and a rewind writes the file back as the person (as root "
    "it also sets the owner)")


def show(a, step):
    return json.loads(a.envgit("show", str(step), "--json", check=True).stdout)


def changed_paths(a, step):
    return {p["path"] for p in show(a, step)["snapshot"]["paths"]}


def test_no_second_name_in_tmp(attacker):
    """/tmp and the project are different mounts inside the sandbox: no link between them."""
    a = attacker
    (a.root / "a.txt").write_text("original\n")
    a.own(a.root / "a.txt")
    r = a.run("ln a.txt /tmp/l && echo changed > /tmp/l")
    assert r.returncode != 0 and "cross-device" in r.stderr.lower(), r.stderr
    assert (a.root / "a.txt").read_text() == "original\n"


def test_write_through_a_second_name_is_seen_and_rewound(attacker):
    a = attacker
    (a.root / "a.txt").write_text("original\n")
    a.own(a.root / "a.txt")
    assert a.run("true").returncode == 0                               # step 1: the tree with a.txt
    r = a.run("mkdir -p deep/er && ln a.txt deep/er/b && echo changed > deep/er/b")   # step 2
    assert r.returncode == 0, r.stderr
    assert (a.root / "a.txt").read_text() == "changed\n"
    assert "a.txt" in changed_paths(a, 2)
    d = a.envgit("diff", "1", "2", check=True).stdout
    assert "a.txt" in d and "+changed" in d, d
    # later writes through the second name alone: the first name is re-checked every snapshot
    assert a.run("echo again > deep/er/b").returncode == 0             # step 3
    assert "a.txt" in changed_paths(a, 3)
    assert "+again" in a.envgit("diff", "2", "3", "--", "a.txt", check=True).stdout
    r = a.envgit("rewind", "1", "--yes")
    assert r.returncode == 0, r.stderr
    assert (a.root / "a.txt").read_text() == "original\n"


def test_a_link_made_before_envrc_existed_cannot_rewrite_it(attacker):
    a = attacker
    a.write_policy('version: 1\nescape_routes:\n  allow: [".envrc"]\n')   # else taken back at once
    r = a.run("echo 'export A=1' > x && ln x .envrc")                   # step 1: creates .envrc
    assert r.returncode == 0, r.stderr
    assert "escape-route-written" in show(a, 1)["marks"] and ".envrc" in show(a, 1)["escape_routes"]
    r = a.run("echo 'touch $HOME/pwned' > x; echo 'touch $HOME/pwned' >> .envrc")   # step 2
    assert r.returncode != 0
    assert (a.root / ".envrc").read_text() == "export A=1\n"
    assert (a.root / "x").read_text() == "touch $HOME/pwned\n"         # the other name is its own file
    assert (a.root / ".envrc").stat().st_nlink == 1


def test_a_hard_link_to_git_config_cannot_rewrite_it(attacker):
    a = attacker
    m = a.home / "pwned-hardlink"
    r = a.host("ln .git/config notes.txt")          # made earlier, outside any step
    assert r.returncode == 0, r.stderr
    before = (a.root / ".git" / "config").read_text()
    r = a.run(f"printf '[core]\\n\\tfsmonitor = \"touch {m}; false\"\\n' >> notes.txt")
    assert r.returncode == 0, r.stderr                # the other name is an ordinary file
    assert (a.root / ".git" / "config").read_text() == before
    a.host("git status")
    assert not m.exists()
    assert a.host("git config --get core.fsmonitor").stdout == ""
    owner = (a.root / ".git" / "config").stat()
    assert owner.st_uid == (a.root / ".git").stat().st_uid     # still the person's file
