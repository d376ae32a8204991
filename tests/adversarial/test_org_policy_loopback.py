"""Red team 16: an organisation policy that denies a host loopback service by one spelling
(`network.deny: ["127.0.0.1:PORT"]`: a Docker API on 2375, a database's admin port) is loosened
by a project that allows the same address and port under another spelling (`localhost:PORT`,
`[::ffff:127.0.0.1]:PORT`). The merge (policy/org.py) compares host names as text, while the gate
treats every loopback spelling on one port as the same authority (policy/network.py
`_loopback`) and the loopback forwarder reaches the same socket.

The oracle: a canary server on the host's 127.0.0.1:PORT that touches a marker file when
anything connects. The org denies that address; no step may reach it. Either the project policy
is refused (exit 125 naming both files) or the connection is refused: the marker must not exist."""

import http.server
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

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


# --- the org's l7 and irreversible rules on a loopback service, by another spelling ------------


class MethodLog(http.server.BaseHTTPRequestHandler):
    """Records every method that reaches it in the server's `seen` list."""

    def _any(self):
        self.server.seen.append(self.command)
        n = int(self.headers.get("content-length") or 0)
        if n:
            self.rfile.read(n)
        self.send_response(200)
        self.send_header("content-length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")

    do_GET = do_POST = do_DELETE = do_PUT = _any

    def log_message(self, *a):
        pass


@pytest.fixture
def limited_service(attacker):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MethodLog)
    srv.seen = []
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    d = tempfile.mkdtemp(prefix="envgit-org-")
    os.chmod(d, 0o755)
    org = Path(d) / "policy.yaml"
    org.write_text(f'version: 1\nnetwork:\n  l7:\n    "127.0.0.1:{port}": {{methods: [GET]}}\n'
                   f'irreversible:\n  - net: {{host: "127.0.0.1", method: DELETE}}\n    action: deny\n')
    org.chmod(0o644)
    attacker.stop()
    attacker.env["ENVGIT_ORG_POLICY"] = str(org)
    yield attacker, srv, port
    attacker.stop()
    srv.shutdown()
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("spelling", ["127.0.0.1", "localhost"])
def test_the_orgs_l7_and_irreversible_rules_hold_for_another_spelling(limited_service, spelling):
    """The org lets only GET reach 127.0.0.1:PORT (network.l7) and denies DELETE to 127.0.0.1
    (an irreversible net: rule). The project allows the service as SPELLING:PORT (its own
    spelling is the control). The step sends POST and DELETE to both spellings: the service
    must see GET only."""
    attacker, srv, port = limited_service
    attacker.write_policy(f'version: 1\nnetwork:\n  allow: ["{spelling}:{port}"]\n')
    r = attacker.run(
        f"curl -sS -m 5 http://{spelling}:{port}/; "
        + "".join(f"curl -sS -m 5 -X {m} -d x http://{h}:{port}/x; "
                  for m in ("POST", "DELETE") for h in (spelling, "127.0.0.1"))
        + "echo ran")
    assert "ran" in r.stdout, r.stdout + r.stderr
    assert "GET" in srv.seen, (srv.seen, r.stdout, r.stderr)       # the allowed method works
    assert set(srv.seen) == {"GET"}, (
        f"the org allows only GET to 127.0.0.1:{port} and denies DELETE; with the project "
        f"allowing {spelling}:{port} the service saw {srv.seen}")


# --- an IPv4 address the org denies, allowed as its IPv4-mapped IPv6 form ----------------------

@pytest.mark.parametrize("spelling", ["[::ffff:192.168.1.10]", "[::ffff:c0a8:10a]"])
def test_policy_check_refuses_an_org_denied_address_in_its_v4_mapped_form(tmp_path, spelling):
    """No second host here to connect to (only 127.0.0.1 in tests; the loopback case above is
    the behaviour): the oracle is `envgit policy check`'s exit status. The org denies
    192.168.1.10; `[::ffff:192.168.1.10]` is the same address to a dual-stack socket (the
    merge already canonicalises 3232235786 and IPv6 spellings, not this one)."""
    import subprocess

    from conftest import ENVGIT
    d = tempfile.mkdtemp(prefix="envgit-org-")
    os.chmod(d, 0o755)
    org = Path(d) / "policy.yaml"
    org.write_text('version: 1\nnetwork:\n  deny: ["192.168.1.10"]\n')
    org.chmod(0o644)
    proj = tmp_path / "p"
    proj.mkdir()
    env = {**os.environ, "ENVGIT_ORG_POLICY": str(org), "HOME": str(tmp_path)}
    subprocess.run([ENVGIT, "init"], cwd=proj, env=env, capture_output=True, check=True)
    try:
        ctl = subprocess.run([ENVGIT, "policy", "check"], cwd=proj, env=env, capture_output=True, text=True,
                             input="", timeout=60)
        (proj / "envgit.yaml").write_text('version: 1\nnetwork:\n  allow: ["3232235786"]\n')
        dec = subprocess.run([ENVGIT, "policy", "check"], cwd=proj, env=env, capture_output=True, text=True,
                             timeout=60)
        assert dec.returncode != 0, dec.stdout + dec.stderr        # control: refused
        (proj / "envgit.yaml").write_text(f'version: 1\nnetwork:\n  allow: ["{spelling}"]\n')
        r = subprocess.run([ENVGIT, "policy", "check"], cwd=proj, env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode != 0, (f"the org denies 192.168.1.10; a project allowing {spelling} "
                                   f"passes `envgit policy check` (control exit {ctl.returncode}): "
                                   + r.stdout + r.stderr)
    finally:
        subprocess.run([ENVGIT, "stop"], cwd=proj, env=env, capture_output=True)
        shutil.rmtree(d, ignore_errors=True)
