"""A WebSocket attack kit, RFC 6455 by hand (no WebSocket library is installed here): the
client a step runs through its proxy (CLIENT, a script for `python3 ws.py`), and a TLS server
on 127.0.0.1 that logs each message and answers it as a test asks (ws_server)."""

import base64
import hashlib
import struct
from contextlib import contextmanager

from kit.rawtls import raw_tls_server
from kit.tunnel import TUNNEL

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

# The step's client: CONNECT through $HTTPS_PROXY, TLS, upgrade (with the placeholder as its
# Bearer token if argv[3] is "auth"), send argv[2] as one text message ("PH": the
# placeholder), print the answer, and argv[4] further messages if given.
CLIENT = TUNNEL + r'''
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
def ws_server(ca, stem="ws"):
    """A WebSocket server over TLS on 127.0.0.1 (names api.github.com, stub.example.test):
    each text message is logged in `seen` (with the upgrade's Authorization); "echo-auth" is
    answered with that Authorization, "echo-close" with a Close frame whose reason quotes it,
    "echo-frag" with it in one message of two frames, "echo-split" with it in two messages;
    anything else with "ok"."""
    seen = []

    def handle(s):
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

    with raw_tls_server(ca, ["api.github.com", "stub.example.test"], stem, handle, backlog=8) as port:
        yield port, seen
