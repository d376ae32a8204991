"""A step floods the gate's socket (/run/envgit/proxy.sock, its only way out) with connections
and holds them: each held connection costs the daemon descriptors that every step and client of
the project share, so unbounded they end every other step's start. The gate keeps at most
MAX_CONNECTIONS_PER_SANDBOX from one sandbox; the oracle is another step starting promptly
while the flood holds, and the flooding step seeing the connections past the cap closed."""

import subprocess
import time

from conftest import ENVGIT
from envgit.proxy.gate import MAX_CONNECTIONS_PER_SANDBOX

FLOOD = MAX_CONNECTIONS_PER_SANDBOX + 200
SCRIPT = f"""
import socket, time
held = []
for i in range({FLOOD}):
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/envgit/proxy.sock")
    held.append(s)
def count_closed():
    closed = 0
    for s in held:
        s.settimeout(0.001)
        try:
            if s.recv(1) == b"":
                closed += 1
        except socket.timeout:
            pass
        except OSError:
            closed += 1
    return closed
# the gate closes what is past its cap as it gets to it: on a loaded machine that takes a
# while, so count until they are all closed or 30 s have passed
deadline = time.monotonic() + 30
while (closed := count_closed()) < {FLOOD - MAX_CONNECTIONS_PER_SANDBOX} and time.monotonic() < deadline:
    time.sleep(0.2)
print("closed", closed, flush=True)
open("flood-ready", "w").write("x")
for _ in range(300):
    try:
        open("flood-done").close()
        break
    except OSError:
        time.sleep(0.1)
"""


def test_a_step_flooding_the_gate_leaves_other_steps_their_start(attacker):
    attacker.write_policy('version: 1\nnetwork:\n  allow: ["example.com"]\n')
    (attacker.root / "flood.py").write_text(SCRIPT)
    attacker.own(attacker.root / "flood.py")
    argv = [ENVGIT, "run", "--", "python3", "flood.py"]
    if attacker.user:
        argv = ["runuser", "-u", attacker.user, "--", *argv]
    p = subprocess.Popen(argv, cwd=attacker.root, env=attacker.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (attacker.root / "flood-ready").exists():
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.1)
        t0 = time.monotonic()
        r = attacker.run("echo other-step")
        took = time.monotonic() - t0
        assert r.returncode == 0 and "other-step" in r.stdout, r.stderr
        assert took < 10, took
    finally:
        (attacker.root / "flood-done").write_text("")
        out, err = p.communicate(timeout=60)
    closed = int(out.split("closed", 1)[1].split()[0])
    assert closed >= FLOOD - MAX_CONNECTIONS_PER_SANDBOX, (out, err)
