"""The inner control socket: how a process *inside* a sandbox (Claude Code's shell-prefix shim)
asks for a command to run as a step of its own.

bwrap cannot nest (nested user namespaces are refused), so the step runs in a sibling sandbox
started by the daemon (sandbox/launch.py, as every sandbox is), in a session of its own, with
the caller's stdin, stdout and stderr handed over as file descriptors (SCM_RIGHTS): the
command writes to the agent's own pipes or terminal.

One socket per agent session, bound read-only into that session's sandbox at
`/run/envgit/control.sock`. It offers only:
  {"op": "run", "argv", "cwd", "env", "tool_call_id"?, "cwd_file"?}  + 3 fds
                                                  -> {"step", "exit_code", "signal"}
      cwd_file (a /tmp/NAME, with argv ["bash", "-c", CMD]): where the shell's last directory
      goes when CMD succeeds, as Claude Code's own `eval CMD && pwd -P >| FILE` does, so a `cd`
      holds in the agent's next call; the /tmp is the agent's (its session's), the write the
      step's own. The step is recorded as argv.
  {"op": "record", "argv", "cwd", "tool_call_id"?, "marks"?, "body"?}  -> {"step"}
      a step for something already done inside (an agent's file edit): its snapshot, now.
      Marked `from-inner` (and `origin: "inner"` on its begin entry): what it claims is the
      agent's word; the only mark it may add is `agent-edit`
  {"op": "status"}                                                -> {"session", "live"}
  {"op": "mcp", "project"?}  + 3 fds                              -> {"exit_code"}
      envgit's own MCP server for the agent, run on the host on the caller's fds until it
      exits or the caller goes away (mcphost.py); `project`, when the agent's MCP config
      names one, must be this session's project.
Steps from it always belong to its session and its project: a cwd outside the project is
refused.

Everything arriving here comes from inside a sandbox, so it is treated as hostile: frames are
a 4-byte big-endian length and a UTF-8 JSON object (never marshal or pickle, whose decoders
are not safe on untrusted bytes), at most MAX_FRAME bytes, and every field is checked for
type, size and meaning (`check_request`) before anything acts on it. A bad frame gets an error
reply (or the connection closed) and the daemon serves on. The caller's side is inner_shim.py.
"""

import asyncio
import errno
import fcntl
import json
import os
import shlex
import signal
import socket
import stat
import struct
import threading

from ..fdpass import recv_with_fds
from ..sandbox.launch import Launch, LaunchError
from ..sandbox.resolver import PER_WAKE, Resolver
from . import mcphost, steps

MAX_FRAME = 4 * 1024 * 1024          # a frame from inside: argv + env of one command
MAX_ARGS = 65536
MAX_ENV = 4096
MAX_STR = 1024 * 1024
MAX_ID = 256
MAX_BODY_KEYS = 32
RECV_TIMEOUT_S = 30                  # a caller that stops mid-frame does not hold a thread for ever
RECORD_MARKS = ("agent-edit",)       # the marks a record from inside may carry
MAX_CONNECTIONS = 64                 # at once, per socket: each holds a thread (and a step)
MAX_MCP_SERVERS = 8                  # at once, per socket: each is a host process (~60 MB)


class BadRequest(ValueError):
    """A frame from inside that is not a well-formed request; its text goes back as the error."""


def encode(obj) -> bytes:
    body = json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode()
    return len(body).to_bytes(4, "big") + body


def decode(body: bytes) -> dict:
    """One frame's JSON object. Anything else (bad UTF-8, bad JSON, nesting deep enough to
    exhaust the parser's recursion, a non-object) is a BadRequest."""
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BadRequest(f"a frame must be one JSON object ({type(e).__name__})") from None
    if not isinstance(obj, dict):
        raise BadRequest("a frame must be one JSON object")
    return obj


def _str(v, what, limit=MAX_STR, empty=False):
    if not isinstance(v, str) or (not v and not empty) or len(v) > limit or "\0" in v:
        raise BadRequest(f"{what} must be a non-empty string without NUL, at most {limit} characters")
    return v


def _argv(v, limit=MAX_ARGS):
    if not isinstance(v, list) or not v or len(v) > limit:
        raise BadRequest(f"argv must be a non-empty list of at most {limit} strings")
    return [_str(a, "each argv item", empty=True) for a in v]


