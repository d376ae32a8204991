"""Starting a sandbox: the one way every bubblewrap sandbox is started (a step of `envgit run`,
an agent's own sandbox, the sibling step the daemon starts for an agent's Bash call, the MCP
REPL). Standard library only: `envgit run` imports it on the hot path.

What every start gets, here and nowhere else:
- bwrap itself from a trusted system directory (`trusted_binary`), never from PATH: a step can
  write to a project's `.venv/bin`, which is on PATH whenever that venv is active;
- the seccomp filter (seccomp.py), handed to bwrap as a memfd;
- only fds 0, 1, 2 and the launcher's own: every other fd the caller inherited (a shell's
  `exec 7</secret`, a harness's pipe) is closed for bwrap, so the step sees none of them;
- bwrap's --info-fd (the sandbox's pid namespace and init pid, known before the command runs)
  and --block-fd (the command waits until the caller releases it): between the two, the caller
  ties the step's proxy credentials to that pid namespace (the gate refuses them from any
  other) and hands the terminal to the step's process group;
- a process group of its own (a session of its own when started by the daemon or another
  long-lived process): `kill 0` or `kill -KILL -1` inside signal the step's own processes only,
  never the `envgit run` that waits for it, the person's shell or the session daemon.
- with `report` (`envgit run`, whose exit status is the command's): the reporter (REPORTER)
  between bwrap and the command, which tells "died of signal N" from "exited 128+N" (bwrap's
  own status and --json-status-fd say 128+N for both) and finds the command (127 not found,
  126 not executable); bwrap itself ignores the terminal's SIGINT and SIGQUIT, which reach the
  command only (a command that traps Ctrl-C finishes with its own status).

Callers that spawn with their own process API (asyncio, anyio) use `Launch.argv`,
`Launch.pass_fds` and `start_new_session=True`; `envgit run` uses `Launch.spawn`.
"""

import _signal  # type: ignore[import-not-found]  # the builtin module (no stub): `signal` would import enum on the hot path
import os
import sys

from .seccomp import program

# Where bwrap and socat are taken from: directories only the system's package manager (root)
# writes, in this order. ENVGIT_BWRAP / ENVGIT_SOCAT may name an absolute path instead (set by
# the person outside any project; a path inside the project is refused).
TRUSTED_DIRS = ("/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin")

_found: dict[str, str] = {}

# argv[0] of a spec for the Landlock backend (a host where bwrap cannot make namespaces)
LANDLOCK = "envgit-landlock"


class LaunchError(Exception):
    """The sandbox cannot be started (bwrap missing or untrusted), worded for the person."""


# The reporter: the command's parent inside the sandbox, and the sandbox's pid 1 (bwrap's own
# pid 1 would reap the command and report signal N as exit 128+N, so only a process that waits
# for the command itself sees its real wait status); this one writes it ("$?\n", the raw status)
# to the fd named first, then exits as bwrap would. Perl: installed wherever git is (git needs
# it); it costs a step ~5 ms (perl's start ~2.3 ms, its fork and wait, the seccomp filter on
# both; bare bwrap is ~8.5 ms on the same machine), where a Python reporter costs ~11 ms to
# start alone (a compiled one would cost ~1 ms, but needs a build step). Its argv: FD, the
# signals the command gets at their default disposition (INT,QUIT unless envgit run's caller
# ignored them), NAME=VALUE / NAME items that restore the command's own PERL5OPT, PERLIO,
# PERL_BADLANG (the reporter starts without them: they would load modules into it, or print
# locale warnings), "--", the command. The command gets no fd of the reporter's (the report fd
# is closed before exec), and it is found as a shell would: not found 127, not executable 126.
REPORTER = r"""$0 = "envgit-step";
my $fd = shift; my $prctl = shift; my $sigs = shift; my @env;
syscall($prctl, 4, 0, 0, 0, 0) if $prctl;     # PR_SET_DUMPABLE 0: see PRCTL_NR
while (@ARGV and (my $item = shift) ne "--") { push @env, $item }
open(my $report, ">&=", $fd) or exit 125;
my $pid = fork;
if (!defined $pid) { print STDERR "envgit: cannot start $ARGV[0]: $!\n"; exit 125 }
if (!$pid) {
  close $report;
  $SIG{$_} = "DEFAULT" for split /,/, $sigs;
  for (@env) { my ($k, $v) = split /=/, $_, 2; if (defined $v) { $ENV{$k} = $v } else { delete $ENV{$k} } }
  exec { $ARGV[0] } @ARGV;
  my $e = $! + 0;
  print STDERR "envgit: $ARGV[0]: ", ($e == 2 && $ARGV[0] !~ m{/} ? "command not found" : "$!"), "\n";
  exit($e == 2 ? 127 : 126);
}
my $got;     # pid 1 of the step's namespace: reap every orphan until the command ends
do { $got = waitpid(-1, 0) } while ($got != $pid && ($got > 0 || $! == 4));     # EINTR
$SIG{PIPE} = "IGNORE";
syswrite($report, "$?\n");
exit(($? & 127) ? 128 + ($? & 127) : $? >> 8);
"""
REPORTER_STASHED = ("PERL5OPT", "PERLIO", "PERL_BADLANG")

