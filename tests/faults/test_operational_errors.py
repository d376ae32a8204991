"""Operational failures are one line starting `envgit:` with the fix, and a stable exit code
(cli.py: 3 the daemon, 4 the snapshot store, 5 the journal), never a traceback.

The faults this reproduces (issue 11, item 8): `log` and `rewind` after an interrupted rewind,
a daemon that went away, and MissingObject when a pack or its index is gone all printed
tracebacks. Also a rewind killed midway is finished by the next command (or, when it cannot
be, closed with the reason instead of being retried by every command)."""

import json

import pytest

from faultlib import assert_rewinds_exactly, no_traceback, tree_of


def pack_of(proj, step, name):
    """The pack file holding the blob of `name` in step's tree."""
    from envgit.snapshot import Store
    from envgit.snapshot.diff import read_tree
    from envgit.snapshot.packs import pack_path
    tree = json.loads(proj.envgit("show", str(step), "--json", check=True).stdout)["snapshot"]["tree"]
    objects = proj.root / ".envgit" / "objects"
    store = Store(objects)
    oid = next(e.oid for e in read_tree(store.objects, bytes.fromhex(tree)) if e.name == name)
    pack_id = store.objects.index[oid][0]
    store.close()
    return pack_path(str(objects / "packs"), pack_id, ".pack")


def one_line(r, code):
    no_traceback(r)
    assert r.returncode == code, (r.returncode, r.stderr)
    said = [line for line in r.stderr.splitlines() if line.startswith("envgit")]
    assert len(said) == 1 and said[0].startswith("envgit: "), r.stderr


@pytest.mark.parametrize("ext", [".pack", ".idx"])
def test_a_missing_pack_or_index_is_one_line(bare_proj, ext):
    import os
    proj = bare_proj
    assert proj.run("head -c 5000 /dev/urandom > data.bin").returncode == 0
    assert proj.run("rm data.bin").returncode == 0
    proj.stop()
    os.unlink(pack_of(proj, 1, b"data.bin")[:-5] + ext)
    one_line(proj.envgit("diff", "1", "2"), 4)
    r = no_traceback(proj.envgit("rewind", "1", "--yes"))
    assert r.returncode == 4 and "fsck" in r.stderr and not (proj.root / "data.bin").exists()
    f = no_traceback(proj.envgit("fsck"))
    assert f.returncode == 1
    assert no_traceback(proj.run("echo goes on > b")).returncode == 0


def test_the_daemon_going_away_is_one_line(bare_proj):
    proj = bare_proj
    assert proj.run("echo 1 > a").returncode == 0
    proj.stop()
    one_line(proj.envgit("gc", env={"ENVGIT_FAULT": "gc-journaled"}), 3)
    assert no_traceback(proj.envgit("gc")).returncode == 0       # the next one starts a daemon


@pytest.mark.parametrize("point", ["rewind-begun", "rewind-restored"])
def test_a_killed_rewind_is_finished_by_the_next_command(bare_proj, point):
    proj = bare_proj
    assert proj.run("mkdir d && echo 1 > d/a && echo 1 > b").returncode == 0
    after1 = tree_of(proj.root)
    assert proj.run("rm -r d && echo 2 > b && echo 2 > c").returncode == 0
    proj.stop()
    r = no_traceback(proj.envgit("rewind", "1", "--yes", env={"ENVGIT_FAULT": point}))
    assert r.returncode == 3                                     # the daemon died under it
    log = no_traceback(proj.envgit("log", "--json"))             # finishes the rewind first
    steps = json.loads(log.stdout)
    assert steps[-1]["status"] == "done" and "finished-after-crash" in steps[-1]["marks"]
    assert tree_of(proj.root) == after1
    assert no_traceback(proj.envgit("fsck")).returncode == 0
    assert_rewinds_exactly(proj, {1: after1})


def test_a_killed_rewind_that_cannot_be_finished_is_closed_with_the_reason(bare_proj):
    import os
    proj = bare_proj
    assert proj.run("head -c 5000 /dev/urandom > data.bin").returncode == 0
    assert proj.run("rm data.bin && echo 2 > b").returncode == 0
    after2 = tree_of(proj.root)
    pack = pack_of(proj, 1, b"data.bin")       # (any command after the kill finishes the rewind)
    proj.stop()
    r = no_traceback(proj.envgit("rewind", "1", "--yes", env={"ENVGIT_FAULT": "rewind-begun"}))
    assert r.returncode == 3
    os.unlink(pack)                                              # the target's content is gone
    for args in (("log",), ("rewind", "2", "--yes")):
        r = no_traceback(proj.envgit(*args))
    steps = json.loads(no_traceback(proj.envgit("log", "--json")).stdout)
    rewind = steps[2]
    assert rewind["status"] == "done" and rewind["exit_code"] == 1 and "not-finished" in rewind["marks"]
    assert r.returncode == 0 and tree_of(proj.root) == after2    # rewind 2 worked


HUGE = "99999999999999999999999"          # past SQLite's integers


@pytest.mark.parametrize("args", [("ls", HUGE), ("show", HUGE), ("cat", f"{HUGE}:a"), ("diff", HUGE),
                                  ("rewind", HUGE, "--yes"), ("ls", f"last~{HUGE}"),
                                  ("restore", HUGE, "--target", "out"), ("show", HUGE, "--json")])
def test_a_step_number_past_any_journal_is_one_line(bare_proj, args):
    proj = bare_proj
    assert proj.run("echo 1 > a").returncode == 0
    r = no_traceback(proj.envgit(*args))
    assert r.returncode == 2 and "no step has a number that large" in r.stderr + r.stdout, r.stderr


def test_log_n_past_any_journal_lists_every_step(bare_proj):
    proj = bare_proj
    assert proj.run("echo 1 > a").returncode == 0
    r = no_traceback(proj.envgit("log", "-n", HUGE, "--json"))
    assert r.returncode == 0 and len(json.loads(r.stdout)) == 1, r.stderr
