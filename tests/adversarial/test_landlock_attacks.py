"""Red team: the Landlock + seccomp backend (sandbox/landlock_run.py), attacked from inside a
step on a host that refuses user namespaces (kit/nouserns.py), as root and as an unprivileged
user. Everything sandbox/backend.py's WEAKER does not give up is a claim; each case here is one
way around one of them, with a marker file or a canary as its only oracle, and fails when the
attack works. The cases of one uid share one project (`every_case`).

What these cases lean on that bubblewrap's namespaces gave for free and Landlock does not:
- no network namespace: a socket the seccomp filter lets through (a TCP socket, a netlink
  socket, a unix pair from socketpair(2)) is a socket of the host's own network and IPC;
- no mount namespace: /dev/pts is the host's, with every terminal of the host in it;
- no pid namespace: the step's processes are ended by the launcher alone, and only while it
  lives; the step's reporter is a process like any other;
- envgit.yaml, .envgit and .git/hooks are writable, and kept only by what the daemon does at
  the step's end.
"""

import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import CANARY, ENVGIT
from harness import attacker_in, every_case, steps_of
from kit import nouserns

pytestmark = [pytest.mark.xdist_group("landlock"),
              pytest.mark.skipif(not nouserns.available(), reason="making a host without user "
                                 "namespaces needs root and user namespaces (kit/nouserns.py)")]


@pytest.fixture(params=["root", "user"])
def ll(request, tmp_path):
    with attacker_in(request.param, tmp_path, no_userns=True) as a:
        a.run("true", check=True)           # the daemon up, in a session of its own
        yield a


def py(code: str) -> str:
    """A shell line running `code` with the system's python3 inside the step."""
    return f"/usr/bin/python3 -c {shlex.quote(code)}"


