"""A root-only file in /etc (a lock or temporary file of useradd's, passwd's) that goes between
the daemon's listing of what to mask and bwrap's mount over it: bwrap cannot make the missing
mount point in the read-only /etc, and the step failed (exit 125) before its command ran; a
soak of real steps met it. The client now starts the sandbox once more without that mask, and
only that: never without another bind, and never with the file back (then it fails closed)."""

import os
import shutil
import uuid
from pathlib import Path

import pytest

from conftest import CANARY
from envgit.sandbox.launch import cover_paths, without_gone_masks

BWRAP = shutil.which("bwrap", path="/usr/bin:/bin")


def test_only_the_kernel_placeholders_over_gone_paths_are_left_out(tmp_path):
    state = tmp_path / "state"
    (state / "sandbox").mkdir(parents=True)
    hidden, hidden_dir = cover_paths(str(state))
    Path(hidden).touch()
    os.mkdir(hidden_dir)
    other = tmp_path / "protected"             # a path bound over itself, mode 000 for a moment
    other.mkdir()
    for p in (hidden, hidden_dir, other):
        os.chmod(p, 0)
    gone, here = str(tmp_path / "gone"), str(tmp_path)
    argv = ["bwrap", "--ro-bind", hidden, gone, "--ro-bind", hidden_dir, here,
            "--ro-bind", str(other), str(tmp_path / "also-gone"), "--", "true"]
    out, dropped = without_gone_masks(argv, str(state))
    assert dropped == [gone]
    assert out == ["bwrap", "--ro-bind", hidden_dir, here,
                   "--ro-bind", str(other), str(tmp_path / "also-gone"), "--", "true"]
    # nothing of the kernel's gone: no second start
    assert without_gone_masks(argv[:1] + argv[4:], str(state)) is None


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
        wrapper.write_text(f"#!/bin/sh\nrm -f {gone}\nexec {BWRAP} \"$@\"\n")
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


@pytest.mark.machine_wide("moves a root-only file in /etc away and back: a step starting elsewhere meanwhile "
                          "masks it and can find it gone under it")
def test_a_masked_file_back_before_the_second_start_fails_closed(proj, tmp_path):
    """The file is gone when the first sandbox is built and back for the second: the second
    start left its mask out, so it must not release the command (exit 125, nothing run)."""
    assert os.geteuid() == 0, "masks of root-only host files are made for steps run as root"
    secret = Path(f"/etc/envgit-test-back-{uuid.uuid4().hex[:8]}")
    away, first = Path(f"{secret}.away"), tmp_path / "first-start"
    try:
        secret.write_text(CANARY + "\n")
        secret.chmod(0o600)
        env = {"ENVGIT_ROOT_SCAN_MAX_AGE": "0"}
        r = proj.envgit("run", "--", "sh", "-c", f"cat {secret}; true", env=env)      # masked now
        assert r.returncode == 0 and CANARY not in r.stdout + r.stderr, r.stdout + r.stderr
        wrapper = tmp_path / "bwrap-away-and-back"
        wrapper.write_text(f"#!/bin/sh\nif [ ! -e {first} ]; then touch {first}; mv {secret} {away}; "
                           f"else mv {away} {secret}; fi\nexec {BWRAP} \"$@\"\n")
        wrapper.chmod(0o755)
        ran = proj.root / "ran"
        r = proj.envgit("run", "--", "sh", "-c", f"echo x >> {ran}; cat {secret}",
                        env={**env, "ENVGIT_BWRAP": str(wrapper)})
        assert "starting it again" in r.stderr, r.stderr
        assert CANARY not in r.stdout + r.stderr, r.stdout + r.stderr          # the oracle
        assert r.returncode == 125 and "came back" in r.stderr, (r.returncode, r.stderr)
        assert not ran.exists()                                                 # never released
    finally:
        secret.unlink(missing_ok=True)
        away.unlink(missing_ok=True)
