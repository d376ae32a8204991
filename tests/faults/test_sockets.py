"""Hostile peers on the daemon's sockets (issue 11, item 10): a frame announcing a huge list,
frames that stop half-way, more idle connections than the daemon has descriptors, a client
that never speaks, a daemon that never answers. Each in a bounded loop; each asserts that a
real `envgit run` beside it still finishes promptly (or says why, one line, no traceback), that
the daemon's memory stays bounded and that it still idles out.

Both sockets: `.envgit/daemon.sock` (marshal frames, checked by daemon/frames.py before they
are decoded) and a session's inner socket (the one an agent's sandbox reaches; JSON, inner.py).
"""

import json
import os
import resource
import socket
import subprocess
import time

import pytest

from conftest import ENVGIT
from faultlib import no_traceback

# Short bounds for the daemon these tests start (the defaults are 10/30/120 s).
FAST = {"ENVGIT_FIRST_FRAME_TIMEOUT": "2", "ENVGIT_FRAME_TIMEOUT": "3", "ENVGIT_QUIET_TIMEOUT": "3"}


def start(proj, preexec=None, **env):
    proj.stop()
    r = subprocess.run([ENVGIT, "daemon", "status"], cwd=proj.root,
                       env={**proj.env, **FAST, **env}, capture_output=True, text=True, timeout=60,
                       preexec_fn=preexec)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["pid"]


def sock(proj):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(str(proj.root / ".envgit" / "daemon.sock"))
    return s


def rss_mb(pid) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def timed_run(proj, script="echo ok > out", limit=20):
    t = time.monotonic()
    r = no_traceback(proj.run(script, timeout=limit + 30))
    return r, time.monotonic() - t


def closed_or_error(s) -> bool:
    """The daemon answered with an error frame or closed the connection (in 10 s)."""
    try:
        data = s.recv(65536)
    except TimeoutError:
        return False
    except OSError:
        return True
    if not data:
        return True
    import marshal
    size = int.from_bytes(data[:4], "big")
    return "error" in marshal.loads(data[4:4 + size])


def test_a_frame_announcing_a_huge_list_is_refused_at_once_and_stalls_nothing(bare_proj):
    proj = bare_proj
    pid = start(proj)
    assert timed_run(proj)[0].returncode == 0
    bombs = [b"[\xff\xff\xff\x7f", b"(\xff\xff\xff\x7f", b"{[\xff\xff\xff\x7f", b"<\xff\xff\xff\x7f",
             b"s\xff\xff\xff\x7f", b"{" + b"[\x01\x00\x00\x00" * 150 + b"N", b"\xdb\xff\xff\xff\x7f",
             b"c" + b"\x00" * 40, b"{z\x01a" + b"l\xff\xff\xff\x7f"]
    for _round in range(3):                          # bounded: 27 frames in all
        t = time.monotonic()
        conns = []
        for b in bombs:
            s = sock(proj)
            s.sendall(len(b).to_bytes(4, "big") + b)
            conns.append(s)
        for s in conns:
            assert closed_or_error(s)
            s.close()
        assert time.monotonic() - t < 5, "the bombs were not refused promptly"
    r, took = timed_run(proj)
    assert r.returncode == 0 and took < 10
    st = json.loads(proj.envgit("daemon", "status", check=True).stdout)
    assert st["pid"] == pid and rss_mb(pid) < 300         # the same daemon, not grown


def test_half_frames_from_many_clients_do_not_grow_the_daemon(bare_proj):
    proj = bare_proj
    pid = start(proj)
    before = rss_mb(pid)
    conns = []
    for _ in range(20):                               # 20 clients, half of a 16 MiB frame each
        s = sock(proj)
        s.sendall((16 * 1024 * 1024).to_bytes(4, "big"))
        s.setblocking(False)
        sent = 0
        try:
            while sent < 8 * 1024 * 1024:
                sent += s.send(b"\x00" * 65536)
        except BlockingIOError:
            pass                                      # the daemon is not reading it: back-pressure
        conns.append(s)
    over = sock(proj)                                 # a frame over the cap is refused unread
    over.sendall((64 * 1024 * 1024).to_bytes(4, "big") + b"[")
    assert closed_or_error(over)
    r, took = timed_run(proj)                         # a step beside them is not held up
    assert r.returncode == 0 and took < 10, r.stderr
    assert rss_mb(pid) - before < 120, f"the daemon grew {rss_mb(pid) - before:.0f} MB"
    time.sleep(4)                                     # FRAME_S: the stalled ones are dropped
    for s in conns:
        s.setblocking(True)
        s.settimeout(5)
        assert closed_or_error(s)
        s.close()
    assert timed_run(proj)[0].returncode == 0


