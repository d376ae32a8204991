"""A full disk (issue 11, item 6), on a small tmpfs the test mounts under its tmp dir (root
only): a step that fills the disk is told once what was and was not recorded; the next step,
a daemon starting on the full disk and `envgit log` say "the disk is full" in one line, with
no traceback and no 30 s wait; freeing space makes the next command work, the held-back end
is written (or the step closed), ids stay unique and rewinds stay exact."""

import json
import os
import time

import pytest

from faultlib import assert_rewinds_exactly, no_traceback, small_disk_fixture, tree_of  # noqa: F401

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root "
                                "(an unprivileged user cannot make a filesystem that fills up)")


def said_once(r, *words):
    lines = [line for line in r.stderr.splitlines() if "disk" in line and "full" in line]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("envgit: ") and all(w in lines[0] for w in words), lines[0]


def fill(root):
    with open(root / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass


def test_a_full_disk_is_said_once_and_freeing_space_makes_the_next_command_work(small_disk):
    proj = small_disk
    assert proj.run("echo 1 > a").returncode == 0
    after1 = tree_of(proj.root)
    # The step fills the disk itself: its snapshot and its end entry cannot be written.
    r = no_traceback(proj.run("echo 2 > b; dd if=/dev/zero of=fill bs=64k 2>/dev/null; true"))
    said_once(r, "step 2", "not recorded")
    log = json.loads(no_traceback(proj.envgit("log", "--json")).stdout)
    assert [s["id"] for s in log] == [1, 2] and log[1]["status"] == "running"     # what is true
    t = time.monotonic()
    r = no_traceback(proj.run("echo 3 > c"))
    assert r.returncode == 125 and time.monotonic() - t < 10          # envgit's own failure
    said_once(r, "nothing was started")
    assert not (proj.root / "c").exists()
    # A daemon starting on the full disk: said at once, not after 30 s.
    proj.stop()
    fill(proj.root)
    for argv in (["run", "--", "true"], ["log"], ["show", "1"]):
        t = time.monotonic()
        r = no_traceback(proj.envgit(*argv, timeout=60))
        assert time.monotonic() - t < 15, argv
        if argv[0] == "run":
            assert r.returncode == 125 and r.stderr.startswith("envgit: ") and "full" in r.stderr, r.stderr
            assert len(r.stderr.strip().splitlines()) == 1
        else:
            assert r.returncode == 0, r.stderr
    # Space freed: the next command works, and what happened is recorded.
    (proj.root / "filler").unlink()
    (proj.root / "fill").unlink()
    assert no_traceback(proj.run("echo 4 > d")).returncode == 0
    log = json.loads(proj.envgit("log", "--json", check=True).stdout)
    ids = [s["id"] for s in log]
    assert ids == sorted(set(ids)) and ids[-1] == 3
    assert log[1]["status"] in ("done", "interrupted")                      # step 2 closed
    after3 = tree_of(proj.root)
    assert proj.envgit("fsck").returncode == 0
    assert_rewinds_exactly(proj, {1: after1, 3: after3})


def test_a_held_back_end_is_written_late_by_the_same_daemon(small_disk):
    proj = small_disk
    assert proj.run("echo 1 > a").returncode == 0
    r = no_traceback(proj.run("dd if=/dev/zero of=fill bs=64k 2>/dev/null; exit 7"))
    assert r.returncode == 7                          # the command's own exit, as always
    said_once(r, "step 2", "exit 7")
    (proj.root / "fill").unlink()                     # the same daemon still holds step 2's end
    assert proj.run("echo 3 > c").returncode == 0
    log = json.loads(proj.envgit("log", "--json", check=True).stdout)
    assert [(s["id"], s["status"], s["exit_code"]) for s in log] == [(1, "done", 0), (2, "done", 7), (3, "done", 0)]
    assert "snapshot-failed" in log[1]["marks"]
    assert proj.envgit("fsck").returncode == 0
