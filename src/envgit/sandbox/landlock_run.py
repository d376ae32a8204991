"""A step's start where bubblewrap cannot make namespaces: the Landlock + seccomp backend
(docs/ARCHITECTURE.md "Hosts without user namespaces").

It takes bwrap's own command line, the one the daemon built for the step (sandbox/spec.py), so
the view is drawn once, in one place, for both backends; launch.Launch runs this file in bwrap's
stead (`python -I -S landlock_run.py ARGS… -- COMMAND…`). What each argument becomes:

  --ro-bind P P, --bind P P     a Landlock rule: P readable (and executable), or writable too
  --ro-bind S D, --bind S D     S allowed, D left out: a path shown as another cannot be shown
                                here (the caller points the program at S instead: TMPDIR,
                                GIT_CONFIG_GLOBAL); a placeholder over a denied path (a mask)
                                thus makes the path unreadable rather than replaced
  --tmpfs D                     D left out (empty in bwrap: nothing of it here)
  --proc /proc                  /proc readable; Landlock's own ptrace rule keeps every process
                                outside the step's domain from it (environ, mem, fd)
  --dev /dev                    the terminal and the harmless devices, and nothing else
  --seccomp FD                  the same filter, installed by this process before the exec
  --info-fd, --block-fd         the same protocol: {"child-pid", "pid-namespace"} written once
                                the command's process exists, the command held until released
  --cap-drop ALL                every capability and the bounding set dropped, root's exec
                                gaining none back (SECBIT_NOROOT)
  --die-with-parent             PR_SET_PDEATHSIG
  --unshare-*, --hostname,
  --as-pid-1, --dir, --symlink,
  --remount-ro                  nothing: there are no namespaces to make

Landlock rights add up along a path and cannot be taken back beneath it. A read-only tree with
something hidden inside (/etc with /etc/shadow masked) is therefore allowed entry by entry,
down to the hidden path's directory, each entry but the hidden one; a writable tree cannot be
treated so (a file made later at its top would have no rule), and what its view hides or keeps
read-only inside it stays as the tree is: `plan` lists those as not enforced, and the step's
record says so. A process the step leaves behind is ended with it: this process is the step's
subreaper, and kills what is left once the command has ended, as the end of bwrap's pid
namespace would.

Standard library only; of envgit's own, paths.py, landlock.py and landlock_meta.py.
"""

import _signal  # type: ignore[import-not-found]  # the builtin: `signal` imports enum
import ctypes
import os
import sys
import time

if __name__ == "__main__":      # run as a file (`python -I -S`): envgit from where this file is
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from envgit.paths import inside  # noqa: E402

R, RW, NONE = "r", "rw", "none"

# What the view's --dev gives a step: readable and writable, terminal ioctls allowed on its
# controlling terminal. Not /dev/pts nor /dev/ptmx: bwrap's --dev is a devpts of the step's
# own, the host's holds every terminal of the person (typed into, read from, stty'd), and a
# step's own terminal is open already (its stdio) before the rules apply.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")

_TAKES = {"--seccomp": 1, "--info-fd": 1, "--block-fd": 1, "--chdir": 1, "--hostname": 1,
          "--report-fd": 1, "--report-signals": 1,
          "--cap-drop": 1, "--ro-bind": 2, "--bind": 2, "--ro-bind-try": 2, "--bind-try": 2,
          "--symlink": 2, "--tmpfs": 1, "--dir": 1, "--proc": 1, "--dev": 1, "--remount-ro": 1}
_IGNORED = {"--as-pid-1", "--die-with-parent", "--disable-userns", "--new-session", "--unshare-user",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--unshare-net",
            "--unshare-all"}


class RunError(Exception):
    pass


