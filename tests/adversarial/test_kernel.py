"""Class 1: the host's kernel state through /proc and /sys, and host files only root can read.

As root, a step is host uid 0 with its capabilities dropped: sysctl files check the uid, not a
capability, so a writable /proc/sys/kernel/core_pattern is a host root escape. The oracles: a
probe inside that tries to open every kernel file for writing (never writing a byte) and lists
what opened; marker files a successful write would create; canaries in root-only host files.
"""

import os
import shutil
import uuid
from pathlib import Path

import pytest

from conftest import CANARY

pytestmark = pytest.mark.both_uids(
    "kernel files under /proc and /sys check the uid, not capabilities (a root step is host uid 0 "
    "with its capabilities dropped, a non-root user's step is in a user namespace), and the root-only "
    "scan masks files only for root: each must hold for both")

# Opens (O_WRONLY, writes nothing) every regular file under the roots it is given, not
# following symlinks and skipping the per-process directories of /proc; lists what opened.
PROBE = r'''
import os, sys
out, roots = sys.argv[1], sys.argv[2:]
opened = []
def probe(p):
    try:
        fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return
    os.close(fd)
    opened.append(p)
for root in roots:
    if os.path.isfile(root):
        probe(root)
        continue
    for d, dirs, files in os.walk(root):
        if d == "/proc":
            dirs[:] = [x for x in dirs if not x.isdigit() and x not in ("self", "thread-self")]
            files = [f for f in files if not f.isdigit()]
        for f in files:
            p = os.path.join(d, f)
            if not os.path.islink(p):
                probe(p)
with open(out, "w") as f:
    f.write("\n".join(opened))
'''

PY = "/usr/bin/python3"


def _probe(attacker, *roots, report="opened.txt"):
    (attacker.root / "probe.py").write_text(PROBE)
    attacker.own(attacker.root / "probe.py")
    r = attacker.envgit("run", "--", PY, "probe.py", report, *roots)
    assert r.returncode == 0, r.stderr
    return [ln for ln in (attacker.root / report).read_text().splitlines() if ln]


def test_nothing_in_proc_outside_the_steps_processes_opens_for_writing(attacker):
    opened = _probe(attacker, "/proc")
    assert opened == [], f"kernel files a step could write: {opened[:20]}"
    # The probe does find what is writable: the step's own process files stay so.
    assert _probe(attacker, "/proc/self/comm", report="own.txt") == ["/proc/self/comm"]


def test_sysctl_and_sysrq_writes_fail(attacker):
    host_core = Path("/proc/sys/kernel/core_pattern").read_text()
    r = attacker.run(
        'v=$(cat /proc/sys/kernel/core_pattern); echo "read:$v"\n'
        # the current value written back: a success changes nothing on the host but is the hole
        '(printf "%s\\n" "$v" > /proc/sys/kernel/core_pattern) && touch core-written\n'
        '(printf "%s\\n" "$(cat /proc/sys/kernel/hostname)" > /proc/sys/kernel/hostname) && touch sysctl-written\n'
        '(true > /proc/sysrq-trigger) && touch sysrq-opened\n'
        'echo made > ok')
    assert r.returncode == 0, r.stderr
    for marker in ("core-written", "sysctl-written", "sysrq-opened"):
        assert not (attacker.root / marker).exists(), marker
    assert "read:" + host_core.strip() in r.stdout         # reading a sysctl still works
    assert (attacker.root / "ok").read_text() == "made\n"
    assert Path("/proc/sys/kernel/core_pattern").read_text() == host_core


def test_leaky_proc_entries_are_masked(attacker):
    r = attacker.run("for f in keys timer_list sched_debug kcore kmsg slabinfo; do "
                     "[ -e /proc/$f ] && head -c 64 /proc/$f >/dev/null 2>&1 && echo LEAK:$f; done; "
                     "head -1 /proc/cpuinfo >/dev/null && grep -q '^Pid:' /proc/self/status && echo fine")
    assert r.returncode == 0, r.stderr
    assert "LEAK:" not in r.stdout
    assert "fine" in r.stdout


def test_sys_is_not_in_the_view(attacker):
    r = attacker.run("ls -A /sys 2>/dev/null | head -3; echo end")
    assert r.stdout.strip() == "end"
    assert _probe(attacker, "/sys") == []


