"""Red team 15: the VM tier's network between steps.

A process a VM step starts keeps running after the step (the tier's point). The guest's only
network is its proxy port, each connection a channel to the gate; the promise is that every
request is judged and recorded on a step, as in the default tier (whose step's processes end
with it). Attack: a process left running by step 1 makes a request after step 1 has ended,
while no step runs. The oracle: the server's record, and the journal's steps. HELD when
written: the gate answers 407 (step 1's credentials closed with it), nothing reaches the server.
"""

import json
import os
import subprocess
import time

import pytest

from gatekit import hostport, netproject, servers
from harness import attacker  # noqa: F401

pytestmark = pytest.mark.skipif(subprocess.run(["sh", "-c", "command -v qemu-system-x86_64"],
                                               capture_output=True).returncode != 0,
                                reason="QEMU is not installed (dev/run test installs it)")

SHARED_CACHE = "/var/tmp/envgit-test-vm-cache"

LATE = r'''
import sys, time, urllib.request
time.sleep(25)                      # step 1 has ended by now
try:
    with urllib.request.urlopen(sys.argv[1], timeout=60) as r:
        res = f"{r.status}"
except Exception as e:
    res = repr(e)[:200]
open("/tmp/late.txt", "w").write(res)
'''


@pytest.fixture(scope="module")
def shared_image():
    old = os.environ.get("ENVGIT_VM_CACHE")
    os.environ["ENVGIT_VM_CACHE"] = SHARED_CACHE
    try:
        from envgit.vm import image
        image.ensure()
    finally:
        if old is None:
            os.environ.pop("ENVGIT_VM_CACHE")
        else:
            os.environ["ENVGIT_VM_CACHE"] = old
    subprocess.run(["chmod", "-R", "a+rX", SHARED_CACHE], check=True)
    return SHARED_CACHE


def test_vm_a_process_left_running_reaches_nothing_unrecorded_between_steps(attacker, shared_image):
    with servers() as (git, stub):
        netproject(attacker, git, stub, tail="backend: vm\nvm: { memory: 256MiB, cpus: 1 }\n")
        attacker.env["ENVGIT_VM_CACHE"] = shared_image
        (attacker.root / "late.py").write_text(LATE)
        attacker.own(attacker.root / "late.py")
        url = f"https://{hostport(stub, 'stub.example.test')}/late-between-steps"
        r = attacker.envgit("run", "--", "sh", "-c",
                            f"python3 late.py {url} </dev/null >/dev/null 2>&1 & echo started",
                            timeout=400)
        assert "started" in r.stdout, r.stdout + r.stderr
        time.sleep(60)                  # no step runs: the process's request is made now
        r = attacker.envgit("run", "--", "cat", "/tmp/late.txt", timeout=200)
        reached = [q for q in stub.requests if "late-between-steps" in q["path"]]
        recorded = []
        for n in (1, 2):
            s = attacker.envgit("show", str(n), "--json")
            if s.returncode == 0:
                recorded += [q for q in json.loads(s.stdout).get("requests") or []
                             if "late-between-steps" in json.dumps(q)]
        assert not reached or recorded, (
            f"a request made between VM steps reached the server unrecorded on any step: "
            f"guest saw {r.stdout!r}; server saw {reached}")
        assert not reached, (f"a request made while no step ran reached the server (recorded on "
                             f"{recorded}); guest saw {r.stdout!r}")