def start(a, script, out):
    """`envgit run -- sh -c SCRIPT` in the background, in a process group of its own (the
    client and nouserns' wrapper: what an agent's tool call is, and what its timeout kills)."""
    return subprocess.Popen(a._argv([ENVGIT, "run", "--", "sh", "-c", script]), cwd=a.root, env=a.env,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(path: Path, timeout=45.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.exists() and path.stat().st_size:
            return True
        time.sleep(0.1)
    return False


def kill_client(p):
    """The agent's timeout, the OOM killer, a closed terminal: the `envgit run` client (and
    its wrapper) killed outright, as a group."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(30)


def stop_pid_in(path: Path):
    """End the process whose pid a case's step wrote to `path` (a process this test started),
    if it is still there."""
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def remove(*paths):
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.lexists(p):
            p.unlink()


# --- the network, the host's IPC and its terminals ----------------------------------------------

class Ears:
    """What host sockets heard from a step: a TCP listener (for TCP fast open), a unix datagram
    socket file anyone may send to, an abstract unix datagram socket, a NETLINK_USERSOCK
    socket. `heard` is the oracle."""

    NETLINK_USERSOCK = 2

    def __init__(self, base: Path):
        self.heard: list[str] = []
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.path = str(base / "dgram.sock")
        self.dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.dgram.bind(self.path)
        os.chmod(self.path, 0o777)
        self.abstract_name = b"\0envgit-ll-attack-%d" % os.getpid()
        self.abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.abstract.bind(self.abstract_name)
        self.netlink = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, self.NETLINK_USERSOCK)
        self.netlink.bind((0, 0))
        self.netlink_port = self.netlink.getsockname()[0]
        self.names = {self.tcp: "tcp", self.dgram: "unix-dgram", self.abstract: "abstract-dgram",
                      self.netlink: "netlink-usersock"}
        self.stop = False
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        socks = list(self.names)
        while not self.stop:
            ready, _, _ = select.select(socks, [], [], 0.2)
            for s in ready:
                try:
                    if s is self.tcp:
                        s.accept()[0].close()
                    else:
                        s.recvmsg(4096, 4096)
                    self.heard.append(self.names[s])
                except OSError:
                    pass

    def close(self):
        self.stop = True
        self.thread.join(5)
        for s in self.names:
            s.close()


@pytest.mark.both_uids("a host socket, a terminal and a process are the step's uid's on the host")
def test_a_landlock_step_reaches_no_socket_terminal_or_process_outside(ll):
    """Claims: no network at all (no TCP listen or connect, no UDP, no unix socket to a host
    socket file, no abstract socket outside the step), which the seccomp filter's own comment
    narrows to "netlink: the host's addresses, read only"; a step cannot type into the person's
    terminal, read what is typed there, or fake what it shows; no signal to or ptrace of a
    process outside the step; secrets outside the project unreadable by any path; nothing
    outside the project, its TMPDIR and the project cache writable (modes and times too). Each case
    attacks from inside a step; a host socket hearing it, a terminal showing or losing a byte,
    a process dying or a canary showing is the attack working."""
    a = ll
    base = Path(tempfile.mkdtemp(prefix="envgit-lla-"))
    os.chmod(base, 0o755)
    ears = Ears(base)
    uid = {"user": a.user, "group": a.user, "extra_groups": []} if a.user else {}
    victim = subprocess.Popen(["sleep", "300"], env={"SECRET_ENV": CANARY}, **uid)
    pw = None
    if a.user:
        import pwd
        pw = pwd.getpwnam(a.user)

    def unheard(script, wait=0.6):
        before = len(ears.heard)
        r = a.run(script + " 2>&1; true")
        time.sleep(wait)
        assert ears.heard[before:] == [], f"a host socket heard the step: {ears.heard[before:]}\n{r.stdout}"

    def secret(script):
        r = a.run(script + " 2>&1; true")
        assert CANARY not in r.stdout + r.stderr, r.stdout

    def alive(script):
        a.run(script + " 2>/dev/null; true")
        time.sleep(0.3)
        assert victim.poll() is None, "a step's signal killed a process outside it"

    def tcp_listen():
        """A TCP socket that listens without bind(2) is bound by the kernel to a free port on
        every address: Landlock's BIND_TCP is never asked. The host (or the next machine)
        connects to it."""
        port, heard = a.root / "ll-port", a.root / "ll-heard"
        remove(port, heard)
        code = ("import socket\n"
                "try:\n s = socket.socket(); s.listen(); p = s.getsockname()[1]\n"
                "except OSError:\n p = 0\n"
                "open('ll-port', 'w').write(str(p))\n"
                "if p:\n"
                " s.settimeout(10)\n"
                " try:\n  c, _ = s.accept(); open('ll-heard', 'w').write(repr(c.recv(64)))\n"
                " except OSError:\n  pass\n")
        with tempfile.TemporaryFile() as out:
            p = start(a, py(code), out)
            try:
                assert wait_for(port), "the step never said its port"
                n = int(port.read_text())
                connected = False
                if n:
                    try:
                        with socket.create_connection(("127.0.0.1", n), timeout=3) as c:
                            c.sendall(b"from the host")
                            connected = True
                    except OSError:
                        pass
                p.wait(60)
            finally:
                if p.poll() is None:
                    kill_client(p)
        try:
            said = heard.read_text() if heard.exists() else ""
            assert not connected and not said, \
                f"the step listened on TCP port {n} (0.0.0.0) and the host reached it: {said}"
        finally:
            remove(port, heard)

    def pty_pair():
        m, s = os.openpty()
        name = os.ttyname(s)
        if pw:                      # the person's own terminal is theirs
            os.chown(name, pw.pw_uid, pw.pw_gid)
        return m, s, name

    def pty_read():
        """The person's other terminal (a shell waiting for its next line, a password
        prompt): the step opens the same /dev/pts/N and takes what is typed before it does."""
        m, s, name = pty_pair()
        try:
            os.write(m, f"typed-by-the-person {CANARY}\n".encode())
            secret(f"timeout 3 cat < {name}")
        finally:
            os.close(m)
            os.close(s)

    def pty_write():
        """The step writes to the person's other terminal: what it shows is the step's."""
        m, s, name = pty_pair()
        try:
            a.run(f"printf 'STEP-WROTE-HERE' > {name} 2>/dev/null; true")
            os.set_blocking(m, False)
            shown = b""
            try:
                while chunk := os.read(m, 4096):
                    shown += chunk
            except (BlockingIOError, OSError):
                pass
            assert b"STEP-WROTE-HERE" not in shown, f"the step wrote on {name}: {shown!r}"
        finally:
            os.close(m)
            os.close(s)

    def pty_modes():
        """The step turns echo off on the person's other terminal (their next password shows,
        or their typing vanishes): its modes are the step's."""
        import termios
        m, s, name = pty_pair()
        try:
            a.run(f"stty -echo < {name} 2>/dev/null; true")
            assert termios.tcgetattr(s)[3] & termios.ECHO, f"the step turned echo off on {name}"
        finally:
            os.close(m)
            os.close(s)

    def metadata_outside():
        """chmod(2), utimes(2) and setxattr(2) are no Landlock right: a file outside the project
        that the step's uid owns (every file of the person's for their own step, every
        root-owned file of the host for a root step: /etc/shadow, /etc/passwd, /usr/bin)
        changes mode, times and attributes. The person's ssh key and its directory opened to
        every user of the host; a file outside changed."""
        key, ssh = a.home / ".ssh" / "id_ed25519", a.home / ".ssh"
        files = {n: base / f"meta-{n}" for n in ("mode", "time", "xattr")}
        for f in files.values():
            f.write_text("outside\n")
            os.chmod(f, 0o644)
            os.utime(f, (1_500_000_000, 1_500_000_000))
            if pw:
                os.chown(f, pw.pw_uid, pw.pw_gid)
        os.chmod(key, 0o600)
        os.chmod(ssh, 0o700)
        try:
            a.run(f"chmod 0644 {key}; chmod 0777 {ssh}; chmod 0777 {files['mode']}; "
                  f"touch -d 2001-01-01 {files['time']}; "
                  + py(f"import os\nos.setxattr({str(files['xattr'])!r}, 'user.planted', b'by-the-step')")
                  + " 2>/dev/null; true")
            changed = []
            if os.stat(key).st_mode & 0o077 or os.stat(ssh).st_mode & 0o077:
                changed.append(f"~/.ssh {oct(os.stat(ssh).st_mode)}, its key {oct(os.stat(key).st_mode)}")
            if os.stat(files["mode"]).st_mode & 0o777 != 0o644:
                changed.append(f"mode {oct(os.stat(files['mode']).st_mode)}")
            if os.stat(files["time"]).st_mtime != 1_500_000_000:
                changed.append(f"mtime {os.stat(files['time']).st_mtime}")
            if os.listxattr(files["xattr"]):
                changed.append(f"xattrs {os.listxattr(files['xattr'])}")
            assert not changed, "the step changed outside the project: " + "; ".join(changed)
        finally:
            os.chmod(key, 0o600)
            os.chmod(ssh, 0o700)

    nlmsg = ("import socket, struct\n"
             "s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2)\n"
             "m = b'from-the-step'\n"
             f"s.sendto(struct.pack('=IHHII', 16 + len(m), 0x10, 0, 1, 0) + m, ({ears.netlink_port}, 0))\n")
    pair = "import socket, os, array\na, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    cases = {
        "tcp: listen() with no bind()": tcp_listen,
        "tcp: a fast-open sendto() with no connect()": lambda: unheard(py(
            "import socket\n"
            f"socket.socket().sendto(b'x', socket.MSG_FASTOPEN, ('127.0.0.1', {ears.tcp.getsockname()[1]}))")),
        "unix: a socketpair's datagram end sent to a host socket file, with a descriptor": lambda: unheard(py(
            pair + "fd = os.open('.', os.O_RDONLY)\n"
            "a.sendmsg([b'from-the-step'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [fd]))],"
            f" 0, {ears.path!r})")),
        "unix: a socketpair's datagram end connected to a host socket file": lambda: unheard(py(
            pair + f"a.connect({ears.path!r}); a.send(b'from-the-step')")),
        "unix: a socketpair's datagram end sent to an abstract socket": lambda: unheard(py(
            pair + f"a.sendto(b'from-the-step', {ears.abstract_name!r})")),
        "netlink: NETLINK_USERSOCK to a host process": lambda: unheard(py(nlmsg)),
        "terminal: read what is typed on another one": pty_read,
        "terminal: write on another one": pty_write,
        "terminal: change another one's modes": pty_modes,
        "metadata: chmod, utimes, setxattr of files outside": metadata_outside,
        "signal: SIGIO (F_SETOWN, F_SETSIG SIGKILL) to a process outside": lambda: alive(py(
            "import os, fcntl, signal\nr, w = os.pipe()\n"
            f"fcntl.fcntl(r, fcntl.F_SETOWN, {victim.pid})\n"
            "fcntl.fcntl(r, 10, signal.SIGKILL)\n"          # F_SETSIG
            "fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)\n"
            "os.write(w, b'x')")),
        "signal: pidfd_send_signal to a process outside": lambda: alive(py(
            f"import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({victim.pid}), signal.SIGKILL)")),
        "read: the key through an O_PATH descriptor reopened by /proc/self/fd": lambda: secret(py(
            "import os\n"
            "fd = os.open(os.path.expanduser('~/.ssh/id_ed25519'), os.O_PATH)\n"
            "print(open(f'/proc/self/fd/{fd}').read())")),
        "read: the key linked into the project by linkat(AT_EMPTY_PATH)": lambda: secret(py(
            "import os, ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "fd = os.open(os.path.expanduser('~/.ssh/id_ed25519'), os.O_PATH)\n"
            "libc.linkat(fd, b'', -100, b'll-key', 0x1000)\n"
            "libc.linkat(-100, f'/proc/self/fd/{fd}'.encode(), -100, b'll-key', 0x400)\n"
            "print(open('ll-key').read())") + "; rm -f ll-key"),
        "read: the key through /proc/<a process outside>/root": lambda: secret(
            f"cat /proc/{victim.pid}/root$HOME/.ssh/id_ed25519"),
    }
    try:
        every_case(cases, lambda name: cases[name]())
    finally:
        ears.close()
        victim.kill()
        victim.wait()
        shutil.rmtree(base, ignore_errors=True)


