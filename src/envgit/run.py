"""`envgit run [--] CMD…`: the hot path. Standard library only (checked by a test with
`python -X importtime`): the daemon decides, this process only execs bwrap and waits.

stdin, stdout, stderr and the terminal are handed to the command as they are. The step runs
in a process group of its own (sandbox/launch.py), so nothing it signals reaches this process
or the shell; when this process holds the terminal's foreground, the step gets it for its run
(Ctrl-C and Ctrl-Z reach it as they would without envgit, a stopped step stops this process's
job) and the terminal's modes are restored after, however the command ended. Signals sent to
this process (SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGTSTP) are passed on to the command.

Exit status, by the shell's convention (as `env`, `timeout` and `docker run` use it):
  the command's own code, unchanged (a command's own `exit 130` is 130);
  a command that died of signal N: this process dies of N too (the shell shows 128+N);
  127 the command was not found, 126 it was found but could not be run (not executable, or
  refused by a `shell:` rule of the policy);
  125 envgit itself failed (no project, a bad policy, bubblewrap or perl missing, the sandbox or
  its network bridge did not start, the session daemon unreachable), with one `envgit:` line
  naming the fix.
"""

import _signal as signal  # type: ignore[import-not-found]  # the builtin (no stub): `signal` would import enum, ~3 ms per step
import os
import sys
import time

from .daemon.client import DaemonError, connect
from .paths import NoProject, Project, find_project
from .sandbox.launch import Foreground, Launch, LaunchError, bwrap_path, trusted_binary, without_gone_masks
from .sandbox.resolver import Resolver

SIGNAL_NAMES = {getattr(signal, n): n for n in dir(signal)
                if n.startswith("SIG") and not n.startswith("SIG_") and n not in ("SIGIOT", "SIGPOLL", "SIGCLD")}

# envgit's own failure, as `env`, `timeout` and `docker run` report theirs
FAILED = 125
# the command was found but cannot be run (here also: refused by the policy's shell rules)
CANNOT_RUN = 126


def fail(msg, code=FAILED):
    print(msg, file=sys.stderr)
    return code


def run(argv: list[str]) -> int:
    publish = []                    # -p PORT, -p HOST_PORT:STEP_PORT (sandbox/publish.py)
    while argv and (argv[0] in ("-p", "--publish") or argv[0].startswith(("-p", "--publish="))):
        if argv[0] in ("-p", "--publish"):
            if len(argv) < 2:
                return fail(f"envgit: {argv[0]} needs a port: envgit run -p 5173 -- CMD", 2)
            publish.append(argv[1])
            argv = argv[2:]
        else:
            publish.append(argv[0].split("=", 1)[1] if argv[0].startswith("--") else argv[0][2:])
            argv = argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        return fail("envgit: no command given: envgit run [--] CMD [ARGS…] (see envgit run --help)")
    return step(argv, dict(os.environ), publish)


def learning(argv: list[str]) -> int:
    """`envgit learn -- CMD…`: one step in learn mode (daemon/learn.py, policy/learn.py)."""
    if not argv:
        return fail("envgit: no command given: envgit learn -- CMD [ARGS…] (see envgit learn --help)")
    return step(argv, dict(os.environ), learn=True)


def _progress_line(frame, shown):
    """A `progress` push while the step is being set up (the project's first snapshot): one
    line on the terminal's stderr, rewritten in place and cleared once the step starts."""
    if frame.get("push") == "progress":
        text = "".join(c for c in str(frame.get("text", "")) if c.isprintable())[:200]
        sys.stderr.write(f"\r\x1b[Kenvgit: {text}")
        sys.stderr.flush()
        shown.append(1)


