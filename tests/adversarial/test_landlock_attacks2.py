"""Red team, second round: the Landlock + seccomp backend (sandbox/landlock_run.py,
landlock_meta.py) after the first round's holes were fixed, attacked from inside a step on a
host that refuses user namespaces (kit/nouserns.py). Each case is one way around one claim of
docs/THREATS.md's Landlock paragraph that sandbox/backend.py's WEAKER does not give up, with a
marker file, a canary or a host-side reading as its only oracle, and fails when the attack
works. The cases of one test share one project (`every_case`).

What these cases lean on:
- Landlock's scopes keep signals and ptrace inside the step's domain, but not every call that
  acts on another process by pid: prlimit(2), setpriority(2) and sched_setaffinity(2) ask only
  that the caller's uid match the target's, and a step's uid is the person's (or root);
- the launcher judges chmod, chown, utimensat and setxattr, but a file's inode flags
  (FS_IOC_SETFLAGS, chattr) are an ioctl on any file the step can open for reading;
- the launcher and the daemon are processes of the step's own uid, findable in /proc.
"""

import os
import resource
import subprocess
import time

import pytest

from harness import every_case, steps_of
from kit import nouserns
from landlockkit import py, remove

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group("landlock"),
              pytest.mark.skipif(not nouserns.available(), reason="making a host without user "
                                 "namespaces needs root and user namespaces (kit/nouserns.py)")]


def daemon_pids(a) -> list[int]:
    """The project's session daemon (`python -m envgit.daemon ROOT`), a process the test
    started through envgit."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"envgit.daemon" in argv and str(a.root).encode() in argv:
            out.append(int(d))
    return out


def open_files_limit(pid) -> str:
    """A process's RLIMIT_NOFILE as /proc/PID/limits (readable by anyone) shows it."""
    with open(f"/proc/{pid}/limits") as f:
        return next(line for line in f if line.startswith("Max open files")).strip()


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS = 0x80086601, 0x40086602
FS_NODUMP_FL, FS_NOATIME_FL = 0x40, 0x80


def inode_flags(path) -> int:
    import array
    import fcntl
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf, True)
        return buf[0]
    finally:
        os.close(fd)