def _cwd(v, root):
    """The cwd, resolved on the host, inside the project (the session's own): else refused."""
    v = _str(v, "cwd", 4096)
    if not os.path.isabs(v):
        raise BadRequest("cwd must be an absolute path")
    real = os.path.realpath(v)
    if real != root and not real.startswith(root + "/"):
        raise BadRequest(f"cwd {v} is outside the project {root}: a step of this session runs in "
                         "its own project only")
    return real


def _env(v):
    if v is None:
        return {}
    if not isinstance(v, dict) or len(v) > MAX_ENV:
        raise BadRequest(f"env must be an object of at most {MAX_ENV} string values")
    out = {}
    for k, val in v.items():
        if not k or "=" in k or "\0" in k or len(k) > 4096:
            raise BadRequest("env names must be non-empty, without '=' or NUL")
        out[k] = _str(val, f"env {k[:40]}", empty=True)
    return out


def _call_id(v):
    return None if v is None else _str(v, "tool_call_id", MAX_ID)


def _body(v):
    """A record's note: a flat object of short scalars (what the hook says about the edit)."""
    if v is None:
        return None
    if not isinstance(v, dict) or len(v) > MAX_BODY_KEYS:
        raise BadRequest(f"body must be an object of at most {MAX_BODY_KEYS} keys")
    out = {}
    for k, val in v.items():
        _str(k, "a body key", 64)
        if val is not None and not isinstance(val, (bool, int, float)):
            val = _str(val, f"body {k}", 4096, empty=True)
        if isinstance(val, int) and not isinstance(val, bool) and abs(val) > 1 << 53:
            raise BadRequest(f"body {k} is out of range")
        out[k] = val
    return out


def _cwd_file(v, argv):
    if v is None:
        return None
    v = _str(v, "cwd_file", 256)
    name = v[len("/tmp/"):]
    if not v.startswith("/tmp/") or not name or "/" in name or name in (".", ".."):
        raise BadRequest("cwd_file must be a file directly in /tmp")
    if len(argv) != 3 or argv[:2] != ["bash", "-c"]:
        raise BadRequest("cwd_file goes with argv [\"bash\", \"-c\", CMD] only")
    return v


def tracking_cwd(argv, cwd_file):
    """What runs for a run with cwd_file: CMD in the same shell, then its directory, as the
    agent itself composes it (`eval` keeps CMD's own words, `$0` and positional parameters)."""
    return ["bash", "-c", f"eval {shlex.quote(argv[2])} && pwd -P >| {shlex.quote(cwd_file)}"]


FIELDS = {"run": {"op", "argv", "cwd", "env", "tool_call_id", "cwd_file"},
          "record": {"op", "argv", "cwd", "tool_call_id", "marks", "body"},
          "status": {"op"},
          "mcp": {"op", "project"}}


def check_request(msg: dict, root: str) -> dict:
    """The request with every field checked (BadRequest says which is wrong)."""
    op = msg.get("op")
    if op not in FIELDS:
        raise BadRequest(f"the inner socket offers run, record, mcp and status, not {str(op)[:40]!r}")
    extra = set(msg) - FIELDS[op]
    if extra:
        raise BadRequest(f"{op} does not take {', '.join(sorted(str(k)[:40] for k in extra)[:5])}")
    if op == "status":
        return {"op": op}
    if op == "mcp":
        project = msg.get("project")
        if project is not None:
            real = os.path.realpath(_str(project, "project", 4096))
            if real != root:
                raise BadRequest(f"envgit mcp here serves this session's project {root}, not {project} "
                                 "(drop --project from the MCP server's entry, or run the agent in that "
                                 "project)")
        return {"op": op}
    out = {"op": op, "tool_call_id": _call_id(msg.get("tool_call_id"))}
    if op == "run":
        out.update(argv=_argv(msg.get("argv")), cwd=_cwd(msg.get("cwd"), root), env=_env(msg.get("env")))
        out["cwd_file"] = _cwd_file(msg.get("cwd_file"), out["argv"])
        return out
    argv = msg.get("argv") or ["edit"]
    marks = msg.get("marks") or []
    if not isinstance(marks, list) or any(m not in RECORD_MARKS for m in marks):
        raise BadRequest(f"a record from inside may carry only the marks {', '.join(RECORD_MARKS)}")
    out.update(argv=[_str(a, "each argv item", 4096) for a in _argv(argv, 16)],
               cwd=_cwd(msg.get("cwd") or root, root), marks=sorted(set(marks)), body=_body(msg.get("body")))
    return out


