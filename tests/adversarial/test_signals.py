"""Class 10: signals must not leave the sandbox. A step runs in a process group of its own (a
session of its own when the daemon starts it); `kill -KILL 0` inside reaches only the step's
own processes, never the `envgit run` waiting for it, the person's shell, its other jobs or
the session daemon. Interactive use still works: on a real terminal the step gets the
terminal's foreground (Ctrl-C reaches it, with the network on too) and the terminal's modes
come back whatever the command did.

Oracles: marker files written by the *outer* shell after `envgit run` returned (it survived),
by a sibling job, and the daemon answering afterwards."""

import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ENVGIT

pytestmark = pytest.mark.both_uids(
    "signals are checked by uid: `kill -1` from a root step reaches every process uid 0 may signal, "
    "from a user's step only that user's; and the terminal's foreground goes to a step run by runuser "
    "as the user: both must hold")

SHIM = Path(__file__).resolve().parents[2] / "src" / "envgit" / "daemon" / "inner_shim.py"
NETWORK = "version: 1\nnetwork:\n  allow: [example.com]\n"


def outer(attacker, script, timeout=90):
    """`sh -c SCRIPT` outside, as the person, in a session of its own: were the step able to
    signal its caller's group, it would reach this shell, never the test runner."""
    return subprocess.run(attacker._argv(["sh", "-c", script]), cwd=attacker.root, env=attacker.env,
                          capture_output=True, text=True, timeout=timeout, start_new_session=True)


def test_kill_0_and_kill_minus_1_stay_in_the_step(attacker):
    m = attacker.root / "m"
    m.mkdir()
    attacker.own(m)
    script = (f"sleep 60 & job=$!; "
              f"{ENVGIT} run -- sh -c 'echo inside; kill -KILL 0'; echo \"rc=$?\"; touch m/shell-alive; "
              f"{ENVGIT} run -- sh -c 'kill -KILL -1; kill -TERM -1; sleep 1; echo after-minus-1'; "
              f"touch m/shell-alive-2; "
              f"kill -0 $job && touch m/sibling-alive; kill $job")
    r = outer(attacker, script)
    assert (m / "shell-alive").exists() and (m / "shell-alive-2").exists(), r.stdout + r.stderr
    assert (m / "sibling-alive").exists(), r.stdout + r.stderr
    assert "inside" in r.stdout and "rc=137" in r.stdout           # the step itself was killed
    # ... and `kill -1` reached none of what makes the step a step: the command went on past
    # it (the sleep gives a killed pid 1 time to take the namespace down) and its status came back
    assert "after-minus-1" in r.stdout
    # the daemon is fine and the next step runs
    ok = attacker.run("echo next")
    assert ok.returncode == 0 and ok.stdout == "next\n"


def test_kill_0_with_the_network_on(attacker):
    attacker.write_policy(NETWORK)
    m = attacker.root / "m"
    m.mkdir()
    attacker.own(m)
    r = outer(attacker, f"{ENVGIT} run -- sh -c 'echo bridged; kill -KILL 0'; touch m/shell-alive")
    assert (m / "shell-alive").exists(), r.stdout + r.stderr
    assert "bridged" in r.stdout, r.stderr                  # the step ran, through the bridge
    ok = attacker.run("echo next")
    assert ok.returncode == 0 and ok.stdout == "next\n", ok.stderr


def test_an_inner_step_cannot_kill_the_daemon(attacker):
    """An agent's Bash call runs as a sibling sandbox started by the session daemon: `kill 0`
    and `kill -1` there must not reach the daemon (it would take the gate and every step)."""
    attacker.run("true")
    from envgit.daemon.client import connect
    from envgit.paths import Project
    conn = connect(Project(str(attacker.root)), start=False)
    before = conn.request({"op": "status"})["pid"]
    spec = conn.request({"op": "spec", "argv": ["true"], "cwd": str(attacker.root), "env": {},
                         "session": "agent-sig", "inner": True})
    sock = spec["bwrap"][spec["bwrap"].index("/run/envgit/control.sock") - 1]
    shim = attacker.home / "inner_shim.py"
    shutil.copy(SHIM, shim)
    attacker.own(shim)
    r = subprocess.run(attacker._argv([sys.executable, str(shim), "sh", "-c",
                                       "echo inner; kill -KILL 0; kill -KILL -1"]),
                       cwd=attacker.root, env={**attacker.env, "ENVGIT_INNER_SOCKET": str(sock)},
                       capture_output=True, text=True, timeout=60, start_new_session=True)
    assert "inner" in r.stdout, r.stderr
    status = conn.request({"op": "status"})
    assert status["pid"] == before                       # the same daemon, still serving
    ok = subprocess.run(attacker._argv([sys.executable, str(shim), "sh", "-c", "echo again"]),
                        cwd=attacker.root, env={**attacker.env, "ENVGIT_INNER_SOCKET": str(sock)},
                        capture_output=True, text=True, timeout=60)
    assert ok.stdout == "again\n", ok.stderr