# prctl's number, for the reporter to make itself not dumpable before it forks: the step runs
# as the reporter's own uid, and without this any process of the step could open
# /proc/<reporter>/fd/<report fd> (a pipe: a new writable end) and write a status of its
# choosing first (red team 12). Not dumpable, its /proc/PID/fd needs CAP_SYS_PTRACE, which no
# step has. The command is unaffected: exec makes it dumpable again. A machine not listed here
# keeps the reporter dumpable (docs/THREATS.md).
PRCTL_NR = {"x86_64": 157, "aarch64": 167, "riscv64": 167, "i686": 172, "armv7l": 172,
            "ppc64le": 171, "s390x": 172}


def trusted_binary(name: str, project_root: str | None = None) -> str:
    """The absolute path of `name` (bwrap, socat) from TRUSTED_DIRS, or from $ENVGIT_<NAME> when
    set; resolved once per process. Never PATH: a project's activated virtualenv puts a
    directory every step can write at its front."""
    if name in _found:
        return _found[name]
    var = "ENVGIT_" + name.upper()
    configured = os.environ.get(var)
    if configured:
        path = _check_configured(var, configured, project_root)
    else:
        path = None
        for d in TRUSTED_DIRS:
            p = os.path.join(d, name)
            if _usable(p):
                path = p
                break
        if path is None:
            raise LaunchError(f"{name} is not installed in {', '.join(TRUSTED_DIRS)} (envgit does "
                              f"not take it from PATH; set {var}=/absolute/path to use another); "
                              "run `envgit doctor` for the fix")
    _found[name] = path
    return path


def _usable(path):
    try:
        st = os.stat(path)
    except OSError:
        return False
    # not writable by anyone but its owner, and owned by root or by whoever runs envgit
    return (st.st_mode & 0o170000 == 0o100000 and st.st_mode & 0o111 and not st.st_mode & 0o022
            and st.st_uid in (0, os.getuid()))


def _check_configured(var, value, project_root):
    if not os.path.isabs(value):
        raise LaunchError(f"{var}={value} must be an absolute path")
    real = os.path.realpath(value)
    if project_root and (real == project_root or real.startswith(project_root.rstrip("/") + "/")):
        raise LaunchError(f"{var}={value} is inside the project {project_root}, where a step can "
                          "replace it; install it outside the project")
    if not _usable(real):
        raise LaunchError(f"{var}={value} is not an executable file writable only by its owner")
    return real


def bwrap_path(project_root=None) -> str:
    return trusted_binary("bwrap", project_root)