class InnerSocket:
    def __init__(self, sess, session: str, path: str, loop, home: str, launch_env=None):
        self.sess, self.session, self.path, self.loop = sess, session, path, loop
        self.home = home        # from the agent's launch: a frame's env.HOME never picks the view
        self.launch_env = dict(launch_env or {})     # the person's, for the MCP server (mcphost.py)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.sock.bind(path)
        finally:
            os.umask(old)
        self.sock.listen(64)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.mcp_servers = 0             # asked for and not yet ended (mcphost.py), counted on the loop
        self.mcp_pids: set[int] = set()  # those running: ended when the socket closes
        threading.Thread(target=self._accept, daemon=True, name=f"inner-{session}").start()

    def close(self):
        self.sock.close()
        mcphost.stop(self.mcp_pids)      # the daemon is stopping: no server of it outlives it
        try:
            os.unlink(self.path)
            os.rmdir(os.path.dirname(self.path))     # a private temp dir, or .envgit/inner once empty
        except OSError:
            pass

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return                   # closed
            if not self.slots.acquire(blocking=False):
                conn.close()             # a flood from inside: refused, the daemon serves on
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        caller = _caller_pidfd(conn)        # at once: the process that connected, while it runs
        try:
            self._serve_one(conn, caller)
        finally:
            if caller is not None and caller >= 0:
                os.close(caller)
            self.slots.release()

    def _serve_one(self, conn, caller=None):
        fds = []
        with conn:
            try:
                conn.settimeout(RECV_TIMEOUT_S)
                head, fds = recv_with_fds(conn, 4)
                if len(head) < 4:
                    return
                size = int.from_bytes(head, "big")
                if size > MAX_FRAME:
                    reply = {"error": f"envgit: inner socket: a frame of {size} bytes is over the "
                                      f"{MAX_FRAME}-byte limit", "exit": 2}
                else:
                    msg = check_request(decode(_recv_exact(conn, size)), self.sess.project.root)
                    conn.settimeout(None)            # a step may run for hours
                    gone = asyncio.Event()           # set when the caller goes away (below)
                    # the fds are closed here, not on the loop: a socket's close can wait (SO_LINGER)
                    fut = asyncio.run_coroutine_threadsafe(self._dispatch(msg, fds, gone), self.loop)
                    _watch_caller(conn, fut, lambda: self.loop.call_soon_threadsafe(gone.set), caller)
                    reply = fut.result()
            except BadRequest as e:
                reply = {"error": f"envgit: inner socket: {e}", "exit": 2}
            except (OSError, EOFError) as e:
                reply = {"error": f"envgit: inner socket: {e}", "exit": 1}
            except Exception as e:          # never the daemon's end: say it and serve on
                reply = {"error": f"envgit: inner socket: {type(e).__name__}", "exit": 1}
            finally:
                for fd in fds:
                    os.close(fd)
            try:
                conn.sendall(encode(reply))
            except OSError:
                pass

    async def _dispatch(self, msg, fds, gone=None):
        """The reply to a checked request; `fds` stay the caller's thread's to close."""
        if msg["op"] == "status":
            return {"session": self.session, "live": sorted(self.sess.live)}
        if msg["op"] == "record":
            return await record_step(self.sess, msg, self.session)
        if len(fds) != 3:
            return {"error": f"envgit: {msg['op']} needs stdin, stdout and stderr passed as fds", "exit": 2}
        if msg["op"] == "mcp":
            if self.mcp_servers >= MAX_MCP_SERVERS:
                return {"error": f"envgit: at most {MAX_MCP_SERVERS} envgit MCP servers run at once "
                                 "for one agent session", "exit": 1}
            self.mcp_servers += 1
            try:
                return await mcphost.serve(self.sess.project.root, fds, self.session, self.launch_env,
                                           gone or asyncio.Event(), self.mcp_pids)
            finally:
                self.mcp_servers -= 1
        return await run_step(self.sess, msg, fds, self.session, self.home, gone)


async def record_step(sess, msg, session):
    """A checked record request (check_request) as a record-only step, marked as from inside."""
    begin = await steps.begin(sess, {"argv": msg["argv"], "cwd": msg["cwd"], "uid": os.getuid(), "session": session,
                              "record_only": True, "tool_call_id": msg["tool_call_id"],
                              "marks": ["from-inner", *msg["marks"]], "origin": "inner"})
    if "error" in begin or "refused" in begin:
        return {"error": begin.get("error") or begin["refused"], "exit": begin.get("exit", 126)}
    if msg["body"]:
        steps.event(sess, {"step": begin["step"], "kind": "note", "body": {**msg["body"], "from": "inner"}})
    await steps.end(sess, {"step": begin["step"], "exit_code": 0})
    return {"step": begin["step"]}