@pytest.mark.both_uids("prlimit and setpriority compare the step's uid with the target's")
def test_a_landlock_step_acts_on_no_process_or_inode_outside(ll):
    """Claims: a step cannot act on a process outside it (THREATS: "signals and /proc of
    processes outside the step" held, "the launcher is out of the step's reach", "processes
    left behind" ended by the launcher), and changes no metadata of a file outside its
    writable places ("chmod, utimes and setxattr outside the project"). Oracles, read from
    the host: a victim process's limits, nice value and CPUs; a marker a leftover process
    writes after the step ended; `envgit log` after the step; a file's inode flags."""
    a = ll
    uid = {"user": a.user, "group": a.user, "extra_groups": []} if a.user else {}
    victim = subprocess.Popen(["sleep", "300"], **uid)
    shared = a.home / "shared"
    shared.mkdir()
    (shared / "notes.txt").write_text("outside\n")
    a.own(shared)
    policy = (a.root / "envgit.yaml").read_text()
    assert "allow_read: []" in policy, "the template changed: this test needs its allow_read line"
    a.write_policy(policy.replace("allow_read: []", f'allow_read: ["{shared}"]'))
    late = a.root / "ll2-late"

    def limits_of_a_process_outside():
        """prlimit(2) on a process of the same uid outside the step: no Landlock hook judges
        it. The person's editor, shell or agent gets RLIMIT_NOFILE 1 (hard too: it never
        gets it back), RLIMIT_CPU 1 s (SIGXCPU), RLIMIT_AS…"""
        before = open_files_limit(victim.pid)
        a.run(py(f"import resource\nresource.prlimit({victim.pid}, resource.RLIMIT_NOFILE, (1, 1))")
              + " 2>/dev/null; true")
        now = open_files_limit(victim.pid)
        assert now == before, f"a step set the open-file limit of process {victim.pid} outside it: {now}"

    def priority_of_a_process_outside():
        """setpriority(2) and sched_setaffinity(2) on a process of the same uid outside."""
        nice, cpus = os.getpriority(os.PRIO_PROCESS, victim.pid), os.sched_getaffinity(victim.pid)
        a.run(py(f"import os\nos.setpriority(os.PRIO_PROCESS, {victim.pid}, 19)") + " 2>/dev/null; "
              + py(f"import os\nos.sched_setaffinity({victim.pid}, {{min(os.sched_getaffinity(0))}})")
              + " 2>/dev/null; true")
        got = os.getpriority(os.PRIO_PROCESS, victim.pid), os.sched_getaffinity(victim.pid)
        assert got == (nice, cpus), f"a step reniced / pinned process {victim.pid} outside it: {got}"

    def leftover_after_launcher_limited():
        """The launcher (the step's parent, its subreaper, the one that ends what the step
        leaves running) given RLIMIT_NOFILE 0 by the step: its listing of /proc fails, it
        finds nothing to end, and a process the step left runs on after the step."""
        remove(late)
        try:
            a.run("setsid sh -c 'sleep 3; echo late > ll2-late' >/dev/null 2>&1 & "
                  "exec " + py("import os, resource\n"
                               "resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (0, 0))"),
                  timeout=60)
            time.sleep(5)
            assert not late.exists(), "a process the step left behind ran on after the step ended"
        finally:
            remove(late)

    def inode_flags_outside():
        """chattr: FS_IOC_SETFLAGS is an ioctl on any file the step can open for reading, and
        the owner may set most flags (no-dump, no-atime, sync...). A file of an allow_read
        tree outside the project changes."""
        f = shared / "notes.txt"
        before = inode_flags(f)
        a.run(py("import array, fcntl, os\n"
                 f"fd = os.open({str(f)!r}, os.O_RDONLY)\n"
                 "b = array.array('l', [0]); fcntl.ioctl(fd, 0x80086601, b, True)\n"
                 f"b[0] |= {FS_NODUMP_FL | FS_NOATIME_FL}; fcntl.ioctl(fd, 0x40086602, b, True)")
              + " 2>/dev/null; true")
        now = inode_flags(f)
        assert now == before, f"a step changed the inode flags of {f} outside it: {before:#x} -> {now:#x}"

    def daemon_limited():
        """The session daemon (journal, snapshots, the gate, every later envgit command) is a
        process of the step's uid, found in /proc: given RLIMIT_NOFILE 0 by the step, it can
        open nothing more, so the step's own end, and every later `envgit log`, fail. Last:
        it leaves the project's daemon crippled."""
        before = len(steps_of(a))
        pids = daemon_pids(a)
        assert pids, "the project's daemon is not running"
        try:
            a.run(py("import os, resource\n"
                     f"for p in {pids!r}:\n"
                     "    resource.prlimit(p, resource.RLIMIT_NOFILE, (0, 0))") + " 2>/dev/null; true",
                  timeout=60)
        except subprocess.TimeoutExpired:
            pass
        try:
            after = a.run("echo after > ll2-after", timeout=60)
            said = f"exit {after.returncode}: {after.stderr.strip()[:300]}"
        except subprocess.TimeoutExpired:
            said = "no answer in 60 s"
        r = a.envgit("log", "--json", timeout=60)
        got = steps_of(a) if r.returncode == 0 else []
        assert len(got) >= before + 2, \
            f"after a step limited the daemon, the next step ({said}) is not in envgit log " \
            f"({r.returncode}: {r.stderr.strip()[:300]}; {len(got)} steps, {before} before)"

    cases = {
        "prlimit: a process outside": limits_of_a_process_outside,
        "setpriority, sched_setaffinity: a process outside": priority_of_a_process_outside,
        "prlimit: the launcher, then a process left behind": leftover_after_launcher_limited,
        "FS_IOC_SETFLAGS (chattr): a file outside": inode_flags_outside,
        "prlimit: the session daemon": daemon_limited,
    }
    try:
        every_case(cases, lambda name: cases[name]())
    finally:
        victim.kill()
        victim.wait()
        for p in daemon_pids(a):        # a daemon that can open nothing cannot stop itself
            try:
                resource.prlimit(p, resource.RLIMIT_NOFILE, (1024, 1024))
            except OSError:
                try:
                    os.kill(p, 9)
                except OSError:
                    pass


