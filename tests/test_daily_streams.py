"""A step's streams and terminal are the command's own, with the network off and on (issue 12:
with a host in network.allow, stdin was /proc/net/tcp, `bash -i` exited at once and `git
commit` left the terminal raw). Everything here is typed into a real pseudo-terminal (ptydrive)
or piped, as a person does; with the network on the bridge really runs (HTTPS_PROXY is set in
the step and the gate answers it)."""

import shutil
import signal
import subprocess

import pytest

from conftest import ENVGIT
from ptydrive import Term, exit_code

NETWORK = {"off": "", "on": "network:\n  allow: [\"example.test\"]\n"}


def policy(net, extra=""):
    return "version: 1\n" + NETWORK[net] + extra


@pytest.fixture(params=["off", "on"])
def netproj(request, proj):
    if request.param == "on" and shutil.which("socat") is None:
        pytest.skip("socat is not installed (dev/run installs it)")
    proj.net = request.param
    proj.write_policy(policy(request.param, "env:\n  pass: [EDITOR]\n"))
    proj.env["TERM"] = "xterm"
    return proj


def term(proj, argv, **env):
    return Term(argv, proj.root, {**proj.env, **env})


def assert_bridge_as_configured(proj):
    r = proj.run("echo proxy=${HTTPS_PROXY:+set}")
    assert r.stdout == ("proxy=set\n" if proj.net == "on" else "proxy=\n"), r.stderr


