"""The session daemon's server.

Protocol: frames (see client.py: length + marshal'd dict) over the unix socket `.envgit/daemon.sock` (mode 0600, in `.envgit/`,
which no sandbox can see). A client keeps its connection open for the length of its step;
a connection that closes with its step still open marks the step `interrupted`.

  {"op": "begin", "argv", "cwd", "env", "pid", "session"?, "tool_call_id"?}
      -> {"step", "bwrap": [...], "env": {...}}      run it, then send `end`
      -> {"step", "refused": "message"}               a shell rule refused it (recorded)
      -> {"error": "message", "exit": 2}              bad policy or input (nothing recorded)
  {"op": "end", "step", "exit_code", "signal", "duration_ms"}  -> {"ok": true, "marks": [...]}
  {"op": "status"}  -> {"pid", "session", "live": [step ids], "version"}
  {"op": "stop"}    -> {"ok": true}, then the daemon exits
"""

import asyncio
import fcntl
import os
import secrets
import shutil
import signal
import sys
import time

from .. import __version__
from ..journal import Journal
from ..paths import Project
from ..policy import PolicyError, decide_command, load_policy
from ..sandbox.projectscan import ProjectScan
from ..sandbox.spec import build
from .client import MAX_FRAME, decode, encode
from .repair import mark_interrupted

IDLE_S = float(os.environ.get("ENVGIT_DAEMON_IDLE", "900"))


