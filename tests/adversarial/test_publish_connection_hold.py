"""A step that publishes a port decides what its socket file answers. Its own server there
accepts every connection the daemon joins to it and never answers, while connections keep
arriving at the host's port (any local program may open them): each joined one holds two of
the daemon's descriptors, which every step and client of the project share, so how many a
step's ports may hold at once is bounded and `envgit run` is still served. Oracles: the
daemon's descriptors (/proc/PID/fd) and a later step's marker."""

import os
import socket
import subprocess
import time

import pytest

from conftest import ENVGIT
from envgit.daemon.client import connect
from envgit.paths import Project
from kit.ports import free_port as _free_port

pytestmark = pytest.mark.both_uids("the step's server and the socket file are the step's uid's")

OPENED = 2000

HOLD = """
import os, resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
path = sys.argv[1]
while not os.path.exists(path):
    time.sleep(0.05)
os.unlink(path)
srv = socket.socket(socket.AF_UNIX)
srv.bind(path)
srv.listen(4096)
open("ready", "w").close()
srv.settimeout(0.2)
held = []
while not os.path.exists("done"):
    try:
        held.append(srv.accept()[0])
    except (TimeoutError, OSError):
        pass
"""


def _fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def _start(attacker, port, argv):
    argv = [ENVGIT, "run", "-p", str(port), "--", *argv]
    if attacker.user:
        argv = ["runuser", "-u", attacker.user, "--", *argv]
    return subprocess.Popen(argv, cwd=attacker.root, env=attacker.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(attacker, p, name):
    end = time.monotonic() + 60
    while not (attacker.root / name).exists():
        assert time.monotonic() < end and p.poll() is None, (name, p.poll())
        time.sleep(0.05)


def _finish(attacker, p):
    (attacker.root / "done").write_text("")
    attacker.own(attacker.root / "done")
    try:
        p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()


def test_a_step_holding_every_joined_connection_holds_few_of_the_daemons_descriptors(attacker):
    attacker.run("true")
    pid = connect(Project(str(attacker.root)), start=False).request({"op": "status"})["pid"]
    port = _free_port()
    p = _start(attacker, port, ["python3", "-c", HOLD, f"/run/envgit/publish/{port}.sock"])
    clients = []
    try:
        _wait_for(attacker, p, "ready")
        before = _fds(pid)
        for _ in range(OPENED):
            try:
                c = socket.create_connection(("127.0.0.1", port), timeout=5)
                c.sendall(b"GET / HTTP/1.0\r\n\r\n")
                clients.append(c)
            except OSError:
                pass
        time.sleep(2)
        grown = _fds(pid) - before
        t0 = time.monotonic()
        r = attacker.run("echo ok > served")
        took = time.monotonic() - t0
    finally:
        for c in clients:
            c.close()
        _finish(attacker, p)
    assert grown < 1000, f"{OPENED} connections to the step's port took {grown} of the daemon's descriptors"
    assert r.returncode == 0 and (attacker.root / "served").exists(), r.stderr
    assert took < 30, took
