"""Signing at the gate attacked from inside a step, as root and as an unprivileged user: the
person's key signs nothing before they trust it, and nothing but a commit or a tag in git's
namespace (proxy/sshsign.py): not a file, another namespace, an already signed commit, or a
request made to the gate's socket by hand."""

import shutil

import pytest

from kit.signing import git_outside, make_signer, signs

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None or shutil.which("socat") is None,
                                reason="ssh-keygen and socat are installed by dev/run")


@pytest.mark.both_uids("the daemon signs as whoever runs envgit")
def test_signing_waits_for_the_persons_trust(attacker):
    p = make_signer(attacker)
    r = p.envgit("run", "--", "sh", "-c", "echo one > a && git add a && git commit -q -S -m unsigned")
    assert r.returncode != 0 and "envgit trust" in r.stderr, r.stderr
    assert git_outside(p, "rev-parse", "-q", "--verify", "HEAD").returncode != 0      # no commit made
    assert signs(p, 1)[0]["decision"] == "deny"


@pytest.mark.both_uids("the daemon signs as whoever runs envgit")
def test_only_a_commit_or_a_tag_in_gits_namespace_is_signed(attacker):
    """The signing program called by hand (and the socket spoken to raw) with what is not a
    commit: a file, another namespace, a commit that already carries a signature."""
    p = make_signer(attacker)
    assert p.envgit("trust", "--yes").returncode == 0
    tree = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
    commit = f"tree {tree}\nauthor A <a@x> 1 +0000\ncommitter A <a@x> 1 +0000\n\nmsg\n"
    signed = commit.replace("\n\n", "\ngpgsig -----BEGIN SSH SIGNATURE-----\n x\n\n", 1)
    (p.root / "plain.txt").write_text("a login challenge\n")
    (p.root / "c1").write_text(commit)
    (p.root / "c2").write_text(signed)
    p.own(p.root / "plain.txt", p.root / "c1", p.root / "c2")
    raw = ("import base64,json,socket,sys\n"
           "s=socket.socket(socket.AF_UNIX); s.connect('/run/envgit/ssh.sock')\n"
           "b=json.dumps({'op':'sign','namespace':'git','payload':base64.b64encode(b'hello').decode()}).encode()\n"
           "s.sendall(len(b).to_bytes(4,'big')+b); n=int.from_bytes(s.recv(4),'big'); print(s.recv(n).decode())\n")
    r = p.envgit("run", "--", "sh", "-c", "k=/run/envgit/bin/ssh-keygen; "
                 "$k -Y sign -n git -f x plain.txt; echo rc=$?; "
                 "$k -Y sign -n file -f x c1; echo rc=$?; "
                 "$k -Y sign -n git -f x c2; echo rc=$?; "
                 f"python3 -c \"{raw}\"; ls *.sig 2>/dev/null; echo end")
    assert r.stdout.count("rc=1") == 3, r.stdout + r.stderr
    assert "not a commit or tag" in r.stderr and "only git's namespace" in r.stderr, r.stderr
    assert "denied sign" not in r.stderr, r.stderr       # said once, by the signing program
    assert "no signature yet" in r.stderr and '"error"' in r.stdout and ".sig" not in r.stdout, r.stdout
    recs = signs(p, 1)
    assert len(recs) == 4 and all(s["decision"] == "deny" for s in recs), recs
    assert not list(p.root.glob("*.sig"))
