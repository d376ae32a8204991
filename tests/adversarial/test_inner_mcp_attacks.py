"""The inner socket's `mcp` op, attacked from inside an agent's sandbox: the daemon runs envgit's
own MCP server on the host for it (daemon/mcphost.py), so code in the sandbox tries to make
that host process run something of its own, outlive the agent, or wedge the daemon. The
sandbox is the daemon's own (`spec` with `inner`, as an agent adapter builds it); the attack
runs inside it and speaks inner.py's framing to /run/envgit/control.sock. The oracles: a
marker file on the host, written only by code running outside the sandbox; the host's process
table (`envgit mcp --project ROOT` processes left)."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

# Run on the host, as the person: the agent's sandbox (the daemon's `spec` with `inner`, run
# as an agent adapter runs it) with inside.py running in it. argv: root, the launcher's extra
# environment (JSON), the arguments for inside.py.
AGENT = r'''
import json, os, subprocess, sys
from envgit.daemon.client import connect
from envgit.paths import Project
from envgit.sandbox.seccomp import program
root, extra = sys.argv[1], json.loads(sys.argv[2])
conn = connect(Project(root))
helper = conn.request({"op": "begin", "argv": ["agent"], "cwd": root, "env": dict(os.environ),
                       "record_only": True, "session": "agent-mcp-attack"})
spec = conn.request({"op": "spec", "argv": ["/usr/bin/python3", root + "/inside.py", *sys.argv[3:]],
                     "cwd": root, "env": {**os.environ, **extra}, "session": "agent-mcp-attack",
                     "inner": True, "step": helper["step"]})
fd = os.memfd_create("s", 0)
os.write(fd, program())
os.lseek(fd, 0, 0)
r = subprocess.run([spec["bwrap"][0], "--seccomp", str(fd), *spec["bwrap"][1:]], env=spec["env"],
                   pass_fds=[fd], capture_output=True, text=True, timeout=120)
conn.request({"op": "end", "step": helper["step"], "exit_code": r.returncode})
print(r.stdout + r.stderr)
'''

# What every attack inside shares: the framing, a request with three fds, its reply.
FRAMING = r'''
import array, json, os, socket, sys, time

def ask(msg, fds, wait_s=30, then=None):
    """Send `msg` with `fds`; `then(sock)` runs once it is sent; the reply (or what failed)."""
    body = json.dumps(msg).encode()
    data = len(body).to_bytes(4, "big") + body
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/envgit/control.sock")
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    s.sendmsg([data[:4]], anc)
    s.sendall(data[4:])
    if then is not None:
        then(s)
    s.settimeout(wait_s)
    try:
        head = s.recv(4)
        size = int.from_bytes(head, "big")
        got = b""
        while len(got) < size:
            got += s.recv(size - len(got))
        return json.loads(got)
    except (OSError, ValueError) as e:
        return {"no reply": repr(e)}
    finally:
        s.close()
'''


def agent_runs(attacker, inside, *args, extra_env=None, timeout=180):
    """Run `inside` (FRAMING is prepended) in the agent's sandbox of `attacker`'s project; its
    output."""
    (attacker.root / "inside.py").write_text(FRAMING + inside)
    (attacker.root / "agent.py").write_text(AGENT)
    attacker.own(attacker.root / "inside.py", attacker.root / "agent.py")
    attacker.run("true", check=True)              # the daemon up, as the person's envgit started it
    r = attacker.host(shlex.join([sys.executable, "agent.py", str(attacker.root), json.dumps(extra_env or {}),
                                  *args]), timeout=timeout)
    return r.stdout + r.stderr


def servers_left(root, within_s=10):
    """Pids of `envgit mcp --project ROOT` processes still running after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if b"mcp" in argv and str(root).encode() in argv:
                left.append(int(pid))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def end_servers(root):
    """The servers this test's attack left running (by pid), so that one hole's test does not
    leave host processes behind."""
    for pid in servers_left(root, 0):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# --- 1. Python from the project on the host server's import path -------------------------

