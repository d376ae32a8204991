"""Red team: echoes the gate cannot read. The credential's host is a server the step controls;
it answers the real token it was sent in a form the gate did not read the way the step's
client does:

- base64 broken into lines (MIME: CRLF every 76 characters; LF every 10; lines indented), in a
  buffered body and in a stream, the stream trickled a few bytes at a time: the gate looked for
  the token's base64 within one unbroken run only;
- under a Content-Encoding the gate does not decode (`x-custom`, `compress`, a stacked list
  with one unknown), buffered and streamed: passed on undecoded, the step decodes it by hand;
- deflate with a preset dictionary (zlib's FDICT): the gate cannot inflate it, a client that
  knows the dictionary can;
- a `101 Switching Protocols` to a request that asked for no WebSocket (or answered with a
  wrong Sec-WebSocket-Accept): mitmproxy switched to relaying WebSocket frames anyway, past
  the policy's refusal of upgrades, and forwards a Ping's payload unlooked at.

What the gate cannot read on a credential's host is cut off (a 502 for a buffered body, a
closed stream for a streamed one, a 502 for the 101) and the step marked; what it can is
rewritten to the placeholder. The step runs real curl or Python through the real gate; the
oracle is the canary (the real token, in the person's environment only) in what the step read,
or a message at a server where the policy refuses WebSockets."""

import base64
import gzip
import hashlib
import json
import shutil
import struct
import time
import zlib
from contextlib import contextmanager

import pytest

from conftest import CANARY
from gatekit import netproject, servers
from harness import every_case
from kit.rawtls import raw_tls_server, read_head
from kit.tunnel import TUNNEL

pytestmark = pytest.mark.skipif(shutil.which("socat") is None or shutil.which("python3") is None,
                                reason="socat or python3 is not installed")

NAME = "api.github.com"        # gatekit.STUB_NAMES: resolved to 127.0.0.1 by netproject
OTHER = "stub.example.test"
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
DICT = b'{"you_sent": "Bearer '   # a preset dictionary the step's client knows


def _echo(token: str) -> bytes:
    """The debug endpoint's answer: long enough before the token that its base64 crosses a
    76-character line."""
    return b'{"note": "' + b"n" * 14 + b'", "you_sent": "' + token.encode() + b'"}\n'


def _wrap(data: bytes, width: int, sep: bytes, indent: bytes = b"") -> bytes:
    enc = base64.b64encode(data)
    return sep.join(indent + enc[i:i + width] for i in range(0, len(enc), width)) + sep


WRAPS = {"/b64-crlf76": (76, b"\r\n", b""), "/b64-lf10": (10, b"\n", b""),
         "/b64-indented": (64, b"\n", b"    ")}


def _buffered(body: bytes, encoding: bytes = b"", ctype: bytes = b"text/plain") -> list[bytes]:
    ce = b"Content-Encoding: " + encoding + b"\r\n" if encoding else b""
    return [b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype + b"\r\n" + ce +
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)]


