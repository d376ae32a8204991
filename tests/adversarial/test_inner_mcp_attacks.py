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

import pytest

from kit.agentsandbox import AGENT_SANDBOX
from kit.mcpservers import servers_left

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
    (attacker.root / "agent.py").write_text(AGENT_SANDBOX)
    attacker.own(attacker.root / "inside.py", attacker.root / "agent.py")
    attacker.run("true", check=True)              # the daemon up, as the person's envgit started it
    r = attacker.host(shlex.join([sys.executable, "agent.py", str(attacker.root), "agent-mcp-attack",
                                  json.dumps(extra_env or {}), "inside.py", *args]), timeout=timeout)
    return r.stdout + r.stderr




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


# --- 4. Odd descriptors, odd frames, a race on the cap ------------------------------------

ODD = r'''
import socket as so
root = sys.argv[1]
results = {}
null = os.open("/dev/null", os.O_RDWR)
r, w = os.pipe()
d = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
p = os.open(root + "/envgit.yaml", os.O_PATH)
ro = os.open(root + "/envgit.yaml", os.O_RDONLY)        # protected: read-only in here
lst = so.socket(so.AF_UNIX)
lst.bind("\0envgit-odd-" + str(os.getpid()))
lst.listen(1)
cases = {
    "directory stdin": [d, null, null],
    "O_PATH all three": [p, p, p],
    "one pipe end thrice": [w, w, w],            # its stdin the write end
    "read-only policy file as stdout and stderr": [null, ro, ro],
    "listening socket": [lst.fileno(), lst.fileno(), lst.fileno()],
    "two fds": [null, null],
    "no fds": [],
}
for name, fds in cases.items():
    results[name] = ask({"op": "mcp"}, fds, wait_s=60)
    results[name + ": then status"] = ask({"op": "status"}, [])
for name, msg in {"env in the frame": {"op": "mcp", "env": {"PYTHONPATH": root}},
                  "argv in the frame": {"op": "mcp", "argv": ["sh", "-c", "id"]},
                  "cwd in the frame": {"op": "mcp", "cwd": root + "/sub"},
                  "a subdirectory's project": {"op": "mcp", "project": root + "/sub"},
                  "a symlink to a subdirectory": {"op": "mcp", "project": root + "/to-sub"},
                  "a relative project": {"op": "mcp", "project": "sub"},
                  "a project with NUL": {"op": "mcp", "project": root + "\0/sub"}}.items():
    results[name] = ask(msg, [null, null, null], wait_s=60)
print("RESULTS", json.dumps(results))
'''


def test_odd_descriptors_and_frames_start_nothing_of_the_sandboxs_and_the_daemon_serves_on(attacker):
    """The mcp op with a directory, O_PATH descriptors, one pipe end thrice (the server then
    holds the write end of its own stdin), the protected policy opened read-only as its
    output, a listening socket, too few fds; and frames that carry an environment, a command
    line, a cwd, or name as the project a subdirectory holding an envgit.yaml whose MCP
    server would write the marker. Nothing the sandbox named runs, envgit.yaml is unchanged,
    every server ends, and the daemon answers each time."""
    marker = attacker.home / "host-marker"
    sub = attacker.root / "sub"
    sub.mkdir()
    (sub / "envgit.yaml").write_text("version: 1\nmcp:\n  servers:\n    planted:\n      command: sh\n"
                                     f"      args: [-c, \"echo planted > {marker}\"]\n")
    (attacker.root / "to-sub").symlink_to(sub)
    attacker.own(sub, sub / "envgit.yaml", attacker.root / "to-sub")
    policy = (attacker.root / "envgit.yaml").read_bytes()
    try:
        out = agent_runs(attacker, ODD, str(attacker.root))
        left = servers_left(attacker.root, 10)
    finally:
        end_servers(attacker.root)
    assert "RESULTS" in out, out
    results = json.loads(out.split("RESULTS", 1)[1].strip().splitlines()[0])
    for name, reply in results.items():
        if name.endswith("then status"):
            assert reply.get("session") == "agent-mcp-attack", (name, reply)
        elif name in ("two fds", "no fds"):
            assert "needs stdin, stdout and stderr" in reply.get("error", ""), (name, reply)
        elif "frame" in name:
            assert "mcp does not take" in reply.get("error", ""), (name, reply)
        elif "project" in name or "symlink" in name:
            assert "serves this session's project" in reply.get("error", "") or \
                "must be a non-empty string" in reply.get("error", ""), (name, reply)
        else:                          # the server ran on them, and ended
            assert isinstance(reply.get("exit_code"), int), (name, reply)
    assert not left, left
    assert (attacker.root / "envgit.yaml").read_bytes() == policy
    assert not marker.exists()                                              # the oracle


RACE = r'''
import threading
replies, socks = [], []
null = os.open("/dev/null", os.O_RDWR)
r, w = os.pipe()                 # every server's stdin: held open, so each runs until its caller goes
go = threading.Event()
def one():
    body = json.dumps({"op": "mcp"}).encode()
    data = len(body).to_bytes(4, "big") + body
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/envgit/control.sock")
    socks.append(s)
    go.wait()
    s.sendmsg([data[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r, null, null]))])
    s.sendall(data[4:])
    s.settimeout(12)
    try:
        size = int.from_bytes(s.recv(4), "big")
        replies.append(json.loads(s.recv(size)))
    except OSError:
        replies.append("held")
threads = [threading.Thread(target=one) for _ in range(24)]
for t in threads:
    t.start()
time.sleep(1)
go.set()                         # all 24 at once
open(sys.argv[1] + "/sent", "w").close()
for t in threads:
    t.join()
print("RACE", json.dumps(replies))
'''


