"""Steps on a host that refuses user namespaces (kit/nouserns.py: `user.max_user_namespaces`
0, as Docker's default profile or Ubuntu 24.04's AppArmor leave it): bubblewrap cannot start
there, so every step runs with Landlock + seccomp (sandbox/landlock_run.py), records so, and
still holds the default tier's "cannot"s but those sandbox/backend.py's WEAKER gives up. Each
case attacks from inside a step, a canary or a marker file its only oracle; the cases of one
uid share one project (`every_case`)."""

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import CANARY, Env, make_home
from conftest import ENVGIT as ENVGIT_BIN
from gatekit import clone_into_project, hostport, netproject
from harness import every_case, steps_of
from kit import nouserns
from landlockkit import Ears
from uikit import UI

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group("landlock"),
              pytest.mark.skipif(not nouserns.available(), reason="making a host without user "
                                 "namespaces needs root and user namespaces (kit/nouserns.py)")]


def test_a_step_runs_with_landlock_and_its_record_says_so(ll):
    """bwrap cannot make namespaces on this host; the step runs anyway, and its record, `show`
    and `doctor` say it ran with the weaker sandbox."""
    r = ll.envgit("run", "--", "/usr/bin/bwrap", "--unshare-user", "--ro-bind", "/", "/", "true")
    assert r.returncode != 0
    ll.envgit("run", "--", "sh", "-c", "echo made > made.txt", check=True)
    assert (ll.root / "made.txt").read_text() == "made\n"
    step = steps_of(ll)[-1]
    assert "sandbox-degraded" in step["marks"] and step["sandbox"]["backend"] == "landlock"
    assert any("no network" in w for w in step["sandbox"]["weaker"])
    shown = ll.envgit("show", str(step["id"]), check=True).stdout
    assert "sandbox   landlock" in shown and "envgit.yaml" in shown     # not enforced, and said
    doctor = ll.envgit("doctor").stdout
    assert "steps run with Landlock + seccomp (degraded:" in doctor
    with UI(ll) as ui:                                  # the page says it too
        _, _, body = ui.get(f"/steps/{step['id']}")
        assert "weaker than bubblewrap" in body and "mark-sandbox-degraded" in body
    # the project's state is outside it, behind a link
    assert os.path.islink(ll.root / ".envgit")


def test_what_a_landlock_step_cannot_do(ll, tmp_path):
    """Each case is one attack from inside a step; its marker or canary must not appear."""
    a = ll
    # Everything here is open to the step's uid on the host (a world-writable file, sockets
    # anyone may connect to, a process of its own uid): only the sandbox can refuse it.
    base = Path(tempfile.mkdtemp(prefix="envgit-ll-"))
    os.chmod(base, 0o755)
    hear = Ears(base)
    outside = base / "outside.txt"
    outside.write_text("outside\n")
    os.chmod(outside, 0o666)
    uid = {"user": a.user, "group": a.user, "extra_groups": []} if a.user else {}
    victim = subprocess.Popen(["sleep", "300"], env={"SECRET_ENV": CANARY}, **uid)
    py = "/usr/bin/python3"

    def secret(script):
        r = a.run(script + " 2>&1; true")
        assert CANARY not in r.stdout + r.stderr, r.stdout

    def unchanged(script):
        a.run(script + " 2>/dev/null; true")
        assert outside.read_text() == "outside\n"
        assert not os.path.exists(a.home / "planted")

    def unheard(script):
        before = len(hear.heard)
        a.run(script + " 2>/dev/null; true")
        time.sleep(0.5)
        assert hear.heard[before:] == []

    cases = {
        "ssh key": lambda: secret("cat ~/.ssh/id_ed25519"),
        "aws, gh, netrc, history": lambda: secret(
            "cat ~/.aws/credentials ~/.config/gh/hosts.yml ~/.netrc ~/.bash_history"),
        "a symlink to the key": lambda: secret("ln -s ~/.ssh/id_ed25519 k && cat k; rm -f k"),
        "a hard link to the key": lambda: secret("ln ~/.ssh/id_ed25519 k2 && cat k2; rm -f k2"),
        "through /proc/self/root": lambda: secret("cat /proc/self/root$HOME/.ssh/id_ed25519"),
        "a process's environment": lambda: secret(f"cat /proc/{victim.pid}/environ"),
        "a process's memory": lambda: secret(
            f"{py} -c \"import sys; f=open('/proc/{victim.pid}/mem','rb')\""),
        "write outside": lambda: unchanged(f"echo x > {outside}; echo x >> {outside}"),
        "write the home": lambda: unchanged("echo x > ~/planted"),
        "tcp to the host": lambda: unheard(
            f"{py} -c \"import socket; socket.create_connection(('127.0.0.1', {hear.tcp.getsockname()[1]}))\""),
        "udp to the host": lambda: unheard(
            f"{py} -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
            f".sendto(b'x', ('127.0.0.1', {hear.udp.getsockname()[1]}))\""),
        "a unix socket file": lambda: unheard(
            f"{py} -c \"import socket; socket.socket(socket.AF_UNIX).connect('{hear.stream_path}')\""),
        "an abstract unix socket": lambda: unheard(
            f"{py} -c \"import socket; socket.socket(socket.AF_UNIX)"
            f".connect({hear.abstract_stream_name!r})\""),
        "signal a process outside": lambda: (a.run(f"kill -9 {victim.pid}"), time.sleep(0.3),
                                             _alive(victim)),
    }
    if a.is_root:
        cases["/etc/shadow"] = lambda: _unreadable(a, "/etc/shadow")
        cases["a setuid copy"] = lambda: _no_setuid(a)
    try:
        every_case(cases, lambda name: cases[name]())
    finally:
        hear.close()
        victim.kill()
        victim.wait()
        shutil.rmtree(base, ignore_errors=True)


