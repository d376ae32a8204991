"""`envgit run`'s exit status follows the shell's convention, on a real terminal, with the network
off and on: the command's own code unchanged (a chosen `exit 130` too), a death by signal N
re-raised (the caller sees the signal, a shell 128+N), 127 not found, 126 not executable, 125
envgit's own failure with one `envgit:` line naming the fix."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from conftest import ENVGIT
from ptydrive import Term, died_of, exit_code

NETWORK = {"off": "", "on": "network:\n  allow: [\"example.test\"]\n"}


@pytest.fixture(params=["off", "on"])
def netproj(request, proj):
    if request.param == "on" and shutil.which("socat") is None:
        pytest.skip("socat is not installed (dev/run installs it)")
    proj.net = request.param
    proj.write_policy("version: 1\n" + NETWORK[request.param])
    return proj


def on_terminal(proj, argv, send=None, when=b"", cwd=None, **env):
    """`argv` on a real terminal: (wait status, what the terminal showed)."""
    with Term(argv, cwd or proj.root, {**proj.env, **env}) as t:
        if send:
            assert t.expect(when), t.text
            t.send(send, settle=0.5)
        status = t.wait()
    return status, t.text


def run_on_terminal(proj, *cmd, **kw):
    return on_terminal(proj, [ENVGIT, "run", "--", *cmd], **kw)


def envgit_lines(text):
    return [ln for ln in text.replace("\r", "").splitlines() if ln.startswith("envgit:")]


def test_the_commands_own_code_passes_unchanged(netproj):
    for code in (0, 1, 3, 125, 126, 127, 130, 137, 255):
        status, text = run_on_terminal(netproj, "sh", "-c", f"exit {code}")
        assert exit_code(status) == code, (code, status, text)
        assert not envgit_lines(text), text


def test_a_chosen_130_is_not_a_death_by_sigint(netproj):
    status, text = run_on_terminal(netproj, "sh", "-c", "exit 130")
    assert exit_code(status) == 130 and died_of(status) is None, (status, text)
    # Ctrl-C that the command handles by choosing 130 itself: still its own exit
    status, text = run_on_terminal(netproj, "sh", "-c", "trap 'exit 130' INT; echo ready; while :; do sleep 0.1; done",
                                   send=b"\x03", when=b"ready")
    assert exit_code(status) == 130 and died_of(status) is None, (status, text)


def test_a_command_killed_by_ctrl_c_ends_envgit_by_sigint(netproj):
    status, text = run_on_terminal(netproj, "sh", "-c", "echo ready; exec sleep 30", send=b"\x03", when=b"ready")
    assert died_of(status) == signal.SIGINT, (status, text)
    # Ctrl-\ likewise, without a core dump of envgit's own
    status, text = run_on_terminal(netproj, "sh", "-c", "echo ready; exec sleep 30", send=b"\x1c", when=b"ready")
    assert died_of(status) == signal.SIGQUIT and not os.WCOREDUMP(status), (status, text)


def test_a_death_by_signal_is_reraised(netproj):
    for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGSEGV, signal.SIGUSR1):
        status, text = run_on_terminal(netproj, "sh", "-c", f"kill -{int(sig)} $$")
        assert died_of(status) == sig, (sig, status, text)
    assert not list(netproj.root.glob("core*"))         # envgit dumped no core of its own


def test_a_command_writing_into_a_closed_pipe_ends_envgit_by_sigpipe(netproj):
    # `envgit run -- yes | head -1`: yes dies of SIGPIPE, and so does envgit, quietly
    p = subprocess.Popen([ENVGIT, "run", "--", "yes"], cwd=netproj.root, env=netproj.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline() == b"y\n"
    p.stdout.close()
    try:
        assert p.wait(timeout=60) == -signal.SIGPIPE
    finally:
        p.kill()
    assert b"envgit" not in p.stderr.read()


def test_kill_9_of_the_command_is_137_to_the_shell(netproj):
    status, text = on_terminal(netproj, ["sh", "-c",
                                         f"{ENVGIT} run -- sh -c 'echo started; kill -KILL $$'; echo rc=$?"])
    assert exit_code(status) == 0 and "started" in text and "rc=137" in text, text


def test_not_found_is_127_and_not_executable_is_126(netproj):
    (netproj.root / "script.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(netproj.root / "script.sh", 0o644)
    status, text = run_on_terminal(netproj, "no-such-command-here")
    assert exit_code(status) == 127 and "no-such-command-here" in text and "not found" in text, text
    status, text = run_on_terminal(netproj, "./script.sh")
    assert exit_code(status) == 126 and "Permission denied" in text and "ran" not in text, text
    status, text = run_on_terminal(netproj, "./no-such-file")
    assert exit_code(status) == 127, text
    # and the shell around envgit says the same
    status, text = on_terminal(netproj, ["sh", "-c", f"{ENVGIT} run -- no-such-command-here; echo rc=$?; "
                                         f"{ENVGIT} run -- ./script.sh; echo rc=$?"])
    assert "rc=127" in text and "rc=126" in text, text


# --- 125: envgit's own failures, each one `envgit:` line with the fix ------------------------

def assert_failed(status, text, *said):
    lines = envgit_lines(text)
    assert exit_code(status) == 125, (status, text)
    assert len(lines) == 1, text
    for s in said:
        assert s in lines[0], (s, lines[0])
    assert "Traceback" not in text, text


def test_125_no_project(netproj, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    status, text = run_on_terminal(netproj, "true", cwd=outside)
    assert_failed(status, text, "no envgit project", "envgit init")


def test_125_no_command(netproj):
    status, text = on_terminal(netproj, [ENVGIT, "run", "--"])
    assert_failed(status, text, "envgit run [--] CMD")


def test_125_bad_policy(netproj):
    netproj.write_policy("version: 1\n" + NETWORK[netproj.net] + "filesystem:\n  deny_reed: []\n")
    status, text = run_on_terminal(netproj, "echo", "should-not-run")
    assert_failed(status, text, "envgit.yaml:", "deny_read")
    assert "should-not-run" not in text


def test_125_missing_bubblewrap(netproj):
    status, text = run_on_terminal(netproj, "true", ENVGIT_BWRAP="/nonexistent/bwrap")
    assert_failed(status, text, "ENVGIT_BWRAP")


def test_125_missing_perl(netproj):
    status, text = run_on_terminal(netproj, "true", ENVGIT_PERL="/nonexistent/perl")
    assert_failed(status, text, "ENVGIT_PERL")


def test_125_the_sandbox_did_not_start(netproj):
    # a trusted binary that is not bwrap: it exits 1 before any command runs, as bwrap does
    # when it cannot set the sandbox up (its own message precedes envgit's)
    status, text = run_on_terminal(netproj, "echo", "should-not-run", ENVGIT_BWRAP="/bin/false")
    assert_failed(status, text, "the sandbox did not start", "envgit doctor")
    assert "should-not-run" not in text
    log = subprocess.run([ENVGIT, "log", "--json"], cwd=netproj.root, env=netproj.env, capture_output=True, text=True)
    assert json.loads(log.stdout)[-1]["exit_code"] == 125, log.stdout


def test_125_the_daemon_does_not_answer(netproj):
    netproj.stop()
    # a daemon that accepts and never answers (stuck): the step is not begun
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = netproj.root / ".envgit" / "daemon.sock"
    if path.exists():
        path.unlink()
    sock.bind(str(path))
    sock.listen(8)
    try:
        status, text = run_on_terminal(netproj, "echo", "should-not-run", ENVGIT_DAEMON_ANSWER_TIMEOUT="1")
    finally:
        sock.close()
        path.unlink()
    assert_failed(status, text, "daemon", "envgit daemon stop")
    assert "should-not-run" not in text


def test_125_the_network_bridge_did_not_start(proj):
    if shutil.which("socat") is None:
        pytest.skip("socat is not installed")
    proj.write_policy("version: 1\n" + NETWORK["on"])
    proj.stop()
    # a "socat" that never listens (a trusted binary that is not socat), given to the daemon
    # this step starts
    status, text = run_on_terminal(proj, "echo", "should-not-run", ENVGIT_SOCAT="/bin/false")
    proj.stop()
    assert exit_code(status) == 125, (status, text)
    assert "should-not-run" not in text and "bridge" in text and "envgit doctor" in text, text


def test_refused_by_a_shell_rule_is_126(netproj):
    netproj.write_policy("version: 1\n" + NETWORK[netproj.net] + "shell:\n  - deny: ['git push']\n")
    status, text = run_on_terminal(netproj, "git", "push")
    assert exit_code(status) == 126 and "git push" in text, (status, text)


# --- the Codex exec-server's step launcher (agents/steprun.py) is envgit run's run.step -------

def steprun_argv(proj, *cmd):
    """`python -I -m envgit.agents.steprun FD -- CMD`, its environment on a pipe (the daemon
    scrubs it by the policy, as envgit run's)."""
    r, w = os.pipe()
    os.write(w, json.dumps({"PATH": proj.env["PATH"], "HOME": proj.env["HOME"]}).encode())
    os.close(w)
    os.set_inheritable(r, True)
    return r, [sys.executable, "-I", "-m", "envgit.agents.steprun", str(r), "--", *cmd]


def test_the_codex_step_launcher_has_envgit_runs_streams_and_status(netproj):
    def piped(*cmd, input=None):
        fd, argv = steprun_argv(netproj, *cmd)
        try:
            return subprocess.run(argv, cwd=netproj.root, env=netproj.env, input=input, capture_output=True,
                                  text=True, pass_fds=(fd,), timeout=120)
        finally:
            os.close(fd)
    r = piped("cat", input="through the pipe\n")
    assert r.returncode == 0 and r.stdout == "through the pipe\n", r.stderr
    r = piped("sh", "-c", "ls /proc/self/fd")
    assert sorted(int(x) for x in r.stdout.split()) == [0, 1, 2, 3], (r.stdout, r.stderr)
    assert piped("sh", "-c", "exit 130").returncode == 130
    assert piped("sh", "-c", "kill -INT $$").returncode == -signal.SIGINT
    assert piped("no-such-command-here").returncode == 127
    # on a terminal: the step reads the typed line from it
    fd, argv = steprun_argv(netproj, "sh", "-c", "echo ready; read line; echo got:$line; [ -t 0 ] && echo tty-in")
    try:
        with Term(argv, netproj.root, netproj.env) as t:
            assert t.expect(b"ready"), t.text
            t.send(b"typed\r")
            status = t.wait()
    finally:
        os.close(fd)
    assert exit_code(status) == 0 and "got:typed" in t.text and "tty-in" in t.text, t.text
