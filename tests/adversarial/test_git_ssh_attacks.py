"""Pushing over SSH past the gate (issue 30, item 1): a real sshd on 127.0.0.1 with the
person's key outside every step (tests/kit/sshgit.py); each attack is a step that tries to
change the remote, or run something else there, through envgit's `ssh`. The oracle is the
remote itself (its refs, and a file a remote command would have made, read on the host), with
the gate's own refusal (git's `[remote rejected]`, report-status `ng` lines, one `envgit:` line)
and the step's record: a refusal by a missing network would carry neither."""

import json
import shutil

import pytest

from kit.sshgit import ssh_world  # noqa: F401  (the fixture `ssh`)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

ZERO = "0" * 40
SHELL_RULE = "shell:\n  - deny: [\"git push\"]\n"


def _pkt(text: bytes) -> bytes:
    return b"%04x" % (len(text) + 4) + text


def _topic(ssh) -> str:
    """A second branch on the remote, made on the host: what a delete would take."""
    main = ssh.refs()["refs/heads/main"]
    import subprocess
    subprocess.run(["git", "--git-dir", str(ssh.bare), "update-ref", "refs/heads/topic", main], check=True)
    return main


RAW_FRAME = """import array, json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect("/run/envgit/ssh.sock")
b = open(sys.argv[1], "rb").read()
d = len(b).to_bytes(4, "big") + b
s.sendmsg([d[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
s.sendall(d[4:])
print(s.recv(65536)[4:].decode())
"""


def _pushes(ssh):
    return [q for q in ssh.requests() if q["method"] == "git-receive-pack"]


def test_a_hidden_push_over_ssh_is_refused(ssh):
    ssh.policy(SHELL_RULE)                       # the courtesy rule does not see `$g push`
    before = ssh.refs()
    ssh.commit()
    r = ssh.env.run("g=git; $g push origin main")
    assert "[remote rejected] main -> main (envgit: git push is irreversible" in r.stderr, r.stderr
    assert ssh.refs() == before
    push = _pushes(ssh)
    assert [(q["decision"], q["refs"][0]["action"]) for q in push] == [("deny", "update")]


def test_a_force_push_over_ssh_is_refused(ssh):
    before = ssh.refs()
    # history that does not descend from the remote's main, pushed over it
    r = ssh.env.run("git checkout -q --orphan fresh && git commit -q -m orphan && "
                    "git push -f origin fresh:main")
    assert "[remote rejected] fresh -> main (envgit:" in r.stderr, r.stderr
    assert ssh.refs() == before
    push = _pushes(ssh)
    assert push and push[0]["decision"] == "deny" and push[0]["refs"][0]["old"] == before["refs/heads/main"]


def test_a_ref_delete_over_ssh_is_refused(ssh):
    _topic(ssh)
    before = ssh.refs()
    r = ssh.env.run("git fetch -q origin && git push origin --delete topic")
    assert "[remote rejected] topic (envgit:" in r.stderr, r.stderr
    assert ssh.refs() == before
    assert [q["refs"][0]["action"] for q in _pushes(ssh)] == ["delete"]


def test_raw_receive_pack_with_hand_made_pkt_lines_is_refused(ssh):
    main = _topic(ssh)
    before = ssh.refs()
    # a delete needs no pack: let through, the server would act on these bytes alone
    cmds = _pkt(f"{main} {ZERO} refs/heads/topic\0report-status delete-refs\n".encode()) + b"0000"
    (ssh.env.root / "cmds.bin").write_bytes(cmds)
    # and one whose command list never ends (cut off: doubt, never forwarded)
    (ssh.env.root / "cut.bin").write_bytes(_pkt(f"{main} {ZERO} refs/heads/main\0report-status\n".encode()))
    r = ssh.env.run(f"ssh gitserver \"git-receive-pack '{ssh.bare}'\" < cmds.bin; echo; "
                    f"ssh -p {ssh.port} gitserver git-receive-pack {ssh.bare} < cut.bin; echo")
    assert "ng refs/heads/topic envgit: git push is irreversible" in r.stdout, r.stdout + r.stderr
    assert ssh.refs() == before
    push = _pushes(ssh)
    assert [q["decision"] for q in push] == ["deny", "deny"], push
    assert push[0]["refs"] == [{"ref": "refs/heads/topic", "old": main, "new": ZERO, "action": "delete"}]


def test_a_non_git_remote_command_is_refused(ssh, tmp_path):
    made = tmp_path / "made-by-remote"
    # the shim bypassed: frames of the step's own making on the gate's socket
    for name, frame in (("forged.json", {"op": "git-ssh", "host": "gitserver", "command": f"touch {made}-4"}),
                        ("hostile.json", {"op": "git-ssh", "host": f"-oProxyCommand=touch {made}-5",
                                          "command": f"git-upload-pack '{ssh.bare}'"})):
        (ssh.env.root / name).write_text(json.dumps(frame))
    (ssh.env.root / "raw.py").write_text(RAW_FRAME)
    r = ssh.env.run(
        f"ssh gitserver touch {made}-1; "
        f"ssh gitserver \"git-upload-pack '{ssh.bare}'; touch {made}-2\"; "
        f"ssh -o 'ProxyCommand=touch {made}-3' gitserver git-upload-pack {ssh.bare}; "
        "python3 raw.py forged.json; python3 raw.py hostile.json; true")
    assert not list(tmp_path.glob("made-by-remote*"))
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith(("envgit: ssh", '{"error"'))]
    assert len([x for x in lines if "the remote command" in x]) == 3, r.stdout + r.stderr
    assert any("-o ProxyCommand" in x and "is not carried" in x for x in lines), lines
    assert any("is not a host name" in x for x in lines), lines
    assert "git-shell" not in r.stderr                  # refused here, never sent to the server
    # each refusal at the gate is on the step's record (the -o one never left the shim)
    assert [(q["decision"], q["rule"]) for q in ssh.requests()] == [("deny", "builtin:ssh-command")] * 4


def test_a_process_outside_any_step_gets_nothing_from_the_ssh_socket(ssh):
    import socket
    import subprocess
    ssh.env.run("true")                                  # the gate and its ssh socket are up
    sock = ssh.env.root / ".envgit" / "net" / "ssh.sock"
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(sock))
    body = json.dumps({"op": "git-ssh", "host": "gitserver", "command": f"git-upload-pack '{ssh.bare}'"}).encode()
    with s:
        try:
            s.sendall(len(body).to_bytes(4, "big") + body)
        except BrokenPipeError:     # refused before a byte is read (sshgit.py _take): the
            pass                    # reply may be written and the socket closed before this
        reply = json.loads(s.recv(65536)[4:])
    assert "in no running step" in reply["error"], reply
    assert subprocess.run(["true"]).returncode == 0