def test_sys_brought_in_by_a_policy_stays_read_only(attacker):
    if not os.path.isdir("/sys/kernel"):
        pytest.skip("this machine has no /sys/kernel")
    attacker.write_policy("version: 1\nfilesystem:\n  allow_read: [/sys]\n  allow_write: [/sys/kernel]\n")
    opened = _probe(attacker, "/sys/kernel")
    assert opened == [], f"sysfs files a step could write: {opened[:20]}"
    r = attacker.run("cat /sys/kernel/ostype 2>/dev/null || ls /sys/kernel | head -1; "
                     "[ -d /sys/firmware ] && ls /sys/firmware >/dev/null 2>&1 && echo FIRMWARE-LISTED; echo end")
    assert r.stdout.strip().endswith("end") and len(r.stdout.strip().splitlines()) >= 2, r.stdout + r.stderr
    assert "FIRMWARE-LISTED" not in r.stdout


@pytest.fixture
def root_only_files():
    """A root-only file and directory in /etc holding the canary, and a public file beside
    them (the legitimate read); removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("making root-owned files in /etc needs root")
    tag = uuid.uuid4().hex[:8]
    secret = Path(f"/etc/envgit-test-canary-{tag}")
    secret_dir = Path(f"/etc/envgit-test-canary-dir-{tag}")
    public = Path(f"/etc/envgit-test-public-{tag}")
    try:
        secret.write_text(CANARY + "\n")
        os.chmod(secret, 0o600)
        secret_dir.mkdir(mode=0o700)
        (secret_dir / "inside").write_text(CANARY + "\n")
        os.chmod(secret_dir / "inside", 0o644)
        public.write_text("public-" + tag + "\n")
        os.chmod(public, 0o644)
        yield secret, secret_dir, public, tag
    finally:
        for p in (secret, public):
            p.unlink(missing_ok=True)
        shutil.rmtree(secret_dir, ignore_errors=True)


@pytest.mark.machine_wide("makes and removes root-only files in /etc: a step starting elsewhere meanwhile "
                          "masks them and can find one gone under it")
def test_root_only_host_files_stay_unreadable(attacker, root_only_files):
    secret, secret_dir, public, tag = root_only_files
    attacker.env["ENVGIT_ROOT_SCAN_MAX_AGE"] = "0"     # this daemon scans after the files exist
    r = attacker.run(f"cat {secret}; cat {secret_dir}/inside; ls {secret_dir}; "
                     f"cp {secret} stolen; cat {public}; grep -c '^root:' /etc/passwd")
    assert CANARY not in r.stdout + r.stderr
    assert not (attacker.root / "stolen").exists()
    assert f"public-{tag}" in r.stdout                  # the rest of /etc is still there
    assert r.stdout.strip().endswith("1")


def test_the_root_only_scan_never_runs_a_planted_find(attacker):
    marker = attacker.root / "planted-find-ran"
    r = attacker.run(f"mkdir -p .venv/bin && printf '#!/bin/sh\\ntouch {marker}\\n' > .venv/bin/find && "
                     "chmod +x .venv/bin/find")
    assert r.returncode == 0, r.stderr
    attacker.stop()                      # the next daemon starts with the venv first on PATH
    env = {"PATH": f"{attacker.root}/.venv/bin:{attacker.env['PATH']}", "ENVGIT_ROOT_SCAN_MAX_AGE": "0"}
    r = attacker.envgit("run", "--", "cat", "/etc/hostname", env=env)
    assert r.returncode == 0, r.stderr
    r = attacker.envgit("run", "--", "true", env=env)        # a second step: a rescan has run by now
    assert r.returncode == 0, r.stderr
    assert not marker.exists()


def test_a_policy_cannot_bring_in_the_hosts_proc(attacker):
    """allow_read: [/proc] would bind the host's /proc over the step's own: every host
    process (its environment, its root) in view. The step keeps its own /proc."""
    attacker.write_policy("version: 1\nfilesystem:\n  allow_read: [/proc, /proc/1]\n")
    me = os.getpid()
    r = attacker.run(f"[ -e /proc/{me} ] && echo HOST-PID-VISIBLE; ls /proc | grep -c '^[0-9]'; "
                     "(true > /proc/sys/kernel/hostname) && echo SYSCTL-WRITABLE; "
                     "cat /proc/1/comm")
    assert r.returncode == 0, r.stderr
    assert "HOST-PID-VISIBLE" not in r.stdout and "SYSCTL-WRITABLE" not in r.stdout
    assert int(r.stdout.split()[0]) < 10                  # the step's own few processes
    assert r.stdout.split()[-1] in ("envgit-step", "bwrap", "sh")   # pid 1: the sandbox's own (the reporter)
