"""Real steps (real `envgit run`, bwrap, the session daemon) under an organisation policy: what
the organisation closes stays closed, a loosening project runs nothing, and the daemon picks
up an edit of the organisation's file. (The network gate under it: adversarial/
test_org_policy_gate.py.)"""

import os
import shutil

import pytest

from conftest import CANARY, ENVGIT
from envgit.policy.org import ORG_POLICY_ENV
from ptydrive import Term, exit_code
from test_org_policy import org_file

pytestmark = pytest.mark.skipif(os.path.lexists("/etc/envgit/policy.yaml") or os.geteuid() != 0,
                                reason="needs root (the org file must be root's) and no real "
                                       "/etc/envgit/policy.yaml")

ORG = "version: 1\nfilesystem:\n  deny_read:\n    - \"**/*.key\"\n"


@pytest.fixture
def org_proj(proj):
    (proj.root / "deploy").mkdir()
    (proj.root / "deploy" / "prod.key").write_text(CANARY + "\n")
    p = org_file(ORG)
    proj.env[ORG_POLICY_ENV] = p
    yield proj, p
    proj.stop()
    shutil.rmtree(os.path.dirname(p), ignore_errors=True)


def test_a_path_the_org_denies_is_unreadable_in_a_step(org_proj):
    proj, _ = org_proj
    r = proj.run("cat deploy/prod.key; echo rc=$?")
    assert CANARY not in r.stdout + r.stderr, r.stdout
    # it reads as its placeholder, naming the organisation's entry and file:line, and is said
    assert "is hidden from this sandbox by filesystem.deny_read '**/*.key'" in r.stdout, r.stdout
    assert "deploy/prod.key is hidden from steps" in r.stderr, r.stderr
    # the control: the same project without the organisation's policy reads it
    proj.stop()
    del proj.env[ORG_POLICY_ENV]
    r = proj.run("cat deploy/prod.key")
    assert CANARY in r.stdout, r.stdout + r.stderr


def test_a_project_that_tries_to_pass_it_runs_nothing(org_proj):
    proj, org = org_proj
    proj.write_policy("version: 1\nfilesystem:\n  allow_read:\n    - deploy/prod.key\n")
    with Term([ENVGIT, "run", "--", "sh", "-c", "touch ran; cat deploy/prod.key"], proj.root,
              proj.env) as t:
        status = t.wait()
    text = t.text
    assert exit_code(status) == 125, (status, text)        # as every other policy error
    (line,) = [ln for ln in text.replace("\r", "").splitlines() if ln.startswith("envgit:")]
    assert "envgit.yaml:4:" in line and f"which {org}:4 denies" in line, line
    assert CANARY not in text and not (proj.root / "ran").exists()


def test_the_daemon_rereads_an_edited_org_policy(org_proj):
    proj, org = org_proj
    with open(org, "w") as f:
        f.write("version: 1\n")
    r = proj.run("cat deploy/prod.key")
    assert CANARY in r.stdout, r.stdout + r.stderr
    with open(org, "w") as f:                       # the organisation tightens; same daemon
        f.write(ORG)
    r = proj.run("cat deploy/prod.key; echo done")
    assert "done" in r.stdout and CANARY not in r.stdout, r.stdout
    os.chmod(org, 0o666)                            # now anyone could rewrite it: refused
    r = proj.run("echo should-not-run")
    assert r.returncode == 125 and "should-not-run" not in r.stdout, r.stdout + r.stderr
    assert "writable by everyone" in r.stderr, r.stderr
