"""A step's streams and terminal are the command's own, with the network on: the socat bridge
starts the command without touching fd 0/1/2 (issue 12: stdin was /proc/net/tcp)."""

import os
import shutil

import pytest

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

NET = "version: 1\nnetwork:\n  allow: [\"example.test\"]\nshell: []\n"


@pytest.fixture
def netproj(proj):
    proj.write_policy(NET)
    return proj


def test_piped_stdin_reaches_the_command(netproj):
    r = netproj.envgit("run", "--", "cat", input="hi from the pipe\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hi from the pipe\n"
    env = netproj.run("env")
    assert "HTTPS_PROXY=" in env.stdout          # the bridge really was on


def test_no_descriptor_beyond_the_three_is_left_open(netproj):
    r = netproj.envgit("run", "--", "sh", "-c", "ls /proc/self/fd")
    assert r.returncode == 0, r.stderr
    # the listing's own directory fd is the only one past 0, 1, 2
    assert sorted(int(x) for x in r.stdout.split()) == [0, 1, 2, 3]


def test_interactive_shell_reads_the_terminal(netproj):
    status, out = netproj.pty_run(["sh", "-c", "echo ready; read line; echo got:$line; "
                                   "[ -t 0 ] && echo tty-in; [ -t 1 ] && echo tty-out"],
                                  send=b"typed\r", when=b"ready")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, out
    assert "got:typed" in out and "tty-in" in out and "tty-out" in out
