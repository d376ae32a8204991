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

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import CANARY
from harness import every_case
from kit import nouserns
from landlockkit import Ears, kill_client, py, remove, start, wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group("landlock"),
              pytest.mark.skipif(not nouserns.available(), reason="making a host without user "
                                 "namespaces needs root and user namespaces (kit/nouserns.py)")]


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
