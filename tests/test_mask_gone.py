"""A root-only file in /etc (a lock or temporary file of useradd's, passwd's) that goes between
the daemon's listing of what to mask and bwrap's mount over it: bwrap cannot make the missing
mount point in the read-only /etc, and the step failed (exit 125) before its command ran; a
soak of real steps met it. The client now starts the sandbox once more without that mask."""

import os
import shutil
import uuid
from pathlib import Path

import pytest

from conftest import CANARY


@pytest.mark.machine_wide("makes and removes a root-only file in /etc: a step starting elsewhere meanwhile "
                          "masks it and can find it gone under it")
def test_a_masked_file_removed_while_the_sandbox_is_built_does_not_fail_the_step(proj, tmp_path):
    assert os.geteuid() == 0, "masks of root-only host files are made for steps run as root"
    tag = uuid.uuid4().hex[:8]
    gone, kept = Path(f"/etc/envgit-test-going-{tag}"), Path(f"/etc/envgit-test-canary-{tag}")
    try:
        for p in (gone, kept):
            p.write_text(CANARY + "\n")
            p.chmod(0o600)
        env = {"ENVGIT_ROOT_SCAN_MAX_AGE": "0"}
        r = proj.envgit("run", "--", "sh", "-c", f"cat {gone} {kept}; true", env=env)   # both masked now
        assert r.returncode == 0 and CANARY not in r.stdout + r.stderr, r.stdout + r.stderr
        # Made certain: the bwrap the client runs (ENVGIT_BWRAP) removes the file just before it
        # mounts over it, as another program could in those milliseconds.
        wrapper = tmp_path / "bwrap-removing"
        wrapper.write_text(f"#!/bin/sh\nrm -f {gone}\nexec {shutil.which('bwrap', path='/usr/bin:/bin')} \"$@\"\n")
        wrapper.chmod(0o755)
        ran = proj.root / "ran"
        r = proj.envgit("run", "--", "sh", "-c", f"echo x >> {ran}; cat {kept}; cat /etc/hostname",
                        env={**env, "ENVGIT_BWRAP": str(wrapper)})
        assert r.returncode == 0, r.stderr
        assert "starting it again" in r.stderr, r.stderr
        assert ran.read_text() == "x\n"                     # the command ran, once
        assert CANARY not in r.stdout + r.stderr            # the other root-only file stays masked
        assert r.stdout.strip() == Path("/etc/hostname").read_text().strip()
    finally:
        for p in (gone, kept):
            p.unlink(missing_ok=True)