def step(argv: list[str], env: dict, publish: list[str] | None = None, learn: bool = False) -> int:
    """Run `argv` as one recorded step with `env` as the environment asked for (the daemon
    scrubs it by the policy): `envgit run`, and agents/steprun.py for the Codex exec-server.
    `learn`: in learn mode (`envgit learn -- CMD`). Returns the exit status, or dies of the
    signal the command died of."""
    cwd = os.getcwd()
    try:
        project = find_project(cwd)
        bwrap_path(project.root)       # trusted system binaries, never PATH's: fail before the step
        trusted_binary("perl", project.root)
    except (NoProject, LaunchError) as e:
        return fail(f"envgit: {e}")
    shown: list[int] = []
    try:
        conn = connect(project)
        if sys.stderr.isatty():        # the first snapshot of a big project: show it move
            conn.on_push = lambda frame: _progress_line(frame, shown)
        reply = conn.request({"op": "begin", "argv": argv, "cwd": os.path.realpath(cwd),
                              "env": env, "pid": os.getpid(),
                              "uid": os.getuid(), "session": os.environ.get("ENVGIT_SESSION"),
                              "tool_call_id": os.environ.get("ENVGIT_TOOL_CALL_ID"),
                              **({"publish": publish} if publish else {}),
                              **({"learn": True} if learn else {})})
    except (DaemonError, OSError) as e:
        return fail(("\r\x1b[K" if shown else "") + f"envgit: {e}")
    if shown:
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()
    if "error" in reply:
        return fail(reply["error"])
    if "refused" in reply:
        return fail(reply["refused"], CANNOT_RUN)
    if "vm" in reply:                   # backend: vm: the command runs in the project's microVM
        code, sig = execute_vm(conn, reply)
        if sig:
            die_of(sig)
        return code
    for line in reply.get("notices") or ():
        print(f"envgit: step {reply['step']}: {line}", file=sys.stderr)
    for host_port, step_port in reply.get("published") or ():
        print(f"envgit: step {reply['step']}: port {step_port} published at http://127.0.0.1:{host_port}/ "
              "while it runs", file=sys.stderr)
    code, sig = execute(conn, reply["step"], reply["bwrap"], reply["env"], reply.get("bind"), project.root)
    if sig:
        die_of(sig)
    return code


def die_of(sig):
    """End this process by the signal the command died of, as a shell expects of a command
    (`wait` status, "Killed", `set -o pipefail`); never with a core dump of its own."""
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    except (OSError, ValueError):
        pass                    # a signal that cannot end this process: 128+N, as the shell would say


def execute(conn, step, args, env, bind=False, project_root=None, hold_notices=False) -> tuple[int, int]:
    """Run the bwrap command line the daemon gave for `step` on this terminal, serving what
    the daemon pushes meanwhile, then end the step: (exit code, signal number or 0): the
    command's own code, or 128+N and N if it died of signal N, 125 if the sandbox did not
    start. With `bind`, the step's proxy credentials are tied to its sandbox before the
    command starts. With `hold_notices` (a full-screen program: `envgit claude`), what the
    daemon says during the step is said once the command has exited and given the terminal
    back, not drawn over its screen."""
    term = Terminal(hold_notices)
    conn.on_push = lambda frame: term.push(frame, conn)
    gone: list[str] = []
    for attempt in (1, 2):
        dns = Resolver()          # the step's 127.0.0.1:53, answered here (sandbox/resolver.py)
        try:
            code, sig, ms, started = _spawn_and_wait(args, env, conn, term, step if bind else None,
                                                     project_root, dns, gone)
        except (LaunchError, OSError) as e:
            print(f"envgit: the sandbox could not start: {e}", file=sys.stderr)
            code, sig, ms, started = FAILED, 0, 0, None
        finally:
            dns.close()
        # bwrap failed before the command ran because a masked host file went away meanwhile
        # (sandbox/launch.py: without_gone_masks): once more without that mask. Only when the
        # command surely never ran: a command's own exit 125 is never run twice.
        if attempt == 1 and started is False and project_root and \
                (again := without_gone_masks(args, Project(project_root).state)) is not None:
            args, gone = again
            print("envgit: a masked system file was removed while the sandbox was built; "
                  "starting it again", file=sys.stderr)
            continue
        break
    for text in term.held or ():
        term.say(text)
    try:
        reply = conn.request({"op": "end", "step": step, "exit_code": code, "dns": dns.summary(),
                              "signal": SIGNAL_NAMES.get(sig) if sig else None, "duration_ms": ms})
        for line in reply.get("notices") or ():
            print(f"envgit: step {step}: {line}", file=sys.stderr)
    except (DaemonError, OSError) as e:
        _unclosed(step, e, code)
    return code, sig


def _unclosed(step, e, code):
    """The daemon went away before the step's end reached it (killed, or stopped): its next
    start records the step as interrupted. Said in words, never as an errno."""
    why = str(e) if isinstance(e, DaemonError) else "the session daemon closed the connection"
    if "daemon.log" not in why:
        why += " (see .envgit/daemon.log)"
    print(f"envgit: step {step} could not be closed: {why}; it is recorded as interrupted "
          f"(the command exited {code})", file=sys.stderr)


