"""The organisation policy's merge judges what a value IS, not how it is spelled (policy/org.py):
a host by the place the gate takes it for (hostnames.canonical_host / places: every loopback
spelling of a port, an IPv4 address and its IPv4-mapped or NAT64 IPv6 forms), a credential by
its source, an MCP server by its upstream. Loaded through the real `load_policy` under a
root-owned organisation file; the gate's decisions by its real decide_request. The end-to-end
attacks are tests/adversarial/test_org_policy_{loopback,gate,mcp}.py."""

import os
import shutil

import pytest

from envgit.policy import PolicyError, load_policy
from envgit.policy.network import Request, decide_request
from envgit.policy.org import ORG_POLICY_ENV
from test_org_policy import line_of, org_file, project

pytestmark = pytest.mark.skipif(os.path.lexists("/etc/envgit/policy.yaml") or os.geteuid() != 0,
                                reason="an organisation policy must be root's (the test writes "
                                       "one as root), and no real /etc/envgit/policy.yaml")


@pytest.fixture
def org_text(monkeypatch):
    made = []

    def install(text):
        p = org_file(text)
        made.append(p)
        monkeypatch.setenv(ORG_POLICY_ENV, p)
        return p
    yield install
    for p in made:
        shutil.rmtree(os.path.dirname(p), ignore_errors=True)


def refused(tmp_path, body, pneedle):
    text = "version: 1\n" + body
    f = project(tmp_path, text)
    with pytest.raises(PolicyError) as e:
        load_policy(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}:{line_of(text, pneedle)}:"), msg
    return msg


# --- hosts -----------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["localhost:5000", "[::1]:5000", "[::ffff:127.0.0.1]:5000",
                                      "127.1:5000", "0x7f000001:5000", "127.0.0.2:5000"])
def test_an_org_denied_loopback_port_is_refused_in_every_spelling(org_text, tmp_path, spelling):
    org = org_text('version: 1\nnetwork:\n  deny: ["127.0.0.1:5000"]\n')
    msg = refused(tmp_path, f'network:\n  allow: ["{spelling}"]\n', spelling)
    assert f"{org}:3" in msg and "denies" in msg, msg
    # the control: another port of the same place is the project's to allow
    load_policy(project(tmp_path, f'version: 1\nnetwork:\n  allow: ["{spelling[:-4]}5001"]\n'))


@pytest.mark.parametrize("spelling", ["[::ffff:192.168.1.10]", "[::ffff:c0a8:10a]",
                                      "[64:ff9b::c0a8:10a]", "3232235786", "192.168.01.10"])
def test_an_org_denied_address_is_refused_in_its_v6_and_legacy_forms(org_text, tmp_path, spelling):
    org = org_text('version: 1\nnetwork:\n  deny: ["192.168.1.10"]\n')
    msg = refused(tmp_path, f'network:\n  allow: ["{spelling}"]\n', spelling)
    assert f"{org}:3" in msg, msg
    load_policy(project(tmp_path, 'version: 1\nnetwork:\n  allow: ["[::ffff:192.168.1.11]"]\n'))


def test_the_orgs_loopback_l7_and_irreversible_rules_are_refused_and_applied_by_place(org_text, tmp_path):
    org = org_text('version: 1\nnetwork:\n  l7:\n    "127.0.0.1:5000": {methods: [GET]}\n'
                   'irreversible:\n  - net: {host: "127.0.0.1", method: DELETE}\n    action: deny\n')
    # a project l7 entry on another spelling may not allow more
    msg = refused(tmp_path, 'network:\n  l7:\n    "[::1]:5000": {methods: [GET, POST]}\n', "[::1]")
    assert f"{org}:4" in msg and "allows method POST" in msg, msg
    # a project rule that allows DELETE on localhost may not slip in under the org's l7
    msg = refused(tmp_path, 'irreversible:\n  - net: {host: localhost, method: POST}\n'
                  '    action: allow\n', "net:")
    assert "lets method POST on localhost through" in msg, msg
    # the gate: the project allows the port as localhost; the org's rules still decide
    pol = load_policy(project(tmp_path, 'version: 1\nnetwork:\n  allow: ["localhost:5000", '
                              '"[::1]:5000"]\n'))

    def decide(method, host):
        authority = f"[{host}]:5000" if ":" in host else f"{host}:5000"
        return decide_request(pol, Request("http", host, 5000, method, "/x", "",
                                           {"host": authority}, b"x"))
    for host in ("localhost", "::1"):
        assert decide("GET", host).action == "allow", host
        d = decide("POST", host)
        assert d.action == "deny" and d.rule == "network.l7[127.0.0.1:5000]", (host, d)
        d = decide("DELETE", host)
        assert d.action == "deny" and d.rule == "irreversible[0]", (host, d)