class Launch:
    """One sandbox start. `spec_argv` is the daemon's bwrap command line (its argv[0] is only a
    name: the binary is `bwrap_path()`).

        launch = Launch(spec_argv)
        pid = launch.spawn(env)                 # or: spawn with launch.argv / launch.pass_fds,
        launch.spawned()                        #     then call spawned()
        info = launch.ready()                   # {"pid-namespace", "child-pid"} (blocks briefly)
        ... tie credentials to info["pid-namespace"], hand over the terminal ...
        launch.release()                        # the command starts now
        ... wait for bwrap ...
        code, sig = launch.outcome(status)      # with report=True: the command's own

    `report`: the reporter (REPORTER) runs the command and tells its real wait status; only
    with `spawn`, whose caller reads it with outcome().
    """

    def __init__(self, spec_argv, project_root=None, report=False):
        # A spec for a host without user namespaces (spec.py) names LANDLOCK: the same
        # arguments, taken by landlock_run.py in bwrap's stead, on this interpreter.
        self.landlock = landlock = spec_argv[0] == LANDLOCK
        self.bwrap = sys.executable if landlock else bwrap_path(project_root)
        self.perl = trusted_binary("perl", project_root) if report and not landlock else None
        self.report_r = None
        self._mine = []          # parent ends, closed by close()
        self._child = []         # the ends bwrap inherits, closed once it is spawned
        extra = [] if not landlock else ["-I", "-S", os.path.join(os.path.dirname(__file__), "landlock_run.py")]
        prog = program(sockets_tcp_only=landlock)
        if prog is not None:
            fd = os.memfd_create("envgit-seccomp", os.MFD_CLOEXEC)
            os.write(fd, prog)
            os.lseek(fd, 0, os.SEEK_SET)
            self._child.append(fd)
            extra += ["--seccomp", str(fd)]
        self.info_r, info_w = os.pipe()
        block_r, self.block_w = os.pipe()
        self._mine += [self.info_r, self.block_w]
        self._child += [info_w, block_r]
        extra += ["--info-fd", str(info_w), "--block-fd", str(block_r)]
        self.argv = [self.bwrap, *extra, *spec_argv[1:]]
        if report:
            # the reporter's fd is one bwrap passes on (it hands every inherited fd to the
            # sandbox); the reporter goes right after bwrap's `--` (no option value is `--`:
            # they are names and absolute paths), before the network bridge if there is one
            self.report_r, report_w = os.pipe()
            os.set_blocking(self.report_r, False)
            self._mine.append(self.report_r)
            self._child.append(report_w)
            # The reporter is the namespace's pid 1 (--as-pid-1, in bwrap's reaper's stead):
            # the kernel delivers no signal from inside the namespace to a pid 1 that has no
            # handler for it, so the command's `kill -KILL -1` cannot take its own reporter
            # down (and with it, as pid 1's death kills the namespace, the command itself).
            cut = self.argv.index("--")
            self.argv[cut:cut] = ["--as-pid-1"]
            cut += 2
            self._reporter_at = cut
            self._report_fd = report_w
            # SIGINT/SIGQUIT ignored by whoever started this process (`nohup`, a script's `&`)
            # stay ignored in the command, as they would without envgit (read before the caller
            # installs its own handlers to pass them on)
            self._caller_ignored = {n for n in ("INT", "QUIT")
                                    if _signal.getsignal(getattr(_signal, "SIG" + n)) == _signal.SIG_IGN}
        self.pass_fds = tuple(self._child)
        self.info = None
        self.pid = None
        self.started = None      # outcome(): False when bwrap failed before the command ran

    def spawn(self, env, *, new_session=False, stdio=None) -> int:
        """posix_spawn bwrap in a process group of its own (with `new_session`, a session of its
        own); `stdio`: three fds for its stdin, stdout, stderr (default: this process's)."""
        keep = {*self._child, 0, 1, 2}
        _not_inherited(keep)
        for fd in self._child:
            os.set_inheritable(fd, True)
        actions = [(os.POSIX_SPAWN_DUP2, fd, n) for n, fd in enumerate(stdio)] if stdio else []
        kw = {"setsid": True} if new_session else {"setpgroup": 0}
        # Default dispositions and an empty mask: an ignored or blocked signal would survive
        # exec into the command (bwrap passes both on). With the reporter, bwrap ignores the
        # terminal's SIGINT and SIGQUIT (it would die of Ctrl-C, and take the command with it
        # before the command's own handler finished), and the reporter gives the command them
        # at their default, unless the caller of this process ignored them.
        reset, argv = _RESET_SIGNALS, self.argv
        ignored: tuple = ()
        if self.report_r is not None:
            ignored = (_signal.SIGINT, _signal.SIGQUIT)
            reset = tuple(s for s in _RESET_SIGNALS if s not in ignored)
            argv, env = self.command_line(env)
        old = {s: _signal.signal(s, _signal.SIG_IGN) for s in ignored}
        try:
            self.pid = os.posix_spawn(self.bwrap, argv, env, file_actions=actions,
                                      setsigdef=reset, setsigmask=(), **kw)
        finally:
            for s, h in old.items():
                _signal.signal(s, h)
            self.spawned()
        return self.pid

    def command_line(self, env):
        """(argv, env) to start bwrap with: with the reporter, the argv has it before the
        command and the environment is the command's less what would act on perl (the reporter
        restores it). A caller that spawns with its own process API (the daemon's asyncio) uses
        this, and outcome() with the wait status (asyncio's returncode -N is status N, M >= 0
        is M << 8)."""
        if self.report_r is None:
            return self.argv, env
        sigs = ",".join(n for n in ("INT", "QUIT") if n not in self._caller_ignored)
        if self.landlock:       # landlock_run.py reports itself, from outside the step's domain
            at = self._reporter_at - 1          # its options go before the `--`
            return [*self.argv[:at], "--report-fd", str(self._report_fd), "--report-signals", sigs or "-",
                    *self.argv[at:]], env
        stash = [f"{k}={env[k]}" if k in env else k for k in REPORTER_STASHED]
        env = {k: v for k, v in env.items() if k not in REPORTER_STASHED}
        env["PERL_BADLANG"] = "0"
        at = self._reporter_at
        prctl = str(PRCTL_NR.get(os.uname().machine, 0))
        argv = [*self.argv[:at], self.perl, "-e", REPORTER, str(self._report_fd), prctl, sigs, *stash, "--",
                *self.argv[at:]]
        return argv, env

    def outcome(self, status) -> tuple[int, int]:
        """(exit code, signal number or 0) of the command, from bwrap's wait status and the
        reporter's: the command's own exit code (a chosen 130 stays 130, signal 0), or 128+N and
        N when it died of signal N. (125, 0) when the sandbox did not start (bwrap failed before
        the command: it said why on stderr)."""
        raw = b""
        self.started = True
        if self.report_r is not None:
            try:
                raw = os.read(self.report_r, 64)
            except (BlockingIOError, OSError):
                raw = b""
        if raw.strip().isdigit():
            st = int(raw)
            return (128 + (st & 0x7f), st & 0x7f) if st & 0x7f else (st >> 8 & 0xff, 0)
        if os.WIFSIGNALED(status):          # bwrap itself was killed (kill 0 inside reaches it)
            sig = os.WTERMSIG(status)
            return 128 + sig, sig
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 255
        if self.report_r is None:           # no reporter: bwrap's 128+N is all there is
            return code, (code - 128 if 128 < code < 128 + 65 else 0)
        if code > 128:                      # the reporter itself was killed: the sandbox with it
            return code, code - 128
        self.started = False
        return 125, 0

    def spawned(self, pid=None):
        """bwrap has its ends: close them here (else a dead bwrap would leave ready() waiting)."""
        if pid is not None:
            self.pid = pid
        for fd in self._child:
            os.close(fd)
        self._child = []

    def ready(self) -> dict:
        """bwrap's --info-fd document, written once the namespaces exist and before the command
        runs: {"child-pid", "pid-namespace", …}. ValueError if bwrap ended without one."""
        if self.info is None:
            self.info = read_info(self.info_r)
        return self.info

    def release(self):
        """Let the command run (bwrap reads one byte from --block-fd)."""
        if self.block_w is not None:
            try:
                os.write(self.block_w, b"x")
            except OSError:
                pass             # bwrap is gone; its status says why
            os.close(self.block_w)
            self._mine.remove(self.block_w)
            self.block_w = None

    def command_pids(self) -> list[int]:
        """The command's processes as this namespace sees them: the children of the sandbox's
        pid 1 (bwrap's reaper, or the reporter in its stead); empty before ready() or once
        they are gone."""
        init = (self.info or {}).get("child-pid")
        return _children(init) if init else []

    def signal(self, signum):
        """Send `signum` to the command (not to bwrap, which would only die of it and take the
        command with it by SIGKILL), or to bwrap while the command does not run yet."""
        for p in self.command_pids() or ([self.pid] if self.pid else []):
            try:
                os.kill(p, signum)
            except OSError:
                pass

    def close(self):
        for fd in self._mine + self._child:
            try:
                os.close(fd)
            except OSError:
                pass
        self._mine, self._child, self.block_w = [], [], None