def parse(args: list[str]) -> tuple[dict, list[tuple[str, str, str]], list[str]]:
    """(options, view operations [(kind, source, destination)] in order, the command)."""
    opts: dict = {"flags": set()}
    ops: list[tuple[str, str, str]] = []
    sources: list[tuple[str, str, str]] = []    # what a bind shows elsewhere, allowed last
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return opts, ops + sources, args[i + 1:]
        if a in _IGNORED:
            opts["flags"].add(a)
            i += 1
            continue
        n = _TAKES.get(a)
        if n is None or i + n >= len(args):
            raise RunError(f"the Landlock launcher does not take {a!r}")
        vals = args[i + 1:i + 1 + n]
        if a in ("--ro-bind", "--bind", "--ro-bind-try", "--bind-try"):
            src, dst = vals
            if src != dst and os.path.realpath(src) == os.path.realpath(dst):
                src = dst
            writable = a.startswith("--bind")
            if src == dst:
                ops.append((RW if writable else R, dst, dst))
            else:
                ops.append((NONE, dst, dst))
                # what is shown there, allowed by its own name (the program is pointed at it:
                # spec.landlock_environment), after the view so no operation of it covers it
                sources.append((RW if writable else R, src, src))
        elif a == "--tmpfs":
            ops.append((NONE, vals[0], vals[0]))
        elif a == "--proc":
            ops.append(("proc", vals[0], vals[0]))
        elif a == "--dev":
            ops.append(("dev", vals[0], vals[0]))
        else:
            opts[a] = vals[0] if n == 1 else vals
        i += 1 + n
    raise RunError("no command after --")


def plan(ops) -> tuple[list[tuple[str, str]], list[str]]:
    """([(path, R | RW)] to allow, [paths the view hides or keeps read-only that these rules
    cannot]). A later operation covers an earlier one at or below its path, as a later mount
    does in bwrap."""
    grants: list[tuple[str, str]] = []
    unenforced: list[str] = []
    for i, (kind, path, _) in enumerate(ops):
        if kind == NONE:
            continue
        if any(inside(path, later) for _, later, _ in ops[i + 1:]):
            continue                    # covered by a later operation at or above it
        if kind == "dev":
            grants += [(d, RW) for d in DEVICES if os.path.exists(d)]
            continue
        holes = [(k, p) for k, p, _ in ops[i + 1:] if inside(p, path) and p != path
                 and _less(k, kind)]
        if kind == "proc" or kind == RW:
            grants.append((path, R if kind == "proc" else RW))
            unenforced += [p for _, p in holes]
            continue
        _expand(path, kind, [p for _, p in holes], grants)
    return grants, sorted(set(unenforced))


def not_enforced(spec_argv) -> list[str]:
    """The paths a spec's view hides or keeps read-only that Landlock cannot (the daemon
    records them on the step)."""
    _, ops, _ = parse(spec_argv[1:])
    return plan(ops)[1]


def _less(k, than):
    rank = {NONE: 0, R: 1, "proc": 1, "dev": 1, RW: 2}
    return rank[k] < rank[than]


def _expand(top, kind, holes, grants):
    """Allow `top` for `kind` but none of `holes` beneath it: entry by entry down to each."""
    if not holes:
        grants.append((top, kind))
        return
    if top in holes:
        return
    grants.append((top, "list"))
    try:
        names = os.listdir(top)
    except OSError:
        return
    for name in names:
        child = os.path.join(top, name)
        inner = [h for h in holes if inside(h, child)]
        if child in inner or os.path.islink(child):
            continue        # a link is not allowed itself: what it leads to is judged by its own path
        if inner and os.path.isdir(child):
            _expand(child, kind, inner, grants)
        else:
            grants.append((child, kind))


def ruleset(grants, port=None):
    """The Landlock ruleset of `grants` (TCP: connect to `port` only, or to nothing)."""
    from envgit.sandbox import landlock as L
    rs = L.Ruleset(L.abi())
    rights = {R: L.READ, RW: L.READ | L.WRITE | L.IOCTL_DEV, "list": L.READ_DIR}
    for path, kind in grants:
        r = rights[kind]
        if kind == RW and path.startswith("/dev/"):
            r = L.READ_FILE | L.WRITE_FILE | L.READ_DIR | L.IOCTL_DEV
        rs.allow_path(path, r)
    if port:
        rs.allow_port(port)
    return rs


_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_CAPBSET_DROP = 1, 4, 36, 24
PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 28, 38, 22
SECCOMP_MODE_FILTER = 2
# SECBIT_NOROOT | _LOCKED, SECBIT_NO_SETUID_FIXUP | _LOCKED, SECBIT_KEEP_CAPS_LOCKED,
# SECBIT_NO_CAP_AMBIENT_RAISE | _LOCKED: uid 0 gains nothing by exec
SECUREBITS = 0x3 | 0xC | 0x20 | 0xC0
CAPSET_NR = {"x86_64": 126, "aarch64": 91}


def _prctl(*args, ok_fail=False):
    if _libc.prctl(*[ctypes.c_ulong(a) for a in args]) != 0 and not ok_fail:
        e = ctypes.get_errno()
        raise RunError(f"prctl({args[0]}): {os.strerror(e)}")