def execute_vm(conn, reply) -> tuple[int, int]:
    """The step in the project's VM (vm/client.py streams it), then its end, as `execute`."""
    from .vm.client import run_step
    step = reply["step"]
    for line in reply.get("notices") or ():
        print(f"envgit: {line}", file=sys.stderr)
    try:
        code, sig, ms = run_step(reply["vm"], conn)
    except OSError as e:
        print(f"envgit: the VM's step could not start: {e}", file=sys.stderr)
        code, sig, ms = FAILED, 0, 0
    try:
        reply = conn.request({"op": "end", "step": step, "exit_code": code,
                              "signal": SIGNAL_NAMES.get(sig) if sig else None, "duration_ms": ms})
        for line in reply.get("notices") or ():
            print(f"envgit: step {step}: {line}", file=sys.stderr)
        if reply.get("error"):
            print(f"envgit: step {step}: {reply['error']}", file=sys.stderr)
    except (DaemonError, OSError) as e:
        _unclosed(step, e, code)
    return code, sig


# Signals this process passes on to the command while it waits (SIGINT and SIGQUIT reach it
# here only when the step does not hold the terminal, e.g. in a pipeline, or from `kill`).
FORWARDED = (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP)


def _spawn_and_wait(args, env, conn, term, bind_step, project_root, dns, gone=()):
    """Start the step's sandbox in a process group of its own (launch.py), give it the terminal
    when this process holds it, tie its credentials when asked, plant its resolver (`dns`),
    and wait: (exit code, signal number or 0, ms, whether the command started: False when
    bwrap failed before it). `gone`: masked paths this start leaves out because they were gone
    from the host; if one is back once the sandbox is made, the command is never released."""
    dns.prepare()                 # its planter forks now, beside bwrap's own start
    launch = Launch(args, project_root, report=True)
    fg = Foreground()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    old = {}
    try:
        def forward(signum, _frame):
            launch.signal(signum)
        for s in FORWARDED:
            old[s] = signal.signal(s, forward)
        # Ctrl-Z while the step is in the background (a pipeline): stop the step too; the
        # step's stop (SIGCHLD) then stops this process the way a job stops.
        old[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, lambda *_: _kill_group(launch.pid, signal.SIGTSTP))
        old[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        t0 = time.monotonic_ns()
        pid = launch.spawn(env)
        try:
            fg.give(pid)
            try:
                info = launch.ready()
                dns.plant(info.get("child-pid"))       # before the command can look a name up
                if bind_step is not None:
                    conn.request({"op": "sandbox", "step": bind_step, "pidns": info.get("pid-namespace")})
            except (OSError, ValueError, DaemonError):
                pass                # bwrap failed to start (its status says so), or no gate: no network
            if any(os.path.lexists(p) for p in gone):
                # a mask left out and its file back: the view may show it, so fail closed
                _kill_group(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                print("envgit: a masked system file came back while the sandbox was started again; "
                      "the command was not run (run it again)", file=sys.stderr)
                return FAILED, 0, 0, None
            launch.release()
            status = _wait(pid, conn, term, fg, wake_r, dns)
        finally:
            signal.set_wakeup_fd(old_wakeup)
        ms = round((time.monotonic_ns() - t0) / 1e6, 3)
        code, sig = launch.outcome(status)
        if launch.started is False:
            print("envgit: the sandbox did not start (bwrap's reason is above); "
                  "`envgit doctor` checks the set-up", file=sys.stderr)
        return code, sig, ms, launch.started
    finally:
        fg.close()                  # the terminal back, in the modes it had before the step
        for s, h in old.items():
            signal.signal(s, h)
        launch.close()
        os.close(wake_r)
        os.close(wake_w)


def _wait(pid, conn, term, fg, wake_r, dns):
    """Until the command exits, serve what the daemon pushes (asks, notices), the
    person's answers typed at this terminal and the step's name lookups (`dns`); follow the
    step's stops like a shell's job control. Returns bwrap's wait status."""
    import select
    sock = conn.sock.fileno()
    asking = False
    while True:
        # a question needs the terminal: take it from the step while the person answers
        if bool(term.fds()) != asking:
            asking = not asking
            if asking:
                fg.take()
            else:
                fg.give(pid, fg.step_modes)
        resolver = dns.fileno()
        watch = [wake_r] + ([sock] if sock is not None else []) + term.fds() + \
            ([resolver] if resolver is not None else [])
        ready, _, _ = select.select(watch, [], [])
        if resolver is not None and resolver in ready:
            dns.serve()
        if sock in ready:
            if not conn.fill():
                sock = None             # the daemon went away; the command goes on
            while conn.has_frame():
                term.push(conn.read_frame(), conn)
        if term.fds() and term.fds()[0] in ready:
            term.typed(conn)
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
            if done and os.WIFSTOPPED(status):
                _job_stopped(pid, fg)
            elif done:
                return status


def _job_stopped(pid, fg):
    """The step stopped (Ctrl-Z, or it read the terminal from the background): take the
    terminal back and stop this process's group, as a job stops, so that the shell regains
    the terminal; when continued (`fg` or `bg`), continue the step, with the terminal if this
    process has it again. (An orphaned group cannot stop: the step then just goes on.)"""
    fg.take()
    old = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
    try:
        os.kill(0, signal.SIGTSTP)
    finally:
        signal.signal(signal.SIGTSTP, old)
    fg.give(pid, fg.step_modes)             # only if this process holds the terminal again
    _kill_group(pid, signal.SIGCONT)


def _kill_group(pgid, signum):
    if pgid:
        try:
            os.kill(-pgid, signum)
        except OSError:
            pass


CHANGED_HOLD_S = 1.0


class Terminal:
    """Questions from the gate, answered at this terminal when there is one."""

    def __init__(self, hold_notices=False):
        try:
            self.tty = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
        except OSError:
            self.tty = None
        self.waiting = []          # asks not yet answered, the first one being prompted
        # When the questions changed under the prompt (a second one printed below it, or the
        # first one ended and the next is prompted), which a step can time: an allowing answer
        # typed within CHANGED_HOLD_S may have been meant for what was shown before.
        self.changed_at = -1e9
        self.held = [] if hold_notices else None   # notices kept until the command exits

    def fds(self):
        return [self.tty] if self.tty is not None and self.waiting else []

    def say(self, text):
        # (what a step's request named may hold a lone surrogate: shown escaped, never a traceback)
        os.write(2, (text + "\n").encode("utf-8", "backslashreplace"))

    def push(self, frame, conn):
        # What the step's requests name (host, path, ref names) is shown inert: a step must
        # not fake the question a person answers with escape sequences (inert.py).
        from .inert import inert
        kind = frame.get("push")
        if kind == "notice" and self.held is not None:
            if inert(frame["text"]) not in self.held:
                self.held.append(inert(frame["text"]))
        elif kind == "notice":
            self.say(inert(frame["text"]))
        elif kind == "ask":
            q = frame["question"]
            refs = ", ".join(f"{r.get('ref')} {str(r.get('old', ''))[:7]}..{str(r.get('new', ''))[:7]}"
                             for r in q.get("refs") or [])
            what = q.get("kind") or "request"
            self.say(f"envgit: step {q.get('step')} asks: " +
                     inert(f"{q['method']} {q['host']}{q['path']} ({what}{': ' + refs if refs else ''}) "
                           f"by rule {q.get('rule')}") + "\n"
                     f"  answer here, or from another terminal: envgit approve {frame['id']} / "
                     f"envgit deny {frame['id']} (no answer in {frame.get('timeout') or 120:g} s denies)")
            self.waiting.append(frame)
            if self.tty is not None:    # the last line names the question an answer goes to
                self._prompt(changed=len(self.waiting) > 1)
        elif kind == "asked":
            was_first = self.waiting and self.waiting[0]["id"] == frame["id"]
            self.waiting = [w for w in self.waiting if w["id"] != frame["id"]]
            self.say(inert(f"envgit: question {frame['id']}: {frame['answer']} ({frame.get('who')})"))
            if was_first and self.waiting and self.tty is not None:
                self._prompt(changed=True)

    def _prompt(self, changed=False):
        if changed:
            self.changed_at = time.monotonic()
        q = self.waiting[0]
        os.write(self.tty, f"  question {q['id']}: allow once [y], allow and remember exactly this for 8 h "
                           "[m], allow this rule on this host for the step [r], deny [N]? ".encode())

    def typed(self, conn):
        line = os.read(self.tty, 1024).decode(errors="replace").strip().lower()
        answer = {"y": "allow", "yes": "allow", "m": "allow", "r": "allow-rule"}.get(line, "deny")
        if answer != "deny" and time.monotonic() - self.changed_at < CHANGED_HOLD_S:
            os.write(self.tty, b"  (the questions changed just now: read again)\n")
            self._prompt()
            return
        ask = self.waiting[0]
        msg = {"op": "answer", "id": ask["id"], "answer": answer, "uid": os.getuid(),
               "how": "at the terminal of envgit run", "rid": -1}
        if line == "m":         # a grant (daemon/grants.py); one that cannot be made: allow once
            msg.update(remember=True, or_once=True)
        conn.send(msg)

    def close(self):
        if self.tty is not None:
            os.close(self.tty)

