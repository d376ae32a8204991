"""git over SSH through the gate (issue 30, item 1), end to end: a real sshd on 127.0.0.1
(tests/kit/sshgit.py), the person's key in their ssh-agent and ~/.ssh outside every step, real
`envgit run` steps whose git reaches the server through envgit's `ssh` and the gate. The oracle
is what the remote holds (its refs read on the host), what git printed, and the step's record."""

import json
import shutil

import pytest

from conftest import CANARY
from kit.sshgit import POLICY, ssh_world  # noqa: F401  (the fixture `ssh`)
from test_grants import Person, deny_all, first_remembered

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

ASK_PUSH = "  - rule: git-push\n    action: ask\n"


def _of(reqs, service):
    return [q for q in reqs if q["method"] == service]


def test_fetch_over_ssh_works_and_is_recorded(ssh):
    before = ssh.refs()["refs/heads/main"]
    r = ssh.env.run("git fetch origin && git rev-parse origin/main")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == before
    fetch = _of(ssh.requests(), "git-upload-pack")
    assert len(fetch) == 1 and fetch[0]["scheme"] == "ssh" and fetch[0]["host"] == "gitserver"
    assert fetch[0]["decision"] == "allow" and fetch[0]["bytes_down"] > 0 and fetch[0]["status"] == 0
    assert fetch[0]["path"] == "/" + str(ssh.bare).lstrip("/")
    shown = ssh.env.envgit("show", "last", check=True).stdout
    assert "git-upload-pack" in shown and "gitserver" in shown


def test_a_port_given_to_ssh_is_judged_as_that_port_of_the_host(ssh):
    """`ssh -p N` (git's ssh://host:N/) reaches another port of an allowed host only when
    network.allow names host:N, as over HTTPS: the host alone stands for SSH's own port."""
    url = f"ssh://gitserver:{ssh.port}{ssh.bare}"
    r = ssh.env.run(f"git ls-remote {url}")
    assert r.returncode != 0 and "network.allow" in r.stderr, r.stdout + r.stderr
    refused = _of(ssh.requests(), "git-upload-pack")
    assert refused and refused[0]["decision"] == "deny" and refused[0]["port"] == ssh.port, refused
    ssh.env.write_policy(POLICY.format(extra="").replace("allow: [gitserver]",
                                                         f"allow: [gitserver, 'gitserver:{ssh.port}']"))
    r = ssh.env.run(f"git ls-remote {url}")
    assert r.returncode == 0 and "refs/heads/main" in r.stdout, r.stdout + r.stderr


def test_the_key_and_the_agent_socket_are_not_inside_while_fetch_works(ssh):
    key = ssh.key.read_text()
    r = ssh.env.run(f"git fetch origin && echo fetched; echo agent=$SSH_AUTH_SOCK; "
                    f"cat ~/.ssh/id_ed25519 {ssh.key} ~/.ssh/config; ls -a ~/.ssh; "
                    f"SSH_AUTH_SOCK={ssh.agent_sock} ssh-add -L; "
                    f"ls /proc/*/environ | xargs cat 2>/dev/null | tr '\\0' '\\n' | grep SSH_AUTH; true")
    out = r.stdout + r.stderr
    assert "fetched" in r.stdout, out
    assert "agent=\n" in r.stdout or r.stdout.rstrip().endswith("agent="), out
    assert CANARY not in out                        # ~/.ssh/id_ed25519's canary, the key's comment
    assert key.splitlines()[1] not in out            # the private key's own bytes
    assert str(ssh.agent_sock) not in r.stdout


def test_push_over_ssh_is_refused_per_ref_and_the_remote_is_unchanged(ssh):
    before = ssh.refs()
    ssh.commit()
    # a policy without the courtesy shell rule: the gate is what refuses
    r = ssh.env.envgit("run", "--", "git", "push", "origin", "main")
    assert r.returncode != 0
    assert "[remote rejected] main -> main (envgit: git push is irreversible" in r.stderr, r.stderr
    assert "hung up" not in r.stderr, r.stderr
    assert ssh.refs() == before
    push = _of(ssh.requests(), "git-receive-pack")
    assert len(push) == 1 and push[0]["decision"] == "deny" and push[0]["rule"] == "preset:default/git-push"
    assert [(x["ref"], x["action"]) for x in push[0]["refs"]] == [("refs/heads/main", "update")]
    # re-judged as the HTTPS push it was judged as: a candidate allowing pushes newly allows it
    cand = ssh.env.home / "candidate.yaml"
    cand.write_text((ssh.env.root / "envgit.yaml").read_text() + "  - rule: git-push\n    action: allow\n")
    replay = ssh.env.envgit("policy", "replay", str(cand), "--json")
    assert replay.returncode == 1, replay.stdout + replay.stderr


