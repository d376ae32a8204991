"""Red team 16: the organisation's `mcp.rules` name servers by the name a policy gives them
(`{server: corpus, tool: "delete_*", action: deny}`), and the project chooses its own servers'
names. A project that may not redefine the org's server `corpus` defines `corpus2`, the same
upstream (the same command and arguments), and calls `corpus2.delete_file`: the org's deny
never matches. The merge (policy/org.py `mcp`) checks only that the name is new.

Driven through the real `envgit mcp` (stdio, the SDK's client) with the real upstream
tests/mcp_fixture_server.py; the oracle is the corpus file the denied tool deletes."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from mcp_fixture_server import make_corpus
from test_mcp_server import FIXTURE, execute, session, text_of

pytestmark = pytest.mark.skipif(os.path.lexists("/etc/envgit/policy.yaml") or os.geteuid() != 0,
                                reason="needs root (the org file must be root's) and no real "
                                       "/etc/envgit/policy.yaml")


@pytest.fixture
def org_mcp(proj):
    proj.corpus = make_corpus(proj.home.parent)
    d = tempfile.mkdtemp(prefix="envgit-org-")
    os.chmod(d, 0o755)
    org = Path(d) / "policy.yaml"
    org.write_text(f"""version: 1
mcp:
  servers:
    corpus:
      command: {sys.executable}
      args: [{FIXTURE}, {proj.corpus}]
  rules:
    - {{server: corpus, tool: "delete_*", action: deny}}
""")
    org.chmod(0o644)
    proj.stop()
    proj.env["ENVGIT_ORG_POLICY"] = str(org)
    yield proj
    proj.stop()
    shutil.rmtree(d, ignore_errors=True)


def test_the_orgs_mcp_deny_holds_for_the_same_server_under_another_name(org_mcp):
    proj = org_mcp
    victim = proj.corpus / "src" / "file00.js"

    async def via_org_name(client):
        return await execute(client, "await corpus.delete_file({path: 'src/file00.js'})")
    r = session(proj, via_org_name)
    assert r.is_error and "refused" in text_of(r), text_of(r)     # control: the org's name is denied
    assert victim.exists()

    with open(proj.root / "envgit.yaml", "a") as f:
        f.write(f"""
mcp:
  servers:
    corpus2:
      command: {sys.executable}
      args: [{FIXTURE}, {proj.corpus}]
""")
    proj.envgit("trust", "--yes", check=True)     # the project's server is a host command
    proj.stop()

    async def via_alias(client):
        return await execute(client, "await corpus2.delete_file({path: 'src/file00.js'})")
    r = session(proj, via_alias)
    assert victim.exists(), ("the org denies delete_* on the corpus server; the project named the "
                             "same server corpus2 and deleted src/file00.js: " + text_of(r)[:300])