def _watch_caller(conn, fut, went_away, caller=None, every_s=0.2):
    """Until `fut` is done: if the caller closes its connection (the agent killed it: Claude
    Code's Esc, Codex's /stop, a tool call's timeout), or the process that connected ends
    (`caller`, its pidfd: the caller can hand its end of the connection to the very server or
    step it asked for, whose hang-up then never comes), call `went_away` once. Bytes after the
    request are ignored; a caller that only shuts its sending side (a request-then-reply
    client's half-close) still waits for its reply: only the hang-up of its whole end counts,
    which its death brings. poll, not select: a daemon holding many connections (a step's to
    its gate) gives this one a descriptor past FD_SETSIZE."""
    import select
    if caller == -1:                                 # it had ended before it was looked at
        went_away()
        return
    poller = select.poll()
    poller.register(conn, select.POLLIN)
    if caller is not None:
        poller.register(caller, select.POLLIN)       # readable once the process has exited
    while not fut.done():
        try:
            events = poller.poll(every_s * 1000)
            if any(fd == caller or ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL)
                   for fd, ev in events):
                went_away()
                return
            if events and not conn.recv(4096):       # half-closed: only a hang-up from now on
                poller.modify(conn, 0)
        except (OSError, ValueError):
            went_away()
            return


SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)    # Linux 6.5


def _caller_pidfd(conn) -> int | None:
    """A pidfd of the process that connected (taken at its connect(): no pid reuse), -1 when it
    has already ended, None when the kernel cannot say (the hang-up alone then counts)."""
    try:
        return conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError as e:
        if e.errno == errno.ESRCH:
            return -1
    try:
        pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        return os.pidfd_open(pid) if pid > 0 else None
    except ProcessLookupError:
        return -1
    except (OSError, AttributeError):
        return None


# How long an interrupted step's processes get to end after SIGTERM before SIGKILL.
STOP_GRACE_S = 0.5


async def run_step(sess, msg, fds, session, home, gone=None):
    """Begin a step, run it in its own sandbox on the given stdio fds, end it (snapshot).
    `gone` is set when the caller goes away: the step's processes are ended then (within a
    second) and the step is marked `interrupted-by-agent`."""
    begin = await steps.begin(sess, {"argv": msg["argv"], "cwd": msg["cwd"], "env": msg["env"], "home": home,
                              "pid": None, "uid": os.getuid(), "session": session,
                              "tool_call_id": msg["tool_call_id"], "origin": "inner"},
                             run_argv=tracking_cwd(msg["argv"], msg["cwd_file"]) if msg.get("cwd_file") else None)
    if "error" in begin:
        return begin
    step = begin["step"]
    if "refused" in begin:
        say(fds[2], begin["refused"] + "\n")
        return {"step": step, "exit_code": 126, "signal": None}
    sess.live[step].stderr_fd = teller(fds[2])       # denial notices go to the step's stderr
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    launch = None
    marks: list[str] = []
    dns = Resolver()              # the step's 127.0.0.1:53, answered on this loop
    sandbox = None                # its pid 1, held by a pidfd: ended directly when stopped
    try:
        # With the exit-status reporter, as envgit run: a command's chosen 130 is 130, a death
        # by SIGINT is SIGINT (bwrap alone says 128+N for both).
        launch = Launch(begin["bwrap"], sess.project.root, report=True)
        argv, env = launch.command_line(begin["env"])
        # A session of its own: nothing inside can signal the daemon or another step.
        proc = await asyncio.create_subprocess_exec(*argv, stdin=fds[0], stdout=fds[1], stderr=fds[2],
                                                    env=env, pass_fds=launch.pass_fds,
                                                    start_new_session=True)
        launch.spawned(proc.pid)
        sess.live[step].proc = proc
        try:
            info = await asyncio.to_thread(launch.ready)
            sandbox = _pidfd(info.get("child-pid"))
            if await asyncio.to_thread(dns.plant, info.get("child-pid")):
                serve_resolver(loop, dns)
            if begin.get("bind") and sess.gate is not None:
                sess.gate.bind_step(step, info["pid-namespace"])     # its credentials, its sandbox only
        except (OSError, ValueError, KeyError):
            pass                        # bwrap failed to start: its status says so
        launch.release()
        rc = await _wait_or_stop(proc, gone, sandbox)
        if gone is not None and gone.is_set():
            marks.append("interrupted-by-agent")
        # asyncio's returncode -N is a death by signal N, M >= 0 an exit with M: as a wait status
        code, sig = launch.outcome(-rc if rc < 0 else rc << 8)
    except (LaunchError, OSError) as e:
        say(fds[2], f"envgit: the sandbox could not start: {e}\n")
        code, sig = 125, 0
    finally:
        if dns.fileno() is not None:
            loop.remove_reader(dns.fileno())
        dns.close()
        if launch is not None:
            launch.close()
        if sandbox is not None:
            os.close(sandbox)
    name = signal.Signals(sig).name if sig else None
    fd = None
    if (live := sess.live.get(step)) is not None:
        fd, live.stderr_fd = live.stderr_fd, None
    if fd is not None:
        os.close(fd)
    ended = await steps.end(sess, {"step": step, "exit_code": code, "signal": name, "dns": dns.summary(),
                            "duration_ms": round((loop.time() - t0) * 1000, 3), "marks": marks})
    for line in ended.get("notices") or ():          # what envgit run would print after the step
        say(fds[2], f"envgit: step {step}: {line}\n")
    return {"step": step, "exit_code": code, "signal": name}


