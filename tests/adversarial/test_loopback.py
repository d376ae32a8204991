"""A loopback host in network.allow (sandbox/loopback.py): the step reaches the listed
address and port of the host's loopback, and nothing else there: not another port (where the
person's other services, a database, an admin UI listen), not the same port under another
spelling, not through the listed port's forwarder.

The oracle: canary servers on the host's 127.0.0.1 and ::1 that touch a marker file when
anything connects to them at all."""

import os
import socket
import threading
from pathlib import Path

import pytest

PY = "/usr/bin/python3"


class Canary:
    """Accepts on (addr, any port) and touches `marker` on every connection."""

    def __init__(self, marker: Path, family=socket.AF_INET, addr="127.0.0.1"):
        self.marker = marker
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((addr, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.marker.touch()
            try:
                c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\nCANARY\n")
            except OSError:
                pass
            c.close()

    def close(self):
        self.stop.set()
        self.sock.close()


@pytest.fixture
def loopback(attacker, tmp_path):
    """A listed dev server (a canary too, but allowed) and unlisted canaries on 127.0.0.1 and
    ::1, the policy naming the dev server's address and port only."""
    marks = tmp_path / "marks"
    marks.mkdir()
    listed = Canary(marks / "listed")
    v4 = Canary(marks / "other-v4")
    v6 = None
    if os.path.exists("/proc/net/if_inet6"):
        try:
            v6 = Canary(marks / "other-v6", socket.AF_INET6, "::1")
        except OSError:
            v6 = None
    attacker.stop()
    attacker.write_policy(f'version: 1\nnetwork:\n  allow: ["127.0.0.1:{listed.port}"]\n')
    yield attacker, listed, v4, v6
    for c in (listed, v4, v6):
        if c is not None:
            c.close()


def test_the_listed_port_is_reached_and_only_it(loopback):
    attacker, listed, v4, v6 = loopback
    r = attacker.run(f"curl -sS -m 5 http://127.0.0.1:{listed.port}/")
    assert r.returncode == 0 and "CANARY" in r.stdout, r.stderr       # the listed one works
    listed.marker.unlink()
    q = v4.port
    spellings = [f"127.0.0.1:{q}", f"localhost:{q}", f"127.1:{q}", f"2130706433:{q}",
                 f"0x7f000001:{q}", f"0.0.0.0:{q}", f"127.0.0.2:{q}", f"[::ffff:127.0.0.1]:{q}",
                 f"[::ffff:7f00:1]:{q}", f"[::]:{q}", f"[::1]:{q}", f"foo.localhost:{q}",
                 f"localhost.:{q}", f"[64:ff9b::7f00:1]:{q}"]
    if v6 is not None:
        spellings += [f"[::1]:{v6.port}", f"localhost:{v6.port}"]
    script = []
    for s in spellings:
        script += [f"curl -sS -m 5 http://{s}/direct",                          # NO_PROXY or not
                   f"curl -sS -m 5 --noproxy '' http://{s}/proxied",             # the gate, plain
                   f"curl -sS -m 5 --noproxy '' -p http://{s}/tunnel"]           # the gate, CONNECT
    r = attacker.run("; ".join(script) + "; true", timeout=300)
    assert not v4.marker.exists(), r.stdout + r.stderr
    assert v6 is None or not v6.marker.exists(), r.stdout + r.stderr
    assert "CANARY" not in r.stdout


RAW = r"""
import socket, sys
port, other = int(sys.argv[1]), int(sys.argv[2])
def send(data, then=b""):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(data)
    try:
        first = s.recv(4096)
        if then:
            s.sendall(then)
            first += s.recv(4096)
        sys.stdout.write(first.decode("latin-1") + "\n----\n")
    except OSError as e:
        sys.stdout.write(f"error {e}\n----\n")
    s.close()
h = f"127.0.0.1:{other}".encode()
# an absolute-form request, a nested CONNECT, a Host naming the other port, a second request
# on a kept-alive connection to the other port: all into the listed port's forwarder
send(b"GET http://" + h + b"/abs HTTP/1.1\r\nHost: " + h + b"\r\n\r\n")
send(b"CONNECT " + h + b" HTTP/1.1\r\nHost: " + h + b"\r\n\r\n", b"GET /in HTTP/1.1\r\nHost: " + h + b"\r\n\r\n")
send(b"GET /host HTTP/1.1\r\nHost: " + h + b"\r\n\r\n")
send(b"GET /ok HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port,
     b"GET http://" + h + b"/second HTTP/1.1\r\nHost: " + h + b"\r\n\r\n")
send(b"GET /ok HTTP/1.1\r\nHost: localhost:%d\r\nX-Forwarded-Host: " % port + h + b"\r\n\r\n")
"""


def test_the_listed_ports_forwarder_leads_nowhere_else(loopback):
    attacker, listed, v4, v6 = loopback
    (attacker.root / "raw.py").write_text(RAW)
    attacker.own(attacker.root / "raw.py")
    r = attacker.run(f"{PY} raw.py {listed.port} {v4.port}", timeout=120)
    assert not v4.marker.exists(), r.stdout + r.stderr
    assert listed.marker.exists(), r.stdout + r.stderr          # the forwarder itself works


@pytest.mark.both_uids("the daemon's and the gate's unix sockets are kept out by the step's view of .envgit and "
                       "/run/envgit: as a non-root user bwrap builds that view in a user namespace")
def test_nothing_else_of_the_host_is_reachable_from_the_loopback(loopback):
    """The daemon's and the gate's sockets are unix sockets the step cannot see; a port the
    gate or the daemon might listen on is not listed; SSH on loopback is refused outright."""
    attacker, listed, v4, v6 = loopback
    r = attacker.run("ls -A .envgit; echo ---; ls -A /run/envgit")
    # the gate's proxy socket, its ssh socket and the shim git's ssh runs (proxy/sshgit.py)
    assert r.stdout.split() == ["---", "bin", "proxy.sock", "ssh.sock"], r.stdout
    r = attacker.run(f"curl -sS -m 5 --noproxy '' http://127.0.0.1:22/; "
                     f"curl -sS -m 5 --noproxy '' http://127.0.0.1:{listed.port + 1}/; "
                     f"curl -sS -m 5 --noproxy '' -p http://127.0.0.1:{v4.port}/; true")
    assert "builtin:ssh" in r.stdout + r.stderr
    assert not v4.marker.exists() and "CANARY" not in r.stdout