PLANT = r'''
root, marker = sys.argv[1], sys.argv[2]
try:
    open(marker, "w").write("from the sandbox")
    print("DIRECT-WRITE-WORKED")
except OSError:
    print("DIRECT-WRITE-REFUSED")
pkg = os.path.join(root, sys.argv[3], "envgit")
os.makedirs(pkg, exist_ok=True)
with open(os.path.join(pkg, "__init__.py"), "w") as f:
    f.write(f"open({marker!r}, 'w').write('ran on the host as envgit')\n")
with open(os.path.join(pkg, "__main__.py"), "w") as f:
    f.write("")
for name in ("json", "asyncio", "anyio"):       # modules envgit mcp imports, named in the project
    with open(os.path.join(root, sys.argv[3], name + ".py"), "w") as f:
        f.write(f"open({marker!r}, 'w').write('ran on the host as {name}')\n")
print("PLANTED")
r, w = os.pipe()
reply = ask({"op": "mcp"}, [r, 1, 2], then=lambda s: (time.sleep(4), os.close(w)))
print("REPLY", json.dumps(reply))
'''


def test_a_package_planted_in_the_project_does_not_run_as_the_host_mcp_server(attacker):
    """`python -m envgit` in the project's directory puts that directory first on sys.path: an
    `envgit/` (or `json.py`) the sandbox writes there would be the host server's code."""
    marker = attacker.home / "host-marker"     # the person's home: read-only inside
    try:
        out = agent_runs(attacker, PLANT, str(attacker.root), str(marker), ".")
    finally:
        end_servers(attacker.root)
    assert "PLANTED" in out and "DIRECT-WRITE-REFUSED" in out and "REPLY" in out, out
    assert (attacker.root / "envgit" / "__init__.py").exists(), out
    assert not marker.exists(), marker.read_text()                          # the oracle


def test_a_launcher_pythonpath_into_the_project_does_not_import_the_sandboxs_code(attacker):
    """The person launched the agent with PYTHONPATH naming a directory of the project (their
    own code's `src`): the host server must not import what the sandbox writes there (the
    daemon refuses to run so itself: importpath.py)."""
    marker = attacker.home / "host-marker"     # the person's home: read-only inside
    (attacker.root / "src").mkdir()
    attacker.own(attacker.root / "src")
    try:
        out = agent_runs(attacker, PLANT, str(attacker.root), str(marker), "src",
                         extra_env={"PYTHONPATH": str(attacker.root / "src")})
    finally:
        end_servers(attacker.root)
    assert "PLANTED" in out and "DIRECT-WRITE-REFUSED" in out and "REPLY" in out, out
    assert (attacker.root / "src" / "envgit" / "__init__.py").exists(), out
    assert not marker.exists(), marker.read_text()                          # the oracle


# --- 2. The caller's own connection handed to the server: it never "goes away" -----------

SELF_HELD = r'''
# stdin a pipe whose write end the server holds too (never EOF), stderr the client end of
# this very connection (the daemon would never see it hang up): then the caller exits.
r, w = os.pipe()
body = json.dumps({"op": "mcp"}).encode()
data = len(body).to_bytes(4, "big") + body
s = socket.socket(socket.AF_UNIX)
s.connect("/run/envgit/control.sock")
s.sendmsg([data[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r, w, s.fileno()]))])
s.sendall(data[4:])
time.sleep(3)                    # the server started
print("HANDED OVER", flush=True)
os._exit(0)
'''


