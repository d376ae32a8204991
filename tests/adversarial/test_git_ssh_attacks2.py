"""git over SSH through the gate (issue 30, item 1), attacked from inside steps, beyond
tests/adversarial/test_git_ssh_attacks.py: wedging or starving the daemon's side (endless or
trickled input, connections one step hoards or whose ends it hands the daemon, a host ssh that
fails first, a huge command list), pushing past a grant with pkt-line framing, and shell or
options in what reaches the remote. A real sshd on 127.0.0.1 (tests/kit/sshgit.py). The
oracles: the remote's refs and files a remote command would make, the daemon's own CPU time
(/proc) and journal size, and whether another step's git over ssh still gets an answer."""

import json
import os
import shlex
import shutil
import subprocess
import time

import pytest

from harness import every_case
from kit.sshgit import ssh_world  # noqa: F401  (the fixture `ssh`)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


def _daemon_pid(ssh) -> int:
    return json.loads(ssh.env.envgit("daemon", "status", check=True).stdout)["pid"]


def _cpu_s(pid) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _a_refused_push_from_an_endless_stdin_is_not_read_after_its_step(ssh):
    # /dev/zero as git's output: the refused push's "pack", which the gate reads and drops
    r = ssh.env.run(f"for i in 1 2 3; do ssh gitserver \"git-receive-pack '{ssh.bare}'\" < /dev/zero "
                    "> /dev/null; done; echo ran")
    assert "ran" in r.stdout, r.stdout + r.stderr
    assert [q["decision"] for q in ssh.requests()] == ["deny"] * 3
    pid = _daemon_pid(ssh)
    time.sleep(1)
    cpu = _cpu_s(pid)
    time.sleep(2)
    burnt = _cpu_s(pid) - cpu
    assert burnt < 1.0, f"the daemon spent {burnt:.2f} s of CPU in 2 s after the step ended"


TRICKLE = """import os, sys, time
os.write(1, b"0004" * 131072)              # half a MiB of empty pkt-lines, no flush
t0 = time.monotonic()
while time.monotonic() - t0 < 4:           # then four bytes at a time
    os.write(1, b"0004")
    time.sleep(0.005)
"""


def _a_command_list_sent_four_bytes_at_a_time_costs_the_gate_no_more_than_once(ssh):
    (ssh.env.root / "trickle.py").write_text(TRICKLE)
    pid = _daemon_pid(ssh)
    cpu = _cpu_s(pid)
    r = ssh.env.run(f"python3 trickle.py | ssh gitserver \"git-receive-pack '{ssh.bare}'\" > /dev/null; echo ran")
    burnt = _cpu_s(pid) - cpu
    assert "ran" in r.stdout, r.stdout + r.stderr
    assert [q["decision"] for q in ssh.requests()] == ["deny"]     # never ends: doubt
    print(f"daemon CPU for the step: {burnt:.2f} s")
    assert burnt < 2, f"the daemon spent {burnt:.2f} s of CPU reading a 4 s trickle"


HOLD = """import array, json, socket, sys, time
held = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/envgit/ssh.sock")
    held.append(s)                         # connected, and never a byte
open("held", "w").write(str(len(held)))
time.sleep(float(sys.argv[2]))
"""


