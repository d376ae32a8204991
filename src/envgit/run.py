"""`envgit run [--] CMD…`: the hot path. Standard library only (checked by a test with
`python -X importtime`): the daemon decides, this process only execs bwrap and waits.

stdin, stdout, stderr and the terminal are handed to the command as they are; Ctrl-C reaches
it through the terminal's process group as it would without envgit; SIGTERM and SIGHUP sent
to this process are passed on to the command; the exit status is the command's own.
"""

import _signal as signal   # the builtin: `signal` would import enum, ~3 ms per step
import os
import sys
import time

from .daemon.client import DaemonError, connect
from .paths import NoProject, find_project
from .sandbox.seccomp import program


SIGNAL_NAMES = {getattr(signal, n): n for n in dir(signal)
                if n.startswith("SIG") and not n.startswith("SIG_") and n not in ("SIGIOT", "SIGPOLL", "SIGCLD")}


def _which(name):
    for d in os.environ.get("PATH", "").split(os.pathsep):
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _fail(msg, code=2):
    print(msg, file=sys.stderr)
    return code


def run(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        return _fail("usage: envgit run [--] CMD [ARGS…]")
    cwd = os.getcwd()
    try:
        project = find_project(cwd)
    except NoProject as e:
        return _fail(f"envgit: {e}")
    bwrap = _which("bwrap")
    if bwrap is None:
        return _fail("envgit: bubblewrap (bwrap) is not installed; run `envgit doctor` for the fix")
    try:
        conn = connect(project)
        reply = conn.request({"op": "begin", "argv": argv, "cwd": os.path.realpath(cwd),
                              "env": dict(os.environ), "pid": os.getpid(),
                              "uid": os.getuid(), "session": os.environ.get("ENVGIT_SESSION"),
                              "tool_call_id": os.environ.get("ENVGIT_TOOL_CALL_ID")})
    except (DaemonError, OSError) as e:
        return _fail(f"envgit: {e}", 1)
    if "error" in reply:
        return _fail(reply["error"], reply.get("exit", 1))
    if "refused" in reply:
        print(reply["refused"], file=sys.stderr)
        return 126
    code, sig = execute(conn, reply["step"], bwrap, reply["bwrap"], reply["env"], reply.get("bind"))
    if sig and sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)     # die the way the command died, as a shell expects
        os.kill(os.getpid(), sig)
    return code


def execute(conn, step, bwrap, args, env, bind=False) -> tuple[int, int]:
    """Run the bwrap command line the daemon gave for `step` on this terminal, serving what
    the daemon pushes meanwhile, then end the step: (exit code, signal number or 0). With
    `bind`, the step's proxy credentials are tied to its sandbox before the command starts."""
    term = Terminal()
    conn.on_push = lambda frame: term.push(frame, conn)
    status, ms = _spawn_and_wait(bwrap, args, env, conn, term, step if bind else None)
    code, sig = _decode(status)
    try:
        conn.request({"op": "end", "step": step, "exit_code": code,
                      "signal": SIGNAL_NAMES.get(sig) if sig else None, "duration_ms": ms})
    except (DaemonError, OSError) as e:
        print(f"envgit: step {step} could not be closed ({e}); it is recorded as interrupted",
              file=sys.stderr)
    return code, sig


def _spawn_and_wait(bwrap, args, env, conn, term, bind_step=None):
    prog = program()
    fds = []
    extra = []
    if prog is not None:
        fd = os.memfd_create("envgit-seccomp", 0)
        os.write(fd, prog)
        os.lseek(fd, 0, os.SEEK_SET)
        fds.append(fd)
        extra = ["--seccomp", str(fd)]
    info_r, info_w = os.pipe()
    fds.append(info_w)
    extra += ["--info-fd", str(info_w)]
    if bind_step is not None:       # bwrap waits on this before it execs the command
        block_r, block_w = os.pipe()
        fds.append(block_r)
        extra += ["--block-fd", str(block_r)]
    for fd in fds:
        os.set_inheritable(fd, True)
    # Ctrl-C and Ctrl-\ go to the whole foreground process group, the command included:
    # this process only waits and must outlive the command to record it.
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGQUIT)}
    pid_box = {}

    def forward(signum, _frame):
        _forward(info_r, pid_box, signum)
    for s in (signal.SIGTERM, signal.SIGHUP):
        old[s] = signal.signal(s, forward)
    t0 = time.monotonic_ns()
    # the command gets default dispositions back: an ignored SIGINT would survive exec
    pid = os.posix_spawn(bwrap, [args[0], *extra, *args[1:]], env,
                         setsigdef=(signal.SIGINT, signal.SIGQUIT))
    pid_box["bwrap"] = pid
    for fd in fds:
        os.close(fd)
    if bind_step is not None:
        try:
            info = _read_info(info_r)
            pid_box["init"] = info.get("child-pid")
            conn.request({"op": "sandbox", "step": bind_step, "pidns": info.get("pid-namespace")})
        except (OSError, ValueError, DaemonError):
            pass                    # bwrap failed to start: its status says so below
        finally:
            os.write(block_w, b"x")
            os.close(block_w)
    _wait(pid, conn, term)
    _, status = os.waitpid(pid, 0)
    ms = round((time.monotonic_ns() - t0) / 1e6, 3)
    for s, h in old.items():
        signal.signal(s, h)
    os.close(info_r)
    return status, ms