# --- what a step leaves behind, and what is left of the record ----------------------------------

@pytest.mark.both_uids("the daemon that restores the link and takes routes back runs as the step's uid")
def test_what_a_landlock_step_leaves_behind(ll):
    """Claims: processes a step leaves behind end with it, however the step ends (its command
    returning, or its `envgit run` killed: an agent's timeout); the `.envgit` link comes back
    after any step, so `envgit log`, `fsck` and `rewind` keep working; the project's state
    (journal, snapshots, the daemon's socket) out of the step's reach, its modes included, and
    a journal that cannot be read said, never shown as empty; an escape route a step
    wrote is taken back, so the person's next `git commit` runs nothing of the step's; how a
    step ended is recorded as it was (its reporter, under bubblewrap its pid 1, is out of its
    reach). Each case is one step; a marker file written, a hook run, a mode changed, `envgit
    log` failing or a forged exit recorded is the attack working."""
    a = ll
    link = a.root / ".envgit"
    state = os.readlink(link)
    started, late = a.root / "ll-started", a.root / "ll-late"
    hook, hook_ran = a.root / ".git" / "hooks" / "pre-commit", a.home / "ll-hook-ran"

    def relink():
        """Put the project back as the person would, for the next case."""
        os.chmod(a.root, 0o755)
        if os.path.islink(link) and os.readlink(link) == state:
            return
        if os.path.lexists(link):
            remove(link)
        os.symlink(state, link)
        if a.user:
            import pwd
            pw = pwd.getpwnam(a.user)
            os.lchown(link, pw.pw_uid, pw.pw_gid)
        for p in a.root.glob(".envgit-left-by-step-*"):
            remove(p)

    def killed_midway(script):
        """`script` runs as a step that writes its pid to ll-started first; once it has, the
        client is killed."""
        remove(started, late)
        with tempfile.TemporaryFile() as out:
            p = start(a, f"echo $$ > ll-started; {script}", out)
            try:
                assert wait_for(started), "the step never started"
            finally:
                kill_client(p)
        time.sleep(2)               # the daemon sees its client gone: the step is interrupted

    def thread_child():
        """A process forked by a thread of a background process is not in
        /proc/PID/task/PID/children of that process: the launcher does not see it to kill it,
        then waits for it once it is its own child (nothing ends it)."""
        remove(late)
        code = ("import os, threading, time\n"
                "if os.fork() == 0:\n"
                "    def t():\n"
                "        if os.fork() == 0:\n"
                "            time.sleep(3); open('ll-late', 'w').write('late'); os._exit(0)\n"
                "        time.sleep(60)\n"
                "    threading.Thread(target=t, daemon=True).start()\n"
                "    time.sleep(60); os._exit(0)\n")
        try:
            a.run(py(code), timeout=90)
            time.sleep(1)
            assert not late.exists(), "a process the step left behind ran on after its command ended"
        finally:
            remove(late)

    def client_killed():
        """No pid namespace dies with the launcher: only it and the reporter are killed (their
        parent-death signal), and the command is left running, unsandboxed by nothing but its
        Landlock domain, and recorded by nothing."""
        try:
            killed_midway("sleep 4; echo late > ll-late")
            time.sleep(4)
            assert not late.exists(), "the step's command ran on after its `envgit run` was killed"
        finally:
            stop_pid_in(started)
            remove(started, late)

    def link_gone_interrupted():
        """The link removed by a step whose client is then killed: the daemon's end of an
        interrupted step does not restore it, and with no `.envgit` no envgit command finds
        the project (not even `envgit run`, whose step's end would)."""
        try:
            killed_midway("rm -f .envgit; exec sleep 20")
            r = a.envgit("log")
            assert r.returncode == 0, f"after the step, envgit log: {r.stderr.strip()}"
            r = a.envgit("fsck")
            assert r.returncode == 0, f"after the step, envgit fsck: {r.stderr.strip()}"
        finally:
            stop_pid_in(started)
            remove(started)
            relink()

    def link_gone_root_read_only():
        """The link removed and the project's root made read-only (chmod is no Landlock
        right): a daemon that is not root cannot make the link again."""
        try:
            a.run("rm -f .envgit; chmod 555 .", timeout=60)
            r = a.envgit("log")
            assert r.returncode == 0, f"after the step, envgit log: {r.stderr.strip()}"
        finally:
            relink()

    def hook_interrupted():
        """.git/hooks is writable under Landlock and kept only by the take-back at the step's
        end; a step whose client is killed gets an `interrupted` end, which takes nothing
        back."""
        remove(hook, hook_ran)
        try:
            killed_midway(f"printf '#!/bin/sh\\ntouch {hook_ran}\\n' > .git/hooks/pre-commit; "
                          "chmod +x .git/hooks/pre-commit; exec sleep 20")
            a.host("git -c user.email=a@b -c user.name=a commit -q --allow-empty -m ll")
            assert not hook_ran.exists(), "the person's git commit ran a hook a step wrote"
        finally:
            stop_pid_in(started)
            remove(started, hook, hook_ran)

    def reporter_killed():
        """The reporter is the step's pid 1 under bubblewrap (no signal from inside reaches
        it); here it is a process of the step's own domain and uid: killed, the step's end
        says SIGKILL for a command that exited 0."""
        a.run("kill -9 $PPID; exit 0")
        got = json.loads(a.envgit("show", "last", "--json", check=True).stdout)
        assert got.get("exit_code") == 0, f"recorded {got.get('exit_code')} / {got.get('signal')} for `exit 0`"

    def journal_through_tmpdir():
        """The step's TMPDIR is a directory of the project's state (step-tmp/N): its parents
        hold the journal and the snapshots, reached by no rule of the step's."""
        r = a.run("cat $TMPDIR/../../journal.sqlite | head -c 64; ls $TMPDIR/../..; "
                  "ln -s ../../journal.sqlite $TMPDIR/j && head -c 64 $TMPDIR/j; "
                  "echo planted > $TMPDIR/../../ll-planted; mkdir $TMPDIR/../99; true")
        assert "SQLite format" not in r.stdout and "journal" not in r.stdout, r.stdout
        assert not os.path.exists(os.path.join(state, "ll-planted"))
        assert not os.path.exists(os.path.join(state, "step-tmp", "99"))

    def modes_of_state():
        st = os.path.join(state, "journal.sqlite"), os.path.join(state, "daemon.sock")
        return {p: os.stat(p).st_mode & 0o7777 for p in (state, *st) if os.path.exists(p)}

    saved_modes = modes_of_state()

    def put_modes_back():
        for p, m in saved_modes.items():
            os.chmod(p, m)

    def state_opened():
        """chmod(2) is no Landlock right, and it follows the `.envgit` link to the state dir
        the step cannot open: the daemon's socket (steps, approvals, rewinds as the person)
        and the journal opened to every user of the host."""
        try:
            a.run("chmod 0777 .envgit/ .envgit/daemon.sock .envgit/journal.sqlite; true")
            now = modes_of_state()
            assert not now[state] & 0o077 and all(not m & 0o022 for m in now.values()), \
                {os.path.basename(p): oct(m) for p, m in now.items()}
        finally:
            put_modes_back()

    def state_closed():
        """The same, the other way: the state dir made unreadable to its owner, envgit's
        commands (run as a user, whom no capability lets past a mode) cannot read it."""
        before = len(steps_of(a))
        try:
            a.run("chmod 0 .envgit/; true")
            r = a.envgit("log", "--json")
            got = json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else None
            got = got.get("steps", got) if isinstance(got, dict) else got
            assert got is not None and len(got) > before, \
                f"after the step, envgit log shows {got if got is None else len(got)} steps of " \
                f"{before + 1}, and says: {r.stderr.strip() or r.stdout.strip()[:200]}"
        finally:
            put_modes_back()

    cases = {
        "the journal and the state dir through the step's TMPDIR": journal_through_tmpdir,
        "the state dir, its socket and journal opened to every user": state_opened,
        "a child of a thread of a background process": thread_child,
        "the command, when its envgit run is killed": client_killed,
        "a hook written, the step interrupted": hook_interrupted,
        "the reporter killed": reporter_killed,
        "the link removed, the step interrupted": link_gone_interrupted,
        "the link removed, the project's root made read-only": link_gone_root_read_only,
        "the state dir made unreadable": state_closed,
    }
    try:
        every_case(cases, lambda name: cases[name]())
    finally:
        relink()
    # every step above, however it ended, says it ran with the weaker sandbox
    ran = [s for s in steps_of(a) if s["argv"][:1] == ["sh"]]
    assert ran and all("sandbox-degraded" in s["marks"] for s in ran), ran