def pty_shell(attacker, script, send=None, when=b"", timeout=40):
    """`sh -c SCRIPT` on a real terminal (as the person); `send` is typed once `when` shows."""
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(attacker.root)
        argv = attacker._argv(["sh", "-c", script])
        os.execvpe(argv[0], argv, attacker.env)
    out, t0 = b"", time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            if send and when in out:
                time.sleep(0.3)
                os.write(fd, send)
                send = None
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status, out.decode(errors="replace")
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        return status, out.decode(errors="replace")
    finally:
        os.close(fd)


def _ctrl_c_reaches_the_step(attacker):
    script = (f"{ENVGIT} run -- sh -c 'trap \"echo got-int; exit 7\" INT; echo ready; "
              f"while :; do sleep 0.1; done'; echo \"rc=$?\"")
    status, out = pty_shell(attacker, script, send=b"\x03", when=b"ready")
    # the step got the Ctrl-C and its trap's own status is envgit's (bwrap ignores the
    # terminal's SIGINT: it died of it, taking the command with it, 130), and the shell that
    # ran envgit lived on to print the status
    assert "rc=7" in out, out


def test_ctrl_c_reaches_the_command_on_a_terminal(attacker):
    _ctrl_c_reaches_the_step(attacker)


def test_ctrl_c_reaches_the_command_with_the_network_on(attacker):
    attacker.write_policy(NETWORK)
    _ctrl_c_reaches_the_step(attacker)


def test_terminal_modes_come_back_and_kill_0_spares_the_shell_on_a_terminal(attacker):
    attacker.write_policy(NETWORK)
    m = attacker.root / "m"
    m.mkdir()
    attacker.own(m)
    script = (f"stty -g > m/before; "
              f"{ENVGIT} run -- sh -c 'stty raw -echo; echo changed; kill -KILL 0'; "
              f"stty -g > m/after; touch m/shell-alive")
    status, out = pty_shell(attacker, script)
    assert (m / "shell-alive").exists(), out
    assert "changed" in out
    assert (m / "before").read_text() == (m / "after").read_text(), out


def test_a_step_reads_the_terminal_and_a_pipeline_keeps_working(attacker):
    """Interactive use: the step owns the terminal (it reads a typed line); in a pipeline the
    step stays in the background and the other end of the pipe keeps the terminal."""
    script = (f"{ENVGIT} run -- sh -c 'echo ask; read line; echo \"typed=$line\"'; "
              f"{ENVGIT} run -- sh -c 'echo piped' | tr a-z A-Z")
    status, out = pty_shell(attacker, script, send=b"hello\n", when=b"ask")
    assert "typed=hello" in out and "PIPED" in out, out