def _streamed(pieces: list[bytes], encoding: bytes = b"") -> list[bytes]:
    ce = b"Content-Encoding: " + encoding + b"\r\n" if encoding else b""
    return [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" + ce +
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"] + \
        [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p] + [b"0\r\n\r\n"]


def _fdict(data: bytes) -> bytes:
    c = zlib.compressobj(zdict=DICT)
    return c.compress(data) + c.flush()


def _answer(path: str, token: str) -> list[bytes]:
    """What the echoing server writes for `path`, as pieces written apart."""
    echo = _echo(token)
    base, _, kind = path.partition("?")
    if base in WRAPS:
        body = b"token (base64):\n" + _wrap(echo, *WRAPS[base])
        if kind == "stream":
            return _streamed([body])
        if kind == "trickle":                   # a few bytes an HTTP chunk, each sent apart
            return _streamed([body[i:i + 3] for i in range(0, len(body), 3)])
        return _buffered(body)
    unknown = {"/x-custom": b"x-custom", "/compress": b"compress", "/stacked": b"gzip, x-custom"}
    if base in unknown:                         # gzip bytes, labelled as the gate cannot read
        body = gzip.compress(echo)
        return _streamed([body], unknown[base]) if kind == "stream" else _buffered(body, unknown[base])
    if base == "/fdict":
        body = _fdict(echo)
        return _streamed([body], b"deflate") if kind == "stream" else _buffered(body, b"deflate")
    return [b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"]


@contextmanager
def http_server(ca):
    """HTTPS/1.1 on 127.0.0.1 writing raw answers with the Bearer token it was sent; `seen`
    holds each request's Authorization."""
    seen = []

    def handle(s):
        path, hdrs = read_head(s)
        seen.append(hdrs.get("authorization", ""))
        for i, piece in enumerate(_answer(path, hdrs.get("authorization", "").partition(" ")[2])):
            if i:
                time.sleep(0.05)
            s.sendall(piece)
        time.sleep(0.2)

    with raw_tls_server(ca, [NAME, OTHER], "unreadable", handle) as port:
        yield port, seen


@contextmanager
def world(attacker, server=http_server, ws_allow=False):
    """The echoing server as the credential's host (NAME) and as another allowed host (OTHER);
    with `ws_allow`, network.l7 lets WebSockets through on the credential's host."""
    with servers() as (git, stub), server(git.ca) as (port, seen):
        attacker.env["MY_TOKEN"] = CANARY
        api, other = f"{NAME}:{port}", f"{OTHER}:{port}"
        l7 = f"  l7:\n    \"{api}\": {{websocket: allow}}\n" if ws_allow else ""
        netproject(attacker, git, stub, allow=[api, other], tail=l7 + (
            f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n"))
        yield api, other, seen


def _marked(attacker) -> list[dict]:
    """The last step's records of a response the gate cut off (credential-misuse, echo)."""
    s = json.loads(attacker.envgit("log", "--json", check=True).stdout)[-1]
    assert "credential-misuse" in s["marks"], (s["marks"], s["requests"])
    return [q for q in s["requests"] if q.get("rule") == "credential-misuse"]


# --- base64 broken into lines -------------------------------------------------------------

B64_READ = ("python3 -c \"import base64; d = open('/tmp/b','rb').read(); "
            "print(base64.b64decode(d.split(b':', 1)[1]).decode('latin-1'))\"")


def test_a_real_token_in_wrapped_base64_comes_back_as_the_placeholder(attacker):
    """Buffered (Content-Length): the wrapped base64 is decoded, the token replaced by the
    placeholder, encoded again and wrapped the same way; the step decodes the placeholder.
    Every wrapping its own step, in one project and gate."""
    with world(attacker) as (api, _, seen):
        ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
        every_case(WRAPS, lambda path: _check_wrapped(attacker, api, seen, ph, path))


def _check_wrapped(attacker, api, seen, ph, path):
    r = attacker.run(f"curl -sS -H \"Authorization: Bearer $MY_TOKEN\" https://{api}{path} "
                     f"-o /tmp/b; {B64_READ}; python3 -c \"print(open('/tmp/b','rb').read().hex())\"")
    out = r.stdout + r.stderr
    assert seen and seen[-1] == f"Bearer {CANARY}", seen         # the real token arrived
    assert CANARY not in out, f"the real token reached the step through {path}:\n{out}"
    assert f'"you_sent": "{ph}"' in out, out                     # rewritten, not withheld
    same_form = b"token (base64):\n" + _wrap(_echo(ph), *WRAPS[path])
    assert same_form.hex() in out, f"not wrapped as it was:\n{out}"


@pytest.mark.both_uids("the stream is cut in the daemon, which runs as the step's user")
def test_a_real_token_in_wrapped_base64_in_a_stream_is_cut_off(attacker):
    """Streamed (chunked): the stream cannot be rewritten across its runs' ends, so it is cut
    off before any byte of the token's base64; trickled, no prefix of it reaches the step
    either (a prefix would give away the token's first bytes). Streamed and trickled each its
    own steps, in one project and gate; each starts without the other's /tmp/b."""
    with world(attacker) as (api, _, seen):
        def check(how):
            n = len(seen)
            r = attacker.run(f"rm -f /tmp/b; curl -sS -H \"Authorization: Bearer $MY_TOKEN\" "
                             f"https://{api}/b64-crlf76?{how} -o /tmp/b; echo curl-exit=$?; {B64_READ}")
            out = r.stdout + r.stderr
            assert len(seen) > n and seen[-1] == f"Bearer {CANARY}", seen
            assert CANARY not in out, f"the real token reached the step through wrapped base64:\n{out}"
            assert _marked(attacker), "the cut was not recorded"
            got = "".join(attacker.run("cat /tmp/b").stdout.partition(":")[2].split())
            part = base64.b64decode(got[:len(got) // 4 * 4]).decode("latin-1")
            assert CANARY[:2] not in part, f"a prefix of the token reached the step: {part!r}"

        every_case(["stream", "trickle"], check)


# --- bodies the gate cannot decode --------------------------------------------------------

UNDECODABLE = {
    "/x-custom": "gzip -dc < /tmp/b",
    "/compress": "gzip -dc < /tmp/b",
    "/stacked": "gzip -dc < /tmp/b",
    "/fdict": "python3 -c \"import zlib; d = zlib.decompressobj(zdict=b'{\\\"you_sent\\\": \\\"Bearer '); "
              "print(d.decompress(open('/tmp/b','rb').read()).decode('latin-1'))\"",
}


@pytest.mark.both_uids("the response is withheld by the daemon, which runs as the step's user")
def test_an_echo_the_gate_cannot_decode_is_cut_off(attacker):
    """A body on a credential's host the gate cannot decode and check is cut off: a 502 saying
    so (buffered), a closed stream (streamed); the step is marked. Every body, buffered and
    streamed, its own step, in one project and gate; each one that fails is named."""
    with world(attacker) as (api, _, seen):
        every_case([(path, how) for how in ("buffered", "stream") for path in UNDECODABLE],
                   lambda case: _check_undecodable(attacker, api, seen, *case))


def _check_undecodable(attacker, api, seen, path, how):
    q, n = "?stream" if how == "stream" else "", len(seen)
    r = attacker.run(f"rm -f /tmp/b /tmp/h; "
                     f"curl -sS -D /tmp/h -H \"Authorization: Bearer $MY_TOKEN\" https://{api}{path}{q} "
                     f"-o /tmp/b; echo curl-exit=$?; {UNDECODABLE[path]}; cat /tmp/h; "
                     "tr -cd '[:print:]\\n' < /tmp/b")
    out = r.stdout + r.stderr
    assert len(seen) > n and seen[-1] == f"Bearer {CANARY}", seen
    assert CANARY not in out, f"the real token reached the step through {path} ({how}):\n{out}"
    if how == "buffered":
        assert "HTTP/1.1 502" in out and "envgit" in out and "could not read" in out, out
    else:
        assert "curl-exit=0" not in out, out
    assert _marked(attacker), "the cut was not recorded"


def test_a_body_the_gate_cannot_decode_elsewhere_passes_as_before(attacker):
    """Not on a credential's host, an unknown Content-Encoding passes unchanged (a download, a
    package), as it did."""
    with world(attacker) as (_, other, seen):
        r = attacker.run(f"curl -sS -H \"Authorization: Bearer nothing\" https://{other}/x-custom "
                         "-o /tmp/b; echo curl-exit=$?; gzip -dc < /tmp/b; od -c /tmp/b | head -5")
        out = r.stdout + r.stderr
        assert "curl-exit=0" in out and '"you_sent": "nothing"' in out, out


# --- 101 Switching Protocols ------------------------------------------------------------

# The step's client: CONNECT through $HTTPS_PROXY, TLS, one GET with the headers argv[3]
# names, then one masked text message "hello websocket"; prints all it reads until the end.
WS_CLIENT = TUNNEL + r'''
extra = {"plain": "Sec-WebSocket-Version: 13\r\n",
         "upgrade": "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                    "Sec-WebSocket-Key: " + base64.b64encode(os.urandom(16)).decode() + "\r\n"}[sys.argv[3]]
auth = f"Authorization: Bearer {os.environ['MY_TOKEN']}\r\n" if sys.argv[4:5] == ["auth"] else ""
t.sendall((f"GET {sys.argv[2]} HTTP/1.1\r\nHost: {host}:{port}\r\n{extra}{auth}\r\n").encode())
t.settimeout(3)
got = b""
try:
    while b"\r\n\r\n" not in got:
        b = t.recv(4096)
        if not b:
            break
        got += b
    data = b"hello websocket"
    mask = os.urandom(4)
    t.sendall(bytes([0x81, 0x80 | len(data)]) + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(data)))
    while True:
        b = t.recv(4096)
        if not b:
            break
        got += b
except (OSError, socket.timeout):
    pass
print(got.decode("latin-1"))
'''


@contextmanager
def ws_server(ca):
    """Answers every request with a 101 (`/bad-accept`: a wrong Sec-WebSocket-Accept;
    otherwise the right one, or none without a key), then a Ping frame whose payload is the
    Authorization it was sent; logs the text messages it gets in `seen`."""
    seen = []

    def handle(s):
        path, hdrs = read_head(s)
        key = hdrs.get("sec-websocket-key", "")
        accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()) if key else b""
        if path == "/bad-accept":
            accept = base64.b64encode(b"\0" * 20)
        s.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
                  (b"Sec-WebSocket-Accept: " + accept + b"\r\n" if accept else b"") + b"\r\n")
        auth = hdrs.get("authorization", "").encode()[:125]
        s.sendall(bytes([0x89, len(auth)]) + auth)
        while True:
            b0, b1 = s.recv(1)[0], s.recv(1)[0]
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", s.recv(2))[0]
            mask = s.recv(4) if b1 & 0x80 else b"\0\0\0\0"
            data = b""
            while len(data) < n:
                data += s.recv(n - len(data))
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(data))
            if b0 & 0x0F == 1:
                seen.append((hdrs.get("host", ""), data.decode("latin-1")))
            elif b0 & 0x0F == 8:
                return

    with raw_tls_server(ca, [NAME, OTHER], "ws101", handle, backlog=8) as port:
        yield port, seen


def _ws(attacker):
    attacker.run(f"cat > /tmp/ws.py <<'EOF'\n{WS_CLIENT}\nEOF\ncp /tmp/ws.py ws.py")


@pytest.mark.both_uids("the 101 is judged by the daemon, which runs as the step's user")
def test_a_101_to_a_request_that_asked_no_upgrade_is_refused(attacker):
    """GET with `Sec-WebSocket-Version: 13` but no `Upgrade`/`Connection: upgrade`: the policy
    never judged it as an upgrade (refused on every intercepted host unless network.l7 allows
    WebSockets). The server answers 101 websocket; mitmproxy relayed frames both ways: a
    Ping carrying the real token to the step, the step's message to the server. On the
    credential's host and on another, each its own step in one project and gate."""
    with world(attacker, ws_server) as (api, other, seen):
        _ws(attacker)

        def check(where):
            n = len(seen)
            target, auth = (api, "auth") if where == "credential-host" else (other, "")
            r = attacker.run(f"python3 ws.py {target} /no-upgrade plain {auth}")
            out = r.stdout + r.stderr
            assert CANARY not in out, f"the real token reached the step past a 101:\n{out}"
            assert not seen[n:], f"a WebSocket message reached {where} past the policy: {seen[n:]}"
            assert "HTTP/1.1 502" in out and "envgit" in out, out
            assert _marked_upgrade(attacker)

        every_case(["credential-host", "other-host"], check)


def test_a_101_with_a_wrong_accept_is_refused(attacker):
    """An allowed WebSocket upgrade (network.l7 websocket: allow) answered with a wrong
    Sec-WebSocket-Accept: not a WebSocket the client asked for; nothing passes after it."""
    with world(attacker, ws_server, ws_allow=True) as (api, _, seen):
        _ws(attacker)
        r = attacker.run(f"python3 ws.py {api} /bad-accept upgrade auth")
        out = r.stdout + r.stderr
        assert CANARY not in out, f"the real token reached the step past a bad 101:\n{out}"
        assert not seen, seen
        assert "HTTP/1.1 502" in out, out
        r = attacker.run(f"python3 ws.py {api} /good upgrade auth")      # a valid upgrade still goes
        assert "101 Switching Protocols" in r.stdout and seen, r.stdout + r.stderr


def _marked_upgrade(attacker) -> list[dict]:
    s = json.loads(attacker.envgit("log", "--json", check=True).stdout)[-1]
    bad = [q for q in s["requests"] if q.get("rule") == "builtin:upgrade"]
    assert bad and bad[0]["decision"] == "deny", s["requests"]
    return bad