def _alive(p):
    assert p.poll() is None, "a step killed a process outside it"


def _unreadable(a, path):
    r = a.run(f"head -c 200 {path}")
    assert "root:" not in r.stdout, r.stdout


def _no_setuid(a):
    a.run("cp /bin/sh ./rootsh; chmod 4755 ./rootsh; true")
    p = a.root / "rootsh"
    assert not (p.exists() and os.stat(p).st_mode & 0o4000)
    if p.exists():
        p.unlink()


def test_the_state_stays_out_of_reach_and_its_link_comes_back(ll):
    """The journal and snapshots are outside the project; a step that removes or replaces the
    link loses nothing: the daemon makes the link again, the journal verifies, a rewind works."""
    a = ll
    a.run("echo one > f.txt", check=True)
    r = a.run("cat .envgit/journal.sqlite | head -c 100; ls .envgit; rm -rf .envgit/*; rm -f .envgit; "
              "mkdir .envgit; echo fake > .envgit/journal.sqlite; echo two > f.txt")
    assert "SQLite" not in r.stdout
    assert os.path.islink(a.root / ".envgit")
    left = list(a.root.glob(".envgit-left-by-step-*"))
    assert len(left) == 1 and (left[0] / "journal.sqlite").read_text() == "fake\n"
    assert "it is a link again" in r.stderr
    fsck = a.envgit("fsck", check=True).stdout
    assert "journal chain intact" in fsck
    first = [x["id"] for x in steps_of(a) if x["argv"][-1] == "echo one > f.txt"][0]
    a.envgit("rewind", str(first), "--yes", check=True)
    assert (a.root / "f.txt").read_text() == "one\n"


def test_escape_routes_a_landlock_step_writes_are_taken_back(ll):
    """Landlock cannot keep .git/hooks read-only inside the writable project: what the step
    wrote there is taken back at its end, so the person's next `git commit` runs nothing."""
    a = ll
    marker = a.home / "hook-ran"
    r = a.run(f"printf '#!/bin/sh\\ntouch {marker}\\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit; "
              f"echo '# a step was here' >> envgit.yaml")
    assert "took back" in r.stderr
    assert not (a.root / ".git" / "hooks" / "pre-commit").exists()
    assert "a step was here" not in (a.root / "envgit.yaml").read_text()
    a.host("git -c user.email=a@b -c user.name=a commit -q --allow-empty -m x")
    assert not marker.exists()


def test_what_a_landlock_step_leaves_running_ends_with_it(ll):
    """No pid namespace ends a step's leftovers: the launcher, their subreaper, does."""
    a = ll
    a.run("(sleep 3; echo late > late.txt) & setsid sh -c 'sleep 3; echo late > late2.txt' & true", check=False)
    time.sleep(5)
    assert not (a.root / "late.txt").exists() and not (a.root / "late2.txt").exists()


@pytest.mark.parametrize("ll", ["root"], indirect=True)
def test_an_organisation_can_refuse_the_landlock_sandbox(ll, tmp_path):
    """`degraded_sandbox: forbid` in the organisation's policy: no step runs here, said why."""
    a = ll
    org = tmp_path / "org"
    org.mkdir()
    (org / "policy.yaml").write_text("version: 1\ndegraded_sandbox: forbid\n")
    os.chmod(org, 0o755)
    a.stop()                        # the daemon reads the organisation's file from its start
    r = a.envgit("run", "--", "sh", "-c", "echo ran > ran.txt", env={"ENVGIT_ORG_POLICY": str(org / "policy.yaml")})
    assert r.returncode == 125 and "degraded_sandbox: forbid" in r.stderr, r.stderr
    assert not (a.root / "ran.txt").exists()
    assert not [x for x in steps_of(a) if "ran.txt" in " ".join(x["argv"])]


