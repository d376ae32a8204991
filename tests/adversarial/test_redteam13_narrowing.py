"""Red team 13: a credential narrowed to methods is used for another method.

`credentials.NAME.methods: [GET]` binds the credential to reads. The gate checks only the
request line's method, while its own request rules (network.py `_OVERRIDE_HEADERS`) know that
servers take the method from X-HTTP-Method-Override / X-HTTP-Method / X-Method-Override (Rails'
Rack::MethodOverride, Google APIs, many REST frameworks). A GET carrying one of them goes out
with the real token swapped in, and the server performs a DELETE (or PUT, POST) with it. The
oracle is the credential host's record: the real token arrived with a method override the
credential does not allow."""

import shutil

import pytest

from gatekit import hostport, netproject, servers
from harness import CANARY, attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


@pytest.mark.parametrize("header", ["X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"])
def test_a_method_override_does_not_take_the_credential_past_its_methods(attacker, header):
    with servers() as (git, stub):
        attacker.env["MY_TOKEN"] = CANARY
        api = hostport(stub, "stub.example.test")   # no preset rule of its own
        netproject(attacker, git, stub,
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n"
                   "    methods: [GET]\n")
        # the narrowing holds for the request line: a DELETE is misuse
        attacker.run(f"curl -s -o /dev/null -X DELETE -H \"Authorization: Bearer $MY_TOKEN\" "
                     f"https://{api}/repos/o/r")
        assert not [q for q in stub.requests if CANARY in q["headers"].get("authorization", "")]
        # …but not for the method the server acts on
        attacker.run(f"curl -s -o /dev/null -H \"{header}: DELETE\" "
                     f"-H \"Authorization: Bearer $MY_TOKEN\" https://{api}/repos/o/r")
        used = [q for q in stub.requests
                if CANARY in q["headers"].get("authorization", "") and
                q["headers"].get(header.lower(), "").upper() == "DELETE"]
        assert not used, "the real token went out on a DELETE (by override) the credential does not allow"
