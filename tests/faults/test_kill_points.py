"""kill -9 of the daemon at each named point of a step's snapshot and journal append (the
ENVGIT_FAULT hook), then on: what was recorded is exactly what happened, the next command
works, and every rewind writes exactly its tree. Also a bounded loop of kills at random
moments while steps run."""

import json
import os
import random
import signal
import subprocess
import time

import pytest

from conftest import ENVGIT
from faultlib import assert_rewinds_exactly, no_traceback, rows, tree_of

POINTS = [("journal-inserted", 1), ("journal-committed", 1), ("journal-inserted", 2),
          ("journal-committed", 2), ("pack-sealed-no-index", 1), ("step-snapshotted", 1)]


@pytest.mark.parametrize("point,nth", POINTS)
def test_a_step_killed_at_each_point(bare_proj, point, nth):
    proj = bare_proj
    assert proj.run("echo 1 > a").returncode == 0
    after1 = tree_of(proj.root)
    proj.stop()
    r = no_traceback(proj.run("echo 2 > a", env={"ENVGIT_FAULT": f"{point}@{nth}"}))
    ran = (proj.root / "a").read_text() == "2\n"
    steps = json.loads(no_traceback(proj.envgit("log", "--json")).stdout)
    if point == "journal-inserted" and nth == 1:      # its begin never committed: not a step,
        assert not ran and r.returncode != 0 and [s["id"] for s in steps] == [1]   # never run
    else:          # begun (after journal-committed@1 the daemon died before the command ran)
        assert ran == ((point, nth) != ("journal-committed", 1)) and [s["id"] for s in steps] == [1, 2]
        s2 = steps[1]
        if point == "journal-committed" and nth == 2:  # the end was committed: done, with its tree
            assert s2["status"] == "done" and s2["snapshot"]["tree"]
        else:                                           # the end never was: said, not invented
            assert s2["status"] == "interrupted" and not (s2["snapshot"] or {}).get("tree")
    assert no_traceback(proj.envgit("fsck")).returncode == 0
    assert proj.run("echo 3 > a && echo x > b").returncode == 0
    after3 = tree_of(proj.root)
    ids = [s["id"] for s in json.loads(proj.envgit("log", "--json", check=True).stdout)]
    assert len(ids) == len(set(ids))
    assert_rewinds_exactly(proj, {1: after1, ids[-1]: after3})
    assert no_traceback(proj.envgit("gc")).returncode == 0   # drops what the kill left unreferenced
    assert proj.envgit("fsck").returncode == 0


def test_daemon_killed_at_random_moments(bare_proj):
    proj = bare_proj
    rnd = random.Random(11)
    expected = {}
    for i in range(8):
        p = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c",
                              f"for j in 1 2 3 4 5 6 7 8; do echo {i}-$j > f$j; done; echo {i} > a"],
                             cwd=proj.root, env=proj.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(rnd.uniform(0.0, 0.15))
        st = proj.envgit("daemon", "status")
        if st.returncode == 0:
            os.kill(json.loads(st.stdout)["pid"], signal.SIGKILL)
        out, err = p.communicate(timeout=60)
        assert b"Traceback" not in err
        steps = json.loads(no_traceback(proj.envgit("log", "--json")).stdout)
        assert all(s["status"] in ("done", "interrupted") for s in steps)
        if steps and steps[-1]["status"] == "done" and (steps[-1]["snapshot"] or {}).get("tree"):
            expected[steps[-1]["id"]] = tree_of(proj.root)
        assert no_traceback(proj.envgit("fsck")).returncode == 0
    assert proj.run("echo end > a").returncode == 0
    last = json.loads(proj.envgit("log", "--json", check=True).stdout)[-1]["id"]
    expected[last] = tree_of(proj.root)
    ids = [s["id"] for s in json.loads(proj.envgit("log", "--json", check=True).stdout)]
    assert len(ids) == len(set(ids)) and ids == sorted(ids)
    assert_rewinds_exactly(proj, expected)
    assert [k for _, _, k, _ in rows(proj)].count("lost") == 0     # a kill loses no entry


def test_a_daemon_killed_while_a_step_runs_is_one_line_and_the_exit_code_is_kept(bare_proj):
    """The daemon dies (kill -9) while the command runs: the command runs to its end, `envgit
    run` exits with its exit code, and says in one line, in words (no errno), that the step is
    recorded as interrupted; the next command starts a new daemon and records it so."""
    proj = bare_proj
    assert proj.run("true").returncode == 0
    pid = json.loads(proj.envgit("daemon", "status", check=True).stdout)["pid"]
    # the command ends when communicate() closes its stdin, after the kill: a `sleep 1.5`
    # could end first while `daemon status` started on a loaded machine (the step: done)
    p = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", "read line; echo hi > x; exit 7"],
                         cwd=proj.root, env=proj.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:                # until the daemon holds the step
        if json.loads(proj.envgit("daemon", "status", check=True).stdout)["live"]:
            break
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 7 and (proj.root / "x").read_text() == "hi\n"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("envgit: step 2 could not be closed: "), err
    assert "Errno" not in err and "Traceback" not in err and "exited 7" in err
    assert proj.run("true").returncode == 0
    steps = json.loads(no_traceback(proj.envgit("log", "--json")).stdout)
    assert [s["status"] for s in steps] == ["done", "interrupted", "done"]