@pytest.mark.parametrize("ll", ["root"], indirect=True)
def test_the_metadata_supervisor_acts_only_inside_and_keeps_answering(ll):
    """Claims (landlock_meta.py): chmod, chown, utimensat and setxattr are done for the step
    only on a file inside its writable places that its uid owns, "the inode checked is the
    inode changed" whatever the step names it by (an O_PATH descriptor, /proc/self/fd, a
    directory fd outside, AT_EMPTY_PATH, a link swapped in meanwhile), never on the project's
    state; and the launcher keeps answering whatever the step throws at it, so what a step
    needs (chmod +x, cp -p, tar x) still works. A root step, whose uid owns every root file of
    the host. Oracles: the mode, times and attributes of a file outside, of the state dir, and
    of files the step made."""
    a = ll
    shared = a.home / "shared"
    shared.mkdir()
    target = shared / "notes.txt"
    target.write_text("outside\n")
    os.chmod(target, 0o644)
    os.utime(target, (1_500_000_000, 1_500_000_000))
    policy = (a.root / "envgit.yaml").read_text()
    a.write_policy(policy.replace("allow_read: []", f'allow_read: ["{shared}"]'))
    state = os.readlink(a.root / ".envgit")

    def untouched():
        st = os.stat(target)
        return st.st_mode & 0o7777, st.st_mtime, os.listxattr(target)

    want = untouched()
    t = str(target)

    def every_name():
        """One step naming the file outside every way the supervisor resolves."""
        code = ("import ctypes, os\n"
                "libc = ctypes.CDLL(None, use_errno=True)\n"
                f"t = {t!r}\n"
                "def tryit(f, *a):\n"
                "    try: f(*a)\n"
                "    except OSError: pass\n"
                "fd = os.open(t, os.O_PATH)\n"
                "d = os.open(os.path.dirname(t), os.O_PATH)\n"
                "r = os.open(t, os.O_RDONLY)\n"
                "for n in (fd, r):\n"
                "    tryit(os.chmod, n, 0o777)\n"
                "    tryit(os.chmod, f'/proc/self/fd/{n}', 0o777)\n"
                "    tryit(os.chmod, f'/proc/{os.getpid()}/fd/{n}', 0o777)\n"
                "    tryit(os.utime, n, (1, 1))\n"
                "    tryit(os.setxattr, n, 'user.planted', b'x')\n"
                "    tryit(os.setxattr, f'/proc/self/fd/{n}', 'user.planted', b'x')\n"
                "    libc.fchmodat(n, b'', 0o777, 0x1000)\n"
                "    libc.syscall(452, n, b'', 0o777, 0x1000)\n"
                "    libc.utimensat(n, None, None, 0)\n"
                "tryit(os.chmod, 'notes.txt', 0o777, dir_fd=d)\n"
                "tryit(os.utime, 'notes.txt', (1, 1), dir_fd=d)\n"
                "os.symlink(t, 'll2-link'); tryit(os.chmod, 'll2-link', 0o777)\n"
                "tryit(os.utime, 'll2-link', (1, 1)); tryit(os.setxattr, 'll2-link', 'user.planted', b'x')\n"
                "os.unlink('ll2-link')\n"
                "libc.linkat(fd, b'', -100, b'll2-hard', 0x1000)\n"
                "tryit(os.chmod, 'll2-hard', 0o777)\n"
                "tryit(os.chmod, f'/proc/self/cwd/../shared/notes.txt', 0o777)\n")
        a.run(py(code) + " 2>&1; rm -f ll2-link ll2-hard; true")
        assert untouched() == want, f"the step changed {t}: {want} -> {untouched()}"

    def swapped():
        """A name in the project flipped between a file of the step's and a link to the file
        outside by one thread while another chmods, utimes and setxattrs it."""
        code = ("import os, threading, time\n"
                f"t = {t!r}\n"
                "open('ll2-mine', 'w').close(); os.symlink(t, 'll2-lnk')\n"
                "stop = time.time() + 2\n"
                "def flip():\n"
                "    while time.time() < stop:\n"
                "        os.rename('ll2-lnk', 'll2-swap'); os.rename('ll2-mine', 'll2-lnk')\n"
                "        os.rename('ll2-lnk', 'll2-mine'); os.rename('ll2-swap', 'll2-lnk')\n"
                "threading.Thread(target=flip).start()\n"
                "while time.time() < stop:\n"
                "    for f in (lambda: os.chmod('ll2-lnk', 0o777), lambda: os.utime('ll2-lnk', (1, 1)),\n"
                "              lambda: os.setxattr('ll2-lnk', 'user.planted', b'x')):\n"
                "        try: f()\n"
                "        except OSError: pass\n")
        a.run(py(code) + " 2>&1; rm -f ll2-mine ll2-lnk ll2-swap; true", timeout=60)
        assert untouched() == want, f"the step changed {t}: {want} -> {untouched()}"

    def the_state():
        """The state dir, its parent and its step-tmp reached through the step's TMPDIR and
        through the .envgit link."""
        places = [state, os.path.dirname(state), os.path.join(state, "step-tmp")]
        before = {p: os.stat(p).st_mode & 0o7777 for p in places}
        a.run('chmod 0777 "$TMPDIR/.." "$TMPDIR/../.." .envgit/.. .envgit/step-tmp; '
              'touch -d 2001-01-01 "$TMPDIR/../.."; true')
        now = {p: os.stat(p).st_mode & 0o7777 for p in places}
        assert now == before, f"the step changed the modes of the project's state: {before} -> {now}"

    def still_answers():
        """A bad pointer, a huge attribute, a flood from many threads, a process killed in
        the middle of its call: then what a step needs still works in the same step."""
        abuse = ("import ctypes, os, threading, signal\n"
                 "libc = ctypes.CDLL(None, use_errno=True)\n"
                 "libc.syscall(90, ctypes.c_void_p(8), 0o755)\n"
                 "libc.syscall(188, b'll2-a', b'user.big', ctypes.c_void_p(8), 1 << 30, 0)\n"
                 "libc.syscall(188, b'll2-a', ctypes.c_void_p(16), b'x', 1, 0)\n"
                 "libc.syscall(280, -100, b'll2-a', ctypes.c_void_p(24), 0)\n"
                 "kids = []\n"
                 "for _ in range(4):\n"
                 "    p = os.fork()\n"
                 "    if p == 0:\n"
                 "        while True: libc.chmod(b'll2-a', 0o644)\n"
                 "    kids.append(p)\n"
                 "def flood():\n"
                 "    for _ in range(300): libc.chmod(b'll2-a', 0o600)\n"
                 "ts = [threading.Thread(target=flood) for _ in range(4)]\n"
                 "[x.start() for x in ts]; [x.join() for x in ts]\n"
                 "for p in kids: os.kill(p, signal.SIGKILL); os.waitpid(p, 0)\n")
        try:
            a.run("touch ll2-a; " + py(abuse) + " 2>&1; "
                  "printf '#!/bin/sh\\necho ok\\n' > ll2-x.sh && chmod +x ll2-x.sh && "
                  "mkdir -p ll2-t && cp -p ll2-x.sh ll2-t/c.sh && tar cf ll2.tar ll2-x.sh && "
                  "mkdir -p ll2-u && tar xpf ll2.tar -C ll2-u && touch -d 2001-01-01 ll2-t/c.sh; true",
                  timeout=90)
            for p in ("ll2-x.sh", "ll2-t/c.sh", "ll2-u/ll2-x.sh"):
                f = a.root / p
                assert f.exists() and os.stat(f).st_mode & 0o111, \
                    f"{p}: {oct(os.stat(f).st_mode) if f.exists() else 'missing'}"
            assert time.gmtime(os.stat(a.root / "ll2-t/c.sh").st_mtime).tm_year == 2001
        finally:
            remove(*(a.root / p for p in ("ll2-a", "ll2-x.sh", "ll2-t", "ll2.tar", "ll2-u")))

    cases = {
        "a file outside, by every name": every_name,
        "a name swapped to a link outside meanwhile": swapped,
        "the project's state, through TMPDIR and the link": the_state,
        "abused, then chmod +x, cp -p, tar xp": still_answers,
    }
    every_case(cases, lambda name: cases[name]())