# The placeholders sandbox/kernel.py binds over the paths it masks, in the state directory's
# sandbox/ (its _sentinels makes them): the only binds the client may leave out on a second start.
COVERS = ("kernel-hidden", "kernel-hidden-dir")


def cover_paths(state_dir: str) -> tuple[str, ...]:
    return tuple(os.path.join(state_dir, "sandbox", name) for name in COVERS)


def without_gone_masks(argv: list[str], state_dir: str) -> tuple[list[str], list[str]] | None:
    """bwrap's command line without the masks over paths gone from the host since the daemon
    built it, and those paths; None when no mask's path is gone. A mask here is kernel.py's:
    one of its placeholders (`cover_paths`, mode 000) bound read-only over a root-only host
    path. bwrap must create a missing mount point, and cannot in a read-only /etc: a root-only
    lock or temporary file (useradd's, passwd's) removed in those milliseconds failed the step
    before its command ran. What is gone has nothing to hide; the caller checks that it is
    still gone once the second sandbox is made (run.py), and fails closed if it is back.
    Any other bind (a protected path bound over itself, whatever its mode) is never left out."""
    covers = cover_paths(state_dir)
    out, dropped, i = [], [], 0
    while i < len(argv):
        if argv[i] == "--ro-bind" and i + 2 < len(argv) and argv[i + 1] in covers and _is_cover(argv[i + 1]):
            try:
                os.lstat(argv[i + 2])
            except FileNotFoundError:
                dropped.append(argv[i + 2])
                i += 3
                continue
        out.append(argv[i])
        i += 1
    return (out, dropped) if dropped else None