def test_twenty_four_mcp_asks_at_once_start_at_most_eight_servers(attacker):
    """The cap on envgit MCP servers, raced: 24 connections send their ask in the same
    instant. At no time do more than eight run on the host; the rest are refused."""
    import threading
    out, most = {}, [0]
    t = threading.Thread(target=lambda: out.update(r=agent_runs(attacker, RACE, str(attacker.root))))
    t.start()
    try:
        while t.is_alive():
            most[0] = max(most[0], len(servers_left(attacker.root, 0)))
            time.sleep(0.1)
        left = servers_left(attacker.root, 10)
    finally:
        t.join()
        end_servers(attacker.root)
    assert "RACE" in out["r"], out["r"]
    replies = json.loads(out["r"].split("RACE", 1)[1].strip().splitlines()[0])
    refused = [x for x in replies if isinstance(x, dict) and "at most 8" in x.get("error", "")]
    assert len(replies) == 24 and len(refused) >= 16, replies
    assert 0 < most[0] <= 8, most[0]                                        # the oracle
    assert not left, left


STEP_SELF_HELD = r'''
# a run whose step gets the client end of its own connection as stdout: then the caller exits
body = json.dumps({"op": "run", "argv": ["sh", "-c", "sleep 4242; sleep 4243"], "cwd": sys.argv[1],
                   "env": {}}).encode()
data = len(body).to_bytes(4, "big") + body
null = os.open("/dev/null", os.O_RDWR)
s = socket.socket(socket.AF_UNIX)
s.connect("/run/envgit/control.sock")
s.sendmsg([data[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null, s.fileno(), null]))])
s.sendall(data[4:])
time.sleep(3)
print("HANDED OVER", flush=True)
os._exit(0)
'''


def sleeps_left(within_s=10):
    deadline = time.monotonic() + within_s
    while True:
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().split(b"\0")[:2] == [b"sleep", b"4242"]:
                        left.append(int(pid))
            except OSError:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_a_step_handed_its_own_callers_connection_ends_with_the_caller(attacker):
    """The same hand-over on a `run`: the step's sandbox holds the client end of the
    connection that asked for it; once the caller (and the agent's sandbox) has ended, so
    has the step."""
    try:
        out = agent_runs(attacker, STEP_SELF_HELD, str(attacker.root))
        left = sleeps_left(10)
    finally:
        for pid in sleeps_left(0):
            os.kill(pid, signal.SIGKILL)
    assert "HANDED OVER" in out, out
    assert not left, f"the step's processes {left} outlived its caller"     # the oracle



# --- 5. A descriptor whose close() waits: closed where it holds nothing up ----------------

LINGER = r'''
import socket as so, struct
root, op, hold_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
lst = so.socket()
lst.setsockopt(so.SOL_SOCKET, so.SO_RCVBUF, 4096)
lst.bind(("127.0.0.1", 0))
lst.listen(1)
c = so.socket()
c.setsockopt(so.SOL_SOCKET, so.SO_SNDBUF, 4096)
c.connect(lst.getsockname())
peer, _ = lst.accept()           # held, never read: what c sends stays unsent
c.setblocking(False)
try:
    while True:
        c.send(b"x" * 65536)
except BlockingIOError:
    pass
c.setblocking(True)
c.setsockopt(so.SOL_SOCKET, so.SO_LINGER, struct.pack("ii", 1, 3600))   # its last close() waits an hour
body = json.dumps({"op": "status"} if op == "status" else
                  {"op": op, "argv": ["true"], "cwd": root, "env": {}}).encode()
data = len(body).to_bytes(4, "big") + body
s = so.socket(so.AF_UNIX)
s.connect("/run/envgit/control.sock")
s.sendmsg([data[:4]], [(so.SOL_SOCKET, so.SCM_RIGHTS, array.array("i", [c.fileno()] * 3))])
os.close(c.detach())             # the daemon's copy is the last one
s.sendall(data[4:])
open(os.path.join(root, "sent"), "w").close()
s.settimeout(hold_s)
try:
    print("REPLY", s.recv(65536)[4:].decode())
except OSError as e:
    print("REPLY none", e)
time.sleep(max(0, hold_s - 10))
'''


@pytest.mark.parametrize("op", ["status", "run"])
def test_a_lingering_socket_passed_as_a_descriptor_does_not_stop_the_daemon(attacker, op):
    """A TCP socket (inside the sandbox's own loopback) with unsent data and SO_LINGER of an
    hour, passed as the three fds and closed inside: the daemon's close of it is the last, and
    waits. It must not wait on the daemon's loop."""
    import threading
    out, hold_s = {}, 30
    t = threading.Thread(target=lambda: out.update(r=agent_runs(attacker, LINGER, str(attacker.root), op,
                                                                  str(hold_s))))
    t.start()
    deadline = time.monotonic() + 60
    while not (attacker.root / "sent").exists() and time.monotonic() < deadline and t.is_alive():
        time.sleep(0.2)
    time.sleep(2)
    try:
        r = attacker.envgit("run", "--", "true", timeout=hold_s - 10)
        served, said = r.returncode == 0, f"envgit run -> {r.returncode} {r.stderr[-500:]}"
    except subprocess.TimeoutExpired:
        served, said = False, f"envgit run -- true: no answer in {hold_s - 10} s"
    t.join(hold_s + 120)
    assert (attacker.root / "sent").exists(), out.get("r")
    assert served, said + "\n" + out.get("r", "")                          # the oracle
