"""A step asked for through the inner socket is ended when its caller goes away (inner.py).
A caller that shuts its sending side after its request (as request-then-reply clients do)
still gets its step run to its end and its reply; when it then goes away (killed), its step
is ended, not left running. A caller that goes away at once, while the step's sandbox is still
starting, has its step ended too: bwrap killed in its first milliseconds left the sandbox
running (its --die-with-parent not yet armed), the command writing on after its step was
recorded as ended. Oracles: the reply and the markers the steps write after their sleeps."""

import array
import os
import socket
import time

import pytest

from envgit.daemon.client import connect
from envgit.daemon.inner_shim import frame, reply
from envgit.paths import Project

pytestmark = pytest.mark.both_uids("the step runs as the caller's uid")


def _inner_path(attacker):
    attacker.run("true")
    conn = connect(Project(str(attacker.root)), start=False)
    spec = conn.request({"op": "spec", "argv": ["true"], "cwd": str(attacker.root), "env": {},
                         "session": "agent-hc", "inner": True})
    return spec["bwrap"][spec["bwrap"].index("/run/envgit/control.sock") - 1]


def _ask(path, attacker, script, half_close=True):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(60)
    s.connect(path)
    null = os.open("/dev/null", os.O_RDWR)
    try:
        body = frame({"op": "run", "argv": ["sh", "-c", script], "cwd": str(attacker.root), "env": {}})
        s.sendmsg([body[:1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null] * 3))])
        s.sendall(body[1:])
        if half_close:
            s.shutdown(socket.SHUT_WR)
    finally:
        os.close(null)
    return s


def test_a_half_closed_caller_gets_its_step_run_to_the_end(attacker):
    path = _inner_path(attacker)
    s = _ask(path, attacker, "sleep 1; echo ran > ran")
    try:
        got = reply(s)
    finally:
        s.close()
    assert got.get("exit_code") == 0 and got.get("signal") is None, got
    assert (attacker.root / "ran").exists()


def test_a_half_closed_caller_that_goes_away_has_its_step_ended(attacker):
    path = _inner_path(attacker)
    s = _ask(path, attacker, "sleep 3; echo late > late")
    time.sleep(1)
    s.close()
    time.sleep(5)
    assert not (attacker.root / "late").exists()


def test_a_caller_that_goes_away_at_once_has_its_step_ended(attacker):
    path = _inner_path(attacker)
    for i in range(5):                  # the window is a few milliseconds of bwrap's start
        _ask(path, attacker, f"sleep 2; echo late > late{i}", half_close=False).close()
        time.sleep(0.3)
    time.sleep(4)
    late = sorted(p.name for p in attacker.root.glob("late*"))
    assert not late, f"steps ran on after their caller went away: {late}"
