"""The step's resolver (sandbox/resolver.py) attacked from inside the step: a flood, huge and
malformed queries, names built to be terminal escapes, TCP, and queries aimed at the host's
own nameservers. It must keep answering "does not exist" (and nothing else), never forward a
query, never put a raw escape on a person's terminal, and never stop envgit run or the daemon.

Oracles: a canary listener on the host's 127.0.0.1:53 (a real resolver's place) that must hear
nothing, the step's own lookups after the attack, and envgit answering afterwards."""

import json
import os
import socket
import threading

import pytest

from conftest import CANARY

# Sent from inside the step: every kind of bad datagram, as fast as it can, then one ordinary
# lookup, whose outcome it prints.
ATTACK = r'''
import os, socket, struct, sys, time, random
def q(name_labels, qd=1, flags=0x0100, qtype=1):
    body = b"".join(bytes([len(l)]) + l for l in name_labels) + b"\0" + struct.pack(">HH", qtype, 1)
    return struct.pack(">HHHHHH", random.randrange(65536), flags, qd, 0, 0, 0) + body
bad = [b"", b"\x00", b"\x12\x34", b"\xff" * 11, b"\x00" * 12,
       q([b"resp", b"invalid"], flags=0x8180),                  # a response: never answered
       q([b"zero", b"invalid"], qd=0), q([b"two", b"invalid"], qd=2),
       q([b"a" * 63] * 5),                                       # past 255 bytes
       struct.pack(">HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c\x00\x01\x00\x01",   # pointer loop
       struct.pack(">HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\x3fshort",                   # label past the end
       q([b"notify", b"invalid"], flags=0x2000),                 # another opcode
       os.urandom(65507),                                        # the largest datagram
       q([b"%s" % sys.argv[1].encode(), b"invalid"]),
       q([b"\x1b]52;c;" + sys.argv[1].encode() + b"\x07", b"\x1b[2J\x1b[H", b"test"]),
       q([b"\x1b]0;owned\x07", b"invalid"])]
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(8)]
for s in socks:
    s.setblocking(False)
sent, t0 = 0, time.monotonic()
while time.monotonic() - t0 < 3:
    for s in socks:
        for d in bad + [q([b"flood%d" % (sent % 5000), b"invalid"])]:
            try:
                s.sendto(d, ("127.0.0.1", 53)); sent += 1
            except (BlockingIOError, OSError):
                pass
# the host's own nameservers (from its resolv.conf, given as arguments): unreachable from here
for ns in sys.argv[2:]:
    try:
        socket.socket(socket.AF_INET6 if ":" in ns else socket.AF_INET, socket.SOCK_DGRAM).sendto(
            q([sys.argv[1].encode(), b"invalid"]), (ns, 53))
    except OSError:
        pass
# TCP to the resolver's address: nothing listens (refused at once)
try:
    socket.create_connection(("127.0.0.1", 53), timeout=2).sendall(b"\x00\x20" + q([b"tcp", b"invalid"]))
    print("tcp=open")
except OSError as e:
    print("tcp=closed")
# an ordinary lookup after all that: answered, "does not exist", at once
time.sleep(0.5)
t = time.monotonic()
try:
    socket.getaddrinfo("after-the-flood.invalid", 80)
    print("after=resolved")
except socket.gaierror as e:
    print("after=" + ("NONAME" if e.errno == socket.EAI_NONAME else "errno%d" % e.errno),
          "fast" if time.monotonic() - t < 3 else "slow")
# a raw query: the answer carries no record at all, whatever is asked
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.settimeout(3)
c.sendto(q([b"www", b"example", b"com"], qtype=255), ("127.0.0.1", 53))
r = c.recv(4096)
print("answer rcode=%d an=%d ns=%d ar=%d" % (r[3] & 15, *struct.unpack(">HHH", r[6:12])))
print("sent", sent)
'''


# The canary listens on the host's one 127.0.0.1:53: two of these tests at once (side by side)
# would find it taken and skip, so they share one xdist worker.
pytestmark = pytest.mark.xdist_group("host-port-53")

class Canary:
    """A UDP and TCP listener on the host's 127.0.0.1:53: where a real local resolver sits.
    It records whatever reaches it."""

    def __init__(self):
        self.heard = []
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.udp.bind(("127.0.0.1", 53))
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind(("127.0.0.1", 53))
        self.tcp.listen(8)
        self.udp.settimeout(0.2)
        self.tcp.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                self.heard.append(self.udp.recv(65535))
            except OSError:
                pass
            try:
                conn, _ = self.tcp.accept()
                conn.settimeout(1)
                self.heard.append(conn.recv(65535))
                conn.close()
            except OSError:
                pass

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.udp.close()
        self.tcp.close()


@pytest.fixture
def canary():
    try:
        c = Canary()
    except OSError as e:
        pytest.skip(f"the host's 127.0.0.1:53 is taken ({e}): no canary to listen there")
    yield c
    c.close()


def host_nameservers():
    try:
        with open("/etc/resolv.conf") as f:
            return [line.split()[1] for line in f if line.startswith("nameserver") and len(line.split()) > 1]
    except OSError:
        return []


@pytest.mark.both_uids("the resolver answers on the step's 127.0.0.1:53, a privileged port, which a non-root user's "
                       "step has inside a user namespace's network namespace (and "
                       "test_a_flood_from_a_step_the_daemon_runs_leaves_the_daemon_answering points at this run)")