async def _wait_or_stop(proc, gone, sandbox=None):
    """The sandbox's exit status; if `gone` is set first, its process group is sent SIGTERM,
    then (after STOP_GRACE_S) bwrap SIGKILL, and the sandbox's pid 1 (`sandbox`, a pidfd)
    SIGKILL, which ends every process of the sandbox: bwrap's --die-with-parent does not when
    bwrap dies in the first milliseconds of its start (the command then ran on, unrecorded)."""
    if gone is None:
        return await proc.wait()
    waiting = asyncio.ensure_future(proc.wait())
    stop = asyncio.ensure_future(gone.wait())
    done, _ = await asyncio.wait({waiting, stop}, return_when=asyncio.FIRST_COMPLETED)
    if waiting in done:
        stop.cancel()
        return waiting.result()
    try:
        os.killpg(proc.pid, signal.SIGTERM)      # its own session: the group is the sandbox's
    except OSError:
        pass
    try:
        return await asyncio.wait_for(asyncio.shield(waiting), STOP_GRACE_S)
    except TimeoutError:
        proc.kill()
        return await waiting
    finally:
        if sandbox is not None:
            try:
                signal.pidfd_send_signal(sandbox, signal.SIGKILL)
            except OSError:
                pass                            # ended with bwrap, as it should


def _pidfd(pid) -> int | None:
    """A pidfd of `pid` (the sandbox's pid 1, alive until the command is let run), or None."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def serve_resolver(loop, dns, pause_s=0.05):
    """Answer the step's lookups on the daemon's loop. A full batch (a flood) stops reading for
    `pause_s`: the step waits on its own queries, and the gate and other steps keep the loop."""
    fd = dns.fileno()

    def readable():
        if dns.serve() >= PER_WAKE and dns.fileno() == fd:
            loop.remove_reader(fd)
            loop.call_later(pause_s, lambda: dns.fileno() == fd and loop.add_reader(fd, readable))
    loop.add_reader(fd, readable)


def teller(fd) -> int | None:
    """A descriptor for what the daemon tells a caller on its stderr `fd` (on the daemon's
    loop) that never blocks: a pipe or terminal the caller filled and never reads would stop
    every session's steps and the network gate. Its own open file description with O_NONBLOCK
    (the caller's flags stay the caller's), reopened only with the write access the caller's
    fd has; a file or another device as is (neither waits for a reader); None for a socket,
    whose O_NONBLOCK would be the caller's too, or anything else: nothing is told there."""
    try:
        st = os.fstat(fd)
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY or stat.S_ISSOCK(st.st_mode):
            return None
        if stat.S_ISFIFO(st.st_mode) or os.isatty(fd):
            return os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        if stat.S_ISREG(st.st_mode) or stat.S_ISCHR(st.st_mode):
            return os.dup(fd)
    except OSError:
        pass
    return None


def say(fd, text: str):
    """`text` on a caller's stderr, if it can take it now (teller)."""
    out = teller(fd)
    if out is None:
        return
    try:
        os.write(out, text.encode())
    except OSError:
        pass
    finally:
        os.close(out)


def _recv_exact(conn, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("the caller closed the connection")
        buf += chunk
    return bytes(buf)
