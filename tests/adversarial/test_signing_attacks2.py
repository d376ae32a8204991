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


@pytest.mark.both_uids("the daemon signs as whoever runs envgit")
def test_a_commit_with_a_second_author_header_is_not_signed(attacker):
    """git shows a commit's last `author` header (and fsck calls a second one an error): a
    commit with two would be recorded by its first while every log shows the other."""
    p = make_signer(attacker)
    assert p.envgit("trust", "--yes").returncode == 0
    tree = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
    r = p.envgit("run", "--", "sh", "-c",
                 f"printf 'tree {tree}\\nauthor Me <me@example> 1 +0000\\ncommitter Me <me@example> 1 +0000\\n"
                 "author Other <other@example> 1 +0000\\n\\nharmless\\n' > c && "
                 "/run/envgit/bin/ssh-keygen -Y sign -n git -f x c; echo rc=$?")
    assert "rc=1" in r.stdout and "rc=0" not in r.stdout, r.stdout + r.stderr
    assert not (p.root / "c.sig").exists()
    assert [s["decision"] for s in signs(p, 1)] == ["deny"]


@pytest.mark.both_uids("the daemon signs as whoever runs envgit")
def test_the_recorded_subject_is_the_one_git_shows(attacker):
    """git's subject is the message's first paragraph, its lines joined: a record of the
    first line alone hides the rest of it (and a terminal escape in it rewrites what
    `envgit show` prints)."""
    p = make_signer(attacker)
    assert p.envgit("trust", "--yes").returncode == 0
    r = p.envgit("run", "--", "sh", "-c",
                 "printf 'Fix a typo\\nand drop the users table\\033[2K\\n\\nbody\\n' > m && "
                 "echo one > a && git add a && git commit -q -S -F m")
    assert r.returncode == 0, r.stdout + r.stderr
    shown = git_outside(p, "log", "-1", "--format=%s").stdout.strip()
    rec = signs(p, 1)[0]["signed"]["subject"]
    assert "drop the users table" in rec and "\033" not in rec, rec
    assert rec == shown.replace("\033", "\\x1b"), (rec, shown)


@pytest.mark.both_uids("the daemon signs as whoever runs envgit")
def test_a_commit_in_another_encoding_is_not_signed(attacker):
    """git shows a message in the encoding its `encoding` header names (re-encoded to UTF-8):
    a record read as UTF-8 would show other text than every log does."""
    p = make_signer(attacker)
    assert p.envgit("trust", "--yes").returncode == 0
    r = p.envgit("run", "--", "sh", "-c",
                 "printf 'Fix \\341\\342\\n' > m && echo one > a && git add a && "
                 "git -c i18n.commitEncoding=ISO-8859-7 commit -q -S -F m; echo rc=$?")
    assert "rc=0" not in r.stdout and "encoding ISO-8859-7" in r.stderr, r.stdout + r.stderr
    assert git_outside(p, "rev-parse", "-q", "--verify", "HEAD").returncode != 0
    assert [s["decision"] for s in signs(p, 1)] == ["deny"]