def test_a_grant_for_one_ref_over_ssh_does_not_update_another(ssh):
    ssh.policy(ASK_PUSH)
    ssh.commit()
    with Person(ssh.env, first_remembered()) as p:
        r = ssh.env.envgit("run", "--", "git", "push", "origin", "main")
    assert r.returncode == 0, r.stderr
    assert len(p.seen) == 1 and p.replies[0][1] == 0, p.replies
    grant = json.loads(p.replies[0][2])["grant"]
    assert grant["scope"]["refs"] == [{"ref": "refs/heads/main", "action": "update"}]
    assert grant["scope"]["scheme"] == "ssh"
    first = ssh.refs()["refs/heads/main"]
    head = ssh.commit(name="g.txt")
    with Person(ssh.env, deny_all) as p2:
        r = ssh.env.run("git push origin HEAD:refs/heads/feature; git push origin main")
    assert [q["refs"] for q in p2.seen] == [
        [{"ref": "refs/heads/feature", "old": "0" * 40, "new": head, "action": "create"}]], p2.seen
    assert "[remote rejected] HEAD -> feature" in r.stderr, r.stderr
    refs = ssh.refs()
    assert "refs/heads/feature" not in refs and refs["refs/heads/main"] == head != first
    push = _of(ssh.requests(), "git-receive-pack")
    assert [q["decision"] for q in push] == ["deny", "allow"]
    assert push[1]["answered_how"].startswith("grant ")


def _pkt(b: bytes) -> bytes:
    return b"%04x" % (len(b) + 4) + b


def test_the_gate_takes_git_services_with_one_path_only_and_requotes_it():
    from envgit.proxy.sshgit import Refused, parse_command, ssh_argv
    assert parse_command("git-upload-pack '/srv/app.git'") == ("git-upload-pack", "/srv/app.git")
    assert parse_command("git-receive-pack org/app.git") == ("git-receive-pack", "org/app.git")
    assert parse_command("git-upload-archive 'my repo.git'") == ("git-upload-archive", "my repo.git")
    for bad in ("touch /tmp/x", "git-upload-pack '/a'; touch x", "git-upload-pack '/a' '/b'",
                "git-upload-pack /a$(id)", "git-upload-pack '--upload-pack=touch x'",
                "git upload-pack '/a'", "git-upload-pack 'a'\\''b'", "git-upload-pack '/a\n'",
                "sh -c 'git-upload-pack /a'", "git-upload-pack"):
        with pytest.raises(Refused):
            parse_command(bad)
    t = {"host": "gitserver", "user": "git", "port": 2222, "service": "git-receive-pack",
         "path": "my repo.git", "protocol": None}
    argv = ssh_argv("/usr/bin/ssh", t, environ={})
    assert argv[-3:] == ["--", "gitserver", "git-receive-pack 'my repo.git'"]
    assert "BatchMode=yes" in argv and "ForwardAgent=no" in argv and "-T" in argv


def test_a_push_is_read_to_the_end_of_its_commands_and_options_before_the_pack():
    from envgit.proxy.sshpipes import section_end
    old, new = "1" * 40, "2" * 40
    cmd = f"{old} {new} refs/heads/main\0report-status push-options\n".encode()
    # a shallow line first: the capabilities are the first command's
    push = _pkt(b"shallow " + b"3" * 40 + b"\n") + _pkt(cmd) + b"0000" + _pkt(b"ci.skip\n") + b"0000"
    assert section_end(push + b"PACK") == len(push)
    assert section_end(push[:-4]) is None                 # the options not ended yet: read on
    plain = _pkt(cmd.replace(b" push-options", b"")) + b"0000"
    assert section_end(plain + _pkt(b"opt\n") + b"0000PACK") == len(plain)
    assert section_end(b"zz") is None and section_end(b"zzzz") == 0   # malformed: judged as is
