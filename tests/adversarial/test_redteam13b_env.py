"""Red team 13b: the real value enters the step's environment under another name.

`env.pass` of a credential's source variable is refused at policy load, by name. The same
token is often in the person's environment twice (GITHUB_TOKEN for one tool, GH_TOKEN or a
DEPLOY_TOKEN for another; CI sets several): passing the other name hands the step the real
value, which no check compares against the credentials' values. The oracle is the canary (the
real token) in the step's environment. Runs as root and as an unprivileged user."""

import shutil

import pytest

from gatekit import hostport, netproject, servers
from harness import CANARY, attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


def test_a_passed_variable_holding_a_credentials_real_value_is_not_passed_in(attacker):
    with servers() as (git, stub):
        attacker.env["MY_TOKEN"] = CANARY           # the credential's source
        attacker.env["DEPLOY_TOKEN"] = CANARY       # the same token, under another name
        api = hostport(stub, "api.github.com")
        netproject(attacker, git, stub,
                   "env:\n  pass: [DEPLOY_TOKEN]\n"
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n")
        r = attacker.run("tr '\\0' '\\n' < /proc/self/environ; echo done")
        assert "done" in r.stdout, r.stdout + r.stderr
        assert CANARY not in r.stdout + r.stderr, \
            "the credential's real value is in the step's environment (DEPLOY_TOKEN)"