def _is_cover(path: str) -> bool:
    """A mode-000 regular file or directory, as kernel.py keeps its placeholders. (Not its
    size: an empty directory's differs from one filesystem to the next.)"""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_mode & 0o7777 == 0 and st.st_mode & 0o170000 in (0o040000, 0o100000)


def _children(pid) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _not_inherited(keep):
    """Every open fd of this process but `keep` marked close-on-exec: fds the caller's shell or
    harness left open (`exec 7</secret 8>>/outside; envgit run …`) are inheritable here, and
    posix_spawn would hand them to bwrap and so to the step, a way out of its view and policy.
    (Python's own fds are close-on-exec already; spawning through subprocess closes the rest.)
    A few µs per fd: /proc/self/fd lists what is open."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:                         # no /proc: every fd number up to the limit
        fds = range(3, os.sysconf("SC_OPEN_MAX"))
    for fd in fds:
        if fd not in keep:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass                        # the listing's own fd, closed since


def read_info(fd) -> dict:
    """bwrap's --info-fd document: its integer fields. Read without `json`, whose import (it
    pulls in `re`) would cost a step ~5 ms: the document is a flat object of numbers."""
    data = b""
    while not data.rstrip().endswith(b"}"):
        chunk = os.read(fd, 4096)
        if not chunk:
            raise ValueError("bwrap wrote no --info-fd document")
        data += chunk
        if len(data) > 65536:
            raise ValueError("bwrap's --info-fd document is too long")
    out = {}
    for item in data.decode().strip().strip("{}").split(","):
        key, _, value = item.partition(":")
        out[key.strip().strip('"')] = int(value)
    return out


def _signals(*names):
    import _signal
    return tuple(getattr(_signal, n) for n in names)


_RESET_SIGNALS = _signals("SIGINT", "SIGQUIT", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGPIPE", "SIGXFSZ",
                          "SIGHUP", "SIGTERM", "SIGCHLD")



class Foreground:
    """The terminal handed to a step's process group and taken back, as a shell's job control
    does. Only while this process has a controlling terminal, holds its foreground (now, or
    after the person's `fg` of a job started in the background) and shares its process group
    with no sibling (in `envgit run cmd | less`, less keeps the terminal: the step stays in the
    background and the person's Ctrl-C reaches it through this process). The terminal's modes
    are saved before and restored after, whatever the command did to them."""

    def __init__(self):
        self.tty = self.modes = self.step_modes = None
        self.given_to = None
        try:
            self.tty = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            return                                # no controlling terminal
        try:
            if _shares_group():
                raise OSError
            import termios  # only with a terminal: ~0.5 ms
            self._termios = termios
        except Exception:                         # not ours to hand over: leave it be
            os.close(self.tty)
            self.tty = None

    @property
    def active(self) -> bool:
        """This process may hand the terminal over (when it holds it)."""
        return self.tty is not None

    def give(self, pgid, modes=None):
        """The foreground to `pgid`, if this process holds it (else nothing: a background job
        is left in the background)."""
        if not self.is_foreground():
            return
        if self.modes is None:
            try:
                self.modes = self._termios.tcgetattr(self.tty)
            except Exception:
                return
        if modes is not None:
            self._set_modes(modes)
        try:
            _ignoring_ttou(os.tcsetpgrp, self.tty, pgid)
            self.given_to = pgid
        except OSError:
            pass

    def take(self):
        """The terminal back to this process's group, with the modes it had before; the step's
        modes are kept in step_modes, for give() after a stop."""
        if self.tty is None or self.given_to is None:
            return
        try:
            self.step_modes = self._termios.tcgetattr(self.tty)
        except Exception:
            self.step_modes = None
        try:
            _ignoring_ttou(os.tcsetpgrp, self.tty, os.getpgrp())
        except OSError:
            pass
        self.given_to = None
        self._set_modes(self.modes)

    def is_foreground(self) -> bool:
        try:
            return self.tty is not None and os.tcgetpgrp(self.tty) == os.getpgrp()
        except OSError:
            return False

    def _set_modes(self, modes):
        try:
            _ignoring_ttou(self._termios.tcsetattr, self.tty, self._termios.TCSADRAIN, modes)
        except Exception:
            pass

    def close(self):
        self.take()
        if self.tty is not None:
            os.close(self.tty)
            self.tty = None


def _ignoring_ttou(fn, *args):
    """A background process changing the terminal is sent SIGTTOU (and stopped) unless it
    ignores it, as shells do when they take the terminal back."""
    import _signal
    old = _signal.signal(_signal.SIGTTOU, _signal.SIG_IGN)
    try:
        return fn(*args)
    finally:
        _signal.signal(_signal.SIGTTOU, old)


def _shares_group() -> bool:
    """Another child of our parent is in our process group: we are one command of a pipeline
    (`envgit run cmd | less`), whose other members may need the terminal."""
    me, parent, group = os.getpid(), os.getppid(), os.getpgrp()
    try:
        with open(f"/proc/{parent}/task/{parent}/children") as f:
            siblings = [int(p) for p in f.read().split() if int(p) != me]
    except OSError:
        return False
    for p in siblings:
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                stat = f.read()
            if int(stat[stat.rindex(b")") + 2:].split()[2]) == group:
                return True
        except (OSError, ValueError, IndexError):
            pass
    return False
