"""A step asked for through the inner socket is ended when its caller goes away (inner.py's
watch on the caller's connection). Steps of the same project hold a thousand and more
connections to their gate (the proxy socket inside each sandbox: every one is a descriptor of
the daemon's; the gate keeps at most MAX_CONNECTIONS_PER_SANDBOX from one sandbox, so three
steps flood at once), so the daemon's next descriptors are past select()'s FD_SETSIZE (1024): an agent's
next tool call must still run to its end, not be taken for a caller that went away and killed
at once. The oracle: the marker the inner step writes after its sleep."""

import array
import os
import socket
import subprocess
import time

import pytest

from conftest import ENVGIT
from envgit.daemon.client import connect
from envgit.daemon.inner_shim import frame, reply
from envgit.paths import Project

pytestmark = pytest.mark.both_uids("the daemon's descriptors are counted against the step's uid's limits")

HOLD = 1200
FLOODS = 3

FLOOD = f"""
import os, resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for _ in range({HOLD}):
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/envgit/proxy.sock")
    held.append(s)
open("held-" + sys.argv[1], "w").close()
# and one more every few ms: a descriptor the daemon frees meanwhile is taken again at once
while not os.path.exists("done") and len(held) < 4 * {HOLD}:
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/envgit/proxy.sock")
    held.append(s)
    time.sleep(0.005)
while not os.path.exists("done"):
    time.sleep(0.1)
"""


def _fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_an_inner_step_runs_on_while_the_daemon_holds_many_descriptors(attacker):
    attacker.write_policy('version: 1\nnetwork:\n  allow: ["example.invalid:443"]\n')
    attacker.run("true")
    conn = connect(Project(str(attacker.root)), start=False)
    pid = conn.request({"op": "status"})["pid"]
    spec = conn.request({"op": "spec", "argv": ["true"], "cwd": str(attacker.root), "env": {},
                         "session": "agent-fds", "inner": True})
    path = spec["bwrap"][spec["bwrap"].index("/run/envgit/control.sock") - 1]
    floods = []
    for i in range(FLOODS):
        argv = [ENVGIT, "run", "--", "python3", "-c", FLOOD, str(i)]
        if attacker.user:
            argv = ["runuser", "-u", attacker.user, "--", *argv]
        floods.append(subprocess.Popen(argv, cwd=attacker.root, env=attacker.env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True))
    try:
        end = time.monotonic() + 60
        while not all((attacker.root / f"held-{i}").exists() for i in range(FLOODS)):
            assert time.monotonic() < end and all(f.poll() is None for f in floods), [f.poll() for f in floods]
            time.sleep(0.1)
        deadline = time.monotonic() + 20
        while _fds(pid) <= 1100 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _fds(pid) > 1100, _fds(pid)
        # what the daemon freed since is taken by connections that say nothing yet (another
        # tool call's, starting): the tool call below gets a descriptor past the flood
        idle = []
        for _ in range(8):
            idle.append(socket.socket(socket.AF_UNIX))
            idle[-1].connect(path)
        time.sleep(0.5)
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(60)
        s.connect(path)
        null = os.open("/dev/null", os.O_RDWR)
        try:
            body = frame({"op": "run", "argv": ["sh", "-c", "sleep 1; echo ran > inner-ran"],
                          "cwd": str(attacker.root), "env": {}})
            s.sendmsg([body[:1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null] * 3))])
            s.sendall(body[1:])
            got = reply(s)
        finally:
            os.close(null)
            for c in (s, *idle):
                c.close()
        assert got.get("exit_code") == 0 and got.get("signal") is None, got
        assert (attacker.root / "inner-ran").exists()
    finally:
        (attacker.root / "done").write_text("")
        attacker.own(attacker.root / "done")
        for flood in floods:
            try:
                flood.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                flood.kill()
                flood.communicate()
