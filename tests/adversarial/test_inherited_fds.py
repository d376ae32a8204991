"""The caller's open file descriptors must not reach a step: `exec 7</secret 8>>/outside;
envgit run -- sh -c 'cat <&7; echo x >&8'` read a file the policy denies and wrote outside
every writable path. The launcher hands bwrap fds 0, 1, 2 and its own (sandbox/launch.py).

Oracle: a canary in the file behind fd 7, a marker line in the file behind fd 8, and the
step's own listing of /proc/self/fd."""

import os
import subprocess

import pytest

from conftest import CANARY, ENVGIT


@pytest.mark.both_uids("the caller's descriptors are opened as the person (runuser for a non-root one), and bwrap "
                       "without root takes its user-namespace path, with descriptors of its own: the step must see "
                       "only 0-2 for both")
def test_inherited_fds_do_not_reach_the_step(attacker, tmp_path):
    a = attacker
    secret, outside = tmp_path / "fdsecret", tmp_path / "outside"
    secret.write_text(CANARY + "\n")
    outside.write_text("")
    os.chmod(tmp_path, 0o755)
    for p in (secret, outside):
        a.own(p)
    r_pipe, w_pipe = os.pipe()                   # the harness's own extra pipe, inheritable
    os.set_inheritable(w_pipe, True)
    try:
        script = (f"exec 7<{secret} 8>>{outside}; exec {ENVGIT} run -- sh -c "
                  "'ls /proc/self/fd; cat <&7; (echo FROM_STEP >&8); (echo FROM_STEP >&" + str(w_pipe) + ")'")
        r = subprocess.run(a._argv(["bash", "-c", script]), cwd=a.root, env=a.env, capture_output=True,
                           text=True, timeout=120, pass_fds=(w_pipe,))
    finally:
        os.close(w_pipe)
    leaked = os.read(r_pipe, 4096) if _readable(r_pipe) else b""
    os.close(r_pipe)
    assert CANARY not in r.stdout + r.stderr
    assert "FROM_STEP" not in outside.read_text()
    assert b"FROM_STEP" not in leaked
    # 0 1 2, and the listing's own directory fd (3)
    assert r.stdout.split() == ["0", "1", "2", "3"], (r.stdout, r.stderr)
    assert "Bad file descriptor" in r.stderr      # the step tried fds 7 and 8: not open


def test_stdio_still_reaches_the_step(attacker):
    r = attacker.envgit("run", "--", "sh", "-c", "read x; echo got:$x; echo err >&2", input="hello\n")
    assert r.returncode == 0 and "got:hello" in r.stdout and "err" in r.stderr


def _readable(fd):
    import select
    return bool(select.select([fd], [], [], 0)[0])


def test_a_step_the_daemon_starts_gets_only_its_three_fds(proj):
    """An agent's Bash call through the inner socket: the daemon starts the step on the three
    fds the shim sent (SCM_RIGHTS); none of the daemon's own (journal, sockets, watches) nor the
    outer sandbox's extra fd reaches it."""
    import shutil
    from pathlib import Path

    from envgit.daemon.client import connect
    from envgit.paths import Project
    from envgit.sandbox.seccomp import program
    shim = Path(__file__).resolve().parents[2] / "src" / "envgit" / "daemon" / "inner_shim.py"
    proj.run("true")
    conn = connect(Project(str(proj.root)))
    helper = conn.request({"op": "begin", "argv": ["agent"], "cwd": str(proj.root), "env": proj.env,
                           "record_only": True, "session": "fds-s1"})
    shutil.copy(shim, proj.root / "shim.py")
    spec = conn.request({"op": "spec", "argv": ["/usr/bin/python3", str(proj.root / "shim.py"), "sh", "-c",
                                                "ls /proc/self/fd"],
                         "cwd": str(proj.root), "env": proj.env, "session": "fds-s1", "inner": True,
                         "step": helper["step"]})
    assert "bwrap" in spec, spec
    fd = os.memfd_create("s", 0)
    os.write(fd, program())
    os.lseek(fd, 0, 0)
    extra_r, extra_w = os.pipe()
    try:
        r = subprocess.run([spec["bwrap"][0], "--seccomp", str(fd), *spec["bwrap"][1:]], env=spec["env"],
                           pass_fds=[fd, extra_w], capture_output=True, text=True, timeout=60)
    finally:
        os.close(extra_r), os.close(extra_w), os.close(fd)
    conn.request({"op": "end", "step": helper["step"], "exit_code": 0})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["0", "1", "2", "3"], (r.stdout, r.stderr)