def test_ctrl_z_stops_the_job_and_fg_continues_it(attacker):
    """Job control in an interactive shell: Ctrl-Z stops the step and `envgit run` as one job
    (the shell gets its prompt back), `fg` gives the terminal back to the step, Ctrl-C then
    ends it."""
    if shutil.which("bash") is None:
        import pytest
        pytest.skip("needs bash for an interactive shell with job control")
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(attacker.root)
        argv = attacker._argv(["bash", "--norc", "--noprofile", "-i"])
        os.execvpe(argv[0], argv, {**attacker.env, "PS1": "PROMPT$ "})
    out = b""

    def pump(until, timeout=20, since=0):
        nonlocal out
        end = time.monotonic() + timeout
        while until not in out[since:] and time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    out += os.read(fd, 4096)
                except OSError:
                    return

    try:
        pump(b"PROMPT$ ")
        # (what the terminal shows is checked for strings the typed lines do not contain)
        # The trap is set before go-2 is said, and the loop says t-10 as it runs: the Ctrl-C
        # after `fg` is typed once the step runs again (a fixed second was not always enough
        # for bash to read `fg` on a loaded machine; a Ctrl-C before it flushed the line).
        os.write(fd, f"{ENVGIT} run -- sh -c 'trap \"echo got-\\$((2+2)); exit 9\" INT; echo go-$((1+1)); "
                     f"while :; do sleep 0.2; echo t-$((5+5)); done'\n".encode())
        pump(b"go-2\r\n")
        time.sleep(0.3)
        os.write(fd, b"\x1a")
        pump(b"Stopped")
        os.write(fd, b"echo back-$((3+3))\n")
        pump(b"back-6\r\n")
        mark = len(out)
        os.write(fd, b"fg\n")
        pump(b"t-10", since=mark)
        os.write(fd, b"\x03")
        pump(b"PROMPT$ ")
        os.write(fd, b"echo rc=$((100+$?))\n")
        pump(b"rc=1")
        pump(b"rc=2", 1)
        pump(b"PROMPT$ ", 3)
        os.write(fd, b"exit\n")
    finally:
        time.sleep(0.3)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)
    text = out.decode(errors="replace")
    assert "Stopped" in text and "back-6" in text, text
    assert "rc=109" in text, text                          # its trap's 9


def test_a_step_started_in_the_background_gets_the_terminal_after_fg(attacker):
    """`envgit run … &` in an interactive shell: the step reading the terminal stops the job
    (as any background job would), `fg` hands the terminal to the step, which reads the line."""
    if shutil.which("bash") is None:
        import pytest
        pytest.skip("needs bash for an interactive shell with job control")
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(attacker.root)
        argv = attacker._argv(["bash", "--norc", "--noprofile", "-i"])
        os.execvpe(argv[0], argv, {**attacker.env, "PS1": "PROMPT$ "})
    out = b""

    def pump(until, timeout=20):
        nonlocal out
        end = time.monotonic() + timeout
        while until not in out and time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    out += os.read(fd, 4096)
                except OSError:
                    return

    try:
        pump(b"PROMPT$ ")
        os.write(fd, f"{ENVGIT} run -- sh -c 'read x; echo got=$x-$((1+1))' &\n".encode())
        deadline = time.monotonic() + 40
        while b"Stopped" not in out and time.monotonic() < deadline:
            time.sleep(1)
            os.write(fd, b"jobs\n")        # reading the terminal from the background stops it
            pump(b"Stopped", 1)
        os.write(fd, b"fg\n")
        time.sleep(1.0)
        os.write(fd, b"hello\n")
        pump(b"got=hello-2")
        os.write(fd, b"exit\n")
        pump(b"exit", 3)
    finally:
        time.sleep(0.3)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)
    text = out.decode(errors="replace")
    assert "Stopped" in text and "got=hello-2" in text, text


def test_the_mcp_repl_cannot_signal_the_mcp_server(attacker):
    """The MCP server's Node REPL runs the model's code in a sandbox started through the same
    launcher, in a session of its own: `process.kill(0, 'SIGKILL')` there ends the REPL only;
    the server answers the next call (with a fresh REPL)."""
    import anyio
    from mcp import Client, StdioServerParameters

    from mcp_fixture_server import make_corpus
    from test_mcp_server import mcp_section
    corpus = make_corpus(attacker.home.parent / "c")
    with open(attacker.root / "envgit.yaml", "a") as f:
        f.write(mcp_section(corpus))
    attacker.own(attacker.root / "envgit.yaml", corpus)
    # the upstream is a host command, approved first (in the test home: runuser gives the
    # test user its passwd home, which does not exist)
    attacker.env["XDG_STATE_HOME"] = str(attacker.home / ".local" / "state")
    attacker.envgit("trust", "--yes", check=True)
    argv = attacker._argv([ENVGIT, "mcp", "--project", str(attacker.root)])
    params = StdioServerParameters(command=argv[0], args=argv[1:], cwd=str(attacker.home), env=attacker.env)

    async def main():
        async with Client(params) as client:
            with anyio.fail_after(120):
                first = await client.call_tool("execute", {"code": "globalThis.x = 1; process.kill(0, 'SIGKILL'); 2"})
                second = await client.call_tool("execute", {"code": "40 + 2"})
                return first, second
    first, second = anyio.run(main)
    text = "".join(b.text for b in second.content if b.type == "text")
    assert not second.is_error and text == "42", text