def test_flood_and_malformed_queries(attacker, canary):
    script = attacker.root / "attack.py"
    script.write_text(ATTACK)
    attacker.own(script)
    attacker.write_policy("version: 1\nnetwork:\n  allow: []\n")
    r = attacker.envgit("run", "--", "python3", "attack.py", CANARY, *host_nameservers(), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "after=NONAME fast" in r.stdout, r.stdout + r.stderr
    assert "answer rcode=3 an=0 ns=0 ar=0" in r.stdout, r.stdout
    assert "tcp=closed" in r.stdout, r.stdout
    # nothing was forwarded to a real resolver's place
    assert not any(CANARY.encode() in h for h in canary.heard), canary.heard
    assert canary.heard == [], canary.heard
    # nothing raw reached the terminal: the names are said escaped or not at all
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr, repr(r.stderr)
    shown = attacker.envgit("show", "last")
    assert shown.returncode == 0 and "\x1b" not in shown.stdout and "\x07" not in shown.stdout, repr(shown.stdout)
    s = json.loads(attacker.envgit("show", "last", "--json").stdout)
    assert len(s["dns_names"]) <= 100 and s["dns_queries"] > 100, (len(s["dns_names"]), s["dns_queries"])
    assert any("\\027]52;c;" in n for n in s["dns_names"]) or len(s["dns_names"]) == 100, s["dns_names"][:20]
    assert not any("\x1b" in n for n in s["dns_names"])
    # envgit and its daemon carry on
    after = attacker.run("echo alive")
    assert after.returncode == 0 and after.stdout == "alive\n", after.stderr


def test_escape_names_are_recorded_inert_and_not_offered_as_hosts(attacker, canary):
    attacker.write_policy("version: 1\nnetwork:\n  allow: []\n")
    script = attacker.root / "names.py"
    script.write_text(r'''
import socket, struct
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.settimeout(3)
for labels in ([b"\x1b]0;pwned\x07", b"evil", b"test"], [b"\x1b[31mred", b"invalid"],
               [b"a`touch x`", b"invalid"], [b"ok", b"never", b"invalid"]):
    body = b"".join(bytes([len(l)]) + l for l in labels) + b"\0\x00\x01\x00\x01"
    c.sendto(struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0) + body, ("127.0.0.1", 53))
    print(c.recv(512)[3] & 15)
''')
    attacker.own(script)
    r = attacker.envgit("run", "--", "python3", "names.py", timeout=60)
    assert r.stdout.split() == ["3", "3", "3", "3"], r.stdout + r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr, repr(r.stderr)
    said = [line for line in r.stderr.splitlines() if "tried to reach" in line]
    assert len(said) == 1 and "ok.never.invalid" in said[0], r.stderr
    assert "pwned" not in said[0] and "touch" not in said[0], said
    names = json.loads(attacker.envgit("show", "last", "--json").stdout)["dns_names"]
    assert "\\027]0;pwned\\007.evil.test" in names and "ok.never.invalid" in names, names
    shown = attacker.envgit("show", "last").stdout
    assert "\x1b" not in shown and "\\027[31mred.invalid" in shown, repr(shown)
    assert canary.heard == []


def test_a_flood_from_a_step_the_daemon_runs_leaves_the_daemon_answering(attacker, canary):
    """The steps the daemon starts itself (an agent's Bash call through the inner socket) are
    answered on the daemon's own loop: a flood there must not starve other steps."""
    if attacker.user is not None:
        pytest.skip("drives the daemon's protocol from the test process (root); the unprivileged "
                    "run of the same resolver code is test_flood_and_malformed_queries[user]")
    import shutil
    import subprocess
    import time
    from pathlib import Path

    from envgit.daemon.client import connect
    from envgit.paths import Project
    from envgit.sandbox.seccomp import program
    attacker.write_policy("version: 1\nnetwork:\n  allow: []\n")
    (attacker.root / "attack.py").write_text(ATTACK)
    attacker.run("true")
    conn = connect(Project(str(attacker.root)))
    helper = conn.request({"op": "begin", "argv": ["agent"], "cwd": str(attacker.root), "env": attacker.env,
                           "record_only": True, "session": "agent-flood"})
    shim = Path(__file__).resolve().parents[2] / "src" / "envgit" / "daemon" / "inner_shim.py"
    shutil.copy(shim, attacker.root / "shim.py")
    spec = conn.request({"op": "spec", "argv": ["/usr/bin/python3", str(attacker.root / "shim.py"),
                                                "python3", "attack.py", CANARY, *host_nameservers()],
                         "cwd": str(attacker.root), "env": attacker.env, "session": "agent-flood",
                         "inner": True, "step": helper["step"]})
    fd = os.memfd_create("s", 0)
    os.write(fd, program())
    os.lseek(fd, 0, 0)
    flood = subprocess.Popen([spec["bwrap"][0], "--seccomp", str(fd), *spec["bwrap"][1:]], env=spec["env"],
                             pass_fds=[fd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)                                    # the flood is on
    t = time.monotonic()
    during = attacker.run("echo alive", timeout=60)
    took = time.monotonic() - t
    out, err = flood.communicate(timeout=120)
    assert during.returncode == 0 and during.stdout == "alive\n", during.stderr
    assert took < 30, took
    assert "after=NONAME fast" in out and "answer rcode=3 an=0 ns=0 ar=0" in out, out + err
    assert "\x1b" not in err and "\x07" not in err, repr(err)
    assert canary.heard == []
    conn.request({"op": "end", "step": helper["step"], "exit_code": 0})
    steps = json.loads(attacker.envgit("log", "--json", check=True).stdout)
    inner = [s for s in steps if s["session"] == "agent-flood" and s["argv"][:1] == ["python3"]]
    assert len(inner) == 1 and inner[0]["dns_queries"] > 100 and len(inner[0]["dns_names"]) <= 100
    assert attacker.run("echo after").stdout == "after\n"