def drop_capabilities():
    """Root's capabilities gone for good, and none regained by an exec (what bwrap's
    --cap-drop ALL gives inside its namespace). Nothing to do for another uid."""
    if os.geteuid() != 0:
        return
    _prctl(PR_SET_SECUREBITS, SECUREBITS)
    for cap in range(64):
        _prctl(PR_CAPBSET_DROP, cap, ok_fail=True)       # past the last cap: EINVAL
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)         # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()                        # effective, permitted, inheritable x2: none
    nr = CAPSET_NR.get(os.uname().machine)
    if nr is None or _libc.syscall(ctypes.c_long(nr), header, data) != 0:
        raise RunError("cannot drop root's capabilities on this machine")


def install_seccomp(prog: bytes):
    from envgit.sandbox.landlock_meta import sock_fprog  # imported already (_meta_pipes)
    if _libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
                   sock_fprog(prog), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        raise RunError(f"cannot install the seccomp filter: {os.strerror(ctypes.get_errno())}")


def _read_all(fd):
    out = b""
    while chunk := os.read(fd, 65536):
        out += chunk
    return out


def _child(opts, grants, command, port):
    """In the command's process, before its exec: wait for the release, then restrict. Found
    as a shell finds a command: not found 127, not executable 126 (what bwrap's reporter says)."""
    _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)    # the launcher's own handler is not its
    _prctl(PR_SET_PDEATHSIG, 9)
    _prctl(PR_SET_DUMPABLE, 1)         # the launcher's pidfd_getfd of its listener needs it
    block = opts.get("--block-fd")
    if block is not None:
        os.read(int(block), 1)
        os.close(int(block))
    if opts.get("--report-fd") is not None:
        os.close(int(opts["--report-fd"]))
    prog = b""
    if opts.get("--seccomp") is not None:
        fd = int(opts["--seccomp"])
        os.lseek(fd, 0, os.SEEK_SET)
        prog = _read_all(fd)
        os.close(fd)
    rs = ruleset(grants, port)
    if opts.get("--chdir"):
        os.chdir(opts["--chdir"])
    if opts.get("--cap-drop"):
        drop_capabilities()
    rs.restrict()                      # no_new_privs first, then the domain for good
    if prog:
        install_seccomp(prog)
    meta = opts.get("meta")
    if meta is not None:               # chmod and its kin, judged by the launcher (landlock_meta.py)
        from envgit.sandbox import landlock_meta
        os.close(meta[0])
        os.close(meta[3])
        listener = landlock_meta.install()
        os.write(meta[1], f"{listener}\n".encode())
        os.close(meta[1])
        os.read(meta[2], 1)            # the launcher holds its own copy now
        os.close(meta[2])
        os.close(listener)
    for name in (opts.get("--report-signals") or "").split(","):
        if name in ("INT", "QUIT"):     # the terminal's, at their default in the command
            _signal.signal(getattr(_signal, "SIG" + name), _signal.SIG_DFL)
    e = _exec(command)
    missing = isinstance(e, (FileNotFoundError, NotADirectoryError))
    said = "command not found" if missing and "/" not in command[0] else e.strerror
    os.write(2, f"envgit: {command[0]}: {said}\n".encode(errors="replace"))
    os._exit(127 if missing else 126)


def _exec(command) -> OSError:
    """execvp's search of PATH, without its import of `warnings` (which, under the rules just
    applied, could not read the interpreter's own library); returns the error if nothing ran."""
    if "/" in command[0]:
        dirs = [""]
    else:
        dirs = (os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin").split(":")
    saved: OSError | None = None
    last: OSError | None = None
    for d in dirs:
        try:
            os.execv(os.path.join(d, command[0]) if d else command[0], command)
        except (FileNotFoundError, NotADirectoryError) as e:
            last = e
        except OSError as e:
            last = e
            saved = saved or e
    return saved or last or FileNotFoundError(2, "No such file or directory")


def _descendants(pid):
    """Every process below `pid`, through every thread's children (a process forked by a
    thread is that thread's child, not the main thread's)."""
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        kids = []
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                try:
                    with open(f"/proc/{p}/task/{t}/children") as f:
                        kids += [int(x) for x in f.read().split()]
                except OSError:
                    pass
        except OSError:
            pass
        out += kids
        stack += kids
    return out


def _end_leftovers(rounds=200):
    """Kill everything below this process (its subreaper's orphans too) and reap them, until
    none is left or `rounds` passes are done (a step forking faster than it is killed)."""
    for _ in range(rounds):
        left = _descendants(os.getpid())
        for p in left:
            try:
                os.kill(p, 9)
            except OSError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] <= 0:
                    break
            except ChildProcessError:
                break
        if not left:
            return
        time.sleep(0.005)