def _wait(pid, conn, term):
    """Until the command exits, serve what the daemon pushes (asks, notices) and the
    person's answers typed at this terminal."""
    import select
    pidfd = os.pidfd_open(pid)
    sock = conn.sock.fileno()
    try:
        while True:
            watch = [pidfd] + ([sock] if sock is not None else []) + term.fds()
            ready, _, _ = select.select(watch, [], [])
            if sock in ready:
                if not conn.fill():
                    sock = None             # the daemon went away; the command goes on
                while conn.has_frame():
                    term.push(conn.read_frame(), conn)
            if term.fds() and term.fds()[0] in ready:
                term.typed(conn)
            if pidfd in ready:
                return
    finally:
        os.close(pidfd)
        term.close()


class Terminal:
    """Questions from the gate, answered at this terminal when there is one."""

    def __init__(self):
        try:
            self.tty = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
        except OSError:
            self.tty = None
        self.waiting = []          # asks not yet answered, the first one being prompted

    def fds(self):
        return [self.tty] if self.tty is not None and self.waiting else []

    def say(self, text):
        os.write(2, (text + "\n").encode())

    def push(self, frame, conn):
        kind = frame.get("push")
        if kind == "notice":
            self.say(frame["text"])
        elif kind == "ask":
            q = frame["question"]
            refs = ", ".join(f"{r.get('ref')} {str(r.get('old', ''))[:7]}..{str(r.get('new', ''))[:7]}"
                             for r in q.get("refs") or [])
            what = q.get("kind") or "request"
            self.say(f"envgit: step {q.get('step')} asks: {q['method']} {q['host']}{q['path']} "
                     f"({what}{': ' + refs if refs else ''}) by rule {q.get('rule')}\n"
                     f"  answer here, or from another terminal: envgit approve {frame['id']} / "
                     f"envgit deny {frame['id']} (no answer in {frame.get('timeout') or 120:g} s denies)")
            self.waiting.append(frame)
            if self.tty is not None and len(self.waiting) == 1:
                self._prompt()
        elif kind == "asked":
            was_first = self.waiting and self.waiting[0]["id"] == frame["id"]
            self.waiting = [w for w in self.waiting if w["id"] != frame["id"]]
            self.say(f"envgit: question {frame['id']}: {frame['answer']} ({frame.get('who')})")
            if was_first and self.waiting and self.tty is not None:
                self._prompt()

    def _prompt(self):
        os.write(self.tty, f"  allow once [y], allow this rule on this host for the step [r], "
                           f"deny [N]? ".encode())

    def typed(self, conn):
        line = os.read(self.tty, 1024).decode(errors="replace").strip().lower()
        answer = {"y": "allow", "yes": "allow", "r": "allow-rule"}.get(line, "deny")
        ask = self.waiting[0]
        conn.send({"op": "answer", "id": ask["id"], "answer": answer, "uid": os.getuid(),
                   "how": "at the terminal of envgit run", "rid": -1})

    def close(self):
        if self.tty is not None:
            os.close(self.tty)


def _read_info(fd) -> dict:
    """bwrap's --info-fd document (written once the namespaces exist, before the command
    runs): its integer fields. Read without `json`, whose import (it pulls in `re`) would cost
    a network step ~5 ms: the document is a flat object of numbers."""
    data = b""
    while not data.rstrip().endswith(b"}"):
        chunk = os.read(fd, 4096)
        if not chunk:
            raise ValueError("bwrap wrote no --info-fd document")
        data += chunk
    out = {}
    for item in data.decode().strip().strip("{}").split(","):
        key, _, value = item.partition(":")
        out[key.strip().strip('"')] = int(value)
    return out


def _forward(info_r, box, signum):
    """Send `signum` to the command: the children of the sandbox's init (bwrap --info-fd)."""
    if "init" not in box:
        try:
            os.set_blocking(info_r, False)     # written long ago, or bwrap is not up yet
            box["init"] = _read_info(info_r).get("child-pid")
        except (OSError, ValueError):
            box["init"] = None
    init = box.get("init")
    targets = []
    if init:
        try:
            with open(f"/proc/{init}/task/{init}/children") as f:
                targets = [int(p) for p in f.read().split()]
        except OSError:
            pass
    for p in targets or [box["bwrap"]]:
        try:
            os.kill(p, signum)
        except OSError:
            pass


def _decode(status):
    """(exit code, signal number or 0). bwrap reports a command killed by signal N as 128+N."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return 128 + sig, sig
    code = os.WEXITSTATUS(status)
    if 128 < code < 128 + 32:
        return code, code - 128
    return code, 0