class Session:
    def __init__(self, project: Project):
        self.project = project
        self.journal = Journal(project.journal)
        self.scan = ProjectScan(project.root)
        self.id = time.strftime("s%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        self.live: dict[int, dict] = {}
        self.clients = 0
        self.last_activity = time.monotonic()
        self._policy = None
        self._policy_key = None
        self.stopping = asyncio.Event()

    # The policy is re-read whenever the file changes, so an edit applies to the next step.
    def policy(self):
        st = os.stat(self.project.policy)
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._policy_key:
            self._policy = load_policy(self.project.policy)
            self._policy_key = key
        return self._policy

    def session_tmp(self, session):
        d = self.project.state_path("sessions", session, "tmp")
        os.makedirs(d, mode=0o700, exist_ok=True)
        return d

    # --- operations ---------------------------------------------------------------------

    def begin(self, msg):
        argv, cwd = msg.get("argv"), msg.get("cwd")
        if not argv or not isinstance(argv, list) or not cwd:
            return {"error": "envgit run needs a command: envgit run [--] CMD [ARGS…]", "exit": 2}
        try:
            pol = self.policy()
        except PolicyError as e:
            return {"error": str(e), "exit": 2}
        except OSError as e:
            return {"error": f"{self.project.policy}: {e.strerror}", "exit": 2}
        session = msg.get("session") or self.id
        head = {"argv": argv, "cwd": cwd, "session": session, "pid": msg.get("pid"),
                "user": _user_name(msg.get("uid")), "policy_sha256": pol.sha256,
                "tool_call_id": msg.get("tool_call_id")}
        verdict = decide_command(pol, argv)
        if verdict.action == "deny":
            step = self.journal.begin_step({**head, "marks": ["refused"]})
            text = f"envgit: refused by {verdict.rule}" + (f": {verdict.reason}" if verdict.reason else "") + \
                "\n(a courtesy rule: the network gate is what stops the action itself)"
            self.journal.append(step, "end", {"exit_code": 126, "signal": None, "duration_ms": 0,
                                              "marks": ["refused"], "refused_by": verdict.rule})
            return {"step": step, "refused": text}
        step = self.journal.begin_step(head)
        try:
            spec = build(pol, self.project.root, cwd, argv, msg.get("env") or {},
                         self.project.state, self.session_tmp(session), self.scan,
                         {"ENVGIT_STEP": str(step), "ENVGIT_SESSION": session})
        except Exception as e:          # never leave a begun step without an end
            self.journal.append(step, "interrupted", {"reason": f"sandbox set-up failed: {e}"})
            return {"error": f"envgit: could not set up the sandbox: {e}", "exit": 2}
        self.live[step] = {"masked": spec.masked + spec.denied_literal, "argv": argv,
                           "home": spec.env.get("HOME", "")}
        return {"step": step, "bwrap": spec.argv, "env": spec.env}

    def end(self, msg):
        step = msg.get("step")
        info = self.live.pop(step, None)
        if info is None:
            return {"error": f"step {step} is not running", "exit": 2}
        denied = mentioned(info["argv"], info["masked"], self.project.root, info["home"])
        marks = ["denied-read"] if denied else []
        self.journal.append(step, "end", {
            "exit_code": msg.get("exit_code"), "signal": msg.get("signal"),
            "duration_ms": msg.get("duration_ms"), "marks": marks, "denied_paths": denied})
        return {"ok": True, "marks": marks}

    def interrupted(self, step, reason):
        if self.live.pop(step, None) is not None:
            self.journal.append(step, "interrupted", {"reason": reason})

    # --- serving ------------------------------------------------------------------------

    async def handle(self, reader, writer):
        self.clients += 1
        mine = set()
        try:
            while True:
                try:
                    size = int.from_bytes(await reader.readexactly(4), "big")
                    if size > MAX_FRAME:
                        break
                    body = await reader.readexactly(size)
                except asyncio.IncompleteReadError:
                    break
                self.last_activity = time.monotonic()
                msg = {}
                try:
                    msg = decode(body)
                    reply = self.dispatch(msg)
                except Exception as e:          # a bad message must not take the daemon down
                    reply = {"error": f"envgit daemon: {type(e).__name__}: {e}", "exit": 1}
                if msg.get("op") == "begin" and "step" in reply and "refused" not in reply:
                    mine.add(reply["step"])
                elif msg.get("op") == "end":
                    mine.discard(msg.get("step"))
                writer.write(encode(reply))
                await writer.drain()
                if msg.get("op") == "stop":
                    self.stopping.set()
        except (ConnectionError, ValueError):
            pass
        finally:
            for step in mine:
                self.interrupted(step, "envgit run exited before the step ended")
            self.clients -= 1
            self.last_activity = time.monotonic()
            writer.close()

    def dispatch(self, msg):
        op = msg.get("op")
        if op == "begin":
            return self.begin(msg)
        if op == "end":
            return self.end(msg)
        if op == "status":
            return {"pid": os.getpid(), "session": self.id, "live": sorted(self.live),
                    "version": __version__}
        if op == "stop":
            return {"ok": True}
        return {"error": f"unknown op {op!r}", "exit": 2}

    async def idle_watch(self):
        while not self.stopping.is_set():
            await asyncio.sleep(min(1.0, IDLE_S))
            if self.clients == 0 and not self.live and time.monotonic() - self.last_activity > IDLE_S:
                self.stopping.set()


def _user_name(uid):
    import pwd
    try:
        return pwd.getpwuid(uid).pw_name if uid is not None else ""
    except KeyError:
        return str(uid)


def mentioned(argv, masked, root, home):
    """The denied paths a command line names: the part of 'which denied path did the step
    touch' that can be known without tracing the process."""
    text = " ".join(argv)
    out = []
    for p in masked:
        forms = {p}
        if p.startswith(root + "/"):
            forms.add(p[len(root) + 1:])
            forms.add(os.path.basename(p))
        if home and p.startswith(home + "/"):
            forms.add("~" + p[len(home):])
        if any(f and f in text for f in forms):
            out.append(p)
    return out


async def serve(project: Project):
    lock = open(project.state_path("daemon.lock"), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0                         # another daemon serves this project
    sess = Session(project)
    mark_interrupted(sess.journal, "the session daemon stopped before the step ended")
    try:
        os.unlink(project.socket)
    except FileNotFoundError:
        pass
    old = os.umask(0o077)
    server = await asyncio.start_unix_server(sess.handle, path=project.socket)
    os.umask(old)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sess.stopping.set)
    watcher = asyncio.create_task(sess.idle_watch())
    print(f"envgit daemon {os.getpid()} serving {project.root} (session {sess.id})", flush=True)
    await sess.stopping.wait()
    server.close()
    watcher.cancel()
    try:
        os.unlink(project.socket)
    except FileNotFoundError:
        pass
    for step in list(sess.live):
        sess.interrupted(step, "the session daemon stopped before the step ended")
    shutil.rmtree(project.state_path("sessions", sess.id), ignore_errors=True)
    sess.journal.close()
    return 0


def main(argv=None):
    argv = argv if argv is not None else sys.argv[1:]
    if len(argv) != 1:
        print("usage: python -m envgit.daemon PROJECT_ROOT", file=sys.stderr)
        return 2
    return asyncio.run(serve(Project(os.path.realpath(argv[0]))))