def test_piped_stdin_reaches_the_command(netproj):
    r = netproj.envgit("run", "--", "cat", input="hi from the pipe\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hi from the pipe\n"
    assert_bridge_as_configured(netproj)


def test_piped_stdin_reaches_the_command_on_a_terminal(netproj):
    # the person's `producer | envgit run -- cmd`, typed at a terminal
    piped = f"printf 'one\\ntwo\\n' | {ENVGIT} run -- sh -c 'wc -l; [ -t 1 ] && echo out-is-tty'"
    with term(netproj, ["sh", "-c", piped]) as t:
        status = t.wait()
    assert exit_code(status) == 0, t.text
    assert "2\r\n" in t.text and "out-is-tty" in t.text, t.text


def test_no_descriptor_beyond_the_three_is_left_open(netproj):
    r = netproj.envgit("run", "--", "sh", "-c", "ls /proc/self/fd")
    assert r.returncode == 0, r.stderr
    # the listing's own directory fd is the only one past 0, 1, 2
    assert sorted(int(x) for x in r.stdout.split()) == [0, 1, 2, 3]


def test_the_command_gets_this_terminal(netproj):
    script = ('echo ready; read line; echo got:$line; [ -t 0 ] && echo tty-in; [ -t 1 ] && echo tty-out; '
              '[ -t 2 ] && echo tty-err; [ "$(stat -L -c %t:%T /proc/self/fd/0)" = "$OUTER" ] && echo same-tty; '
              '(: </dev/tty) 2>/dev/null && echo has-ctty')
    # the terminal's device as the outer shell sees it (inside, its name is /dev/console: the
    # sandbox has a /dev of its own), handed in through `env` (the policy passes no unknown
    # variable)
    with term(netproj, ["sh", "-c", f"{ENVGIT} run -- env OUTER=$(stat -c %t:%T $(tty)) sh -c '{script}'"]) as t:
        assert t.expect(b"ready"), t.text
        t.send(b"typed\r")
        status = t.wait()
    assert exit_code(status) == 0, t.text
    for seen in ("got:typed", "tty-in", "tty-out", "tty-err", "same-tty", "has-ctty"):
        assert seen in t.text, (seen, t.text)


def test_bash_i_takes_typed_lines_and_shows_its_prompt(netproj):
    # (PS1 through `env`: the policy passes no unknown variable)
    with term(netproj, [ENVGIT, "run", "--", "env", "PS1=PROMPT$ ", "bash", "--norc", "--noprofile", "-i"]) as t:
        assert t.expect(b"PROMPT$ "), t.text
        t.send(b"echo typed-$((6*7))\r")
        assert t.expect(b"typed-42"), t.text
        assert t.expect(b"PROMPT$ "), t.text            # and the next prompt
        t.send(b"sleep 30\r")
        t.send(b"\x03", settle=1.0)                     # Ctrl-C ends the sleep, not the shell
        assert t.expect(b"PROMPT$ "), t.text
        t.send(b"echo still-$((40+2))\r")
        assert t.expect(b"still-42"), t.text
        t.send(b"exit 5\r")
        status = t.wait()
    assert exit_code(status) == 5, t.text


def test_python_input_reads_a_typed_line(netproj):
    with term(netproj, [ENVGIT, "run", "--", "python3", "-c", "print('got:' + input('ask: '))"]) as t:
        assert t.expect(b"ask: "), t.text
        t.send(b"a typed line\r")
        status = t.wait()
    assert exit_code(status) == 0, t.text
    assert "got:a typed line" in t.text


@pytest.mark.skipif(shutil.which("vi") is None, reason="no vi (dev/run installs vim-tiny)")
def test_git_commit_with_vi_lands_the_commit(netproj):
    proj = netproj
    (proj.root / "notes.txt").write_text("hello\n")
    subprocess.run(["git", "add", "notes.txt"], cwd=proj.root, check=True)
    with term(proj, [ENVGIT, "run", "--", "git", "-c", "user.name=Person", "-c", "user.email=p@example.test",
                     "commit"], EDITOR="vi") as t:
        assert t.expect(b"Please enter the commit message"), t.text       # vi shows git's template
        t.send(b"i", settle=0.5)
        t.send(b"typed in vi")
        t.send(b"\x1b")
        t.send(b":wq\r")
        if t.expect(b"Press ENTER", timeout=3):          # a vi that could not write its viminfo
            t.send(b"\r")
        status = t.wait()
    assert exit_code(status) == 0, t.text
    log = subprocess.run(["git", "log", "-1", "--format=%s"], cwd=proj.root, capture_output=True, text=True)
    assert log.stdout == "typed in vi\n", (log.stdout, t.text)


# --- the terminal's modes after the step, however it ended ---------------------------------

def stty_around(proj, tmp_path, command, send=None, when=b""):
    """`stty -a` before and after `envgit run -- COMMAND`, in the shell of a real terminal;
    `send` is typed once `when` has shown. Returns (before, after, rc as the shell saw it, text)."""
    before, after = tmp_path / "before", tmp_path / "after"
    script = (f"stty -a > {before}; {ENVGIT} run -- {command}; echo rc=$?; stty -a > {after}; echo done-$((40+2))")
    with term(proj, ["sh", "-c", script]) as t:
        if send:
            assert t.expect(when), t.text
            t.send(send, settle=0.5)
        assert t.expect(b"done-42"), t.text
        t.wait()
    rc = t.text.split("rc=")[-1].split()[0] if "rc=" in t.text else None
    return before.read_text(), after.read_text(), rc, t.text


def test_stty_same_after_the_command_changed_the_modes(netproj, tmp_path):
    b, a, rc, text = stty_around(netproj, tmp_path, "sh -c 'stty raw -echo -isig; echo changed'")
    assert rc == "0" and "changed" in text, text
    assert a == b, text


def test_stty_same_after_the_command_is_killed_with_signal_9(netproj, tmp_path):
    b, a, rc, text = stty_around(netproj, tmp_path, "sh -c 'stty raw -echo; echo changed; kill -KILL $$'")
    assert rc == "137" and "changed" in text, text
    assert a == b, text


def test_stty_same_after_ctrl_c(netproj, tmp_path):
    b, a, rc, text = stty_around(netproj, tmp_path, "sh -c 'stty -echo -icanon; echo ready; sleep 30'",
                                 send=b"\x03", when=b"ready")
    assert rc == "130", text
    assert a == b, text


@pytest.mark.skipif(shutil.which("vi") is None, reason="no vi (dev/run installs vim-tiny)")
def test_stty_same_after_an_editor_crashes(netproj, tmp_path):
    # vi in its full-screen mode, then killed where it stands: it restores nothing itself
    b, a, rc, text = stty_around(netproj, tmp_path,
                                 "vi -c 'call system(\"kill -KILL \" . getpid())' scratch.txt")
    assert rc == "137", text
    assert a == b, text


def test_ctrl_c_leaves_a_command_that_handles_it_running_to_its_own_end(netproj):
    """Ctrl-C reaches the command only: the sandbox around it does not die of it (bwrap did, and
    took a command that traps SIGINT with it, its status becoming 130)."""
    script = "trap 'sleep 0.5; echo handled; exit 7' INT; echo ready; while :; do sleep 0.1; done"
    with term(netproj, [ENVGIT, "run", "--", "sh", "-c", script]) as t:
        assert t.expect(b"ready"), t.text
        t.send(b"\x03", settle=0.5)
        status = t.wait()
    assert exit_code(status) == 7 and "handled" in t.text, (status, t.text)


def test_the_command_gets_sigint_as_envgit_run_got_it(netproj):
    """Default when envgit run had it at default; ignored when whoever started envgit run ignored
    it (`nohup`, a script's `cmd &`), as without envgit (bwrap itself ignores it either way)."""
    def ignored_in_the_command(prefix):
        r = subprocess.run(["sh", "-c", f"{prefix}exec {ENVGIT} run -- grep SigIgn /proc/self/status"],
                           cwd=netproj.root, env=netproj.env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        mask = int(r.stdout.split()[-1], 16)
        return {s for s in (signal.SIGINT, signal.SIGQUIT) if mask & (1 << (s - 1))}
    assert ignored_in_the_command("") == set()
    assert ignored_in_the_command("trap '' INT QUIT; ") == {signal.SIGINT, signal.SIGQUIT}


def test_the_network_outlives_a_ctrl_c_the_command_survives(proj):
    """A REPL or a dev server survives Ctrl-C and goes on using the network: the bridge (socat)
    is in a session of its own, out of the terminal's foreground group, so the Ctrl-C is the
    command's alone. The oracle: 127.0.0.1:3128 still listening after it."""
    if shutil.which("socat") is None:
        pytest.skip("socat is not installed (dev/run installs it)")
    proj.write_policy(policy("on"))
    proj.env["TERM"] = "xterm"
    listening = "grep -q ' 0100007F:0C38 00000000:0000 0A' /proc/net/tcp && echo bridge-up || echo bridge-down"
    script = (f"trap 'echo caught' INT; echo ready; i=0; while [ $i -lt 30 ]; do sleep 0.1; i=$((i+1)); "
              f"[ -f stop ] && break; done; {listening}")
    with term(proj, [ENVGIT, "run", "--", "sh", "-c", f"({script}) </dev/tty; true"]) as t:
        assert t.expect(b"ready"), t.text
        t.send(b"\x03", settle=1.0)
        status = t.wait()
    assert "caught" in t.text and "bridge-up" in t.text, (status, t.text)
