"""Signing at the gate: with `signing:` in the policy (and approved with `envgit trust`), a
step's `git commit -S` / `git tag -s` is signed by the gate with the person's SSH key on the
host (proxy/sshsign.py); the step never reads the key; only commit and tag payloads are signed;
each signature is recorded on its step with the object id it gives; `action: ask` asks first."""

import json
import shutil
import subprocess
import threading
import time

import pytest

from conftest import CANARY

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None or shutil.which("socat") is None,
                                reason="ssh-keygen and socat are installed by dev/run")

POLICY = ('version: 1\nnetwork:\n  allow: ["example.test"]\n'
          'signing:\n  key: ~/.ssh/signing_key\n')


@pytest.fixture
def signer(proj):
    key = proj.home / ".ssh" / "signing_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{CANARY}@example", "-f", str(key)],
                   check=True)
    for k, v in (("user.email", "me@example"), ("user.name", "Me")):
        subprocess.run(["git", "-C", str(proj.root), "config", k, v], check=True)
    allowed = proj.home / "allowed_signers"
    allowed.write_text(f"me@example {(proj.home / '.ssh' / 'signing_key.pub').read_text()}")
    proj.write_policy(POLICY)
    proj.key, proj.allowed = key, allowed
    return proj


def _git(proj, *args):
    return subprocess.run(["git", "-C", str(proj.root), "-c", f"gpg.ssh.allowedSignersFile={proj.allowed}",
                           *args], capture_output=True, text=True)


def _signs(proj, step):
    s = json.loads(proj.envgit("show", str(step), "--json", check=True).stdout)
    return [r for r in s["requests"] if r.get("method") == "sign"]


def test_a_commit_and_a_tag_signed_in_a_step_verify_outside_and_are_recorded(signer):
    p = signer
    assert p.envgit("trust", "--yes").returncode == 0
    r = p.run("echo one > a && git add a && git commit -q -S -m 'first signed' && git tag -s v1 -m v1 "
              "&& git rev-parse HEAD && cat ~/.ssh/signing_key")
    assert r.returncode == 0, r.stdout + r.stderr
    head = _git(p, "rev-parse", "HEAD").stdout.strip()
    assert head in r.stdout
    verify = _git(p, "verify-commit", "HEAD")
    assert verify.returncode == 0 and 'Good "git" signature for me@example' in verify.stderr, verify.stderr
    assert _git(p, "verify-tag", "v1").returncode == 0
    # the private key never reached the step: its bytes are nowhere in what the step printed
    secret = p.key.read_text().splitlines()[1]
    assert secret not in r.stdout + r.stderr
    signs = _signs(p, 1)
    assert [s["path"] for s in signs] == ["/commit", "/tag"], signs
    commit = signs[0]["signed"]
    assert commit["object"] == head and commit["subject"] == "first signed" and commit["author"] == "Me <me@example>"
    tag_id = _git(p, "rev-parse", "v1").stdout.strip()
    assert signs[1]["signed"]["object"] == tag_id, (signs, tag_id)


def test_signing_waits_for_the_persons_trust(signer):
    p = signer
    r = p.run("echo one > a && git add a && git commit -q -S -m unsigned")
    assert r.returncode != 0 and "envgit trust" in r.stderr, r.stderr
    assert _git(p, "rev-parse", "-q", "--verify", "HEAD").returncode != 0      # no commit made
    assert _signs(p, 1)[0]["decision"] == "deny"


def test_only_a_commit_or_a_tag_in_gits_namespace_is_signed(signer):
    """The signing program called by hand (and the socket spoken to raw) with what is not a
    commit: a file, another namespace, a commit that already carries a signature."""
    p = signer
    assert p.envgit("trust", "--yes").returncode == 0
    tree = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
    commit = f"tree {tree}\nauthor A <a@x> 1 +0000\ncommitter A <a@x> 1 +0000\n\nmsg\n"
    signed = commit.replace("\n\n", "\ngpgsig -----BEGIN SSH SIGNATURE-----\n x\n\n", 1)
    (p.root / "plain.txt").write_text("a login challenge\n")
    (p.root / "c1").write_text(commit)
    (p.root / "c2").write_text(signed)
    raw = ("import base64,json,socket,sys\n"
           "s=socket.socket(socket.AF_UNIX); s.connect('/run/envgit/ssh.sock')\n"
           "b=json.dumps({'op':'sign','namespace':'git','payload':base64.b64encode(b'hello').decode()}).encode()\n"
           "s.sendall(len(b).to_bytes(4,'big')+b); n=int.from_bytes(s.recv(4),'big'); print(s.recv(n).decode())\n")
    r = p.run("k=/run/envgit/bin/ssh-keygen; "
              "$k -Y sign -n git -f x plain.txt; echo rc=$?; "
              "$k -Y sign -n file -f x c1; echo rc=$?; "
              "$k -Y sign -n git -f x c2; echo rc=$?; "
              f"python3 -c \"{raw}\"; ls *.sig 2>/dev/null; echo end")
    assert r.stdout.count("rc=1") == 3, r.stdout + r.stderr
    assert "not a commit or tag" in r.stderr and "only git's namespace" in r.stderr, r.stderr
    assert "denied sign" not in r.stderr, r.stderr       # said once, by the signing program
    assert "no signature yet" in r.stderr and '"error"' in r.stdout and ".sig" not in r.stdout, r.stdout
    signs = _signs(p, 1)
    assert len(signs) == 4 and all(s["decision"] == "deny" for s in signs), signs
    assert not list(p.root.glob("*.sig"))


@pytest.mark.parametrize("answer,signed", [("approve", True), ("deny", False)])
def test_action_ask_waits_for_the_person(signer, answer, signed):
    p = signer
    p.write_policy(POLICY + "  action: ask\n")
    assert p.envgit("trust", "--yes").returncode == 0

    def person():
        end = time.monotonic() + 30
        while time.monotonic() < end:
            asks = json.loads(p.envgit("pending", "--json").stdout or "[]")
            if asks:
                p.envgit(answer, str(asks[0]["id"]))
                return
            time.sleep(0.1)
    t = threading.Thread(target=person)
    t.start()
    r = p.run("echo one > a && git add a && git commit -q -S -m asked")
    t.join()
    assert (r.returncode == 0) == signed, r.stderr
    assert (_git(p, "verify-commit", "HEAD").returncode == 0) == signed
    sign = _signs(p, 1)[0]
    assert sign["decision"] == ("allow" if signed else "deny") and sign["answered_how"].startswith("envgit " + answer)


def test_the_signing_shim_leaves_other_ssh_keygen_uses_alone(signer):
    """Verification inside a step is the real ssh-keygen's (public data only)."""
    p = signer
    assert p.envgit("trust", "--yes").returncode == 0
    (p.root / "k.pub").write_text((p.home / ".ssh" / "signing_key.pub").read_text())
    r = p.run("/run/envgit/bin/ssh-keygen -l -f k.pub")
    assert r.returncode == 0 and "(ED25519)" in r.stdout, r.stdout + r.stderr
