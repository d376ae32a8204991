"""The inner control socket: a process inside one sandbox gets a command run as a step of its
own, in a sibling sandbox, on its own stdio (what `envgit claude`'s shell-prefix shim uses)."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from envgit.daemon.client import connect
from envgit.paths import Project
from envgit.sandbox.seccomp import program

SHIM = Path(__file__).resolve().parent.parent / "src" / "envgit" / "daemon" / "inner_shim.py"


def _inner_step(proj, session, script, before=()):
    """Run `sh -c script` as a step asked for from inside a sandbox (the shim on the inner
    socket, as an agent's tool call does), `before` the shim on its command line: (the shim's
    result, the step as log --json has it)."""
    proj.run("true")                                   # the daemon is up
    project = Project(str(proj.root))
    conn = connect(project)
    helper = conn.request({"op": "begin", "argv": ["agent"], "cwd": str(proj.root), "env": proj.env,
                           "record_only": True, "session": session})
    # the shim must be visible inside: put it in the project (a real adapter binds it in)
    shutil.copy(SHIM, proj.root / "shim.py")
    spec = conn.request({"op": "spec", "argv": [*before, "/usr/bin/python3", str(proj.root / "shim.py"),
                                                "sh", "-c", script],
                         "cwd": str(proj.root), "env": proj.env, "session": session, "inner": True,
                         "step": helper["step"]})
    assert "bwrap" in spec, spec
    fd = os.memfd_create("s", 0)
    os.write(fd, program())
    os.lseek(fd, 0, 0)
    r = subprocess.run([spec["bwrap"][0], "--seccomp", str(fd), *spec["bwrap"][1:]], env=spec["env"],
                       pass_fds=[fd], capture_output=True, text=True, timeout=60)
    conn.request({"op": "end", "step": helper["step"], "exit_code": 0})
    steps = json.loads(proj.envgit("log", "--json", check=True).stdout)
    inner = [s for s in steps if s["argv"][:2] == ["sh", "-c"] and s["argv"][2] == script]
    assert len(inner) == 1, steps
    return r, inner[0]


def test_a_step_from_inside_a_sandbox(proj):
    r, inner = _inner_step(proj, "agent-s1", "echo from-inner; cat ~/.ssh/id_ed25519; exit 3")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "from-inner" in r.stdout and "CANARY" not in r.stdout
    assert inner["session"] == "agent-s1" and inner["exit_code"] == 3
    assert inner["snapshot"]["tree"]


def test_an_inner_steps_chosen_130_is_not_a_death_by_sigint(proj):
    """Steps an agent's tool call asks for get the exit-status reporter as envgit run's do:
    `exit 130` is recorded as exit 130 with no signal, a real SIGINT death as SIGINT."""
    r, chosen = _inner_step(proj, "agent-s2", "exit 130")
    assert r.returncode == 130 and chosen["exit_code"] == 130 and chosen["signal"] is None, chosen
    r, died = _inner_step(proj, "agent-s2", "kill -INT $$; sleep 5")
    assert died["exit_code"] == 130 and died["signal"] == "SIGINT", died


def test_a_step_whose_caller_the_agent_killed_ends_within_a_second(proj):
    """Claude Code's Esc (Codex's /stop, a tool call's timeout) kills the agent's process that
    asked for the step: the step's processes end with it, not minutes later, and the step says
    how it ended. The oracle: the file the command writes after its sleep never appears."""
    # The caller is killed once the command has started (it makes `started`), not at a fixed
    # time: a `timeout -s KILL 2` fired before the step's sandbox was up on a loaded machine.
    kill_once_started = ('"$@" & p=$!; i=0; while [ ! -e started ] && [ $i -lt 800 ]; do sleep 0.05; i=$((i+1)); done; '
                         'kill -KILL $p; wait $p')
    r, step = _inner_step(proj, "agent-s3", "echo started; touch started; sleep 6; echo late > late.txt",
                          before=["sh", "-c", kill_once_started, "caller"])
    t_killed = time.monotonic()                     # the step's sleep had begun before this
    assert r.returncode == 137 and "started" in r.stdout, (r.returncode, r.stdout, r.stderr)
    for _ in range(50):                             # its end may still be being written
        if step["status"] != "running":
            break
        time.sleep(0.1)
        step = next(s for s in json.loads(proj.envgit("log", "--json", check=True).stdout) if s["id"] == step["id"])
    assert step["status"] != "running" and "interrupted-by-agent" in step["marks"], step
    assert step["duration_ms"] < 4000, step          # killed once started, ended within a second or so
    time.sleep(max(0.0, 7 - (time.monotonic() - t_killed)))
    assert not (proj.root / "late.txt").exists()


def test_the_inner_socket_offers_only_run_and_status(proj):
    import socket
    proj.run("true")
    conn = connect(Project(str(proj.root)))
    spec = conn.request({"op": "spec", "argv": ["true"], "cwd": str(proj.root), "env": proj.env,
                         "session": "agent-s2", "inner": True})
    assert "bwrap" in spec, spec
    path = spec["bwrap"][spec["bwrap"].index("/run/envgit/control.sock") - 1]    # where it is bound from
    for op in ("answer", "rewind", "gc", "stop", "begin"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(path))
        body = json.dumps({"op": op, "id": 1, "answer": "allow", "step": 1}).encode()
        s.sendall(len(body).to_bytes(4, "big") + body)
        size = int.from_bytes(s.recv(4), "big")
        reply = json.loads(s.recv(size))
        s.close()
        assert "offers run, record, mcp and status" in reply["error"], (op, reply)
    assert conn.request({"op": "status"})["pid"]          # the daemon is still fine


def test_a_long_session_name_still_gets_its_socket(proj):
    """An agent's session id (`claude-20261202-182559-46ba`) under a deep project path would
    pass the AF_UNIX limit: the socket is then made in a private directory of its own."""
    import socket
    session = "claude-20261202-182559-46ba" + "-x" * 30
    proj.run("true")
    conn = connect(Project(str(proj.root)))
    spec = conn.request({"op": "spec", "argv": ["true"], "cwd": str(proj.root), "env": proj.env,
                         "session": session, "inner": True})
    assert "bwrap" in spec, spec
    bound = spec["bwrap"][spec["bwrap"].index("/run/envgit/control.sock") - 1]
    assert len(bound) <= 100 and os.stat(os.path.dirname(bound)).st_mode & 0o777 == 0o700
    s = socket.socket(socket.AF_UNIX)
    s.connect(bound)
    body = json.dumps({"op": "status"}).encode()
    s.sendall(len(body).to_bytes(4, "big") + body)
    size = int.from_bytes(s.recv(4), "big")
    assert json.loads(s.recv(size))["session"] == session
    s.close()


def test_an_agents_writable_state_keeps_its_escape_routes_read_only(proj, tmp_path):
    state = proj.home / ".agent-state"
    (state / "hooks").mkdir(parents=True)
    (state / "settings.json").write_text("{}\n")
    proj.run("true")
    conn = connect(Project(str(proj.root)))
    spec = conn.request({"op": "spec", "argv": ["sh", "-c", f"echo a > {state}/notes; "
                                                f"echo evil > {state}/settings.json; "
                                                f"echo evil > {state}/hooks/pre; true"],
                         "cwd": str(proj.root), "env": proj.env, "session": "agent-s3",
                         "write": [str(state)], "protect": [str(state / "settings.json"), str(state / "hooks")]})
    r = subprocess.run(spec["bwrap"], env=spec["env"], capture_output=True, text=True, timeout=60)
    assert (state / "notes").read_text() == "a\n"                 # the state dir is writable
    assert (state / "settings.json").read_text() == "{}\n"        # its escape routes are not
    assert not (state / "hooks" / "pre").exists()
    assert "Read-only file system" in r.stderr


def test_the_home_of_a_step_from_inside_is_its_sessions_not_the_frames(proj, tmp_path):
    """A frame's env.HOME does not choose the sibling step's home view: the view is built on
    the home the agent was launched with (the spec that made the socket)."""
    other = tmp_path / "elsewhere"
    (other / ".local" / "bin").mkdir(parents=True)
    (other / ".local" / "bin" / "secret").write_text("CANARY-elsewhere\n")
    (proj.home / ".local" / "bin").mkdir(parents=True, exist_ok=True)
    (proj.home / ".local" / "bin" / "tool").write_text("tool-of-the-real-home\n")
    r, _ = _inner_step(proj, "agent-s4", f"echo home=$HOME; cat {other}/.local/bin/secret; "
                       f"cat {proj.home}/.local/bin/tool", before=["env", f"HOME={other}"])
    assert "CANARY" not in r.stdout + r.stderr
    assert f"home={proj.home}\n" in r.stdout and "tool-of-the-real-home" in r.stdout, r.stdout + r.stderr