def test_an_org_network_deny_applies_at_the_gate_to_every_spelling(org_text, tmp_path):
    """network.deny is also a request rule tried first (load._denied_hosts): it matches the
    place, so it holds even where a spelling reached the gate without a merge refusal (a
    project that allows the whole of *.example names the address only through DNS)."""
    org_text('version: 1\nnetwork:\n  deny: ["192.168.1.10"]\n')
    pol = load_policy(project(tmp_path, 'version: 1\nnetwork:\n  allow: ["[::ffff:192.168.1.11]"]\n'))
    pol.network_allow.append("[::ffff:192.168.1.10]")    # as if it had slipped past the merge
    d = decide_request(pol, Request("https", "::ffff:192.168.1.10", 443, "GET", "/", "",
                                    {"host": "[::ffff:192.168.1.10]"}, b""))
    assert d.action == "deny" and d.rule == "network.deny 192.168.1.10", d


# --- credentials -----------------------------------------------------------------------------

CRED_ORG = """\
version: 1
credentials:
  gh:
    from: {env: MY_TOKEN}
    hosts: [git.corp.example]
  deploy:
    from: {file: ~/.corp/deploy-token}
    hosts: [deploy.corp.example]
  vault:
    from: {command: "vault read -field=token secret/ci"}
    hosts: [vault.corp.example]
  aws:
    from: {profile: corp}
    hosts: [s3.amazonaws.com]
"""


@pytest.mark.parametrize("source,oname,oneedle", [
    ("{env: MY_TOKEN}", "gh", "gh:"),
    ("{file: ~/.corp/../.corp/deploy-token}", "deploy", "deploy:"),
    ("{file: HOME/.corp/deploy-token}", "deploy", "deploy:"),
    ("{file: HOME/link/deploy-token}", "deploy", "deploy:"),
    ('{command: "vault  read -field=token   secret/ci"}', "vault", "vault:"),
    ("{profile: corp}", "aws", "aws:"),
])
def test_a_project_credential_may_not_reuse_an_org_credentials_source(
        org_text, tmp_path, monkeypatch, source, oname, oneedle):
    home = tmp_path / "home"
    (home / ".corp").mkdir(parents=True)
    (home / "link").symlink_to(home / ".corp")
    monkeypatch.setenv("HOME", str(home))
    org = org_text(CRED_ORG)
    msg = refused(tmp_path, "credentials:\n  mine:\n    from: "
                  + source.replace("HOME", str(home)) + "\n    hosts: [stub.example.test]\n", "from:")
    assert f"credential {oname} of {org}:{line_of(CRED_ORG, oneedle) + 1}" in msg, msg  # its from:
    assert "sent only to" in msg, msg
    # the control: a source of its own is the project's
    load_policy(project(tmp_path, "version: 1\ncredentials:\n  mine:\n    from: {env: MINE}\n"
                        "    hosts: [stub.example.test]\n"))


# --- MCP servers -----------------------------------------------------------------------------

def test_the_orgs_mcp_rules_follow_the_same_upstream_under_another_name(org_text, tmp_path):
    py = shutil.which("python3")
    org_text("""version: 1
mcp:
  servers:
    corpus:
      command: python3
      args: [/srv/mcp/corpus.py, /data]
    web:
      url: https://MCP.corp.example/mcp
  rules:
    - {server: "corp*", tool: "delete_*", action: deny}
    - {server: web, action: ask}
""")
    pol = load_policy(project(tmp_path, f"""version: 1
mcp:
  servers:
    mine:
      command: {os.path.realpath(py)}
      args: [/srv/mcp/./corpus.py, /data/]
    w2:
      url: https://mcp.corp.example:443/mcp/
    other:
      command: python3
      args: [/srv/mcp/corpus.py, /elsewhere]
  rules:
    - {{action: allow}}
"""))
    from envgit.mcp.rules import decide_tool
    rules = pol.mcp["rules"]
    assert decide_tool(rules, "mine", "delete_file").action == "deny", rules
    assert decide_tool(rules, "mine", "read_file").action == "allow", rules
    assert decide_tool(rules, "w2", "search").action == "ask", rules
    # another corpus (other arguments) is another upstream: the project's own rules decide
    assert decide_tool(rules, "other", "delete_file").action == "allow", rules
