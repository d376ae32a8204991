"""Signing at the gate: with `signing:` in the policy (and approved with `envgit trust`), a
step's `git commit -S` / `git tag -s` is signed by the gate with the person's SSH key on the
host (proxy/sshsign.py); the step never reads the key; only commit and tag payloads are signed;
each signature is recorded on its step with the object id it gives; `action: ask` asks first."""

import shutil

import pytest

from kit.person import answer_when_asked
from kit.signing import POLICY, git_outside, make_signer, signs

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None or shutil.which("socat") is None,
                                reason="ssh-keygen and socat are installed by dev/run")

@pytest.fixture
def signer(proj):
    return make_signer(proj)


def test_a_commit_and_a_tag_signed_in_a_step_verify_outside_and_are_recorded(signer):
    p = signer
    assert p.envgit("trust", "--yes").returncode == 0
    r = p.run("echo one > a && git add a && git commit -q -S -m 'first signed' && git tag -s v1 -m v1 "
              "&& git rev-parse HEAD && cat ~/.ssh/signing_key")
    assert r.returncode == 0, r.stdout + r.stderr
    head = git_outside(p, "rev-parse", "HEAD").stdout.strip()
    assert head in r.stdout
    verify = git_outside(p, "verify-commit", "HEAD")
    assert verify.returncode == 0 and 'Good "git" signature for me@example' in verify.stderr, verify.stderr
    assert git_outside(p, "verify-tag", "v1").returncode == 0
    # the private key never reached the step: its bytes are nowhere in what the step printed
    secret = p.key.read_text().splitlines()[1]
    assert secret not in r.stdout + r.stderr
    recs = signs(p, 1)
    assert [s["path"] for s in recs] == ["/commit", "/tag"], recs
    commit = recs[0]["signed"]
    assert commit["object"] == head and commit["subject"] == "first signed" and commit["author"] == "Me <me@example>"
    shown = p.envgit("show", "1", check=True).stdout
    assert f"signed    allow commit {head[:12]} 'first signed' by Me <me@example>" in shown, shown
    # what the signature fixes, whatever id the object ends up with: the tree, the parents, the tag's target
    assert commit["tree"] == git_outside(p, "rev-parse", "HEAD^{tree}").stdout.strip() and commit["parents"] == []
    assert recs[1]["signed"]["target"] == head, recs[1]
    tag_id = git_outside(p, "rev-parse", "v1").stdout.strip()
    assert recs[1]["signed"]["object"] == tag_id, (recs, tag_id)


@pytest.mark.parametrize("answer,signed", [("approve", True), ("deny", False)])
def test_action_ask_waits_for_the_person(signer, answer, signed):
    p = signer
    p.write_policy(POLICY + "  action: ask\n")
    assert p.envgit("trust", "--yes").returncode == 0

    t = answer_when_asked(p, answer)
    r = p.run("echo one > a && git add a && git commit -q -S -m asked")
    t.join()
    assert (r.returncode == 0) == signed, r.stderr
    assert (git_outside(p, "verify-commit", "HEAD").returncode == 0) == signed
    sign = signs(p, 1)[0]
    assert sign["decision"] == ("allow" if signed else "deny") and sign["answered_how"].startswith("envgit " + answer)


def test_the_signing_shim_leaves_other_ssh_keygen_uses_alone(signer):
    """Verification inside a step is the real ssh-keygen's (public data only)."""
    p = signer
    assert p.envgit("trust", "--yes").returncode == 0
    (p.root / "k.pub").write_text((p.home / ".ssh" / "signing_key.pub").read_text())
    r = p.run("/run/envgit/bin/ssh-keygen -l -f k.pub")
    assert r.returncode == 0 and "(ED25519)" in r.stdout, r.stdout + r.stderr
