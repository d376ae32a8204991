"""As root, a step reads the host files only root can read unless they are masked
(sandbox/kernel.py). The mask came from a scan cached for 300 s and shared by every project, so
a 0600 file made in /etc after the scan was readable by the next step. It is now current at
every step's start: the hand-edited trees are watched, the package-managed rest is rescanned
when the package database changes.

Oracle: canaries in root-only files made (or made root-only) between two steps of one daemon,
with the default scan age; a public file made at the same time is still read."""

import os
import shutil
import uuid
from pathlib import Path

import pytest

from conftest import CANARY

pytestmark = pytest.mark.both_uids(
    "the root-only scan masks what only root could read, for a root step only; a non-root user's step "
    "is kept out by DAC: the canaries must stay unreadable for both")


@pytest.fixture
def late_files():
    tag = uuid.uuid4().hex[:8]
    made = {
        "etc_secret": Path(f"/etc/envgit-late-{tag}"),
        "opt_dir": Path(f"/opt/envgit-late-{tag}"),
        "etc_public": Path(f"/etc/envgit-late-public-{tag}"),
        "etc_chmod": Path(f"/etc/envgit-late-chmod-{tag}"),
    }
    made["etc_chmod"].write_text("public-before\n")     # readable when the first step starts
    os.chmod(made["etc_chmod"], 0o644)
    try:
        yield made, tag
    finally:
        for k, p in made.items():
            if k == "opt_dir":
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


@pytest.mark.machine_wide("makes and removes root-only files in /etc and /opt: a step starting elsewhere "
                          "meanwhile masks them and can find one gone under it")
def test_root_only_files_made_after_a_step_are_masked_in_the_next(attacker, late_files):
    if os.geteuid() != 0:
        pytest.skip("creating root-only files in /etc and /opt needs root")
    made, tag = late_files
    assert attacker.run("true").returncode == 0         # the daemon and its scan exist now
    fd = os.open(made["etc_secret"], os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
    os.write(fd, (CANARY + "\n").encode())
    os.close(fd)
    made["opt_dir"].mkdir(mode=0o700)
    (made["opt_dir"] / "inside").write_text(CANARY + "\n")
    os.chmod(made["opt_dir"] / "inside", 0o644)
    made["etc_public"].write_text(f"public-{tag}\n")
    os.chmod(made["etc_public"], 0o644)
    made["etc_chmod"].write_text(CANARY + "\n")          # a secret put in, then the mode taken away:
    os.chmod(made["etc_chmod"], 0o600)                   # no new name in /etc, only a chmod
    r = attacker.run(f"cat {made['etc_secret']}; cat {made['opt_dir']}/inside; ls {made['opt_dir']}; "
                     f"cat {made['etc_chmod']}; cat {made['etc_public']}")
    assert CANARY not in r.stdout + r.stderr
    assert f"public-{tag}" in r.stdout                   # what others may read is still there
    # and back: once readable by others again, the next step reads it
    os.chmod(made["etc_chmod"], 0o644)
    r = attacker.run(f"cat {made['etc_chmod']}")
    assert CANARY in r.stdout, r.stderr