def test_one_step_holding_connections_leaves_git_over_ssh_to_other_steps(ssh):
    from conftest import ENVGIT
    (ssh.env.root / "hold.py").write_text(HOLD)
    ssh.env.run("true")
    hog = subprocess.Popen([ENVGIT, "run", "--", "python3", "hold.py", "100", "25"], cwd=ssh.env.root,
                           env=ssh.env.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(200):
            if (ssh.env.root / "held").exists():
                break
            time.sleep(0.1)
        r = ssh.env.run("git ls-remote origin")
        assert "refs/heads/main" in r.stdout, r.stderr
    finally:
        hog.kill()
        hog.wait()


SELF_HELD = """import array, json, os, socket, sys, time
host, path, n, order = sys.argv[1:5]
body = json.dumps({"op": "git-ssh", "host": host, "command": f"git-receive-pack '{path}'"}).encode()
d = len(body).to_bytes(4, "big") + body
for _ in range(int(n)):
    r, w = os.pipe()
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/envgit/ssh.sock")
    # stdin: a pipe whose one writer goes to the daemon too; `order` puts it as stdout or as
    # ssh's stderr, whichever stays silent; the other is this very connection, so the daemon
    # holds the caller's end of it: nothing of the step is left to end them when it ends
    fds = {"r": r, "w": w, "s": s.fileno()}
    s.sendmsg([d[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fds[c] for c in order]))])
    s.sendall(d[4:])
    for fd in (r, w):
        os.close(fd)
    s.close()
time.sleep(2)                              # named by the gate (its pid namespace), then gone
print("sent")
"""


def test_connections_whose_ends_the_daemon_holds_end_with_their_step(ssh):
    (ssh.env.root / "selfheld.py").write_text(SELF_HELD)
    for _ in range(5):                          # more than the gate's connections, in steps of 16
        r = ssh.env.run(f"python3 selfheld.py gitserver '{ssh.bare}' 16 rsw")    # the server's ssh: silent
        assert "sent" in r.stdout, r.stderr
    time.sleep(1)
    r = ssh.env.run("git ls-remote origin")
    assert "refs/heads/main" in r.stdout, r.stderr


ZERO = "0" * 40


def _pkt(data: bytes) -> bytes:
    return b"%04x" % (len(data) + 4) + data


def _empty_pack() -> bytes:
    import hashlib
    import struct
    head = b"PACK" + struct.pack(">II", 2, 0)
    return head + hashlib.sha1(head).digest()


def test_a_push_granted_one_ref_carries_no_other_ref_in_its_framing(ssh):
    from test_git_ssh import ASK_PUSH
    from test_grants import Person, deny_all, first_remembered
    seed = ssh.refs()["refs/heads/main"]
    subprocess.run(["git", "--git-dir", str(ssh.bare), "update-ref", "refs/heads/topic", seed], check=True)
    ssh.policy(ASK_PUSH)
    ssh.commit()
    with Person(ssh.env, first_remembered()) as p:          # main's update granted, remembered
        assert ssh.env.run("git push -q origin main").returncode == 0
    assert p.replies and p.replies[0][1] == 0, p.replies
    before = ssh.refs()
    main = before["refs/heads/main"]
    granted = f"{main} {seed} refs/heads/main".encode()     # an update of main: covered
    smuggled = f"{seed} {ZERO} refs/heads/topic".encode()   # a delete of topic: not
    caps = b"\0report-status delete-refs"
    cert = (b"certificate version 0.1\npusher x 0 +0000\npushee gitserver\nnonce 1\n\n" +
            smuggled + b"\n")
    attempts = {
        "second-caps": _pkt(granted + caps + b"\n") + _pkt(smuggled + b"\0push-options\n") + b"0000",
        "delim": _pkt(granted + caps + b"\n") + b"0001" + _pkt(smuggled + b"\n") + b"0000",
        "shallow-after": _pkt(granted + caps + b"\n") + _pkt(f"shallow {seed}\n".encode()) +
        _pkt(smuggled + b"\n") + b"0000",
        "push-cert": _pkt(b"push-cert" + caps + b"\n") + _pkt(cert) + _pkt(b"push-cert-end\n") + b"0000",
        "upper-hex": _pkt(granted + caps + b"\n") + b"%04X" % (len(smuggled) + 5) + smuggled + b"\n0000",
    }
    for name, data in attempts.items():
        (ssh.env.root / f"{name}.bin").write_bytes(data + _empty_pack())
    (ssh.env.root / "control.bin").write_bytes(_pkt(granted + caps + b"\n") + b"0000" + _empty_pack())
    push = f"ssh gitserver \"git-receive-pack '{ssh.bare}'\""
    with Person(ssh.env, deny_all) as p2:
        r = ssh.env.run("; ".join(f"{push} < {name}.bin > {name}.out" for name in attempts) + "; true")
    assert ssh.refs() == before, r.stdout + r.stderr
    recs = [q for q in ssh.requests() if q["method"] == "git-receive-pack"]
    assert [q["decision"] for q in recs] == ["deny"] * len(attempts), recs
    # framing git's receive-pack reads as the gate does shows the person both refs; any other
    # is doubt, denied without a question (and recorded as denied, not as a question)
    assert [[(u["ref"], u["action"]) for u in q["refs"]] for q in p2.seen] == [
        [("refs/heads/main", "update"), ("refs/heads/topic", "delete")]], p2.seen
    assert all(q["reason"].endswith(("nobody can be asked about it", "not approved (envgit deny)"))
               for q in recs), [q["reason"] for q in recs]
    # the control: the granted update alone, sent the same way, is let through
    r = ssh.env.run(f"{push} < control.bin > control.out")
    assert ssh.refs() == {**before, "refs/heads/main": seed}, r.stderr


def test_a_step_over_its_share_of_connections_is_told_so(ssh):
    (ssh.env.root / "hold.py").write_text(HOLD)
    r = ssh.env.run("python3 hold.py 16 20 & while [ ! -e held ]; do sleep 0.1; done; "
                    "git ls-remote origin; kill $!")
    assert "envgit: ssh: this step already has 16 git-over-ssh connections open" in r.stderr, r.stderr
    r = ssh.env.run("git ls-remote origin")                  # its own again once they are gone
    assert "refs/heads/main" in r.stdout, r.stderr


TIMERFD = """import ctypes, os, struct, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.timerfd_create(1, 0)                 # CLOCK_MONOTONIC: readable again each nanosecond
spec = struct.pack("qqqq", 0, 1, 0, 1)
assert libc.timerfd_settime(fd, 0, spec, None) == 0
subprocess.run(["timeout", "4", "ssh", "gitserver", f"git-receive-pack '{sys.argv[1]}'"], stdin=fd,
               stdout=subprocess.DEVNULL)
print("ran")
"""


def _a_refused_push_from_a_stdin_of_tiny_reads_costs_the_gate_a_bounded_drain(ssh):
    # a timer as git's output: always readable, eight bytes a read, never at an end
    (ssh.env.root / "timer.py").write_text(TIMERFD)
    pid = _daemon_pid(ssh)
    cpu = _cpu_s(pid)
    r = ssh.env.run(f"python3 timer.py '{ssh.bare}'")
    burnt = _cpu_s(pid) - cpu
    assert "ran" in r.stdout, r.stdout + r.stderr
    assert [q["decision"] for q in ssh.requests()] == ["deny"]
    print(f"daemon CPU for the step: {burnt:.2f} s")
    assert burnt < 2.0, f"the daemon spent {burnt:.2f} s of CPU draining a timer for 4 s"



# The daemon's CPU over each case's own step (or the seconds after it); the first case also
# finds the daemon idle after a refused push, so a later case's window holds its own work only.
DAEMON_CPU = {
    "endless-stdin": _a_refused_push_from_an_endless_stdin_is_not_read_after_its_step,
    "four-bytes-at-a-time": _a_command_list_sent_four_bytes_at_a_time_costs_the_gate_no_more_than_once,
    "tiny-reads": _a_refused_push_from_a_stdin_of_tiny_reads_costs_the_gate_a_bounded_drain,
}


def test_a_refused_push_of_endless_trickled_or_tiny_reads_costs_the_daemon_bounded_cpu(ssh):
    """Each its own step in one ssh world: none changes the remote or the policy."""
    every_case(DAEMON_CPU, lambda case: DAEMON_CPU[case](ssh))

@pytest.mark.both_uids("the gate's threads, fds and the host's ssh are the daemon's, which runs as the person")
def test_the_gate_still_answers_after_steps_left_it_connections_it_holds_both_ends_of(attacker):
    # no server needed: the wedge is on the daemon's side, before the host's ssh matters
    attacker.write_policy("version: 1\nnetwork:\n  allow: [nohost.invalid]\n")
    (attacker.root / "selfheld.py").write_text(SELF_HELD)
    attacker.own(attacker.root / "selfheld.py")
    for _ in range(5):
        r = attacker.run("python3 selfheld.py nohost.invalid /srv/app.git 16 rws")   # its stdout: silent
        assert "sent" in r.stdout, r.stderr
    time.sleep(1)
    r = attacker.run("ssh nohost.invalid git-upload-pack /srv/app.git")
    assert "cannot reach the envgit gate" not in r.stderr, r.stderr
    assert "nohost.invalid" in r.stderr and r.returncode == 255, r.stderr    # the host's ssh, run


def _a_push_whose_ssh_fails_before_the_advertisement_ends_at_once(ssh, tmp_path):
    # the host's ssh is refused (no such user): git waits for the server's refs, the gate for
    # git's commands; neither comes, and the step used to hang with its connection held
    r = ssh.env.run(f"timeout 30 git push nosuchuser@gitserver:{ssh.bare} main; echo rc=$?")
    assert "rc=128" in r.stdout, r.stdout + r.stderr         # git's own failure, not timeout's 124
    assert "Permission denied" in r.stderr, r.stderr
    push = [q for q in ssh.requests() if q["method"] == "git-receive-pack"]
    assert [q["status"] for q in push] == [255] and push[0]["refs"] == [], push


def _a_refused_push_of_thousands_of_refs_costs_the_journal_a_small_record(ssh, tmp_path):
    main = ssh.refs()["refs/heads/main"]
    cmds = [_pkt(f"{main} {ZERO} refs/heads/t{i:05d}-{'x' * 40}\n".encode()) for i in range(6000)]
    cmds[0] = cmds[0][:-1] + b"\0report-status delete-refs\n"
    cmds[0] = b"%04x" % len(cmds[0]) + cmds[0][4:]
    (ssh.env.root / "many.bin").write_bytes(b"".join(cmds) + b"0000")
    journal = ssh.env.root / ".envgit"
    ssh.env.run("true")

    def size():
        return sum(p.stat().st_size for p in journal.glob("journal.sqlite*"))
    before = size()
    r = ssh.env.run(f"for i in 1 2 3; do ssh gitserver \"git-receive-pack '{ssh.bare}'\" < many.bin > /dev/null; done")
    push = [q for q in ssh.requests() if q["method"] == "git-receive-pack"]
    assert [q["decision"] for q in push] == ["deny"] * 3, r.stderr
    grown = size() - before
    assert grown < 600_000, f"the journal grew {grown} bytes for 3 refused pushes"
    assert push[0]["refs"][0]["ref"].startswith("refs/heads/t00000") and push[0]["refs_total"] == 6000


def _shell_in_a_quoted_repository_path_reaches_the_remote_as_one_literal_word(ssh, tmp_path):
    # the gate takes a quoted path with any character but a quote, `!` or a control character,
    # and sends it on: the remote's shell must read it as one literal word
    m = tmp_path / "made-by-remote-shell"
    paths = [f"/x$(touch {m}-1)", f"/x`touch {m}-2`", f"/x;touch {m}-3", f"/x & touch {m}-4",
             f"/x|touch {m}-5", f"/x > {m}-6"]
    # each quoted for the step's own shell, so that the remote's is the one tested
    script = "; ".join(f"ssh gitserver {shlex.quote('git-upload-pack ' + repr(p))} </dev/null" for p in paths)
    r = ssh.env.run(f"{script}; GIT_PROTOCOL='version=2;touch {m}-8' ssh gitserver "
                    f"\"git-upload-pack '/x'\" </dev/null; "
                    f"ssh -l '-oProxyCommand=touch {m}-9' gitserver \"git-upload-pack '/x'\"; "
                    f"ssh 'gitserver -oProxyCommand=touch {m}-10' \"git-upload-pack '/x'\"; true")
    assert not list(tmp_path.glob("made-by-remote-shell*")), r.stderr
    # each path reached git on the remote whole, and no more: "… does not appear to be a git repository"
    for p in paths:
        assert f"'{p}' does not appear to be a git repository" in r.stderr, (p, r.stderr)
    fetches = [q for q in ssh.requests() if q["method"] == "git-upload-pack"]
    assert sorted(q["path"] for q in fetches) == sorted([*paths, "/x"]), fetches


def _upload_archive_arguments_write_nothing_on_the_remote(ssh, tmp_path):
    m = tmp_path / "made-by-remote-archive"
    for i, args in enumerate(([f"--output={m}-1", "HEAD"], [f"--exec=touch {m}-2", "HEAD"],
                              [f"--remote=ext::sh -c touch% {m}-3", "HEAD"], ["--format=tar", "HEAD"])):
        stream = b"".join(_pkt(f"argument {a}\n".encode()) for a in args) + b"0000"
        (ssh.env.root / f"archive{i}.bin").write_bytes(stream)
    r = ssh.env.run("; ".join(f"ssh gitserver \"git-upload-archive '{ssh.bare}'\" < archive{i}.bin > archive{i}.out"
                              for i in range(4)) + "; true")
    assert not list(tmp_path.glob("made-by-remote-archive*")), r.stderr
    assert (ssh.env.root / "archive3.out").stat().st_size > 1024, r.stderr   # the plain one is served
    archives = [q for q in ssh.requests() if q["method"] == "git-upload-archive"]
    assert len(archives) == 4 and {q["decision"] for q in archives} == {"allow"}, archives


# None of these changes the remote, the policy or what the daemon holds (each step's requests
# are read from that step): one ssh world serves them all, each its own steps.
REMOTE_AND_JOURNAL = {
    "ssh-fails-before-the-advertisement": _a_push_whose_ssh_fails_before_the_advertisement_ends_at_once,
    "thousands-of-refs": _a_refused_push_of_thousands_of_refs_costs_the_journal_a_small_record,
    "shell-in-a-quoted-path": _shell_in_a_quoted_repository_path_reaches_the_remote_as_one_literal_word,
    "upload-archive-arguments": _upload_archive_arguments_write_nothing_on_the_remote,
}


def test_what_reaches_the_remote_is_what_was_sent_and_a_refusal_is_small_and_quick(ssh, tmp_path):
    """A push whose host ssh fails first ends at once; thousands of refused refs cost the
    journal a small record; shell or options in a repository path or in upload-archive's
    arguments reach the remote as literal words and make nothing there."""
    every_case(REMOTE_AND_JOURNAL, lambda case: REMOTE_AND_JOURNAL[case](ssh, tmp_path))
