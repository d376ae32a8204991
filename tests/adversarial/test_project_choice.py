"""Class 2: a step must not choose its own policy or project. A step can write anywhere in its
project, so `sub/envgit.yaml` + `sub/.envgit/` may be a policy it made for itself (secrets
readable, nothing in the outer journal): a project inside a project is refused by project
discovery, and the step that made one is marked `policy-file-written` and told. Every adapter
runs a command in the session's own project, refusing a cwd outside it.

Oracles: the canary (readable only under the step's own policy) and marker files a command
run in the wrong project would write."""

import json
import subprocess
import sys

from conftest import CANARY

OPEN_POLICY = "version: 1\nfilesystem:\n  deny_read: []\n"


def test_a_nested_project_made_by_a_step_is_refused(attacker):
    r = attacker.run(f"mkdir -p sub/.envgit && printf '{OPEN_POLICY}' > sub/envgit.yaml && echo made")
    assert r.returncode == 0 and "made" in r.stdout, r.stderr
    assert "policy-file-written" in r.stderr and "sub/envgit.yaml" in r.stderr     # said at the end
    steps = json.loads(attacker.envgit("log", "--json", check=True).stdout)
    assert "policy-file-written" in steps[-1]["marks"]
    # a later command with its cwd under sub/: refused, not run under the step's policy
    sub = attacker.root / "sub"
    later = attacker.envgit("run", "--", "sh", "-c", "cat ~/.ssh/id_ed25519; touch ran", cwd=sub)
    assert later.returncode != 0 and "inside the project" in later.stderr, later.stderr
    assert CANARY not in later.stdout + later.stderr
    assert not (sub / "ran").exists()
    assert not (sub / ".envgit" / "journal.sqlite").exists()     # no daemon of its own either


def test_a_plain_subdirectory_still_works(attacker):
    r = attacker.run("mkdir -p pkg/src && echo ok")
    assert r.returncode == 0
    sub = attacker.envgit("run", "--", "sh", "-c", "pwd; cat ~/.ssh/id_ed25519", cwd=attacker.root / "pkg" / "src")
    assert sub.returncode != 0 or CANARY not in sub.stdout
    assert sub.stdout.startswith(str(attacker.root / "pkg" / "src")), sub.stderr
    assert CANARY not in sub.stdout


def test_an_outer_directory_made_into_a_project_does_not_capture_the_inner_one(attacker):
    """The other direction: the project is found however deep the cwd, and a second project
    above it (here: the home) makes the person choose, rather than one silently applying."""
    (attacker.home / "envgit.yaml").write_text(OPEN_POLICY)
    (attacker.home / ".envgit").mkdir()
    attacker.own(attacker.home / "envgit.yaml", attacker.home / ".envgit")
    r = attacker.run("cat ~/.ssh/id_ed25519; touch ran")
    assert r.returncode != 0 and "inside the project" in r.stderr, r.stderr
    assert CANARY not in r.stdout and not (attacker.root / "ran").exists()


def test_the_inner_socket_refuses_a_cwd_outside_the_project(attacker, tmp_path):
    import socket

    from envgit.daemon.client import connect
    from envgit.daemon.inner_shim import frame, reply
    from envgit.paths import Project
    attacker.run("true")
    conn = connect(Project(str(attacker.root)), start=False)
    spec = conn.request({"op": "spec", "argv": ["true"], "cwd": str(attacker.root), "env": {},
                         "session": "agent-cwd", "inner": True})
    path = spec["bwrap"][spec["bwrap"].index("/run/envgit/control.sock") - 1]
    other = tmp_path / "other"
    other.mkdir()
    link = attacker.root / "link"
    link.symlink_to(other)
    for cwd in (str(other), str(link), "/", "relative"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        s.sendmsg([frame({"op": "run", "argv": ["sh", "-c", "touch marker"], "cwd": cwd, "env": {}})[:4]],
                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS, __import__("array").array("i", [0, 1, 2]))])
        s.sendall(frame({"op": "run", "argv": ["sh", "-c", "touch marker"], "cwd": cwd, "env": {}})[4:])
        out = reply(s)
        s.close()
        assert "error" in out and ("outside the project" in out["error"] or "absolute" in out["error"]), out
    assert not (other / "marker").exists() and not (attacker.root / "marker").exists()


