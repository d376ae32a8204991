"""Issue 16: a step must not be able to change the organisation policy or make envgit ignore
it. From inside a step (as root, and as an unprivileged user where the uid matters) it
rewrites, deletes and symlinks the org file's path, plants /etc/envgit/policy.yaml, sets
$ENVGIT_ORG_POLICY to a permissive file it wrote into the project, and plants that file for
the person. The oracle: the canary in a project file the organisation denies never shows, in
this step or the next."""

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import CANARY

pytestmark = pytest.mark.skipif(os.path.lexists("/etc/envgit/policy.yaml") or os.geteuid() != 0,
                                reason="needs root (the org file must be root's) and no real "
                                       "/etc/envgit/policy.yaml")

ORG = 'version: 1\nfilesystem:\n  deny_read:\n    - "**/*.key"\n'


@pytest.fixture
def org(attacker):
    d = tempfile.mkdtemp(prefix="envgit-org-")
    os.chmod(d, 0o755)
    p = Path(d) / "policy.yaml"
    p.write_text(ORG)
    p.chmod(0o644)
    attacker.stop()
    attacker.env["ENVGIT_ORG_POLICY"] = str(p)
    (attacker.root / "secret.key").write_text(CANARY + "\n")
    attacker.own(attacker.root / "secret.key")
    yield p
    attacker.stop()
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.both_uids("the organisation file is trusted by its owner (root or the uid running envgit, "
                       "policy/org.py), and a root step could write /etc and the file itself but for the view, a "
                       "non-root one only its own files: neither may rewrite, hide or replace it")
def test_a_step_cannot_rewrite_or_hide_the_org_policy(attacker, org):
    before = hashlib.sha256(org.read_bytes()).hexdigest()
    script = f"""
        printf 'version: 1\\n' > evil.yaml
        printf 'version: 1\\n' > {org} 2>/dev/null
        rm -f {org} 2>/dev/null
        ln -sf "$PWD/evil.yaml" {org} 2>/dev/null
        mkdir -p /etc/envgit 2>/dev/null && printf 'version: 1\\n' > /etc/envgit/policy.yaml 2>/dev/null
        export ENVGIT_ORG_POLICY="$PWD/evil.yaml"
        cat secret.key 2>/dev/null
        sh -c 'cat secret.key' 2>/dev/null
        echo attempted
    """
    r = attacker.run(script)
    assert "attempted" in r.stdout, r.stdout + r.stderr
    assert CANARY not in r.stdout + r.stderr
    assert hashlib.sha256(org.read_bytes()).hexdigest() == before and not org.is_symlink()
    assert not os.path.lexists("/etc/envgit/policy.yaml")
    # the next step, same daemon: still under the organisation's policy
    r = attacker.run("cat secret.key; echo next")
    assert "next" in r.stdout and CANARY not in r.stdout + r.stderr, r.stdout
    # and the file the step planted is refused even if the person were led to name it
    r = attacker.envgit("policy", "check", env={"ENVGIT_ORG_POLICY": str(attacker.root / "evil.yaml")})
    assert r.returncode != 0, r.stdout
    assert ("inside the project" in r.stderr) or ("owned by uid" in r.stderr), r.stderr
    # with the daemon restarted by the person, the organisation still binds
    attacker.stop()
    r = attacker.run("cat secret.key; echo restarted")
    assert "restarted" in r.stdout and CANARY not in r.stdout + r.stderr, r.stdout


@pytest.mark.both_uids("envgit.yaml is kept read-only by a bind in the step's view: as a non-root user bwrap builds "
                       "it in a user namespace, where DAC lets the person write their own file")
def test_a_step_cannot_loosen_through_the_project_policy(attacker, org):
    """envgit.yaml is read-only inside (protected); and had the person accepted a loosening
    edit, every step is refused rather than the organisation quietly losing."""
    r = attacker.run("printf 'version: 1\\nfilesystem:\\n  allow_read: [secret.key]\\n' > envgit.yaml; "
                     "cat secret.key; echo tried")
    assert CANARY not in r.stdout + r.stderr
    attacker.write_policy("version: 1\nfilesystem:\n  allow_read: [secret.key]\n")
    r = attacker.run("cat secret.key; echo ran")
    assert "ran" not in r.stdout and CANARY not in r.stdout + r.stderr, r.stdout
    assert "envgit.yaml:3:" in r.stderr and f"{org}:4" in r.stderr, r.stderr


def test_allow_write_cannot_open_the_org_policy_to_a_step(attacker, org):
    """A project policy that binds the org file's directory (or one above it) writable would
    let a step as root rewrite the organisation's rules: refused, naming the line; the org
    file is untouched."""
    before = org.read_bytes()
    up = os.path.relpath(org.parent, attacker.root)           # ../../.. out of the project
    for entry in (str(org.parent), str(org.parent.parent), "/", up):
        attacker.write_policy(f'version: 1\nfilesystem:\n  allow_write: [".", "{entry}"]\n')
        r = attacker.run(f"printf 'version: 1\\n' > {org}; cat secret.key; echo ran")
        assert "ran" not in r.stdout and CANARY not in r.stdout + r.stderr, (entry, r.stdout)
        assert "envgit.yaml:3:" in r.stderr and "holds the organisation policy" in r.stderr, r.stderr
    assert org.read_bytes() == before
