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