@pytest.mark.parametrize("ll", ["root"], indirect=True)
def test_a_landlock_step_reaches_the_network_only_through_the_gate(ll, gate_servers):
    """No network namespace to bridge: the step gets the gate's TCP port, and the gate judges
    as it does for any step: a fetch goes through, a hidden push is refused and the remote is
    unchanged, and nothing but the gate's port can be connected to."""
    git, stub = gate_servers
    a = netproject(ll, git, stub)
    clone_into_project(a, git)
    before = git.refs()["refs/heads/main"]
    r = a.run("git fetch -q origin && echo fetched; echo x > x && git add x && git commit -qm x && "
              "g=git; $g push -q origin HEAD:main; echo push=$?; "
              f"curl -s -o /dev/null -w '%{{http_code}}' https://{hostport(stub)}/ok; echo; "
              f"/usr/bin/python3 -c \"import socket; socket.create_connection(('127.0.0.1', {stub.port}))\" "
              "2>&1 | tail -1", timeout=180)
    assert "fetched" in r.stdout and "push=0" not in r.stdout, (r.stdout, r.stderr)
    assert git.refs()["refs/heads/main"] == before                       # the oracle
    assert "200" in r.stdout and "Permission denied" in r.stdout, r.stdout
    step = steps_of(a)[-1]
    assert step["sandbox"]["backend"] == "landlock" and any("gate is reached" in w for w in step["sandbox"]["weaker"])
    assert any(q.get("decision") == "deny" for q in step["requests"]), step["requests"]


@pytest.mark.parametrize("ll", ["root"], indirect=True)
def test_daily_work_in_a_landlock_step(ll):
    """What the metadata judge (landlock_meta.py) and the socket rules must leave working inside
    the project: a venv with pip's scripts, chmod +x, tar's modes and times, cp -p, a commit,
    a program that starts programs."""
    a = ll
    r = a.run("python3 -m venv --without-pip .venv && echo '#!/bin/sh' > s.sh && chmod +x s.sh && ./s.sh && "
              "mkdir -p d/e && echo x > d/e/f && chmod 700 d/e && touch -d 2001-01-01 d/e/f && "
              "tar czf t.tgz d && mkdir x && tar xzf t.tgz -C x && stat -c '%a %Y' x/d/e x/d/e/f && "
              "cp -p d/e/f g && stat -c %Y g && "
              "git add s.sh && git -c user.email=a@b -c user.name=a commit -qm s && git log --oneline | wc -l && "
              "/usr/bin/python3 -c \"import subprocess; print(subprocess.run(['echo', 'child'], "
              "capture_output=True, text=True).stdout.strip())\"", timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    words = r.stdout.split()
    # tar kept the directory's mode and the file's time; cp -p the time
    assert words[0] == "700" and words[3] == words[4] == str(int(os.stat(a.root / "d/e/f").st_mtime)), r.stdout
    assert "child" in r.stdout


def test_init_moves_a_projects_state_out_of_it_on_a_landlock_host(tmp_path):
    """A project made where steps ran in bubblewrap keeps `.envgit` inside it, where a Landlock
    step could write its journal; `envgit init` on the Landlock host moves it out, steps and
    all, once no daemon holds it, and the step made before is still there to rewind to."""
    home = make_home(tmp_path)
    root = home / "proj"
    root.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    e = Env(home, root)
    e.envgit("init", check=True)
    e.run("echo one > f.txt", check=True)               # a step under bubblewrap
    e.stop()
    assert (root / ".envgit").is_dir() and not (root / ".envgit").is_symlink()
    r = subprocess.run(nouserns.wrap([ENVGIT_BIN, "init"]), cwd=root, env=e.env, capture_output=True, text=True)
    assert r.returncode == 0 and "moved" in r.stdout, (r.stdout, r.stderr)
    assert (root / ".envgit").is_symlink()
    r = subprocess.run(nouserns.wrap([ENVGIT_BIN, "run", "--", "sh", "-c", "cat .envgit/journal.sqlite | head -c 20; "
                             "echo two > f.txt"]), cwd=root, env=e.env, capture_output=True, text=True)
    assert "SQLite" not in r.stdout, r.stdout
    steps = json.loads(e.envgit("log", "--json", check=True).stdout)
    assert steps[0]["argv"][-1] == "echo one > f.txt" and steps[0].get("sandbox") is None
    assert steps[-1]["sandbox"]["backend"] == "landlock"
    e.envgit("rewind", "1", "--yes", check=True)
    assert (root / "f.txt").read_text() == "one\n"
    e.stop()