def _meta_pipes(opts):
    """(the child's fd-number pipe, its write end, the ack pipe's read end) for the metadata
    supervisor, or None where it is not supported (landlock_meta.py)."""
    from envgit.sandbox import landlock_meta
    if not landlock_meta.supported():
        return None
    num_r, num_w = os.pipe()
    ack_r, ack_w = os.pipe()
    opts["meta"] = (num_r, num_w, ack_r, ack_w)
    return num_r, num_w, ack_r, ack_w


def _supervise(opts, grants, pid, meta):
    """Take the step's listener and answer its metadata calls from a thread of this process
    (outside the step's domain): the writable places are the step's read-write rules."""
    from envgit.sandbox import landlock_meta
    num_r, num_w, ack_r, ack_w = meta
    os.close(num_w)
    os.close(ack_r)
    data = b""
    while not data.endswith(b"\n") and (chunk := os.read(num_r, 32)):
        data += chunk
    os.close(num_r)
    if not data.strip().isdigit():
        os.close(ack_w)                 # the child failed before: its status says why
        return
    try:
        listener = landlock_meta.take_listener(pid, int(data))
    except OSError as e:
        print(f"envgit: cannot judge the step's chmod calls: {e}", file=sys.stderr)
        os.kill(pid, 9)                 # never run it with them unjudged
        os.close(ack_w)
        return
    os.write(ack_w, b"k")
    os.close(ack_w)
    writable = [p for p, kind in grants if kind == RW and not p.startswith("/dev/")]
    landlock_meta.Supervisor(listener, writable).start()


def _on_parent_death(signum, frame):
    """Its caller (`envgit run`, the daemon) is gone: what the step runs ends with it, as bwrap's
    --die-with-parent ends its whole pid namespace."""
    _end_leftovers()
    os._exit(128 + signum)


def main(argv):
    try:
        opts, ops, command = parse(argv)
        port = int(os.environ.pop("ENVGIT_LANDLOCK_PORT", "0") or 0)
        if "--die-with-parent" in opts["flags"]:
            _signal.signal(_signal.SIGTERM, _on_parent_death)
            _prctl(PR_SET_PDEATHSIG, _signal.SIGTERM)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        _prctl(PR_SET_DUMPABLE, 0)      # its /proc/PID/fd (the report fd) for no one but root
        grants, _ = plan(ops)           # once, here: the child and the judge share it
    except (RunError, OSError, ValueError) as e:
        print(f"envgit: cannot start the step with Landlock: {e}", file=sys.stderr)
        return 125
    meta = _meta_pipes(opts)
    pid = os.fork()
    if pid == 0:
        try:
            if opts.get("--info-fd") is not None:
                os.close(int(opts["--info-fd"]))
            _child(opts, grants, command, port)
        except BaseException as e:      # noqa: BLE001 — anything before the exec is the start failing
            msg = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            print(f"envgit: cannot start the step with Landlock: {msg}", file=sys.stderr)
        os._exit(125)
    for key in ("--block-fd", "--seccomp"):
        if opts.get(key) is not None:
            os.close(int(opts[key]))
    # This process is the step's reporter, as the reporter is pid 1 under bwrap: outside the
    # step's Landlock domain, so nothing of the step can signal it, trace it or open its fds
    # (its report fd), and its children are the command's processes (Launch.command_pids).
    report = opts.get("--report-fd")
    if report is not None:
        os.set_inheritable(int(report), False)
    info = opts.get("--info-fd")
    if info is not None:
        ns = os.stat("/proc/self/ns/pid").st_ino
        os.write(int(info), f'{{"child-pid": {os.getpid()}, "pid-namespace": {ns}}}\n'.encode())
        os.close(int(info))
    if meta is not None:
        _supervise(opts, grants, pid, meta)
    while True:             # reap every orphan (this is their subreaper) until the command ends
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 125
        if got == pid:
            break
    if report is not None:
        try:
            os.write(int(report), f"{status}\n".encode())     # the raw wait status, as the reporter's
        except OSError:
            pass
    # what the command left behind (reparented here, its subreaper) ends with it, as the
    # step's pid namespace would end in bwrap
    _end_leftovers()
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