# --- the policy ----------------------------------------------------------------------------------

@pytest.mark.parametrize("ll", ["root"], indirect=True)
def test_a_root_landlock_step(ll):
    """Claims, for a root step (uid 0 on the host here, its capabilities dropped): nothing
    outside the project, its TMPDIR and the project cache writable; a step cannot choose its
    policy; no chown of another's file; no setuid or setgid bit set by any call. Under Landlock
    envgit.yaml is writable (WEAKER), taken back at the step's end; a step that rewrites it and
    keeps running widens the policy the daemon reads for every step begun meanwhile (an
    agent's next tool call, or its own background one). Oracles: a file outside, writable by
    anyone on the host, unchanged; owners and modes on disk."""
    a = ll
    base = Path(tempfile.mkdtemp(prefix="envgit-llp-"))
    os.chmod(base, 0o755)
    outside = base / "outside.txt"
    outside.write_text("outside\n")
    os.chmod(outside, 0o666)
    ready, done = a.root / "ll-a-ready", a.root / "ll-b-done"
    policy = (a.root / "envgit.yaml").read_bytes()

    def policy_beside():
        widen = py("import os, time\n"
                   "t = open('envgit.yaml').read()\n"
                   f"t = t.replace('allow_write: [\".\"]', 'allow_write: [\".\", \"{outside}\"]')\n"
                   "open('envgit.yaml', 'w').write(t)\n"
                   "open('ll-a-ready', 'w').write('x')\n"
                   "t0 = time.time()\n"
                   "while not os.path.exists('ll-b-done') and time.time() - t0 < 40: time.sleep(0.1)\n")
        assert b'allow_write: ["."]' in policy, "the template changed: this case needs its allow_write line"
        try:
            with tempfile.TemporaryFile() as out:
                p = start(a, widen, out)
                try:
                    assert wait_for(ready), "step A never widened envgit.yaml"
                    a.run(f"echo written-by-step-b > {outside}; true", timeout=60)
                    done.write_text("x")
                    p.wait(60)
                finally:
                    if p.poll() is None:
                        kill_client(p)
            assert outside.read_text() == "outside\n", \
                "a step begun while another had rewritten envgit.yaml wrote outside the project"
        finally:
            remove(ready, done)
            (a.root / "envgit.yaml").write_bytes(policy)

    def chown_others():
        theirs, mine = a.root / "ll-theirs", a.root / "ll-mine"
        theirs.write_text("x")
        os.chown(theirs, 12345, 12345)
        try:
            take = py("import os\nos.lchown('ll-theirs', 0, 0)")
            a.run(f"chown 0:0 ll-theirs; echo y > ll-mine; chown 12345:12345 ll-mine; {take}; true")
            assert os.stat(theirs).st_uid == 12345, "a root step took another user's file"
            assert os.stat(mine).st_uid == 0, "a root step gave a file away (CAP_CHOWN)"
        finally:
            remove(theirs, mine)

    def special_bits():
        d = a.root / "ll-bits"
        code = ("import os\n"
                "for f, how in [('o', lambda p: os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o4755))),\n"
                "               ('c', lambda p: (open(p, 'w').close(), os.chmod(p, 0o4755))),\n"
                "               ('f', lambda p: (open(p, 'w').close(), os.chmod(os.open(p, os.O_RDONLY), 0o2755))),\n"
                "               ('d', lambda p: os.mkdir(p, 0o2755)),\n"
                "               ('n', lambda p: os.mknod(p, 0o4755))]:\n"
                "    try:\n        how('ll-bits/' + f)\n    except OSError:\n        pass\n")
        try:
            a.run("mkdir -p ll-bits; cp /bin/true ll-bits/t; chmod u+s ll-bits/t; "
                  f"install -m 4755 /bin/true ll-bits/i; {py(code)}; true")
            for p in d.iterdir():
                assert not os.lstat(p).st_mode & 0o6000, f"{p.name}: {oct(os.lstat(p).st_mode)}"
        finally:
            remove(d)

    cases = {
        "envgit.yaml rewritten by a step still running": policy_beside,
        "chown another user's file, give one away": chown_others,
        "setuid and setgid bits by every call": special_bits,
    }
    try:
        every_case(cases, lambda name: cases[name]())
    finally:
        (a.root / "envgit.yaml").write_bytes(policy)
        shutil.rmtree(base, ignore_errors=True)
