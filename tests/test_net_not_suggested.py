"""The one decider of "a host envgit may suggest allowing" (policy/hostnames.py not_suggested):
a step chooses what it looks up or asks the gate for, so the notices never offer a line for
an address the gate keeps out unless named exactly, nor a name no public host is under."""

import pytest

from envgit.daemon import netadvice
from envgit.policy.hostnames import is_special, not_suggested

NEVER = ["metadata.google.internal", "metadata.goog", "instance-data.ec2.internal",
         "metadata.azure.internal", "169.254.169.254", "[fd00:ec2::254]", "100.100.100.200",
         "127.0.0.1", "127.1", "0x7f000001", "2130706433", "0177.0.0.1", "10.0.0.1", "192.168.1.1",
         "::1", "::ffff:169.254.169.254", "localhost", "app.localhost", "db.internal",
         "printer.local", "router.lan", "nas.home", "x.localdomain", "1.0.0.10.in-addr.arpa",
         "intranet", "a.b.123"]
OFFERED = ["pypi.org", "registry.npmjs.org", "ok.never.invalid", "example.test",
           "files.pythonhosted.org", "xn--80ak6aa92e.xn--p1ai"]


@pytest.mark.parametrize("host", NEVER)
def test_never_suggested(host):
    assert not_suggested(host), host


@pytest.mark.parametrize("host", OFFERED)
def test_suggested(host):
    assert not_suggested(host) is None and is_special(host) is None, host


def test_the_gates_special_addresses_are_all_withheld():
    """Every host the gate treats as special is withheld: one classification, not two lists."""
    for h in NEVER:
        if is_special(h):
            assert not_suggested(h)


def test_split_offered_keeps_ports_and_says_why():
    offered, withheld = netadvice.split_offered(["pypi.org", "169.254.169.254:80", "db.internal:8443"])
    assert offered == ["pypi.org"]
    assert [h for h, _ in withheld] == ["169.254.169.254:80", "db.internal:8443"]
    text = netadvice.withheld_notice(withheld)
    assert "allow" not in text and "cloud metadata address" in text and "db.internal:8443" in text


def test_an_agents_own_hosts_are_advised_exactly_never_as_a_preset(tmp_path):
    """A step's npm host is advised as preset:npm (its client's other hosts come with it); the
    hosts an agent contacted for its own housekeeping (its agent-session step) are advised as
    themselves: a preset would open its other hosts to every step for nothing seen."""
    from envgit.policy import load_policy
    (tmp_path / "envgit.yaml").write_text("version: 1\nnetwork:\n  allow: [\"example.com\"]\n")
    pol = load_policy(str(tmp_path / "envgit.yaml"))
    step = netadvice.advice(pol, ["api.github.com"])
    agent = netadvice.advice(pol, ["api.github.com"], exact=True)
    assert '"preset:github"' in step, step
    assert "preset:" not in agent and '"api.github.com"' in agent, agent
    said = netadvice.denial_notice(3, {"decision": "deny", "rule": "network.allow", "host": "api.github.com",
                                       "port": 443}, pol, set(), exact=True)
    assert "preset:" not in said and "api.github.com" in said, said