def _as_1024_fds():
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def test_idle_connections_past_the_fd_limit_do_not_hang_a_new_step(bare_proj):
    proj = bare_proj
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2400:
        pytest.skip(f"the test needs 2400 descriptors of its own (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2400), hard))
    pid = start(proj, preexec=_as_1024_fds)            # the daemon at a 1,024 limit, as reported
    conns = []
    try:
        for _ in range(1100):
            try:
                conns.append(sock(proj))
            except OSError:
                break                                 # the backlog is full: that is a refusal too
        r, took = timed_run(proj)                     # said why, or run, never a hang
        assert took < 20
        one_line = r.stderr.startswith("envgit: ") and len(r.stderr.strip().splitlines()) == 1
        assert r.returncode == 0 or one_line, r.stderr
        time.sleep(3)                                 # FIRST_FRAME_S: the silent ones are closed
        r, took = timed_run(proj)
        assert r.returncode == 0 and took < 10, r.stderr
        assert json.loads(proj.envgit("daemon", "status", check=True).stdout)["pid"] == pid
    finally:
        for s in conns:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_silent_client_does_not_keep_the_daemon_up(bare_proj):
    proj = bare_proj
    pid = start(proj, ENVGIT_DAEMON_IDLE="2")
    silent = sock(proj)                               # never says a word
    spoke = sock(proj)                                # says hello, then nothing
    spoke.sendall(_frame({"op": "hello", "rid": 1}))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}") and \
            "zombie" not in open(f"/proc/{pid}/status").read():
        time.sleep(0.2)
    assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read(), \
        "a silent client kept the daemon up"
    silent.close()
    spoke.close()
    assert timed_run(proj)[0].returncode == 0          # the next command starts a new one


def _frame(obj):
    import marshal
    body = marshal.dumps(obj, 4)
    return len(body).to_bytes(4, "big") + body


def test_a_daemon_that_never_answers_is_said_with_a_timeout(bare_proj, tmp_path):
    """A socket that accepts and never answers (a wedged daemon): the client gives up after
    its answer timeout with one `envgit:` line, not a hang or a traceback."""
    proj = bare_proj
    proj.stop()
    path = proj.root / ".envgit" / "daemon.sock"
    path.unlink(missing_ok=True)
    mute = socket.socket(socket.AF_UNIX)
    mute.bind(str(path))
    mute.listen(64)
    lock = open(proj.root / ".envgit" / "daemon.lock", "a+")
    import fcntl
    fcntl.flock(lock, fcntl.LOCK_EX)                  # no daemon may start and take the path over
    try:
        for argv in (["run", "--", "true"], ["daemon", "status"], ["gc"]):
            t = time.monotonic()
            r = no_traceback(proj.envgit(*argv, env={"ENVGIT_DAEMON_ANSWER_TIMEOUT": "2"}, timeout=30))
            assert time.monotonic() - t < 15
            said = [line for line in r.stderr.splitlines() if line.startswith("envgit: ")]
            assert r.returncode != 0 and len(said) == 1 and "did not answer" in said[0], r.stderr
            assert r.returncode == {"run": 125, "daemon": 1}.get(argv[0], 3)
    finally:
        mute.close()
        lock.close()
        path.unlink(missing_ok=True)
    assert timed_run(proj)[0].returncode == 0


def test_a_command_run_while_the_daemon_starts_waits_for_its_start_only(bare_proj, tmp_path):
    """A daemon holds the project's lock from its first instant but binds its socket only after
    opening the journal and closing what a killed one left open. A command run in that window
    (here held open with ENVGIT_FAULT=daemon-locked:pause) connects as soon as the socket is
    there; it once took the held lock for a daemon still stopping and waited 60 s."""
    proj = bare_proj
    proj.stop()
    held = {**proj.env, "ENVGIT_FAULT": "daemon-locked:pause", "ENVGIT_FAULT_DIR": str(tmp_path)}
    starter = subprocess.Popen([ENVGIT, "daemon", "status"], cwd=proj.root, env=held,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    flag = tmp_path / "daemon-locked.paused"
    deadline = time.monotonic() + 30
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert flag.exists(), "the daemon never reached its lock"
    t = time.monotonic()
    waiting = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", "echo started > s"], cwd=proj.root,
                               env=proj.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert waiting.poll() is None           # it waits for the start: it does not start its own
    flag.unlink()
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0 and (proj.root / "s").read_text() == "started\n", err
    assert time.monotonic() - t < 15, f"waited {time.monotonic() - t:.1f} s for a daemon's start"
    assert "Traceback" not in err
    _, started_err = starter.communicate(timeout=30)
    assert starter.returncode == 0 and "Traceback" not in started_err, started_err


def _inner_socket(proj):
    from envgit.daemon.client import connect
    from envgit.paths import Project
    conn = connect(Project(str(proj.root)), start=False)
    spec = conn.request({"op": "spec", "argv": ["true"], "cwd": str(proj.root), "env": {},
                         "session": "agent-sockets", "inner": True})
    return conn, spec["bwrap"][spec["bwrap"].index("/run/envgit/control.sock") - 1]


def test_the_inner_socket_half_frames_and_bombs_stall_nothing(bare_proj):
    proj = bare_proj
    pid = start(proj)
    assert timed_run(proj)[0].returncode == 0
    conn, path = _inner_socket(proj)
    before = rss_mb(pid)
    conns = []
    for i in range(40):                               # bounded: 40 hostile peers at once
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(path)
        if i % 4 == 0:
            s.sendall((0x7FFFFFFF).to_bytes(4, "big"))                    # a huge frame announced
        elif i % 4 == 1:
            s.sendall((4 * 1024 * 1024).to_bytes(4, "big") + b"[" * (2 * 1024 * 1024))   # half a frame
        elif i % 4 == 2:
            body = b"[" * 100000 + b"]" * 100000                          # deep nesting
            s.sendall(len(body).to_bytes(4, "big") + body)
        conns.append(s)                               # i % 4 == 3: silent
    r, took = timed_run(proj)
    assert r.returncode == 0 and took < 10, r.stderr
    assert rss_mb(pid) - before < 150
    for s in conns:
        s.close()
    assert conn.request({"op": "status"})["pid"] == pid
    conn.close()
