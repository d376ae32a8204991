"""`env.pass` refused by value: a passed variable that holds a credential's real value, under
another name than the credential's source (DEPLOY_TOKEN beside MY_TOKEN; a value with the
token inside it), enters the step with the placeholder in the real value's place, so the
gate still swaps it on the way to the credential's hosts, and the step's record names the
variables (a `note` of type env-withheld). The oracles: the canary is not in the step's
output, the credential host receives the real token, the journal says what was withheld.
Runs as root: what passes into the step's environment does not depend on its uid."""

import json
import shutil

import pytest

from conftest import CANARY
from gatekit import hostport, netproject, servers

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


def test_a_passed_variable_holding_a_real_value_gets_the_placeholder(attacker):
    with servers() as (git, stub):
        attacker.env.update(MY_TOKEN=CANARY, DEPLOY_TOKEN=CANARY, DEPLOY_URL=f"https://x:{CANARY}@h/",
                            PLAIN="nothing-secret-here")
        api = hostport(stub, "api.github.com")
        netproject(attacker, git, stub,
                   "env:\n  pass: [DEPLOY_TOKEN, DEPLOY_URL, PLAIN]\n"
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n")
        r = attacker.run("printf '%s\\n' \"$DEPLOY_TOKEN\" \"$DEPLOY_URL\" \"$PLAIN\"; "
                         f"curl -s -o /dev/null -H \"Authorization: Bearer $DEPLOY_TOKEN\" https://{api}/; "
                         "echo done")
        out = r.stdout + r.stderr
        assert "done" in out and "nothing-secret-here" in out, out
        assert CANARY not in out, out
        lines = r.stdout.splitlines()
        assert lines[0] and lines[1].startswith("https://x:") and lines[1].endswith("@h/"), lines
        assert [q for q in stub.requests if q["headers"].get("authorization") == f"Bearer {CANARY}"], \
            "the placeholder in DEPLOY_TOKEN was not swapped for the real value"
        steps = json.loads(attacker.envgit("log", "--json", check=True).stdout)
        notes = [e for s in steps for e in s.get("events") or []
                 if e.get("kind") == "note" and e.get("type") == "env-withheld"]
        assert notes and sorted(notes[-1]["variables"]) == ["DEPLOY_TOKEN", "DEPLOY_URL"], steps[-1]
        assert CANARY not in json.dumps(steps)


def test_a_passed_variable_holding_a_credentials_real_value_is_not_passed_in(attacker):
    """The red team's case (round 13b): `env.pass` of a credential's source variable is
    refused at policy load, by name. The same token is often in the person's environment twice
    (GITHUB_TOKEN for one tool, GH_TOKEN or a DEPLOY_TOKEN for another; CI sets several):
    passing the other name handed the step the real value, which no check compared against the
    credentials' values. The oracle is the canary (the real token) in the step's environment."""
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