def test_the_codex_exec_server_refuses_a_cwd_outside_the_project(attacker, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    attacker.own(other)
    p = subprocess.Popen(attacker._argv([sys.executable, "-m", "envgit.agents.execserver", "--project",
                                         str(attacker.root), "--session", "codex-cwd"]),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=attacker.env, cwd=attacker.root)

    def call(rid, method, **params):
        p.stdin.write((json.dumps({"id": rid, "method": method, "params": params}) + "\n").encode())
        p.stdin.flush()
        while True:
            msg = json.loads(p.stdout.readline())
            if msg.get("id") == rid:
                return msg
    try:
        bad = call(1, "process/start", processId="p1", argv=["sh", "-c", "touch marker"],
                   cwd=f"file://{other}", env={}, tty=False)
        assert "error" in bad and "outside this session's project" in bad["error"]["message"], bad
        good = call(2, "process/start", processId="p2", argv=["sh", "-c", "touch marker"],
                    cwd=f"file://{attacker.root}", env={}, tty=False)
        assert "result" in good, good
        import time
        deadline = time.monotonic() + 30
        while not (attacker.root / "marker").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        p.stdin.close()
        p.wait(30)
    assert not (other / "marker").exists()
    assert (attacker.root / "marker").exists()          # the legitimate one ran, as a step


def test_a_step_cannot_begin_outside_the_project(attacker, tmp_path):
    """The daemon itself refuses a step whose cwd is not in its project (any client)."""
    from envgit.daemon.client import connect
    from envgit.paths import Project
    attacker.run("true")
    conn = connect(Project(str(attacker.root)), start=False)
    r = conn.request({"op": "begin", "argv": ["touch", "marker"], "cwd": str(tmp_path), "env": {}})
    assert "outside the project" in r.get("error", ""), r


def test_an_agents_step_that_makes_a_nested_project_is_told_and_marked(attacker):
    """The same through the inner socket (an agent's Bash call): the notice reaches the
    agent's own stderr, the step is marked, and the nested project is refused later."""
    import shutil
    from pathlib import Path

    from envgit.daemon.client import connect
    from envgit.paths import Project
    attacker.run("true")
    conn = connect(Project(str(attacker.root)), start=False)
    spec = conn.request({"op": "spec", "argv": ["true"], "cwd": str(attacker.root), "env": {},
                         "session": "agent-nest", "inner": True})
    sock = spec["bwrap"][spec["bwrap"].index("/run/envgit/control.sock") - 1]
    shim = attacker.home / "inner_shim.py"
    shutil.copy(Path(__file__).resolve().parents[2] / "src" / "envgit" / "daemon" / "inner_shim.py", shim)
    attacker.own(shim)
    r = subprocess.run(attacker._argv([sys.executable, str(shim), "sh", "-c",
                                       f"mkdir -p deep/x/.envgit && printf '{OPEN_POLICY}' > deep/x/envgit.yaml"]),
                       cwd=attacker.root, env={**attacker.env, "ENVGIT_INNER_SOCKET": sock},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "policy-file-written" in r.stderr and "deep/x/envgit.yaml" in r.stderr, r.stderr
    later = attacker.envgit("run", "--", "sh", "-c", "cat ~/.ssh/id_ed25519", cwd=attacker.root / "deep" / "x")
    assert later.returncode != 0 and CANARY not in later.stdout


def test_the_persons_own_policy_edit_is_not_blamed_on_a_step(attacker):
    attacker.run("true")
    attacker.write_policy("version: 1\n")                 # the person, outside, between steps
    r = attacker.run("echo ok")
    assert r.returncode == 0 and "policy-file-written" not in r.stderr, r.stderr
    steps = json.loads(attacker.envgit("log", "--json", check=True).stdout)
    assert "policy-file-written" not in steps[-1]["marks"]
