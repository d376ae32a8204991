"""Signing at the gate attacked from inside a step, further (proxy/sshsign.py): a policy key
the step can write (inside the project) is not a key the person approved, whatever it holds
or points to when the step asks for a signature."""

import shutil
import subprocess

import pytest

from kit.signing import git_outside, make_signer, signs

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None or shutil.which("socat") is None,
                                reason="ssh-keygen and socat are installed by dev/run")


@pytest.mark.both_uids("the daemon signs as whoever runs envgit")
def test_a_signing_key_inside_the_project_signs_nothing(attacker):
    """The person approved a key kept in the project; a step replaces it by a link to their
    own key in ~/.ssh (or by any key of its own): the gate would sign with whatever the path
    names when asked, so a key the step can write is refused."""
    p = make_signer(attacker)               # ~/.ssh/signing_key: the person's own key
    kdir = p.root / "signer"
    kdir.mkdir()
    deploy = kdir / "deploy"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "deploy", "-f", str(deploy)], check=True)
    p.own(kdir, deploy, deploy.with_suffix(".pub"))
    p.write_policy(f'version: 1\nnetwork:\n  allow: ["example.test"]\nsigning:\n  key: {deploy}\n')
    assert p.envgit("trust", "--yes").returncode == 0
    swap = f"rm -f signer/deploy* && ln -s {p.key} signer/deploy && ln -s {p.key}.pub signer/deploy.pub"
    r = p.envgit("run", "--", "sh", "-c", swap + " && echo one > a && git add a && "
                 "git commit -q -S -m 'by the step'; echo rc=$?")
    assert "rc=0" not in r.stdout, r.stdout + r.stderr
    assert "inside the project" in r.stderr, r.stderr
    assert git_outside(p, "verify-commit", "HEAD").returncode != 0      # nothing signed with ~/.ssh's key
    assert signs(p, 1)[0]["decision"] == "deny"
