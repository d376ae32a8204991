"""Issue 13: a credential narrowed to methods goes only on requests whose every method a server
may act on is among them: besides the override headers (test_redteam13_narrowing.py), Rails'
Rack::MethodOverride, Laravel and Symfony take a POST's method from a `_method` form field (or
query parameter). The oracle is the credential host's record: the real token must not arrive
with a `_method` the credential does not allow, and it does arrive on an allowed POST. Runs as
root and as an unprivileged user."""

import shutil

import pytest

from gatekit import hostport, netproject, servers
from harness import CANARY, attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


@pytest.mark.parametrize("how", [
    "--data '_method=DELETE' https://{api}/repos/o/r",
    "-F _method=DELETE https://{api}/repos/o/r",
    "-X POST 'https://{api}/repos/o/r?_method=DELETE'",
])
def test_a_method_field_does_not_take_the_credential_past_its_methods(attacker, how):
    with servers() as (git, stub):
        attacker.env["MY_TOKEN"] = CANARY
        api = hostport(stub, "stub.example.test")
        netproject(attacker, git, stub,
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n"
                   "    methods: [GET, POST]\n")
        attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" --data 'a=1' "
                     f"https://{api}/repos/o/r")           # a plain POST: the real value goes
        assert [q for q in stub.requests if CANARY in q["headers"].get("authorization", "")]
        stub.requests.clear()
        attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" " + how.format(api=api))
        used = [q for q in stub.requests if CANARY in q["headers"].get("authorization", "")]
        assert not used, f"the real token went out on a _method=DELETE: {used}"
