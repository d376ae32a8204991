"""`envgit daemon stop` on a full disk (issue 32, case 5), on a real small tmpfs (root only):
a step that exited 0 and whose end the full disk held back in the daemon's memory keeps its
exit code through the stop. The daemon writes the held end into the space it set aside when it
started; the terminal of `envgit daemon stop` is told what could not go into the journal and
where it is kept; daemon.log has one line for the full disk, no traceback; once space is freed
the next daemon writes the end into the journal: the step is `done` with exit 0, not
`interrupted` with no exit code."""

import json
import os

import pytest

from faultlib import no_traceback, small_disk_fixture  # noqa: F401  (the fixture small_disk)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root "
                                "(an unprivileged user cannot make a filesystem that fills up)")


def test_a_held_end_survives_a_stop_on_a_full_disk(small_disk):
    proj = small_disk
    assert proj.run("echo 1 > a").returncode == 0
    r = no_traceback(proj.run("echo 2 > b; dd if=/dev/zero of=fill bs=64k 2>/dev/null; true"))
    assert r.returncode == 0 and "not recorded" in r.stderr, r.stderr       # the end is held
    log_path = proj.root / ".envgit" / "daemon.log"
    before = log_path.read_bytes()
    r = no_traceback(proj.envgit("daemon", "stop", timeout=60))
    said = [line for line in r.stderr.splitlines() if "full" in line]
    assert len(said) == 1 and said[0].startswith("envgit: ") and "step 2" in said[0], r.stderr
    logged = log_path.read_bytes()[len(before):].decode(errors="replace")
    assert "Traceback" not in logged, logged
    assert len([line for line in logged.splitlines() if "full" in line]) == 1, logged
    # nothing half-written beside the state files (a stat cache save that failed left one)
    assert not list((proj.root / ".envgit").glob("*.tmp")), list((proj.root / ".envgit").iterdir())
    # Space freed: the next daemon writes the held end before anything else.
    (proj.root / "fill").unlink()
    assert no_traceback(proj.run("echo 3 > c")).returncode == 0
    log = json.loads(proj.envgit("log", "--json", check=True).stdout)
    assert [(s["id"], s["status"], s["exit_code"]) for s in log] == [(1, "done", 0), (2, "done", 0), (3, "done", 0)]
    assert "interrupted" not in log[1]["marks"]
    assert proj.envgit("fsck").returncode == 0
