"""Red team 16: an organisation policy that denies a host loopback service by one spelling
(`network.deny: ["127.0.0.1:PORT"]`: a Docker API on 2375, a database's admin port) is loosened
by a project that allows the same address and port under another spelling (`localhost:PORT`,
`[::ffff:127.0.0.1]:PORT`). The merge (policy/org.py) compares host names as text, while the gate
treats every loopback spelling on one port as the same authority (policy/network.py
`_loopback`) and the loopback forwarder reaches the same socket.

The oracle: a canary server on the host's 127.0.0.1:PORT that touches a marker file when
anything connects. The org denies that address; no step may reach it. Either the project policy
is refused (exit 125 naming both files) or the connection is refused: the marker must not exist."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from harness import attacker  # noqa: F401  (the fixture)
from test_loopback import Canary

pytestmark = pytest.mark.skipif(os.path.lexists("/etc/envgit/policy.yaml") or os.geteuid() != 0,
                                reason="needs root (the org file must be root's) and no real "
                                       "/etc/envgit/policy.yaml")


@pytest.fixture
def denied_service(attacker, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    svc = Canary(marks / "denied")
    d = tempfile.mkdtemp(prefix="envgit-org-")
    os.chmod(d, 0o755)
    org = Path(d) / "policy.yaml"
    org.write_text(f'version: 1\nnetwork:\n  deny: ["127.0.0.1:{svc.port}"]\n')
    org.chmod(0o644)
    attacker.stop()
    attacker.env["ENVGIT_ORG_POLICY"] = str(org)
    yield attacker, svc, org
    attacker.stop()
    svc.close()
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("spelling", ["localhost", "[::ffff:127.0.0.1]"])
def test_a_project_cannot_reach_an_org_denied_loopback_port_by_another_spelling(denied_service, spelling):
    attacker, svc, org = denied_service
    # control: the org's own spelling is refused at the merge
    attacker.write_policy(f'version: 1\nnetwork:\n  allow: ["127.0.0.1:{svc.port}"]\n')
    r = attacker.run(f"curl -sS -m 5 http://127.0.0.1:{svc.port}/; echo ran")
    assert "ran" not in r.stdout and str(org) in r.stderr, r.stdout + r.stderr
    assert not svc.marker.exists()
    # the same socket, another spelling
    attacker.stop()
    attacker.write_policy(f'version: 1\nnetwork:\n  allow: ["{spelling}:{svc.port}"]\n')
    host = spelling
    r = attacker.run(f"curl -sS -m 5 http://{host}:{svc.port}/; "
                     f"curl -sS -m 5 http://127.0.0.1:{svc.port}/; echo ran")
    assert not svc.marker.exists(), (
        f"the org denies 127.0.0.1:{svc.port}; a project allowing {spelling}:{svc.port} reached it:\n"
        + r.stdout + r.stderr)
