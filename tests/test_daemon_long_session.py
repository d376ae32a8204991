"""A daemon through a long session stays flat: one pack is sealed per step and its trees read
back, and the daemon's open descriptors must not grow with the number of steps (they used to,
one per step, until every snapshot and rewind failed with EMFILE). The oracle is the daemon's
own /proc/PID/fd, counted after a warm-up and again after many more steps."""

import json
import os

from envgit.snapshot.objects import MAX_OPEN_PACKS

MORE = 40


def _daemon_fds(proj) -> int:
    pid = json.loads(proj.envgit("daemon", "status", check=True).stdout)["pid"]
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_the_daemons_descriptors_stay_flat_over_many_steps(proj):
    for i in range(MAX_OPEN_PACKS + 10):               # past the packs kept open: the cache is full
        assert proj.run(f"echo {i} > f{i % 3}").returncode == 0
    full = _daemon_fds(proj)
    for i in range(MORE):                               # new content: a new pack each step
        assert proj.run(f"echo more {i} > f{i % 3}").returncode == 0
    grown = _daemon_fds(proj) - full
    assert grown <= 3, f"{grown} more descriptors after {MORE} more steps"
    steps = json.loads(proj.envgit("log", "--json", check=True).stdout)
    steps = steps.get("steps", steps) if isinstance(steps, dict) else steps
    assert not [s["id"] for s in steps if "snapshot-failed" in s["marks"]]
    assert proj.envgit("rewind", "-y", "1").returncode == 0
    assert (proj.root / "f0").read_text() == "0\n"