def test_the_host_mcp_server_ends_with_its_caller_even_when_handed_the_callers_connection(attacker):
    """The caller passes the client end of its own connection as one of the server's fds (and
    a pipe it cannot see the end of as stdin), then exits, and the agent's sandbox with it: no
    hang-up ever reaches the daemon, but the server must still end with its caller."""
    try:
        out = agent_runs(attacker, SELF_HELD)
        left = servers_left(attacker.root, 10)
    finally:
        end_servers(attacker.root)
    assert "HANDED OVER" in out, out
    assert not left, f"envgit mcp processes {left} outlived the agent's sandbox"    # the oracle


# --- 3. A caller's stderr that is full: what the daemon says there must not stop it ---------

FULL_STDERR = r'''
import fcntl, threading
root, argv, hold_s = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
r, w = os.pipe()                 # stderr: filled, then never read (r is held open)
flags = fcntl.fcntl(w, fcntl.F_GETFL)
fcntl.fcntl(w, fcntl.F_SETFL, flags | os.O_NONBLOCK)
try:
    while True:
        os.write(w, b"x" * 65536)
except BlockingIOError:
    pass
fcntl.fcntl(w, fcntl.F_SETFL, flags)      # blocking again, for whoever writes next
null = os.open("/dev/null", os.O_RDWR)
replies = []
def asking():
    replies.append(ask({"op": "run", "argv": argv, "cwd": root, "env": {}}, [null, null, w], wait_s=hold_s))
t = threading.Thread(target=asking, daemon=True)
t.start()
time.sleep(2)
open(os.path.join(root, "sent"), "w").close()
t.join(hold_s + 5)
print("REPLY", json.dumps(replies))
'''


def daemon_answers_while(attacker, inside_args, hold_s=30):
    """Run FULL_STDERR in the agent's sandbox; once its request is in, `envgit run -- true`
    from the host: whether it finished in time (the daemon serving on), and what the sandbox
    printed."""
    import threading
    out = {}
    t = threading.Thread(target=lambda: out.update(r=agent_runs(attacker, FULL_STDERR, str(attacker.root),
                                                                  *inside_args, str(hold_s))))
    t.start()
    deadline = time.monotonic() + 60
    while not (attacker.root / "sent").exists() and time.monotonic() < deadline and t.is_alive():
        time.sleep(0.2)
    try:
        r = attacker.envgit("run", "--", "true", timeout=hold_s - 5)
        served = r.returncode == 0
        said = f"envgit run -> {r.returncode} {r.stderr[-500:]}"
    except subprocess.TimeoutExpired:
        served, said = False, f"envgit run -- true: no answer in {hold_s - 5} s"
    t.join(hold_s + 120)
    return served, said + "\n" + out.get("r", "")


def test_a_refusal_told_to_a_full_stderr_does_not_stop_the_daemon(attacker):
    """The `shell:` deny rule `envgit init` writes refuses the inner step; the refusal is
    written to the caller's stderr, a pipe the caller filled and never reads: the daemon
    (every session's steps, the network gate) must serve on meanwhile."""
    served, out = daemon_answers_while(attacker, [json.dumps(["git", "push"])])
    assert (attacker.root / "sent").exists(), out
    assert served, out                                                      # the oracle
    told = agent_runs(attacker, TOLD, str(attacker.root))      # a stderr with room is still told
    assert "TOLD envgit: refused by shell[0]" in told, told


def test_a_notice_told_to_a_full_stderr_at_the_steps_end_does_not_stop_the_daemon(attacker):
    """The same full stderr, on a step that tries to reach a host: its `tried to reach`
    notice is written there at the step's end."""
    served, out = daemon_answers_while(attacker, [json.dumps(["sh", "-c", "getent hosts x.never.invalid"])])
    assert (attacker.root / "sent").exists(), out
    assert served, out                                                      # the oracle


TOLD = r'''
r, w = os.pipe()
null = os.open("/dev/null", os.O_RDWR)
reply = ask({"op": "run", "argv": ["git", "push"], "cwd": sys.argv[1], "env": {}}, [null, null, w])
os.close(w)
print("TOLD", os.read(r, 65536).decode(), json.dumps(reply))
'''
